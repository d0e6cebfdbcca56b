// CUTLASS-style code: inline asm with `{ }` scoped registers and predicates, a texture object read,
// a surface write, and a predicated global load written in asm.
extern "C" __global__ void inline_asm(const float *in, float *out, cudaTextureObject_t tex,
                                      cudaSurfaceObject_t surf, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = 0.0f;
    asm volatile("{\n\t.reg .pred p;\n\tsetp.lt.s32 p, %1, %2;\n\t@p ld.global.nc.f32 %0, [%3];\n\t}\n"
                 : "+f"(v) : "r"(i), "r"(n), "l"(in + i));
    float t = tex1Dfetch<float>(tex, i);
    unsigned lane;
    asm("mov.u32 %0, %%laneid;" : "=r"(lane));
    if (i < n) {
        out[i] = v + t + (float)lane;
        surf1Dwrite(v, surf, i * 4);
    }
}
