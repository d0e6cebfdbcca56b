/* hostapi.c: host-API probes in the hooks (egpu_hostapi.h): the table of APIs the runtime routes
 * programs to, the context of one call (struct egpu_host_ctx, egpu_preload/bpf/ctx.py HOST), and the
 * synchronization hooks. Copies and sets are hooked in cow.c, allocations and frees in interpose.c; each
 * brackets its driver call with EGPU_HOST_BEGIN/END. The programs run in launchvm.c.
 *
 * Cost: with no program on an API, one relaxed load per call. With one, two clock reads, the context,
 * the probe under launchvm.c's lock (shared with the launch drain), and for cuMemcpy/cuMemcpyAsync (the
 * unified-addressing copies, whose direction the call does not say) one cuPointerGetAttribute per
 * operand; while a stream capture the shim saw begin is in progress, one cuStreamIsCapturing.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "egpu_shim.h"
#include "egpu_cow.h"
#include "egpu_gate.h"
#include "egpu_hostapi.h"
#include "egpu_launchvm.h"

#define EXPORT __attribute__((visibility("default")))
#define CUDA_SUCCESS 0
#define CUDA_ERROR_NOT_FOUND 500
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_MEMORYTYPE_DEVICE 2
#define CU_MEMORYTYPE_UNIFIED 4
#define CU_STREAM_CAPTURE_STATUS_ACTIVE 1
#define P(x) ((unsigned long long)(uintptr_t)(x))

_Static_assert(EGPU_H_COUNT <= EGPU_LVM_APIS, "launchvm.c's route table must hold every hooked API");

/* struct egpu_host_ctx (egpu_preload/bpf/ctx.py HOST_FIELDS; test_hostapi.py reads it back field by field) */
#define CTX_BASE 144
#define CTX_SIZE (CTX_BASE + 72)
struct host_ctx {
    unsigned char gpu_part[CTX_BASE];
    unsigned long long api_id, dst, src, bytes, stream, handle, blocked_ns;
    unsigned int kind, flags;
    int result;
    unsigned int pad;
};
_Static_assert(sizeof(struct host_ctx) == CTX_SIZE, "struct egpu_host_ctx is 216 bytes");

/* ---- the table ---- */

static const struct { const char *symbol, *api; } apis[EGPU_H_COUNT] = {
#define X(sym, api_, ver, ptsz, params) [EGPU_H_##sym] = {#sym, #api_},
    EGPU_HOST_ALL(X)
#undef X
};

/* Which section a hook runs: the hooks below, cow.c's copies and sets, interpose.c's allocations. */
static const char *section_of(const char *api) {
    static const char *const alloc[] = {"cuMemAlloc", "cuMemAllocPitch", "cuMemAllocManaged", "cuMemAllocAsync",
                                        "cuMemAllocFromPoolAsync", "cuMemAllocHost", "cuMemHostAlloc",
                                        "cuMemHostRegister", "cuMemCreate", "cuMemMap"};
    static const char *const free_[] = {"cuMemFree", "cuMemFreeAsync", "cuMemFreeHost", "cuMemHostUnregister",
                                        "cuMemRelease", "cuMemUnmap"};
    static const char *const sync[] = {"cuStreamSynchronize", "cuEventSynchronize", "cuCtxSynchronize"};
    if (!strncmp(api, "cuMemcpy", 8) || !strcmp(api, "cuGraphAddMemcpyNode")) return "memcpy";
    if (!strncmp(api, "cuMemset", 8) || !strcmp(api, "cuGraphAddMemsetNode")) return "memset";
    for (size_t i = 0; i < sizeof alloc / sizeof *alloc; i++) if (!strcmp(api, alloc[i])) return "alloc";
    for (size_t i = 0; i < sizeof free_ / sizeof *free_; i++) if (!strcmp(api, free_[i])) return "free";
    for (size_t i = 0; i < sizeof sync / sizeof *sync; i++) if (!strcmp(api, sync[i])) return "sync";
    return "";
}

EXPORT size_t egpu_host_apis(const char **symbols, const char **api_names, const char **sections, size_t max) {
    for (size_t i = 0; i < EGPU_H_COUNT && i < max; i++)
        symbols[i] = apis[i].symbol, api_names[i] = apis[i].api, sections[i] = section_of(apis[i].api);
    return EGPU_H_COUNT;
}

/* ---- one call ---- */

static uint64_t fnv1a(const char *s) { /* ctx.py api_id */
    uint64_t h = 0xCBF29CE484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001B3ull;
    return h;
}

