/* sass.c: the SASS back end in libegpu_shim.so, through NVIDIA's Compute Sanitizer patching API.
 *
 * - egpu_sass_start (the cuInit hook, before the driver starts; EGPU_BACKEND sass|auto) dlopens
 *   libsanitizer-public.so (EGPU_SANITIZER_LIB), subscribes and enables the resource domain. That is
 *   standby: every module load is recorded (MODULE_LOADED), nothing is patched and the launch domain
 *   is off, so a job pays nothing until a probe arrives. A subscription made after CUDA started would
 *   never see a launch (docs/sass-backend.md), so it is made for every job that asked for the back end
 *   (runtime/sass.py for_job: kernel-site probes, --backend sass, --live-sass).
 * - A generation is one patch image (sass_patch.py, entry points named after the image) with the
 *   instruction classes it patches and its map-table block. The runtime stages one
 *   (egpu_sass_stage) and it is committed either at once, while no module is patched
 *   (egpu_sass_commit_now: the start-up probes), or inside the launch gate of a flip
 *   (egpu_shim_swap -> egpu_sass_flip): the contexts drain, then every recorded module is unpatched and
 *   patched again with the new image's entry points (re-patching over a patch without unpatching
 *   breaks the module: measured on the H200). A generation without classes unpatches everything and
 *   turns the launch domain off again: standby. A failed re-patch puts the old generation back.
 * - MODULE_LOADED of a module the PTX back end did not instrument (its cubin has no "__egpu_maps_"
 *   table) while a generation patches: patched with it at once (a first patch needs no drain), or, while
 *   another thread patches, by that thread before it lets go (Locks below). Its kernels' names are read
 *   from the cubin's symbol table then: a generation patches a module only where one of its kernels
 *   runs a program (the sanitizer patches whole modules, and every thread of a patched kernel pays the
 *   patch mechanism, about 1 ns of GPU time a warp and patch class on the H200, even when the patch
 *   returns at once: bench/bench_sass_sweep.py). What runs where comes from the generation's table (a
 *   staged generation holds every kernel of the modules loaded before it: egpu_sass_kernel_names), or,
 *   for a module loaded after, from Python, asked at its load about the generation current then, before
 *   any lock is taken. A kernel neither knows, or a cubin that cannot be read, gets its module patched.
 * - LAUNCH_BEGIN of a patched module's kernel: the function's programs under the current generation
 *   (once per function and generation: from the generation's table of the kernels known when it was
 *   staged, else asked from Python) decide; with any, a launch record
 *   (sass_patch.Record) is copied into a per-context ring on the launch's stream and given to the
 *   launch as its callback data (sanitizerSetLaunchCallbackData). Without, nothing: the patches see
 *   NULL and return.
 *
 * Locks. Every sanitizer call that patches (and the contexts' images) is made under g_commit_mu, which
 * no callback ever waits for: a MODULE_LOADED callback runs inside the driver's load, and a commit's
 * sanitizer call may wait for a driver lock that load holds. So a load only tries the lock: got, it
 * patches its module at once (before the load returns); held, it records the module as pending and
 * the holder patches it before letting go (commit_unlock). g_list_mu guards the module list and the
 * staged generation, and is held for a few loads and stores only, never across a call.
 *
 * The sanitizer's types and functions are declared here, not taken from its headers, so the shim
 * builds without them; tests/test_sass_gpu.py checks them against the real headers.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "egpu_shim.h"
#include "egpu_sass.h"
#include "egpu_table.h"

/* ---- the sanitizer API we use (sanitizer_callbacks.h, sanitizer_patching.h, CUDA 12/13) ---- */

typedef int SanitizerResult;
typedef void *Sanitizer_SubscriberHandle, *Sanitizer_StreamHandle, *Sanitizer_LaunchHandle;
typedef void (*Sanitizer_CallbackFunc)(void *userdata, int domain, uint32_t cbid, const void *cbdata);

enum { SAN_DOMAIN_RESOURCE = 3, SAN_DOMAIN_LAUNCH = 5 };
enum { SAN_CBID_MODULE_LOADED = 9, SAN_CBID_MODULE_UNLOAD_STARTING = 10 };
enum { SAN_CBID_LAUNCH_BEGIN = 1 };

typedef struct { /* Sanitizer_ResourceModuleData */
    CUcontext context;
    CUmodule module;
    size_t cubinSize;
    const char *pCubin;
    CUlibrary library;
} san_module_data;

typedef struct { /* Sanitizer_LaunchData, up to the last member we read */
    CUcontext context;
    CUstream stream;
    Sanitizer_StreamHandle hStream;
    CUmodule module;
    CUfunction function;
    const char *functionName;
    uint32_t gridDim_x, gridDim_y, gridDim_z, blockDim_x, blockDim_y, blockDim_z;
    uint32_t clusterDim_x, clusterDim_y, clusterDim_z;
    uint64_t gridId;
    Sanitizer_LaunchHandle hLaunch;
} san_launch_data;

#define SAN_FNS(X) \
    X(sanitizerSubscribe, (Sanitizer_SubscriberHandle *subscriber, Sanitizer_CallbackFunc callback, void *userdata)) \
    X(sanitizerUnsubscribe, (Sanitizer_SubscriberHandle subscriber)) \
    X(sanitizerEnableDomain, (uint32_t enable, Sanitizer_SubscriberHandle subscriber, int domain)) \
    X(sanitizerEnableCallback, (uint32_t enable, Sanitizer_SubscriberHandle subscriber, int domain, uint32_t cbid)) \
    X(sanitizerAddPatches, (const void *image, CUcontext ctx)) \
    X(sanitizerPatchInstructions, (int instructionId, CUmodule module, const char *deviceCallbackName)) \
    X(sanitizerPatchModule, (CUmodule module)) \
    X(sanitizerUnpatchModule, (CUmodule module)) \
    X(sanitizerAlloc, (CUcontext ctx, void **devPtr, size_t size)) \
    X(sanitizerMemcpyHostToDeviceAsync, (void *dst, void *src, size_t count, Sanitizer_StreamHandle stream)) \
    X(sanitizerSetLaunchCallbackData, \
      (Sanitizer_LaunchHandle launch, CUfunction kernel, Sanitizer_StreamHandle stream, const void *userdata)) \
    X(sanitizerGetFunctionPcAndSize, (CUmodule module, const char *functionName, uint64_t *pc, uint64_t *size)) \
    X(sanitizerGetResultString, (SanitizerResult result, const char **str))

