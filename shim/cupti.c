/* cupti.c: CUPTI clients get the driver's tool slot from the SASS back end's standby.
 *
 * The driver lends one tool slot, and a job in standby (sass.c) holds it from cuInit on, so every
 * CUPTI client in the job (torch.profiler's kineto, egpu-run --durations, a profiler the application
 * brings) would fail with CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED. The calls that take the slot
 * are wrapped: a program linked to libcupti reaches the exported ones here (the preload comes first),
 * one that dlsyms them (ctypes, dlopen'ed CUPTI) is handed them by the dlsym hook. Each asks the SASS
 * back end to yield before the real call; a generation that patches keeps the slot, and CUPTI then
 * fails as it would have. A job not in standby gets dlsym's answer unchanged, and its linked callers
 * reach their own libcupti (real_for): one loaded by an RTLD_LOCAL dlopen (torch's kineto, a dependency
 * of a Python extension) is in no global scope, and a job may hold two copies of libcupti.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <string.h>

#include "egpu_shim.h"
#include "egpu_sass.h"

#define EXPORT __attribute__((visibility("default")))
#define CUPTI_ERROR_NOT_INITIALIZED 15

typedef int CUptiResult;

#define CUPTI_FNS(X)                                                                  \
    X(cuptiSubscribe, (void *subscriber, void *callback, void *userdata), (subscriber, callback, userdata)) \
    X(cuptiActivityRegisterCallbacks, (void *requested, void *completed), (requested, completed))        \
    X(cuptiActivityEnable, (int kind), (kind))                                        \
    X(cuptiActivityEnableContext, (CUcontext context, int kind), (context, kind))

enum {
#define X(name, params, args) FN_##name,
    CUPTI_FNS(X)
#undef X
    NFNS
};

static const char *const names[NFNS] = {
#define X(name, params, args) #name,
    CUPTI_FNS(X)
#undef X
};

static _Atomic(void *) handed[NFNS]; /* what dlsym found for a caller handed the wrapper (standby) */
static void *const wrappers[NFNS];

/* The function the caller at `ret` would have bound to without the preload: the first definition in
 * its own object's scope (not the wrapper: the main program's scope holds the preload), else the one
 * dlsym found for a caller handed the wrapper, else the next in the global scope. Never cached: these
 * calls are few, and two callers may hold different copies of libcupti. */
static void *real_for(int i, const void *ret) {
    void *p = NULL;
    Dl_info info;
    if (dladdr(ret, &info) && info.dli_fname) {
        void *h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
        if (h) {
            p = egpu_real_dlsym(h, names[i]);
            dlclose(h);
        }
    }
    if (!p || p == wrappers[i]) p = atomic_load_explicit(&handed[i], memory_order_acquire);
    return p ? p : egpu_dlsym_next(names[i]);
}

#define X(name, params, args)                                                                  \
    EXPORT CUptiResult name params {                                                           \
        egpu_sass_yield("CUPTI (" #name ")");                                                  \
        CUptiResult(*f) params = (CUptiResult(*) params)real_for(FN_##name, __builtin_return_address(0)); \
        return f ? f args : CUPTI_ERROR_NOT_INITIALIZED;                                       \
    }
CUPTI_FNS(X)
#undef X

static void *const wrappers[NFNS] = {
#define X(name, params, args) (void *)name,
    CUPTI_FNS(X)
#undef X
};

int egpu_cupti_fn(const char *name) {
    for (int i = 0; i < NFNS; i++)
        if (!strcmp(name, names[i])) return i;
    return -1;
}

void *egpu_cupti_hand_out(int i, void *found) {
    if (!found || !egpu_sass_holds_slot()) return found; /* only standby needs its callers to pass here */
    atomic_store_explicit(&handed[i], found, memory_order_release);
    return wrappers[i];
}