unsigned long long egpu_host_begin(int api) {
    egpu_python_start_early(); /* a program whose copies come before any cuInit the shim saw */
    if (__builtin_expect(!egpu_lvm_api_routed((unsigned int)api), 1) || egpu_passthrough()) return 0;
    return egpu_now_ns() | 1;
}

typedef CUresult (*pfn_pointer_attr)(void *data, int attribute, CUdeviceptr ptr);
typedef CUresult (*pfn_is_capturing)(CUstream stream, int *status);

/* Device-side memory (device, managed), or host memory (pinned, or unknown to CUDA: pageable). */
static int on_device(unsigned long long p) {
    unsigned int type = 0;
    pfn_pointer_attr attr = EGPU_REAL(pfn_pointer_attr, "cuPointerGetAttribute");
    return attr && attr(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p) == CUDA_SUCCESS &&
           (type == CU_MEMORYTYPE_DEVICE || type == CU_MEMORYTYPE_UNIFIED);
}

/* cuMemcpy and cuMemcpyAsync take any two addresses (unified addressing): their direction. */
static unsigned int direction(unsigned long long dst, unsigned long long src) {
    int d = on_device(dst), s = on_device(src);
    return s && d ? EGPU_COPY_D2D : d ? EGPU_COPY_H2D : s ? EGPU_COPY_D2H : EGPU_COPY_H2H;
}

static int captured(unsigned long long stream) {
    int status = 0;
    if (!egpu_shim_capturing()) return 0;
    pfn_is_capturing is = EGPU_REAL(pfn_is_capturing, "cuStreamIsCapturing");
    return is && is((CUstream)(uintptr_t)stream, &status) == CUDA_SUCCESS && status == CU_STREAM_CAPTURE_STATUS_ACTIVE;
}

void egpu_host_end(int api, unsigned long long t0, int result, const struct egpu_host_call *call) {
    unsigned long long t1 = egpu_now_ns();
    struct host_ctx c;
    memset(&c, 0, sizeof c);
    c.api_id = fnv1a(apis[api].symbol);
    c.dst = call->dst, c.src = call->src, c.bytes = call->bytes, c.stream = call->stream, c.handle = call->handle;
    c.blocked_ns = t1 > (t0 & ~1ull) ? t1 - (t0 & ~1ull) : 0;
    c.kind = call->kind, c.flags = call->flags, c.result = result;
    if (api == EGPU_H_cuMemcpy || api == EGPU_H_cuMemcpy_ptds || api == EGPU_H_cuMemcpyAsync ||
        api == EGPU_H_cuMemcpyAsync_ptsz)
        c.kind = direction(c.dst, c.src);
    if (captured(c.stream)) c.flags |= EGPU_HOST_F_GRAPH;
    egpu_lvm_run_api((unsigned int)api, &c, sizeof c);
}

/* ---- synchronization: the time the caller was blocked ---- */

#define X(sym, api, ver, ptsz, params) typedef CUresult (*pfn_##sym) params;
EGPU_HOSTAPI_HOOKS(X)
#undef X
#define CALL(sym, ...) ({ pfn_##sym fn_ = EGPU_REAL(pfn_##sym, #sym); fn_ ? fn_(__VA_ARGS__) : CUDA_ERROR_NOT_FOUND; })

#define STREAM_SYNC(sym, per_thread) \
    EXPORT CUresult sym(CUstream s) { \
        unsigned long long t_ = EGPU_HOST_BEGIN(sym); \
        CUresult r_ = CALL(sym, s); \
        EGPU_HOST_END(sym, t_, r_, .stream = EGPU_HOST_STREAM(s, per_thread), .handle = P(s), \
                      .kind = EGPU_SYNC_STREAM, .flags = (per_thread) ? EGPU_HOST_F_PER_THREAD : 0); \
        return r_; \
    }
STREAM_SYNC(cuStreamSynchronize, 0)
STREAM_SYNC(cuStreamSynchronize_ptsz, 1)

EXPORT CUresult cuEventSynchronize(CUevent e) {
    unsigned long long t = EGPU_HOST_BEGIN(cuEventSynchronize);
    CUresult r = CALL(cuEventSynchronize, e);
    EGPU_HOST_END(cuEventSynchronize, t, r, .handle = P(e), .kind = EGPU_SYNC_EVENT);
    return r;
}

EXPORT CUresult cuCtxSynchronize(void) {
    unsigned long long t = EGPU_HOST_BEGIN(cuCtxSynchronize);
    CUresult r = CALL(cuCtxSynchronize);
    EGPU_HOST_END(cuCtxSynchronize, t, r, .kind = EGPU_SYNC_CONTEXT);
    return r;
}

