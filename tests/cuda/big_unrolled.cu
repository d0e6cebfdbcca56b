// A long straight-line kernel: a 64-tap filter, fully unrolled, 8 outputs per thread.
#define TAPS 64
#define OUTS 8
__constant__ float coeff[TAPS];
extern "C" __global__ void big_unrolled(const float *in, float *out, int n) {
    int base = (blockIdx.x * blockDim.x + threadIdx.x) * OUTS;
    if (base + OUTS + TAPS > n) return;
#pragma unroll
    for (int o = 0; o < OUTS; ++o) {
        float acc = 0.0f;
#pragma unroll
        for (int t = 0; t < TAPS; ++t) acc += coeff[t] * in[base + o + t];
        out[base + o] = acc;
    }
}
