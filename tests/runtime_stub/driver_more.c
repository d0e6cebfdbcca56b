/* Linked into a copy of the stand-in libcuda.so.1 (tests/stub_driver/libcuda_stub.c) for the runtime
 * tests: the context, device, global and copy calls the runtime makes (runtime/driver.py), over a
 * fake device memory that keeps what is copied in. Logs to EGPU_STUB_LOG like the stand-in.
 * EGPU_STUB_NO_CONTEXT=1: no context is current (as when cudart loads a library before making one).
 * EGPU_STUB_NO_GLOBALS=1: global lookups fail (CUDA_ERROR_INVALID_CONTEXT), so no map table can be filled.
 * EGPU_STUB_FREE_MB=N: cuMemGetInfo_v2 says N MB of device memory are free (unset: 80 GB).
 * EGPU_STUB_PROBE_COUNTS=1: launches of instrumented modules count themselves in their probe's first map,
 * and reads on the runtime's stream take 20 ms (launches run between a hot swap's flip and its reads).
 * Live control (tests/test_live.py): device-to-device copies, a stream of the runtime's own, and a
 * launch effect on module state (egpu_stub_launched).
 * A second device: cuDevicePrimaryCtxRetain(1) gives its primary context, which cuCtxSetCurrent makes the
 * application's; device d's memory and globals lie d TB above device 0's, and a probe that reads a map of
 * another device's memory is logged as the fault a GPU without peer access would raise. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
CUresult egpu_stub_ok(void);   /* libcuda_stub.c: CUDA_SUCCESS, or not after a fork */
#define OK egpu_stub_ok()
#define NOT_FOUND 500

static void note(const char *fmt, ...) {
    const char *path = getenv("EGPU_STUB_LOG");
    if (!path || !*path) return;
    char line[512];
    int n = snprintf(line, sizeof line, "%d ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(line + n, sizeof line - n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof line - 2) n = sizeof line - 2;
    line[n++] = '\n';
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (fd >= 0) {
        (void)!write(fd, line, n);
        close(fd);
    }
}

/* Three contexts: the application's (current unless EGPU_STUB_NO_CONTEXT) and device 0's primary one, and
 * device 1's primary one (current once the application sets it). Copies log which one they ran in. */
static int app_context, primary_context, device1_context;
static void *stack[16];
static int depth;
static void *set_current;   /* cuCtxSetCurrent's, below the pushed ones */

static void *current(void) {
    if (depth) return stack[depth - 1];
    return set_current ? set_current : getenv("EGPU_STUB_NO_CONTEXT") ? NULL : &app_context;
}

const char *egpu_stub_context_name(void) {
    void *c = current();
    return c == &app_context ? "app" : c == &primary_context ? "primary" : c == &device1_context ? "device1" : "none";
}

int egpu_stub_device(void) { return current() == &device1_context; }

/* The context a load or launch runs in, for the stand-in sanitizer's callbacks (libcuda_stub.c): the current
 * one, else device 0's primary one, where the runtime then put the maps. */
void *egpu_stub_current_context(void) { return current() ? current() : &primary_context; }

CUresult cuCtxGetCurrent(void **ctx) {
    *ctx = current();
    return OK;
}
CUresult cuCtxSetCurrent(void *ctx) {
    note("cuCtxSetCurrent ctx=%s", ctx == &device1_context ? "device1" : ctx == &primary_context ? "primary" : "app");
    set_current = ctx;
    return OK;
}
CUresult cuCtxGetDevice(int *dev) { *dev = egpu_stub_device(); return OK; }
static void *destroyed;   /* cuCtxDestroy_v2's: pushing it fails from then on, as the driver's does */
CUresult cuCtxDestroy_v2(void *ctx) {
    note("cuCtxDestroy_v2");
    destroyed = ctx;
    return OK;
}
CUresult cuCtxPushCurrent_v2(void *ctx) {
    if (depth == 16 || ctx == destroyed || (ctx != &app_context && ctx != &primary_context &&
                                            ctx != &device1_context)) return 201;
    stack[depth++] = ctx;
    return OK;
}
CUresult cuCtxPopCurrent_v2(void **ctx) {
    if (!depth) return 201;
    depth--;
    if (ctx) *ctx = stack[depth];
    return OK;
}
CUresult cuDeviceGet(int *dev, int ordinal) { *dev = ordinal; return OK; }
CUresult cuMemGetInfo_v2(size_t *free_, size_t *total) {
    const char *mb = getenv("EGPU_STUB_FREE_MB");
    *total = 80ull << 30;
    *free_ = mb ? (size_t)atoll(mb) << 20 : *total;
    return OK;
}
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) {
    note("cuDevicePrimaryCtxRetain dev=%d", dev);
    *ctx = dev == 1 ? (void *)&device1_context : (void *)&primary_context;
    return OK;
}
CUresult cuDevicePrimaryCtxRelease_v2(int dev) { note("cuDevicePrimaryCtxRelease_v2 dev=%d", dev); return OK; }
CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
    *v = attr == 75 ? 9 : attr == 76 ? 0 : attr == 16 ? 132 : 0; /* sm_90, 132 SMs */
    return OK;
}
CUresult cuGetErrorName(CUresult r, const char **name) { /* a lookup: it answers in a forked child too */
    *name = r == NOT_FOUND ? "CUDA_ERROR_NOT_FOUND" : r == 3 ? "CUDA_ERROR_NOT_INITIALIZED" : "CUDA_ERROR_STUB";
    return 0;
}

