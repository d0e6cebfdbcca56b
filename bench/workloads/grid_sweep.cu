// What a patch costs per block, per thread and per launch (bench/bench_sass_sweep.py): vecadd launched
// alone at grid sizes from one wave (a block per SM) up, at 32, 256 and 1024 threads a block, each timed
// between events (median of 7). Prints "SWEEP threads blocks kernel_us" per shape, "ATTR regs local_bytes
// blocks_per_sm" (the runtime's view of the kernel at 256 threads), then "SWEEP_DONE checksum".
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <cuda_runtime.h>

#define CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    std::printf("error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); std::exit(1); } } while (0)

extern "C" __global__ void vecadd(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

int main() {
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int waves[] = {1, 2, 4, 8, 16, 64}, threads[] = {32, 256, 1024};
    size_t most = (size_t)sms * 64 * 1024;
    float *x, *y, *z;
    CHECK(cudaMalloc(&x, most * 4));
    CHECK(cudaMalloc(&y, most * 4));
    CHECK(cudaMalloc(&z, most * 4));
    CHECK(cudaMemset(x, 0, most * 4));
    CHECK(cudaMemset(y, 0, most * 4));
    cudaEvent_t before, after;
    CHECK(cudaEventCreate(&before));
    CHECK(cudaEventCreate(&after));
    vecadd<<<1, 32>>>(x, y, z, 32);  // module load, first launch
    CHECK(cudaDeviceSynchronize());
    for (int t : threads)
        for (int w : waves) {
            int blocks = sms * w;
            float us[7];
            for (float &u : us) {
                CHECK(cudaEventRecord(before));
                vecadd<<<blocks, t>>>(x, y, z, blocks * t);
                CHECK(cudaEventRecord(after));
                CHECK(cudaEventSynchronize(after));
                CHECK(cudaEventElapsedTime(&u, before, after));
                u *= 1e3f;
            }
            for (int i = 1; i < 7; i++)
                for (int j = i; j > 0 && us[j - 1] > us[j]; j--) std::swap(us[j - 1], us[j]);
            std::printf("SWEEP %d %d %.2f\n", t, blocks, us[3]);
        }
    cudaFuncAttributes attr;
    int per_sm = 0;
    CHECK(cudaFuncGetAttributes(&attr, vecadd));
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, vecadd, 256, 0));
    std::printf("ATTR %d %zu %d\n", attr.numRegs, attr.localSizeBytes, per_sm);
    CHECK(cudaGetLastError());
    std::printf("SWEEP_DONE ok\n");
    return 0;
}
