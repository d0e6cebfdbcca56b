/* A stand-in libcuda.so.1 for the shim tests: it implements the hooked entry points, cuGetProcAddress
 * (_v2) with the driver's version/flags rules, and a few unhooked ones, and appends one line per call
 * to the file named by EGPU_STUB_LOG: "<pid> <symbol> key=value ...".
 *
 * Modules remember their PTX, so a launch can log its arguments: the u64 behind each kernelParams
 * entry, as many as the kernel's .entry declares. Built with -Wl,-Bsymbolic so that the addresses it
 * hands out are its own functions, as the real driver's are, never the preloaded shim's. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
#define OK egpu_stub_ok() /* what a call that succeeds returns (below) */
#define NOT_INITIALIZED 3
#define INVALID_VALUE 1
#define FILE_NOT_FOUND 301
#define INVALID_PTX 218
#define NOT_FOUND 500
#define NOT_SUPPORTED 801
#define CAPTURE_UNSUPPORTED 900
#define CAPTURE_INVALIDATED 901
#define CAPTURE_UNMATCHED 903
#define CAPTURE_IMPLICIT 906
#define MODE_RELAXED 2

/* EGPU_STUB_FORK_FAILS=1: in a process forked after cuInit every call that would succeed returns
 * CUDA_ERROR_NOT_INITIALIZED (3), as the real driver's do: its state does not survive fork (the CUDA C++
 * Programming Guide leaves any use of CUDA there undefined; a DataLoader worker forked after CUDA sees
 * "initialization error"). The call still runs and logs, so a test sees what the child called. Unset, a
 * child goes on with the parent's stand-in state (tests whose forked child launches, test_cow_live.py). */
static int forked_after_init;
static void fork_child(void) { forked_after_init = getenv("EGPU_STUB_FORK_FAILS") != NULL; }
static void watch_forks(void) { pthread_atfork(NULL, NULL, fork_child); }
CUresult egpu_stub_ok(void) { return forked_after_init ? NOT_INITIALIZED : 0; }

static int logging(void) {
    const char *path = getenv("EGPU_STUB_LOG");
    return path && *path;
}

