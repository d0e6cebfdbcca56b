// bpftime's example/gpu vec_add, reduced: vectorAdd(const float*, const float*, float*) (the kernel its
// probes name, _Z9vectorAddPKfS0_Pf) launched K times on one thread, each launch awaited, 20 ms apart.
#include <cstdio>
#include <cstdlib>
#include <unistd.h>

__global__ void vectorAdd(const float *A, const float *B, float *C) {
    int i = threadIdx.x;
    C[i] = A[i] + B[i];
}

int main(int argc, char **argv) {
    int k = argc > 1 ? std::atoi(argv[1]) : 5;
    float *a, *b, *c;
    cudaMalloc(&a, sizeof(float));
    cudaMalloc(&b, sizeof(float));
    cudaMalloc(&c, sizeof(float));
    for (int i = 0; i < k; i++) {
        vectorAdd<<<1, 1>>>(a, b, c);
        cudaDeviceSynchronize();
        usleep(20000);
    }
    std::printf("vectoradd_bpftime launches=%d error=%d\n", k, (int)cudaGetLastError());
    return 0;
}