static struct {
#define X(name, params) SanitizerResult (*name) params;
    SAN_FNS(X)
#undef X
} san;

#define DEFAULT_LIB "/usr/local/cuda/compute-sanitizer/libsanitizer-public.so"
#define SASS_UNKNOWN (~0ull) /* egpu_py_sass_kernel's "no answer": its module patched, the kernel running none */
#define MARKER "__egpu_maps_" /* translate/module.py table_symbol: the PTX back end's modules */
#define CLASSES 4             /* Sanitizer_InstructionId 1..3: block enter, block exit, global access */

/* sass_patch.Record, padded to 64 bytes */
struct record {
    unsigned long long kernel_id, launch_id, start, mask, tables, generation, stream, pad;
};
#define RING 4096 /* records per context: a slot is reused after RING later launches in that context */

__thread unsigned long long egpu_sass_launch_id;

static _Atomic int g_state;
static struct {
    _Atomic unsigned long long modules_seen, modules_patched, modules_skipped, launches, probed, errors, flips, asked;
    _Atomic unsigned long long other_context;
} g_stats;
static _Atomic(CUcontext) g_maps_ctx; /* egpu_sass_maps_context: where the tables are */
static pthread_mutex_t g_err_mu = PTHREAD_MUTEX_INITIALIZER; /* g_error: any thread may fail a call */
static char g_error[256];
static Sanitizer_SubscriberHandle g_subscriber;
static pthread_mutex_t g_commit_mu = PTHREAD_MUTEX_INITIALIZER; /* patching calls, contexts' images */
static pthread_mutex_t g_list_mu = PTHREAD_MUTEX_INITIALIZER;   /* the module list, the staged generation */
static __thread int tls_adding; /* our own sanitizerAddPatches: its module is the patch image */
static int g_launches_on;        /* the launch domain is enabled (under g_commit_mu) */
static _Atomic unsigned long long g_flip_us; /* the last commit's unpatch and re-patch, microseconds */
static _Atomic unsigned long long g_drain_us; /* the last flip's drain of the patched contexts */

__attribute__((format(printf, 1, 2))) static void set_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&g_err_mu);
    vsnprintf(g_error, sizeof g_error, fmt, ap);
    pthread_mutex_unlock(&g_err_mu);
    va_end(ap);
}

/* The last failure is kept (a flip's caller reads the one it caused). */
static int ok(SanitizerResult r, const char *call) {
    if (r == 0) return 1;
    atomic_fetch_add(&g_stats.errors, 1);
    const char *s = NULL;
    if (!san.sanitizerGetResultString || san.sanitizerGetResultString(r, &s) != 0) s = "?";
    set_error("%s failed: %d (%s)", call, r, s ? s : "?");
    return 0;
}

/* ---- generations: immutable once published; never freed (a launch callback may hold one) ---- */

struct kernel { /* what the runtime said at staging about a kernel name it had been asked about */
    const char *name;               /* NULL: a free slot */
    unsigned long long mask, kernel_id;
};

struct generation {
    unsigned long long id;
    unsigned int classes;           /* bit 1 << Sanitizer_InstructionId */
    char entry[CLASSES][96];        /* the image's entry point for each class */
    unsigned long long image_id;    /* names the image: added to a context once */
    void *image;                    /* owned until the generation is replaced */
    _Atomic unsigned long long tables;
    struct kernel *kernels;         /* open addressing by name; nkernels a power of two (0: none) */
    size_t nkernels;
    int evaluates;                  /* egpu_sass_generation.evaluates */
};
static _Atomic(struct generation *) g_current; /* NULL or no classes: standby */
static struct generation *g_staged;             /* under g_list_mu */

static uint64_t name_hash(const char *s) {
    uint64_t h = 0xCBF29CE484222325ull;
    while (*s) h = (h ^ (unsigned char)*s++) * 0x100000001B3ull;
    return h;
}

static const struct kernel *kernel_of(const struct generation *g, const char *name) {
    if (!g->nkernels || !name) return NULL;
    size_t last = g->nkernels - 1;
    for (size_t i = name_hash(name) & last, n = 0; n <= last; n++, i = (i + 1) & last) {
        if (!g->kernels[i].name) return NULL;
        if (!strcmp(g->kernels[i].name, name)) return &g->kernels[i];
    }
    return NULL;
}

/* g's table of the kernels the runtime knew at staging; 0, or -1 out of memory. The names are copied
 * into one block after the slots. */
static int set_kernels(struct generation *g, const char *const *names, const unsigned long long *masks,
                       const unsigned long long *ids, size_t n) {
    if (!n) return 0;
    size_t slots = 2, text = 0;
    while (slots < 2 * n) slots *= 2;
    for (size_t k = 0; k < n; k++) text += strlen(names[k]) + 1;
    if (!(g->kernels = calloc(1, slots * sizeof *g->kernels + text))) return -1;
    g->nkernels = slots;
    char *at = (char *)(g->kernels + slots);
    for (size_t k = 0; k < n; k++) {
        size_t i = name_hash(names[k]) & (slots - 1);
        while (g->kernels[i].name && strcmp(g->kernels[i].name, names[k])) i = (i + 1) & (slots - 1);
        size_t len = strlen(names[k]) + 1;
        memcpy(at, names[k], len);
        g->kernels[i] = (struct kernel){at, masks[k], ids[k]};
        at += len;
    }
    return 0;
}

