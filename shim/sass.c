/* sass.c: the SASS back end in libegpu_shim.so, through NVIDIA's Compute Sanitizer patching API.
 *
 * - egpu_sass_start (the cuInit hook, before the driver starts; EGPU_BACKEND sass|auto) dlopens
 *   libsanitizer-public.so (EGPU_SANITIZER_LIB), subscribes and enables the resource domain; the launch
 *   domain is enabled when the first module is patched.
 * - MODULE_LOADED: a module the PTX back end did not instrument (its cubin has no "__egpu_maps_" table)
 *   is patched: the patch image goes into its context once (sanitizerAddPatches), then every configured
 *   instruction class is patched (sanitizerPatchInstructions + sanitizerPatchModule). Modules loaded
 *   before the runtime configured the image wait in a list and are patched by egpu_sass_configure.
 * - LAUNCH_BEGIN of a patched module's kernel: the function's programs (asked from Python once per
 *   function) decide; with any, a launch record (sass_patch.Record) is copied into a per-context ring
 *   on the launch's stream, before the kernel, and given to the launch as its callback data
 *   (sanitizerSetLaunchCallbackData). Without, nothing: the patches see NULL and return.
 *
 * The sanitizer's types and functions are declared here, not taken from its headers, so the shim
 * builds without them; tests/test_sass_gpu.py checks them against the real headers.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    X(sanitizerEnableDomain, (uint32_t enable, Sanitizer_SubscriberHandle subscriber, int domain)) \
    X(sanitizerAddPatches, (const void *image, CUcontext ctx)) \
    X(sanitizerPatchInstructions, (int instructionId, CUmodule module, const char *deviceCallbackName)) \
    X(sanitizerPatchModule, (CUmodule module)) \
    X(sanitizerAlloc, (CUcontext ctx, void **devPtr, size_t size)) \
    X(sanitizerMemcpyHostToDeviceAsync, (void *dst, void *src, size_t count, Sanitizer_StreamHandle stream)) \
    X(sanitizerSetLaunchCallbackData, (Sanitizer_LaunchHandle launch, CUfunction kernel, Sanitizer_StreamHandle stream, const void *userdata)) \
    X(sanitizerGetFunctionPcAndSize, (CUmodule module, const char *functionName, uint64_t *pc, uint64_t *size)) \
    X(sanitizerGetResultString, (SanitizerResult result, const char **str))

static struct {
#define X(name, params) SanitizerResult (*name) params;
    SAN_FNS(X)
#undef X
} san;

#define DEFAULT_LIB "/usr/local/cuda/compute-sanitizer/libsanitizer-public.so"
#define MARKER "__egpu_maps_" /* translate/module.py table_symbol: the PTX back end's modules */
/* sass_patch.py's entry points, by Sanitizer_InstructionId */
static const char *const ENTRY[4] = {NULL, "egpu_sass_block_enter", "egpu_sass_block_exit",
                                     "egpu_sass_global_access"};

/* sass_patch.Record, padded to 64 bytes */
struct record {
    unsigned long long kernel_id, launch_id, start, mask, tables, pad[3];
};
#define RING 4096 /* records per context: a slot is reused after RING later launches in that context */

__thread unsigned long long egpu_sass_launch_id;

static _Atomic int g_state;
static struct {
    _Atomic unsigned long long modules_seen, modules_patched, modules_skipped, launches, probed, errors;
} g_stats;
static char g_error[256];
static Sanitizer_SubscriberHandle g_subscriber;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; /* configuration, contexts, pending modules */
static void *g_image;
static unsigned int g_classes;
static _Atomic unsigned long long g_tables;
static __thread int tls_adding; /* our own sanitizerAddPatches: its module is the patch image */
static int g_launches_on;        /* the launch domain is enabled (under g_mu) */

static int ok(SanitizerResult r, const char *call) {
    if (r == 0) return 1;
    if (atomic_fetch_add(&g_stats.errors, 1) == 0) {
        const char *s = NULL;
        if (!san.sanitizerGetResultString || san.sanitizerGetResultString(r, &s) != 0) s = "?";
        snprintf(g_error, sizeof g_error, "%s failed: %d (%s)", call, r, s ? s : "?");
    }
    return 0;
}

