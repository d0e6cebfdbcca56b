// sm_90a only, compiled not run: a wgmma.mma_async sequence as CUTLASS emits it (fence, scoped
// predicate, commit, wait), with a global load before and a global store after.
extern "C" __global__ void wgmma_m64n8k16(const float *in, float *out, unsigned long long da,
                                          unsigned long long db, int accumulate) {
    float d0 = in[threadIdx.x], d1 = 0.f, d2 = 0.f, d3 = 0.f;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "l"(da), "l"(db), "r"(accumulate));
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
    float4 r = make_float4(d0, d1, d2, d3);
    reinterpret_cast<float4 *>(out)[threadIdx.x] = r;
}
