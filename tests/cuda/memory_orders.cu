// Memory orders, cache operators and atomics of several types and spaces; exit, trap and brkpt in asm;
// a return from inside a loop; a generic pointer that may be shared or global.
#include <cuda/atomic>
#include <cuda_fp16.h>
extern "C" __global__ void memory_orders(int *g, volatile int *vg, const int *__restrict__ ro, double *d,
                                         unsigned long long *u, float *f, const float4 *f4, int n) {
    __shared__ int sh[32];
    int i = threadIdx.x;
    if (i >= n) asm volatile("exit;");
    int a = vg[i], b = __ldg(ro + i), c, e;
    asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(c) : "l"(g + i));
    asm volatile("ld.acquire.gpu.s32 %0, [%1];" : "=r"(e) : "l"(g + i + 1));
    asm volatile("prefetch.global.L2 [%0];" ::"l"(g + 64));
    asm volatile("st.release.sys.global.s32 [%0], %1;" ::"l"(g + i + 2), "r"(c));
    float4 x = __ldcs(f4 + i), y = __ldlu(f4 + i + 1);
    __stcs(f + i, x.x + y.y);
    __stwt(f + i + n, __ldcv(f + i));
    sh[i] = a;
    int *gen = (i & 1) ? sh : g;   // one generic access, shared or global by lane
    gen[i] += b;
    atomicAdd(d, 1.0);
    atomicExch(u, 3ull);
    atomicMin(g, a);
    atomicAnd(g + 1, b);
    atomicXor(g + 3, e);
    atomicInc((unsigned *)g + 4, 9u);
    atomicAdd((__half2 *)f + 1, __half2());
    atomicAdd_block(sh + (i + 1) % 32, 1);
    cuda::atomic_ref<int, cuda::thread_scope_device>(g[5]).fetch_add(1, cuda::memory_order_acq_rel);
    if (x.z < 0) __trap();
    if (x.w < 0) __brkpt();
    for (int k = 0; k < n; ++k) {
        if (g[k] == 7) return;
        if (g[k] == 8) asm volatile("exit;");
        g[k + n] += 1;
    }
}
