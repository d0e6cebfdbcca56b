/* interpose.c: the C half of libegpu_shim.so (LD_PRELOAD).
 *
 * How programs reach the driver (DESIGN.md section 3): cudart dlopens libcuda.so.1, dlsyms
 * cuGetProcAddress_v2 and asks it for every entry point (and for cuGetProcAddress itself);
 * PyTorch/Triton/CuPy dlsym entry points; Triton's stub links libcuda. So the shim interposes dlsym,
 * dlvsym and cuGetProcAddress(_v2), and also exports every hook under the driver's own symbol name.
 * Each hook is the ABI twin of one driver symbol (egpu_shim.h, EGPU_HOOKS) and calls that symbol.
 *
 * Launch hooks stay in C: one lock-free table lookup (original handle -> current target), counters,
 * an optional lock-free ring of launch records; no Python, no lock, no synchronization (a launch
 * waits only while egpu_shim_swap or a checkpoint's cut holds the gate, never past the holder's
 * deadline: egpu_gate.h). Module loads
 * and handle lookups call into embedded Python (started by cffi on the first such call, never here
 * at load time). Every hook returns the driver's own CUresult. The library does nothing until called.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>

#include "egpu_shim.h"
#include "egpu_sass.h"
#include "egpu_cow.h"
#include "egpu_hostapi.h"
#include "egpu_gate.h"
#include "egpu_ring.h"
#include "egpu_table.h"
#include "egpu_launchvm.h"
#include "egpu_uprobe.h"

/* every hooked symbol: the launch and module side here, copies and streams in cow.c, synchronization in
 * hostapi.c (egpu_hostapi.h's order) */
#define EGPU_ALL_HOOKS(X) EGPU_HOST_ALL(X)

#define EXPORT __attribute__((visibility("default")))
#if defined(__has_attribute) && __has_attribute(musttail)
#define TAIL __attribute__((musttail)) /* clang >= 13, gcc >= 15; elsewhere -O2 makes it a jmp */
#else
#define TAIL
#endif
#define CUDA_SUCCESS 0
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_STREAM_CAPTURE_INVALIDATED 901
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2
#define CU_JIT_INPUT_PTX 1
#define CU_JIT_ERROR_LOG_BUFFER 5
#define CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES 6
#define CU_GRAPH_NODE_TYPE_KERNEL 0
#define CU_LAUNCH_PARAM_END ((void *)0x00)
#define CU_LAUNCH_PARAM_BUFFER_POINTER ((void *)0x01)
#define CU_LAUNCH_PARAM_BUFFER_SIZE ((void *)0x02)

/* ---- the hooked driver symbols, as a table ---- */

enum variant_id {
#define X(sym, api, ver, ptsz, params) V_##sym,
    EGPU_ALL_HOOKS(X)
#undef X
    V_COUNT
};

#define X(sym, api, ver, ptsz, params) typedef CUresult (*pfn_##sym) params; EXPORT CUresult sym params;
EGPU_ALL_HOOKS(X)
#undef X

struct variant {
    const char *symbol; /* exported by libcuda */
    const char *api;    /* what cuGetProcAddress is asked for */
    int version;        /* first cudaVersion that returns this symbol */
    int ptsz;           /* the per-thread default stream twin */
    void *hook;
};

static const struct variant variants[V_COUNT] = {
#define X(sym, api_, ver, ptsz_, params) [V_##sym] = {#sym, #api_, ver, ptsz_, (void *)sym},
    EGPU_ALL_HOOKS(X)
#undef X
};

/* The driver's function behind each hook, learnt from what dlsym/cuGetProcAddress returned to the app
 * or looked up in libcuda.so.1 on first use (programs that link libcuda call the hooks directly). */
static _Atomic(void *) real_fns[V_COUNT];

/* ---- the real dlsym/dlvsym ---- */

typedef void *(*dlsym_fn)(void *, const char *);
typedef void *(*dlvsym_fn)(void *, const char *, const char *);
static _Atomic(dlsym_fn) g_dlsym;
static _Atomic(dlvsym_fn) g_dlvsym;

static uint32_t gnu_hash(const char *s) {
    uint32_t h = 5381;
    for (; *s; s++) h = h * 33 + (unsigned char)*s;
    return h;
}

/* `name` in the dynamic symbol table of the already loaded `lib`, read through its GNU hash table.
 * The shim defines dlsym and dlvsym itself, so any call by those names from here would reach the
 * shim again: the first real one has to be found without them. */
static void *elf_symbol(const char *lib, const char *name) {
    void *h = dlopen(lib, RTLD_LAZY | RTLD_NOLOAD);
    struct link_map *map = NULL;
    if (!h) return NULL;
    int ok = dlinfo(h, RTLD_DI_LINKMAP, &map) == 0 && map;
    dlclose(h);
    if (!ok) return NULL;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const uint32_t *gh = NULL;
    ElfW(Addr) base = map->l_addr;
    for (const ElfW(Dyn) *d = map->l_ld; d->d_tag != DT_NULL; d++) {
        /* glibc relocates these entries in place where .dynamic is writable; else they are offsets */
        ElfW(Addr) p = d->d_un.d_ptr < base ? d->d_un.d_ptr + base : d->d_un.d_ptr;
        if (d->d_tag == DT_SYMTAB) symtab = (const void *)p;
        else if (d->d_tag == DT_STRTAB) strtab = (const void *)p;
        else if (d->d_tag == DT_GNU_HASH) gh = (const void *)p;
    }
    if (!symtab || !strtab || !gh) return NULL;
    uint32_t nbuckets = gh[0], symoffset = gh[1], bloom_size = gh[2];
    const uint32_t *buckets = (const uint32_t *)((const ElfW(Addr) *)&gh[4] + bloom_size);
    const uint32_t *chain = buckets + nbuckets;
    uint32_t hash = gnu_hash(name);
    for (uint32_t i = buckets[hash % nbuckets]; i >= symoffset; i++) {
        uint32_t c = chain[i - symoffset];
        if ((c | 1) == (hash | 1) && symtab[i].st_value && !strcmp(strtab + symtab[i].st_name, name))
            return (void *)(base + symtab[i].st_value);
        if (c & 1) break;
    }
    return NULL;
}

static dlvsym_fn real_dlvsym(void) {
    dlvsym_fn f = atomic_load_explicit(&g_dlvsym, memory_order_acquire);
    if (!f) {
        f = (dlvsym_fn)elf_symbol("libc.so.6", "dlvsym"); /* glibc >= 2.34 */
        if (!f) f = (dlvsym_fn)elf_symbol("libdl.so.2", "dlvsym");
        atomic_store_explicit(&g_dlvsym, f, memory_order_release);
    }
    return f;
}

static dlsym_fn real_dlsym(void) {
    dlsym_fn f = atomic_load_explicit(&g_dlsym, memory_order_acquire);
    if (!f) {
        f = (dlsym_fn)real_dlvsym()(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
        atomic_store_explicit(&g_dlsym, f, memory_order_release);
    }
    return f;
}

void *egpu_real_dlsym(void *handle, const char *name) {
    return real_dlsym()(handle, name);
}

void *egpu_real_dlvsym(void *handle, const char *name, const char *version) {
    return real_dlvsym()(handle, name, version);
}

/* ---- finding the driver's functions ---- */

static void *libcuda(void) {
    static _Atomic(void *) handle;
    void *h = atomic_load_explicit(&handle, memory_order_acquire);
    if (!h) {
        h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        if (!h) h = dlopen("libcuda.so.1", RTLD_LAZY);
        atomic_store_explicit(&handle, h, memory_order_release);
    }
    return h;
}

/* Remember what the driver returned for variant i; our own hook (dlsym(RTLD_DEFAULT) finds the shim
 * first) is never a driver function. */
static void note_real(int i, void *p) {
    if (p && p != variants[i].hook) {
        egpu_fork_handlers();
        atomic_store_explicit(&real_fns[i], p, memory_order_release);
    }
}

static void *real_fn(int i) {
    void *p = atomic_load_explicit(&real_fns[i], memory_order_acquire);
    if (__builtin_expect(p != NULL, 1)) return p;
    egpu_fork_handlers(); /* the first hook that reaches the driver: from here on there is state to fork */
    void *h = libcuda();
    /* dlsym on libcuda's own handle searches libcuda and its dependencies, never the preload */
    note_real(i, h ? real_dlsym()(h, variants[i].symbol) : NULL);
    return atomic_load_explicit(&real_fns[i], memory_order_acquire);
}

#define CALL_REAL(sym, ...) ({ pfn_##sym fn_ = (pfn_##sym)real_fn(V_##sym); \
    fn_ ? fn_(__VA_ARGS__) : CUDA_ERROR_NOT_FOUND; })

static int variant_by_symbol(const char *symbol) {
    for (int i = 0; i < V_COUNT; i++)
        if (!strcmp(variants[i].symbol, symbol)) return i;
    return -1;
}

/* The variant the driver returns for (api, cudaVersion, flags): the newest one not newer than the
 * requested version, preferring the per-thread twin when asked for it. -1: not hooked. */
static int variant_for(const char *api, int version, cuuint64_t flags) {
    int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    int best = -1;
    for (int i = 0; i < V_COUNT; i++) {
        const struct variant *v = &variants[i];
        if (v->version > version || strcmp(v->api, api)) continue;
        if (v->ptsz && !want_ptsz) continue;
        if (best < 0 || v->ptsz > variants[best].ptsz ||
            (v->ptsz == variants[best].ptsz && v->version > variants[best].version))
            best = i;
    }
    return best;
}

/* ---- per-thread pass-through ---- */

static __thread int tls_bypass __attribute__((tls_model("initial-exec")));
static __thread int tls_in_python __attribute__((tls_model("initial-exec")));

static inline int passthrough(void) { return tls_bypass | tls_in_python; }
int egpu_passthrough(void) { return passthrough(); }

EXPORT int egpu_shim_bypass(int on) {
    int old = tls_bypass;
    tls_bypass = on != 0;
    return old;
}

EXPORT void *egpu_shim_real(const char *symbol) {
    int i = symbol ? variant_by_symbol(symbol) : -1;
    if (i >= 0) return real_fn(i);
    void *h = libcuda();
    return h && symbol ? real_dlsym()(h, symbol) : NULL;
}

/* ---- dlsym, dlvsym, cuGetProcAddress ---- */

static void *hand_out(int i, void *real) {
    if (!real) return NULL;
    note_real(i, real);
    return variants[i].hook;
}

/* The pass-through is a tail call on purpose: glibc's dlsym reads its caller from the return
 * address to resolve RTLD_NEXT, and a tail call leaves the application's there (tests/test_shim.py
 * checks it with app_nocuda). */
EXPORT void *dlsym(void *handle, const char *name) {
    dlsym_fn real = real_dlsym();
    if (name[0] == 'c' && name[1] == 'u' && !passthrough()) {
        int i = variant_by_symbol(name);
        if (i >= 0) return hand_out(i, real(handle, name));
        if ((i = egpu_cupti_fn(name)) >= 0) return egpu_cupti_hand_out(i, real(handle, name));
    }
    if (egpu_uprobes_on() && handle != RTLD_NEXT) return egpu_uprobe_dlsym(real(handle, name));
    TAIL return real(handle, name);
}

void *egpu_dlsym_next(const char *name) {
    return real_dlsym()(RTLD_NEXT, name);
}

EXPORT void *dlvsym(void *handle, const char *name, const char *version) {
    dlvsym_fn real = real_dlvsym();
    if (name[0] == 'c' && name[1] == 'u' && !passthrough()) {
        int i = variant_by_symbol(name);
        if (i >= 0) return hand_out(i, real(handle, name, version));
    }
    if (egpu_uprobes_on() && handle != RTLD_NEXT) return egpu_uprobe_dlsym(real(handle, name, version));
    TAIL return real(handle, name, version);
}

static void proc_address(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    if (!symbol || !pfn || !*pfn || passthrough()) return;
    int i = variant_for(symbol, version, flags);
    if (i >= 0) *pfn = hand_out(i, *pfn);
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    CUresult r = CALL_REAL(cuGetProcAddress, symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS) proc_address(symbol, pfn, cudaVersion, flags);
    return r;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                    int *symbolStatus) {
    CUresult r = CALL_REAL(cuGetProcAddress_v2, symbol, pfn, cudaVersion, flags, symbolStatus);
    if (r == CUDA_SUCCESS) proc_address(symbol, pfn, cudaVersion, flags);
    return r;
}

/* The SASS back end subscribes to the sanitizer here, before the driver starts: a subscription made
 * after CUDA ran sees no launches (docs/sass-backend.md). */
/* Say once why the job will see no instrumented kernel: its own error handling may say nothing (a
 * framework falls back to the CPU). 100 is CUDA_ERROR_NO_DEVICE. */
static void cuinit_failed(CUresult r) {
    static _Atomic int said;
    if (atomic_exchange(&said, 1)) return;
    fprintf(stderr, "egpu[%d]: cuInit failed: %s (CUDA error %d): this process runs no probe\n", (int)getpid(),
            r == 100 ? "no CUDA device"
            : r == 35 ? "the driver is older than this program's CUDA"
            : "the driver refused",
            r);
}

