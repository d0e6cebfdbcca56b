/* egpu_cow.h: the shim's part for cow/ (shim/cow.c): copies and memsets recorded, the streams an app
 * made, and the soft copy-on-write of a live checkpoint (egpu_preload/cow/live.py), in the three parts
 * of egpu_shim.h (shim/build.py cuts them apart the same way).
 *
 * Soft copy-on-write (PhOS, SOSP '25, done in process): while a checkpoint is armed, every launch and
 * every copy or memset into device memory first looks for pending ranges it may write (a launch: any
 * 8-byte parameter word pointing into one; the PTX write set narrows that when the runtime gave one).
 * The first writer of a range claims it with one CAS and enqueues its copy to the staging buffer on
 * its own stream, before itself, after waiting for the cut events of every stream: stream ordered, no
 * host stall, and the copy sees the range exactly as it was at the cut. The runtime's copier claims
 * the other ranges one at a time on a stream of its own that waits for the cut. A writer that finds a
 * range claimed by another stream waits for that copy's event on its own stream (cuStreamWaitEvent),
 * again without stalling the host.
 */
#ifndef EGPU_COW_H
#define EGPU_COW_H

/* ---- part 1: implemented in Python (embedding_api) ---- */

/* The launch hook calls this once the app has made as many allocations as egpu_cow_restore_at said
 * (egpu_preload/cow/restore.py puts the snapshot back), before that launch reaches the driver. */
void egpu_py_cow_restore(void);

/* ---- part 2: C API for the runtime (cdef) ---- */

/* What one recorded operation was. */
enum egpu_op_kind {
    EGPU_OP_HTOD = 1, EGPU_OP_DTOH, EGPU_OP_DTOD, EGPU_OP_COPY, EGPU_OP_PEER, EGPU_OP_MEMSET,
    EGPU_OP_EVENT_RECORD, EGPU_OP_STREAM_WAIT, EGPU_OP_STREAM_CREATE, EGPU_OP_STREAM_DESTROY
};
#define EGPU_OP_ASYNC 1       /* flags: an ...Async call */
#define EGPU_OP_PER_THREAD 2  /* flags: the _ptds/_ptsz twin (stream 0 is the per-thread stream) */
#define EGPU_OP_STRIDED 4     /* flags: 2D/3D; dst/src/size bound the rows touched */

/* One copy, memset, event or stream call, as recorded while records are on (egpu_cow_records).
 * COPY: cuMemcpy/cuMemcpyAsync (unified addresses); MEMSET: src is the value; EVENT_RECORD and
 * STREAM_WAIT: src is the event; STREAM_CREATE/DESTROY: stream is the stream. Host addresses are
 * host pointers, array operands 0. */
struct egpu_op {
    unsigned long long seq;         /* process-wide operation counter (launches not included) */
    unsigned long long dst, src, size;
    void *stream;
    int kind;                       /* enum egpu_op_kind */
    int flags;                      /* EGPU_OP_* */
};

/* One range a checkpoint must save: `size` bytes at `address` go to `staging` (device memory, or
 * pinned host memory from egpu_cow_staging). always: a module global, which any launch may write
 * (all of them are copied together, after the cut, by the first launch that comes). */
struct egpu_cow_range {
    unsigned long long address, size, staging;
    int always;
};