static void free_generation(struct generation *g) {
    if (g) {
        free(g->image);
        free(g->kernels);
        free(g);
    }
}

/* ---- contexts: the images added to each, and a record ring ---- */

#define IMAGES 256 /* distinct images one context can take; a flip past it is refused */
struct context {
    CUcontext ctx;
    struct record *ring;           /* NULL until the first patch in it */
    _Atomic unsigned long long next;
    unsigned long long images[IMAGES];
    int nimages;
};
#define MAX_CONTEXTS 64
static struct context contexts[MAX_CONTEXTS];
static _Atomic int ncontexts;

/* Caller holds g_commit_mu when create. */
static struct context *context_of(CUcontext ctx, int create) {
    int n = atomic_load_explicit(&ncontexts, memory_order_acquire);
    for (int i = 0; i < n; i++)
        if (contexts[i].ctx == ctx) return &contexts[i];
    if (!create || n == MAX_CONTEXTS) return NULL;
    contexts[n].ctx = ctx;
    atomic_store_explicit(&ncontexts, n + 1, memory_order_release);
    return &contexts[n];
}

/* The context, ready for generation g's patches: its ring allocated, g's image added. Under g_commit_mu. */
static struct context *context_ready(CUcontext ctx, const struct generation *g) {
    struct context *c = context_of(ctx, 1);
    if (!c) {
        set_error("more than %d contexts", MAX_CONTEXTS);
        return NULL;
    }
    if (!c->ring && !ok(san.sanitizerAlloc(ctx, (void **)&c->ring, RING * sizeof(struct record)), "sanitizerAlloc"))
        return NULL;
    for (int i = 0; i < c->nimages; i++)
        if (c->images[i] == g->image_id) return c;
    if (!g->image) { /* a generation replaced since: only the contexts it was in can run it */
        set_error("the probes before this flip were never patched into context %p", (void *)ctx);
        return NULL;
    }
    if (c->nimages == IMAGES) {
        set_error("a context holds %d patch images already: no new probe set can be patched", IMAGES);
        return NULL;
    }
    tls_adding = 1;
    int in = ok(san.sanitizerAddPatches(g->image, ctx), "sanitizerAddPatches");
    tls_adding = 0;
    if (!in) return NULL;
    c->images[c->nimages++] = g->image_id;
    return c;
}

/* ---- modules: every one loaded (a list), and a lock-free table of the generation each runs ---- */

#define SKIPPED (~0ull) /* the PTX back end's: never patched */
#define MODULES (1u << 14)
static struct {
    _Atomic(void *) key;
    _Atomic unsigned long long runs; /* the generation id it is patched with; 0 none, or SKIPPED */
} modules[MODULES];

static _Atomic unsigned long long *module_runs(void *m, int insert) {
    __typeof__(&modules[0]) e = EGPU_TABLE_FIND(modules, m, insert);
    return e ? &e->runs : NULL;
}

static void set_runs(void *m, unsigned long long id) {
    _Atomic unsigned long long *s = module_runs(m, 1);
    if (s) atomic_store_explicit(s, id, memory_order_release);
}

/* A module the back end may patch (not the PTX back end's), in load order. */
struct loaded {
    struct loaded *next;
    CUcontext ctx;
    CUmodule module;
    struct kernel_names *kernels;  /* NULL: unknown, patched whatever they are */
    unsigned long long asked;      /* the generation Python was asked about at the load (0: none)... */
    int asked_runs;                /* ...and whether any of these kernels runs a program of it */
    int unselected;                /* left unpatched by the last commit: no kernel of it runs a program */
    const struct generation *runs; /* written under both locks */
    int pending;                   /* recorded by a load that found g_commit_mu held: not patched yet */
    int gone;                      /* unloaded: out of the list, freed once unpinned */
    int pins;                      /* holders of g_commit_mu working on it */
};
static struct loaded *g_loaded;   /* under g_list_mu */
static size_t g_nloaded;
static _Atomic int g_pending;     /* modules pending */
static _Atomic int g_domain_stale; /* a patched module unloaded: the launch domain may have to go off */

static void free_loaded(struct loaded *n) {
    free(n->kernels);
    free(n);
}

/* Under g_list_mu. */
static void unpin(struct loaded *n) {
    if (!--n->pins && n->gone) free_loaded(n);
}

static int is_gone(struct loaded *n) {
    pthread_mutex_lock(&g_list_mu);
    int gone = n->gone;
    pthread_mutex_unlock(&g_list_mu);
    return gone;
}

/* ---- a cubin's kernels: what decides whether a generation patches its module ---- */

struct kernel_names {
    size_t n;
    const char *name[]; /* into the same block, after the pointers */
};

