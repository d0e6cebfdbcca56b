/* Every copy, set, allocation, free and synchronization the shim hooks, called once each (cuMemFreeHost
 * twice: it frees both kinds of pinned memory; a batch of three copies runs the probe three times) with
 * its own byte count, for the host-API probes' tests
 * (tests/test_hostapi.py). Entry points come from dlsym, a few per-thread twins from cuGetProcAddress_v2
 * with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, as cudart gets them. A cubin is loaded first and
 * launched once, unless the argument is "nomodule" (then the runtime starts at the first host-API
 * call). One copy is made while its stream is captured. Prints "call SYMBOL bytes=N" for each call,
 * then "rc R". */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef int (*fn)();
typedef unsigned long long u64;

/* cuda.h's CUDA_MEMCPY2D and CUDA_MEMCPY3D */
struct copy2d {
    size_t srcXInBytes, srcY;
    int srcMemoryType;
    const void *srcHost;
    u64 srcDevice;
    void *srcArray;
    size_t srcPitch, dstXInBytes, dstY;
    int dstMemoryType;
    void *dstHost;
    u64 dstDevice;
    void *dstArray;
    size_t dstPitch, WidthInBytes, Height;
};
struct copy3d {
    size_t srcXInBytes, srcY, srcZ, srcLOD;
    int srcMemoryType;
    const void *srcHost;
    u64 srcDevice;
    void *srcArray, *srcContext;
    size_t srcPitch, srcHeight, dstXInBytes, dstY, dstZ, dstLOD;
    int dstMemoryType;
    void *dstHost;
    u64 dstDevice;
    void *dstArray, *dstContext;
    size_t dstPitch, dstHeight, WidthInBytes, Height, Depth;
};
enum { HOST = 1, DEVICE = 2 };

static const unsigned char cubin[64] = {0x7f, 'E', 'L', 'F', 2, 1, 1};
static unsigned char host[1 << 16], pinned[1 << 12];
static void *cuda;
static int rc;

static fn sym(const char *name) {
    fn f = (fn)dlsym(cuda, name);
    if (!f) printf("missing %s\n", name);
    return f;
}

static fn per_thread(const char *api, int version) {
    fn f = NULL;
    int status;
    ((int (*)(const char *, fn *, int, u64, int *))sym("cuGetProcAddress_v2"))(api, &f, version, 2, &status);
    return f;
}

#define CALL(name, bytes, ...) do { \
        printf("call %s bytes=%llu\n", name, (u64)(bytes)); \
        rc |= sym(name)(__VA_ARGS__); \
    } while (0)
#define CALL_PT(name, api, version, bytes, ...) do { \
        printf("call %s bytes=%llu\n", name, (u64)(bytes)); \
        rc |= per_thread(api, version)(__VA_ARGS__); \
    } while (0)