static void logf_(const char *fmt, ...) {
    const char *path = getenv("EGPU_STUB_LOG");
    if (!logging()) return;
    char line[2048];
    int n = snprintf(line, sizeof line, "%d ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(line + n, sizeof line - n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof line - 2) n = sizeof line - 2;
    line[n++] = '\n';
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (fd >= 0) {
        (void)!write(fd, line, n); /* one write per line: lines from several processes never mix */
        close(fd);
    }
}

/* ---- modules, functions ---- */

/* elf: a real cubin, as loaded; device: the device of the context it was loaded in */
struct module { int id; char *ptx; const void *elf; size_t elf_size; int device; };
/* The current context's device, where the runtime stand-in (tests/runtime_stub/driver_more.c) has two. */
__attribute__((weak)) int egpu_stub_device(void);
static int current_device(void) { return egpu_stub_device ? egpu_stub_device() : 0; }
/* loaded: whether its code is (cuFuncIsLoaded); a lookup hands out functions partly loaded, as the driver
 * may under lazy loading, and what may load one loads it. shared: the dynamic shared memory its launches may
 * ask for beyond the default 48 KiB (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: cuFuncSetAttribute's on a
 * function, cuKernelSetAttribute's on a CUkernel). function: a CUkernel's function (cuKernelGetFunction); of: the
 * CUkernel of such a function. */
struct function {
    char name[128];
    struct module *m;
    int kernel, loaded;
    struct function *next, *function, *of;
    int shared;
};
static struct function *functions; /* every handle handed out: a lookup repeated gets the same one */
static int next_module = 1;

static const char *image_kind(const void *image) {
    uint32_t magic;
    memcpy(&magic, image, 4);
    if (magic == 0x466243B1u) return "wrapper";
    if (magic == 0xBA55ED50u) return "fatbin";
    if (!memcmp(image, "\x7f" "ELF", 4)) return "elf";
    return "ptx";
}

/* The stand-in sanitizer (tests/sass_stub) subscribes here: loads and launches call it back as the driver
 * calls the Compute Sanitizer's subscriber (domain, callback id, data laid out as sanitizer.h has it). */
typedef void (*sanitizer_event)(int domain, unsigned int cbid, const void *data);
static sanitizer_event san_event;
/* The context a callback names: driver_more.c's current one where it is linked in, else a stand-in handle. */
__attribute__((weak)) void *egpu_stub_current_context(void);
static void *san_context(void) { return egpu_stub_current_context ? egpu_stub_current_context() : (void *)1; }
__attribute__((visibility("default"))) void egpu_stub_sanitizer(sanitizer_event fn) { san_event = fn; }

/* JIT options (cuModuleLoadDataEx, cuLibraryLoadData): their ids, as the log line's " jit=5,6" ("" if none),
 * where the info log goes (CU_JIT_INFO_LOG_BUFFER 3, its size 4), where the error log goes
 * (CU_JIT_ERROR_LOG_BUFFER 5, its size CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES 6), and CU_JIT_MAX_REGISTERS (0). */
struct jit { char ids[256]; char *info, *log; void **info_size, **log_size; unsigned registers; };
static struct jit jit_options(unsigned n, const int *o, void **v) {
    struct jit j = {"", NULL, NULL, NULL, NULL, 255};
    for (unsigned i = 0, k = 0; i < n && k < sizeof j.ids - 16; i++) {
        k += snprintf(j.ids + k, sizeof j.ids - k, "%s%d", i ? "," : " jit=", o[i]);
        if (o[i] == 0) j.registers = (unsigned)(uintptr_t)v[i];
        if (o[i] == 3) j.info = v[i];
        if (o[i] == 4) j.info_size = &v[i];
        if (o[i] == 5) j.log = v[i];
        if (o[i] == 6) j.log_size = &v[i];
    }
    return j;
}

/* `text` into a log the options name (at most its size, NUL included); the size written back is what was
 * written, as the driver's is, which writes its logs (empty ones too) whether the load succeeds or not. */
static void jit_log(char *log, void **size, const char *text) {
    if (!log || !size || !(uintptr_t)*size) return;
    size_t room = (uintptr_t)*size;
    int n = snprintf(log, room, "%s", text);
    *size = (void *)(uintptr_t)((size_t)n < room ? (size_t)n + 1 : room);
}

/* The JIT's logs for a load: on a refusal ptxas's words for the error, else an empty error log; the info log
 * says which (a load's info is longer than a refusal's, so a size shrunk by one cuts the next). */
static void jit_logs(struct jit *j, const char *image, const char *at) {
    char text[256];
    if (!at) {
        snprintf(text, sizeof text, "stand-in JIT: loaded with %u registers at most", j->registers);
        jit_log(j->info, j->info_size, text);
        jit_log(j->log, j->log_size, "");
        return;
    }
    int line = 1;
    for (const char *c = image; c < at; c++) line += *c == '\n';
    int len = (int)strcspn(at, "\n");
    snprintf(text, sizeof text, "ptxas application ptx input, line %d; error   : stand-in refuses '%.*s'\n"
             "ptxas fatal   : Ptx assembly aborted due to errors\n", line, len < 40 ? len : 40, at);
    jit_log(j->info, j->info_size, "stand-in JIT: refused");
    jit_log(j->log, j->log_size, text);
}

/* Images marked "// egpu-refuse", or holding EGPU_STUB_REFUSE's text, are refused, as the JIT refuses bad
 * PTX, with a log where the options ask for one. */
static CUresult load(const char *api, const void *image, void **out, unsigned n, const int *o, void **v) {
    struct jit j = jit_options(n, o, v);
    const char *refuse = getenv("EGPU_STUB_REFUSE");
    const char *at = strcmp(image_kind(image), "ptx") ? NULL : strstr(image, "// egpu-refuse");
    if (!strcmp(image_kind(image), "ptx") && !at && refuse && *refuse) at = strstr(image, refuse);
    jit_logs(&j, image, at);
    if (at) {
        logf_("%s refused%s", api, j.ids);
        return INVALID_PTX;
    }
    struct module *m = calloc(1, sizeof *m);
    m->id = next_module++;
    m->device = current_device();
    const char *kind = image_kind(image);
    if (!strcmp(kind, "ptx")) m->ptx = strdup(image);
    else if (!strcmp(kind, "elf")) {
        unsigned long long shoff;
        uint16_t shentsize, shnum;
        memcpy(&shoff, (const char *)image + 0x28, 8);
        memcpy(&shentsize, (const char *)image + 0x3A, 2);
        memcpy(&shnum, (const char *)image + 0x3C, 2);
        if (shnum) /* a real cubin (nvcc's): the sanitizer is given it whole */
            m->elf = image, m->elf_size = shoff + (size_t)shnum * shentsize;
        else if (shoff > 65) /* one cuLinkComplete made: the linked PTX after the header */
            m->ptx = strdup((const char *)image + 64);
    }
    const char *marker = m->ptx ? strstr(m->ptx, "// egpu-instrumented") : NULL;
    const char *images = getenv("EGPU_STUB_IMAGES"); /* a directory: each module's PTX, as module-ID.ptx */
    if (images && *images && m->ptx) {
        char name[4096];
        snprintf(name, sizeof name, "%s/module-%d.ptx", images, m->id);
        FILE *f = fopen(name, "w");
        if (f) { fputs(m->ptx, f); fclose(f); }
    }
    logf_("%s module=%d kind=%s instrumented=%d%s", api, m->id, kind, marker != NULL, j.ids);
    *out = m;
    if (san_event) { /* Sanitizer_ResourceModuleData: MODULE_LOADED */
        struct { void *ctx, *module; size_t size; const char *cubin; void *library; } d =
            {san_context(), m, m->elf ? m->elf_size : m->ptx ? strlen(m->ptx) : 0, m->elf ? m->elf : m->ptx, NULL};
        san_event(3, 9, &d);
    }
    return OK;
}

/* Number of .param entries in ".entry NAME(...)" of the module's PTX; -1 if unknown. */
static int param_count(const struct function *f) {
    if (!f->m || !f->m->ptx) return -1;
    char key[160];
    snprintf(key, sizeof key, ".entry %s(", f->name);
    const char *p = strstr(f->m->ptx, key);
    if (!p) return -1;
    const char *end = strchr(p, ')');
    int n = 0;
    for (const char *q = strstr(p, ".param"); q && q < end; q = strstr(q + 1, ".param")) n++;
    return n;
}

static void fn_name(char *out, size_t size, const void *h) {
    const struct function *f = h;
    if (!f) snprintf(out, size, "null");
    else snprintf(out, size, "%s@%d%s", f->name, f->m ? f->m->id : 0, f->kernel ? "k" : "");
}

/* The runtime tests' extension (tests/runtime_stub/driver_more.c) runs a launch's effect on module
 * state; absent in the shim tests' build. */
__attribute__((weak)) void egpu_stub_launched(const void *f);

/* What the last launch or node was given (app_no_params.c: made-up handles are not logged). */
static void **last_params, **last_extra;
void egpu_stub_last_launch(void ***params, void ***extra) {
    *params = last_params, *extra = last_extra;
}

/* `runs`: a launch (its effect runs), not a graph node being set. */
static void log_launch(const char *api, const void *f, unsigned gx, unsigned bx, void *stream,
                       void **params, void **extra, int runs) {
    last_params = params, last_extra = extra;
    if (!logging()) return; /* app_threads launches made-up handles */
    if (f && runs) ((struct function *)f)->loaded = 1; /* as the driver, loading what it launches */
    if (san_event && f && runs) { /* Sanitizer_LaunchData: LAUNCH_BEGIN (hLaunch: the function) */
        const struct function *fn = f;
        struct {
            void *ctx, *stream, *hstream, *module, *function;
            const char *name;
            unsigned int grid[3], block[3], cluster[3];
            unsigned long long grid_id;
            void *launch;
        } d = {san_context(), stream, stream, fn->m, (void *)f, fn->name, {gx, 1, 1}, {bx, 1, 1}, {1, 1, 1}, 0,
               (void *)f};
        san_event(5, 1, &d);
    }
    if (egpu_stub_launched && f && runs) egpu_stub_launched(f);
    char name[200], args[512] = "";
    fn_name(name, sizeof name, f);
    int n = f ? param_count(f) : -1, at = 0;
    const int room = sizeof args - 32; /* a long list is cut short, never past the line */
    for (int i = 0; params && i < n && at < room; i++)
        at += snprintf(args + at, sizeof args - at, "%s%llu", i ? "," : "", *(unsigned long long *)params[i]);
    for (void **e = extra; e && e[0]; e += 2) {
        if (e[0] != (void *)1) continue; /* CU_LAUNCH_PARAM_BUFFER_POINTER; the size follows */
        size_t size = *(size_t *)e[3];
        at += snprintf(args + at, sizeof args - at, "buffer:%zu:", size);
        for (size_t o = 0; o + 8 <= size && at < room; o += 8)
            at += snprintf(args + at, sizeof args - at, "%s%llu", o ? "," : "",
                           *(unsigned long long *)((char *)e[1] + o));
    }
    logf_("%s f=%s grid=%u block=%u stream=%p params=%s", api, name, gx, bx, stream, args);
}

/* ---- unhooked entry points ---- */

CUresult cuInit(unsigned int flags) { /* EGPU_STUB_CUINIT=N: cuInit fails with N, as with no GPU (100) */
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    logf_("cuInit flags=%u", flags);
    if (getenv("EGPU_STUB_CUINIT")) return (CUresult)atoi(getenv("EGPU_STUB_CUINIT"));
    pthread_once(&once, watch_forks);
    return OK;
}
CUresult cuDriverGetVersion(int *v) { *v = 13000; logf_("cuDriverGetVersion"); return OK; }
/* EGPU_STUB_LOADING=N: the module loading mode cuModuleGetLoadingMode answers (1 eager, 2 lazy); unset,
 * it fails, as a driver that cannot say. */
CUresult cuModuleGetLoadingMode(int *mode) {
    const char *m = getenv("EGPU_STUB_LOADING");
    if (!m) return NOT_FOUND;
    *mode = atoi(m);
    return OK;
}
CUresult egpu_stub_during_capture(const char *api, int waits);
/* egpu_stub_hold_sync(1): the context's work runs until egpu_stub_hold_sync(0), as a kernel that never
 * ends would, and cuCtxSynchronize waits for it. */
static volatile int sync_held;
/* runtime_stub/driver_more.c's: the current context's name, where the stand-in has contexts */
__attribute__((weak)) const char *egpu_stub_context_name(void);
void egpu_stub_hold_sync(int on) { __atomic_store_n(&sync_held, on, __ATOMIC_SEQ_CST); }
CUresult cuCtxSynchronize(void) {   /* it would wait for the capturing stream: refused, as a legacy copy */
    CUresult r = egpu_stub_during_capture(__func__, 1);
    if (r != OK) return r;
    while (__atomic_load_n(&sync_held, __ATOMIC_SEQ_CST)) usleep(1000);
    if (egpu_stub_context_name)
        logf_("cuCtxSynchronize ctx=%s", egpu_stub_context_name());
    else
        logf_("cuCtxSynchronize");
    return OK;
}
#define INVALID_HANDLE 400
CUresult cuFuncGetAttribute(int *pi, int attrib, void *f) {
    logf_("cuFuncGetAttribute attrib=%d", attrib);
    if (attrib == 99) return INVALID_VALUE;
    ((struct function *)f)->loaded = 1;
    *pi = 7;
    return OK;
}
CUresult cuFuncIsLoaded(int *state, void *f) { /* a CUkernel is no function */
    if (((struct function *)f)->kernel) return INVALID_HANDLE;
    *state = ((struct function *)f)->loaded;
    return OK;
}
static CUresult load_function(const char *api, void *f) {
    struct function *fn = f;
    logf_("%s name=%s", api, fn->name);
    if (fn->kernel) return INVALID_HANDLE;
    fn->loaded = 1;
    return OK;
}
CUresult cuFuncLoad(void *f) { return load_function(__func__, f); }
#define MAX_DYNAMIC_SHARED_SIZE_BYTES 8
CUresult cuFuncSetAttribute(void *f, int attrib, int value) {
    CUresult r = load_function(__func__, f);   /* a CUkernel is no function: refused, nothing set */
    if (!r && attrib == MAX_DYNAMIC_SHARED_SIZE_BYTES) ((struct function *)f)->shared = value;
    return r;
}
CUresult cuKernelSetAttribute(int attrib, int value, void *kernel, int dev) {
    struct function *k = kernel;
    logf_("cuKernelSetAttribute name=%s attrib=%d value=%d", k->name, attrib, value);
    if (!k->kernel) return INVALID_HANDLE;
    if (attrib == MAX_DYNAMIC_SHARED_SIZE_BYTES) k->shared = value;
    return OK;
}
/* The dynamic shared memory beyond 48 KiB a launch of f may ask for: what was set on the function it runs (a
 * CUkernel runs its function in the context), else on that function's CUkernel, as the driver has it:
 * cuFuncSetAttribute's setting overrides cuKernelSetAttribute's. */
static int shared_allowed(const struct function *f) {
    const struct function *fn = f->kernel && f->function ? f->function : f;
    return fn->shared ? fn->shared : fn->of ? fn->of->shared : 0;
}
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, void *f, int block, size_t shmem) {
    *blocks = 8;
    return load_function(__func__, f);
}
CUresult cuKernelGetAttribute(int *pi, int attrib, void *kernel, int dev) {
    logf_("cuKernelGetAttribute name=%s", ((struct function *)kernel)->name);
    *pi = 7;
    return OK;
}
CUresult cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags) {
    logf_("cuGraphInstantiateWithFlags");
    *exec = (void *)0x9;
    return OK;
}
static const void *export_table[4];
CUresult cuGetExportTable(const void **table, const void *uuid) {
    logf_("cuGetExportTable");
    *table = export_table;
    return OK;
}
CUresult cuLinkCreate(unsigned int n, int *o, void **v, void **state) { /* the legacy v5050 twin */
    logf_("cuLinkCreate");
    *state = calloc(1, 64);   /* room for a struct link */
    return OK;
}
CUresult cuMemAlloc(unsigned int *dptr, unsigned int size) { /* v2000: 32-bit pointers */
    logf_("cuMemAlloc size=%u", size);
    *dptr = 0x1000;
    return OK;
}

