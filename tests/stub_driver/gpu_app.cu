// A plain CUDA runtime program for the GPU tests: 10 launches of one kernel, then a checksum and
// the shim's launch count (when preloaded). Built with static or shared cudart.
#include <cstdio>
#include <dlfcn.h>

__global__ void bump(unsigned *a, unsigned step) { a[blockIdx.x * blockDim.x + threadIdx.x] += step + threadIdx.x; }

struct egpu_stats { unsigned long long launches, redirected, records, dropped, untracked, python_calls; };

int main() {
    const int n = 256 * 64;
    unsigned *d, h[n];
    cudaMalloc(&d, sizeof h);
    cudaMemset(d, 0, sizeof h);
    for (unsigned i = 0; i < 10; i++) bump<<<64, 256>>>(d, i);
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    unsigned long long sum = 0;
    for (int i = 0; i < n; i++) sum = sum * 31 + h[i];
    printf("checksum %llu error %d\n", sum, (int)cudaGetLastError());
    void (*stats)(egpu_stats *) = (void (*)(egpu_stats *))dlsym(RTLD_DEFAULT, "egpu_shim_stats");
    if (stats) {
        egpu_stats s;
        stats(&s);
        printf("egpu launches %llu python_calls %llu\n", s.launches, s.python_calls);
    }
    return 0;
}
