/* `app_stress ROUNDS STOP`, under egpu-run on the stand-in driver (tests/test_uprobes.py's stress test): 8
 * threads each make ROUNDS rounds without pause, then go on, a round each 100 us (the CPUs left to the
 * runtime and to egpu attach), until file STOP exists. A round: cuMemAlloc_v2 (256 (t + 1) bytes, t the
 * thread's index), cuMemcpy (16 (t + 1) bytes), cuLaunchKernel (grid t + 1), libupt's upt_add6(t, i, 1, 1,
 * 1, 1) and cuMemFree_v2: host-API and launch probes run in 8 threads and the launch drainer at once, beside
 * whatever egpu attach hooks meanwhile. Prints "thread T rounds=R" for each thread, then "rounds=R wrong=W
 * failed=F": W upt_add6 results not right, F driver calls that did not succeed. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define THREADS 8

long upt_add6(long a, long b, long c, long d, long e, long f);

typedef int (*fn)();
typedef unsigned long long u64;

static const char PTX[] =
    ".version 8.0\n.target sm_90\n.address_size 64\n\n"
    ".visible .entry vecadd(\n\t.param .u64 a\n)\n{\n\tret;\n}\n";

static fn alloc, copy, launch, release;
static void *kernel;
static long min_rounds;
static atomic_int stopping;
static atomic_long wrong, failed;
static long rounds[THREADS];

static void *worker(void *arg) {
    long t = (long)arg, bad = 0, fails = 0, i;
    for (i = 0; i < min_rounds || !atomic_load_explicit(&stopping, memory_order_relaxed); i++) {
        u64 d = 0;
        fails += alloc(&d, (size_t)256 * (t + 1)) != 0;
        fails += copy(d, d + 64, (size_t)16 * (t + 1)) != 0;
        fails += launch(kernel, (unsigned)t + 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) != 0;
        bad += upt_add6(t, i, 1, 1, 1, 1) != t + i + 4;
        fails += release(d) != 0;
        if (i >= min_rounds) usleep(100);
    }
    rounds[t] = i;
    atomic_fetch_add(&wrong, bad);
    atomic_fetch_add(&failed, fails);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    min_rounds = atol(argv[1]);
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW), *mod = NULL;
    if (!cuda) return 2;
    alloc = (fn)dlsym(cuda, "cuMemAlloc_v2"), copy = (fn)dlsym(cuda, "cuMemcpy");
    launch = (fn)dlsym(cuda, "cuLaunchKernel"), release = (fn)dlsym(cuda, "cuMemFree_v2");
    if (((fn)dlsym(cuda, "cuInit"))(0) | ((fn)dlsym(cuda, "cuModuleLoadData"))(&mod, PTX) |
        ((fn)dlsym(cuda, "cuModuleGetFunction"))(&kernel, mod, "vecadd"))
        return 3;
    pthread_t threads[THREADS];
    for (long t = 0; t < THREADS; t++) pthread_create(&threads[t], NULL, worker, (void *)t);
    while (access(argv[2], F_OK)) usleep(1000);
    atomic_store(&stopping, 1);
    long total = 0;
    for (int t = 0; t < THREADS; t++) {
        pthread_join(threads[t], NULL);
        printf("thread %d rounds=%ld\n", t, rounds[t]);
        total += rounds[t];
    }
    printf("rounds=%ld wrong=%ld failed=%ld\n", total, atomic_load(&wrong), atomic_load(&failed));
    return 0;
}