/* ---- hooked entry points ---- */

static CUresult load_file(const char *api, const char *fname, void **out) {
    FILE *f = fopen(fname, "rb");
    if (!f) { logf_("%s path=%s missing", api, fname); return FILE_NOT_FOUND; }
    char buf[65536] = {0};
    (void)!fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    return load(api, buf, out, 0, NULL, NULL);
}

CUresult cuModuleLoad(void **mod, const char *fname) { return load_file("cuModuleLoad", fname, mod); }
CUresult cuModuleLoadData(void **mod, const void *image) { return load("cuModuleLoadData", image, mod, 0, NULL, NULL); }
CUresult cuModuleLoadDataEx(void **mod, const void *image, unsigned int n, int *o, void **v) {
    return load("cuModuleLoadDataEx", image, mod, n, o, v);
}
CUresult cuModuleLoadFatBinary(void **mod, const void *fatCubin) {
    return load("cuModuleLoadFatBinary", fatCubin, mod, 0, NULL, NULL);
}
/* Sanitizer_ResourceModuleData: MODULE_UNLOAD_STARTING, inside the unload as the driver raises it */
static void unload_starting(void *mod) {
    if (!san_event) return;
    struct { void *ctx, *module; size_t size; const char *cubin; void *library; } d =
        {san_context(), mod, 0, NULL, NULL};
    san_event(3, 10, &d);
}
CUresult cuModuleUnload(void *mod) {
    logf_("cuModuleUnload module=%d", ((struct module *)mod)->id);
    unload_starting(mod);
    return OK;
}
static struct function *function_for(struct module *m, const char *name, int kernel) {
    for (struct function *f = functions; f; f = f->next)
        if (f->m == m && f->kernel == kernel && !strcmp(f->name, name)) return f;
    struct function *f = calloc(1, sizeof *f);
    snprintf(f->name, sizeof f->name, "%s", name);
    f->m = m;
    f->kernel = kernel;
    f->next = functions;
    return functions = f;
}
CUresult cuModuleGetFunction(void **out, void *mod, const char *name) {
    *out = function_for(mod, name, 0);
    logf_("cuModuleGetFunction module=%d name=%s", ((struct module *)mod)->id, name);
    return OK;
}
CUresult cuLibraryLoadData(void **lib, const void *code, int *jo, void **jv, unsigned int nj, int *lo,
                           void **lv, unsigned int nl) {
    return load("cuLibraryLoadData", code, lib, nj, jo, jv);
}
CUresult cuLibraryLoadFromFile(void **lib, const char *path, int *jo, void **jv, unsigned int nj, int *lo,
                               void **lv, unsigned int nl) {
    return load_file("cuLibraryLoadFromFile", path, lib);
}
CUresult cuLibraryUnload(void *lib) {
    logf_("cuLibraryUnload module=%d", ((struct module *)lib)->id);
    unload_starting(lib);
    return OK;
}
/* The name of the i-th kernel (".entry NAME(") of a module's PTX into out; without PTX (a fatbin), kernel_a and
 * kernel_b, app_common.h's. 0: it has no i-th. */
