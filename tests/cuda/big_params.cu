// By-value parameters near CUDA 12.1's 32 KB limit, structs of odd sizes and alignments, a bool, a half,
// a char first (the launch id's offset depends on all of them), __grid_constant__ parameters whose
// address the kernel takes (cvta.param), and a kernel without parameters.
#include <cuda_fp16.h>
struct Big { int v[8180]; };                                   // 32720 bytes
struct Odd { char c; short s; char d[3]; };                    // 8 bytes, align 2
struct __align__(16) Wide { double x; char tag; };             // 16 bytes, align 16
struct Packed { char b[5]; };                                  // 5 bytes, align 1
extern "C" __global__ void big_param(Big big, int *out) {
    out[threadIdx.x] = big.v[threadIdx.x] + big.v[8179];
}
extern "C" __global__ void odd_params(char c, Wide w, Odd o, bool f, __half h, Packed pk, float *out) {
    out[threadIdx.x] = c + o.s + o.d[2] + f + __half2float(h) + w.x + w.tag + pk.b[4];
}
extern "C" __global__ void grid_const(const __grid_constant__ Big big, const __grid_constant__ Odd o, int *out) {
    const int *p = &big.v[threadIdx.x];      // the parameter's address: a generic load from param space
    out[threadIdx.x] = *p + o.s;
}
extern "C" __global__ void no_params() {
    __shared__ int s;
    if (threadIdx.x == 0) s = 1;
    __syncthreads();
    if (s != 1) __trap();
}
