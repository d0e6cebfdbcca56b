// __constant__ data filling the 64 KB a module may have: the probes' map tables (.const) leave no room.
__constant__ float coeff[16384];
extern "C" __global__ void constant_bank(const float *in, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * coeff[i & 16383];
}
