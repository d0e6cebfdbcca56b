/* Linked into a copy of the stand-in libcuda.so.1 (tests/stub_driver/libcuda_stub.c) for the runtime
 * tests: the context, device, global and copy calls the runtime makes (runtime/driver.py), over a
 * fake device memory that keeps what is copied in. Logs to EGPU_STUB_LOG like the stand-in.
 * EGPU_STUB_NO_CONTEXT=1: no context is current (as when cudart loads a library before making one).
 * EGPU_STUB_NO_GLOBALS=1: global lookups fail (CUDA_ERROR_INVALID_CONTEXT), so no map table can be filled. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
#define OK 0
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

/* Two contexts: the application's (current unless EGPU_STUB_NO_CONTEXT) and the device's primary one.
 * Copies log which one they ran in. */
static int app_context, primary_context;
static void *stack[16];
static int depth;

static const char *context_name(void) {
    void *c = depth ? stack[depth - 1] : getenv("EGPU_STUB_NO_CONTEXT") ? NULL : &app_context;
    return c == &app_context ? "app" : c == &primary_context ? "primary" : "none";
}

CUresult cuCtxGetCurrent(void **ctx) {
    *ctx = depth ? stack[depth - 1] : getenv("EGPU_STUB_NO_CONTEXT") ? NULL : &app_context;
    return OK;
}
CUresult cuCtxGetDevice(int *dev) { *dev = 0; return OK; }
CUresult cuCtxPushCurrent_v2(void *ctx) {
    if (depth == 16 || (ctx != &app_context && ctx != &primary_context)) return 201;
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
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) {
    note("cuDevicePrimaryCtxRetain dev=%d", dev);
    *ctx = &primary_context;
    return OK;
}
CUresult cuDevicePrimaryCtxRelease_v2(int dev) { note("cuDevicePrimaryCtxRelease_v2 dev=%d", dev); return OK; }
CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
    *v = attr == 75 ? 9 : attr == 76 ? 0 : attr == 16 ? 132 : 0; /* sm_90, 132 SMs */
    return OK;
}
CUresult cuGetErrorName(CUresult r, const char **name) {
    *name = r == NOT_FOUND ? "CUDA_ERROR_NOT_FOUND" : "CUDA_ERROR_STUB";
    return OK;
}

/* ---- fake device memory: every copy in is kept; a copy out sees the latest bytes, zeros elsewhere ---- */

struct block { CUdeviceptr addr; size_t size; char *data; struct block *next; };
static struct block *blocks;

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
    struct block *b = calloc(1, sizeof *b);
    *b = (struct block){dst, n, malloc(n), blocks};
    memcpy(b->data, src, n);
    blocks = b;
    note("cuMemcpyHtoD_v2 size=%zu ctx=%s", n, context_name());
    return OK;
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
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
    note("cuMemcpyDtoH_v2 size=%zu ctx=%s", n, context_name());
    return OK;
}

/* ---- globals: the stand-in's modules keep their PTX (struct module in libcuda_stub.c) ---- */

struct module { int id; char *ptx; };
static CUdeviceptr next_global = 0x600000000000ull;

static CUresult global(const char *api, CUdeviceptr *p, size_t *size, struct module *m, const char *name) {
    char decl[256];
    snprintf(decl, sizeof decl, " %s[", name);
    int found = m->ptx && strstr(m->ptx, decl);
    note("%s module=%d name=%s found=%d", api, m->id, name, found);
    if (getenv("EGPU_STUB_NO_GLOBALS")) return 201;
    if (!found) return NOT_FOUND;
    *p = next_global;
    next_global += 0x1000;
    if (size) *size = 8;
    return OK;
}
CUresult cuModuleGetGlobal_v2(CUdeviceptr *p, size_t *size, void *mod, const char *name) {
    return global("cuModuleGetGlobal_v2", p, size, mod, name);
}
CUresult cuLibraryGetGlobal(CUdeviceptr *p, size_t *size, void *lib, const char *name) {
    return global("cuLibraryGetGlobal", p, size, lib, name);
}

/* ---- the runtime's own stream (launch probes push shared-map writes on it) ---- */

static int runtime_stream;
CUresult cuStreamCreate(void **s, unsigned int flags) {
    note("cuStreamCreate flags=%u ctx=%s", flags, context_name());
    *s = &runtime_stream;
    return OK;
}
CUresult cuStreamSynchronize(void *s) { return s == &runtime_stream ? OK : 400; }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *s) {
    if (s != &runtime_stream) return 400;
    return cuMemcpyHtoD_v2(dst, src, n);
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *s) {
    if (s != &runtime_stream) return 400;
    return cuMemcpyDtoH_v2(dst, src, n);
}