/* ---- contexts: the patch image and a record ring in each ---- */

struct context {
    CUcontext ctx;
    int loaded; /* 1 image in, -1 it failed */
    struct record *ring;
    _Atomic unsigned long long next;
};
#define MAX_CONTEXTS 64
static struct context contexts[MAX_CONTEXTS];
static _Atomic int ncontexts;

/* Caller holds g_mu when create. */
static struct context *context_of(CUcontext ctx, int create) {
    int n = atomic_load_explicit(&ncontexts, memory_order_acquire);
    for (int i = 0; i < n; i++)
        if (contexts[i].ctx == ctx) return &contexts[i];
    if (!create || n == MAX_CONTEXTS) return NULL;
    contexts[n].ctx = ctx;
    atomic_store_explicit(&ncontexts, n + 1, memory_order_release);
    return &contexts[n];
}

/* ---- modules: patched or not (insert-only open addressing; unloads reset the state) ---- */

enum { MOD_UNKNOWN, MOD_PATCHED, MOD_SKIPPED };
#define MODULES (1u << 14)
static struct {
    _Atomic(void *) key;
    _Atomic int state;
} modules[MODULES];

static _Atomic int *module_state(void *m, int insert) {
    __typeof__(&modules[0]) e = EGPU_TABLE_FIND(modules, m, insert);
    return e ? &e->state : NULL;
}

static void set_module(void *m, int state) {
    _Atomic int *s = module_state(m, 1);
    if (s) atomic_store_explicit(s, state, memory_order_release);
}

/* ---- functions: what Python said about each (a generation per unload, handles get reused) ---- */

struct function {
    unsigned long long kernel_id, mask, start;
    unsigned int generation;
};
#define FUNCTIONS (1u << 14)
static struct {
    _Atomic(void *) key;
    _Atomic(const struct function *) info;
} functions[FUNCTIONS];
static _Atomic unsigned int g_generation;

