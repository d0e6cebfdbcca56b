// Several returns: threads leave at different points; each thread exits exactly once.
extern "C" __global__ void early_return(const int *in, int *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int v = in[i];
    if (v < 0) { out[i] = -1; return; }
    if (v == 0) return;
    out[i] = v * 2;
}
