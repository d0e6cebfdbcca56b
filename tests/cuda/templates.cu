// One template, several instantiations (mangled names differ; globs match mangled or demangled).
template <typename T, int K>
__global__ void scale(T *x, T a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
#pragma unroll
        for (int k = 0; k < K; ++k) x[i] = x[i] * a;
    }
}
template __global__ void scale<float, 1>(float *, float, int);
template __global__ void scale<double, 2>(double *, double, int);
template __global__ void scale<int, 1>(int *, int, int);
template __global__ void scale<unsigned char, 3>(unsigned char *, unsigned char, int);