struct egpu_cow_stats {
    unsigned long long ops;           /* operations recorded */
    unsigned long long ops_dropped;   /* lost to a full ring */
    unsigned long long allocations;   /* allocations made so far (struct egpu_alloc seq counter) */
    unsigned long long alloc_overflow;/* allocations the shim's table had no room for */
    unsigned long long streams;       /* live streams the app made */
    /* the last (or current) checkpoint */
    unsigned long long launches_at_cut; /* the launch counter when the cut was taken */
    unsigned long long cut_streams;   /* streams an event marks the cut on (the legacy stream included) */
    unsigned long long hook_copies;   /* ranges a launch or copy hook copied first, on its own stream */
    unsigned long long hook_waits;    /* waits a hook enqueued for another stream's copy */
    unsigned long long copier_copies; /* ranges the runtime's copier copied */
    unsigned long long checked;       /* launches and copies checked against pending ranges */
    unsigned long long unknown_layout;/* launches whose parameters could not be read: every range copied */
    unsigned long long stall_ns;      /* time spent inside hooks on copy-on-write (sum) */
    unsigned long long stall_max_ns;  /* the longest one */
    unsigned long long cut_hold_ns;   /* how long the cut held launches and copies at the hooks (the gates
                                       * closing, an event on every stream, the gates open again) */
    unsigned long long alloc_changes;       /* insertions and removals of the allocation table so far */
    unsigned long long alloc_digest;        /* the live allocations' digest (egpu_alloc_digest) */
    unsigned long long alloc_digest_at_cut; /* the same when the cut was taken */
    int armed;
};

/* Turn operation records on (1) or off (0); returns the previous setting. */
int egpu_cow_records(int on);
/* Move up to `max` records into `out` (single consumer); returns how many. */
size_t egpu_cow_drain(struct egpu_op *out, size_t max);
/* Copy up to `max` live streams the app made into `out`; returns how many there are. */
size_t egpu_cow_streams(void **out, size_t max);
void egpu_cow_stats(struct egpu_cow_stats *out);

/* Tell the launch hook where a kernel's parameters are (from its PTX): offsets/sizes of `nparams`
 * parameters; `writes`: byte offsets (in the parameter buffer) of the pointer words the kernel may
 * write through, or nwrites -1 when unknown (every word counts), or EGPU_COW_ANYTHING when it may
 * write through pointers no argument holds (loaded from memory, handles): every pending range counts.
 * Without this the hook asks the driver (cuFuncGetParamInfo / cuKernelGetParamInfo) and treats every
 * word as written through. Returns 0, or -1 when the table is full or memory is out. */
enum { EGPU_COW_ANYTHING = -2 };
int egpu_cow_layout(void *function, const unsigned int *offsets, const unsigned int *sizes,
                    unsigned int nparams, const unsigned int *writes, int nwrites);

/* Staging memory for `size` bytes: device memory, else pinned host memory (*host set to 1).
 * Returns 0 or the CUresult. Freed by egpu_cow_staging_free. Never in the allocation table. */
int egpu_cow_staging(unsigned long long size, unsigned long long *out, int *host);
int egpu_cow_staging_free(unsigned long long ptr, int host);

/* Take the cut and arm, in the calling thread's current context: launches and copies wait at the
 * hooks for a moment (those inside one finish first), an event is recorded on every stream the app
 * made and on the legacy stream, the ranges are published, the hooks go on. `side` (a stream of the
 * runtime's) then waits for every cut event. Returns 0, -1 (already armed, bad ranges, no memory),
 * EGPU_COW_TIMEOUT (a hook stayed in the driver past egpu_shim_hold_limit), EGPU_COW_STREAMS (a stream
 * the app made could not be listed, or too many were made during the arming: the cut would miss it),
 * or a CUresult (nothing armed). */
enum { EGPU_COW_TIMEOUT = -3, EGPU_COW_STREAMS = -4 };
int egpu_cow_arm(const struct egpu_cow_range *ranges, size_t n, void *side);
/* The copier: claim the next pending range (the globals first) and copy it on `side`; returns its
 * index (globals count as one, index n), or -1 when none is left. */
long egpu_cow_copy_next(void *side);
/* Wait until every range's copy has finished (whoever enqueued it), then disarm. Returns 0 or a
 * CUresult (disarmed all the same). */
int egpu_cow_disarm(void);

/* Arm the restore trigger: once `count` allocations have been made, the next launch calls
 * egpu_py_cow_restore() first (once). 0: the first launch (a checkpoint of a job that allocated nothing
 * still has its module globals to put back). */
void egpu_cow_restore_at(unsigned long long count);

/* ---- part 3: C only ---- */

typedef void *CUevent, *CUarray;

/* CUDA_MEMCPY2D_v2; CUDA_MEMCPY3D_v2 and CUDA_MEMCPY3D_PEER_v1 share one layout (the reserved
 * pointers of the first are the contexts of the second). */
