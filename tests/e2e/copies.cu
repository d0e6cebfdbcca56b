// copies K: K rounds, each on one stream: a 1 MiB host-to-device copy from pinned memory, a 256 KiB
// memset, a 512 KiB device-to-device copy and a 1 MiB device-to-host copy, then a stream sync; checks
// the bytes that came back and prints what it did. The GPU test of egpu-run --durations compares CUPTI's
// copies with these counts (tests/test_cupti_activity_gpu.py).
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    std::printf("error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); return 1; } } while (0)

int main(int argc, char **argv) {
    int k = argc > 1 ? std::atoi(argv[1]) : 4;
    const size_t big = 1 << 20, set = 256 << 10, half = 512 << 10;
    unsigned char *host, *back, *dev, *dev2;
    CHECK(cudaMallocHost(&host, big));
    CHECK(cudaMallocHost(&back, big));
    CHECK(cudaMalloc(&dev, big));
    CHECK(cudaMalloc(&dev2, big));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    for (size_t i = 0; i < big; i++) host[i] = (unsigned char)(i * 7);
    int bad = 0;
    for (int r = 0; r < k; r++) {
        CHECK(cudaMemcpyAsync(dev, host, big, cudaMemcpyHostToDevice, s));
        CHECK(cudaMemsetAsync(dev, r + 1, set, s));
        CHECK(cudaMemcpyAsync(dev2, dev, half, cudaMemcpyDeviceToDevice, s));
        CHECK(cudaMemcpyAsync(back, dev2, big, cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        for (size_t i = 0; i < half; i++)
            bad += back[i] != (i < set ? (unsigned char)(r + 1) : (unsigned char)(i * 7));
    }
    std::printf("copies rounds=%d htod=%d/%zu memset=%d/%zu dtod=%d/%zu dtoh=%d/%zu bad=%d\n", k, k, k * big, k,
                k * set, k, k * half, k, k * big, bad);
    return bad != 0;
}