static int entry_name(const struct module *m, unsigned i, char *out, size_t size) {
    if (!m->ptx) return i < 2 ? snprintf(out, size, "kernel_%c", 'a' + i), 1 : 0;
    const char *at = m->ptx;
    for (unsigned k = 0; (at = strstr(at, ".entry ")); k++, at++)
        if (k == i) {
            at += strlen(".entry ");
            int len = (int)strcspn(at, "( \n");
            snprintf(out, size, "%.*s", len, at);
            return 1;
        }
    return 0;
}
CUresult cuModuleGetFunctionCount(unsigned int *count, void *mod) {
    char name[128];
    for (*count = 0; entry_name(mod, *count, name, sizeof name); ++*count) {}
    return OK;
}
CUresult cuModuleEnumerateFunctions(void **out, unsigned int n, void *mod) {
    logf_("cuModuleEnumerateFunctions module=%d", ((struct module *)mod)->id);
    char name[128];
    for (unsigned i = 0; i < n && entry_name(mod, i, name, sizeof name); i++) out[i] = function_for(mod, name, 0);
    return OK;
}
CUresult cuFuncGetName(const char **name, void *f) {
    *name = ((struct function *)f)->name;
    return OK;
}
CUresult cuLibraryGetKernelCount(unsigned int *count, void *lib) { return cuModuleGetFunctionCount(count, lib); }
CUresult cuLibraryEnumerateKernels(void **out, unsigned int n, void *lib) {
    logf_("cuLibraryEnumerateKernels module=%d", ((struct module *)lib)->id);
    char name[128];
    for (unsigned i = 0; i < n && entry_name(lib, i, name, sizeof name); i++) out[i] = function_for(lib, name, 1);
    return OK;
}
CUresult cuKernelGetName(const char **name, void *kernel) { return cuFuncGetName(name, kernel); }
CUresult cuLibraryGetKernel(void **out, void *lib, const char *name) {
    *out = function_for(lib, name, 1);
    logf_("cuModuleGetFunction module=%d name=%s", ((struct module *)lib)->id, name);
    return OK;
}
CUresult cuLibraryGetModule(void **mod, void *lib) {
    *mod = lib;
    logf_("cuLibraryGetModule module=%d", ((struct module *)lib)->id);
    return OK;
}
CUresult cuKernelGetFunction(void **out, void *kernel) {
    struct function *k = kernel;
    if (!k->function) { /* a copy of its own, so that it is not the CUkernel */
        k->function = calloc(1, sizeof *k->function);
        *k->function = (struct function){.m = k->m, .of = k};
        memcpy(k->function->name, k->name, sizeof k->name);
    }
    *out = k->function;
    logf_("cuKernelGetFunction name=%s", k->name);
    return OK;
}
/* A link state keeps its PTX inputs; the "cubin" cuLinkComplete makes is an ELF64 header whose section
 * table offset puts the end of the image after them, then their text (load() reads it back). */
struct link { char *ptx; size_t len; char *cubin; };
CUresult cuLinkCreate_v2(unsigned int n, int *o, void **v, void **state) {
    logf_("cuLinkCreate_v2");
    *state = calloc(1, sizeof(struct link));
    return OK;
}
CUresult cuLinkAddData_v2(void *state, int type, void *data, size_t size, const char *name,
                          unsigned int n, int *o, void **v) {
    if (type == 1 && strstr(data, "// egpu-refuse")) {
        logf_("cuLinkAddData_v2 refused");
        return INVALID_PTX;
    }
    logf_("cuLinkAddData_v2 type=%d size=%zu instrumented=%d", type, size,
          type == 1 && strstr(data, "// egpu-instrumented") != NULL);
    struct link *l = state;
    if (type == 1) {
        size_t add = strnlen(data, size);
        l->ptx = realloc(l->ptx, l->len + add + 2);
        memcpy(l->ptx + l->len, data, add);
        l->len += add;
        l->ptx[l->len++] = '\n';
        l->ptx[l->len] = 0;
    }
    return OK;
}
CUresult cuLinkAddFile_v2(void *state, int type, const char *path, unsigned int n, int *o, void **v) {
    logf_("cuLinkAddFile_v2 type=%d path=%s", type, path);
    return OK;
}
CUresult cuLinkComplete(void *state, void **out, size_t *size) {
    logf_("cuLinkComplete");
    struct link *l = state;
    size_t end = 64 + l->len + 1;
    free(l->cubin);
    l->cubin = calloc(1, end);
    memcpy(l->cubin, "\x7f" "ELF\x02\x01\x01", 7);
    memcpy(l->cubin + 0x28, &end, 8);   /* e_shoff: no sections, the image ends there */
    if (l->len) memcpy(l->cubin + 64, l->ptx, l->len);
    *out = l->cubin;
    *size = end;
    return OK;
}
CUresult cuLinkDestroy(void *state) {
    logf_("cuLinkDestroy");
    struct link *l = state;
    free(l->ptx);
    free(l->cubin);
    free(l);
    return OK;
}

/* What the driver refuses of a launch before it runs: more than 48 KiB of dynamic shared memory unless the
 * function was allowed it (INVALID_VALUE), or a module's function in a context of another device than the
 * module's (INVALID_HANDLE: the module is not loaded there). 0: taken. Not checked unlogged, as apps launch
 * made-up handles then (log_launch). */
