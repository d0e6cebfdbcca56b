/* Looks the same kernels up again and again, as cuDNN, cuBLAS and cudart do: Python must hear of each
 * (lookup, module, handle) once, and again after any unload (handles may be reused then). Prints
 * "lookups first=N repeated=N after_unload=N redirected=N": the shim's Python calls each phase made.
 * "race": a second thread looks a kernel up while the first one's lookup of it is still in Python
 * (run with EGPU_TEST_FOUND_DELAY), then launches it; prints "race redirected=N". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "egpu_shim.h"

typedef void *H;

static const char PTX[] = ".version 8.0\n.target sm_90\n.address_size 64\n\n"
                          ".visible .entry kernel_a(\n\t.param .u64 a,\n\t.param .u64 b\n)\n{\n\tret;\n}\n";

static void (*stats)(struct egpu_stats *);
static CUresult (*get)(H *, H, const char *);
static H racing;

static void *look_up(void *arg) {
    H f;
    get(&f, racing, "kernel_a");
    return arg;
}

static unsigned long long python_calls(void) {
    struct egpu_stats s;
    stats(&s);
    return s.python_calls;
}

int main(int argc, char **argv) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    CUresult (*init)(unsigned) = dlsym(h, "cuInit");
    CUresult (*load)(H *, const void *) = dlsym(h, "cuModuleLoadData");
    CUresult (*unload)(H) = dlsym(h, "cuModuleUnload");
    get = dlsym(h, "cuModuleGetFunction");
    CUresult (*launch)(H, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, H, void **,
                       void **) = dlsym(h, "cuLaunchKernel");
    stats = dlsym(RTLD_DEFAULT, "egpu_shim_stats");
    H m1, m2, f, again;
    unsigned long long a = 1, b = 2;
    void *params[] = {&a, &b};
    struct egpu_stats s;
    init(0);
    if (argc > 1 && !strcmp(argv[1], "race")) {
        load(&racing, PTX);
        pthread_t t;
        pthread_create(&t, NULL, look_up, NULL);
        usleep(100000); /* the thread's lookup is in Python now */
        get(&f, racing, "kernel_a");
        launch(f, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
        pthread_join(t, NULL);
        stats(&s);
        printf("race redirected=%llu\n", s.redirected);
        return 0;
    }
    load(&m1, PTX);
    load(&m2, PTX);
    unsigned long long base = python_calls();
    get(&f, m1, "kernel_a");
    unsigned long long first = python_calls() - base;
    for (int i = 0; i < 1000; i++) get(&again, m1, "kernel_a");
    unsigned long long repeated = python_calls() - base - first;
    unload(m2);
    base = python_calls();
    get(&again, m1, "kernel_a");
    unsigned long long after = python_calls() - base;
    launch(again, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
    stats(&s);
    printf("lookups first=%llu repeated=%llu after_unload=%llu redirected=%llu\n", first, repeated, after,
           s.redirected);
    return again != f;
}
