// vecadd K N: launches c = a + b on N floats (N a multiple of 256, so N threads per launch) K times,
// checks every element on the host and prints a checksum of the result's bits. The GPU end-to-end
// tests run it plain and under egpu-run: the output must be the same, and a kernel-entry counter must
// read exactly K * N.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

#define CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    std::printf("error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); return 1; } } while (0)

__global__ void vecadd(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i] * (float)(i % 3);
}

int main(int argc, char **argv) {
    int k = argc > 1 ? std::atoi(argv[1]) : 10;
    int n = argc > 2 ? std::atoi(argv[2]) : 1 << 20;
    const int block = 256;
    int grid = (n + block - 1) / block;
    size_t bytes = sizeof(float) * n;
    float *a = (float *)std::malloc(bytes), *b = (float *)std::malloc(bytes), *c = (float *)std::malloc(bytes);
    for (int i = 0; i < n; i++) { a[i] = 0.5f * i; b[i] = (float)(i % 7) - 3.0f; }
    float *da, *db, *dc;
    CHECK(cudaMalloc(&da, bytes)); CHECK(cudaMalloc(&db, bytes)); CHECK(cudaMalloc(&dc, bytes));
    CHECK(cudaMemcpy(da, a, bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, b, bytes, cudaMemcpyHostToDevice));
    for (int i = 0; i < k; i++) vecadd<<<grid, block>>>(da, db, dc, n);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(c, dc, bytes, cudaMemcpyDeviceToHost));
    unsigned long long checksum = 1469598103934665603ull, wrong = 0;
    for (int i = 0; i < n; i++) {
        if (c[i] != a[i] + b[i] * (float)(i % 3)) wrong++;
        unsigned int bits;
        std::memcpy(&bits, &c[i], 4);
        checksum = (checksum ^ bits) * 1099511628211ull;
    }
    std::printf("vecadd launches %d threads %d wrong %llu checksum %016llx\n", k, grid * block, wrong, checksum);
    CHECK(cudaFree(da)); CHECK(cudaFree(db)); CHECK(cudaFree(dc));
    return wrong ? 1 : 0;
}
