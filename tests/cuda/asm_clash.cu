// Inline asm with its own labels, nested braces, a ret and an exit inside a scope, registers named like
// nvcc's (%rd1, %r1, %p1) and like egpu's sites use (a, t, m, q without the prefix), a loop written in asm,
// memory ops through scoped registers, and a guarded store inside a scope.
extern "C" __global__ void asm_clash(float *p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v;
    asm volatile("{\n\t.reg .b64 %%rd1;\n\t.reg .pred %%p1;\n\t.reg .b32 %%r1;\n\t"
                 "mov.b64 %%rd1, %1;\n\tmov.b32 %%r1, 0;\n"
                 "$Lmyloop:\n\t"
                 "ld.global.f32 %0, [%%rd1];\n\t"
                 "add.s32 %%r1, %%r1, 1;\n\t"
                 "setp.lt.s32 %%p1, %%r1, %2;\n\t"
                 "@%%p1 bra $Lmyloop;\n\t}"
                 : "=f"(v) : "l"(p + i), "r"(4));
    asm volatile("{\n\t.reg .b64 a, t;\n\t.reg .b32 m;\n\t.reg .pred q;\n\t"
                 "mov.b64 a, %0;\n\tmov.b32 m, %1;\n\tsetp.gt.s32 q, m, 100;\n\t"
                 "{\n\t.reg .b64 a;\n\tadd.s64 a, t, 0;\n\t}\n\t"
                 "@q st.global.f32 [a+4], %2;\n\t}"
                 :: "l"(p + i), "r"(i), "f"(v) : "memory");
    if (i > n) {
        asm volatile("{\n\t.reg .pred %%p;\n\tsetp.ne.s32 %%p, %0, 0;\n\t@%%p exit;\n\t}" :: "r"(i));
    }
    if (i == n) asm volatile("{\n\t{\n\tret;\n\t}\n\t}");
    p[i] = v;
}
