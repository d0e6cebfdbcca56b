// Short conditional stores nvcc turns into predicated st.global.
extern "C" __global__ void predicated_store(const int *in, int *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        int v = in[i];
        if (v & 1) out[i] = v;
    }
}