static const struct function *function_of(const san_launch_data *ld) {
    __typeof__(&functions[0]) e = EGPU_TABLE_FIND(functions, ld->function, 1);
    if (!e) return NULL;
    unsigned int gen = atomic_load_explicit(&g_generation, memory_order_acquire);
    const struct function *info = atomic_load_explicit(&e->info, memory_order_acquire);
    if (info && info->generation == gen) return info;
    struct function *fresh = calloc(1, sizeof *fresh);
    if (!fresh) return NULL;
    fresh->generation = gen;
    if (egpu_python_up()) { /* else no probes: the interpreter is finalized (egpu_shim_python_gone) */
        int old = egpu_shim_bypass(1); /* Python must not reach the driver from here; hooks pass through */
        fresh->mask = egpu_py_sass_kernel(ld->module, ld->functionName ? ld->functionName : "",
                                          &fresh->kernel_id);
        egpu_shim_bypass(old);
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

/* ---- patching ---- */

#define PENDING 1024
static struct { CUcontext ctx; CUmodule module; } pending[PENDING];
static int npending;

/* Caller holds g_mu and has configured the image. */
static void patch(CUcontext ctx, CUmodule module) {
    struct context *c = context_of(ctx, 1);
    if (!c) return;
    if (!c->loaded) {
        tls_adding = 1;
        int in = ok(san.sanitizerAddPatches(g_image, ctx), "sanitizerAddPatches");
        tls_adding = 0;
        c->loaded = in && ok(san.sanitizerAlloc(ctx, (void **)&c->ring, RING * sizeof(struct record)),
                             "sanitizerAlloc") ? 1 : -1;
    }
    if (c->loaded != 1) return;
    for (int id = 1; id <= 3; id++)
        if ((g_classes >> id & 1) && !ok(san.sanitizerPatchInstructions(id, module, ENTRY[id]),
                                         "sanitizerPatchInstructions"))
            return;
    if (!ok(san.sanitizerPatchModule(module), "sanitizerPatchModule")) return;
    /* Launch callbacks from the first patched module on: with them on, every launch of the process
     * pays the sanitizer's callback (PyTorch eager's step 1.15x with no module patched, 2026-12-02). */
    if (!g_launches_on && ok(san.sanitizerEnableDomain(1, g_subscriber, SAN_DOMAIN_LAUNCH), "sanitizerEnableDomain"))
        g_launches_on = 1;
    set_module(module, MOD_PATCHED);
    atomic_fetch_add(&g_stats.modules_patched, 1);
}

static void module_loaded(const san_module_data *d) {
    atomic_fetch_add(&g_stats.modules_seen, 1);
    if (tls_adding) return;
    if (d->pCubin && memmem(d->pCubin, d->cubinSize, MARKER, sizeof MARKER - 1)) {
        set_module(d->module, MOD_SKIPPED);
        atomic_fetch_add(&g_stats.modules_skipped, 1);
        return;
    }
    pthread_mutex_lock(&g_mu);
    if (g_image) patch(d->context, d->module);
    else if (npending < PENDING) pending[npending++] = (typeof(pending[0])){d->context, d->module};
    pthread_mutex_unlock(&g_mu);
}

static void module_unloading(const san_module_data *d) {
    _Atomic int *s = module_state(d->module, 0);
    if (s) atomic_store(s, MOD_UNKNOWN);
    atomic_fetch_add(&g_generation, 1);
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < npending; i++)
        if (pending[i].module == d->module) pending[i] = pending[--npending];
    pthread_mutex_unlock(&g_mu);
}

static void launch_begin(const san_launch_data *ld) {
    _Atomic int *s = module_state(ld->module, 0);
    if (!s || atomic_load_explicit(s, memory_order_acquire) != MOD_PATCHED) return;
    atomic_fetch_add_explicit(&g_stats.launches, 1, memory_order_relaxed);
    unsigned long long tables = atomic_load_explicit(&g_tables, memory_order_acquire);
    const struct function *f = function_of(ld);
    struct context *c = context_of(ld->context, 0);
    if (!f || !f->mask || !tables || !c || c->loaded != 1) return;
    unsigned long long slot = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed) % RING;
    struct record r = {f->kernel_id, egpu_sass_launch_id, f->start, f->mask, tables, {0, 0, 0}};
    egpu_sass_launch_id = 0;
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

/* ---- start, configuration, statistics ---- */

static void fail(const char *what, const char *detail) {
    snprintf(g_error, sizeof g_error, "%s%s%s", what, detail ? ": " : "", detail ? detail : "");
    atomic_store(&g_state, -1);
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
        fail("cannot load the sanitizer", dlerror());
    } else {
        const char *missing = NULL;
#define X(name, params) if (!(san.name = (SanitizerResult(*) params)dlsym(h, #name)) && !missing) missing = #name;
        SAN_FNS(X)
#undef X
        if (missing) fail("the sanitizer library lacks", missing);
        else if (!ok(san.sanitizerSubscribe(&g_subscriber, on_callback, NULL), "sanitizerSubscribe") ||
                 !ok(san.sanitizerEnableDomain(1, g_subscriber, SAN_DOMAIN_RESOURCE), "sanitizerEnableDomain"))
            atomic_store(&g_state, -1); /* ok() wrote the error */
        else
            atomic_store(&g_state, 2);
    }
    egpu_shim_bypass(old);
}

__attribute__((visibility("default"))) int egpu_sass_configure(const void *image, size_t size,
                                                               unsigned int classes) {
    if (atomic_load(&g_state) != 2 || !image || !size) return -1;
    pthread_mutex_lock(&g_mu);
    int r = -1;
    if (!g_image && (g_image = malloc(size))) {
        memcpy(g_image, image, size);
        g_classes = classes;
        for (int i = 0; i < npending; i++) patch(pending[i].ctx, pending[i].module);
        npending = 0;
        r = 0;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

__attribute__((visibility("default"))) void egpu_sass_tables(unsigned long long tables) {
    atomic_store_explicit(&g_tables, tables, memory_order_release);
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
    memcpy(out->error, g_error, sizeof out->error);
    out->error[sizeof out->error - 1] = 0;
}
