/* The shim's safety tests' program (tests/test_shim.py) against the full stand-in driver (libcuda_stub.c
 * with driver_more.c and driver_cow.c), entry points by dlsym.
 *
 *   app_safety gate      a swap whose drain never ends (egpu_stub_hold_sync) while a thread launches:
 *                        prints "timed_out R MS" (the swap's result, how long it took), then after the
 *                        work ended "swapped R", then "launches N max_ms MS old N new N wrong N": each
 *                        launch's record against the launch counter at the flip that went through
 *   app_safety oom       launches of a kernel registered with a launch id while malloc fails: buffer
 *                        form and kernelParams form, then the same with memory; prints
 *                        "oom buffer R params R node R after R refused N"
 *   app_safety fork STOP a job under egpu-run that forks while another thread's swap holds the launch
 *                        gate: the child launches, allocates and copies until STOP exists, as the parent
 *                        does; prints "child exit=N" and "parent steps=N swap=R"
 *   app_safety capture   rings wait and a thread's egpu_shim_idle synchronizes while the work never ends
 *                        (held 200 ms): a capture begun meanwhile on another thread; prints "capture begin R
 *                        ms MS idled_first N idle_after_ms MS end R"
 *   app_safety allocs    the allocation table filled (65536 host ranges registered), then every range
 *                        unregistered, one of them registered again between; prints "allocs full N less N
 *                        again N empty N" (the table's count after each)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "egpu_shim.h"

typedef int (*fn)();
static void *cuda;
#define SYM(name) fn name = (fn)dlsym(cuda, #name)
#define API(name) __typeof__(&name) p_##name = dlsym(RTLD_DEFAULT, #name)

static const char PTX[] = ".version 8.0\n.target sm_90\n.address_size 64\n\n"
                          ".visible .entry kernel_a(\n\t.param .u64 a,\n\t.param .u64 b\n)\n{\n\tret;\n}\n";

/* malloc that fails for requests of fail_from bytes or more while fail_from is set (the shim's calls
 * bind here: the program is linked with -rdynamic) */
extern void *__libc_malloc(size_t);
static volatile size_t fail_from;
void *malloc(size_t n) { return fail_from && n >= fail_from ? NULL : __libc_malloc(n); }

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

typedef CUresult (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              void *, void **, void **);
static launch_fn launch;
static void (*hold_sync)(int);
static void *fa = (void *)0x1000, *fb = (void *)0x2000; /* made-up handles: the stand-in is not logging */
static volatile int stop_launching;
static double max_launch_ms;
static int launched;