/* ---- fake device memory: every copy in is kept; a copy out sees the latest bytes, zeros elsewhere.
 * A copy to the same range as an earlier one overwrites it in place, so state updated at every launch
 * stays one block. One lock: the runtime reads maps on its own thread while the app launches. ---- */

struct block { CUdeviceptr addr; size_t size; char *data; struct block *next; };
static struct block *blocks;
static pthread_mutex_t memory = PTHREAD_MUTEX_INITIALIZER;

static void put(CUdeviceptr dst, const void *src, size_t n) {
    pthread_mutex_lock(&memory);
    struct block *b = blocks;
    while (b && !(b->addr == dst && b->size == n)) b = b->next;
    if (!b) {
        b = calloc(1, sizeof *b);
        *b = (struct block){dst, n, malloc(n), blocks};
        blocks = b;
    }
    memcpy(b->data, src, n);
    pthread_mutex_unlock(&memory);
}

static void get(void *dst, CUdeviceptr src, size_t n) {
    pthread_mutex_lock(&memory);
    memset(dst, 0, n);
    struct block *order[4096]; /* applied oldest first, so newer copies win */
    int count = 0;
    for (struct block *b = blocks; b && count < 4096; b = b->next) order[count++] = b;
    while (count--) {
        struct block *b = order[count];
        CUdeviceptr lo = b->addr > src ? b->addr : src;
        CUdeviceptr hi = b->addr + b->size < src + n ? b->addr + b->size : src + n;
        if (lo < hi) memcpy((char *)dst + (lo - src), b->data + (lo - b->addr), hi - lo);
    }
    pthread_mutex_unlock(&memory);
}

CUresult egpu_stub_during_capture(const char *api, int waits);   /* libcuda_stub.c */

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
    CUresult r = egpu_stub_during_capture(__func__, 1);
    if (r != OK) return r;
    put(dst, src, n);
    note("cuMemcpyHtoD_v2 size=%zu ctx=%s", n, egpu_stub_context_name());
    return OK;
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
    CUresult r = egpu_stub_during_capture(__func__, 1);
    if (r != OK) return r;
    get(dst, src, n);
    note("cuMemcpyDtoH_v2 size=%zu ctx=%s", n, egpu_stub_context_name());
    return OK;
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    char *tmp = malloc(n ? n : 1);
    get(tmp, src, n);
    put(dst, tmp, n);
    free(tmp);
    note("cuMemcpyDtoD_v2 dst=%#llx src=%#llx size=%zu ctx=%s", dst, src, n, egpu_stub_context_name());
    return OK;
}

/* Streams: one stand-in stream; async copies are done when they return. */
static int a_stream;
CUresult cuStreamCreate(void **s, unsigned int flags) {
    note("cuStreamCreate flags=%u ctx=%s", flags, egpu_stub_context_name());
    *s = &a_stream;
    return OK;
}
CUresult cuStreamDestroy_v2(void *s) {   /* driver_cow.c's streams too */
    note("cuStreamDestroy_v2 stream=%s ctx=%s", s == &a_stream ? "ours" : "other", egpu_stub_context_name());
    return OK;
}
CUresult cuStreamSynchronize(void *s) { return s == &a_stream ? OK : 400; }
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *s) {
    if (getenv("EGPU_STUB_PROBE_COUNTS")) usleep(20000); /* launches run between a flip and this read */
    get(dst, src, n);
    note("cuMemcpyDtoHAsync_v2 size=%zu stream=%s ctx=%s", n, s == &a_stream ? "ours" : "other",
         egpu_stub_context_name());
    return OK;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *s) {
    put(dst, src, n);
    note("cuMemcpyHtoDAsync_v2 size=%zu stream=%s ctx=%s", n, s == &a_stream ? "ours" : "other",
         egpu_stub_context_name());
    return OK;
}