EXPORT CUresult cuInit(unsigned int Flags) {
    if (!passthrough()) egpu_sass_start();
    CUresult r = CALL_REAL(cuInit, Flags);
    if (r != CUDA_SUCCESS && !passthrough()) cuinit_failed(r);
    else if (r == CUDA_SUCCESS) egpu_python_start_early(); /* before any context exists */
    return r;
}

/* ---- statistics and the function table ---- */

static struct {
    _Atomic unsigned long long launches, redirected, records, dropped, untracked, python_calls, refused, calls;
} g_stats;

/* What launches of one original handle run. Immutable once published (but for `escaped`, which only
 * ever goes from 0 to 1); a swap publishes a new one. Never freed, so every slot keeps the chain of all
 * targets it ever had. */
struct target {
    void *function;
    unsigned int nparams, param_offset;
    int launch_id;                /* append the launch id (translate/rewrite.py's launch contract) */
    _Atomic int escaped;          /* `function` went where launches bypass the hooks (escape()) */
    const struct target *prev;    /* the target published for the slot before this one */
};

struct evals; /* what a launch of the handle adds for programs evaluated at the launch (below) */

/* What the application set on a handle (cuFuncSetAttribute, cuFuncSetCacheConfig, cuKernelSetAttribute,
 * cuKernelSetCacheConfig), made on every function its launches are sent to as well: when that target is
 * published, and when the application sets it later (setting_made). A copy's function starts from the
 * driver's defaults, and one not allowed the dynamic shared memory the application allowed its own refuses
 * those launches (CUDA_ERROR_INVALID_VALUE). A CUkernel's settings are per device: the last one named is kept. */
#define ATTRIBUTES 16          /* CUfunction_attribute values below this (those settable: 8, 9, 11-15) */
#define CACHE_CONFIG ATTRIBUTES /* the cache config's index */
struct settings {
    unsigned int made;                                 /* bit i: setting i was made */
    int value[ATTRIBUTES + 1], device[ATTRIBUTES + 1]; /* device -1: made on a CUfunction */
};
static pthread_mutex_t settings_lock = PTHREAD_MUTEX_INITIALIZER;

struct slot {
    _Atomic(void *) key;
    _Atomic(const struct target *) target;  /* NULL: launches run the key itself */
    _Atomic(const struct target *) history; /* the newest target ever published, NULL ones aside */
    _Atomic unsigned long long launches;
    _Atomic(const struct evals *) evals;    /* NULL: not asked since counting began or handles were forgotten */
    struct settings *settings;              /* what the application set on the handle; under settings_lock */
};

#define TABLE_SIZE (1u << 16) /* power of two; keys are never removed */
static struct slot table[TABLE_SIZE];
/* The runtime's copies' CUkernels (egpu_shim_kernel_handle), told apart from functions when a setting is made: as
 * many as the slots whose targets they are (each live change may load new copies, and keys are never removed). */
static struct { _Atomic(void *) key; } kernel_handles[TABLE_SIZE];

static struct slot *slot_for(void *key, int insert) { return EGPU_TABLE_FIND(table, key, insert); }

static struct target *new_target(void *function, int launch_id, unsigned int nparams, unsigned int offset) {
    struct target *t = malloc(sizeof *t);
    if (!t) return NULL;
    t->function = function;
    t->nparams = nparams;
    t->param_offset = offset;
    t->launch_id = launch_id;
    atomic_init(&t->escaped, 0);
    t->prev = NULL;
    return t;
}

/* Make `t` (NULL: none) what launches of slot `s` run. It joins the slot's history first, so every
 * target a hook can find there is one egpu_shim_escaped walks past. The previous target is not freed:
 * a launch on another thread may still be reading it, and the history keeps it. */
static void set_target(struct slot *s, struct target *t) {
    if (t) {
        const struct target *head = atomic_load_explicit(&s->history, memory_order_acquire);
        do t->prev = head;
        while (!atomic_compare_exchange_weak_explicit(&s->history, &head, t, memory_order_acq_rel,
                                                      memory_order_acquire));
    }
    atomic_store_explicit(&s->target, t, memory_order_release);
}

/* `t`'s function reached something that can launch it later without a hook. Checked before the store,
 * so a target already marked costs a load, never a write to a shared line. */
static inline void escape(const struct target *t) {
    _Atomic int *e = (_Atomic int *)&t->escaped; /* the one field that changes: t is malloc'd, not const */
    if (!atomic_load_explicit(e, memory_order_relaxed)) atomic_store_explicit(e, 1, memory_order_relaxed);
}

/* Setting i of `st` made on `function`: a CUfunction, or a copy's CUkernel, which takes one the application made
 * on a CUfunction (cuKernelGetFunction's, as a library's kernels have) through its function in the current
 * context, where the application's own took it. */
static void apply_setting(const struct settings *st, int i, void *function) {
    int v = st->value[i], dev = st->device[i];
    int kernel = EGPU_TABLE_FIND(kernel_handles, function, 0) != NULL;
    if (kernel && dev >= 0) {
        if (i == CACHE_CONFIG) CALL_REAL(cuKernelSetCacheConfig, function, v, dev);
        else CALL_REAL(cuKernelSetAttribute, i, v, function, dev);
        return;
    }
    if (kernel && CALL_REAL(cuKernelGetFunction, (CUfunction *)&function, function) != CUDA_SUCCESS) return;
    if (i == CACHE_CONFIG) CALL_REAL(cuFuncSetCacheConfig, function, v);
    else CALL_REAL(cuFuncSetAttribute, function, i, v);
}

EXPORT int egpu_shim_kernel_handle(void *kernel) { return EGPU_TABLE_FIND(kernel_handles, kernel, 1) ? 0 : -1; }

/* Every setting made on slot s's handle, on `function`, its new target's (under settings_lock). */
static void apply_settings(const struct slot *s, void *orig, void *function) {
    const struct settings *st = s->settings;
    for (int i = 0; st && function && function != orig && i <= ATTRIBUTES; i++)
        if (st->made >> i & 1) apply_setting(st, i, function);
}

static int publish(void *orig, void *repl, int launch_id, unsigned int nparams, unsigned int offset) {
    struct slot *s = slot_for(orig, 1);
    if (!s) return -1;
    struct target *t = NULL;
    if (repl && !(t = new_target(repl, launch_id, nparams, offset))) return -1;
    pthread_mutex_lock(&settings_lock);
    set_target(s, t);
    apply_settings(s, orig, repl);
    pthread_mutex_unlock(&settings_lock);
    return 0;
}

EXPORT int egpu_shim_register(void *orig, void *repl) { return publish(orig, repl, 0, 0, 0); }

EXPORT int egpu_shim_register_launch_id(void *orig, void *repl, unsigned int nparams,
                                        unsigned int param_offset) {
    return publish(orig, repl, 1, nparams, param_offset);
}

EXPORT void *egpu_shim_current(void *orig) {
    struct slot *s = slot_for(orig, 0);
    const struct target *t = s ? atomic_load_explicit(&s->target, memory_order_acquire) : NULL;
    return t ? t->function : orig;
}

EXPORT int egpu_shim_escaped(void *orig, void *function) {
    struct slot *s = slot_for(orig, 0);
    const struct target *t = s ? atomic_load_explicit(&s->history, memory_order_acquire) : NULL;
    for (; t; t = t->prev)
        if (t->function == function && atomic_load_explicit(&t->escaped, memory_order_acquire)) return 1;
    return 0;
}

EXPORT unsigned long long egpu_shim_launches(void *orig) {
    struct slot *s = slot_for(orig, 0);
    return s ? atomic_load_explicit(&s->launches, memory_order_relaxed) : 0;
}

EXPORT void egpu_shim_stats(struct egpu_stats *out) {
    out->launches = atomic_load(&g_stats.launches);
    out->redirected = atomic_load(&g_stats.redirected);
    out->records = atomic_load(&g_stats.records);
    out->dropped = atomic_load(&g_stats.dropped);
    out->untracked = atomic_load(&g_stats.untracked);
    out->python_calls = atomic_load(&g_stats.python_calls);
    out->refused = atomic_load(&g_stats.refused);
}

/* ---- the launch record ring (egpu_ring.h): launches push, the runtime's drainer takes ---- */

EGPU_RING(launch_ring, struct egpu_launch_record, 1u << 14)
static _Atomic int records_on;

EXPORT int egpu_shim_records(int on) {
    launch_ring_start();
    return atomic_exchange(&records_on, on != 0);
}

static void ring_push(const struct egpu_launch_record *rec) {
    if (launch_ring_push(rec))
        atomic_fetch_add_explicit(&g_stats.records, 1, memory_order_relaxed);
    else /* full: the drainer is behind; never wait in a launch */
        atomic_fetch_add_explicit(&g_stats.dropped, 1, memory_order_relaxed);
}

EXPORT size_t egpu_shim_drain(struct egpu_launch_record *out, size_t max) {
    return launch_ring_drain(out, max);
}

/* ---- the launch gate (egpu_gate.h): launches wait while a swap or a checkpoint's cut holds it ---- */

static struct egpu_gate g_launch_gate;
static _Atomic long g_captures;   /* stream captures in progress (see "stream capture" below) */
static _Atomic unsigned int g_hold_limit_ms = 5000;

EXPORT unsigned int egpu_shim_hold_limit(unsigned int ms) {
    return ms ? atomic_exchange(&g_hold_limit_ms, ms) : atomic_load(&g_hold_limit_ms);
}

unsigned long long egpu_hold_deadline(void) {
    return egpu_now_ns() + 1000000ull * atomic_load(&g_hold_limit_ms);
}

/* cow.c takes its cut behind the same gate, without draining the context. */
int egpu_launch_gate(int hold, unsigned long long deadline_ns) {
    if (hold) return egpu_gate_close(&g_launch_gate, deadline_ns);
    egpu_gate_open(&g_launch_gate);
    return 0;
}

/* A waiting thread that holds the GIL lets it go: the holder may be waiting for a thread that needs it
 * (a restore in Python on the launching thread, the runtime's control thread). */
void egpu_gate_wait(struct egpu_gate *g) {
    void *gil = egpu_gil_let_go();
    while (atomic_load(&g->hold)) sched_yield();
    egpu_gil_take_back(gil);
}

typedef CUresult (*pfn_ctx_push)(CUcontext);
typedef CUresult (*pfn_ctx_pop)(CUcontext *);
typedef CUresult (*pfn_ctx_sync)(void);
typedef CUresult (*pfn_dtod)(CUdeviceptr, CUdeviceptr, size_t);

/* ---- waiting rings (--trace with --on-full wait): code loads meet an idle context ----
 * A kernel whose ring is full waits for the runtime's reader, a thread of ours that copies on a stream of
 * its own. A module load made while such a kernel ran never returned, and the reader's copies stopped in
 * the driver with it (cupy's warp trace on the H200: the app in cuModuleLoadData, the reader in
 * cuMemcpyDtoHAsync, 2026-12-04g): the driver waits for the context's work there, it seems, and holds the
 * copies up meanwhile; torch's eager step hung so in cuKernelGetFunction (cuBLASLt, under cuDNN), the
 * reader and the mirror waiting on the driver's lock (native stacks, 2 of 4 runs, 2026-12-04g call 4).
 * So while rings wait, whatever may load code first waits for the maps' context to drain itself, letting
 * go of the GIL the reader needs: module and library loads and unloads, and where the driver loads lazily
 * (it may synchronize there itself, CUDA's lazy loading notes), cuModuleGetFunction, cuLibraryGetModule,
 * the first cuKernelGetFunction of a kernel in a context and a launch of a function not loaded yet (before
 * the launch gate: a cut or a swap closing it does not wait on this). A function handle may also come partly
 * loaded (cuModuleEnumerateFunctions), and "CUDA APIs may load the function automatically" when given one
 * (the driver API's notes): its attributes, occupancy, cuFuncLoad, graph instantiation; those wait unless
 * cuFuncIsLoaded says it is loaded, and a lookup that waited loads what it found (cuFuncLoad) inside its
 * wait, so that its later uses need none. Not while a stream is captured, where a synchronize is refused
 * and would end the capture; a capture begun meanwhile waits for the synchronize to end. Another thread's
 * launch between the wait and the load can still meet a waiting kernel. The runtime's own loads call
 * egpu_shim_idle. */
static _Atomic int g_rings_wait, g_lazy, g_idling;
/* Set before g_rings_wait: the maps' context and the driver calls the waits make, looked up once. */
static CUcontext g_rings_ctx;
static CUresult (*g_ctx_current)(CUcontext *);
static CUresult (*g_func_is_loaded)(int *, CUfunction);
static pfn_ctx_push g_ctx_push;
static pfn_ctx_pop g_ctx_pop;
static pfn_ctx_sync g_ctx_sync;