static uint64_t rd(const unsigned char *p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* The entry functions of an ELF64 cubin (symbols of type STT_FUNC marked STO_CUDA_ENTRY, 0x10), names
 * copied; NULL when the image is no ELF64 this can read whole within `size` bytes, or out of memory. */
static struct kernel_names *cubin_kernels(const unsigned char *elf, size_t size) {
    if (!elf || size < 64 || memcmp(elf, "\x7f" "ELF\x02\x01", 6)) return NULL;
    uint64_t shoff = rd(elf + 0x28, 8), shentsize = rd(elf + 0x3A, 2), shnum = rd(elf + 0x3C, 2);
    if (shentsize < 64 || shoff > size || shnum > (size - shoff) / shentsize) return NULL;
    const unsigned char *symtab = NULL, *strtab = NULL;
    uint64_t nsyms = 0, strsize = 0;
    for (uint64_t i = 0; i < shnum && !symtab; i++) {
        const unsigned char *sh = elf + shoff + i * shentsize;
        uint64_t off = rd(sh + 0x18, 8), len = rd(sh + 0x20, 8), link = rd(sh + 0x28, 4);
        if (rd(sh + 4, 4) != 2 /* SHT_SYMTAB */ || off > size || len > size - off || link >= shnum) continue;
        const unsigned char *lh = elf + shoff + link * shentsize;
        uint64_t soff = rd(lh + 0x18, 8), slen = rd(lh + 0x20, 8);
        if (soff > size || slen > size - soff || !slen) return NULL;
        symtab = elf + off, nsyms = len / 24, strtab = elf + soff, strsize = slen;
    }
    if (!symtab) return NULL;
    size_t n = 0, text = 0;
    for (int pass = 0; pass < 2; pass++) { /* count, then copy */
        struct kernel_names *out = NULL;
        char *at = NULL;
        if (pass) {
            if (!(out = malloc(sizeof *out + n * sizeof(char *) + text))) return NULL;
            at = (char *)&out->name[n];
            out->n = 0;
        }
        for (uint64_t k = 0; k < nsyms; k++) {
            const unsigned char *sym = symtab + 24 * k;
            uint64_t name = rd(sym, 4);
            if ((sym[4] & 0xf) != 2 /* STT_FUNC */ || !(sym[5] & 0x10) || name >= strsize) continue;
            const char *s = (const char *)strtab + name;
            size_t len = strnlen(s, strsize - name);
            if (len == strsize - name) continue; /* unterminated */
            if (!pass) {
                n++, text += len + 1;
                continue;
            }
            memcpy(at, s, len + 1);
            out->name[out->n++] = at;
            at += len + 1;
        }
        if (pass) return out;
    }
    return NULL;
}

/* Whether generation g runs a program in any kernel of module n, as far as the generation's table and the
 * answer Python gave at the load tell; 1 where neither knows. Under g_commit_mu: never calls Python (a
 * thread holding the GIL may wait for g_commit_mu: fork, egpu_sass_yield). */
static int selects(const struct loaded *n, const struct generation *g) {
    if (!n->kernels) return 1;
    int unknown = 0;
    for (size_t i = 0; i < n->kernels->n; i++) {
        const struct kernel *k = kernel_of(g, n->kernels->name[i]);
        if (k && k->mask) return 1;
        unknown |= !k;
    }
    return unknown ? n->asked != g->id || n->asked_runs : 0;
}

/* At a load, before any lock: whether generation g runs a program in any kernel of n, asked of Python
 * for the kernels g's table lacks (as at a launch: the driver bypassed). */
static void ask_at_load(struct loaded *n, const struct generation *g) {
    if (!n->kernels || !g || !g->classes || !egpu_python_up()) return;
    int runs = 0;
    for (size_t i = 0; i < n->kernels->n && !runs; i++) {
        const struct kernel *k = kernel_of(g, n->kernels->name[i]);
        unsigned long long kernel_id;
        if (k) {
            runs = k->mask != 0;
            continue;
        }
        int old = egpu_shim_bypass(1);
        runs = egpu_py_sass_kernel(n->module, n->kernels->name[i], g->id, &kernel_id) != 0; /* or unknown */
        egpu_shim_bypass(old);
    }
    n->asked = g->id, n->asked_runs = runs;
}

/* ---- functions: what Python said about each (a generation per unload or flip, handles get reused) ---- */

struct function {
    unsigned long long kernel_id, mask, start;
    unsigned long long patches;   /* the generation whose programs `mask` names */
    unsigned int generation;      /* g_generation when asked: unloads and flips make it stale */
};
#define FUNCTIONS (1u << 14)
static struct {
    _Atomic(void *) key;
    _Atomic(const struct function *) info;
} functions[FUNCTIONS];
static _Atomic unsigned int g_generation;

static const struct function *function_of(const san_launch_data *ld, const struct generation *g) {
    __typeof__(&functions[0]) e = EGPU_TABLE_FIND(functions, ld->function, 1);
    if (!e) return NULL;
    unsigned int gen = atomic_load_explicit(&g_generation, memory_order_acquire);
    const struct function *info = atomic_load_explicit(&e->info, memory_order_acquire);
    if (info && info->generation == gen && info->patches == g->id) return info;
    struct function *fresh = calloc(1, sizeof *fresh);
    if (!fresh) return NULL;
    fresh->generation = gen, fresh->patches = g->id;
    const struct kernel *k = kernel_of(g, ld->functionName);
    if (!egpu_python_up()) { /* no probes: the interpreter is finalized (egpu_shim_python_gone) */
    } else if (k) { /* known at staging: no call into Python on the launch path after a flip */
        fresh->mask = k->mask;
        fresh->kernel_id = k->kernel_id;
    } else {
        atomic_fetch_add_explicit(&g_stats.asked, 1, memory_order_relaxed);
        int old = egpu_shim_bypass(1); /* Python must not reach the driver from here; hooks pass through */
        fresh->mask = egpu_py_sass_kernel(ld->module, ld->functionName ? ld->functionName : "", g->id,
                                          &fresh->kernel_id);
        egpu_shim_bypass(old);
        if (fresh->mask == SASS_UNKNOWN) fresh->mask = 0;
    }
    uint64_t pc = 0, size = 0;
    if (fresh->mask && ld->functionName &&
        ok(san.sanitizerGetFunctionPcAndSize(ld->module, ld->functionName, &pc, &size),
           "sanitizerGetFunctionPcAndSize"))
        fresh->start = pc;
    /* The one replaced is not freed: another launch may still read it. */
    atomic_store_explicit(&e->info, fresh, memory_order_release);
    return fresh;
}

/* ---- patching (under g_commit_mu) ---- */

/* Launch callbacks only while a module is patched: with them on, every launch of the process pays
 * the sanitizer's callback (PyTorch eager's step 1.15x with no module patched, 2026-12-02). */
static void launch_domain(int on) {
    if (on != g_launches_on && ok(san.sanitizerEnableDomain(on, g_subscriber, SAN_DOMAIN_LAUNCH),
                                  "sanitizerEnableDomain"))
        g_launches_on = on;
}

static void set_loaded(struct loaded *n, const struct generation *g) {
    pthread_mutex_lock(&g_list_mu);
    n->runs = g;
    if (!n->gone) set_runs(n->module, g ? g->id : 0);
    pthread_mutex_unlock(&g_list_mu);
}

/* Module n (pinned) made to run generation g's patches (NULL or no classes: none). Unpatched first
 * whenever it was patched: the API does not replace a patch. */
static int repatch(struct loaded *n, const struct generation *g) {
    if (n->runs) {
        if (!ok(san.sanitizerUnpatchModule(n->module), "sanitizerUnpatchModule")) return 0;
        set_loaded(n, NULL);
    }
    int skip = g && g->classes && !selects(n, g);
    pthread_mutex_lock(&g_list_mu);
    n->unselected = skip;
    pthread_mutex_unlock(&g_list_mu);
    if (!g || !g->classes || skip) return 1;
    if (!context_ready(n->ctx, g)) return 0;
    for (int id = 1; id < CLASSES; id++)
        if ((g->classes >> id & 1) && !ok(san.sanitizerPatchInstructions(id, n->module, g->entry[id]),
                                          "sanitizerPatchInstructions"))
            return 0;
    if (!ok(san.sanitizerPatchModule(n->module), "sanitizerPatchModule")) return 0;
    set_loaded(n, g);
    atomic_fetch_add(&g_stats.modules_patched, 1);
    launch_domain(1);
    return 1;
}

/* The launch domain on while any module is patched, off otherwise (a commit may leave none patched: a
 * probe whose kernels are not loaded). Under g_commit_mu. */
static void launch_domain_as_patched(void) {
    int any = 0;
    pthread_mutex_lock(&g_list_mu);
    for (struct loaded *n = g_loaded; n && !any; n = n->next) any = n->runs != NULL;
    pthread_mutex_unlock(&g_list_mu);
    launch_domain(any);
}

static unsigned long long micros(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000 + (unsigned long long)t.tv_nsec / 1000;
}

/* Patch every pending module with the current generation. */
static void settle(void) {
    for (;;) {
        pthread_mutex_lock(&g_list_mu);
        struct loaded *n = g_loaded;
        while (n && !n->pending) n = n->next;
        if (n) {
            n->pending = 0, n->pins++;
            atomic_fetch_sub(&g_pending, 1);
        }
        pthread_mutex_unlock(&g_list_mu);
        if (!n) return;
        repatch(n, atomic_load(&g_current)); /* a failure: this module runs no probe, the error is kept */
        pthread_mutex_lock(&g_list_mu);
        unpin(n);
        pthread_mutex_unlock(&g_list_mu);
    }
}

/* Let go of g_commit_mu with no module left pending: a load that found it held after the last settle is
 * settled here, unless another thread holds it by then (that one does). The fences pair with
 * module_loaded's: either its trylock sees the lock free, or this sees its module pending. */
static void commit_unlock(void) {
    for (;;) {
        settle();
        if (atomic_exchange(&g_domain_stale, 0)) launch_domain_as_patched();
        pthread_mutex_unlock(&g_commit_mu);
        atomic_thread_fence(memory_order_seq_cst);
        if ((!atomic_load(&g_pending) && !atomic_load(&g_domain_stale)) || pthread_mutex_trylock(&g_commit_mu))
            return;
    }
}

/* Every module to generation g (staged, now owned here), or, should one fail, every module back to the
 * current one (the one that failed included: repatch unpatches first). Modules loaded meanwhile are
 * pending: settled after, with whichever generation stands. 0, or -1 with g_error saying why. */
static int commit(struct generation *g) {
    struct generation *old = atomic_load(&g_current);
    unsigned long long t0 = micros();
    pthread_mutex_lock(&g_list_mu);
    size_t count = g_nloaded, reached = 0;
    struct loaded **nodes = malloc((count ? count : 1) * sizeof *nodes);
    for (struct loaded *n = g_loaded; nodes && n; n = n->next) {
        nodes[reached++] = n;
        n->pins++;
        if (n->pending) { /* this commit patches it */
            n->pending = 0;
            atomic_fetch_sub(&g_pending, 1);
        }
    }
    pthread_mutex_unlock(&g_list_mu);
    if (!nodes) {
        set_error("out of memory listing %zu modules", count);
        free_generation(g);
        return -1;
    }
    count = reached, reached = 0;
    /* a module unloaded meanwhile fails its calls: that is no reason to refuse the flip */
    while (reached < count && (repatch(nodes[reached], g) || is_gone(nodes[reached]))) reached++;
    int r = 0;
    if (reached < count) {
        char why[sizeof g_error];
        pthread_mutex_lock(&g_err_mu);
        memcpy(why, g_error, sizeof why);
        pthread_mutex_unlock(&g_err_mu);
        const struct generation *back = old && old->classes ? old : NULL;
        size_t lost = 0; /* the modules reached, and those pending when it began */
        for (size_t i = 0; i < count; i++)
            if (nodes[i]->runs != back) lost += !repatch(nodes[i], back) && !is_gone(nodes[i]);
        launch_domain_as_patched();
        if (lost) set_error("%s; putting the probes before it back failed too: %zu modules run no probe", why, lost);
        else set_error("%s; the probes before it go on running", why);
        free_generation(g);
        r = -1;
    } else {
        atomic_store_explicit(&g_current, g, memory_order_release);
        /* A generation that counts turns the counting on (unless it ended); none turns it off, as the PTX back
         * end's modules may count: a flip ends it (egpu_shim_swap), for both back ends at once. */
        if (g->evaluates) egpu_shim_eval(1);
        atomic_fetch_add(&g_generation, 1); /* every function's programs asked again */
        atomic_fetch_add(&g_stats.flips, 1);
        launch_domain_as_patched(); /* off in standby, or when no kernel of any module runs a program */
        if (old) { /* no context it is not in yet needs it now */
            free(old->image);
            old->image = NULL;
        }
        atomic_store(&g_flip_us, micros() - t0);
    }
    pthread_mutex_lock(&g_list_mu);
    for (size_t i = 0; i < count; i++) unpin(nodes[i]);
    pthread_mutex_unlock(&g_list_mu);
    free(nodes);
    return r;
}

static struct generation *take_staged(void) {
    pthread_mutex_lock(&g_list_mu);
    struct generation *g = g_staged;
    g_staged = NULL;
    pthread_mutex_unlock(&g_list_mu);
    return g;
}

/* Whether a cubin's kernels launch kernels themselves (dynamic parallelism, device graph launches: its
 * device runtime's entry points are named in it). Such launches pass no hook, so launches stop counting
 * evaluated programs (egpu_shim_eval_device_launches). */
static int launches_on_device(const void *cubin, size_t size) {
    static const char *const names[] = {"cudaLaunchDevice", "cudaGetParameterBuffer", "cudaGraphLaunch"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (memmem(cubin, size, names[i], strlen(names[i]))) return 1;
    return 0;
}

static void module_loaded(const san_module_data *d) {
    atomic_fetch_add(&g_stats.modules_seen, 1);
    if (tls_adding) return;
    if (d->pCubin && memmem(d->pCubin, d->cubinSize, MARKER, sizeof MARKER - 1)) {
        set_runs(d->module, SKIPPED);
        atomic_fetch_add(&g_stats.modules_skipped, 1);
        return;
    }
    struct loaded *n = calloc(1, sizeof *n);
    if (!n) {
        set_error("out of memory recording module %zu", g_nloaded);
        return;
    }
    n->ctx = d->context, n->module = d->module, n->pending = 1;
    n->kernels = cubin_kernels((const unsigned char *)d->pCubin, d->cubinSize);
    if (d->pCubin && launches_on_device(d->pCubin, d->cubinSize)) egpu_shim_eval_device_launches();
    ask_at_load(n, atomic_load(&g_current));
    pthread_mutex_lock(&g_list_mu);
    struct loaded **at = &g_loaded;
    while (*at) at = &(*at)->next;
    *at = n;
    g_nloaded++;
    atomic_fetch_add(&g_pending, 1);
    pthread_mutex_unlock(&g_list_mu);
    atomic_thread_fence(memory_order_seq_cst);
    if (pthread_mutex_trylock(&g_commit_mu) == 0) commit_unlock(); /* never waited for: see Locks */
}

static void module_unloading(const san_module_data *d) {
    pthread_mutex_lock(&g_list_mu);
    for (struct loaded **at = &g_loaded; *at; at = &(*at)->next)
        if ((*at)->module == d->module) {
            struct loaded *n = *at;
            *at = n->next;
            g_nloaded--;
            if (n->pending) atomic_fetch_sub(&g_pending, 1);
            n->gone = 1, n->pending = 0;
            if (n->runs) atomic_store(&g_domain_stale, 1); /* egpu_sass_unloaded, after the unload */
            if (!n->pins) free_loaded(n);
            break;
        }
    _Atomic unsigned long long *s = module_runs(d->module, 0);
    if (s) atomic_store(s, 0); /* so no commit marks the handle patched again after this: set_loaded */
    pthread_mutex_unlock(&g_list_mu);
    atomic_fetch_add(&g_generation, 1);
}

/* Launch callbacks off once the last patched module is gone, from the thread that unloaded it, after
 * the driver's unload returned: not from the unload callback, inside the driver's unload. A commit
 * under way does it as it lets go (commit_unlock). */
void egpu_sass_unloaded(void) {
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load(&g_domain_stale) && pthread_mutex_trylock(&g_commit_mu) == 0) commit_unlock();
}

static void launch_begin(const san_launch_data *ld) {
    unsigned long long launch_id = egpu_sass_launch_id; /* this launch's, set by the shim's hook */
    egpu_sass_launch_id = 0;                             /* never a later, unhooked launch's */
    _Atomic unsigned long long *s = module_runs(ld->module, 0);
    unsigned long long runs = s ? atomic_load_explicit(s, memory_order_acquire) : 0;
    if (!runs || runs == SKIPPED) return;
    atomic_fetch_add_explicit(&g_stats.launches, 1, memory_order_relaxed);
    CUcontext maps = atomic_load_explicit(&g_maps_ctx, memory_order_acquire);
    if (maps && ld->context != maps) { /* its kernels cannot reach the tables: egpu_sass_maps_context */
        atomic_fetch_add_explicit(&g_stats.other_context, 1, memory_order_relaxed);
        return;
    }
    /* A record only for the generation its module's patches are: no launch runs one generation's
     * patch with another's programs (a module patched by a load during a flip: pending, then settled). */
    const struct generation *g = atomic_load_explicit(&g_current, memory_order_acquire);
    if (!g || g->id != runs) return;
    unsigned long long tables = atomic_load_explicit(&((struct generation *)g)->tables, memory_order_acquire);
    const struct function *f = function_of(ld, g);
    struct context *c = context_of(ld->context, 0);
    if (!f || !f->mask || !tables || !c || !c->ring) return;
    unsigned long long slot = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed) % RING;
    struct record r = {f->kernel_id, launch_id, f->start, f->mask, tables, g->id,
                       (unsigned long long)(uintptr_t)ld->hStream, 0};
    /* Stream-ordered before the kernel, which is not enqueued yet at LAUNCH_BEGIN; the sanitizer stages
     * the pageable source before returning. */
    if (ok(san.sanitizerMemcpyHostToDeviceAsync(c->ring + slot, &r, sizeof r, ld->hStream),
           "sanitizerMemcpyHostToDeviceAsync") &&
        ok(san.sanitizerSetLaunchCallbackData(ld->hLaunch, ld->function, ld->hStream, c->ring + slot),
           "sanitizerSetLaunchCallbackData"))
        atomic_fetch_add_explicit(&g_stats.probed, 1, memory_order_relaxed);
}