static CUresult refused(const char *api, const void *f, unsigned shmem) {
    const struct function *fn = f;
    CUresult r = 0;
    if (!logging()) return 0;
    if (fn && shmem > 48 * 1024 && shmem > (unsigned)shared_allowed(fn)) r = INVALID_VALUE;
    else if (fn && !fn->kernel && fn->m && fn->m->device != current_device()) r = INVALID_HANDLE;
    if (r)
        logf_("launch refused api=%s f=%s@%d shmem=%u result=%d", api, fn->name, fn->m ? fn->m->id : 0, shmem, r);
    return r;
}

#define LAUNCH(sym) \
    CUresult sym(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, \
                 unsigned shmem, void *stream, void **params, void **extra) { \
        CUresult r = refused(#sym, f, shmem); \
        if (r) return r; \
        log_launch(#sym, f, gx, bx, stream, params, extra, 1); \
        return gx ? OK : INVALID_VALUE; \
    }
LAUNCH(cuLaunchKernel)
LAUNCH(cuLaunchKernel_ptsz)

typedef struct {
    unsigned int gx, gy, gz, bx, by, bz, shmem;
    void *stream, *attrs;
    unsigned int nattrs;
} config;
#define LAUNCH_EX(sym) \
    CUresult sym(const config *c, void *f, void **params, void **extra) { \
        CUresult r = refused(#sym, f, c->shmem); \
        if (r) return r; \
        log_launch(#sym, f, c->gx, c->bx, c->stream, params, extra, 1); \
        return OK; \
    }
LAUNCH_EX(cuLaunchKernelEx)
LAUNCH_EX(cuLaunchKernelEx_ptsz)

#define LAUNCH_COOP(sym) \
    CUresult sym(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, \
                 unsigned shmem, void *stream, void **params) { \
        CUresult r = refused(#sym, f, shmem); \
        if (r) return r; \
        log_launch(#sym, f, gx, bx, stream, params, NULL, 1); \
        return OK; \
    }
LAUNCH_COOP(cuLaunchCooperativeKernel)
LAUNCH_COOP(cuLaunchCooperativeKernel_ptsz)

typedef struct {
    void *func;
    unsigned int gx, gy, gz, bx, by, bz, shmem;
    void **params, **extra;
    void *kern, *ctx; /* _v2 and _v3 only */
} node_params;
/* CUgraphNodeParams: the type, then a 232-byte union */
typedef struct {
    int type, reserved0[3];
    union { long long reserved1[29]; node_params kernel; };
    long long reserved2;
} graph_node;
#define NODE_KERNEL 0
#define NODE_MEM_ALLOC 10
#define NODE_ALLOC_DPTR 14 /* alloc.dptr, the out parameter of a memory node: byte 128 */

/* A kernel node is logged like a launch, and refused like one with an empty grid. */
static CUresult log_node(const char *api, const node_params *p, int v2) {
    const void *f = p->func ? p->func : (v2 ? p->kern : NULL);
    log_launch(api, f, p->gx, p->bx, NULL, p->params, p->extra, 0);
    return p->gx ? OK : INVALID_VALUE;
}
/* Other nodes by their type; a new memory node gets its address, and the parameters of one cannot
 * be set (as the driver says of cuGraphNodeSetParams). */
static CUresult log_any_node(const char *api, graph_node *p, int adding) {
    if (p->type == NODE_KERNEL) return log_node(api, &p->kernel, 1);
    logf_("%s type=%d", api, p->type);
    if (p->type != NODE_MEM_ALLOC) return OK;
    if (!adding) return NOT_SUPPORTED;
    p->reserved1[NODE_ALLOC_DPTR] = 0x7e0000000000ll;
    return OK;
}
static int node_count;
static void *new_node(void) { return (void *)(intptr_t)++node_count; }

CUresult cuGraphAddKernelNode(void **node, void *g, void **deps, size_t n, const node_params *p) {
    *node = new_node();
    return log_node(__func__, p, 0);
}
CUresult cuGraphAddKernelNode_v2(void **node, void *g, void **deps, size_t n, const node_params *p) {
    *node = new_node();
    return log_node(__func__, p, 1);
}
CUresult cuGraphKernelNodeSetParams(void *node, const node_params *p) { return log_node(__func__, p, 0); }
CUresult cuGraphKernelNodeSetParams_v2(void *node, const node_params *p) { return log_node(__func__, p, 1); }
CUresult cuGraphExecKernelNodeSetParams(void *exec, void *node, const node_params *p) {
    return log_node(__func__, p, 0);
}
CUresult cuGraphExecKernelNodeSetParams_v2(void *exec, void *node, const node_params *p) {
    return log_node(__func__, p, 1);
}
CUresult cuGraphAddNode(void **node, void *g, void **deps, size_t n, graph_node *p) {
    *node = new_node();
    return log_any_node(__func__, p, 1);
}
CUresult cuGraphAddNode_v2(void **node, void *g, void **deps, const void *edges, size_t n, graph_node *p) {
    *node = new_node();
    return log_any_node(__func__, p, 1);
}
CUresult cuGraphNodeSetParams(void *node, graph_node *p) { return log_any_node(__func__, p, 0); }
CUresult cuGraphExecNodeSetParams(void *exec, void *node, graph_node *p) { return log_any_node(__func__, p, 0); }

/* A graph replay: the stand-in keeps no graphs, so it only tells the stand-in sanitizer (event 99, not the
 * driver's), which logs what every patched module would run now. */
#define GRAPH_LAUNCH(sym) \
    CUresult sym(void *exec, void *stream) { \
        logf_(#sym " exec=%p", exec); \
        if (san_event) san_event(99, 0, NULL); \
        return OK; \
    }
GRAPH_LAUNCH(cuGraphLaunch)
GRAPH_LAUNCH(cuGraphLaunch_ptsz)

/* Stream capture, minimally: which streams capture, in which mode. A launch into one is logged and run at
 * once like any other (the stand-in keeps no graphs); the legacy stream (NULL) cannot capture, as on the
 * driver, and ending a capture a stream never began is refused. The driver's rules for calls made while
 * a capture goes on (cuStreamBeginCapture, cuThreadExchangeStreamCaptureMode): a thread not in relaxed
 * mode may not make unsafe calls (cuMemAlloc) while a capture not begun relaxed goes on, and a copy on
 * the legacy stream would have to wait for the capturing (blocking) stream; either call fails and
 * invalidates the captures, which then end with CAPTURE_INVALIDATED. */
static void *capturing[16];
static int capture_modes[16], captures_invalidated;
static __thread int thread_mode;   /* CU_STREAM_CAPTURE_MODE_GLOBAL */
static CUresult begin_capture(const char *api, void *stream, int mode) {
    logf_("%s stream=%p mode=%d", api, stream, mode);
    if (!stream) return CAPTURE_UNSUPPORTED;
    for (int i = 0; i < 16; i++)
        if (!capturing[i]) { capturing[i] = stream; capture_modes[i] = mode; return OK; }
    return NOT_SUPPORTED;
}
static CUresult end_capture(const char *api, void *stream, void **graph) {
    logf_("%s stream=%p", api, stream);
    for (int i = 0; stream && i < 16; i++)
        if (capturing[i] == stream) {
            capturing[i] = NULL;
            *graph = (void *)0x6a;
            return captures_invalidated ? CAPTURE_INVALIDATED : OK;
        }
    return CAPTURE_UNMATCHED;
}
/* The result a call of this kind gets now: OK, or the error it gets while a capture goes on (which also
 * invalidates the captures). waits: a call that would wait for the capturing (blocking) stream, in any
 * mode (a synchronous copy on the legacy stream, cuCtxSynchronize); else an unsafe call (cuMemAlloc). */
CUresult egpu_stub_during_capture(const char *api, int waits) {
    for (int i = 0; i < 16; i++)
        if (capturing[i] && (waits || (capture_modes[i] != MODE_RELAXED && thread_mode != MODE_RELAXED))) {
            logf_("%s refused: a stream is capturing", api);
            captures_invalidated = 1;
            return waits ? CAPTURE_IMPLICIT : CAPTURE_UNSUPPORTED;
        }
    return OK;
}
CUresult cuThreadExchangeStreamCaptureMode(int *mode) {
    int old = thread_mode;
    thread_mode = *mode;
    *mode = old;
    return OK;
}
CUresult cuStreamBeginCapture(void *s) { return begin_capture(__func__, s, 0); }
CUresult cuStreamBeginCapture_ptsz(void *s) { return begin_capture(__func__, s, 0); }
CUresult cuStreamBeginCapture_v2(void *s, int mode) { return begin_capture(__func__, s, mode); }
CUresult cuStreamBeginCapture_v2_ptsz(void *s, int mode) { return begin_capture(__func__, s, mode); }
CUresult cuStreamBeginCaptureToGraph(void *s, void *g, void **deps, const void *edges, size_t n, int mode) {
    return begin_capture(__func__, s, mode);
}
CUresult cuStreamBeginCaptureToGraph_ptsz(void *s, void *g, void **deps, const void *edges, size_t n, int mode) {
    return begin_capture(__func__, s, mode);
}
CUresult cuStreamIsCapturing(void *s, int *status) { /* CU_STREAM_CAPTURE_STATUS_ACTIVE = 1 */
    *status = 0;
    for (int i = 0; s && i < 16; i++) *status |= capturing[i] == s;
    return OK;
}
CUresult cuStreamEndCapture(void *s, void **graph) { return end_capture(__func__, s, graph); }
CUresult cuStreamEndCapture_ptsz(void *s, void **graph) { return end_capture(__func__, s, graph); }

static CUdeviceptr next_ptr = 0x700000000000ull;
static CUdeviceptr new_ptr(size_t size) { CUdeviceptr p = next_ptr; next_ptr += (size + 0xfff) & ~0xfffull; return p; }
/* EGPU_STUB_ALLOC_LIMIT=N: allocations of more than N bytes fail as out of memory (2), as a full device. */
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size) {
    CUresult r = egpu_stub_during_capture(__func__, 0);
    if (r != OK) return r;
    const char *limit = getenv("EGPU_STUB_ALLOC_LIMIT");
    if (limit && size > strtoull(limit, NULL, 0)) {
        logf_("cuMemAlloc_v2 size=%zu refused: out of memory", size);
        return 2;
    }
    *p = new_ptr(size) + ((CUdeviceptr)current_device() << 40); /* device d's memory: d TB up */
    logf_("cuMemAlloc_v2 size=%zu", size);
    return OK;
}
CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int e) {
    *pitch = (w + 511) & ~(size_t)511;
    *p = new_ptr(*pitch * h);
    logf_("cuMemAllocPitch_v2");
    return OK;
}
CUresult cuMemAllocManaged(CUdeviceptr *p, size_t size, unsigned int flags) {
    *p = new_ptr(size);
    logf_("cuMemAllocManaged");
    return OK;
}
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, void *s) {
    *p = new_ptr(size);
    logf_("cuMemAllocAsync");
    return OK;
}
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t size, void *s) {
    *p = new_ptr(size);
    logf_("cuMemAllocAsync_ptsz");
    return OK;
}
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t size, void *pool, void *s) {
    *p = new_ptr(size);
    logf_("cuMemAllocFromPoolAsync");
    return OK;
}
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t size, void *pool, void *s) {
    *p = new_ptr(size);
    logf_("cuMemAllocFromPoolAsync_ptsz");
    return OK;
}
CUresult cuMemFree_v2(CUdeviceptr p) { logf_("cuMemFree_v2 ptr=%#llx", p); return p ? OK : INVALID_VALUE; }
CUresult cuMemFreeAsync(CUdeviceptr p, void *s) { logf_("cuMemFreeAsync"); return OK; }
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, void *s) { logf_("cuMemFreeAsync_ptsz"); return OK; }
CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
    *pp = malloc(size);
    logf_("cuMemHostAlloc");
    return OK;
}
CUresult cuMemAllocHost_v2(void **pp, size_t size) {
    *pp = malloc(size);
    logf_("cuMemAllocHost_v2 size=%zu", size);
    return OK;
}
CUresult cuMemFreeHost(void *p) { free(p); logf_("cuMemFreeHost"); return OK; }
CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned int flags) { logf_("cuMemHostRegister_v2"); return OK; }
CUresult cuMemHostUnregister(void *p) { logf_("cuMemHostUnregister"); return OK; }
CUresult cuMemCreate(unsigned long long *h, size_t size, const void *prop, unsigned long long flags) {
    *h = 42;
    logf_("cuMemCreate");
    return OK;
}
CUresult cuMemRelease(unsigned long long h) { logf_("cuMemRelease"); return OK; }
CUresult cuMemMap(CUdeviceptr p, size_t size, size_t off, unsigned long long h, unsigned long long flags) {
    logf_("cuMemMap");
    return OK;
}
CUresult cuMemUnmap(CUdeviceptr p, size_t size) { logf_("cuMemUnmap"); return OK; }
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) { logf_("cuMemcpy size=%zu", n); return OK; }
CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) { logf_("cuMemcpy_ptds size=%zu", n); return OK; }

