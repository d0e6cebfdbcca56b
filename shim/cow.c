/* cow.c: the shim's part for cow/ (egpu_cow.h): copy, memset, stream and event hooks, a ring of their
 * records, the streams the app made, and the soft copy-on-write of a live checkpoint.
 *
 * Nothing here calls Python on the way of a copy or a launch but the one launch that restores a
 * checkpoint (egpu_py_cow_restore, with no lock held). Idle cost: a copy hook counts itself in
 * and out of a gate (two atomics) and loads the armed flag; a launch hook loads the flag
 * (EGPU_COW_LAUNCH in interpose.c). Only while a checkpoint is armed do hooks look at parameters.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "egpu_shim.h"
#include "egpu_cow.h"
#include "egpu_gate.h"
#include "egpu_hostapi.h"
#include "egpu_ring.h"
#include "egpu_table.h"

#define EXPORT __attribute__((visibility("default")))
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NOT_FOUND 500
#define CU_STREAM_PER_THREAD ((CUstream)0x2)
#define CU_EVENT_DISABLE_TIMING 2
#define CU_MEMHOSTALLOC_PORTABLE 1
#define CU_LAUNCH_PARAM_END ((void *)0x00)
#define CU_LAUNCH_PARAM_BUFFER_POINTER ((void *)0x01)
#define CU_LAUNCH_PARAM_BUFFER_SIZE ((void *)0x02)
#define PARAM_BYTES_MAX 32764 /* a kernel's parameters at most (CUDA 12.1+); the driver refuses more */
/* CUmemorytype (cuda.h) */
#define MT_HOST 1
#define MT_DEVICE 2
#define MT_UNIFIED 4

enum { FLAG_ARMED = 1, FLAG_RESTORE = 2 };
_Atomic int egpu_cow_flags;
_Atomic unsigned long long egpu_alloc_seq, egpu_alloc_overflow, egpu_alloc_changes, egpu_alloc_digest;

/* ---- the driver's own functions: each looked up once (egpu_shim_real never returns a hook) ---- */

#define X(sym, api, ver, ptsz, params) typedef CUresult (*pfn_##sym) params;
EGPU_COW_HOOKS(X)
#undef X
typedef CUresult (*pfn_event_create)(CUevent *, unsigned int);
typedef CUresult (*pfn_event)(CUevent);
typedef CUresult (*pfn_param_info)(void *, size_t, size_t *, size_t *);
typedef CUresult (*pfn_mem_alloc)(CUdeviceptr *, size_t);
typedef CUresult (*pfn_mem_free)(CUdeviceptr);
typedef CUresult (*pfn_host_alloc)(void **, size_t, unsigned int);
typedef CUresult (*pfn_host_free)(void *);

#define CALL(sym, ...) ({ pfn_##sym fn_ = EGPU_REAL(pfn_##sym, #sym); fn_ ? fn_(__VA_ARGS__) : CUDA_ERROR_NOT_FOUND; })
#define CALL_AS(type, name, ...) ({ type fn_ = EGPU_REAL(type, name); fn_ ? fn_(__VA_ARGS__) : CUDA_ERROR_NOT_FOUND; })

/* ---- the record ring (egpu_ring.h): the hooks push, the runtime takes ---- */

EGPU_RING(op_ring, struct egpu_op, 1u << 14)
static _Atomic unsigned long long op_seq, ops_recorded, ops_dropped;
static _Atomic int records_on;

EXPORT int egpu_cow_records(int on) {
    op_ring_start();
    return atomic_exchange(&records_on, on != 0);
}

static void record(int kind, int flags, unsigned long long dst, unsigned long long src,
                   unsigned long long size, CUstream stream) {
    unsigned long long seq = atomic_fetch_add_explicit(&op_seq, 1, memory_order_relaxed) + 1;
    if (!atomic_load_explicit(&records_on, memory_order_relaxed)) return;
    struct egpu_op op = {seq, dst, src, size, stream, kind, flags};
    if (op_ring_push(&op))
        atomic_fetch_add_explicit(&ops_recorded, 1, memory_order_relaxed);
    else /* full: never wait in a hook */
        atomic_fetch_add_explicit(&ops_dropped, 1, memory_order_relaxed);
}

EXPORT size_t egpu_cow_drain(struct egpu_op *out, size_t max) {
    return op_ring_drain(out, max);
}

/* ---- the streams the app made: where the cut needs an event ----
 * A list that grows; a stream it had no memory for is counted, and every later cut is refused (it
 * could not be complete): the counter never goes back, since the stream is not known by name. */

static CUstream *streams;
static size_t nstreams, streams_room;
static unsigned long long streams_lost;
static pthread_mutex_t streams_lock = PTHREAD_MUTEX_INITIALIZER;

static void stream_add(CUstream s) {
    pthread_mutex_lock(&streams_lock);
    if (nstreams == streams_room) {
        size_t room = streams_room ? 2 * streams_room : 64;
        CUstream *grown = realloc(streams, room * sizeof *streams);
        if (grown) streams = grown, streams_room = room;
    }
    if (nstreams < streams_room) streams[nstreams++] = s;
    else streams_lost++;
    pthread_mutex_unlock(&streams_lock);
}

static void stream_del(CUstream s) {
    pthread_mutex_lock(&streams_lock);
    for (size_t i = 0; i < nstreams; i++)
        if (streams[i] == s) {
            streams[i] = streams[--nstreams];
            break;
        }
    pthread_mutex_unlock(&streams_lock);
}

EXPORT size_t egpu_cow_streams(void **out, size_t max) {
    pthread_mutex_lock(&streams_lock);
    size_t n = nstreams;
    for (size_t i = 0; i < n && i < max; i++) out[i] = streams[i];
    pthread_mutex_unlock(&streams_lock);
    return n;
}

/* ---- the copy gate (egpu_gate.h): arming waits until no copy hook is between its check and its
 * driver call (the launch hooks have interpose.c's gate) ---- */

static struct egpu_gate copy_gate;

int egpu_copy_gate(int hold, unsigned long long deadline_ns) {
    if (hold) return egpu_gate_close(&copy_gate, deadline_ns);
    egpu_gate_open(&copy_gate);
    return 0;
}