typedef struct {
    size_t srcXInBytes, srcY;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    CUarray srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    CUarray dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
} CUDA_MEMCPY2D;
typedef struct {
    size_t srcXInBytes, srcY, srcZ, srcLOD;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    CUarray srcArray;
    void *srcContext;
    size_t srcPitch, srcHeight;
    size_t dstXInBytes, dstY, dstZ, dstLOD;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    CUarray dstArray;
    void *dstContext;
    size_t dstPitch, dstHeight;
    size_t WidthInBytes, Height, Depth;
} CUDA_MEMCPY3D;

/* The hooks of cow.c, rows as in EGPU_HOOKS (interpose.c hands them out the same way). ptsz 2 marks
 * a per-thread twin that cudaTypedefs.h names _ptds (synchronous calls) rather than _ptsz. */
#define EGPU_COW_HOOKS(X) \
    X(cuMemcpy, cuMemcpy, 4000, 0, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)) \
    X(cuMemcpy_ptds, cuMemcpy, 7000, 2, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)) \
    X(cuMemcpyAsync, cuMemcpyAsync, 4000, 0, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)) \
    X(cuMemcpyAsync_ptsz, cuMemcpyAsync, 7000, 1, \
      (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)) \
    X(cuMemcpyPeer, cuMemcpyPeer, 4000, 0, \
      (CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount)) \
    X(cuMemcpyPeer_ptds, cuMemcpyPeer, 7000, 2, \
      (CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount)) \
    X(cuMemcpyPeerAsync, cuMemcpyPeerAsync, 4000, 0, \
      (CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount, \
       CUstream hStream)) \
    X(cuMemcpyPeerAsync_ptsz, cuMemcpyPeerAsync, 7000, 1, \
      (CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount, \
       CUstream hStream)) \
    X(cuMemcpyHtoD_v2, cuMemcpyHtoD, 3020, 0, (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)) \
    X(cuMemcpyHtoD_v2_ptds, cuMemcpyHtoD, 7000, 2, (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)) \
    X(cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync, 3020, 0, \
      (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream)) \
    X(cuMemcpyHtoDAsync_v2_ptsz, cuMemcpyHtoDAsync, 7000, 1, \
      (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream)) \
    X(cuMemcpyDtoH_v2, cuMemcpyDtoH, 3020, 0, (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)) \
    X(cuMemcpyDtoH_v2_ptds, cuMemcpyDtoH, 7000, 2, (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)) \
    X(cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync, 3020, 0, \
      (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)) \
    X(cuMemcpyDtoHAsync_v2_ptsz, cuMemcpyDtoHAsync, 7000, 1, \
      (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)) \
    X(cuMemcpyDtoD_v2, cuMemcpyDtoD, 3020, 0, (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)) \
    X(cuMemcpyDtoD_v2_ptds, cuMemcpyDtoD, 7000, 2, (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)) \
    X(cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync, 3020, 0, \
      (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)) \
    X(cuMemcpyDtoDAsync_v2_ptsz, cuMemcpyDtoDAsync, 7000, 1, \
      (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)) \
    X(cuMemcpy2D_v2, cuMemcpy2D, 3020, 0, (const CUDA_MEMCPY2D *pCopy)) \
    X(cuMemcpy2D_v2_ptds, cuMemcpy2D, 7000, 2, (const CUDA_MEMCPY2D *pCopy)) \
    X(cuMemcpy2DUnaligned_v2, cuMemcpy2DUnaligned, 3020, 0, (const CUDA_MEMCPY2D *pCopy)) \
    X(cuMemcpy2DUnaligned_v2_ptds, cuMemcpy2DUnaligned, 7000, 2, (const CUDA_MEMCPY2D *pCopy)) \
    X(cuMemcpy2DAsync_v2, cuMemcpy2DAsync, 3020, 0, (const CUDA_MEMCPY2D *pCopy, CUstream hStream)) \
    X(cuMemcpy2DAsync_v2_ptsz, cuMemcpy2DAsync, 7000, 1, (const CUDA_MEMCPY2D *pCopy, CUstream hStream)) \
    X(cuMemcpy3D_v2, cuMemcpy3D, 3020, 0, (const CUDA_MEMCPY3D *pCopy)) \
    X(cuMemcpy3D_v2_ptds, cuMemcpy3D, 7000, 2, (const CUDA_MEMCPY3D *pCopy)) \
    X(cuMemcpy3DAsync_v2, cuMemcpy3DAsync, 3020, 0, (const CUDA_MEMCPY3D *pCopy, CUstream hStream)) \
    X(cuMemcpy3DAsync_v2_ptsz, cuMemcpy3DAsync, 7000, 1, (const CUDA_MEMCPY3D *pCopy, CUstream hStream)) \
    X(cuMemcpy3DPeer, cuMemcpy3DPeer, 4000, 0, (const CUDA_MEMCPY3D *pCopy)) \
    X(cuMemcpy3DPeer_ptds, cuMemcpy3DPeer, 7000, 2, (const CUDA_MEMCPY3D *pCopy)) \
    X(cuMemcpy3DPeerAsync, cuMemcpy3DPeerAsync, 4000, 0, (const CUDA_MEMCPY3D *pCopy, CUstream hStream)) \
    X(cuMemcpy3DPeerAsync_ptsz, cuMemcpy3DPeerAsync, 7000, 1, (const CUDA_MEMCPY3D *pCopy, CUstream hStream)) \
    X(cuMemsetD8_v2, cuMemsetD8, 3020, 0, (CUdeviceptr dstDevice, unsigned char uc, size_t N)) \
    X(cuMemsetD8_v2_ptds, cuMemsetD8, 7000, 2, (CUdeviceptr dstDevice, unsigned char uc, size_t N)) \
    X(cuMemsetD16_v2, cuMemsetD16, 3020, 0, (CUdeviceptr dstDevice, unsigned short us, size_t N)) \
    X(cuMemsetD16_v2_ptds, cuMemsetD16, 7000, 2, (CUdeviceptr dstDevice, unsigned short us, size_t N)) \
    X(cuMemsetD32_v2, cuMemsetD32, 3020, 0, (CUdeviceptr dstDevice, unsigned int ui, size_t N)) \
    X(cuMemsetD32_v2_ptds, cuMemsetD32, 7000, 2, (CUdeviceptr dstDevice, unsigned int ui, size_t N)) \
    X(cuMemsetD2D8_v2, cuMemsetD2D8, 3020, 0, \
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height)) \
    X(cuMemsetD2D8_v2_ptds, cuMemsetD2D8, 7000, 2, \
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height)) \
    X(cuMemsetD2D16_v2, cuMemsetD2D16, 3020, 0, \
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width, size_t Height)) \
    X(cuMemsetD2D16_v2_ptds, cuMemsetD2D16, 7000, 2, \
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width, size_t Height)) \
    X(cuMemsetD2D32_v2, cuMemsetD2D32, 3020, 0, \
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height)) \
    X(cuMemsetD2D32_v2_ptds, cuMemsetD2D32, 7000, 2, \
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height)) \
    X(cuMemsetD8Async, cuMemsetD8Async, 3020, 0, \
      (CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)) \
    X(cuMemsetD8Async_ptsz, cuMemsetD8Async, 7000, 1, \
      (CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)) \
    X(cuMemsetD16Async, cuMemsetD16Async, 3020, 0, \
      (CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream)) \
    X(cuMemsetD16Async_ptsz, cuMemsetD16Async, 7000, 1, \
      (CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream)) \
    X(cuMemsetD32Async, cuMemsetD32Async, 3020, 0, \
      (CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream)) \
    X(cuMemsetD32Async_ptsz, cuMemsetD32Async, 7000, 1, \
      (CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream)) \
    X(cuMemsetD2D8Async, cuMemsetD2D8Async, 3020, 0, \
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height, CUstream hStream)) \
    X(cuMemsetD2D8Async_ptsz, cuMemsetD2D8Async, 7000, 1, \
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height, CUstream hStream)) \
    X(cuMemsetD2D16Async, cuMemsetD2D16Async, 3020, 0, \
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width, size_t Height, CUstream hStream)) \
    X(cuMemsetD2D16Async_ptsz, cuMemsetD2D16Async, 7000, 1, \
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width, size_t Height, CUstream hStream)) \
    X(cuMemsetD2D32Async, cuMemsetD2D32Async, 3020, 0, \
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height, CUstream hStream)) \
    X(cuMemsetD2D32Async_ptsz, cuMemsetD2D32Async, 7000, 1, \
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height, CUstream hStream)) \
    X(cuStreamCreate, cuStreamCreate, 2000, 0, (CUstream *phStream, unsigned int Flags)) \
    X(cuStreamCreateWithPriority, cuStreamCreateWithPriority, 5050, 0, \
      (CUstream *phStream, unsigned int flags, int priority)) \
    X(cuStreamDestroy_v2, cuStreamDestroy, 4000, 0, (CUstream hStream)) \
    X(cuEventRecord, cuEventRecord, 2000, 0, (CUevent hEvent, CUstream hStream)) \
    X(cuEventRecord_ptsz, cuEventRecord, 7000, 1, (CUevent hEvent, CUstream hStream)) \
    X(cuEventRecordWithFlags, cuEventRecordWithFlags, 11010, 0, \
      (CUevent hEvent, CUstream hStream, unsigned int flags)) \
    X(cuEventRecordWithFlags_ptsz, cuEventRecordWithFlags, 11010, 1, \
      (CUevent hEvent, CUstream hStream, unsigned int flags)) \
    X(cuStreamWaitEvent, cuStreamWaitEvent, 3020, 0, (CUstream hStream, CUevent hEvent, unsigned int Flags)) \
    X(cuStreamWaitEvent_ptsz, cuStreamWaitEvent, 7000, 1, (CUstream hStream, CUevent hEvent, unsigned int Flags))