EXPORT void egpu_shim_rings_wait(void *ctx) {
    if (ctx) {
        int mode = 0; /* CU_MODULE_EAGER_LOADING 1, CU_MODULE_LAZY_LOADING 2 */
        CUresult (*loading)(int *) = (CUresult(*)(int *))egpu_shim_real("cuModuleGetLoadingMode");
        atomic_store(&g_lazy, !loading || loading(&mode) != CUDA_SUCCESS || mode != 1);
        g_ctx_current = (CUresult(*)(CUcontext *))egpu_shim_real("cuCtxGetCurrent");
        g_ctx_push = (pfn_ctx_push)egpu_shim_real("cuCtxPushCurrent_v2");
        g_ctx_pop = (pfn_ctx_pop)egpu_shim_real("cuCtxPopCurrent_v2");
        g_ctx_sync = (pfn_ctx_sync)egpu_shim_real("cuCtxSynchronize");
        g_func_is_loaded = (CUresult(*)(int *, CUfunction))egpu_shim_real("cuFuncIsLoaded");
        g_rings_ctx = ctx;
    }
    atomic_store(&g_rings_wait, ctx != NULL && g_ctx_sync != NULL);
}

EXPORT void egpu_shim_idle(void) {
    if (!atomic_load(&g_rings_wait)) return;
    /* counted in before g_captures is read, a capture's begin counted in before g_idling is: one of the
     * two sees the other (sequentially consistent), so no synchronize runs once a capture has begun */
    atomic_fetch_add(&g_idling, 1);
    if (!atomic_load(&g_captures)) {
        void *gil = egpu_gil_let_go();
        /* a maps' context that cannot be made current: the caller's is drained instead */
        int pushed = g_ctx_push && g_ctx_pop && g_ctx_push(g_rings_ctx) == CUDA_SUCCESS;
        CUcontext popped;
        g_ctx_sync();
        if (pushed) g_ctx_pop(&popped);
        egpu_gil_take_back(gil);
    }
    atomic_fetch_sub(&g_idling, 1);
}

/* A capture's begin, counted in: the synchronizes begun before it end first (letting go of the GIL, which
 * the reader they wait for needs). */
static void captures_wait_for_idle(void) {
    if (!atomic_load(&g_idling)) return;
    void *gil = egpu_gil_let_go();
    while (atomic_load(&g_idling)) usleep(100);
    egpu_gil_take_back(gil);
}

/* Where the driver loads code only under lazy loading. */
static inline int lazy_waits(void) {
    return atomic_load(&g_rings_wait) && atomic_load(&g_lazy); /* acquire: the pointers set before it */
}

/* Whether f's code is loaded, as far as the driver says (a driver before 12.4 cannot: no). */
static int function_loaded(CUfunction f) {
    int state = 0;
    return g_func_is_loaded && g_func_is_loaded(&state, f) == CUDA_SUCCESS && state == 1;
}

/* A call that may load f's code waits first, unless it is loaded. */
static inline void idle_unless_loaded(CUfunction f) {
    if (__builtin_expect(!lazy_waits(), 1)) return;
    if (!function_loaded(f)) egpu_shim_idle();
}

/* The swap's work under the hold, on a thread of its own so that the swap can stop waiting for it: drain
 * the context, copy, drain the copies. No Python, so a held launch that keeps the GIL cannot stop it. A
 * drain past the deadline (a kernel that runs long or never ends) is abandoned: the swap returns and the
 * gates open, the thread stays in cuCtxSynchronize until the kernel ends and then copies nothing. Once
 * the drain is done the copies are the swap's own bounded work, waited for to the end. */
enum { DRAINING, COPYING, DRAINED, ABANDONED };
struct drain {
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int state, refs;
    CUresult result;
    void *ctx;
    size_t ncopies;
    struct egpu_copy copies[];
};

static void drain_put(struct drain *d) {
    pthread_mutex_lock(&d->lock);
    int last = --d->refs == 0;
    pthread_mutex_unlock(&d->lock);
    if (last) {
        pthread_cond_destroy(&d->changed);
        pthread_mutex_destroy(&d->lock);
        free(d);
    }
}

static int drain_state(struct drain *d, int from, int to, CUresult result) {
    pthread_mutex_lock(&d->lock);
    int moved = d->state == from;
    if (moved) {
        d->state = to;
        d->result = result;
        pthread_cond_broadcast(&d->changed);
    }
    pthread_mutex_unlock(&d->lock);
    return moved;
}

static void *drain_main(void *arg) {
    struct drain *d = arg;
    pfn_ctx_push push = (pfn_ctx_push)egpu_shim_real("cuCtxPushCurrent_v2");
    pfn_ctx_pop pop = (pfn_ctx_pop)egpu_shim_real("cuCtxPopCurrent_v2");
    pfn_ctx_sync sync = (pfn_ctx_sync)egpu_shim_real("cuCtxSynchronize");
    pfn_dtod dtod = (pfn_dtod)egpu_shim_real("cuMemcpyDtoD_v2");
    CUresult r = !push || !pop || !sync || (d->ncopies && !dtod) ? CUDA_ERROR_NOT_FOUND : push(d->ctx);
    if (r == CUDA_SUCCESS) {
        r = sync();
        if (drain_state(d, DRAINING, COPYING, r)) {
            for (size_t i = 0; i < d->ncopies && r == CUDA_SUCCESS; i++)
                if (d->copies[i].size) r = dtod(d->copies[i].dst, d->copies[i].src, d->copies[i].size);
            if (r == CUDA_SUCCESS && d->ncopies) r = sync();
        }
        CUcontext popped;
        CUresult r2 = pop(&popped);
        if (r == CUDA_SUCCESS) r = r2;
    }
    drain_state(d, DRAINING, DRAINED, r);
    drain_state(d, COPYING, DRAINED, r);
    drain_put(d);
    return NULL;
}

/* CUDA_SUCCESS, the failing CUresult, -1 (no memory or thread), or EGPU_SWAP_TIMEOUT. */
static int swap_state(void *ctx, const struct egpu_copy *copies, size_t ncopies, unsigned long long deadline_ns) {
    struct drain *d = malloc(sizeof *d + ncopies * sizeof *copies);
    if (!d) return -1;
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_mutex_init(&d->lock, NULL);
    pthread_cond_init(&d->changed, &attr);
    pthread_condattr_destroy(&attr);
    d->state = DRAINING, d->refs = 2, d->result = CUDA_SUCCESS, d->ctx = ctx, d->ncopies = ncopies;
    if (ncopies) memcpy(d->copies, copies, ncopies * sizeof *copies);
    pthread_t t;
    if (pthread_create(&t, NULL, drain_main, d)) {
        d->refs = 1;
        drain_put(d);
        return -1;
    }
    pthread_detach(t);
    struct timespec until = {(time_t)(deadline_ns / 1000000000ull), (long)(deadline_ns % 1000000000ull)};
    pthread_mutex_lock(&d->lock);
    while (d->state == COPYING || (d->state == DRAINING && egpu_now_ns() < deadline_ns))
        d->state == COPYING ? pthread_cond_wait(&d->changed, &d->lock)
                            : pthread_cond_timedwait(&d->changed, &d->lock, &until);
    if (d->state == DRAINING) d->state = ABANDONED;
    int r = d->state == ABANDONED ? EGPU_SWAP_TIMEOUT : d->result;
    pthread_mutex_unlock(&d->lock);
    drain_put(d);
    return r;
}

/* ---- moved variables: an immutable table, sorted by orig, replaced whole (old ones are never freed:
 * a copy hook may be reading one) ---- */

struct moved_table {
    size_t n;
    struct egpu_moved rows[];
};
static _Atomic(const struct moved_table *) g_moved;

static int by_orig(const void *a, const void *b) {
    unsigned long long x = ((const struct egpu_moved *)a)->orig, y = ((const struct egpu_moved *)b)->orig;
    return (x > y) - (x < y);
}

static struct moved_table *moved_table(const struct egpu_moved *rows, size_t n) {
    struct moved_table *t = malloc(sizeof *t + n * sizeof *rows);
    if (!t) return NULL;
    t->n = n;
    if (n) memcpy(t->rows, rows, n * sizeof *rows);
    qsort(t->rows, n, sizeof *rows, by_orig);
    return t;
}

unsigned long long egpu_moved_address(unsigned long long p, unsigned long long size) {
    const struct moved_table *t = atomic_load_explicit(&g_moved, memory_order_acquire);
    if (__builtin_expect(!t || !t->n, 1)) return p;
    size_t lo = 0, hi = t->n; /* the last row with orig <= p */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (t->rows[mid].orig <= p) lo = mid + 1;
        else hi = mid;
    }
    if (!lo) return p;
    const struct egpu_moved *r = &t->rows[lo - 1];
    /* wholly inside the variable, or not moved at all (a copy across several stays where it is) */
    return p - r->orig < r->size && size <= r->size - (p - r->orig) ? r->moved + (p - r->orig) : p;
}

EXPORT int egpu_shim_move(const struct egpu_moved *moved, size_t nmoved) {
    struct moved_table *t = moved_table(moved, nmoved);
    if (!t) return -1;
    atomic_store_explicit(&g_moved, t, memory_order_release);
    return 0;
}

static pthread_mutex_t publish_lock = PTHREAD_MUTEX_INITIALIZER;

EXPORT int egpu_shim_swap(void *ctx, const struct egpu_copy *copies, size_t ncopies,
                          const struct egpu_flip *flips, size_t nflips, const struct egpu_moved *moved,
                          size_t nmoved, unsigned long long *launches) {
    /* Everything that can fail is done before the hold, so a failed swap publishes nothing. */
    struct slot **slots = calloc(nflips + 1, sizeof *slots);
    struct target **targets = calloc(nflips + 1, sizeof *targets);
    struct moved_table *table = moved ? moved_table(moved, nmoved) : NULL;
    int result = -1;
    if (!slots || !targets || (moved && !table)) goto out;
    for (size_t i = 0; i < nflips; i++) {
        if (!(slots[i] = slot_for(flips[i].orig, 1))) goto out;
        if (flips[i].repl && !(targets[i] = new_target(flips[i].repl, flips[i].launch_id,
                                                       flips[i].nparams, flips[i].param_offset)))
            goto out;
    }
    unsigned long long deadline = egpu_hold_deadline();
    if (egpu_launch_gate(1, deadline)) {
        result = EGPU_SWAP_TIMEOUT;
        goto out;
    }
    if (egpu_copy_gate(1, deadline)) {
        egpu_launch_gate(0, 0);
        result = EGPU_SWAP_TIMEOUT;
        goto out;
    }
    /* Draining the context while a stream captures would fail, and fail the application's capture too
     * (the driver refuses cuCtxSynchronize then, and invalidates the capture): refuse, touching nothing. */
    result = atomic_load(&g_captures) ? EGPU_SWAP_CAPTURING : swap_state(ctx, copies, ncopies, deadline);
    /* The SASS back end's modules change with the PTX back end's, behind the same hold. */
    if (result == CUDA_SUCCESS && egpu_sass_flip()) result = EGPU_SWAP_SASS;
    if (result == CUDA_SUCCESS) {
        /* Every flip serves the probes' programs in the kernels, those launches counted included (a live
         * change, or the end of the counting): launches held here were counted, the next ones run them. */
        egpu_shim_eval(0);
        pthread_mutex_lock(&publish_lock); /* a fork copies all of the flip or none of it */
        for (size_t i = 0; i < nflips; i++) { /* old targets are never freed: see set_target() */
            set_target(slots[i], targets[i]);
            targets[i] = NULL;
        }
        if (table) {
            atomic_store_explicit(&g_moved, table, memory_order_release);
            table = NULL;
        }
        pthread_mutex_unlock(&publish_lock);
        /* Before the gate opens: no launch reaches a target without them. In the maps' context, the copies'. */
        pfn_ctx_push push = (pfn_ctx_push)egpu_shim_real("cuCtxPushCurrent_v2");
        pfn_ctx_pop pop = (pfn_ctx_pop)egpu_shim_real("cuCtxPopCurrent_v2");
        CUcontext popped;
        int pushed = push && pop && push(ctx) == CUDA_SUCCESS;
        pthread_mutex_lock(&settings_lock);
        for (size_t i = 0; i < nflips; i++) apply_settings(slots[i], flips[i].orig, flips[i].repl);
        pthread_mutex_unlock(&settings_lock);
        if (pushed) pop(&popped);
        if (launches) *launches = atomic_load(&g_stats.launches);
    }
    egpu_copy_gate(0, 0);
    egpu_launch_gate(0, 0);
out:
    free(table);
    for (size_t i = 0; targets && i < nflips; i++) free(targets[i]);
    free(slots);
    free(targets);
    return result;
}

/* ---- launch-time evaluation (translate/launch_eval.py): programs whose every run adds the same amounts
 * to the same lanes are not run by the kernel's threads; each launch adds those amounts times the threads,
 * warps or blocks it runs, here, after the driver took it. While the SASS back end's committed generation
 * counts so, or the PTX back end instruments modules without them (egpu_shim_eval_begin), a handle's first
 * launch asks the runtime what it adds (egpu_py_eval_handle), before the gate, since the answer may be a flip.
 * A launch counts inside the gate, so a flip that ends the counting (it puts those programs into the kernels)
 * falls wholly before or after each launch. Only launches in the maps' context count, as only they reach the
 * maps. ---- */

struct evals {
    size_t n;
    struct egpu_eval_add adds[];
};
static const struct evals no_evals;
static _Atomic int g_eval_on, g_eval_device;
static _Atomic int g_eval_ended; /* turned off (a flip, a generation that does not count): never on again */
static _Atomic int g_graphs; /* a stream capture began or a graph node was made: counting never starts again */