/* 0 with both gates held, or -1 (both open) when a hook stayed inside past the hold limit. */
static int hold_hooks(int on) {
    if (!on) {
        egpu_copy_gate(0, 0);
        egpu_launch_gate(0, 0);
        return 0;
    }
    unsigned long long deadline = egpu_hold_deadline();
    if (egpu_launch_gate(1, deadline)) return -1;
    if (egpu_copy_gate(1, deadline)) {
        egpu_launch_gate(0, 0);
        return -1;
    }
    return 0;
}

/* ---- the armed checkpoint ----
 * A unit is what one claim copies: one pointer range, or every global at once. States go
 * PENDING -> CLAIMED (its claimer is enqueueing) -> ISSUED (copy and event enqueued on `by`) -> DONE
 * (the copy finished; nobody needs to wait for it). */

enum { PENDING, CLAIMED, ISSUED, DONE };
struct unit {
    _Atomic int state;
    _Atomic(CUstream) by;
    CUevent event;
    size_t first, count;   /* its ranges */
};

static struct {
    struct egpu_cow_range *ranges;   /* pointer ranges sorted by address, then the globals */
    size_t nranges;                  /* pointer ranges */
    struct unit *units;              /* one per pointer range, then the globals' unit if any */
    size_t nunits;
    CUevent *cut;                    /* one per stream cut (ncut), and spares (to nevents) */
    size_t ncut, nevents;
    _Atomic size_t next;             /* the copier's next unit */
    _Atomic int error;               /* the first failed CUresult */
} cow;
static pthread_mutex_t arm_lock = PTHREAD_MUTEX_INITIALIZER;

static struct {
    _Atomic unsigned long long launches_at_cut, cut_streams, hook_copies, hook_waits, copier_copies, checked,
        unknown_layout, stall_ns, stall_max_ns, cut_hold_ns, alloc_digest_at_cut;
} cstats;

static void note_error(CUresult r) {
    int none = 0;
    if (r != CUDA_SUCCESS) atomic_compare_exchange_strong(&cow.error, &none, r);
}

static CUstream effective(CUstream s, int per_thread) { return !s && per_thread ? CU_STREAM_PER_THREAD : s; }

/* Enqueue the unit's copies on `s` and an event after them. A writer's copy waits for the cut on every
 * stream first: work issued before the cut on another stream may still be writing the range (other
 * bytes of one allocation, or a global), and nothing orders it before this writer. Nothing issued
 * after the cut can have written the range yet: it would have claimed it. */
static void issue(struct unit *u, CUstream s, int after_cut) {
    if (after_cut)
        for (size_t i = 0; i < cow.ncut; i++) note_error(CALL(cuStreamWaitEvent, s, cow.cut[i], 0));
    for (size_t i = u->first; i < u->first + u->count; i++) {
        const struct egpu_cow_range *r = &cow.ranges[i];
        note_error(CALL(cuMemcpyAsync, r->staging, r->address, r->size, s));
    }
    note_error(CALL(cuEventRecord, u->event, s));
    atomic_store_explicit(&u->by, s, memory_order_relaxed);
    atomic_store_explicit(&u->state, ISSUED, memory_order_release);
}

/* A writer on stream `s` is about to touch unit u: copy it first, or wait for the copy another
 * stream enqueued. Returns 1 if it copied. */
static int touch(struct unit *u, CUstream s) {
    int st = atomic_load_explicit(&u->state, memory_order_acquire);
    if (st == PENDING) {
        if (atomic_compare_exchange_strong(&u->state, &st, CLAIMED)) {
            issue(u, s, 1);
            atomic_fetch_add_explicit(&cstats.hook_copies, 1, memory_order_relaxed);
            return 1;
        }
    }
    while (st == CLAIMED) { /* its claimer is between two driver calls: microseconds */
        sched_yield();
        st = atomic_load_explicit(&u->state, memory_order_acquire);
    }
    if (st == ISSUED && atomic_load_explicit(&u->by, memory_order_relaxed) != s) {
        note_error(CALL(cuStreamWaitEvent, s, u->event, 0));
        atomic_fetch_add_explicit(&cstats.hook_waits, 1, memory_order_relaxed);
    }
    return 0;
}

/* The pointer range holding `p`, or NULL. */
static struct unit *unit_at(unsigned long long p) {
    size_t lo = 0, hi = cow.nranges;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cow.ranges[mid].address <= p) lo = mid + 1;
        else hi = mid;
    }
    if (!lo) return NULL;
    const struct egpu_cow_range *r = &cow.ranges[lo - 1];
    return p - r->address < r->size ? &cow.units[lo - 1] : NULL;
}

/* a + b * c, or ULLONG_MAX where that overflows: a span that wraps reaches the top of the address space
 * (the driver refuses such a call, but what it may write is tracked first) */
static unsigned long long span(unsigned long long a, unsigned long long b, unsigned long long c) {
    unsigned long long m, r;
    return __builtin_mul_overflow(b, c, &m) || __builtin_add_overflow(a, m, &r) ? ULLONG_MAX : r;
}

static void touch_range(unsigned long long p, unsigned long long size, CUstream s) {
    /* a copy into [p, p + size) may span several allocations */
    for (unsigned long long end = span(p, size ? size : 1, 1); p < end;) {
        struct unit *u = unit_at(p);
        if (u) {
            touch(u, s);
            const struct egpu_cow_range *r = &cow.ranges[u->first];
            p = r->address + r->size; /* arm refused ranges that wrap */
            continue;
        }
        size_t lo = 0, hi = cow.nranges; /* skip to the next range start */
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (cow.ranges[mid].address <= p) lo = mid + 1;
            else hi = mid;
        }
        if (lo == cow.nranges) break;
        p = cow.ranges[lo].address;
    }
}

static void stall(unsigned long long t0) {
    unsigned long long d = egpu_now_ns() - t0;
    atomic_fetch_add_explicit(&cstats.stall_ns, d, memory_order_relaxed);
    unsigned long long m = atomic_load_explicit(&cstats.stall_max_ns, memory_order_relaxed);
    while (d > m && !atomic_compare_exchange_weak(&cstats.stall_max_ns, &m, d)) {}
}

