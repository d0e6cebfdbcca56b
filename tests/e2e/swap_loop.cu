// swap_loop K [SLEEP_US [STOP]]: launches `step` K times (sleeping SLEEP_US between launches, default 50),
// or fewer when the file STOP appears, one stream, checking every launch's result. tests/test_swap_gpu.py
// attaches, swaps and detaches probes while it runs, then runs it plain for as many launches. `step` keeps __device__ state (`launches_seen`, +1 per launch) and evolves an integer
// array (x[i] += i % 7 + 1 per launch), so after K launches the program can check both exactly and
// print a checksum that must match a plain run's.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
#include <unistd.h>

#define CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    std::printf("error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); return 1; } } while (0)

__device__ unsigned long long launches_seen;

__global__ void step(unsigned long long *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += (unsigned long long)(i % 7 + 1);
    if (i == 0) launches_seen += 1;
}

int main(int argc, char **argv) {
    long k = argc > 1 ? std::atol(argv[1]) : 1000;
    int sleep_us = argc > 2 ? std::atoi(argv[2]) : 50;
    const char *stop = argc > 3 ? argv[3] : nullptr;
    const int n = 4096, block = 256;
    unsigned long long *dx, zero = 0;
    CHECK(cudaMalloc(&dx, n * sizeof *dx));
    CHECK(cudaMemset(dx, 0, n * sizeof *dx));
    CHECK(cudaMemcpyToSymbol(launches_seen, &zero, sizeof zero));
    long failed = 0, done = 0;
    for (long i = 0; i < k; i++, done++) {
        if (stop && access(stop, F_OK) == 0) break;
        step<<<n / block, block>>>(dx, n);
        if (cudaGetLastError() != cudaSuccess) failed++;
        if (cudaStreamSynchronize(0) != cudaSuccess) failed++;
        if (i == 0) { std::printf("ready\n"); std::fflush(stdout); }
        if (sleep_us) usleep(sleep_us);
    }
    unsigned long long *x = (unsigned long long *)std::malloc(n * sizeof *x), seen = 0;
    CHECK(cudaMemcpy(x, dx, n * sizeof *x, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpyFromSymbol(&seen, launches_seen, sizeof seen));
    unsigned long long checksum = 1469598103934665603ull, wrong = 0;
    for (int i = 0; i < n; i++) {
        if (x[i] != (unsigned long long)done * (i % 7 + 1)) wrong++;
        checksum = (checksum ^ x[i]) * 1099511628211ull;
    }
    std::printf("swap_loop launches %ld failed %ld wrong %llu state %llu checksum %016llx\n", done, failed, wrong,
                seen, checksum);
    return failed || wrong || seen != (unsigned long long)done ? 1 : 0;
}