/* Refused once a graph may exist, which replays what it holds unseen, once turned off (the flip that ended
 * it put those programs into the kernels loaded while it counted, and kernels loaded later are instrumented
 * with them), and once a module launches from the device. Each side stores before it looks at the other's
 * flag (eval_end), so a graph made meanwhile either sees counting on and ends it, or is seen. */
void egpu_shim_eval(int on) {
    if (!on) {
        atomic_store(&g_eval_ended, 1);
        atomic_store(&g_eval_on, 0);
        return;
    }
    if (atomic_load(&g_eval_ended) || atomic_load(&g_eval_device)) return;
    if (!g_ctx_current) g_ctx_current = (CUresult(*)(CUcontext *))egpu_shim_real("cuCtxGetCurrent");
    atomic_store(&g_eval_on, 1);
    if (atomic_load(&g_graphs)) atomic_store(&g_eval_on, 0);
}

EXPORT int egpu_shim_eval_begin(void) {
    egpu_shim_eval(1);
    return atomic_load(&g_eval_on);
}

EXPORT int egpu_shim_eval_on(void) { return atomic_load(&g_eval_on); }

EXPORT void egpu_shim_eval_device_launches(void) { atomic_store(&g_eval_device, 1); }

/* The previous answer is never freed: a launch on another thread may be reading it (answers are set once
 * per handle and unload, a few thousand in a PyTorch job). */
EXPORT int egpu_shim_eval_set(void *handle, const struct egpu_eval_add *adds, size_t n) {
    struct slot *s = slot_for(handle, 1);
    struct evals *e = NULL;
    if (!s || (n && !(e = malloc(sizeof *e + n * sizeof *adds)))) return -1;
    if (e) {
        e->n = n;
        memcpy(e->adds, adds, n * sizeof *adds);
    }
    atomic_store_explicit(&s->evals, e ? e : &no_evals, memory_order_release);
    return 0;
}

EXPORT void egpu_shim_eval_forget(void) {
    for (size_t i = 0; i < TABLE_SIZE; i++) atomic_store_explicit(&table[i].evals, NULL, memory_order_release);
}

/* Before a stream capture begins or a graph node is made: graphs replay launches no hook sees, so the
 * counting ends first (the runtime's flip patches the programs it counted). */
static inline void eval_end(const char *why) {
    if (atomic_load(&g_eval_on) && !passthrough() && egpu_python_up())
        egpu_py_eval_end(why);
}

/* A capture or graph node is about to be made. */
static inline void graph_made(const char *why) {
    if (!passthrough()) atomic_store(&g_graphs, 1);
    eval_end(why);
}

/* Before the gate: the handle's answer, asked for at its first launch while counting is on. */
static inline void eval_before_launch(void *f) {
    if (__builtin_expect(!atomic_load_explicit(&g_eval_on, memory_order_relaxed), 1)) return;
    if (atomic_load_explicit(&g_eval_device, memory_order_relaxed) && atomic_exchange(&g_eval_device, 0))
        eval_end("a module whose kernels launch kernels from the device");
    struct slot *s = slot_for(f, 1);
    if (!s || atomic_load_explicit(&s->evals, memory_order_acquire)) return;
    if (!egpu_python_up() || egpu_py_eval_handle(f)) /* no answer (hooks.py said why): its launches add nothing */
        atomic_store_explicit(&s->evals, &no_evals, memory_order_release);
}

/* Inside the gate: what this launch adds, if counting is still on. */
static inline const struct evals *eval_for(const struct slot *s) {
    if (__builtin_expect(!s || !atomic_load_explicit(&g_eval_on, memory_order_relaxed), 1)) return NULL;
    const struct evals *e = atomic_load_explicit(&s->evals, memory_order_acquire);
    if (!e || !e->n) return NULL;
    void *maps = egpu_sass_maps_ctx();
    CUcontext current = NULL;
    if (maps && g_ctx_current && (g_ctx_current(&current) != CUDA_SUCCESS || current != maps)) return NULL;
    return e;
}

/* A launch the driver took: each lane gets its delta times the threads, warps or blocks launched. */
static void eval_count(const struct evals *e, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                       unsigned int by, unsigned int bz) {
    unsigned long long blocks = (unsigned long long)gx * gy * gz, threads = (unsigned long long)bx * by * bz;
    const unsigned long long runs[3] = {blocks * threads, blocks * ((threads + 31) / 32), blocks};
    for (size_t i = 0; i < e->n; i++) {
        const struct egpu_eval_add *a = &e->adds[i];
        unsigned long long add = a->delta * runs[a->scope < 3 ? a->scope : 0];
        if (a->width == 8) atomic_fetch_add_explicit((_Atomic unsigned long long *)a->lane, add, memory_order_relaxed);
        else atomic_fetch_add_explicit((_Atomic unsigned int *)a->lane, (unsigned int)add, memory_order_relaxed);
    }
}

/* ---- stream capture: a launch into a capturing stream is not run but baked into the captured
 * graph, whose replays never pass a launch hook; so while any capture is in progress, every launch
 * that goes to a target marks it escaped. The count is process-wide (which stream a launch joins to a
 * capture is the driver's business: events, relaxed mode, other threads), so launches into streams
 * that do not capture are marked too while one does: a copy kept longer than needed, never one
 * unloaded too early. Counted whatever the thread's pass-through: it is the driver's state. A begin
 * counts before it reaches the driver (no launch into its capture can come first) and is taken back if
 * the driver refuses it; an end counts off after the driver ended the capture: on success, or when
 * the capture had been invalidated (it ends then too, with no graph). Any other error leaves it
 * counted (wrong thread: the capture goes on). Never below zero, so an end whose begin went past the
 * shim (egpu_shim_real, cuGetExportTable) cannot hide the captures that come after it; one that ends
 * while a capture the shim saw is in progress still counts that one off early (no program is known
 * to begin captures that way). ---- */


int egpu_shim_capturing(void) { return atomic_load(&g_captures) != 0; }

static void capture_ended(void) {
    long n = atomic_load(&g_captures);
    while (n > 0 && !atomic_compare_exchange_weak(&g_captures, &n, n - 1)) {}
}

/* A begin passes the launch gate, so that none starts while a flip holds it (egpu_shim_swap looks at
 * g_captures under the hold). */
#define BEGIN_CAPTURE(sym, params, ...) \
    EXPORT CUresult sym params { \
        graph_made(#sym); \
        egpu_gate_enter(&g_launch_gate); \
        atomic_fetch_add(&g_captures, 1); \
        egpu_gate_exit(&g_launch_gate); \
        captures_wait_for_idle(); \
        CUresult r = CALL_REAL(sym, __VA_ARGS__); \
        if (r != CUDA_SUCCESS) capture_ended(); \
        return r; \
    }
BEGIN_CAPTURE(cuStreamBeginCapture, (CUstream hStream), hStream)
BEGIN_CAPTURE(cuStreamBeginCapture_ptsz, (CUstream hStream), hStream)
BEGIN_CAPTURE(cuStreamBeginCapture_v2, (CUstream hStream, int mode), hStream, mode)
BEGIN_CAPTURE(cuStreamBeginCapture_v2_ptsz, (CUstream hStream, int mode), hStream, mode)
BEGIN_CAPTURE(cuStreamBeginCaptureToGraph, (CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies,
              const CUgraphEdgeData *dependencyData, size_t numDependencies, int mode),
              hStream, hGraph, dependencies, dependencyData, numDependencies, mode)
BEGIN_CAPTURE(cuStreamBeginCaptureToGraph_ptsz, (CUstream hStream, CUgraph hGraph,
              const CUgraphNode *dependencies, const CUgraphEdgeData *dependencyData,
              size_t numDependencies, int mode),
              hStream, hGraph, dependencies, dependencyData, numDependencies, mode)

#define END_CAPTURE(sym) \
    EXPORT CUresult sym(CUstream hStream, CUgraph *phGraph) { \
        CUresult r = CALL_REAL(sym, hStream, phGraph); \
        if (r == CUDA_SUCCESS || r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) capture_ended(); \
        return r; \
    }
END_CAPTURE(cuStreamEndCapture)
END_CAPTURE(cuStreamEndCapture_ptsz)

/* ---- launches ---- */

struct launch {
    const struct target *target;
    unsigned long long id;
    const struct evals *evals; /* what it adds once the driver took it (launch-time evaluation) */
};

/* The seen table (below), where "this CUkernel is loaded in this context" is kept too (owner: the
 * context). */
static int seen_before(int api, void *owner, void *handle, unsigned long *generation);
static void seen_enter(int api, void *owner, void *handle, unsigned long generation);
#define KERNEL_LOADED (-EGPU_API_KERNEL_GET_FUNCTION)

/* Whether `handle` was seen loaded in the current context; that context, and the unload generation to
 * enter it under (seen_enter). */
static int loaded_here(void *handle, CUcontext *ctx, unsigned long *generation) {
    *ctx = NULL;
    if (g_ctx_current) g_ctx_current(ctx);
    return seen_before(KERNEL_LOADED, *ctx, handle, generation);
}

/* A launch may load its kernel (lazy loading): the wait comes before the gate, unless the driver says the
 * function to be launched (the instrumented one a launch is sent to, if any) is loaded. Where it cannot
 * say (a CUkernel's handle, loaded per context; a driver before 12.4) the first launch of the handle in
 * each context waits. Two threads that both find it unloaded both wait, which is harmless. */
static inline void idle_before_launch(void *f) {
    if (__builtin_expect(!lazy_waits(), 1)) return;
    struct slot *s = slot_for(f, 1);
    const struct target *t = s ? atomic_load_explicit(&s->target, memory_order_acquire) : NULL;
    void *launched = t ? t->function : f;
    int state = 0;
    if (g_func_is_loaded && g_func_is_loaded(&state, launched) == CUDA_SUCCESS) {
        if (state != 1) egpu_shim_idle();
        return;
    }
    CUcontext ctx;
    unsigned long generation;
    if (loaded_here(launched, &ctx, &generation)) return;
    egpu_shim_idle();
    seen_enter(KERNEL_LOADED, ctx, launched, generation);
}

/* Count the launch, record it if asked, and find what to run. The launch id is the process-wide
 * launch counter. */
static inline struct launch launch_begin(void *f, int api, unsigned int gx, unsigned int gy,
                                         unsigned int gz, unsigned int bx, unsigned int by,
                                         unsigned int bz, unsigned int shmem, void *stream) {
    struct launch l = {NULL, atomic_fetch_add_explicit(&g_stats.launches, 1, memory_order_relaxed) + 1, NULL};
    egpu_sass_launch_id = l.id; /* for the SASS back end's launch callback inside the real call */
    struct slot *s = slot_for(f, 1);
    l.evals = eval_for(s);
    if (s) {
        atomic_fetch_add_explicit(&s->launches, 1, memory_order_relaxed);
        l.target = atomic_load_explicit(&s->target, memory_order_acquire);
        if (l.target) {
            atomic_fetch_add_explicit(&g_stats.redirected, 1, memory_order_relaxed);
            if (__builtin_expect(atomic_load_explicit(&g_captures, memory_order_relaxed) != 0, 0))
                escape(l.target); /* inside the gate: a swap's check after its drain sees it */
        }
    } else {
        atomic_fetch_add_explicit(&g_stats.untracked, 1, memory_order_relaxed);
    }
    if (atomic_load_explicit(&records_on, memory_order_relaxed)) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        struct egpu_launch_record rec = {l.id, (unsigned long long)ts.tv_sec * 1000000000ull + ts.tv_nsec,
                                         f, l.target ? l.target->function : f, stream,
                                         {gx, gy, gz}, {bx, by, bz}, shmem, api};
        ring_push(&rec);
    }
    return l;
}

#define INLINE_PARAMS 64
#define INLINE_BUFFER 4096

/* Parameters with the launch id appended (rewrite.py's launch contract), kept alive for one call. */
struct args {
    void **params, **extra;
    unsigned long long id;
    size_t size;
    void *param_store[INLINE_PARAMS + 1];
    void *extra_store[5];
    void *heap;
    _Alignas(8) char buf_store[INLINE_BUFFER];
};

/* 0, or -1 when there is no memory for the longer list: then nothing may be launched, since the target
 * expects the id and the app's own handle may be that very target (registered onto itself). */
static int args_init(struct args *a, const struct target *t, unsigned long long id, void **params,
                     void **extra) {
    a->params = params;
    a->extra = extra;
    a->id = id;
    a->heap = NULL;
    if (!t || !t->launch_id) return 0;
    void *size_p = NULL;
    char *buf_in = NULL;
    for (void **e = extra; e && *e != CU_LAUNCH_PARAM_END; e += 2) {
        if (e[0] == CU_LAUNCH_PARAM_BUFFER_POINTER) buf_in = e[1];
        else if (e[0] == CU_LAUNCH_PARAM_BUFFER_SIZE) size_p = e[1];
    }
    if (buf_in && size_p) { /* extra form: copy the buffer, the id at its offset */
        size_t old = *(size_t *)size_p, need = (size_t)t->param_offset + sizeof a->id;
        a->size = need > old ? need : old;
        char *buf = a->size <= INLINE_BUFFER ? a->buf_store : (a->heap = malloc(a->size));
        if (!buf) return -1;
        memcpy(buf, buf_in, old);
        memset(buf + old, 0, a->size - old);
        memcpy(buf + t->param_offset, &a->id, sizeof a->id);
        void **x = a->extra_store;
        x[0] = CU_LAUNCH_PARAM_BUFFER_POINTER; x[1] = buf;
        x[2] = CU_LAUNCH_PARAM_BUFFER_SIZE; x[3] = &a->size;
        x[4] = CU_LAUNCH_PARAM_END;
        a->extra = x;
        return 0;
    }
    if (!params && t->nparams) return 0; /* no parameters given: the driver's to refuse, as without the shim */
    void **p = t->nparams < INLINE_PARAMS ? a->param_store
                                          : (a->heap = malloc(((size_t)t->nparams + 1) * sizeof(void *)));
    if (!p) return -1;
    if (t->nparams) memcpy(p, params, t->nparams * sizeof(void *));
    p[t->nparams] = &a->id;
    a->params = p;
    return 0;
}