/* ---- globals: the stand-in's modules keep their PTX (struct module in libcuda_stub.c). A global's
 * address is fixed by its module and its place in the PTX, its size by its type and count:
 * ".global .u64 name[N]" is 8 * N bytes. ---- */

struct module { int id; char *ptx; const void *elf; size_t elf_size; int device; }; /* libcuda_stub.c's */
struct function { char name[128]; struct module *m; int kernel; };

/* A global of module m in the context of `device` (a library is in every context; a module in its own). */
static int lookup_global(struct module *m, const char *name, CUdeviceptr *p, size_t *size, int device) {
    char decl[256];
    snprintf(decl, sizeof decl, " %s[", name);
    const char *at = m->ptx ? strstr(m->ptx, decl) : NULL;
    if (!at) return 0;
    const char *type = at;
    while (type > m->ptx && type[-1] != '.') type--;
    size_t elem = !strncmp(type, "u64", 3) || !strncmp(type, "b64", 3) ? 8
                  : !strncmp(type, "u32", 3) || !strncmp(type, "b32", 3) ? 4 : 1;
    *p = 0x600000000000ull + ((CUdeviceptr)device << 40) + ((CUdeviceptr)m->id << 24) + (CUdeviceptr)(at - m->ptx) * 16;
    *size = elem * strtoul(at + strlen(decl), NULL, 10);
    return 1;
}

static CUresult global(const char *api, CUdeviceptr *p, size_t *size, struct module *m, const char *name,
                       int device) {
    CUdeviceptr addr;
    size_t n;
    int found = lookup_global(m, name, &addr, &n, device);
    note("%s module=%d name=%s found=%d", api, m->id, name, found);
    if (getenv("EGPU_STUB_NO_GLOBALS")) return 201;
    if (!found) return NOT_FOUND;
    *p = addr;
    if (size) *size = n;
    return OK;
}
CUresult cuModuleGetGlobal_v2(CUdeviceptr *p, size_t *size, void *mod, const char *name) {
    return global("cuModuleGetGlobal_v2", p, size, mod, name, ((struct module *)mod)->device);
}
CUresult cuLibraryGetGlobal(CUdeviceptr *p, size_t *size, void *lib, const char *name) {
    return global("cuLibraryGetGlobal", p, size, lib, name, egpu_stub_device());
}

/* EGPU_STUB_PROBE_COUNTS=1: a launch of a module with a probe map table (__egpu_maps_<tag>) adds 1 to slot 0
 * of the probe's first map, an ARRAY (after the region's header), as count.bpf.c's probe would (one thread
 * per launch). */
#define MAP_HEADER 64 /* egpu_preload/translate/devmaps.py HEADER */
static void probe_effect(struct module *m, int device) {
    const char *at = m->ptx ? strstr(m->ptx, " __egpu_maps_") : NULL;
    char name[128];
    size_t k = 0;
    CUdeviceptr table, map;
    size_t n;
    unsigned long long v;
    if (!at) return;
    for (at++; at[k] && !strchr("[;+, \n", at[k]) && k < sizeof name - 1; k++) name[k] = at[k];
    name[k] = 0;
    if (!lookup_global(m, name, &table, &n, device)) return;
    get(&map, table, 8);
    if (!map) return;   /* an unfilled table: the probe leaves at once (translate/emitter.py table_check) */
    int owner = (int)((map >> 40) - 0x70);   /* libcuda_stub.c cuMemAlloc_v2: device d's memory d TB up */
    if (owner != device) {   /* a GPU without peer access faults: an illegal address, the job's kernel dies */
        note("probe fault: a kernel on device %d read map memory of device %d (illegal address)", device, owner);
        return;
    }
    get(&v, map + MAP_HEADER, 8);
    v++;
    put(map + MAP_HEADER, &v, 8);
}

/* A launch's effect: a module declaring ".global .u64 launches[1]" counts its own launches there, as
 * a kernel keeping __device__ state would, each by the value of its ".const .u64 increment[1]" where
 * it declares one (a __constant__ the app sets), else by 1. */
void egpu_stub_launched(const void *f) {
    const struct function *fn = f;
    struct module *m = fn->m;
    CUdeviceptr addr, inc;
    size_t n;
    unsigned long long v, by = 1;
    int device = m && !fn->kernel ? m->device : egpu_stub_device();   /* a library's kernel: the current one */
    if (m && getenv("EGPU_STUB_PROBE_COUNTS")) probe_effect(m, device);
    if (!m || !lookup_global(m, "launches", &addr, &n, device) || n != 8) return;
    if (lookup_global(m, "increment", &inc, &n, device) && n == 8) get(&by, inc, 8);
    get(&v, addr, 8);
    v += by;
    put(addr, &v, 8);
}