/* CUDA 13's: the context named (NULL: the current one) */
EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx) {
    unsigned long long t = EGPU_HOST_BEGIN(cuCtxSynchronize_v2);
    CUresult r = CALL(cuCtxSynchronize_v2, ctx);
    EGPU_HOST_END(cuCtxSynchronize_v2, t, r, .handle = P(ctx), .kind = EGPU_SYNC_CONTEXT);
    return r;
}

/* ---- copies to and from CUDA arrays: an array operand is its CUarray handle (the offset not added) ---- */

#define ARRAY_END(sym, kind_, flags_, d, s, n, st_) \
    EGPU_HOST_END(sym, t_, r_, .dst = P(d), .src = P(s), .bytes = (n), \
                  .stream = EGPU_HOST_STREAM(st_, (flags_) & EGPU_HOST_F_PER_THREAD), .kind = (kind_), \
                  .flags = (flags_))
#define TO_ARRAY(sym, kind_, flags_, st) \
    EXPORT CUresult sym(CUarray d, size_t off, st s, size_t n) { \
        unsigned long long t_ = EGPU_HOST_BEGIN(sym); \
        CUresult r_ = CALL(sym, d, off, s, n); \
        ARRAY_END(sym, kind_, flags_, d, s, n, NULL); \
        return r_; \
    }
#define FROM_ARRAY(sym, kind_, flags_, dt) \
    EXPORT CUresult sym(dt d, CUarray s, size_t off, size_t n) { \
        unsigned long long t_ = EGPU_HOST_BEGIN(sym); \
        CUresult r_ = CALL(sym, d, s, off, n); \
        ARRAY_END(sym, kind_, flags_, d, s, n, NULL); \
        return r_; \
    }
#define ARRAY_TO_ARRAY(sym, flags_) \
    EXPORT CUresult sym(CUarray d, size_t doff, CUarray s, size_t soff, size_t n) { \
        unsigned long long t_ = EGPU_HOST_BEGIN(sym); \
        CUresult r_ = CALL(sym, d, doff, s, soff, n); \
        ARRAY_END(sym, EGPU_COPY_D2D, flags_, d, s, n, NULL); \
        return r_; \
    }
#define TO_ARRAY_ASYNC(sym, flags_) \
    EXPORT CUresult sym(CUarray d, size_t off, const void *s, size_t n, CUstream stream) { \
        unsigned long long t_ = EGPU_HOST_BEGIN(sym); \
        CUresult r_ = CALL(sym, d, off, s, n, stream); \
        ARRAY_END(sym, EGPU_COPY_H2D, EGPU_HOST_F_ASYNC | (flags_), d, s, n, stream); \
        return r_; \
    }
#define FROM_ARRAY_ASYNC(sym, flags_) \
    EXPORT CUresult sym(void *d, CUarray s, size_t off, size_t n, CUstream stream) { \
        unsigned long long t_ = EGPU_HOST_BEGIN(sym); \
        CUresult r_ = CALL(sym, d, s, off, n, stream); \
        ARRAY_END(sym, EGPU_COPY_D2H, EGPU_HOST_F_ASYNC | (flags_), d, s, n, stream); \
        return r_; \
    }
#define PT EGPU_HOST_F_PER_THREAD
TO_ARRAY(cuMemcpyHtoA_v2, EGPU_COPY_H2D, 0, const void *)
TO_ARRAY(cuMemcpyHtoA_v2_ptds, EGPU_COPY_H2D, PT, const void *)
TO_ARRAY(cuMemcpyDtoA_v2, EGPU_COPY_D2D, 0, CUdeviceptr)
TO_ARRAY(cuMemcpyDtoA_v2_ptds, EGPU_COPY_D2D, PT, CUdeviceptr)
FROM_ARRAY(cuMemcpyAtoH_v2, EGPU_COPY_D2H, 0, void *)
FROM_ARRAY(cuMemcpyAtoH_v2_ptds, EGPU_COPY_D2H, PT, void *)
FROM_ARRAY(cuMemcpyAtoD_v2, EGPU_COPY_D2D, 0, CUdeviceptr)
FROM_ARRAY(cuMemcpyAtoD_v2_ptds, EGPU_COPY_D2D, PT, CUdeviceptr)
ARRAY_TO_ARRAY(cuMemcpyAtoA_v2, 0)
ARRAY_TO_ARRAY(cuMemcpyAtoA_v2_ptds, PT)
TO_ARRAY_ASYNC(cuMemcpyHtoAAsync_v2, 0)
TO_ARRAY_ASYNC(cuMemcpyHtoAAsync_v2_ptsz, PT)
FROM_ARRAY_ASYNC(cuMemcpyAtoHAsync_v2, 0)
FROM_ARRAY_ASYNC(cuMemcpyAtoHAsync_v2_ptsz, PT)