#ifndef __cplusplus
#include <stdatomic.h>
/* Nonzero while a checkpoint is armed (1) or a restore waits for its allocations (2): the launch
 * hooks' only cost otherwise is loading it. */
extern _Atomic int egpu_cow_flags;
/* The allocation table's counters (interpose.c alloc_add): allocations made, and those it dropped;
 * changes: insertions and removals (a read of the table between two equal counts is whole); digest: the
 * XOR of a hash of every live allocation's seq, so that a checkpoint knows its table still held at the cut. */
extern _Atomic unsigned long long egpu_alloc_seq, egpu_alloc_overflow, egpu_alloc_changes, egpu_alloc_digest;
/* The launch gate of interpose.c (egpu_shim_swap's) and the copy gate of cow.c (egpu_gate.h): hold 1
 * closes it and returns 0 once no hook is inside, or -1 (open again) if one still is at `deadline_ns`;
 * hold 0 opens it. */
int egpu_launch_gate(int hold, unsigned long long deadline_ns);
int egpu_copy_gate(int hold, unsigned long long deadline_ns);
/* When a hold taken now must end (egpu_shim_hold_limit from now, CLOCK_MONOTONIC ns). */
unsigned long long egpu_hold_deadline(void);
/* Where the app's address `p` (`size` bytes from it) is served now: a moved variable's place in the
 * serving copy (egpu_shim_swap's table), else `p`. Called inside the copy gate. */
unsigned long long egpu_moved_address(unsigned long long p, unsigned long long size);
/* Before a launch reaches the driver (interpose.c's launch hooks, inside the gate). */
void egpu_cow_launch(void *f, CUstream stream, int per_thread, void **params, void **extra);
#define EGPU_COW_LAUNCH(f, stream, per_thread, params, extra) do { \
        if (__builtin_expect(atomic_load_explicit(&egpu_cow_flags, memory_order_acquire) != 0, 0)) \
            egpu_cow_launch((f), (stream), (per_thread), (params), (extra)); \
    } while (0)
#endif

#endif /* EGPU_COW_H */
