/* egpu_hostapi.h: host-API probes (SEC("egpu/memcpy/GLOB"), egpu/memset, egpu/alloc, egpu/free,
 * egpu/sync) run by the hooks themselves, in the calling thread, in C (shim/hostapi.c builds the context,
 * shim/launchvm.c runs the programs on the probe object's host maps, the launch probes' own). Parts as in
 * egpu_shim.h.
 *
 * Every hooked driver entry point has an API number: its row in EGPU_HOST_ALL (interpose.c's table,
 * cow.c's, the sync hooks below), the index egpu_lvm_route_api takes. A hook with a host-API section
 * brackets its driver call: t = EGPU_HOST_BEGIN(sym) (0 unless a program is routed to that API: one
 * relaxed load), then EGPU_HOST_END(sym, t, result, fields...) runs the programs after the call returned,
 * with the time the thread spent in it. The runtime's own calls (egpu_shim_bypass, Python callbacks)
 * run nothing.
 */
#ifndef EGPU_HOSTAPI_H
#define EGPU_HOSTAPI_H

/* ---- part 1: implemented in Python (embedding_api) ---- */

/* Does nothing: its first call starts Python, whose init code attaches the runtime (as any part-1 call
 * does). The first host-API hook of a job with host-API probes (EGPU_HOST_APIS=1) calls it, so a program
 * that copies or allocates before it loads any module is seen from its first call. */
void egpu_py_start(void);

/* ---- part 2: C API for the runtime (cdef) ---- */

/* The hooked driver APIs by number: symbols[i] (the exported symbol), apis[i] (what cuGetProcAddress is
 * asked for) and sections[i] ("memcpy", "memset", "alloc", "free", "sync"; "" where the hook runs no
 * host-API probe), for the first `max`; returns how many there are. */
size_t egpu_host_apis(const char **symbols, const char **apis, const char **sections, size_t max);

/* ---- part 3: C only ---- */

/* cuda.h's CUDA_MEMSET_NODE_PARAMS (_v1) */
typedef struct {
    CUdeviceptr dst;
    size_t pitch;
    unsigned int value, elementSize;
    size_t width, height;
} CUDA_MEMSET_NODE_PARAMS;

/* The hooks of hostapi.c, rows as in EGPU_HOOKS: synchronization, the copies cow.c does not hook (to and
 * from CUDA arrays, batches, copy and set nodes added to a graph). cuStreamWaitEvent is not among them: it
 * makes a stream wait on the GPU and returns at once (cow.c hooks it). */