static void on_callback(void *userdata, int domain, uint32_t cbid, const void *data) {
    (void)userdata;
    if (domain == SAN_DOMAIN_RESOURCE && cbid == SAN_CBID_MODULE_LOADED) module_loaded(data);
    else if (domain == SAN_DOMAIN_RESOURCE && cbid == SAN_CBID_MODULE_UNLOAD_STARTING) module_unloading(data);
    else if (domain == SAN_DOMAIN_LAUNCH && cbid == SAN_CBID_LAUNCH_BEGIN) launch_begin(data);
}

/* ---- start, generations, statistics ---- */

static void fail(const char *what, const char *detail) {
    set_error("%s%s", what, detail ? detail : "");
    atomic_store(&g_state, -1);
}

/* Standby needs only the module loads and unloads, not the whole resource domain: its stream, memory
 * and context callbacks would run on the job's allocations and stream work for nothing. */
static int enable_module_callbacks(void) {
    return ok(san.sanitizerEnableCallback(1, g_subscriber, SAN_DOMAIN_RESOURCE, SAN_CBID_MODULE_LOADED),
              "sanitizerEnableCallback") &&
           ok(san.sanitizerEnableCallback(1, g_subscriber, SAN_DOMAIN_RESOURCE, SAN_CBID_MODULE_UNLOAD_STARTING),
              "sanitizerEnableCallback");
}