/* A copy or memset about to write [dst, dst + size) on stream s. */
static void cow_write(unsigned long long dst, unsigned long long size, CUstream s) {
    if (!(atomic_load_explicit(&egpu_cow_flags, memory_order_acquire) & FLAG_ARMED) || !dst) return;
    unsigned long long t0 = egpu_now_ns();
    atomic_fetch_add_explicit(&cstats.checked, 1, memory_order_relaxed);
    touch_range(dst, size, s);
    stall(t0);
}

/* ---- kernel parameter layouts: from the runtime (PTX), else from the driver; never removed ---- */

struct layout {
    int known;                 /* 0: the parameters cannot be read */
    unsigned int nparams;
    int nwrites;               /* -1: every word may be written through; EGPU_COW_ANYTHING */
    unsigned int *offsets, *sizes, *writes;
};
#define LAYOUTS (1u << 14)
static struct { _Atomic(void *) key; _Atomic(struct layout *) layout; } layouts[LAYOUTS];
static struct layout unknown_layout;

static _Atomic(struct layout *) *layout_slot(void *f, int insert) {
    __typeof__(&layouts[0]) e = EGPU_TABLE_FIND(layouts, f, insert);
    return e ? &e->layout : NULL;
}

static struct layout *layout_new(unsigned int nparams, int nwrites) {
    size_t words = 2 * (size_t)nparams + (nwrites > 0 ? nwrites : 0);
    struct layout *l = calloc(1, sizeof *l + words * sizeof(unsigned int));
    if (!l) return NULL;
    l->known = 1;
    l->nparams = nparams;
    l->nwrites = nwrites;
    l->offsets = (unsigned int *)(l + 1);
    l->sizes = l->offsets + nparams;
    l->writes = l->sizes + nparams;
    return l;
}

EXPORT int egpu_cow_layout(void *function, const unsigned int *offsets, const unsigned int *sizes,
                           unsigned int nparams, const unsigned int *writes, int nwrites) {
    _Atomic(struct layout *) *slot = layout_slot(function, 1);
    struct layout *l = slot ? layout_new(nparams, nwrites) : NULL;
    if (!l) return -1;
    memcpy(l->offsets, offsets, nparams * sizeof *offsets);
    memcpy(l->sizes, sizes, nparams * sizeof *sizes);
    if (nwrites > 0) memcpy(l->writes, writes, nwrites * sizeof *writes);
    atomic_store_explicit(slot, l, memory_order_release); /* an old one is never freed: a hook may read it */
    return 0;
}

/* Ask the driver (CUDA 12.4+): parameter i's offset and size until the index runs out. The handle may
 * be a CUfunction or a CUkernel (cudart launches CUkernels): whichever call takes it. */
static struct layout *layout_from_driver(void *f) {
    static const char *const api[] = {"cuFuncGetParamInfo", "cuKernelGetParamInfo"};
    for (int a = 0; a < 2; a++) {
        size_t off, size;
        unsigned int n = 0;
        CUresult r;
        while ((r = CALL_AS(pfn_param_info, api[a], f, n, &off, &size)) == CUDA_SUCCESS && n < 4096) n++;
        if (r != CUDA_ERROR_INVALID_VALUE) continue; /* not this kind of handle, or no such call */
        struct layout *l = layout_new(n, -1);
        if (!l) return NULL;
        for (unsigned int i = 0; i < n; i++) {
            CALL_AS(pfn_param_info, api[a], f, i, &off, &size);
            l->offsets[i] = (unsigned int)off;
            l->sizes[i] = (unsigned int)size;
        }
        return l;
    }
    return NULL;
}

static struct layout *layout_for(void *f) {
    _Atomic(struct layout *) *slot = layout_slot(f, 1);
    struct layout *l = slot ? atomic_load_explicit(slot, memory_order_acquire) : NULL;
    if (l) return l;
    l = layout_from_driver(f);
    if (!l) return &unknown_layout;
    struct layout *none = NULL;
    if (slot && !atomic_compare_exchange_strong(slot, &none, l)) {
        free(l);
        return none;
    }
    return l;
}

static unsigned long long word_at(const void *p) {
    unsigned long long w;
    memcpy(&w, p, sizeof w); /* parameters need not be 8-byte aligned in the app's memory */
    return w;
}

/* Every 8-byte-aligned word (aligned in the parameter buffer) of parameter bytes [at, at + size). */
static void scan(const char *base, unsigned int offset, size_t size, CUstream s) {
    for (size_t w = (8 - offset % 8) % 8; w + 8 <= size; w += 8) {
        struct unit *u = unit_at(word_at(base + w));
        if (u) touch(u, s);
    }
}

/* A launch that may write anything: every pending range is copied first. */
static void all_written(CUstream s) {
    atomic_fetch_add_explicit(&cstats.unknown_layout, 1, memory_order_relaxed);
    for (size_t i = 0; i < cow.nranges; i++) touch(&cow.units[i], s);
}

static void restore_check(void);

void egpu_cow_launch(void *f, CUstream stream, int per_thread, void **params, void **extra) {
    int flags = atomic_load_explicit(&egpu_cow_flags, memory_order_acquire);
    if (flags & FLAG_RESTORE) restore_check();
    if (!(flags & FLAG_ARMED)) return;
    unsigned long long t0 = egpu_now_ns();
    CUstream s = effective(stream, per_thread);
    atomic_fetch_add_explicit(&cstats.checked, 1, memory_order_relaxed);
    if (cow.nunits > cow.nranges) touch(&cow.units[cow.nranges], s); /* any kernel may write a global */
    const char *buf = NULL;
    size_t bufsize = 0;
    for (void **e = extra; e && *e != CU_LAUNCH_PARAM_END; e += 2) {
        if (e[0] == CU_LAUNCH_PARAM_BUFFER_POINTER) buf = e[1];
        else if (e[0] == CU_LAUNCH_PARAM_BUFFER_SIZE && e[1]) bufsize = *(size_t *)e[1];
    }
    struct layout *l = layout_for(f);
    /* a buffer past the driver's limit (it refuses the launch), or a kernel that loads its pointers */
    if (bufsize > PARAM_BYTES_MAX || l->nwrites == EGPU_COW_ANYTHING) {
        all_written(s);
    } else if (buf && bufsize && (!l->known || l->nwrites < 0)) {
        scan(buf, 0, bufsize, s);
    } else if (l->known && l->nwrites >= 0 && (buf || params || !l->nparams)) {
        for (int i = 0; i < l->nwrites; i++) { /* only the words the kernel writes through */
            unsigned long long at = l->writes[i];
            for (unsigned int p = 0; p < l->nparams; p++) {
                if (at < l->offsets[p] || at + 8 > (unsigned long long)l->offsets[p] + l->sizes[p]) continue;
                const char *word = buf ? buf + at : (const char *)params[p] + (at - l->offsets[p]);
                if (!buf || at + 8 <= bufsize) {
                    struct unit *u = unit_at(word_at(word));
                    if (u) touch(u, s);
                }
                break;
            }
        }
    } else if (l->known && (params || !l->nparams)) {
        for (unsigned int p = 0; p < l->nparams; p++) scan(params[p], l->offsets[p], l->sizes[p], s);
    } else { /* nothing to read the parameters by */
        all_written(s);
    }
    stall(t0);
}

