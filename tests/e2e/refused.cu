// refused N: two kernels, one of which egpu's PTX rewriter must leave alone (it names a global in the
// rewriter's reserved __egpu prefix); the program's result must be the same with and without egpu, the
// other kernel is instrumented, and egpu reports why the first was not.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    std::printf("error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); return 1; } } while (0)

__device__ int __egpu_scale = 3;

extern "C" __global__ void scaled(int *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = i * __egpu_scale;
}

extern "C" __global__ void plus_one(int *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] += 1;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? std::atoi(argv[1]) : 1 << 16;   // a multiple of 256
    int *d, *h = (int *)std::malloc(sizeof(int) * n);
    CHECK(cudaMalloc(&d, sizeof(int) * n));
    scaled<<<n / 256, 256>>>(d, n);
    plus_one<<<n / 256, 256>>>(d, n);
    CHECK(cudaMemcpy(h, d, sizeof(int) * n, cudaMemcpyDeviceToHost));
    long long wrong = 0, sum = 0;
    for (int i = 0; i < n; i++) {
        wrong += h[i] != 3 * i + 1;
        sum += h[i];
    }
    std::printf("refused threads %d wrong %lld sum %lld\n", n, wrong, sum);
    return wrong ? 1 : 0;
}
