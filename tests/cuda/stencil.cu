// 1-D 3-point stencil over the interior: out[i] = (in[i-1] + in[i] + in[i+1]) / 3 for 0 < i < n-1.
extern "C" __global__ void stencil3(const float *in, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i > 0 && i < n - 1) out[i] = (in[i - 1] + in[i] + in[i + 1]) * (1.0f / 3.0f);
}
