/* A uprobe on getppid, which a signal handler calls; another thread sends the signal every 0.5 ms while this one
 * runs a program of launchvm.c (egpu_lvm_exec, a loop of 4M instructions) under its lock, 20 times. Prints
 * "handled N" (whether the handler ran); a hang (the handler waiting for the lock its own thread holds) ends in
 * SIGALRM. The shim's C API by dlsym: no runtime. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <unistd.h>

#include "egpu_shim.h"
#include "egpu_launchvm.h"
#include "egpu_uprobe.h"

#define API(name) __typeof__(&name) p_##name = dlsym(RTLD_DEFAULT, #name)

static volatile int done, handled;
static pthread_t main_thread;

static void on_signal(int sig) { handled += getppid() > 0 && sig; }

static void *poke(void *arg) {
    while (!done) {
        pthread_kill(main_thread, SIGUSR1);
        usleep(500);
    }
    return arg;
}

int main(void) {
    API(egpu_lvm_prog_new); API(egpu_lvm_exec); API(egpu_uprobe_attach);
    if (!p_egpu_lvm_prog_new || !p_egpu_lvm_exec || !p_egpu_uprobe_attach) return 2;
    alarm(10);
    static const unsigned char nop[] = {0xb7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0}; /* r0 = 0; exit */
    /* r1 = 2000000; loop: r1 -= 1; if r1 != 0 goto loop; r0 = 0; exit */
    static const unsigned char loop[] = {0xb7, 1, 0, 0, 0x80, 0x84, 0x1e, 0, 0x17, 1, 0, 0, 1, 0, 0, 0,
                                         0x55, 1, 0xfe, 0xff, 0, 0, 0, 0, 0xb7, 0, 0, 0, 0, 0, 0, 0,
                                         0x95, 0, 0, 0, 0, 0, 0, 0};
    struct egpu_lvm_prog *probe = p_egpu_lvm_prog_new(nop, 2, NULL, 0), *busy = p_egpu_lvm_prog_new(loop, 5, NULL, 0);
    int ret = 0;
    if (!probe || !busy || p_egpu_uprobe_attach("libc.so.6", "getppid", &probe, &ret, 1)) return 3;
    main_thread = pthread_self();
    signal(SIGUSR1, on_signal);
    pthread_t t;
    pthread_create(&t, NULL, poke, NULL);
    for (int i = 0; i < 20; i++) {
        unsigned long long r0;
        unsigned int pc;
        p_egpu_lvm_exec(busy, NULL, 0, &r0, &pc);
    }
    done = 1;
    pthread_join(t, NULL);
    printf("handled %d\n", handled > 0);
    return 0;
}
