/* Launches from many threads while the main thread swaps the target and drains launch records:
 * every launch must be counted once, recorded or counted as dropped, with a unique launch id, and
 * must reach one of the two targets. Prints "ok ..." or the first inconsistency. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "egpu_shim.h"

typedef void *H;

#define THREADS 4
#define LAUNCHES 20000

typedef CUresult (*launch_fn)(H, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, H,
                              void **, void **);
static launch_fn launch;
static H fa = (H)0x1000, fb = (H)0x2000; /* the stand-in is not asked to log: handles are never read */

static void *worker(void *arg) {
    for (int i = 0; i < LAUNCHES; i++) launch(fa, 1, 1, 1, 1, 1, 1, 0, arg, NULL, NULL);
    return NULL;
}

int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    launch = (launch_fn)dlsym(h, "cuLaunchKernel");
    int (*reg)(void *, void *) = dlsym(RTLD_DEFAULT, "egpu_shim_register");
    int (*records)(int) = dlsym(RTLD_DEFAULT, "egpu_shim_records");
    size_t (*drain)(struct egpu_launch_record *, size_t) = dlsym(RTLD_DEFAULT, "egpu_shim_drain");
    void (*stats)(struct egpu_stats *) = dlsym(RTLD_DEFAULT, "egpu_shim_stats");
    records(1);
    static struct egpu_launch_record r[THREADS * LAUNCHES];
    static unsigned char seen[THREADS * LAUNCHES + 1];
    pthread_t t[THREADS];
    for (long i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, (void *)(i + 1));
    size_t n = 0;
    for (int swap = 0; swap < 2000; swap++) {
        reg(fa, swap % 2 ? fb : NULL);
        n += drain(r + n, THREADS * LAUNCHES - n);
    }
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    n += drain(r + n, THREADS * LAUNCHES - n);
    struct egpu_stats s;
    stats(&s);
    for (size_t i = 0; i < n; i++) {
        unsigned long long id = r[i].launch_id;
        if (id == 0 || id > THREADS * LAUNCHES || seen[id]++) { printf("bad id %llu\n", id); return 1; }
        if (r[i].function != fa || (r[i].launched != fa && r[i].launched != fb)) { printf("bad target\n"); return 1; }
    }
    printf("ok launches=%llu recorded=%zu dropped=%llu\n", s.launches, n, s.dropped);
    return !(s.launches == THREADS * LAUNCHES && n == s.records && n + s.dropped == s.launches);
}