static inline void args_done(struct args *a) { free(a->heap); }

/* A launch that could not get its launch id for want of host memory: the driver's own answer then. */
static CUresult no_memory(void) {
    atomic_fetch_add_explicit(&g_stats.refused, 1, memory_order_relaxed);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

#define DIMS gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ
#define GRID DIMS, sharedMemBytes, hStream

#define LAUNCH_KERNEL(sym) \
    EXPORT CUresult sym(EGPU_LAUNCH_ARGS(CUfunction), void **kernelParams, void **extra) { \
        if (passthrough()) return CALL_REAL(sym, f, GRID, kernelParams, extra); \
        idle_before_launch(f); \
        eval_before_launch(f); \
        egpu_gate_enter(&g_launch_gate); \
        struct launch l = launch_begin(f, EGPU_API_LAUNCH_KERNEL, GRID); \
        EGPU_COW_LAUNCH(f, hStream, variants[V_##sym].ptsz, kernelParams, extra); \
        CUresult r; \
        if (__builtin_expect(l.target == NULL, 1)) { \
            r = CALL_REAL(sym, f, GRID, kernelParams, extra); \
        } else { \
            struct args a; \
            r = args_init(&a, l.target, l.id, kernelParams, extra) ? no_memory() \
                : CALL_REAL(sym, l.target->function, GRID, a.params, a.extra); \
            args_done(&a); \
        } \
        if (l.evals && r == CUDA_SUCCESS) eval_count(l.evals, DIMS); \
        egpu_gate_exit(&g_launch_gate); \
        return r; \
    }
LAUNCH_KERNEL(cuLaunchKernel)
LAUNCH_KERNEL(cuLaunchKernel_ptsz)

#define LAUNCH_COOPERATIVE(sym) \
    EXPORT CUresult sym(EGPU_LAUNCH_ARGS(CUfunction), void **kernelParams) { \
        if (passthrough()) return CALL_REAL(sym, f, GRID, kernelParams); \
        idle_before_launch(f); \
        eval_before_launch(f); \
        egpu_gate_enter(&g_launch_gate); \
        struct launch l = launch_begin(f, EGPU_API_LAUNCH_COOPERATIVE_KERNEL, GRID); \
        EGPU_COW_LAUNCH(f, hStream, variants[V_##sym].ptsz, kernelParams, NULL); \
        CUresult r; \
        if (__builtin_expect(l.target == NULL, 1)) { \
            r = CALL_REAL(sym, f, GRID, kernelParams); \
        } else { \
            struct args a; \
            r = args_init(&a, l.target, l.id, kernelParams, NULL) ? no_memory() \
                : CALL_REAL(sym, l.target->function, GRID, a.params); \
            args_done(&a); \
        } \
        if (l.evals && r == CUDA_SUCCESS) eval_count(l.evals, DIMS); \
        egpu_gate_exit(&g_launch_gate); \
        return r; \
    }
LAUNCH_COOPERATIVE(cuLaunchCooperativeKernel)
LAUNCH_COOPERATIVE(cuLaunchCooperativeKernel_ptsz)

#define CONFIG_DIMS(c) (c)->gridDimX, (c)->gridDimY, (c)->gridDimZ, (c)->blockDimX, (c)->blockDimY, (c)->blockDimZ
#define CONFIG(c) CONFIG_DIMS(c), (c)->sharedMemBytes, (c)->hStream
#define LAUNCH_EX(sym) \
    EXPORT CUresult sym(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) { \
        if (passthrough() || !config) return CALL_REAL(sym, config, f, kernelParams, extra); \
        idle_before_launch(f); \
        eval_before_launch(f); \
        egpu_gate_enter(&g_launch_gate); \
        struct launch l = launch_begin(f, EGPU_API_LAUNCH_KERNEL_EX, CONFIG(config)); \
        EGPU_COW_LAUNCH(f, config->hStream, variants[V_##sym].ptsz, kernelParams, extra); \
        CUresult r; \
        if (__builtin_expect(l.target == NULL, 1)) { \
            r = CALL_REAL(sym, config, f, kernelParams, extra); \
        } else { \
            struct args a; \
            r = args_init(&a, l.target, l.id, kernelParams, extra) ? no_memory() \
                : CALL_REAL(sym, config, l.target->function, a.params, a.extra); \
            args_done(&a); \
        } \
        if (l.evals && r == CUDA_SUCCESS) eval_count(l.evals, CONFIG_DIMS(config)); \
        egpu_gate_exit(&g_launch_gate); \
        return r; \
    }
LAUNCH_EX(cuLaunchKernelEx)
LAUNCH_EX(cuLaunchKernelEx_ptsz)

/* ---- graph kernel nodes: the node keeps the function it was given, so retarget it there ----
 * A node's parameters are copied by the driver when set, so its launch id is fixed per node (one
 * number drawn from the launch counter), not per replay. Launches during stream capture go through
 * the launch hooks above and are retargeted there. Either way the graph may launch the target's
 * function at any later time: it escaped. */

/* The target a node gets, marked escaped. Looked up and marked inside the launch gate: a swap that
 * moves the slot on either came first (the node gets the new target) or waits for the mark, so the
 * runtime's check of the old target right after the swap sees it. */
static const struct target *node_target(void *func, void *kern) {
    egpu_gate_enter(&g_launch_gate);
    struct slot *s = slot_for(func ? func : kern, 0);
    const struct target *t = s ? atomic_load_explicit(&s->target, memory_order_acquire) : NULL;
    if (t) escape(t);
    egpu_gate_exit(&g_launch_gate);
    return t;
}

/* Point `p` (kernel node parameters of type T, or NULL) at a retargeted copy when its function is
 * registered; t_ says whether it did. */
#define NODE_RETARGET(T, p, kern_field) \
    T q_; struct args a_; const struct target *t_ = NULL; int oom_ = 0; \
    if (!passthrough() && p && (t_ = node_target(p->func, kern_field))) { \
        q_ = *p; \
        oom_ = args_init(&a_, t_, atomic_fetch_add(&g_stats.launches, 1) + 1, p->kernelParams, p->extra); \
        q_.func = t_->function; q_.kernelParams = a_.params; q_.extra = a_.extra; \
        p = &q_; \
    }
/* One per parameter struct. */
#define RETARGET_V1(p) NODE_RETARGET(CUDA_KERNEL_NODE_PARAMS_v1, p, NULL)
#define RETARGET_V2(p) NODE_RETARGET(CUDA_KERNEL_NODE_PARAMS_v2, p, p->kern) \
    if (t_) q_.kern = NULL; /* func set: kern and ctx are ignored */
/* A generic node (CUgraphNodeParams) is retargeted only when its type says kernel. Any other type
 * reaches the driver as the app's own struct, so out parameters (alloc.dptr) come back to the app. */
#define RETARGET_NODE(p) \
    const CUDA_KERNEL_NODE_PARAMS_v3 *k_ = p && p->type == CU_GRAPH_NODE_TYPE_KERNEL ? &p->kernel : NULL; \
    RETARGET_V2(k_) \
    CUgraphNodeParams n_; \
    if (t_) { n_ = *p; n_.kernel = q_; p = &n_; }

#define NODE_HOOK(sym, retarget, params, ...) \
    EXPORT CUresult sym params { \
        graph_made(#sym); \
        retarget(nodeParams) \
        if (oom_) return no_memory(); \
        CUresult r = CALL_REAL(sym, __VA_ARGS__); \
        if (t_) args_done(&a_); \
        return r; \
    }
NODE_HOOK(cuGraphAddKernelNode, RETARGET_V1, (CUgraphNode *phGraphNode, CUgraph hGraph,
          const CUgraphNode *dependencies, size_t numDependencies,
          const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams),
          phGraphNode, hGraph, dependencies, numDependencies, nodeParams)
NODE_HOOK(cuGraphAddKernelNode_v2, RETARGET_V2, (CUgraphNode *phGraphNode, CUgraph hGraph,
          const CUgraphNode *dependencies, size_t numDependencies,
          const CUDA_KERNEL_NODE_PARAMS_v2 *nodeParams),
          phGraphNode, hGraph, dependencies, numDependencies, nodeParams)
NODE_HOOK(cuGraphKernelNodeSetParams, RETARGET_V1,
          (CUgraphNode hNode, const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams), hNode, nodeParams)
NODE_HOOK(cuGraphKernelNodeSetParams_v2, RETARGET_V2,
          (CUgraphNode hNode, const CUDA_KERNEL_NODE_PARAMS_v2 *nodeParams), hNode, nodeParams)
NODE_HOOK(cuGraphExecKernelNodeSetParams, RETARGET_V1,
          (CUgraphExec hGraphExec, CUgraphNode hNode, const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams),
          hGraphExec, hNode, nodeParams)
NODE_HOOK(cuGraphExecKernelNodeSetParams_v2, RETARGET_V2,
          (CUgraphExec hGraphExec, CUgraphNode hNode, const CUDA_KERNEL_NODE_PARAMS_v2 *nodeParams),
          hGraphExec, hNode, nodeParams)
NODE_HOOK(cuGraphAddNode, RETARGET_NODE, (CUgraphNode *phGraphNode, CUgraph hGraph,
          const CUgraphNode *dependencies, size_t numDependencies, CUgraphNodeParams *nodeParams),
          phGraphNode, hGraph, dependencies, numDependencies, nodeParams)
NODE_HOOK(cuGraphAddNode_v2, RETARGET_NODE, (CUgraphNode *phGraphNode, CUgraph hGraph,
          const CUgraphNode *dependencies, const CUgraphEdgeData *dependencyData, size_t numDependencies,
          CUgraphNodeParams *nodeParams),
          phGraphNode, hGraph, dependencies, dependencyData, numDependencies, nodeParams)
NODE_HOOK(cuGraphNodeSetParams, RETARGET_NODE, (CUgraphNode hNode, CUgraphNodeParams *nodeParams),
          hNode, nodeParams)
NODE_HOOK(cuGraphExecNodeSetParams, RETARGET_NODE,
          (CUgraphExec hGraphExec, CUgraphNode hNode, CUgraphNodeParams *nodeParams),
          hGraphExec, hNode, nodeParams)

/* A graph replay launches its kernel nodes past every launch hook: it passes the gate, so that none is
 * enqueued while a flip holds it (the flip drains what was enqueued before, then re-patches SASS modules:
 * a replay in between would run some modules unpatched, or old and new patches mixed). */
#define GRAPH_LAUNCH(sym) \
    EXPORT CUresult sym(CUgraphExec hGraphExec, CUstream hStream) { \
        if (passthrough()) return CALL_REAL(sym, hGraphExec, hStream); \
        egpu_gate_enter(&g_launch_gate); \
        CUresult r = CALL_REAL(sym, hGraphExec, hStream); \
        egpu_gate_exit(&g_launch_gate); \
        return r; \
    }
GRAPH_LAUNCH(cuGraphLaunch)
GRAPH_LAUNCH(cuGraphLaunch_ptsz)

/* ---- module loads and lookups: into Python, outside any driver call, while Python is up ---- */

static _Atomic int g_python_gone;

EXPORT void egpu_shim_python_gone(void) { atomic_store(&g_python_gone, 1); }

int egpu_python_up(void) {
    return !atomic_load_explicit(&g_python_gone, memory_order_acquire) && egpu_python_matches();
}

int egpu_python_attached(void) { return atomic_load(&g_stats.python_calls) && egpu_python_up(); }

void egpu_python_start(void) {
    if (!egpu_python_up()) return;
    atomic_fetch_add_explicit(&g_stats.python_calls, 1, memory_order_relaxed);
    tls_in_python++;
    egpu_py_start();
    tls_in_python--;
}

/* The pid whose runtime dumps at exec: only the process that started it (a child forked after holds a copy of
 * its maps, a vfork child its very memory; neither may dump them, nor call Python). */
static _Atomic int g_exec_owner;

EXPORT void egpu_shim_exec_owner(int pid) {
    atomic_store(&g_exec_owner, pid);
}

int egpu_python_exec(int phase) {
    if (getpid() != atomic_load(&g_exec_owner) || passthrough() || !egpu_python_up()) return 0;
    tls_in_python++;
    egpu_py_exec(phase);
    tls_in_python--;
    return 1;
}

void egpu_python_start_early(void) {
    static _Atomic int asked; /* 0 not yet, 1 asked (or not wanted) */
    if (__builtin_expect(atomic_load_explicit(&asked, memory_order_relaxed), 1) || passthrough() ||
        atomic_exchange(&asked, 1))
        return;
    const char *want = getenv("EGPU_EARLY_START");
    if (want && !strcmp(want, "1") && !egpu_python_attached()) egpu_python_start();
}

static const void *py_image(int api, unsigned long long call, const void *image, size_t size,
                            const char *path, size_t *out_size) {
    if (!egpu_python_up()) return NULL; /* the original loads */
    atomic_fetch_add_explicit(&g_stats.python_calls, 1, memory_order_relaxed);
    tls_in_python++;
    const void *r = egpu_py_module_load(api, call, image, size, path, out_size);
    tls_in_python--;
    return r;
}

static void py_loaded(int api, unsigned long long call, void *handle, CUresult r, int repl_result,
                      const char *jit_log) {
    if (!egpu_python_up()) return;
    tls_in_python++;
    egpu_py_module_loaded(api, call, handle, r, repl_result, jit_log);
    tls_in_python--;
}

/* Lookups Python has handled. Libraries look a kernel up again on every call (cuDNN, cuBLAS, cudart's
 * cuKernelGetFunction): Python needs only the first answer, which stays true until an unload, and a
 * call into it costs microseconds. An entry is made once Python has returned, so that a thread asking
 * meanwhile goes to Python too and finds the handle routed (a kernel's function is routed only once
 * its kernel is known); not if an unload came in between, nor when Python failed (the next lookup
 * tries again). Full: every lookup goes to Python. */
#define SEEN_SIZE 8192
static struct seen { void *owner, *handle; int api; } seen[SEEN_SIZE];
static unsigned long seen_generation; /* unloads so far */
static pthread_mutex_t seen_lock = PTHREAD_MUTEX_INITIALIZER;

/* The slot of (api, owner, handle), or the empty slot it would take; NULL when the table is full.
 * Caller holds seen_lock. */
static struct seen *seen_slot(int api, void *owner, void *handle) {
    uint64_t h = (((uintptr_t)owner ^ ((uintptr_t)handle << 1)) >> 3) * 0x9E3779B97F4A7C15ull + (unsigned)api;
    for (uint32_t n = 0, i = (uint32_t)(h >> 51); n < SEEN_SIZE; n++, i = (i + 1) & (SEEN_SIZE - 1)) {
        struct seen *e = &seen[i];
        if (!e->handle || (e->handle == handle && e->owner == owner && e->api == api)) return e;
    }
    return NULL;
}

/* 1 if Python has handled (api, owner, handle); else 0 and the unload generation to enter it under. */
static int seen_before(int api, void *owner, void *handle, unsigned long *generation) {
    pthread_mutex_lock(&seen_lock);
    struct seen *e = seen_slot(api, owner, handle);
    int found = e && e->handle;
    *generation = seen_generation;
    pthread_mutex_unlock(&seen_lock);
    return found;
}

static void seen_enter(int api, void *owner, void *handle, unsigned long generation) {
    pthread_mutex_lock(&seen_lock);
    struct seen *e = generation == seen_generation ? seen_slot(api, owner, handle) : NULL;
    if (e) *e = (struct seen){owner, handle, api};
    pthread_mutex_unlock(&seen_lock);
}

/* An unload may free any handle a lookup returned, and the driver hands addresses out again. */
static void seen_forget(void) {
    pthread_mutex_lock(&seen_lock);
    memset(seen, 0, sizeof seen);
    seen_generation++;
    pthread_mutex_unlock(&seen_lock);
}

static void py_found(int api, void *owner, const char *name, void *handle) {
    if (!egpu_python_up()) return;
    int memo = api != EGPU_API_LINK_CREATE && api != EGPU_API_LINK_COMPLETE; /* states are reused */
    unsigned long generation;
    if (memo && seen_before(api, owner, handle, &generation)) return;
    atomic_fetch_add_explicit(&g_stats.python_calls, 1, memory_order_relaxed);
    tls_in_python++;
    int handled = egpu_py_handle_found(api, owner, name, handle);
    tls_in_python--;
    if (memo && handled) seen_enter(api, owner, handle, generation);
}

static void py_unloaded(int api, void *handle) {
    if (!egpu_python_up()) return;
    tls_in_python++;
    egpu_py_unloaded(api, handle);
    tls_in_python--;
}

static unsigned long long next_call(void) {
    return atomic_fetch_add_explicit(&g_stats.calls, 1, memory_order_relaxed) + 1;
}

/* Room for the driver's error log of a replacement it refuses: egpu reports its first lines. */
#define JIT_LOG_BYTES 4096

/* The JIT options a replacement load passes: the app's, copied (its arrays stay its own), less any error log of
 * its own (the errors of egpu's image are egpu's to report, not the app's to read), plus egpu's error log. */
struct jit_options {
    unsigned n;
    int *options;
    void **values;
};

static int is_error_log(int option) {
    return option == CU_JIT_ERROR_LOG_BUFFER || option == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES;
}

static struct jit_options jit_options_with_log(unsigned n, const int *options, void *const *values, char *log) {
    if (n && (!options || !values)) /* the driver's to refuse, as it would the app's own call */
        return (struct jit_options){n, (int *)options, (void **)values};
    struct jit_options j = {0, malloc(((size_t)n + 2) * sizeof(int)), malloc(((size_t)n + 2) * sizeof(void *))};
    if (!j.options || !j.values) { /* no memory for a copy: the app's options as they are, no log */
        free(j.options), free(j.values);
        return (struct jit_options){n, (int *)options, (void **)values};
    }
    for (unsigned i = 0; i < n; i++)
        if (!is_error_log(options[i])) j.options[j.n] = options[i], j.values[j.n++] = values[i];
    j.options[j.n] = CU_JIT_ERROR_LOG_BUFFER, j.values[j.n++] = log;
    j.options[j.n] = CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, j.values[j.n++] = (void *)(uintptr_t)JIT_LOG_BYTES;
    return j;
}

/* The app's own error log after a replacement loaded, as the driver would have written it had the app's call
 * loaded that image (the driver writes it, empty too, whatever the outcome): egpu's log cut to the app's size
 * (0 without CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES), and that size's output, what the driver wrote for egpu's. */
static void error_log_to_app(unsigned n, const int *options, void **values, const char *log, uintptr_t filled) {
    char *buffer = NULL;
    uintptr_t room = 0;
    for (unsigned i = 0; i < n; i++)
        if (options[i] == CU_JIT_ERROR_LOG_BUFFER) {
            buffer = values[i];
        } else if (options[i] == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES) {
            room = (uintptr_t)values[i];
            if (filled < room) values[i] = (void *)filled; /* written only when it changes, as outputs above */
        }
    if (!buffer || !room) return;
    size_t k = strnlen(log, room - 1);
    memcpy(buffer, log, k);
    buffer[k] = 0;
}

/* After the replacement's load: when it loaded, what the driver wrote into the options (an info log's size, the
 * wall time, the error log) goes back to the app's values, as if its own call had loaded the replacement; when it
 * was refused they stay as the app left them, for its own call that follows. Then the copy is freed. */
static void jit_options_done(struct jit_options j, CUresult r, unsigned n, const int *options, void **values,
                             const char *log) {
    if (j.options == options) return;
    if (r == CUDA_SUCCESS) {
        for (unsigned i = 0, k = 0; i < n && k < j.n; i++)
            if (!is_error_log(options[i])) {
                if (values[i] != j.values[k]) values[i] = j.values[k]; /* only outputs: an input array may be const */
                k++;
            }
        error_log_to_app(n, options, values, log, (uintptr_t)j.values[j.n - 1]);
    }
    free(j.options), free(j.values);
}

/* A replacement image loaded as the app's call would load it, with its JIT options and an error log (`log`,
 * JIT_LOG_BYTES): modules through cuModuleLoadDataEx, the one module load that takes options
 * (cuModuleLoadData(m, i) is cuModuleLoadDataEx(m, i, 0, NULL, NULL); the replacement is PTX or a cubin, never
 * a file), libraries through cuLibraryLoadData with the app's library options as they are. */
static CUresult load_replacement(void **out, const void *image, int library, unsigned n_jit, int *jit,
                                 void **jit_values, unsigned n_lib, int *lib, void **lib_values, char *log) {
    struct jit_options j = jit_options_with_log(n_jit, jit, jit_values, log);
    log[0] = 0;
    CUresult r = library ? CALL_REAL(cuLibraryLoadData, out, image, j.options, j.values, j.n, lib, lib_values, n_lib)
                         : CALL_REAL(cuModuleLoadDataEx, out, image, j.n, j.options, j.values);
    log[JIT_LOG_BYTES - 1] = 0;
    jit_options_done(j, r, n_jit, jit, jit_values, log);
    return r;
}

/* The JIT options of the load in progress on this thread (egpu_shim_load_jit), which a copy of its module is loaded
 * with too: one compiled without the application's (a register cap, FTZ, ...) may no longer launch its blocks or
 * compute what the application's did. */
static __thread struct { unsigned n; const int *options; void *const *values; } tls_jit;

/* CUjit_option values that take a number, none of them output or a pointer: MAX_REGISTERS, THREADS_PER_BLOCK,
 * OPTIMIZATION_LEVEL, TARGET, FALLBACK_STRATEGY, GENERATE_DEBUG_INFO, LOG_VERBOSE, GENERATE_LINE_INFO, CACHE_MODE,
 * FAST_COMPILE, FTZ, PREC_DIV, PREC_SQRT, FMA, OPTIMIZE_UNUSED_DEVICE_VARIABLES, POSITION_INDEPENDENT_CODE,
 * MIN_CTA_PER_SM, MAX_THREADS_PER_BLOCK, OVERRIDE_DIRECTIVE_VALUES (cuda.h). */
static int jit_scalar(int option) {
    static const unsigned long long scalars = 1ull << 0 | 1ull << 1 | 1ull << 7 | 1ull << 9 | 1ull << 10 |
                                              1ull << 11 | 1ull << 12 | 1ull << 13 | 1ull << 14 | 1ull << 16 |
                                              1ull << 21 | 1ull << 22 | 1ull << 23 | 1ull << 24 | 1ull << 29 |
                                              1ull << 30 | 1ull << 31 | 1ull << 32 | 1ull << 33;
    return option >= 0 && option < 64 && (scalars >> option & 1);
}

EXPORT unsigned egpu_shim_load_jit(int *options, unsigned long long *values, unsigned max) {
    unsigned n = 0;
    for (unsigned i = 0; i < tls_jit.n && n < max; i++)
        if (jit_scalar(tls_jit.options[i])) {
            options[n] = tls_jit.options[i];
            values[n++] = (unsigned long long)(uintptr_t)tls_jit.values[i];
        }
    return n;
}

/* One load with an optional replacement image (load_replacement), then the app's own call `sym(...)` when
 * there is none or the driver refused it, so the app never sees our error; Python hears the refusal with the
 * driver's log. `image_in`/`path_in`: what Python reads; library, n_jit...lib_values: load_replacement's. */
#define LOAD(sym, api, out, image_in, path_in, library, n_jit, jit, jit_values, n_lib, lib, lib_values, ...) \
    do { \
        if (passthrough()) return CALL_REAL(sym, __VA_ARGS__); \
        unsigned long long call_ = next_call(); \
        tls_jit.n = (jit) && (jit_values) ? (n_jit) : 0, tls_jit.options = (jit), tls_jit.values = (jit_values); \
        size_t n_ = 0; \
        const void *repl_ = py_image(api, call_, image_in, 0, path_in, &n_); \
        int rr_ = -1; \
        CUresult r_ = CUDA_SUCCESS; \
        char log_[JIT_LOG_BYTES]; \
        log_[0] = 0; \
        egpu_shim_idle(); \
        if (repl_) \
            r_ = rr_ = load_replacement((void **)(out), repl_, library, n_jit, jit, jit_values, n_lib, lib, \
                                        lib_values, log_); \
        if (!repl_ || rr_ != CUDA_SUCCESS) r_ = CALL_REAL(sym, __VA_ARGS__); \
        tls_jit.n = 0; \
        py_loaded(api, call_, r_ == CUDA_SUCCESS && (out) ? *(out) : NULL, r_, rr_, log_); \
        return r_; \
    } while (0)

EXPORT CUresult cuModuleLoad(CUmodule *module, const char *fname) {
    LOAD(cuModuleLoad, EGPU_API_MODULE_LOAD, module, NULL, fname, 0, 0, NULL, NULL, 0, NULL, NULL, module, fname);
}

EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    LOAD(cuModuleLoadData, EGPU_API_MODULE_LOAD_DATA, module, image, NULL, 0, 0, NULL, NULL, 0, NULL, NULL, module,
         image);
}

EXPORT CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                                   int *options, void **optionValues) {
    LOAD(cuModuleLoadDataEx, EGPU_API_MODULE_LOAD_DATA_EX, module, image, NULL, 0, numOptions, options, optionValues,
         0, NULL, NULL, module, image, numOptions, options, optionValues);
}

EXPORT CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin) {
    LOAD(cuModuleLoadFatBinary, EGPU_API_MODULE_LOAD_FAT_BINARY, module, fatCubin, NULL, 0, 0, NULL, NULL, 0, NULL,
         NULL, module, fatCubin);
}

EXPORT CUresult cuLibraryLoadData(CUlibrary *library, const void *code, int *jitOptions,
                                  void **jitOptionsValues, unsigned int numJitOptions,
                                  int *libraryOptions, void **libraryOptionValues,
                                  unsigned int numLibraryOptions) {
    LOAD(cuLibraryLoadData, EGPU_API_LIBRARY_LOAD_DATA, library, code, NULL, 1, numJitOptions, jitOptions,
         jitOptionsValues, numLibraryOptions, libraryOptions, libraryOptionValues, library, code, jitOptions,
         jitOptionsValues, numJitOptions, libraryOptions, libraryOptionValues, numLibraryOptions);
}

EXPORT CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *fileName, int *jitOptions,
                                      void **jitOptionsValues, unsigned int numJitOptions,
                                      int *libraryOptions, void **libraryOptionValues,
                                      unsigned int numLibraryOptions) {
    LOAD(cuLibraryLoadFromFile, EGPU_API_LIBRARY_LOAD_FROM_FILE, library, NULL, fileName, 1, numJitOptions,
         jitOptions, jitOptionsValues, numLibraryOptions, libraryOptions, libraryOptionValues, library, fileName,
         jitOptions, jitOptionsValues, numJitOptions, libraryOptions, libraryOptionValues, numLibraryOptions);
}

EXPORT CUresult cuLinkCreate_v2(unsigned int numOptions, int *options, void **optionValues,
                                CUlinkState *stateOut) {
    CUresult r = CALL_REAL(cuLinkCreate_v2, numOptions, options, optionValues, stateOut);
    if (r == CUDA_SUCCESS && stateOut && !passthrough())
        py_found(EGPU_API_LINK_CREATE, NULL, NULL, *stateOut);
    return r;
}

/* PTX inputs only: cubins, fatbins and objects are already compiled. */
EXPORT CUresult cuLinkAddData_v2(CUlinkState state, int type, void *data, size_t size, const char *name,
                                 unsigned int numOptions, int *options, void **optionValues) {
    if (passthrough() || type != CU_JIT_INPUT_PTX)
        return CALL_REAL(cuLinkAddData_v2, state, type, data, size, name, numOptions, options,
                         optionValues);
    unsigned long long call = next_call();
    size_t n = 0;
    const void *repl = py_image(EGPU_API_LINK_ADD_DATA, call, data, size, NULL, &n);
    int rr = -1;
    CUresult r;
    if (repl)
        rr = CALL_REAL(cuLinkAddData_v2, state, type, (void *)repl, n, name, numOptions, options,
                       optionValues);
    r = repl && rr == CUDA_SUCCESS
            ? rr
            : CALL_REAL(cuLinkAddData_v2, state, type, data, size, name, numOptions, options,
                        optionValues);
    py_loaded(EGPU_API_LINK_ADD_DATA, call, state, r, rr, "");
    return r;
}

EXPORT CUresult cuLinkAddFile_v2(CUlinkState state, int type, const char *path, unsigned int numOptions,
                                 int *options, void **optionValues) {
    if (passthrough() || type != CU_JIT_INPUT_PTX)
        return CALL_REAL(cuLinkAddFile_v2, state, type, path, numOptions, options, optionValues);
    unsigned long long call = next_call();
    size_t n = 0;
    const void *repl = py_image(EGPU_API_LINK_ADD_FILE, call, NULL, 0, path, &n);
    int rr = -1;
    CUresult r;
    if (repl)
        rr = CALL_REAL(cuLinkAddData_v2, state, type, (void *)repl, n, path, numOptions, options,
                       optionValues);
    r = repl && rr == CUDA_SUCCESS
            ? rr
            : CALL_REAL(cuLinkAddFile_v2, state, type, path, numOptions, options, optionValues);
    py_loaded(EGPU_API_LINK_ADD_FILE, call, state, r, rr, "");
    return r;
}

EXPORT CUresult cuLinkComplete(CUlinkState state, void **cubinOut, size_t *sizeOut) {
    CUresult r = CALL_REAL(cuLinkComplete, state, cubinOut, sizeOut);
    if (r == CUDA_SUCCESS && cubinOut && !passthrough())
        py_found(EGPU_API_LINK_COMPLETE, state, NULL, *cubinOut);
    return r;
}

#define FOUND(sym, api, out, owner, name, ...) \
    CUresult r = CALL_REAL(sym, __VA_ARGS__); \
    if (r == CUDA_SUCCESS && out && !passthrough()) py_found(api, owner, name, *out); \
    return r;

/* A function found inside a wait is loaded there too, so its later uses need no wait of their own (an
 * error leaves it as it was: they wait then). */
static void load_found(CUresult r, CUfunction *f) {
    if (r == CUDA_SUCCESS && f && *f) CALL_REAL(cuFuncLoad, *f);
}

EXPORT void egpu_shim_found(void *function) {
    if (lazy_waits()) load_found(CUDA_SUCCESS, &function);
}

EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
    int waits = lazy_waits();
    if (waits) egpu_shim_idle(); /* lazy loading loads the kernel's code here */
    CUresult r = CALL_REAL(cuModuleGetFunction, hfunc, hmod, name);
    if (waits) load_found(r, hfunc);
    if (r == CUDA_SUCCESS && hfunc && !passthrough()) py_found(EGPU_API_MODULE_GET_FUNCTION, hmod, name, *hfunc);
    return r;
}

EXPORT CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name) {
    FOUND(cuLibraryGetKernel, EGPU_API_LIBRARY_GET_KERNEL, pKernel, library, name, pKernel, library,
          name)
}

EXPORT CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel) {
    /* libraries call it again and again (cuBLASLt per heuristic query): the wait only before the first */
    CUcontext ctx = NULL;
    unsigned long generation = 0;
    int loaded = 1;
    if (lazy_waits() && kernel) {
        loaded = loaded_here(kernel, &ctx, &generation);
        if (!loaded) egpu_shim_idle();
    }
    CUresult r = CALL_REAL(cuKernelGetFunction, pFunc, kernel);
    if (!loaded) load_found(r, pFunc);
    if (!loaded && r == CUDA_SUCCESS) seen_enter(KERNEL_LOADED, ctx, kernel, generation);
    if (r == CUDA_SUCCESS && pFunc && !passthrough())
        py_found(EGPU_API_KERNEL_GET_FUNCTION, kernel, NULL, *pFunc);
    return r;
}

EXPORT CUresult cuLibraryGetModule(CUmodule *pMod, CUlibrary library) {
    if (lazy_waits()) egpu_shim_idle(); /* loads the library into the current context */
    FOUND(cuLibraryGetModule, EGPU_API_LIBRARY_GET_MODULE, pMod, library, NULL, pMod, library)
}

/* What else may load code lazily: a library's variables (the library into the current context), a
 * CUkernel's attributes before it was seen loaded in this context, a function's while it is partly loaded,
 * a graph's kernels at instantiation, update or upload. */
#define LAZY_WAIT(sym, params, wait, ...) \
    EXPORT CUresult sym params { \
        if (lazy_waits()) wait; \
        return CALL_REAL(sym, __VA_ARGS__); \
    }
#define FUNCTION_WAIT(sym, params, f, ...) \
    EXPORT CUresult sym params { \
        idle_unless_loaded(f); \
        return CALL_REAL(sym, __VA_ARGS__); \
    }

static void idle_unless_kernel_loaded(CUkernel kernel) {
    CUcontext ctx;
    unsigned long generation;
    if (!loaded_here(kernel, &ctx, &generation)) egpu_shim_idle();
}

LAZY_WAIT(cuLibraryGetGlobal, (CUdeviceptr *dptr, size_t *bytes, CUlibrary library, const char *name),
          egpu_shim_idle(), dptr, bytes, library, name)
LAZY_WAIT(cuLibraryGetManaged, (CUdeviceptr *dptr, size_t *bytes, CUlibrary library, const char *name),
          egpu_shim_idle(), dptr, bytes, library, name)
LAZY_WAIT(cuKernelGetAttribute, (int *pi, int attrib, CUkernel kernel, int dev),
          idle_unless_kernel_loaded(kernel), pi, attrib, kernel, dev)
FUNCTION_WAIT(cuFuncGetAttribute, (int *pi, int attrib, CUfunction hfunc), hfunc, pi, attrib, hfunc)

/* The application made setting i (value v; on a CUkernel for device dev, else dev -1) on `handle`: kept for
 * the targets published later, and made on the function its launches go to now (a target published meanwhile
 * gets it either way: both under settings_lock). */
static void setting_made(void *handle, int i, int v, int dev) {
    struct slot *s = passthrough() || i < 0 || i > ATTRIBUTES ? NULL : slot_for(handle, 1);
    if (!s) return;
    const struct target *t = atomic_load_explicit(&s->target, memory_order_acquire);
    if (t && lazy_waits()) egpu_shim_idle(); /* the setting may load the target's code */
    pthread_mutex_lock(&settings_lock);
    if (!s->settings) s->settings = calloc(1, sizeof *s->settings);
    if (s->settings) {
        s->settings->made |= 1u << i;
        s->settings->value[i] = v;
        s->settings->device[i] = dev;
        t = atomic_load_explicit(&s->target, memory_order_acquire);
        if (t && t->function != handle) apply_setting(s->settings, i, t->function);
    }
    pthread_mutex_unlock(&settings_lock);
}

EXPORT CUresult cuKernelSetAttribute(int attrib, int val, CUkernel kernel, int dev) {
    if (lazy_waits()) idle_unless_kernel_loaded(kernel);
    CUresult r = CALL_REAL(cuKernelSetAttribute, attrib, val, kernel, dev);
    if (r == CUDA_SUCCESS && (unsigned)attrib < ATTRIBUTES) setting_made(kernel, attrib, val, dev);
    return r;
}

EXPORT CUresult cuKernelSetCacheConfig(CUkernel kernel, int config, int dev) {
    if (lazy_waits()) idle_unless_kernel_loaded(kernel);
    CUresult r = CALL_REAL(cuKernelSetCacheConfig, kernel, config, dev);
    if (r == CUDA_SUCCESS) setting_made(kernel, CACHE_CONFIG, config, dev);
    return r;
}

EXPORT CUresult cuFuncSetAttribute(CUfunction hfunc, int attrib, int value) {
    idle_unless_loaded(hfunc);
    CUresult r = CALL_REAL(cuFuncSetAttribute, hfunc, attrib, value);
    if (r == CUDA_SUCCESS && (unsigned)attrib < ATTRIBUTES) setting_made(hfunc, attrib, value, -1);
    return r;
}

EXPORT CUresult cuFuncSetCacheConfig(CUfunction hfunc, int config) {
    idle_unless_loaded(hfunc);
    CUresult r = CALL_REAL(cuFuncSetCacheConfig, hfunc, config);
    if (r == CUDA_SUCCESS) setting_made(hfunc, CACHE_CONFIG, config, -1);
    return r;
}
FUNCTION_WAIT(cuFuncLoad, (CUfunction hfunc), hfunc, hfunc)
FUNCTION_WAIT(cuOccupancyMaxActiveBlocksPerMultiprocessor,
              (int *numBlocks, CUfunction func, int blockSize, size_t dynamicSMemSize), func,
              numBlocks, func, blockSize, dynamicSMemSize)
FUNCTION_WAIT(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags,
              (int *numBlocks, CUfunction func, int blockSize, size_t dynamicSMemSize, unsigned int flags), func,
              numBlocks, func, blockSize, dynamicSMemSize, flags)
FUNCTION_WAIT(cuOccupancyMaxPotentialBlockSize,
              (int *minGridSize, int *blockSize, CUfunction func, size_t (*blockSizeToDynamicSMemSize)(int),
               size_t dynamicSMemSize, int blockSizeLimit), func,
              minGridSize, blockSize, func, blockSizeToDynamicSMemSize, dynamicSMemSize, blockSizeLimit)
FUNCTION_WAIT(cuOccupancyMaxPotentialBlockSizeWithFlags,
              (int *minGridSize, int *blockSize, CUfunction func, size_t (*blockSizeToDynamicSMemSize)(int),
               size_t dynamicSMemSize, int blockSizeLimit, unsigned int flags), func,
              minGridSize, blockSize, func, blockSizeToDynamicSMemSize, dynamicSMemSize, blockSizeLimit, flags)
FUNCTION_WAIT(cuOccupancyAvailableDynamicSMemPerBlock,
              (size_t *dynamicSmemSize, CUfunction func, int numBlocks, int blockSize), func,
              dynamicSmemSize, func, numBlocks, blockSize)
FUNCTION_WAIT(cuOccupancyMaxPotentialClusterSize, (int *clusterSize, CUfunction func, const CUlaunchConfig *config),
              func, clusterSize, func, config)
FUNCTION_WAIT(cuOccupancyMaxActiveClusters, (int *numClusters, CUfunction func, const CUlaunchConfig *config),
              func, numClusters, func, config)
LAZY_WAIT(cuGraphInstantiateWithFlags, (CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags),
          egpu_shim_idle(), phGraphExec, hGraph, flags)
LAZY_WAIT(cuGraphInstantiateWithParams, (CUgraphExec *phGraphExec, CUgraph hGraph, void *instantiateParams),
          egpu_shim_idle(), phGraphExec, hGraph, instantiateParams)
LAZY_WAIT(cuGraphInstantiateWithParams_ptsz, (CUgraphExec *phGraphExec, CUgraph hGraph, void *instantiateParams),
          egpu_shim_idle(), phGraphExec, hGraph, instantiateParams)
LAZY_WAIT(cuGraphExecUpdate_v2, (CUgraphExec hGraphExec, CUgraph hGraph, void *resultInfo),
          egpu_shim_idle(), hGraphExec, hGraph, resultInfo)
LAZY_WAIT(cuGraphUpload, (CUgraphExec hGraphExec, CUstream hStream), egpu_shim_idle(), hGraphExec, hStream)
LAZY_WAIT(cuGraphUpload_ptsz, (CUgraphExec hGraphExec, CUstream hStream), egpu_shim_idle(), hGraphExec, hStream)

EXPORT CUresult cuModuleUnload(CUmodule hmod) {
    egpu_shim_idle();
    CUresult r = CALL_REAL(cuModuleUnload, hmod);
    if (r == CUDA_SUCCESS) seen_forget(), egpu_sass_unloaded();
    if (r == CUDA_SUCCESS && !passthrough()) py_unloaded(EGPU_API_MODULE_UNLOAD, hmod);
    return r;
}

EXPORT CUresult cuLibraryUnload(CUlibrary library) {
    egpu_shim_idle();
    CUresult r = CALL_REAL(cuLibraryUnload, library);
    if (r == CUDA_SUCCESS) seen_forget(), egpu_sass_unloaded();
    if (r == CUDA_SUCCESS && !passthrough()) py_unloaded(EGPU_API_LIBRARY_UNLOAD, library);
    return r;
}

/* ---- allocations: a table for cow/, updated after the driver call, under a short lock ---- */

#define ALLOC_SIZE (1u << 16)
static struct egpu_alloc allocs[ALLOC_SIZE]; /* address 0: empty */
static size_t alloc_count;
static pthread_mutex_t alloc_lock = PTHREAD_MUTEX_INITIALIZER;

/* VMM handles live in their own key space: a handle may equal some address. */
static int alloc_same(const struct egpu_alloc *a, unsigned long long addr, int handle) {
    return a->address == addr && (a->kind == EGPU_ALLOC_VMM_HANDLE) == handle;
}

static uint32_t alloc_home(unsigned long long addr) {
    return (uint32_t)((addr >> 8) * 0x9E3779B97F4A7C15ull >> 48) & (ALLOC_SIZE - 1);
}

/* splitmix64's finalizer: distinct seqs, digest bits that XOR does not cancel by accident */
static unsigned long long seq_hash(unsigned long long x) {
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void alloc_add(unsigned long long addr, unsigned long long size, int kind) {
    if (!addr) return;
    int handle = kind == EGPU_ALLOC_VMM_HANDLE, placed = 0;
    pthread_mutex_lock(&alloc_lock);
    /* numbered under the lock, so numbers follow the table's order of insertion */
    unsigned long long seq = atomic_fetch_add(&egpu_alloc_seq, 1);
    for (uint32_t n = 0, i = alloc_home(addr); n < ALLOC_SIZE; n++, i = (i + 1) & (ALLOC_SIZE - 1)) {
        if (!allocs[i].address || alloc_same(&allocs[i], addr, handle)) {
            alloc_count += !allocs[i].address;
            if (allocs[i].address) atomic_fetch_xor(&egpu_alloc_digest, seq_hash(allocs[i].seq)); /* replaced */
            allocs[i] = (struct egpu_alloc){addr, size, kind, seq};
            atomic_fetch_xor(&egpu_alloc_digest, seq_hash(seq));
            placed = 1;
            break;
        }
    }
    if (!placed) atomic_fetch_add(&egpu_alloc_overflow, 1);
    atomic_fetch_add(&egpu_alloc_changes, 1);
    pthread_mutex_unlock(&alloc_lock);
}

/* Returns what it removed (address 0: not in the table). */
static struct egpu_alloc alloc_del(unsigned long long addr, int handle) {
    struct egpu_alloc gone = {0, 0, 0, 0};
    if (!addr) return gone;
    pthread_mutex_lock(&alloc_lock);
    uint32_t i = alloc_home(addr);
    for (uint32_t n = 0; n < ALLOC_SIZE && allocs[i].address; n++, i = (i + 1) & (ALLOC_SIZE - 1)) {
        if (!alloc_same(&allocs[i], addr, handle)) continue;
        gone = allocs[i];
        /* backward-shift deletion keeps every probe chain unbroken without tombstones; in a full table no slot
         * is empty, so the shift stops after every other slot (it never ended there, under the lock) */
        uint32_t hole = i;
        for (uint32_t j = (i + 1) & (ALLOC_SIZE - 1); j != i && allocs[j].address; j = (j + 1) & (ALLOC_SIZE - 1)) {
            uint32_t home = alloc_home(allocs[j].address);
            if (((j - home) & (ALLOC_SIZE - 1)) >= ((j - hole) & (ALLOC_SIZE - 1))) {
                allocs[hole] = allocs[j];
                hole = j;
            }
        }
        allocs[hole] = (struct egpu_alloc){0, 0, 0, 0};
        alloc_count--;
        atomic_fetch_add(&egpu_alloc_changes, 1);
        atomic_fetch_xor(&egpu_alloc_digest, seq_hash(gone.seq));
        break;
    }
    pthread_mutex_unlock(&alloc_lock);
    return gone;
}

EXPORT size_t egpu_shim_allocations(struct egpu_alloc *out, size_t max) {
    size_t n = 0;
    pthread_mutex_lock(&alloc_lock);
    for (uint32_t i = 0; i < ALLOC_SIZE && n < max; i++)
        if (allocs[i].address) out[n++] = allocs[i];
    n = alloc_count;
    pthread_mutex_unlock(&alloc_lock);
    return n;
}

#define PTR(p) ((unsigned long long)(uintptr_t)(p))

/* Each hook: the driver call, the table, then the egpu/alloc or egpu/free probes (egpu_hostapi.h). A
 * free's probe sees the size and kind the table had for the address (0 when it never saw it made). */
#define ALLOC_HOOK(sym, call, ok, addr, size_, kind_, ...) do { \
        unsigned long long t_ = EGPU_HOST_BEGIN(sym); \
        CUresult r = call; \
        if (r == CUDA_SUCCESS && (ok)) alloc_add((addr), (size_), (kind_)); \
        EGPU_HOST_END(sym, t_, r, .dst = (r == CUDA_SUCCESS && (ok)) ? (addr) : 0, .bytes = (size_), \
                      .kind = (kind_), __VA_ARGS__); \
        return r; \
    } while (0)
#define FREE_HOOK(sym, call, addr, handle, ...) do { \
        unsigned long long t_ = EGPU_HOST_BEGIN(sym); \
        CUresult r = call; \
        struct egpu_alloc gone_ = {0, 0, 0, 0}; \
        if (r == CUDA_SUCCESS) gone_ = alloc_del((addr), (handle)); \
        EGPU_HOST_END(sym, t_, r, .dst = (addr), .bytes = gone_.size, .kind = (unsigned int)gone_.kind, __VA_ARGS__); \
        return r; \
    } while (0)

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    ALLOC_HOOK(cuMemAlloc_v2, CALL_REAL(cuMemAlloc_v2, dptr, bytesize), dptr, *dptr, bytesize, EGPU_ALLOC_DEVICE,
               .flags = 0);
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                   unsigned int ElementSizeBytes) {
    ALLOC_HOOK(cuMemAllocPitch_v2, CALL_REAL(cuMemAllocPitch_v2, dptr, pPitch, WidthInBytes, Height, ElementSizeBytes),
               dptr && pPitch, *dptr, pPitch ? (unsigned long long)*pPitch * Height : 0, EGPU_ALLOC_PITCH, .flags = 0);
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    ALLOC_HOOK(cuMemAllocManaged, CALL_REAL(cuMemAllocManaged, dptr, bytesize, flags), dptr, *dptr, bytesize,
               EGPU_ALLOC_MANAGED, .flags = 0);
}