static void *launcher(void *arg) {
    while (!stop_launching) {
        double t0 = now_ms();
        launch(fa, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
        double dt = now_ms() - t0;
        if (dt > max_launch_ms) max_launch_ms = dt;
        launched++;
        usleep(200);
    }
    return arg;
}

static int swap_to(void *ctx, void *target, unsigned long long *at) {
    API(egpu_shim_swap);
    struct egpu_flip flip = {fa, target, 0, 0, 0};
    return p_egpu_shim_swap(ctx, NULL, 0, &flip, 1, NULL, 0, at);
}

static int gate(void) {
    SYM(cuCtxGetCurrent);
    API(egpu_shim_hold_limit); API(egpu_shim_records); API(egpu_shim_drain);
    void *ctx = NULL;
    cuCtxGetCurrent(&ctx);
    if (p_egpu_shim_hold_limit) p_egpu_shim_hold_limit(300);
    p_egpu_shim_records(1);
    pthread_t t;
    pthread_create(&t, NULL, launcher, NULL);
    usleep(50000);
    hold_sync(1);
    unsigned long long at = 0;
    double t0 = now_ms();
    int r = swap_to(ctx, fb, &at);
    printf("timed_out %d %.0f\n", r, now_ms() - t0);
    usleep(100000); /* launches go on, on the old target */
    hold_sync(0);
    usleep(50000);  /* the abandoned drain returns and ends */
    r = swap_to(ctx, fb, &at);
    printf("swapped %d\n", r);
    usleep(50000);
    stop_launching = 1;
    pthread_join(t, NULL);
    static struct egpu_launch_record recs[1 << 14];
    size_t n = p_egpu_shim_drain(recs, 1 << 14);
    int old = 0, new = 0, wrong = 0;
    for (size_t i = 0; i < n; i++) {
        int is_new = recs[i].launched == fb;
        old += !is_new, new += is_new;
        wrong += is_new != (recs[i].launch_id > at);
    }
    printf("launches %d max_ms %.0f old %d new %d wrong %d\n", launched, max_launch_ms, old, new, wrong);
    return 0;
}

static int oom(void) {
    SYM(cuInit); SYM(cuModuleLoadData); SYM(cuModuleGetFunction); SYM(cuGraphAddKernelNode);
    API(egpu_shim_register_launch_id); API(egpu_shim_stats);
    void *mod = NULL, *f = NULL, *node = NULL;
    int r = cuInit(0) | cuModuleLoadData(&mod, PTX) | cuModuleGetFunction(&f, mod, "kernel_a");
    unsigned long long a = 11, b = 22;
    static char buf[6000];
    memcpy(buf, &a, 8), memcpy(buf + 8, &b, 8);
    size_t size = sizeof buf;
    void *extra[] = {(void *)1, buf, (void *)2, &size, NULL};
    void *params[100] = {&a, &b};
    for (int i = 2; i < 100; i++) params[i] = &b;
    /* the id goes at byte 6000 of a 6000-byte buffer: a copy of 6008 bytes, more than the shim keeps inline */
    r |= p_egpu_shim_register_launch_id(f, f, 2, 6000);
    fail_from = 6000;
    int rb = launch(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, extra);
    fail_from = 0;
    /* 100 parameters and the id: an array of 808 bytes */
    r |= p_egpu_shim_register_launch_id(f, f, 100, 0);
    fail_from = 800;
    int rp = launch(f, 2, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
    struct { void *func; unsigned g[7]; void **params, **extra; } np = {f, {3, 1, 1, 32, 1, 1, 0}, params, NULL};
    int rn = cuGraphAddKernelNode(&node, (void *)0x6a, NULL, 0, &np);
    fail_from = 0;
    int ra = launch(f, 4, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
    struct egpu_stats st = {0};
    p_egpu_shim_stats(&st);
    printf("oom buffer %d params %d node %d after %d refused %llu\n", rb, rp, rn, ra, st.refused);
    return r;
}

static void *swapper(void *arg) {
    void *ctx = NULL;
    SYM(cuCtxGetCurrent);
    cuCtxGetCurrent(&ctx);
    *(int *)arg = swap_to(ctx, fb, NULL);
    return NULL;
}

/* A step: an allocation, a copy into it, a launch, the allocation freed. */
static int step(void *f) {
    SYM(cuMemAlloc_v2); SYM(cuMemcpyHtoD_v2); SYM(cuMemFree_v2);
    unsigned long long d = 0, x = 1, n = 1;
    void *params[] = {&d, &n};
    return cuMemAlloc_v2(&d, 8) | cuMemcpyHtoD_v2(d, &x, 8) | launch(f, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL) |
           cuMemFree_v2(d);
}

static int fork_job(const char *stop) {
    SYM(cuInit); SYM(cuModuleLoadData); SYM(cuModuleGetFunction);
    API(egpu_shim_hold_limit);
    void *mod = NULL, *f = NULL;
    int r = cuInit(0) | cuModuleLoadData(&mod, PTX) | cuModuleGetFunction(&f, mod, "kernel_a") | step(f);
    fa = fb = f; /* the swap flips f onto itself: launches reach a real handle either way */
    if (p_egpu_shim_hold_limit) p_egpu_shim_hold_limit(2000);
    hold_sync(1);
    int swapped = 0;
    pthread_t t;
    pthread_create(&t, NULL, swapper, &swapped);
    usleep(300000); /* the swap holds the gate, draining */
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        alarm(60); /* a child inherits no alarm */
        hold_sync(0);
        int steps = 0;
        double end = now_ms() + 40000;
        while (access(stop, F_OK) != 0 && now_ms() < end) {
            r |= step(f);
            steps++;
            usleep(2000);
        }
        printf("child steps=%d result=%d\n", steps, r);
        return r ? 1 : 0;
    }
    hold_sync(0);
    pthread_join(t, NULL);
    int steps = 0;
    while (access(stop, F_OK) != 0 && steps < 20000) {
        r |= step(f);
        steps++;
        usleep(2000);
    }
    int status = 0;
    waitpid(child, &status, 0);
    printf("child exit=%d\nparent steps=%d swap=%d result=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1,
           steps, swapped, r);
    return r || !WIFEXITED(status) || WEXITSTATUS(status);
}

static volatile int idled;

static void *idler(void *arg) {
    API(egpu_shim_idle);
    p_egpu_shim_idle();
    idled = 1;
    return arg;
}

static void *release_sync(void *arg) {
    usleep(200000);
    hold_sync(0);
    return arg;
}

static int capture(void) {
    SYM(cuInit); SYM(cuCtxGetCurrent); SYM(cuStreamBeginCapture_v2); SYM(cuStreamEndCapture);
    API(egpu_shim_rings_wait); API(egpu_shim_idle);
    void *ctx = NULL, *graph = NULL, *stream = (void *)0x5;
    cuInit(0);
    cuCtxGetCurrent(&ctx);
    p_egpu_shim_rings_wait(ctx);
    hold_sync(1);
    pthread_t idle_thread, release_thread;
    pthread_create(&idle_thread, NULL, idler, NULL);
    usleep(50000); /* the idler is in its synchronize */
    pthread_create(&release_thread, NULL, release_sync, NULL);
    double t0 = now_ms();
    int begin = cuStreamBeginCapture_v2(stream, 0);
    double ms = now_ms() - t0;
    int idled_first = idled;
    t0 = now_ms();
    hold_sync(1); /* a synchronize now would never end: the capture must keep idle from one */
    p_egpu_shim_idle();
    double idle_ms = now_ms() - t0;
    hold_sync(0);
    int end = cuStreamEndCapture(stream, &graph);
    pthread_join(idle_thread, NULL), pthread_join(release_thread, NULL);
    printf("capture begin %d ms %.0f idled_first %d idle_after_ms %.0f end %d\n", begin, ms, idled_first, idle_ms,
           end);
    return 0;
}

static int allocs(void) {
    SYM(cuMemHostRegister_v2); SYM(cuMemHostUnregister);
    API(egpu_shim_allocations);
    enum { N = 1 << 16 }; /* interpose.c's ALLOC_SIZE */
    int r = 0;
    alarm(10); /* a free that never ends is a hang */
    for (int i = 0; i < N; i++) r |= cuMemHostRegister_v2((void *)(0x10000000ul + 0x1000ul * i), 0x1000, 0);
    size_t full = p_egpu_shim_allocations(NULL, 0);
    r |= cuMemHostUnregister((void *)0x10000000ul);
    size_t less = p_egpu_shim_allocations(NULL, 0);
    r |= cuMemHostRegister_v2((void *)0x10000000ul, 0x1000, 0);
    size_t again = p_egpu_shim_allocations(NULL, 0);
    for (int i = 0; i < N; i++) r |= cuMemHostUnregister((void *)(0x10000000ul + 0x1000ul * i));
    printf("allocs full %zu less %zu again %zu empty %zu\n", full, less, again, p_egpu_shim_allocations(NULL, 0));
    return r;
}

int main(int argc, char **argv) {
    alarm(60); /* a hang is a failure, not a stuck test run */
    cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda || argc < 2) return 2;
    launch = (launch_fn)dlsym(cuda, "cuLaunchKernel");
    hold_sync = (void (*)(int))dlsym(cuda, "egpu_stub_hold_sync");
    if (!strcmp(argv[1], "gate")) return gate();
    if (!strcmp(argv[1], "oom")) return oom();
    if (!strcmp(argv[1], "capture")) return capture();
    if (!strcmp(argv[1], "allocs")) return allocs();
    if (!strcmp(argv[1], "fork") && argc == 3) return fork_job(argv[2]);
    return 2;
}