void egpu_sass_start(void) {
    int expect = 0;
    if (!atomic_compare_exchange_strong(&g_state, &expect, 1)) return; /* started, or starting here */
    const char *backend = getenv("EGPU_BACKEND");
    if (!backend || (strcmp(backend, "sass") && strcmp(backend, "auto"))) {
        atomic_store(&g_state, 3);
        return;
    }
    int old = egpu_shim_bypass(1); /* the sanitizer's own driver lookups and calls pass straight through */
    const char *path = getenv("EGPU_SANITIZER_LIB");
    void *h = dlopen(path && *path ? path : DEFAULT_LIB, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fail("cannot load the sanitizer: ", dlerror());
    } else {
        const char *missing = NULL;
#define X(name, params) if (!(san.name = (SanitizerResult(*) params)dlsym(h, #name)) && !missing) missing = #name;
        SAN_FNS(X)
#undef X
        if (missing) fail("the sanitizer library lacks ", missing);
        else if (!ok(san.sanitizerSubscribe(&g_subscriber, on_callback, NULL), "sanitizerSubscribe") ||
                 !enable_module_callbacks())
            atomic_store(&g_state, -1); /* ok() wrote the error */
        else
            atomic_store(&g_state, 2);
    }
    egpu_shim_bypass(old);
}