#define ALLOC_ASYNC(sym, per_thread) \
    EXPORT CUresult sym(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) { \
        ALLOC_HOOK(sym, CALL_REAL(sym, dptr, bytesize, hStream), dptr, *dptr, bytesize, EGPU_ALLOC_ASYNC, \
                   .stream = EGPU_HOST_STREAM(hStream, per_thread), \
                   .flags = EGPU_HOST_F_ASYNC | ((per_thread) ? EGPU_HOST_F_PER_THREAD : 0)); \
    }
ALLOC_ASYNC(cuMemAllocAsync, 0)
ALLOC_ASYNC(cuMemAllocAsync_ptsz, 1)

#define ALLOC_POOL(sym, per_thread) \
    EXPORT CUresult sym(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) { \
        ALLOC_HOOK(sym, CALL_REAL(sym, dptr, bytesize, pool, hStream), dptr, *dptr, bytesize, EGPU_ALLOC_ASYNC, \
                   .stream = EGPU_HOST_STREAM(hStream, per_thread), .handle = PTR(pool), \
                   .flags = EGPU_HOST_F_ASYNC | ((per_thread) ? EGPU_HOST_F_PER_THREAD : 0)); \
    }
ALLOC_POOL(cuMemAllocFromPoolAsync, 0)
ALLOC_POOL(cuMemAllocFromPoolAsync_ptsz, 1)

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    FREE_HOOK(cuMemFree_v2, CALL_REAL(cuMemFree_v2, dptr), dptr, 0, .flags = 0);
}