/* ---- arming, the copier, disarming (the runtime's thread, its context current) ---- */

static int by_address(const void *a, const void *b) {
    unsigned long long x = ((const struct egpu_cow_range *)a)->address;
    unsigned long long y = ((const struct egpu_cow_range *)b)->address;
    return (x > y) - (x < y);
}

/* Drop the checkpoint's tables without freeing them or their events: a hook may still be reading them
 * (a disarm whose hold timed out), or they are the parent's (a forked child). */
static void forget_all(void) {
    cow.ranges = NULL, cow.units = NULL, cow.cut = NULL;
    cow.nranges = cow.nunits = cow.ncut = cow.nevents = 0;
}

static void release_all(void) {
    pfn_event destroy = EGPU_REAL(pfn_event, "cuEventDestroy_v2");
    for (size_t i = 0; destroy && i < cow.nunits; i++)
        if (cow.units[i].event) destroy(cow.units[i].event);
    for (size_t i = 0; destroy && i < cow.nevents; i++)
        if (cow.cut[i]) destroy(cow.cut[i]);
    free(cow.ranges);
    free(cow.units);
    free(cow.cut);
    forget_all();
}

static CUresult new_event(CUevent *e) {
    return CALL_AS(pfn_event_create, "cuEventCreate", e, CU_EVENT_DISABLE_TIMING);
}

EXPORT int egpu_cow_arm(const struct egpu_cow_range *ranges, size_t n, void *side) {
    pthread_mutex_lock(&arm_lock);
    if (atomic_load(&egpu_cow_flags) & FLAG_ARMED || cow.units) {
        pthread_mutex_unlock(&arm_lock);
        return -1;
    }
    size_t nptr = 0, nglob = 0;
    for (size_t i = 0; i < n; i++) {
        if (ranges[i].size > ULLONG_MAX - ranges[i].address) { /* wraps: no range to claim */
            pthread_mutex_unlock(&arm_lock);
            return -1;
        }
        ranges[i].always ? nglob++ : nptr++;
    }
    cow.ranges = calloc(n + 1, sizeof *cow.ranges);
    cow.units = calloc(nptr + 1, sizeof *cow.units);
    pthread_mutex_lock(&streams_lock);
    size_t room = nstreams + 1 + 32; /* the legacy stream, and streams made before the cut */
    int lost = streams_lost != 0;
    pthread_mutex_unlock(&streams_lock);
    int result = lost ? EGPU_COW_STREAMS : -1;
    if (lost) goto fail;
    cow.cut = calloc(room, sizeof *cow.cut);
    if (!cow.ranges || !cow.units || !cow.cut) goto fail;
    cow.nevents = room;
    for (size_t i = 0, p = 0, g = nptr; i < n; i++) cow.ranges[ranges[i].always ? g++ : p++] = ranges[i];
    qsort(cow.ranges, nptr, sizeof *cow.ranges, by_address);
    for (size_t i = 1; i < nptr; i++) /* overlapping ranges would be claimed twice */
        if (cow.ranges[i].address < cow.ranges[i - 1].address + cow.ranges[i - 1].size) goto fail;
    cow.nranges = nptr;
    cow.nunits = nptr + (nglob ? 1 : 0);
    for (size_t i = 0; i < cow.nunits; i++) {
        cow.units[i] = (struct unit){PENDING, NULL, NULL, i, i < nptr ? 1 : nglob};
        if ((result = new_event(&cow.units[i].event)) != CUDA_SUCCESS) goto fail;
    }
    for (size_t i = 0; i < room; i++)
        if ((result = new_event(&cow.cut[i])) != CUDA_SUCCESS) goto fail;
    atomic_store(&cow.next, 0);
    atomic_store(&cow.error, 0);
    memset(&cstats, 0, sizeof cstats);

    /* The cut: no hook between its check and its driver call while events go on every stream. A hook
     * that comes waits from the moment the gates close until they open: that span is the cut's hold. */
    unsigned long long held_from = egpu_now_ns();
    if (hold_hooks(1)) {
        result = EGPU_COW_TIMEOUT;
        goto fail;
    }
    pthread_mutex_lock(&streams_lock);
    /* more streams made since the events were counted than there are spares: refused */
    result = streams_lost ? EGPU_COW_STREAMS
             : nstreams + 1 <= room ? CALL(cuEventRecord, cow.cut[0], NULL) : EGPU_COW_STREAMS;
    cow.ncut = 1;
    for (size_t i = 0; i < nstreams && result == CUDA_SUCCESS; i++) {
        /* a stream of another context refuses the event: it cannot be cut from here */
        if (CALL(cuEventRecord, cow.cut[cow.ncut], streams[i]) == CUDA_SUCCESS) cow.ncut++;
    }
    pthread_mutex_unlock(&streams_lock);
    if (result == CUDA_SUCCESS) {
        struct egpu_stats st;
        egpu_shim_stats(&st);
        atomic_store(&cstats.launches_at_cut, st.launches);
        atomic_store(&cstats.cut_streams, cow.ncut);
        atomic_store(&cstats.alloc_digest_at_cut, atomic_load(&egpu_alloc_digest));
        atomic_fetch_or(&egpu_cow_flags, FLAG_ARMED);
    }
    hold_hooks(0);
    atomic_store(&cstats.cut_hold_ns, egpu_now_ns() - held_from);
    if (result != CUDA_SUCCESS) goto fail;
    for (size_t i = 0; i < cow.ncut && result == CUDA_SUCCESS; i++)
        result = CALL(cuStreamWaitEvent, side, cow.cut[i], 0);
    pthread_mutex_unlock(&arm_lock);
    if (result != CUDA_SUCCESS) { /* armed already: the hooks are consistent, the copier cannot be */
        egpu_cow_disarm();
        return result;
    }
    return 0;
fail:
    release_all();
    pthread_mutex_unlock(&arm_lock);
    return result;
}

