/* A host-API probe run from a thread's last moments (launchvm.c's per-thread run state). A thread calls
 * cuCtxSynchronize, which has a program routed to it (so the shim makes the thread's run state and its
 * pthread key), then sets a key of its own, made after the shim's, whose destructor calls cuCtxSynchronize
 * again as the thread ends: the shim's destructor has run by then. The destructor first takes a block of
 * the heap (the size of the run state's first part) and fills it, and checks after the call that no run
 * wrote into it. Prints "runs=N heap=intact|written". The shim's C API by dlsym: no runtime, no driver. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "egpu_shim.h"
#include "egpu_launchvm.h"

#define API(name) __typeof__(&name) p_##name = dlsym(RTLD_DEFAULT, #name)
#define BLOCK 4096

size_t egpu_host_apis(const char **symbols, const char **api_names, const char **sections, size_t max);

static int (*sync_)(void);
static pthread_key_t key;
static int written;

struct insn { uint8_t code, regs; int16_t off; int32_t imm; };
static const struct insn EXIT0[] = {{0xb7, 0, 0, 0}, {0x95, 0, 0, 0}}; /* r0 = 0; exit */

static void last_call(void *unused) {
    (void)unused;
    unsigned char *block = malloc(BLOCK), want[BLOCK];
    if (!block) return;
    memset(block, 0xa5, BLOCK), memset(want, 0xa5, BLOCK);
    sync_();
    written = memcmp(block, want, BLOCK) != 0;
    free(block);
}

static void *thread(void *unused) {
    (void)unused;
    sync_(); /* the shim's key first */
    if (pthread_key_create(&key, last_call) || pthread_setspecific(key, &key)) exit(3);
    return NULL;
}

int main(void) {
    API(egpu_lvm_prog_new); API(egpu_lvm_route_api); API(egpu_lvm_prog_stats); API(egpu_host_apis);
    sync_ = (int (*)(void))dlsym(RTLD_DEFAULT, "cuCtxSynchronize");
    if (!p_egpu_lvm_prog_new || !p_egpu_lvm_route_api || !p_egpu_host_apis || !sync_) return 2;
    const char *symbols[EGPU_LVM_APIS], *names[EGPU_LVM_APIS], *sections[EGPU_LVM_APIS];
    size_t n = p_egpu_host_apis(symbols, names, sections, EGPU_LVM_APIS), api = 0;
    while (api < n && strcmp(symbols[api], "cuCtxSynchronize")) api++;
    struct egpu_lvm_prog *p = p_egpu_lvm_prog_new(EXIT0, 2, NULL, 0);
    if (api == n || !p || p_egpu_lvm_route_api((unsigned int)api, &p, 1)) return 2;
    pthread_t t;
    if (pthread_create(&t, NULL, thread, NULL) || pthread_join(t, NULL)) return 3;
    struct egpu_lvm_stats s;
    p_egpu_lvm_prog_stats(p, &s);
    printf("runs=%llu heap=%s\n", (unsigned long long)s.runs, written ? "written" : "intact");
    return 0;
}
