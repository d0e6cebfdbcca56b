/* The test program, built SASS-only (-gencode arch=compute_90,code=sm_90: no PTX in the binary).
 * Kernels with a known access pattern; prints EXPECT lines (what an exact tool must count per launch) and
 * HASH lines (outputs, compared with a run without the tool).
 *
 *   target plain   no tool calls (the tool comes from CUDA_INJECTION64_PATH or LD_PRELOAD)
 *   target early   dlopen(SASS_TOOL_LIB) and sass_tool_start() before the first CUDA call
 *   target late    CUDA initialised and both kernels run once first; then dlopen + sass_tool_start() and
 *                  sass_tool_patch_module() on the kernels' module (found with cudaGetKernel ->
 *                  cuKernelGetFunction -> cuFuncGetModule), as egpu's shim would after the fact */
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

__global__ void vecadd(const float* a, const float* b, float* c, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        c[i] = a[i] + b[i];
}

__global__ void copyk(const float* src, float* dst, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        dst[i] = src[i];
}

static void check(cudaError_t e, const char* what)
{
    if (e != cudaSuccess) {
        fprintf(stderr, "target: %s: %s\n", what, cudaGetErrorString(e));
        exit(2);
    }
}

static void* tool(const char* sym)
{
    const char* path = getenv("SASS_TOOL_LIB");
    void* h = path ? dlopen(path, RTLD_NOW | RTLD_GLOBAL) : nullptr;
    void* f = h ? dlsym(h, sym) : nullptr;
    if (!f) {
        fprintf(stderr, "target: cannot load %s from SASS_TOOL_LIB=%s: %s\n", sym, path ? path : "(unset)", dlerror());
        exit(3);
    }
    return f;
}

static int start_tool()
{
    int rc = ((int (*)(void))tool("sass_tool_start"))();
    printf("TOOLSTART rc=%d\n", rc);
    return rc;
}

static unsigned long long fnv(const void* p, size_t n)
{
    unsigned long long h = 0xCBF29CE484222325ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const unsigned char*)p)[i]) * 0x100000001B3ULL;
    return h;
}

int main(int argc, char** argv)
{
    const char* mode = argc > 1 ? argv[1] : "plain";
    const int n = 1000003;          // not a multiple of the block: the bounds check matters
    const int n2 = 777777;          // copyk: grid-stride loop over n2 with a fixed grid
    const int launches = 3;
    const int vb = 256, vg = (n + vb - 1) / vb, cb = 512, cg = 120;

    if (!strcmp(mode, "early") && start_tool() != 0)
        return 4;

    std::vector<float> ha(n), hb(n), hc(n), hs(n2), hd(n2);
    for (int i = 0; i < n; i++)
        ha[i] = i * 0.5f, hb[i] = 1.0f / (i + 1);
    for (int i = 0; i < n2; i++)
        hs[i] = i * 0.25f - 3.0f;
    float *a, *b, *c, *s, *d;
    check(cudaMalloc(&a, n * 4), "malloc");
    check(cudaMalloc(&b, n * 4), "malloc");
    check(cudaMalloc(&c, n * 4), "malloc");
    check(cudaMalloc(&s, n2 * 4), "malloc");
    check(cudaMalloc(&d, n2 * 4), "malloc");
    check(cudaMemcpy(a, ha.data(), n * 4, cudaMemcpyHostToDevice), "h2d");
    check(cudaMemcpy(b, hb.data(), n * 4, cudaMemcpyHostToDevice), "h2d");
    check(cudaMemcpy(s, hs.data(), n2 * 4, cudaMemcpyHostToDevice), "h2d");

    if (!strcmp(mode, "late")) {
        vecadd<<<vg, vb>>>(a, b, c, n);
        copyk<<<cg, cb>>>(s, d, n2);
        check(cudaDeviceSynchronize(), "warm-up");
        if (start_tool() != 0)
            return 4;
        cudaKernel_t k;
        CUfunction f;
        CUmodule m;
        CUcontext ctx;
        check(cudaGetKernel(&k, (const void*)vecadd), "cudaGetKernel");
        if (cuKernelGetFunction(&f, (CUkernel)k) != CUDA_SUCCESS || cuFuncGetModule(&m, f) != CUDA_SUCCESS ||
            cuCtxGetCurrent(&ctx) != CUDA_SUCCESS) {
            fprintf(stderr, "target: cannot find the kernels' module\n");
            return 5;
        }
        int rc = ((int (*)(CUcontext, CUmodule))tool("sass_tool_patch_module"))(ctx, m);
        printf("TOOLPATCH rc=%d\n", rc);
    }

    for (int r = 0; r < launches; r++) {
        vecadd<<<vg, vb>>>(a, b, c, n);
        check(cudaGetLastError(), "vecadd");
        copyk<<<cg, cb>>>(s, d, n2);
        check(cudaGetLastError(), "copyk");
    }
    check(cudaDeviceSynchronize(), "sync");
    check(cudaMemcpy(hc.data(), c, n * 4, cudaMemcpyDeviceToHost), "d2h");
    check(cudaMemcpy(hd.data(), d, n2 * 4, cudaMemcpyDeviceToHost), "d2h");

    int bad = 0;
    for (int i = 0; i < n; i++)
        bad += hc[i] != ha[i] + hb[i];
    for (int i = 0; i < n2; i++)
        bad += hd[i] != hs[i];
    printf("VERIFY %s wrong=%d\n", bad ? "FAIL" : "ok", bad);
    printf("EXPECT kernel=vecadd launches=%d threads=%d blocks=%d warps=%d loads=%d stores=%d ldbytes=%lld "
           "stbytes=%lld\n", launches, vg * vb, vg, vg * vb / 32, 2 * n, n, 8LL * n, 4LL * n);
    printf("EXPECT kernel=copyk launches=%d threads=%d blocks=%d warps=%d loads=%d stores=%d ldbytes=%lld "
           "stbytes=%lld\n", launches, cg * cb, cg, cg * cb / 32, n2, n2, 4LL * n2, 4LL * n2);
    printf("HASH vecadd=%016llx copyk=%016llx\n", fnv(hc.data(), n * 4), fnv(hd.data(), n2 * 4));
    return bad ? 1 : 0;
}