EXPORT long egpu_cow_copy_next(void *side) {
    if (!(atomic_load(&egpu_cow_flags) & FLAG_ARMED)) return -1;
    /* the globals' unit (last) first: every launch waits for it */
    for (;;) {
        size_t k = atomic_fetch_add(&cow.next, 1);
        if (k >= cow.nunits) return -1;
        size_t i = cow.nunits > cow.nranges ? (k == 0 ? cow.nranges : k - 1) : k;
        int st = PENDING;
        if (!atomic_compare_exchange_strong(&cow.units[i].state, &st, CLAIMED)) continue; /* a hook has it */
        issue(&cow.units[i], side, 0); /* `side` already waits for the cut */
        atomic_fetch_add(&cstats.copier_copies, 1);
        CUresult r = CALL_AS(pfn_event, "cuEventSynchronize", cow.units[i].event);
        note_error(r);
        atomic_store(&cow.units[i].state, DONE); /* later writers need not wait */
        return (long)i;
    }
}

EXPORT int egpu_cow_disarm(void) {
    pthread_mutex_lock(&arm_lock);
    pfn_event sync = EGPU_REAL(pfn_event, "cuEventSynchronize");
    for (size_t i = 0; i < cow.nunits; i++) {
        int st = atomic_load(&cow.units[i].state);
        while (st == CLAIMED) {
            sched_yield();
            st = atomic_load(&cow.units[i].state);
        }
        if (st == ISSUED && sync) note_error(sync(cow.units[i].event));
        else if (st == PENDING) note_error(-1); /* never copied: the snapshot is incomplete */
    }
    int held = hold_hooks(1) == 0; /* no hook is reading the table when it goes */
    atomic_fetch_and(&egpu_cow_flags, ~FLAG_ARMED);
    int error = atomic_load(&cow.error);
    if (held) {
        hold_hooks(0);
        release_all();
    } else { /* a hook stayed inside past the limit and may read the table yet: it stays */
        forget_all();
    }
    pthread_mutex_unlock(&arm_lock);
    return error;
}

EXPORT int egpu_cow_staging(unsigned long long size, unsigned long long *out, int *host) {
    *host = 0;
    CUresult r = CALL_AS(pfn_mem_alloc, "cuMemAlloc_v2", out, size ? size : 1);
    if (r == CUDA_SUCCESS) return 0;
    void *p = NULL;
    r = CALL_AS(pfn_host_alloc, "cuMemHostAlloc", &p, size ? size : 1, CU_MEMHOSTALLOC_PORTABLE);
    if (r != CUDA_SUCCESS) return r;
    *out = (unsigned long long)(uintptr_t)p;
    *host = 1;
    return 0;
}

EXPORT int egpu_cow_staging_free(unsigned long long ptr, int host) {
    return host ? CALL_AS(pfn_host_free, "cuMemFreeHost", (void *)(uintptr_t)ptr)
                : CALL_AS(pfn_mem_free, "cuMemFree_v2", ptr);
}

EXPORT void egpu_cow_stats(struct egpu_cow_stats *out) {
    *out = (struct egpu_cow_stats){
        atomic_load(&ops_recorded), atomic_load(&ops_dropped), atomic_load(&egpu_alloc_seq),
        atomic_load(&egpu_alloc_overflow), 0, atomic_load(&cstats.launches_at_cut), atomic_load(&cstats.cut_streams),
        atomic_load(&cstats.hook_copies), atomic_load(&cstats.hook_waits),
        atomic_load(&cstats.copier_copies), atomic_load(&cstats.checked),
        atomic_load(&cstats.unknown_layout), atomic_load(&cstats.stall_ns),
        atomic_load(&cstats.stall_max_ns), atomic_load(&cstats.cut_hold_ns), atomic_load(&egpu_alloc_changes),
        atomic_load(&egpu_alloc_digest), atomic_load(&cstats.alloc_digest_at_cut),
        (atomic_load(&egpu_cow_flags) & FLAG_ARMED) != 0};
    pthread_mutex_lock(&streams_lock);
    out->streams = nstreams;
    pthread_mutex_unlock(&streams_lock);
}

/* ---- the restore trigger ----
 * ARMED until the allocation count is reached; the launch that finds it reached first claims the
 * restore (RUNNING) and calls Python with no lock held; DONE after. Launches on other threads meanwhile
 * wait until the contents are back, letting go of the GIL if they hold it: the restore needs it. Not
 * while a stream captures: the restore's copies would fail there and fail the capture, and a captured
 * launch does not run now but when its graph is replayed, so the first launch outside a capture
 * restores. */

enum { RESTORE_IDLE, RESTORE_ARMED, RESTORE_RUNNING };
static _Atomic unsigned long long restore_count;
static _Atomic int restore_state;
static __thread int tls_restoring; /* this thread runs the restore: its own launches go on */

EXPORT void egpu_cow_restore_at(unsigned long long count) {
    atomic_store(&restore_count, count);
    atomic_store(&restore_state, RESTORE_ARMED);
    atomic_fetch_or(&egpu_cow_flags, FLAG_RESTORE);
}