/* ---- cuGetProcAddress: the newest row not newer than the requested version, the per-thread twin
 * when flags ask for it (CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2) ---- */

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status);

/* Every copy, set and synchronization the shim hooks, for the host-API probes' tests: each logs its name
 * and first three arguments and succeeds. Weak, so that runtime_stub/driver_more.c and driver_cow.c,
 * which move bytes, replace those they define. The arguments are read as 64-bit words: in the x86-64
 * ABI every integer or pointer argument of these calls sits in its own register, and unread ones cost
 * nothing. */
#define ANY(sym) __attribute__((weak)) \
    CUresult sym(unsigned long long a, unsigned long long b, unsigned long long c) { \
        logf_(#sym " a=%#llx b=%#llx c=%#llx", a, b, c); return OK; }
#define TWINS(sym, twin) ANY(sym) ANY(twin)
TWINS(cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds) TWINS(cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds)
TWINS(cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds) TWINS(cuMemcpyAsync, cuMemcpyAsync_ptsz)
TWINS(cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz) TWINS(cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz)
TWINS(cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz) TWINS(cuMemcpyPeer, cuMemcpyPeer_ptds)
TWINS(cuMemcpyPeerAsync, cuMemcpyPeerAsync_ptsz) TWINS(cuMemcpy2D_v2, cuMemcpy2D_v2_ptds)
TWINS(cuMemcpy2DUnaligned_v2, cuMemcpy2DUnaligned_v2_ptds) TWINS(cuMemcpy2DAsync_v2, cuMemcpy2DAsync_v2_ptsz)
TWINS(cuMemcpy3D_v2, cuMemcpy3D_v2_ptds) TWINS(cuMemcpy3DAsync_v2, cuMemcpy3DAsync_v2_ptsz)
TWINS(cuMemcpy3DPeer, cuMemcpy3DPeer_ptds) TWINS(cuMemcpy3DPeerAsync, cuMemcpy3DPeerAsync_ptsz)
TWINS(cuMemsetD8_v2, cuMemsetD8_v2_ptds) TWINS(cuMemsetD16_v2, cuMemsetD16_v2_ptds)
TWINS(cuMemsetD32_v2, cuMemsetD32_v2_ptds) TWINS(cuMemsetD2D8_v2, cuMemsetD2D8_v2_ptds)
TWINS(cuMemsetD2D16_v2, cuMemsetD2D16_v2_ptds) TWINS(cuMemsetD2D32_v2, cuMemsetD2D32_v2_ptds)
TWINS(cuMemsetD8Async, cuMemsetD8Async_ptsz) TWINS(cuMemsetD16Async, cuMemsetD16Async_ptsz)
TWINS(cuMemsetD32Async, cuMemsetD32Async_ptsz) TWINS(cuMemsetD2D8Async, cuMemsetD2D8Async_ptsz)
TWINS(cuMemsetD2D16Async, cuMemsetD2D16Async_ptsz) TWINS(cuMemsetD2D32Async, cuMemsetD2D32Async_ptsz)
TWINS(cuStreamSynchronize, cuStreamSynchronize_ptsz) ANY(cuEventSynchronize) ANY(cuCtxSynchronize_v2)
TWINS(cuMemcpyHtoA_v2, cuMemcpyHtoA_v2_ptds) TWINS(cuMemcpyAtoH_v2, cuMemcpyAtoH_v2_ptds)
TWINS(cuMemcpyDtoA_v2, cuMemcpyDtoA_v2_ptds) TWINS(cuMemcpyAtoD_v2, cuMemcpyAtoD_v2_ptds)
TWINS(cuMemcpyAtoA_v2, cuMemcpyAtoA_v2_ptds) TWINS(cuMemcpyHtoAAsync_v2, cuMemcpyHtoAAsync_v2_ptsz)
TWINS(cuMemcpyAtoHAsync_v2, cuMemcpyAtoHAsync_v2_ptsz) TWINS(cuMemcpyBatchAsync, cuMemcpyBatchAsync_ptsz)
TWINS(cuMemcpyBatchAsync_v2, cuMemcpyBatchAsync_v2_ptsz) TWINS(cuGraphAddMemcpyNode, cuGraphAddMemsetNode)
#undef TWINS
#undef ANY
/* Device memory is what new_ptr hands out (0x7000'0000'0000 up): CU_MEMORYTYPE_DEVICE (2); anything else
 * is memory CUDA does not know (pageable host memory), which the driver refuses as invalid. */
CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr p) {
    if (attribute != 2 || p < 0x700000000000ull || p >= 0x710000000000ull) return INVALID_VALUE;
    *(unsigned int *)data = 2;
    return OK;
}

static const struct { const char *api; int version, ptsz; const char *symbol; void *fn; } rows[] = {
#define R(api, ver, ptsz, sym) {#api, ver, ptsz, #sym, (void *)sym},
    R(cuGetProcAddress, 11030, 0, cuGetProcAddress) R(cuGetProcAddress, 12000, 0, cuGetProcAddress_v2)
    R(cuInit, 2000, 0, cuInit) R(cuDriverGetVersion, 2020, 0, cuDriverGetVersion)
    R(cuCtxSynchronize, 2000, 0, cuCtxSynchronize) R(cuFuncGetAttribute, 2020, 0, cuFuncGetAttribute)
    R(cuFuncIsLoaded, 12040, 0, cuFuncIsLoaded) R(cuFuncLoad, 12040, 0, cuFuncLoad)
    R(cuFuncSetAttribute, 9000, 0, cuFuncSetAttribute)
    R(cuModuleEnumerateFunctions, 12040, 0, cuModuleEnumerateFunctions)
    R(cuOccupancyMaxActiveBlocksPerMultiprocessor, 6050, 0, cuOccupancyMaxActiveBlocksPerMultiprocessor)
    R(cuKernelGetAttribute, 12000, 0, cuKernelGetAttribute)
    R(cuGraphInstantiateWithFlags, 11040, 0, cuGraphInstantiateWithFlags)
    R(cuGetExportTable, 3000, 0, cuGetExportTable)
    R(cuModuleLoad, 2000, 0, cuModuleLoad) R(cuModuleLoadData, 2000, 0, cuModuleLoadData)
    R(cuModuleLoadDataEx, 2010, 0, cuModuleLoadDataEx) R(cuModuleLoadFatBinary, 2000, 0, cuModuleLoadFatBinary)
    R(cuModuleUnload, 2000, 0, cuModuleUnload) R(cuModuleGetFunction, 2000, 0, cuModuleGetFunction)
    R(cuLibraryLoadData, 12000, 0, cuLibraryLoadData) R(cuLibraryLoadFromFile, 12000, 0, cuLibraryLoadFromFile)
    R(cuLibraryUnload, 12000, 0, cuLibraryUnload) R(cuLibraryGetKernel, 12000, 0, cuLibraryGetKernel)
    R(cuLibraryGetModule, 12000, 0, cuLibraryGetModule) R(cuKernelGetFunction, 12000, 0, cuKernelGetFunction) \
    R(cuKernelSetAttribute, 12000, 0, cuKernelSetAttribute)
    R(cuLinkCreate, 5050, 0, cuLinkCreate) R(cuLinkCreate, 6050, 0, cuLinkCreate_v2)
    R(cuLinkAddData, 6050, 0, cuLinkAddData_v2) R(cuLinkAddFile, 6050, 0, cuLinkAddFile_v2)
    R(cuLinkComplete, 5050, 0, cuLinkComplete) R(cuLinkDestroy, 5050, 0, cuLinkDestroy)
    R(cuLaunchKernel, 4000, 0, cuLaunchKernel) R(cuLaunchKernel, 7000, 1, cuLaunchKernel_ptsz)
    R(cuLaunchKernelEx, 11060, 0, cuLaunchKernelEx) R(cuLaunchKernelEx, 11060, 1, cuLaunchKernelEx_ptsz)
    R(cuLaunchCooperativeKernel, 9000, 0, cuLaunchCooperativeKernel)
    R(cuLaunchCooperativeKernel, 9000, 1, cuLaunchCooperativeKernel_ptsz)
    R(cuGraphAddKernelNode, 10000, 0, cuGraphAddKernelNode) R(cuGraphAddKernelNode, 12000, 0, cuGraphAddKernelNode_v2)
    R(cuGraphKernelNodeSetParams, 10000, 0, cuGraphKernelNodeSetParams)
    R(cuGraphKernelNodeSetParams, 12000, 0, cuGraphKernelNodeSetParams_v2)
    R(cuGraphExecKernelNodeSetParams, 10010, 0, cuGraphExecKernelNodeSetParams)
    R(cuGraphExecKernelNodeSetParams, 12000, 0, cuGraphExecKernelNodeSetParams_v2)
    R(cuGraphAddNode, 12020, 0, cuGraphAddNode) R(cuGraphAddNode, 12030, 0, cuGraphAddNode_v2)
    R(cuGraphNodeSetParams, 12020, 0, cuGraphNodeSetParams)
    R(cuGraphExecNodeSetParams, 12020, 0, cuGraphExecNodeSetParams)
    R(cuGraphLaunch, 10000, 0, cuGraphLaunch) R(cuGraphLaunch, 10000, 1, cuGraphLaunch_ptsz)
    R(cuStreamBeginCapture, 10000, 0, cuStreamBeginCapture) R(cuStreamBeginCapture, 10000, 1, cuStreamBeginCapture_ptsz)
    R(cuStreamBeginCapture, 10010, 0, cuStreamBeginCapture_v2)
    R(cuStreamBeginCapture, 10010, 1, cuStreamBeginCapture_v2_ptsz)
    R(cuStreamBeginCaptureToGraph, 12030, 0, cuStreamBeginCaptureToGraph)
    R(cuStreamBeginCaptureToGraph, 12030, 1, cuStreamBeginCaptureToGraph_ptsz)
    R(cuStreamEndCapture, 10000, 0, cuStreamEndCapture) R(cuStreamEndCapture, 10000, 1, cuStreamEndCapture_ptsz)
    R(cuMemAlloc, 2000, 0, cuMemAlloc) R(cuMemAlloc, 3020, 0, cuMemAlloc_v2)
    R(cuMemAllocPitch, 3020, 0, cuMemAllocPitch_v2) R(cuMemAllocManaged, 6000, 0, cuMemAllocManaged)
    R(cuMemAllocAsync, 11020, 0, cuMemAllocAsync) R(cuMemAllocAsync, 11020, 1, cuMemAllocAsync_ptsz)
    R(cuMemAllocFromPoolAsync, 11020, 0, cuMemAllocFromPoolAsync)
    R(cuMemAllocFromPoolAsync, 11020, 1, cuMemAllocFromPoolAsync_ptsz)
    R(cuMemFree, 3020, 0, cuMemFree_v2) R(cuMemFreeAsync, 11020, 0, cuMemFreeAsync)
    R(cuMemFreeAsync, 11020, 1, cuMemFreeAsync_ptsz) R(cuMemHostAlloc, 2020, 0, cuMemHostAlloc)
    R(cuMemAllocHost, 3020, 0, cuMemAllocHost_v2) R(cuMemFreeHost, 2000, 0, cuMemFreeHost)
    R(cuMemHostRegister, 6050, 0, cuMemHostRegister_v2)
    R(cuMemHostUnregister, 4000, 0, cuMemHostUnregister) R(cuMemCreate, 10020, 0, cuMemCreate)
    R(cuMemRelease, 10020, 0, cuMemRelease) R(cuMemMap, 10020, 0, cuMemMap) R(cuMemUnmap, 10020, 0, cuMemUnmap)
    R(cuMemcpy, 4000, 0, cuMemcpy) R(cuMemcpy, 7000, 1, cuMemcpy_ptds)
    R(cuStreamIsCapturing, 10000, 0, cuStreamIsCapturing)
    R(cuStreamSynchronize, 2000, 0, cuStreamSynchronize) R(cuStreamSynchronize, 7000, 1, cuStreamSynchronize_ptsz)
    R(cuEventSynchronize, 2000, 0, cuEventSynchronize) R(cuCtxSynchronize, 13000, 0, cuCtxSynchronize_v2)
    R(cuMemcpyHtoDAsync, 3020, 0, cuMemcpyHtoDAsync_v2) R(cuMemcpyHtoDAsync, 7000, 1, cuMemcpyHtoDAsync_v2_ptsz)
    R(cuMemsetD8, 3020, 0, cuMemsetD8_v2) R(cuMemsetD8, 7000, 1, cuMemsetD8_v2_ptds)
#undef R
};

static int lookup(const char *symbol, void **pfn, int version, unsigned long long flags) {
    int best = -1, want_ptsz = (flags & 2) != 0;
    for (int i = 0; i < (int)(sizeof rows / sizeof rows[0]); i++) {
        if (strcmp(rows[i].api, symbol) || rows[i].version > version || (rows[i].ptsz && !want_ptsz)) continue;
        if (best < 0 || rows[i].ptsz > rows[best].ptsz ||
            (rows[i].ptsz == rows[best].ptsz && rows[i].version > rows[best].version))
            best = i;
    }
    *pfn = best >= 0 ? rows[best].fn : NULL;
    return best;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags) {
    int i = lookup(symbol, pfn, version, flags);
    logf_("cuGetProcAddress symbol=%s version=%d flags=%llu -> %s", symbol, version, flags,
          i >= 0 ? rows[i].symbol : "none");
    return i >= 0 ? OK : NOT_FOUND;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status) {
    int i = lookup(symbol, pfn, version, flags);
    logf_("cuGetProcAddress_v2 symbol=%s version=%d flags=%llu -> %s", symbol, version, flags,
          i >= 0 ? rows[i].symbol : "none");
    if (status) *status = i >= 0 ? 0 : 1;
    return i >= 0 ? OK : NOT_FOUND;
}
