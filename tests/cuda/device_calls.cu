// Non-inlined device functions called from a kernel; they take pointers and return values.
__device__ __noinline__ float load_twice(const float *p, int i) { return p[i] + p[i]; }
__device__ __noinline__ void store_at(float *p, int i, float v) { p[i] = v; }
extern "C" __global__ void device_calls(const float *in, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) store_at(out, i, load_twice(in, i));
}