static void restore_check(void) {
    if (tls_restoring || atomic_load(&egpu_alloc_seq) < atomic_load(&restore_count) || egpu_shim_capturing())
        return;
    int st = RESTORE_ARMED;
    if (atomic_compare_exchange_strong(&restore_state, &st, RESTORE_RUNNING)) {
        if (egpu_python_up()) { /* never into a finalized interpreter */
            tls_restoring = 1;
            egpu_py_cow_restore();
            tls_restoring = 0;
        }
        atomic_fetch_and(&egpu_cow_flags, ~FLAG_RESTORE);
        atomic_store(&restore_state, RESTORE_IDLE);
        return;
    }
    if (st != RESTORE_RUNNING) return;
    void *gil = egpu_gil_let_go();
    while (atomic_load(&restore_state) == RESTORE_RUNNING) sched_yield();
    egpu_gil_take_back(gil);
}

/* ---- the hooks ---- */

#define WRITES(kind) ((kind) == EGPU_OP_HTOD || (kind) == EGPU_OP_DTOD || (kind) == EGPU_OP_COPY || \
                      (kind) == EGPU_OP_PEER || (kind) == EGPU_OP_MEMSET)

/* One copy or memset: its operands moved (`move_`, a statement run inside the gate: a variable of a
 * module that a copy serves), copy-on-write for what it writes, the driver call, its record, the
 * egpu/memcpy or egpu/memset probes (egpu_hostapi.h; `bytes_` the bytes it moves, where `size_` spans
 * the rows a 2D/3D one touches). */
#define OP(sym, kind_, flags_, stream_, move_, dst_, src_, size_, bytes_, ...) do { \
        CUstream s_ = effective((stream_), (flags_) & EGPU_OP_PER_THREAD); \
        egpu_gate_enter(&copy_gate); \
        move_; \
        unsigned long long d_ = (dst_), n_ = (size_); \
        if (WRITES(kind_)) cow_write(d_, n_, s_); \
        unsigned long long t_ = EGPU_HOST_BEGIN(sym); \
        CUresult r_ = CALL(sym, __VA_ARGS__); \
        egpu_gate_exit(&copy_gate); \
        if (r_ == CUDA_SUCCESS) record((kind_), (flags_), d_, (src_), n_, s_); \
        EGPU_HOST_END(sym, t_, r_, .dst = d_, .src = (src_), .bytes = (bytes_), .stream = P(s_), .kind = (kind_), \
                      .flags = (flags_)); \
        return r_; \
    } while (0)

#define P(x) ((unsigned long long)(uintptr_t)(x))
#define PT EGPU_OP_PER_THREAD
#define AS EGPU_OP_ASYNC

#define NO_MOVE ((void)0)
/* Host pointers never fall in a moved range (unified addressing): every operand may be looked up. */
#define MOVED(x, n) (x = (__typeof__(x))(uintptr_t)egpu_moved_address(P(x), (n)))
#define LINEAR(sym, kind, flags, dt, st) \
    EXPORT CUresult sym(dt dst, st src, size_t n) { \
        OP(sym, kind, flags, NULL, (MOVED(dst, n), MOVED(src, n)), P(dst), P(src), n, n, dst, src, n); }
#define LINEAR_ASYNC(sym, kind, flags, dt, st) \
    EXPORT CUresult sym(dt dst, st src, size_t n, CUstream s) { \
        OP(sym, kind, (flags) | AS, s, (MOVED(dst, n), MOVED(src, n)), P(dst), P(src), n, n, dst, src, n, s); }
LINEAR(cuMemcpy, EGPU_OP_COPY, 0, CUdeviceptr, CUdeviceptr)
LINEAR(cuMemcpy_ptds, EGPU_OP_COPY, PT, CUdeviceptr, CUdeviceptr)
LINEAR(cuMemcpyHtoD_v2, EGPU_OP_HTOD, 0, CUdeviceptr, const void *)
LINEAR(cuMemcpyHtoD_v2_ptds, EGPU_OP_HTOD, PT, CUdeviceptr, const void *)
LINEAR(cuMemcpyDtoH_v2, EGPU_OP_DTOH, 0, void *, CUdeviceptr)
LINEAR(cuMemcpyDtoH_v2_ptds, EGPU_OP_DTOH, PT, void *, CUdeviceptr)
LINEAR(cuMemcpyDtoD_v2, EGPU_OP_DTOD, 0, CUdeviceptr, CUdeviceptr)
LINEAR(cuMemcpyDtoD_v2_ptds, EGPU_OP_DTOD, PT, CUdeviceptr, CUdeviceptr)
LINEAR_ASYNC(cuMemcpyAsync, EGPU_OP_COPY, 0, CUdeviceptr, CUdeviceptr)
LINEAR_ASYNC(cuMemcpyAsync_ptsz, EGPU_OP_COPY, PT, CUdeviceptr, CUdeviceptr)
LINEAR_ASYNC(cuMemcpyHtoDAsync_v2, EGPU_OP_HTOD, 0, CUdeviceptr, const void *)
LINEAR_ASYNC(cuMemcpyHtoDAsync_v2_ptsz, EGPU_OP_HTOD, PT, CUdeviceptr, const void *)
LINEAR_ASYNC(cuMemcpyDtoHAsync_v2, EGPU_OP_DTOH, 0, void *, CUdeviceptr)
LINEAR_ASYNC(cuMemcpyDtoHAsync_v2_ptsz, EGPU_OP_DTOH, PT, void *, CUdeviceptr)
LINEAR_ASYNC(cuMemcpyDtoDAsync_v2, EGPU_OP_DTOD, 0, CUdeviceptr, CUdeviceptr)
LINEAR_ASYNC(cuMemcpyDtoDAsync_v2_ptsz, EGPU_OP_DTOD, PT, CUdeviceptr, CUdeviceptr)

#define PEER(sym, flags) \
    EXPORT CUresult sym(CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t n) { \
        OP(sym, EGPU_OP_PEER, flags, NULL, NO_MOVE, dst, src, n, n, dst, dc, src, sc, n); }
#define PEER_ASYNC(sym, flags) \
    EXPORT CUresult sym(CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t n, CUstream s) { \
        OP(sym, EGPU_OP_PEER, (flags) | AS, s, NO_MOVE, dst, src, n, n, dst, dc, src, sc, n, s); }