#define FREE_ASYNC(sym, per_thread) \
    EXPORT CUresult sym(CUdeviceptr dptr, CUstream hStream) { \
        FREE_HOOK(sym, CALL_REAL(sym, dptr, hStream), dptr, 0, .stream = EGPU_HOST_STREAM(hStream, per_thread), \
                  .flags = EGPU_HOST_F_ASYNC | ((per_thread) ? EGPU_HOST_F_PER_THREAD : 0)); \
    }
FREE_ASYNC(cuMemFreeAsync, 0)
FREE_ASYNC(cuMemFreeAsync_ptsz, 1)

EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags) {
    ALLOC_HOOK(cuMemHostAlloc, CALL_REAL(cuMemHostAlloc, pp, bytesize, Flags), pp, PTR(*pp), bytesize,
               EGPU_ALLOC_HOST, .flags = 0);
}

/* cuMemHostAlloc with no flags; cuMemFreeHost frees both */
EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytesize) {
    ALLOC_HOOK(cuMemAllocHost_v2, CALL_REAL(cuMemAllocHost_v2, pp, bytesize), pp, PTR(*pp), bytesize,
               EGPU_ALLOC_HOST, .flags = 0);
}

EXPORT CUresult cuMemFreeHost(void *p) {
    FREE_HOOK(cuMemFreeHost, CALL_REAL(cuMemFreeHost, p), PTR(p), 0, .flags = 0);
}

EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags) {
    ALLOC_HOOK(cuMemHostRegister_v2, CALL_REAL(cuMemHostRegister_v2, p, bytesize, Flags), 1, PTR(p), bytesize,
               EGPU_ALLOC_HOST_REGISTERED, .flags = 0);
}

EXPORT CUresult cuMemHostUnregister(void *p) {
    FREE_HOOK(cuMemHostUnregister, CALL_REAL(cuMemHostUnregister, p), PTR(p), 0, .flags = 0);
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const void *prop,
                            unsigned long long flags) {
    ALLOC_HOOK(cuMemCreate, CALL_REAL(cuMemCreate, handle, size, prop, flags), handle, *handle, size,
               EGPU_ALLOC_VMM_HANDLE, .flags = 0);
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    FREE_HOOK(cuMemRelease, CALL_REAL(cuMemRelease, handle), handle, 1, .flags = 0);
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                         unsigned long long flags) {
    ALLOC_HOOK(cuMemMap, CALL_REAL(cuMemMap, ptr, size, offset, handle, flags), 1, ptr, size,
               EGPU_ALLOC_VMM_MAPPING, .handle = handle);
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    FREE_HOOK(cuMemUnmap, CALL_REAL(cuMemUnmap, ptr, size), ptr, 0, .flags = 0);
}

/* ---- fork (process.c): the tables' locks taken across it; in the child, the gate and the launch
 * record ring as no other thread left them (records go off: their consumer is the parent's thread) ---- */

void egpu_interpose_fork(enum egpu_fork_phase phase) {
    static pthread_mutex_t *const locks[] = {&publish_lock, &seen_lock, &alloc_lock};
    for (size_t i = 0; i < sizeof locks / sizeof *locks; i++) {
        if (phase == EGPU_FORK_PREPARE) pthread_mutex_lock(locks[i]);
        else if (phase == EGPU_FORK_PARENT) pthread_mutex_unlock(locks[i]);
        else pthread_mutex_init(locks[i], NULL);
    }
    if (phase != EGPU_FORK_CHILD) return;
    egpu_gate_reset(&g_launch_gate);
    atomic_store(&records_on, 0);
    atomic_store(&g_rings_wait, 0); /* the reader is a thread of the parent's */
    launch_ring_reset();
}
