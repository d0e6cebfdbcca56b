// Relocatable device code (built with nvcc -rdc=true): template instantiations, the device
// functions they call and C++17 inline variables come out .weak, since another translation unit
// may define them too; the extern "C" kernel stays .visible.
template <typename T>
__device__ __noinline__ T clamp_to(T v, T hi) { return v < hi ? v : hi; }

__device__ inline int weak_hits = 0;   // one definition across the linked program

template <typename T>
__global__ void clamp_all(T *x, T hi, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] = clamp_to(x[i], hi);
        atomicAdd(&weak_hits, 1);
    }
}
template __global__ void clamp_all<float>(float *, float, int);
template __global__ void clamp_all<int>(int *, int, int);

extern "C" __global__ void strong_kernel(float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = clamp_to(x[i], 1.0f) + weak_hits;
}