PEER(cuMemcpyPeer, 0)
PEER(cuMemcpyPeer_ptds, PT)
PEER_ASYNC(cuMemcpyPeerAsync, 0)
PEER_ASYNC(cuMemcpyPeerAsync_ptsz, PT)

/* 2D/3D: the operands' addresses and the bytes from the first row touched to the end of the last. */
static unsigned long long end_of(const void *host, CUdeviceptr dev, int type) {
    return type == MT_HOST ? P(host) : type == MT_DEVICE || type == MT_UNIFIED ? dev : 0;
}
static int kind_of(int src, int dst) {
    int sd = src == MT_DEVICE || src == MT_UNIFIED, dd = dst == MT_DEVICE || dst == MT_UNIFIED;
    return src == MT_HOST && dd ? EGPU_OP_HTOD : sd && dst == MT_HOST ? EGPU_OP_DTOH
           : sd && dd ? EGPU_OP_DTOD : EGPU_OP_COPY;
}
#define C2_DST(c) span(span(end_of((c)->dstHost, (c)->dstDevice, (c)->dstMemoryType), (c)->dstY, (c)->dstPitch), \
                         (c)->dstXInBytes, 1)
#define C2_SRC(c) span(span(end_of((c)->srcHost, (c)->srcDevice, (c)->srcMemoryType), (c)->srcY, (c)->srcPitch), \
                         (c)->srcXInBytes, 1)
#define C2_SIZE(c) ((c)->Height ? span((c)->WidthInBytes, (c)->Height - 1, (c)->dstPitch) : 0)
#define C2_BYTES(c) span(0, (c)->WidthInBytes, (c)->Height)
#define C3_BYTES(c) span(0, span(0, (c)->WidthInBytes, (c)->Height), (c)->Depth)
#define C3_DST(c) span(span(end_of((c)->dstHost, (c)->dstDevice, (c)->dstMemoryType), (c)->dstXInBytes, 1), \
                         span((c)->dstY, (c)->dstZ, (c)->dstHeight), (c)->dstPitch)
#define C3_SRC(c) span(span(end_of((c)->srcHost, (c)->srcDevice, (c)->srcMemoryType), (c)->srcXInBytes, 1), \
                         span((c)->srcY, (c)->srcZ, (c)->srcHeight), (c)->srcPitch)
#define C3_SIZE(c) ((c)->Height && (c)->Depth ? \
    span((c)->WidthInBytes, span((c)->Height - 1, (c)->Depth - 1, (c)->dstHeight), (c)->dstPitch) : 0)