#define EGPU_HOSTAPI_HOOKS(X) \
    X(cuStreamSynchronize, cuStreamSynchronize, 2000, 0, (CUstream hStream)) \
    X(cuStreamSynchronize_ptsz, cuStreamSynchronize, 7000, 1, (CUstream hStream)) \
    X(cuEventSynchronize, cuEventSynchronize, 2000, 0, (CUevent hEvent)) \
    X(cuCtxSynchronize, cuCtxSynchronize, 2000, 0, (void)) \
    X(cuCtxSynchronize_v2, cuCtxSynchronize, 13000, 0, (CUcontext ctx)) \
    X(cuMemcpyHtoA_v2, cuMemcpyHtoA, 3020, 0, \
      (CUarray dstArray, size_t dstOffset, const void *srcHost, size_t ByteCount)) \
    X(cuMemcpyHtoA_v2_ptds, cuMemcpyHtoA, 7000, 2, \
      (CUarray dstArray, size_t dstOffset, const void *srcHost, size_t ByteCount)) \
    X(cuMemcpyAtoH_v2, cuMemcpyAtoH, 3020, 0, (void *dstHost, CUarray srcArray, size_t srcOffset, size_t ByteCount)) \
    X(cuMemcpyAtoH_v2_ptds, cuMemcpyAtoH, 7000, 2, \
      (void *dstHost, CUarray srcArray, size_t srcOffset, size_t ByteCount)) \
    X(cuMemcpyDtoA_v2, cuMemcpyDtoA, 3020, 0, \
      (CUarray dstArray, size_t dstOffset, CUdeviceptr srcDevice, size_t ByteCount)) \
    X(cuMemcpyDtoA_v2_ptds, cuMemcpyDtoA, 7000, 2, \
      (CUarray dstArray, size_t dstOffset, CUdeviceptr srcDevice, size_t ByteCount)) \
    X(cuMemcpyAtoD_v2, cuMemcpyAtoD, 3020, 0, \
      (CUdeviceptr dstDevice, CUarray srcArray, size_t srcOffset, size_t ByteCount)) \
    X(cuMemcpyAtoD_v2_ptds, cuMemcpyAtoD, 7000, 2, \
      (CUdeviceptr dstDevice, CUarray srcArray, size_t srcOffset, size_t ByteCount)) \
    X(cuMemcpyAtoA_v2, cuMemcpyAtoA, 3020, 0, \
      (CUarray dstArray, size_t dstOffset, CUarray srcArray, size_t srcOffset, size_t ByteCount)) \
    X(cuMemcpyAtoA_v2_ptds, cuMemcpyAtoA, 7000, 2, \
      (CUarray dstArray, size_t dstOffset, CUarray srcArray, size_t srcOffset, size_t ByteCount)) \
    X(cuMemcpyHtoAAsync_v2, cuMemcpyHtoAAsync, 3020, 0, \
      (CUarray dstArray, size_t dstOffset, const void *srcHost, size_t ByteCount, CUstream hStream)) \
    X(cuMemcpyHtoAAsync_v2_ptsz, cuMemcpyHtoAAsync, 7000, 1, \
      (CUarray dstArray, size_t dstOffset, const void *srcHost, size_t ByteCount, CUstream hStream)) \
    X(cuMemcpyAtoHAsync_v2, cuMemcpyAtoHAsync, 3020, 0, \
      (void *dstHost, CUarray srcArray, size_t srcOffset, size_t ByteCount, CUstream hStream)) \
    X(cuMemcpyAtoHAsync_v2_ptsz, cuMemcpyAtoHAsync, 7000, 1, \
      (void *dstHost, CUarray srcArray, size_t srcOffset, size_t ByteCount, CUstream hStream)) \
    X(cuMemcpyBatchAsync, cuMemcpyBatchAsync, 12080, 0, \
      (CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, void *attrs, size_t *attrsIdxs, \
       size_t numAttrs, size_t *failIdx, CUstream hStream)) \
    X(cuMemcpyBatchAsync_ptsz, cuMemcpyBatchAsync, 12080, 1, \
      (CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, void *attrs, size_t *attrsIdxs, \
       size_t numAttrs, size_t *failIdx, CUstream hStream)) \
    X(cuMemcpyBatchAsync_v2, cuMemcpyBatchAsync, 13000, 0, \
      (CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, void *attrs, size_t *attrsIdxs, \
       size_t numAttrs, CUstream hStream)) \
    X(cuMemcpyBatchAsync_v2_ptsz, cuMemcpyBatchAsync, 13000, 1, \
      (CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, void *attrs, size_t *attrsIdxs, \
       size_t numAttrs, CUstream hStream)) \
    X(cuGraphAddMemcpyNode, cuGraphAddMemcpyNode, 10000, 0, \
      (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies, \
       const CUDA_MEMCPY3D *copyParams, CUcontext ctx)) \
    X(cuGraphAddMemsetNode, cuGraphAddMemsetNode, 10000, 0, \
      (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies, \
       const CUDA_MEMSET_NODE_PARAMS *memsetParams, CUcontext ctx))

/* Every hooked symbol, in API-number order. */
#define EGPU_HOST_ALL(X) EGPU_HOOKS(X) EGPU_COW_HOOKS(X) EGPU_HOSTAPI_HOOKS(X)

enum egpu_host_api {
#define X(sym, api, ver, ptsz, params) EGPU_H_##sym,
    EGPU_HOST_ALL(X)
#undef X
    EGPU_H_COUNT
};

/* struct egpu_host_ctx's kinds and flags (egpu_preload/bpf/ctx.py, egpu.bpf.h): copy kinds are
 * egpu_op_kind's, allocation kinds egpu_alloc_kind's. */
enum { EGPU_COPY_H2D = 1, EGPU_COPY_D2H, EGPU_COPY_D2D, EGPU_COPY_H2H, EGPU_COPY_PEER, EGPU_COPY_SET };
enum { EGPU_SYNC_STREAM = 1, EGPU_SYNC_EVENT, EGPU_SYNC_CONTEXT };
enum { EGPU_HOST_F_ASYNC = 1, EGPU_HOST_F_PER_THREAD = 2, EGPU_HOST_F_STRIDED = 4, EGPU_HOST_F_GRAPH = 8 };

/* What a hook knows of one call, besides the API and the result. */
struct egpu_host_call {
    unsigned long long dst, src, bytes, stream, handle;
    unsigned int kind, flags;
};

/* 0 when calls of `api` run no program now or this thread's calls are the runtime's; else the time. */
unsigned long long egpu_host_begin(int api);
/* Run `api`'s programs on the call (`t0` from egpu_host_begin). */
void egpu_host_end(int api, unsigned long long t0, int result, const struct egpu_host_call *call);
/* A per-thread twin's stream: the legacy default stream (0) there means the per-thread stream. */
#define EGPU_HOST_STREAM(s, per_thread) ((s) || !(per_thread) ? (unsigned long long)(uintptr_t)(s) : 2ull)

#define EGPU_HOST_BEGIN(sym) egpu_host_begin(EGPU_H_##sym)
#define EGPU_HOST_END(sym, t0, result, ...) do { \
        if (__builtin_expect((t0) != 0, 0)) { \
            struct egpu_host_call c_ = {__VA_ARGS__}; \
            egpu_host_end(EGPU_H_##sym, (t0), (result), &c_); \
        } \
    } while (0)

#endif /* EGPU_HOSTAPI_H */