/* ---- batches (CUDA 12.8): the probe runs once per copy of the batch, each with the batch's time ---- */

static void batch_end(int api, unsigned long long t0, CUresult r, const CUdeviceptr *dsts, const CUdeviceptr *srcs,
                      const size_t *sizes, size_t count, CUstream stream, unsigned int flags) {
    if (!dsts || !srcs || !sizes) return;
    for (size_t i = 0; i < count; i++) {
        struct egpu_host_call c = {dsts[i], srcs[i], sizes[i], EGPU_HOST_STREAM(stream, flags & EGPU_HOST_F_PER_THREAD),
                                   0, direction(dsts[i], srcs[i]), EGPU_HOST_F_ASYNC | flags};
        egpu_host_end(api, t0, r, &c);
    }
}
#define BATCH(sym, flags_) \
    EXPORT CUresult sym(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, void *attrs, \
                        size_t *attrsIdxs, size_t numAttrs, size_t *failIdx, CUstream stream) { \
        unsigned long long t_ = EGPU_HOST_BEGIN(sym); \
        CUresult r_ = CALL(sym, dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx, stream); \
        if (t_) batch_end(EGPU_H_##sym, t_, r_, dsts, srcs, sizes, count, stream, flags_); \
        return r_; \
    }
#define BATCH_V2(sym, flags_) \
    EXPORT CUresult sym(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, void *attrs, \
                        size_t *attrsIdxs, size_t numAttrs, CUstream stream) { \
        unsigned long long t_ = EGPU_HOST_BEGIN(sym); \
        CUresult r_ = CALL(sym, dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, stream); \
        if (t_) batch_end(EGPU_H_##sym, t_, r_, dsts, srcs, sizes, count, stream, flags_); \
        return r_; \
    }
BATCH(cuMemcpyBatchAsync, 0)
BATCH(cuMemcpyBatchAsync_ptsz, PT)
BATCH_V2(cuMemcpyBatchAsync_v2, 0)
BATCH_V2(cuMemcpyBatchAsync_v2_ptsz, PT)

/* ---- copy and set nodes added to a graph: seen once, when added (the replays repeat them unseen) ---- */

#define MT_HOST 1
#define MT_ARRAY 3
/* The operand of a 3D copy by its memory type (an array: its handle). */
static unsigned long long operand(int type, const void *host, CUdeviceptr dev, CUarray array) {
    return type == MT_HOST ? P(host) : type == MT_ARRAY ? P(array) : dev;
}

/* A 3D copy's direction by its memory types: anything but host memory is on the device. */
static unsigned int kind_of_types(int src, int dst) {
    return src == MT_HOST ? (dst == MT_HOST ? EGPU_COPY_H2H : EGPU_COPY_H2D)
                          : (dst == MT_HOST ? EGPU_COPY_D2H : EGPU_COPY_D2D);
}

EXPORT CUresult cuGraphAddMemcpyNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                                     const CUDA_MEMCPY3D *c, CUcontext ctx) {
    unsigned long long t = EGPU_HOST_BEGIN(cuGraphAddMemcpyNode);
    CUresult r = CALL(cuGraphAddMemcpyNode, node, graph, deps, ndeps, c, ctx);
    if (c)
        EGPU_HOST_END(cuGraphAddMemcpyNode, t, r,
                      .dst = operand(c->dstMemoryType, c->dstHost, c->dstDevice, c->dstArray),
                      .src = operand(c->srcMemoryType, c->srcHost, c->srcDevice, c->srcArray),
                      .bytes = (unsigned long long)c->WidthInBytes * c->Height * c->Depth, .handle = P(graph),
                      .kind = kind_of_types(c->srcMemoryType, c->dstMemoryType),
                      .flags = EGPU_HOST_F_STRIDED | EGPU_HOST_F_GRAPH);
    return r;
}

EXPORT CUresult cuGraphAddMemsetNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                                     const CUDA_MEMSET_NODE_PARAMS *m, CUcontext ctx) {
    unsigned long long t = EGPU_HOST_BEGIN(cuGraphAddMemsetNode);
    CUresult r = CALL(cuGraphAddMemsetNode, node, graph, deps, ndeps, m, ctx);
    if (m)
        EGPU_HOST_END(cuGraphAddMemsetNode, t, r, .dst = m->dst, .src = m->value,
                      .bytes = (unsigned long long)m->elementSize * m->width * m->height, .handle = P(graph),
                      .kind = EGPU_COPY_SET, .flags = EGPU_HOST_F_STRIDED | EGPU_HOST_F_GRAPH);
    return r;
}
