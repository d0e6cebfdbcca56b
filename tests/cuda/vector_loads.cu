// float4 and half2 vector loads/stores: ld.global.v4.f32, 32-bit half2 accesses.
#include <cuda_fp16.h>
extern "C" __global__ void add_float4(const float4 *a, const float4 *b, float4 *c, int n4) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) {
        float4 x = a[i], y = b[i];
        c[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    }
}
extern "C" __global__ void add_half2(const __half2 *a, const __half2 *b, __half2 *c, int n2) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n2) c[i] = __hadd2(a[i], b[i]);
}
