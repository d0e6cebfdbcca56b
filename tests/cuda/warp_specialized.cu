// sm_90a: a warp-specialized kernel as CUTLASS and FlashAttention-3 write them for Hopper. The producer
// warpgroup gives registers back (setmaxnreg.dec), the consumer warpgroup takes them (setmaxnreg.inc); the
// rewriter inlines probes in such a kernel, since ptxas cannot allocate a call to a large one after the .dec.
extern "C" __global__ void __launch_bounds__(256, 1) warp_specialized(const float *in, float *out, int n) {
    int i = blockIdx.x * 128 + (threadIdx.x & 127);
    if (threadIdx.x < 128) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
#endif
        if (i < n)
            out[i] = in[i] * 2.0f;
    } else {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
#endif
        if (i < n)
            out[n + i] = in[i] + 1.0f;
    }
}

// The same roles with setmaxnreg inside __noinline__ device functions, two calls deep (a library's role
// switch): the kernel runs setmaxnreg all the same, so the rewriter inlines its probes too.
__device__ __noinline__ void give_registers() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
#endif
}

__device__ __noinline__ void take_registers() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
#endif
}

__device__ __noinline__ void take_role(bool producer) {
    if (producer)
        give_registers();
    else
        take_registers();
}

extern "C" __global__ void __launch_bounds__(256, 1) warp_specialized_calls(const float *in, float *out, int n) {
    int i = blockIdx.x * 128 + (threadIdx.x & 127);
    take_role(threadIdx.x < 128);
    if (i < n)
        out[threadIdx.x < 128 ? i : n + i] = threadIdx.x < 128 ? in[i] * 2.0f : in[i] + 1.0f;
}
