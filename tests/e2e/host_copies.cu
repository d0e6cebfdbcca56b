// host_copies [loop N]: a known set of host-device copies, sets, allocations and synchronizations, for the
// host-API probes' GPU test (tests/test_hostapi_gpu.py). Prints an EXPECT line per (direction, bytes)
// with how many copies of that size it made, and the same for sets, device allocations and waits.
// "loop N": N synchronous 64 KiB host-to-device copies, timed, for the probe's cost (prints TIME_NS).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

#define CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    std::printf("error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); return 1; } } while (0)

__global__ void scale(float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= 2.0f;
}

static int loop(int n) {
    const size_t bytes = 64 << 10;
    char *host = (char *)std::malloc(bytes), *dev;
    std::memset(host, 1, bytes);
    CHECK(cudaMalloc(&dev, bytes));
    CHECK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));  // warm up
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; i++) CHECK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
    auto t1 = std::chrono::steady_clock::now();
    std::printf("TIME_NS %lld\n", (long long)std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
    std::printf("EXPECT H2D %zu %d\n", bytes, n + 1);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !std::strcmp(argv[1], "loop")) return loop(std::atoi(argv[2]));
    const int n = 1 << 20;                       // floats: 4 MiB
    const size_t bytes = sizeof(float) * n, half = bytes / 2;
    float *host = (float *)std::malloc(bytes), *pinned, *a, *b;
    for (int i = 0; i < n; i++) host[i] = (float)i;
    CHECK(cudaMalloc(&a, bytes));
    CHECK(cudaMalloc(&b, bytes));
    CHECK(cudaMallocHost(&pinned, bytes));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    for (int i = 0; i < 5; i++) CHECK(cudaMemcpy(a, host, bytes, cudaMemcpyHostToDevice));   // pageable H2D
    scale<<<n / 256, 256, 0, s>>>(a, n);
    for (int i = 0; i < 3; i++) CHECK(cudaMemcpyAsync(pinned, a, half, cudaMemcpyDeviceToHost, s));  // pinned D2H
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < 2; i++) CHECK(cudaMemcpy(b, a, bytes / 4, cudaMemcpyDeviceToDevice));
    CHECK(cudaMemcpy(host, b, bytes / 8, cudaMemcpyDefault));                                  // unified: D2H
    CHECK(cudaMemset(b, 0, bytes / 16));
    CHECK(cudaMemsetAsync(b, 0, bytes / 32, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaDeviceSynchronize());
    double sum = 0;
    for (int i = 0; i < n / 8 / 4; i++) sum += host[i];
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    CHECK(cudaFreeHost(pinned));
    std::printf("SUM %.1f\n", sum);
    std::printf("EXPECT H2D %zu 5\n", bytes);
    std::printf("EXPECT D2H %zu 3\n", half);
    std::printf("EXPECT D2D %zu 2\n", bytes / 4);
    std::printf("EXPECT D2H %zu 1\n", bytes / 8);
    std::printf("EXPECT SET %zu 1\n", bytes / 16);
    std::printf("EXPECT SET %zu 1\n", bytes / 32);
    std::printf("EXPECT ALLOC_DEVICE %zu 2\n", bytes);
    std::printf("EXPECT ALLOC_HOST %zu 1\n", bytes);
    std::printf("EXPECT FREE_DEVICE %zu 2\n", bytes);
    std::printf("EXPECT FREE_HOST %zu 1\n", bytes);
    std::printf("EXPECT SYNC_STREAM 2\n");
    return 0;
}
