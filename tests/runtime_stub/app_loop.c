/* A job to attach to (tests/test_live.py): `app_loop STOP MAX_S [library] [write:FILE]` loads one PTX
 * module (with `library`: a library, as cudart loads, its kernel a CUkernel) whose kernel `step` keeps
 * __device__ state (.global .u64 launches[1]) that it bumps at every launch by a __constant__
 * (.const .u64 increment[1]; the stand-in runs that effect). It sets the state to 1000 and the
 * increment to 1 the way cudaMemcpyToSymbol does (cuModuleGetGlobal + cuMemcpyHtoD), prints "ready",
 * then launches `step` every millisecond until the file STOP exists (or MAX_S seconds passed), reads
 * the state back and prints launches, state and the OR of all results. With the state carried through
 * every swap, state == 1000 + launches. With `write:FILE`: once FILE exists, between two launches, it
 * sets the state to 5000 and the increment to 3 the same way and creates FILE.done; at the end it also
 * prints how many launches came before that and the increment it reads back, so then
 * state == 5000 + 3 * (launches - before) and increment == 3. With `graph:FILE`: once FILE exists, it
 * adds a graph kernel node of `step` (cuGraphAddKernelNode_v2) and creates FILE.done; with
 * `capture:FILE`, it captures one launch of `step` on a stream of its own (cuStreamBeginCapture_v2,
 * the launch, cuStreamEndCapture), then creates FILE.done. The stand-in runs the captured launch at
 * once, so it counts as a launch. With `hold:FILE`, it begins a capture (global mode) once FILE exists
 * and creates FILE.done, keeps launching on the legacy stream, and ends the capture once FILE.end
 * exists (its result goes into the OR), then creates FILE.end.done. With `stall:FILE`, once FILE exists
 * the context's work stops finishing (the stand-in's egpu_stub_hold_sync, as a kernel that never ends)
 * and the shim's hold limit becomes 500 ms, then FILE.done; once FILE.end exists the work finishes
 * again, then FILE.end.done. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char PTX[] =
    ".version 8.0\n.target sm_90\n.address_size 64\n\n"
    ".visible .global .align 8 .u64 launches[1];\n"
    ".visible .const .align 8 .u64 increment[1];\n\n"
    ".visible .entry step(\n\t.param .u64 a\n)\n{\n"
    "\t.reg .b64 %rd<4>;\n\tld.param.u64 %rd1, [a];\n\tld.global.u64 %rd2, [launches];\n"
    "\tld.const.u64 %rd3, [increment];\n\tadd.u64 %rd2, %rd2, %rd3;\n\tst.global.u64 [launches], %rd2;\n"
    "\tret;\n}\n";

typedef int (*fn)();
static fn get_global, htod, dtoh;

/* CUDA_KERNEL_NODE_PARAMS_v2 */
typedef struct {
    void *func;
    unsigned int gx, gy, gz, bx, by, bz, shmem;
    void **params, **extra;
    void *kern, *ctx;
} node_params;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The module variable `name`, written or read as cudaMemcpyToSymbol / FromSymbol do. */
static int set(void *mod, const char *name, unsigned long long v) {
    unsigned long long global = 0;
    size_t size = 0;
    return get_global(&global, &size, mod, name) | htod(global, &v, sizeof v);
}
static int get(void *mod, const char *name, unsigned long long *v) {
    unsigned long long global = 0;
    size_t size = 0;
    return get_global(&global, &size, mod, name) | dtoh(v, global, sizeof *v);
}

/* Whether the one-shot action of `file` is due now: once, when the file first exists. */
static int due(const char *file, int *done) {
    if (!file || *done || access(file, F_OK) != 0) return 0;
    return *done = 1;
}