__attribute__((visibility("default"))) int egpu_sass_stage(const struct egpu_sass_generation *in) {
    if (atomic_load(&g_state) != 2 || (in->classes && (!in->image || !in->size))) return -1;
    struct generation *g = calloc(1, sizeof *g);
    if (!g || (in->classes && !(g->image = malloc(in->size))) ||
        set_kernels(g, in->names, in->masks, in->kernel_ids, in->nkernels)) {
        free_generation(g);
        return -1;
    }
    if (in->classes) memcpy(g->image, in->image, in->size);
    g->id = in->id, g->classes = in->classes, g->image_id = in->image_id, g->evaluates = in->evaluates;
    atomic_store(&g->tables, in->tables);
    for (int k = 1; k < CLASSES; k++)
        if (in->classes >> k & 1)
            snprintf(g->entry[k], sizeof g->entry[k], "%s", in->entries[k] ? in->entries[k] : "");
    pthread_mutex_lock(&g_list_mu);
    struct generation *replaced = g_staged;
    g_staged = g;
    pthread_mutex_unlock(&g_list_mu);
    free_generation(replaced);
    return 0;
}

__attribute__((visibility("default"))) void egpu_sass_unstage(void) { free_generation(take_staged()); }

__attribute__((visibility("default"))) int egpu_sass_commit_now(void) {
    pthread_mutex_lock(&g_commit_mu);
    int r = -1, patched = 0;
    pthread_mutex_lock(&g_list_mu);
    for (struct loaded *n = g_loaded; n; n = n->next) patched |= n->runs != NULL;
    int staged = g_staged != NULL;
    pthread_mutex_unlock(&g_list_mu);
    if (!staged) set_error("no generation staged");
    else if (patched) set_error("modules are patched: a new generation needs a flip");
    else r = commit(take_staged());
    commit_unlock();
    return r;
}

/* The driver lends one tool slot: while the sanitizer holds it, CUPTI's activity and callback APIs
 * fail with CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED (39; on the H200, --durations timed nothing
 * and torch.profiler saw no kernel in a job in standby). Standby patches nothing, so it gives the slot
 * to the first CUPTI client (cupti.c); a generation that patches keeps it. */
int egpu_sass_holds_slot(void) { return atomic_load(&g_state) == 2; }