#define STRIDED(sym, T, D, flags) \
    EXPORT CUresult sym(const T *c) { \
        if (!c) return CALL(sym, c); \
        OP(sym, kind_of(c->srcMemoryType, c->dstMemoryType), (flags) | EGPU_OP_STRIDED, NULL, NO_MOVE, \
           D##_DST(c), D##_SRC(c), D##_SIZE(c), D##_BYTES(c), c); }
#define STRIDED_ASYNC(sym, T, D, flags) \
    EXPORT CUresult sym(const T *c, CUstream s) { \
        if (!c) return CALL(sym, c, s); \
        OP(sym, kind_of(c->srcMemoryType, c->dstMemoryType), (flags) | AS | EGPU_OP_STRIDED, s, NO_MOVE, \
           D##_DST(c), D##_SRC(c), D##_SIZE(c), D##_BYTES(c), c, s); }
STRIDED(cuMemcpy2D_v2, CUDA_MEMCPY2D, C2, 0)
STRIDED(cuMemcpy2D_v2_ptds, CUDA_MEMCPY2D, C2, PT)
STRIDED(cuMemcpy2DUnaligned_v2, CUDA_MEMCPY2D, C2, 0)
STRIDED(cuMemcpy2DUnaligned_v2_ptds, CUDA_MEMCPY2D, C2, PT)
STRIDED_ASYNC(cuMemcpy2DAsync_v2, CUDA_MEMCPY2D, C2, 0)
STRIDED_ASYNC(cuMemcpy2DAsync_v2_ptsz, CUDA_MEMCPY2D, C2, PT)
STRIDED(cuMemcpy3D_v2, CUDA_MEMCPY3D, C3, 0)
STRIDED(cuMemcpy3D_v2_ptds, CUDA_MEMCPY3D, C3, PT)
STRIDED_ASYNC(cuMemcpy3DAsync_v2, CUDA_MEMCPY3D, C3, 0)
STRIDED_ASYNC(cuMemcpy3DAsync_v2_ptsz, CUDA_MEMCPY3D, C3, PT)
STRIDED(cuMemcpy3DPeer, CUDA_MEMCPY3D, C3, 0)
STRIDED(cuMemcpy3DPeer_ptds, CUDA_MEMCPY3D, C3, PT)
STRIDED_ASYNC(cuMemcpy3DPeerAsync, CUDA_MEMCPY3D, C3, 0)
STRIDED_ASYNC(cuMemcpy3DPeerAsync_ptsz, CUDA_MEMCPY3D, C3, PT)

#define MEMSET(sym, T, unit, flags) \
    EXPORT CUresult sym(CUdeviceptr dst, T v, size_t n) { \
        OP(sym, EGPU_OP_MEMSET, flags, NULL, MOVED(dst, span(0, n, unit)), dst, v, span(0, n, unit), span(0, n, unit), \
           dst, v, n); }
#define MEMSET_ASYNC(sym, T, unit, flags) \
    EXPORT CUresult sym(CUdeviceptr dst, T v, size_t n, CUstream s) { \
        OP(sym, EGPU_OP_MEMSET, (flags) | AS, s, MOVED(dst, span(0, n, unit)), dst, v, span(0, n, unit), \
           span(0, n, unit), dst, v, n, s); }
#define MEMSET2D(sym, T, unit, flags) \
    EXPORT CUresult sym(CUdeviceptr dst, size_t pitch, T v, size_t w, size_t h) { \
        OP(sym, EGPU_OP_MEMSET, (flags) | EGPU_OP_STRIDED, NULL, NO_MOVE, dst, v, \
           h ? span(span(0, w, unit), h - 1, pitch) : 0, span(0, span(0, w, unit), h), \
           dst, pitch, v, w, h); }
#define MEMSET2D_ASYNC(sym, T, unit, flags) \
    EXPORT CUresult sym(CUdeviceptr dst, size_t pitch, T v, size_t w, size_t h, CUstream s) { \
        OP(sym, EGPU_OP_MEMSET, (flags) | AS | EGPU_OP_STRIDED, s, NO_MOVE, dst, v, \
           h ? span(span(0, w, unit), h - 1, pitch) : 0, span(0, span(0, w, unit), h), \
           dst, pitch, v, w, h, s); }
MEMSET(cuMemsetD8_v2, unsigned char, 1, 0)
MEMSET(cuMemsetD8_v2_ptds, unsigned char, 1, PT)
MEMSET(cuMemsetD16_v2, unsigned short, 2, 0)
MEMSET(cuMemsetD16_v2_ptds, unsigned short, 2, PT)
MEMSET(cuMemsetD32_v2, unsigned int, 4, 0)
MEMSET(cuMemsetD32_v2_ptds, unsigned int, 4, PT)
MEMSET2D(cuMemsetD2D8_v2, unsigned char, 1, 0)
MEMSET2D(cuMemsetD2D8_v2_ptds, unsigned char, 1, PT)
MEMSET2D(cuMemsetD2D16_v2, unsigned short, 2, 0)
MEMSET2D(cuMemsetD2D16_v2_ptds, unsigned short, 2, PT)
MEMSET2D(cuMemsetD2D32_v2, unsigned int, 4, 0)
MEMSET2D(cuMemsetD2D32_v2_ptds, unsigned int, 4, PT)
MEMSET_ASYNC(cuMemsetD8Async, unsigned char, 1, 0)
MEMSET_ASYNC(cuMemsetD8Async_ptsz, unsigned char, 1, PT)
MEMSET_ASYNC(cuMemsetD16Async, unsigned short, 2, 0)
MEMSET_ASYNC(cuMemsetD16Async_ptsz, unsigned short, 2, PT)
MEMSET_ASYNC(cuMemsetD32Async, unsigned int, 4, 0)
MEMSET_ASYNC(cuMemsetD32Async_ptsz, unsigned int, 4, PT)
MEMSET2D_ASYNC(cuMemsetD2D8Async, unsigned char, 1, 0)
MEMSET2D_ASYNC(cuMemsetD2D8Async_ptsz, unsigned char, 1, PT)
MEMSET2D_ASYNC(cuMemsetD2D16Async, unsigned short, 2, 0)
MEMSET2D_ASYNC(cuMemsetD2D16Async_ptsz, unsigned short, 2, PT)
MEMSET2D_ASYNC(cuMemsetD2D32Async, unsigned int, 4, 0)
MEMSET2D_ASYNC(cuMemsetD2D32Async_ptsz, unsigned int, 4, PT)

/* Streams and events: the stream list for the cut, records for the DAG (dag.Dag.add(after=)). */
EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags) {
    CUresult r = CALL(cuStreamCreate, phStream, Flags);
    if (r == CUDA_SUCCESS && phStream) {
        stream_add(*phStream);
        record(EGPU_OP_STREAM_CREATE, 0, 0, 0, 0, *phStream);
    }
    return r;
}

EXPORT CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority) {
    CUresult r = CALL(cuStreamCreateWithPriority, phStream, flags, priority);
    if (r == CUDA_SUCCESS && phStream) {
        stream_add(*phStream);
        record(EGPU_OP_STREAM_CREATE, 0, 0, 0, 0, *phStream);
    }
    return r;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) {
    stream_del(hStream); /* first: the cut never records on a stream being destroyed */
    CUresult r = CALL(cuStreamDestroy_v2, hStream);
    record(EGPU_OP_STREAM_DESTROY, 0, 0, 0, 0, hStream);
    return r;
}

#define EVENT_RECORD(sym, flags) \
    EXPORT CUresult sym(CUevent e, CUstream s) { \
        CUresult r = CALL(sym, e, s); \
        if (r == CUDA_SUCCESS) record(EGPU_OP_EVENT_RECORD, flags, 0, P(e), 0, effective(s, (flags) & PT)); \
        return r; }
#define EVENT_RECORD_FLAGS(sym, flags) \
    EXPORT CUresult sym(CUevent e, CUstream s, unsigned int f) { \
        CUresult r = CALL(sym, e, s, f); \
        if (r == CUDA_SUCCESS) record(EGPU_OP_EVENT_RECORD, flags, 0, P(e), 0, effective(s, (flags) & PT)); \
        return r; }
#define WAIT_EVENT(sym, flags) \
    EXPORT CUresult sym(CUstream s, CUevent e, unsigned int f) { \
        CUresult r = CALL(sym, s, e, f); \
        if (r == CUDA_SUCCESS) record(EGPU_OP_STREAM_WAIT, flags, 0, P(e), 0, effective(s, (flags) & PT)); \
        return r; }
EVENT_RECORD(cuEventRecord, 0)
EVENT_RECORD(cuEventRecord_ptsz, PT)
EVENT_RECORD_FLAGS(cuEventRecordWithFlags, 0)
EVENT_RECORD_FLAGS(cuEventRecordWithFlags_ptsz, PT)
WAIT_EVENT(cuStreamWaitEvent, 0)
WAIT_EVENT(cuStreamWaitEvent_ptsz, PT)

/* ---- fork (process.c): the streams' lock taken across it; the child keeps the stream list but none of
 * the parent's checkpoint, restore or records: those are the parent's runtime's (its threads are not in
 * the child) ---- */

void egpu_cow_fork(enum egpu_fork_phase phase) {
    if (phase == EGPU_FORK_PREPARE) {
        pthread_mutex_lock(&streams_lock);
        return;
    }
    if (phase == EGPU_FORK_PARENT) {
        pthread_mutex_unlock(&streams_lock);
        return;
    }
    pthread_mutex_init(&streams_lock, NULL);
    pthread_mutex_init(&arm_lock, NULL);
    atomic_store(&egpu_cow_flags, 0);
    atomic_store(&restore_state, RESTORE_IDLE);
    atomic_store(&restore_count, 0);
    forget_all();
    egpu_gate_reset(&copy_gate);
    atomic_store(&records_on, 0);
    op_ring_reset();
}