/* Tell the test the action of `file` is done: FILE.done. */
static void done(const char *file) {
    char path[4096];
    snprintf(path, sizeof path, "%s.done", file);
    fclose(fopen(path, "w"));
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    int library = 0;
    const char *write = NULL, *graph = NULL, *capture = NULL, *hold = NULL, *stall = NULL;
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "library")) library = 1;
        else if (!strncmp(argv[i], "write:", 6)) write = argv[i] + 6;
        else if (!strncmp(argv[i], "graph:", 6)) graph = argv[i] + 6;
        else if (!strncmp(argv[i], "capture:", 8)) capture = argv[i] + 8;
        else if (!strncmp(argv[i], "hold:", 5)) hold = argv[i] + 5;
        else if (!strncmp(argv[i], "stall:", 6)) stall = argv[i] + 6;
        else return 2;
    }
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) return 2;
#define SYM(name) fn name = (fn)dlsym(cuda, #name)
    SYM(cuInit); SYM(cuModuleLoadData); SYM(cuModuleGetFunction); SYM(cuLaunchKernel); SYM(cuCtxSynchronize);
    SYM(cuModuleGetGlobal_v2); SYM(cuMemcpyHtoD_v2); SYM(cuMemcpyDtoH_v2);
    SYM(cuLibraryLoadData); SYM(cuLibraryGetKernel); SYM(cuLibraryGetGlobal);
    SYM(cuGraphAddKernelNode_v2); SYM(cuStreamBeginCapture_v2); SYM(cuStreamEndCapture);
    get_global = library ? cuLibraryGetGlobal : cuModuleGetGlobal_v2;
    htod = cuMemcpyHtoD_v2;
    dtoh = cuMemcpyDtoH_v2;
    void *mod = NULL, *f = NULL;
    unsigned long long state = 1000, increment = 0, arg = 7, k = 0, before = 0;
    int r = cuInit(0), written = 0, graphed = 0, captured = 0, held = 0, released = 0, stalled = 0, resumed = 0;
    char hold_end[4096], stall_end[4096];
    snprintf(hold_end, sizeof hold_end, "%s.end", hold ? hold : "");
    snprintf(stall_end, sizeof stall_end, "%s.end", stall ? stall : "");
    void (*hold_sync)(int) = (void (*)(int))dlsym(cuda, "egpu_stub_hold_sync");
    unsigned int (*hold_limit)(unsigned int) =
        (unsigned int (*)(unsigned int))dlsym(RTLD_DEFAULT, "egpu_shim_hold_limit");
    void *stream = (void *)0x5, *node = NULL, *captured_graph = NULL; /* the stand-in checks no stream */
    if (library)
        r |= cuLibraryLoadData(&mod, PTX, NULL, NULL, 0, NULL, NULL, 0) | cuLibraryGetKernel(&f, mod, "step");
    else
        r |= cuModuleLoadData(&mod, PTX) | cuModuleGetFunction(&f, mod, "step");
    r |= set(mod, "launches", state) | set(mod, "increment", 1);
    void *params[] = {&arg};
    double end = now() + atof(argv[2]);
    printf("ready\n");
    fflush(stdout);
    while (access(argv[1], F_OK) != 0 && now() < end) {
        if (due(write, &written)) {
            r |= set(mod, "launches", 5000) | set(mod, "increment", 3);
            before = k;
            done(write);
        }
        if (due(graph, &graphed)) {
            node_params p = {f, 1, 1, 1, 32, 1, 1, 0, params, NULL, NULL, NULL};
            r |= cuGraphAddKernelNode_v2(&node, (void *)0x9, NULL, (size_t)0, &p);
            done(graph);
        }
        if (due(capture, &captured)) {
            r |= cuStreamBeginCapture_v2(stream, 0);
            r |= cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, stream, params, NULL);
            k++;
            r |= cuStreamEndCapture(stream, &captured_graph);
            done(capture);
        }
        if (due(hold, &held)) {
            r |= cuStreamBeginCapture_v2(stream, 0);
            done(hold);
        }
        if (held && due(hold_end, &released)) {
            r |= cuStreamEndCapture(stream, &captured_graph);
            done(hold_end);
        }
        if (due(stall, &stalled)) {
            hold_limit(500);
            hold_sync(1);
            done(stall);
        }
        if (stalled && due(stall_end, &resumed)) {
            hold_sync(0);
            done(stall_end);
        }
        r |= cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
        k++;
        usleep(1000);
    }
    r |= cuCtxSynchronize();
    r |= get(mod, "launches", &state) | get(mod, "increment", &increment);
    printf("app_loop launches=%llu state=%llu result=%d\n", k, state, r);
    if (write) printf("app_loop wrote=%d before=%llu increment=%llu\n", written, before, increment);
    return r ? 1 : 0;
}