__attribute__((visibility("default"))) int egpu_sass_yield(const char *to) {
    pthread_mutex_lock(&g_commit_mu); /* a sanitizer call, as patching ones: see Locks */
    pthread_mutex_lock(&g_list_mu);
    int staged = g_staged != NULL;
    pthread_mutex_unlock(&g_list_mu);
    const struct generation *g = atomic_load(&g_current);
    int r = 0;
    if (atomic_load(&g_state) != 2) {
        r = 0;
    } else if ((g && g->classes) || staged) {
        r = -1;
    } else if (ok(san.sanitizerUnsubscribe(g_subscriber), "sanitizerUnsubscribe")) {
        g_launches_on = 0;
        set_error("%s took the driver's tool slot: SASS-only kernels cannot be probed in this job", to);
        atomic_store(&g_state, 4);
    } else {
        r = -1;
    }
    commit_unlock();
    return r;
}

/* Inside egpu_shim_swap's hold, after the maps context drained: drain the others, then commit. */
int egpu_sass_flip(void) {
    pthread_mutex_lock(&g_list_mu);
    int staged = g_staged != NULL;
    pthread_mutex_unlock(&g_list_mu);
    if (!staged) return 0;
    typedef CUresult (*pfn_push)(CUcontext);
    typedef CUresult (*pfn_pop)(CUcontext *);
    typedef CUresult (*pfn_sync)(void);
    pfn_push push = (pfn_push)egpu_shim_real("cuCtxPushCurrent_v2");
    pfn_pop pop = (pfn_pop)egpu_shim_real("cuCtxPopCurrent_v2");
    pfn_sync sync = (pfn_sync)egpu_shim_real("cuCtxSynchronize");
    unsigned long long t0 = micros();
    int n = atomic_load_explicit(&ncontexts, memory_order_acquire);
    for (int i = 0; i < n; i++) { /* unpatching code a kernel still runs would pull it from under it */
        CUcontext popped;
        if (!push || !pop || !sync || push(contexts[i].ctx) != 0) continue;
        CUresult r = sync();
        pop(&popped);
        if (r != 0) {
            set_error("cuCtxSynchronize before re-patching failed: %d", (int)r);
            egpu_sass_unstage();
            return -1;
        }
    }
    atomic_store(&g_drain_us, micros() - t0);
    pthread_mutex_lock(&g_commit_mu);
    struct generation *g = take_staged();
    int r = g ? commit(g) : 0;
    commit_unlock();
    return r;
}

__attribute__((visibility("default"))) size_t egpu_sass_kernel_names(char *out, size_t size) {
    size_t need = 0;
    pthread_mutex_lock(&g_list_mu);
    for (struct loaded *n = g_loaded; n; n = n->next)
        for (size_t i = 0; n->kernels && i < n->kernels->n; i++) {
            size_t len = strlen(n->kernels->name[i]) + 1;
            if (out && need + len <= size) memcpy(out + need, n->kernels->name[i], len);
            need += len;
        }
    pthread_mutex_unlock(&g_list_mu);
    return need;
}

__attribute__((visibility("default"))) void egpu_sass_tables(unsigned long long tables) {
    struct generation *g = atomic_load_explicit(&g_current, memory_order_acquire);
    if (g) atomic_store_explicit(&g->tables, tables, memory_order_release);
}

void *egpu_sass_maps_ctx(void) { return atomic_load_explicit(&g_maps_ctx, memory_order_acquire); }

__attribute__((visibility("default"))) void egpu_sass_maps_context(void *ctx) {
    atomic_store_explicit(&g_maps_ctx, (CUcontext)ctx, memory_order_release);
}

__attribute__((visibility("default"))) void egpu_sass_stats(struct egpu_sass_stats *out) {
    int state = atomic_load(&g_state);
    out->state = state == 1 ? 0 : state;
    out->modules_seen = atomic_load(&g_stats.modules_seen);
    out->modules_patched = atomic_load(&g_stats.modules_patched);
    out->modules_skipped = atomic_load(&g_stats.modules_skipped);
    out->launches = atomic_load(&g_stats.launches);
    out->probed = atomic_load(&g_stats.probed);
    out->errors = atomic_load(&g_stats.errors);
    out->flips = atomic_load(&g_stats.flips);
    out->asked = atomic_load(&g_stats.asked);
    out->other_context = atomic_load(&g_stats.other_context);
    out->flip_us = atomic_load(&g_flip_us);
    out->drain_us = atomic_load(&g_drain_us);
    struct generation *g = atomic_load(&g_current);
    out->generation = g ? g->id : 0;
    pthread_mutex_lock(&g_list_mu);
    out->modules_loaded = g_nloaded;
    out->patched_now = out->modules_unselected = 0;
    for (struct loaded *n = g_loaded; n; n = n->next) {
        out->patched_now += n->runs != NULL;
        out->modules_unselected += !n->runs && n->unselected;
    }
    pthread_mutex_unlock(&g_list_mu);
    pthread_mutex_lock(&g_err_mu);
    memcpy(out->error, g_error, sizeof out->error);
    pthread_mutex_unlock(&g_err_mu);
    out->error[sizeof out->error - 1] = 0;
}

/* ---- fork (process.c): its locks taken across it, made new in the child. The child keeps the
 * parent's generations and module list: the sanitizer's state came with the copy of the process. */

void egpu_sass_fork(enum egpu_fork_phase phase) {
    if (phase == EGPU_FORK_PREPARE) {
        pthread_mutex_lock(&g_commit_mu);
        pthread_mutex_lock(&g_list_mu);
        pthread_mutex_lock(&g_err_mu);
        return;
    }
    if (phase == EGPU_FORK_PARENT) {
        pthread_mutex_unlock(&g_err_mu);
        pthread_mutex_unlock(&g_list_mu);
        pthread_mutex_unlock(&g_commit_mu);
        return;
    }
    pthread_mutex_init(&g_err_mu, NULL);
    pthread_mutex_init(&g_list_mu, NULL);
    pthread_mutex_init(&g_commit_mu, NULL);
}