int main(int argc, char **argv) {
    int modules = !(argc > 1 && !strcmp(argv[1], "nomodule"));
    cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) return 2;
    void *mod = NULL, *f = NULL, *s = NULL, *graph = NULL, *hp = NULL, *hp2 = NULL;
    u64 d = 0, d2 = 0, dm = 0, da = 0, da2 = 0, dp = 0, dp2 = 0, dpitch = 0, vmm = 0;
    size_t pitch = 0;
    rc |= sym("cuInit")(0) | sym("cuStreamCreate")(&s, 0);
    if (modules) {
        rc |= sym("cuModuleLoadData")(&mod, cubin) | sym("cuModuleGetFunction")(&f, mod, "vecadd");
        rc |= sym("cuLaunchKernel")(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL);
    }
    printf("stream %#llx\n", (u64)(uintptr_t)s);

    /* allocations */
    CALL("cuMemAlloc_v2", 1000, &d, 1000);
    CALL("cuMemAllocPitch_v2", 512 * 4, &dpitch, &pitch, 100, 4, 4);
    CALL("cuMemAllocManaged", 3000, &dm, 3000, 1);
    CALL("cuMemAllocAsync", 4000, &da, 4000, s);
    CALL("cuMemAllocAsync_ptsz", 4100, &da2, 4100, NULL);
    CALL("cuMemAllocFromPoolAsync", 5000, &dp, 5000, (void *)0x77, s);
    CALL("cuMemAllocFromPoolAsync_ptsz", 5100, &dp2, 5100, (void *)0x77, NULL);
    CALL("cuMemAllocHost_v2", 6000, &hp, 6000);
    CALL("cuMemHostAlloc", 7000, &hp2, 7000, 0);
    CALL("cuMemHostRegister_v2", sizeof pinned, pinned, sizeof pinned, 0);
    CALL("cuMemCreate", 9000, &vmm, 9000, NULL, 0);
    CALL("cuMemMap", 9000, 0x7100000000ull, 9000, 0, vmm, 0);
    rc |= sym("cuMemAlloc_v2")(&d2, 1 << 16);  /* the copies' second device buffer (a second cuMemAlloc_v2) */
    printf("call cuMemAlloc_v2 bytes=%d\n", 1 << 16);

    /* copies: 1D */
    CALL("cuMemcpy", 101, d2, (u64)(uintptr_t)host, 101);        /* unified: host to device */
    CALL("cuMemcpy_ptds", 102, (u64)(uintptr_t)host, d2, 102);   /* device to host */
    CALL("cuMemcpyAsync", 103, d, d2, 103, s);                    /* device to device */
    CALL("cuMemcpyAsync_ptsz", 104, (u64)(uintptr_t)host, (u64)(uintptr_t)(host + 8192), 104, NULL); /* host */
    CALL("cuMemcpyHtoD_v2", 105, d2, host, 105);
    CALL("cuMemcpyHtoD_v2_ptds", 106, d2, host, 106);
    CALL("cuMemcpyDtoH_v2", 107, host, d2, 107);
    CALL("cuMemcpyDtoH_v2_ptds", 108, host, d2, 108);
    CALL("cuMemcpyDtoD_v2", 109, d, d2, 109);
    CALL("cuMemcpyDtoD_v2_ptds", 110, d, d2, 110);
    CALL("cuMemcpyHtoDAsync_v2", 111, d2, host, 111, s);
    CALL_PT("cuMemcpyHtoDAsync_v2_ptsz", "cuMemcpyHtoDAsync", 12000, 112, d2, host, 112, NULL);
    CALL("cuMemcpyDtoHAsync_v2", 113, host, d2, 113, s);
    CALL("cuMemcpyDtoHAsync_v2_ptsz", 114, host, d2, 114, s);
    CALL("cuMemcpyDtoDAsync_v2", 115, d, d2, 115, s);
    CALL("cuMemcpyPeer", 116, d, (void *)0x1, d2, (void *)0x2, 116);
    CALL("cuMemcpyPeer_ptds", 117, d, (void *)0x1, d2, (void *)0x2, 117);
    CALL("cuMemcpyPeerAsync", 118, d, (void *)0x1, d2, (void *)0x2, 118, s);
    CALL("cuMemcpyPeerAsync_ptsz", 119, d, (void *)0x1, d2, (void *)0x2, 119, s);
    /* copies: 2D (host to device, 64 x 3) and 3D (device to host, 32 x 2 x 2; peer: device to device) */
    struct copy2d c2 = {.srcMemoryType = HOST, .srcHost = host, .srcPitch = 64, .dstMemoryType = DEVICE,
                        .dstDevice = d2, .dstPitch = 512, .WidthInBytes = 64, .Height = 3};
    struct copy3d c3 = {.srcMemoryType = DEVICE, .srcDevice = d2, .srcPitch = 64, .srcHeight = 2,
                        .dstMemoryType = HOST, .dstHost = host, .dstPitch = 32, .dstHeight = 2,
                        .WidthInBytes = 32, .Height = 2, .Depth = 2};
    struct copy3d p3 = c3;
    p3.dstMemoryType = DEVICE, p3.dstHost = NULL, p3.dstDevice = d;
    const char *two[] = {"cuMemcpy2D_v2", "cuMemcpy2D_v2_ptds", "cuMemcpy2DUnaligned_v2",
                         "cuMemcpy2DUnaligned_v2_ptds"};
    for (int i = 0; i < 4; i++) CALL(two[i], 192, &c2);
    CALL("cuMemcpy2DAsync_v2", 192, &c2, s);
    CALL("cuMemcpy2DAsync_v2_ptsz", 192, &c2, s);
    CALL("cuMemcpy3D_v2", 128, &c3);
    CALL("cuMemcpy3D_v2_ptds", 128, &c3);
    CALL("cuMemcpy3DAsync_v2", 128, &c3, s);
    CALL("cuMemcpy3DAsync_v2_ptsz", 128, &c3, s);
    CALL("cuMemcpy3DPeer", 128, &p3);
    CALL("cuMemcpy3DPeer_ptds", 128, &p3);
    CALL("cuMemcpy3DPeerAsync", 128, &p3, s);
    CALL("cuMemcpy3DPeerAsync_ptsz", 128, &p3, s);

    /* copies to and from CUDA arrays (the stand-in's handles 0x5000, 0x6000) */
    void *arr = (void *)0x5000, *arr2 = (void *)0x6000;
    CALL("cuMemcpyHtoA_v2", 121, arr, 0, host, 121);
    CALL("cuMemcpyHtoA_v2_ptds", 122, arr, 0, host, 122);
    CALL("cuMemcpyAtoH_v2", 123, host, arr, 0, 123);
    CALL("cuMemcpyAtoH_v2_ptds", 124, host, arr, 0, 124);
    CALL("cuMemcpyDtoA_v2", 125, arr, 0, d2, 125);
    CALL("cuMemcpyDtoA_v2_ptds", 126, arr, 0, d2, 126);
    CALL("cuMemcpyAtoD_v2", 127, d, arr, 0, 127);
    CALL("cuMemcpyAtoD_v2_ptds", 128, d, arr, 0, 128);
    CALL("cuMemcpyAtoA_v2", 129, arr, 0, arr2, 0, 129);
    CALL("cuMemcpyAtoA_v2_ptds", 130, arr, 0, arr2, 0, 130);
    CALL("cuMemcpyHtoAAsync_v2", 131, arr, 0, host, 131, s);
    CALL("cuMemcpyHtoAAsync_v2_ptsz", 132, arr, 0, host, 132, s);
    CALL("cuMemcpyAtoHAsync_v2", 133, host, arr, 0, 133, s);
    CALL("cuMemcpyAtoHAsync_v2_ptsz", 134, host, arr, 0, 134, NULL);
    /* batches: three host-to-device copies each (a line per copy: the probe runs per copy) */
    u64 dsts[3] = {d, d2, d}, srcs[3] = {(u64)(uintptr_t)host, (u64)(uintptr_t)(host + 64), (u64)(uintptr_t)host};
    size_t sizes[3] = {10, 20, 30}, fail = 0;
    const char *batch[] = {"cuMemcpyBatchAsync", "cuMemcpyBatchAsync_ptsz", "cuMemcpyBatchAsync_v2",
                           "cuMemcpyBatchAsync_v2_ptsz"};
    for (int i = 0; i < 4; i++) {
        for (int k = 0; k < 3; k++) printf("call %s bytes=%zu\n", batch[i], sizes[k]);
        rc |= i < 2 ? sym(batch[i])(dsts, srcs, sizes, (size_t)3, NULL, NULL, (size_t)0, &fail, s)
                    : sym(batch[i])(dsts, srcs, sizes, (size_t)3, NULL, NULL, (size_t)0, s);
    }

    /* sets: 1D (n elements) and 2D (pitch 256, 10 x 3 elements) */
    CALL("cuMemsetD8_v2", 100, d, 0x11, 100);
    CALL_PT("cuMemsetD8_v2_ptds", "cuMemsetD8", 12000, 100, d, 0x11, 100);
    CALL("cuMemsetD16_v2", 200, d, 0x22, 100);
    CALL("cuMemsetD16_v2_ptds", 200, d, 0x22, 100);
    CALL("cuMemsetD32_v2", 400, d, 0x33, 100);
    CALL("cuMemsetD32_v2_ptds", 400, d, 0x33, 100);
    CALL("cuMemsetD2D8_v2", 30, d, 256, 0x44, 10, 3);
    CALL("cuMemsetD2D8_v2_ptds", 30, d, 256, 0x44, 10, 3);
    CALL("cuMemsetD2D16_v2", 60, d, 256, 0x55, 10, 3);
    CALL("cuMemsetD2D16_v2_ptds", 60, d, 256, 0x55, 10, 3);
    CALL("cuMemsetD2D32_v2", 120, d, 256, 0x66, 10, 3);
    CALL("cuMemsetD2D32_v2_ptds", 120, d, 256, 0x66, 10, 3);
    CALL("cuMemsetD8Async", 100, d, 0x11, 100, s);
    CALL("cuMemsetD8Async_ptsz", 100, d, 0x11, 100, s);
    CALL("cuMemsetD16Async", 200, d, 0x22, 100, s);
    CALL("cuMemsetD16Async_ptsz", 200, d, 0x22, 100, s);
    CALL("cuMemsetD32Async", 400, d, 0x33, 100, s);
    CALL("cuMemsetD32Async_ptsz", 400, d, 0x33, 100, s);
    CALL("cuMemsetD2D8Async", 30, d, 256, 0x44, 10, 3, s);
    CALL("cuMemsetD2D8Async_ptsz", 30, d, 256, 0x44, 10, 3, s);
    CALL("cuMemsetD2D16Async", 60, d, 256, 0x55, 10, 3, s);
    CALL("cuMemsetD2D16Async_ptsz", 60, d, 256, 0x55, 10, 3, s);
    CALL("cuMemsetD2D32Async", 120, d, 256, 0x66, 10, 3, s);
    CALL("cuMemsetD2D32Async_ptsz", 120, d, 256, 0x66, 10, 3, s);

    /* a copy into a graph being captured (relaxed mode) */
    rc |= sym("cuStreamBeginCapture_v2")(s, 2);
    CALL("cuMemcpyDtoDAsync_v2_ptsz", 120, d, d2, 120, s);
    rc |= sym("cuStreamEndCapture")(s, &graph);

    /* nodes added to a graph: the 3D copy above (device to host), a 2D set of 10 x 3 four-byte elements */
    struct { u64 dst; size_t pitch; unsigned value, element; size_t width, height; } set = {d, 256, 0x77, 4, 10, 3};
    CALL("cuGraphAddMemcpyNode", 128, NULL, (void *)0x6a, NULL, (size_t)0, &c3, NULL);
    CALL("cuGraphAddMemsetNode", 120, NULL, (void *)0x6a, NULL, (size_t)0, &set, NULL);

    /* synchronization */
    CALL("cuStreamSynchronize", 0, s);
    CALL_PT("cuStreamSynchronize_ptsz", "cuStreamSynchronize", 12000, 0, NULL);
    CALL("cuEventSynchronize", 0, (void *)0x99);
    CALL("cuCtxSynchronize", 0);
    CALL("cuCtxSynchronize_v2", 0, (void *)0x33);

    /* frees: the probe sees the size the allocation had */
    CALL("cuMemFree_v2", 1000, d);
    CALL("cuMemFreeAsync", 4000, da, s);
    CALL("cuMemFreeAsync_ptsz", 4100, da2, NULL);
    CALL("cuMemFreeHost", 6000, hp);
    CALL("cuMemFreeHost", 7000, hp2);
    CALL("cuMemHostUnregister", sizeof pinned, pinned);
    CALL("cuMemUnmap", 9000, 0x7100000000ull, 9000);
    CALL("cuMemRelease", 9000, vmm);
    printf("rc %d\n", rc);
    return rc != 0;
}
