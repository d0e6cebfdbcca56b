/* Runs of host uprobes from many threads at once (launchvm.c's header). `app_concurrent CALLS`:
 * - 8 threads each call libupt's upt_inc(k) CALLS times (k: the thread's index) with an entry program that
 *   counts every call into slot 0 of an array map (an atomic add) and into a hash map under key k (a lookup
 *   and an atomic add, the first call an update). Meanwhile the main thread attaches a marker program
 *   (slot 1) to the same function and detaches it, over and over: after a detach returns its count and
 *   its runs must stay as they are while the threads go on calling.
 * - then 2 threads call upt_inc with a program that waits, in a bounded loop, for another run to be
 *   under way at once (slot 2 counts runs inside, slot 3 how many saw another): with one lock around every
 *   run none ever does.
 * - then 8 threads call upt_inc with a program that adds 1 to a per-CPU array's value with a plain load and
 *   store (no atomic: a CPU's value is its own in Linux, and every host thread here runs on "CPU 0").
 * - then a thread calls upt_call, which calls back into `held`: the main thread keeps it there while it
 *   pauses the entry program (slot 0 of another array) and return program (slot 1) on upt_call or runs them
 *   again (egpu_uprobe_pause), three calls: entered paused, returned running; entered running, paused and
 *   running again meanwhile; entered running, returned paused. Their counts after each: `held`.
 * Prints "counted=N hash=H cycles=C late=L marker=M met=X percpu=P held=H". The shim's C API by dlsym: no
 * runtime. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "egpu_shim.h"
#include "egpu_launchvm.h"
#include "egpu_uprobe.h"

#define API(name) __typeof__(&name) p_##name = dlsym(RTLD_DEFAULT, #name)
#define THREADS 8
#define MEET_CALLS 2000

int upt_inc(int x);

struct insn { uint8_t code, regs; int16_t off; int32_t imm; };
#define I(code, dst, src, off, imm) {code, (uint8_t)((src) << 4 | (dst)), off, imm}
#define LD_MAP(dst, k) I(0x18, dst, 5, 0, k), I(0, 0, 0, 0, 0)       /* dst = map k (by index) */
#define LOOKUP(keyoff) I(0xbf, 2, 10, 0, 0), I(0x07, 2, 0, 0, keyoff), I(0x85, 0, 0, 0, 1) /* r0 = lookup(r1, fp+off) */
#define ADD1(reg) I(0xb7, 1, 0, 0, 1), I(0xdb, reg, 1, 0, 0)         /* lock *(u64 *)reg += 1 */
#define EXIT0 I(0xb7, 0, 0, 0, 0), I(0x95, 0, 0, 0, 0)

/* slot 0 += 1; hash[di] += 1 (inserted as 1 the first time) */
static const struct insn COUNT[] = {
    I(0x79, 6, 1, 112, 0),              /* r6 = ctx->di */
    I(0x63, 10, 6, -4, 0),              /* *(u32 *)(fp - 4) = r6 */
    I(0x62, 10, 0, -8, 0),              /* *(u32 *)(fp - 8) = 0 */
    LD_MAP(1, 0), LOOKUP(-8),
    I(0x15, 0, 0, 2, 0), ADD1(0),       /* if r0: *r0 += 1 */
    LD_MAP(1, 1), LOOKUP(-4),
    I(0x15, 0, 0, 3, 0), ADD1(0),       /* if r0: *r0 += 1, exit */
    I(0x05, 0, 0, 9, 0),
    I(0x7a, 10, 0, -16, 1),             /* else update(hash, fp - 4, fp - 16 = 1, BPF_ANY) */
    LD_MAP(1, 1), I(0xbf, 2, 10, 0, 0), I(0x07, 2, 0, 0, -4), I(0xbf, 3, 10, 0, 0), I(0x07, 3, 0, 0, -16),
    I(0xb7, 4, 0, 0, 0), I(0x85, 0, 0, 0, 2),
    EXIT0,
};

/* slot 1 += 1 */
static const struct insn MARK[] = {
    I(0x62, 10, 0, -4, 1), LD_MAP(1, 0), LOOKUP(-4), I(0x15, 0, 0, 2, 0), ADD1(0), EXIT0,
};

/* slot 2 += 1; spin until slot 2 > 1 (10000 turns at most), then slot 3 += 1; slot 2 -= 1 */
static const struct insn MEET[] = {
    I(0x62, 10, 0, -4, 2), LD_MAP(1, 0), LOOKUP(-4),
    I(0x15, 0, 0, 20, 0),               /* 6: no value: exit */
    I(0xbf, 6, 0, 0, 0), ADD1(6),       /* r6 = slot 2; *r6 += 1 */
    I(0xb7, 7, 0, 0, 10000),
    I(0x79, 1, 6, 0, 0),                /* 11: r1 = *r6 */
    I(0x25, 1, 0, 3, 1),                /* if r1 > 1 goto met */
    I(0x07, 7, 0, 0, -1), I(0x55, 7, 0, -4, 0),
    I(0x05, 0, 0, 9, 0),                /* 15: goto done */
    I(0x62, 10, 0, -8, 3), LD_MAP(1, 0), LOOKUP(-8), I(0x15, 0, 0, 2, 0), ADD1(0), /* met: slot 3 += 1 */
    I(0xb7, 1, 0, 0, -1), I(0xdb, 6, 1, 0, 0), /* 25, done: *r6 -= 1 */
    EXIT0,
};

/* percpu[0] = percpu[0] + 1, a load and a store 100 turns of a loop apart (another thread's run would meet it) */
static const struct insn PLUS[] = {
    I(0x62, 10, 0, -4, 0), LD_MAP(1, 0), LOOKUP(-4),
    I(0x15, 0, 0, 6, 0),                /* no value: exit */
    I(0x79, 1, 0, 0, 0), I(0xb7, 2, 0, 0, 100),
    I(0x07, 2, 0, 0, -1), I(0x55, 2, 0, -2, 0), /* r2 -= 1 until 0 */
    I(0x07, 1, 0, 0, 1), I(0x7b, 0, 1, 0, 0),
    EXIT0,
};

/* slot 0 += 1 */
static const struct insn CALLED[] = {
    I(0x62, 10, 0, -4, 0), LD_MAP(1, 0), LOOKUP(-4), I(0x15, 0, 0, 2, 0), ADD1(0), EXIT0,
};

static atomic_int running;
static pthread_barrier_t start;

struct worker { long calls; int k; };

static void *call(void *arg) {
    struct worker *w = arg;
    volatile int x = 0;
    pthread_barrier_wait(&start);
    for (long i = 0; i < w->calls; i++) x += upt_inc(w->k);
    atomic_fetch_sub(&running, 1);
    return NULL;
}

/* n threads of `calls` calls each, started; the caller joins them */
static void start_workers(pthread_t *t, struct worker *w, int n, long calls) {
    pthread_barrier_init(&start, NULL, (unsigned)n + 1);
    atomic_store(&running, n);
    for (int k = 0; k < n; k++) w[k] = (struct worker){calls, k}, pthread_create(&t[k], NULL, call, &w[k]);
    pthread_barrier_wait(&start);
}

static __typeof__(&egpu_lvm_map_read) p_egpu_lvm_map_read;
static __typeof__(&egpu_uprobe_pause) p_egpu_uprobe_pause;

static unsigned long long slot(struct egpu_lvm_map *m, int k) {
    uint32_t keys[4];
    unsigned long long values[4];
    p_egpu_lvm_map_read(m, keys, values, 4);
    return values[k];
}

/* Until slot 0 has counted `more` calls past now, or the workers are done. */
static void wait_calls(struct egpu_lvm_map *m, unsigned long long more) {
    unsigned long long from = slot(m, 0);
    while (atomic_load(&running) && slot(m, 0) < from + more) sched_yield();
}

long upt_call(long (*fn)(long), long a);
static atomic_int inside, go;

static long held(long a) {
    atomic_store(&inside, 1);
    while (!atomic_load(&go)) sched_yield();
    return a;
}

static void *call_held(void *arg) {
    (void)arg;
    upt_call(held, 1);
    return NULL;
}

/* One call of upt_call, with `pause(before)` while the thread is inside and `pause(after)` just before it is let
 * go (-1: neither); the counts of `m` then, "calls,returns". */
static void held_call(struct egpu_lvm_prog **progs, int before, int after, struct egpu_lvm_map *m, char *counts) {
    pthread_t t;
    atomic_store(&inside, 0), atomic_store(&go, 0);
    pthread_create(&t, NULL, call_held, NULL);
    while (!atomic_load(&inside)) sched_yield();
    if (before >= 0) p_egpu_uprobe_pause(progs, 2, before);
    if (after >= 0) p_egpu_uprobe_pause(progs, 2, after);
    atomic_store(&go, 1);
    pthread_join(t, NULL);
    sprintf(counts, "%llu,%llu", slot(m, 0), slot(m, 1));
}

int main(int argc, char **argv) {
    API(egpu_lvm_map_new); API(egpu_lvm_prog_new); API(egpu_lvm_prog_stats);
    API(egpu_uprobe_attach); API(egpu_uprobe_detach);
    p_egpu_lvm_map_read = dlsym(RTLD_DEFAULT, "egpu_lvm_map_read");
    p_egpu_uprobe_pause = dlsym(RTLD_DEFAULT, "egpu_uprobe_pause");
    if (argc != 2 || !p_egpu_lvm_map_new || !p_egpu_lvm_prog_new || !p_egpu_uprobe_attach || !p_egpu_lvm_map_read
        || !p_egpu_uprobe_pause)
        return 2;
    long calls = atol(argv[1]);
    struct egpu_lvm_map *array = p_egpu_lvm_map_new(2, 4, 8, 4, 0, NULL, 0, 0);
    struct egpu_lvm_map *hash = p_egpu_lvm_map_new(1, 4, 8, 64, 0, NULL, 0, 0);
    struct egpu_lvm_map *maps[] = {array, hash};
    struct egpu_lvm_prog *count = p_egpu_lvm_prog_new(COUNT, sizeof COUNT / 8, maps, 2);
    struct egpu_lvm_prog *mark = p_egpu_lvm_prog_new(MARK, sizeof MARK / 8, maps, 1);
    struct egpu_lvm_prog *meet = p_egpu_lvm_prog_new(MEET, sizeof MEET / 8, maps, 1);
    int entry = 0;
    if (!array || !hash || !count || !mark || !meet || p_egpu_uprobe_attach("libupt.so", "upt_inc", &count, &entry, 1))
        return 3;
    pthread_t t[THREADS];
    struct worker w[THREADS];
    start_workers(t, w, THREADS, calls);
    int cycles = 0, late = 0;
    while (atomic_load(&running)) {
        if (p_egpu_uprobe_attach("libupt.so", "upt_inc", &mark, &entry, 1)) return 4;
        wait_calls(array, 100);
        p_egpu_uprobe_detach(&mark, 1);
        struct egpu_lvm_stats before, after;
        p_egpu_lvm_prog_stats(mark, &before);
        unsigned long long marked = slot(array, 1);
        wait_calls(array, 1000);
        p_egpu_lvm_prog_stats(mark, &after);
        late += slot(array, 1) != marked || after.runs != before.runs;
        cycles++;
    }
    for (int k = 0; k < THREADS; k++) pthread_join(t[k], NULL);
    struct egpu_lvm_stats marks;
    p_egpu_lvm_prog_stats(mark, &marks);
    uint32_t keys[64];
    unsigned long long values[64];
    size_t n = p_egpu_lvm_map_read(hash, keys, values, 64);
    int exact = n == THREADS;
    for (size_t k = 0; k < n && k < 64; k++) exact &= keys[k] < THREADS && values[k] == (unsigned long long)calls;

    p_egpu_uprobe_detach(&count, 1);
    if (p_egpu_uprobe_attach("libupt.so", "upt_inc", &meet, &entry, 1)) return 5;
    start_workers(t, w, 2, MEET_CALLS);
    for (int k = 0; k < 2; k++) pthread_join(t[k], NULL);

    p_egpu_uprobe_detach(&meet, 1);
    struct egpu_lvm_map *percpu = p_egpu_lvm_map_new(6, 4, 8, 1, 0, NULL, 0, 0);
    struct egpu_lvm_prog *plus = percpu ? p_egpu_lvm_prog_new(PLUS, sizeof PLUS / 8, &percpu, 1) : NULL;
    if (!plus || p_egpu_uprobe_attach("libupt.so", "upt_inc", &plus, &entry, 1)) return 6;
    start_workers(t, w, THREADS, calls);
    for (int k = 0; k < THREADS; k++) pthread_join(t[k], NULL);
    int summed = slot(percpu, 0) == (unsigned long long)THREADS * calls;

    struct egpu_lvm_map *calls_returns = p_egpu_lvm_map_new(2, 4, 8, 2, 0, NULL, 0, 0);
    struct egpu_lvm_prog *ends[2] = {
        calls_returns ? p_egpu_lvm_prog_new(CALLED, sizeof CALLED / 8, &calls_returns, 1) : NULL,
        calls_returns ? p_egpu_lvm_prog_new(MARK, sizeof MARK / 8, &calls_returns, 1) : NULL};
    int rets[2] = {0, 1};
    if (!ends[0] || !ends[1] || p_egpu_uprobe_attach("libupt.so", "upt_call", ends, rets, 2)) return 7;
    char counts[3][64];
    p_egpu_uprobe_pause(ends, 2, 1);
    held_call(ends, 0, -1, calls_returns, counts[0]);
    held_call(ends, 1, 0, calls_returns, counts[1]);
    held_call(ends, 1, -1, calls_returns, counts[2]);
    printf("counted=%llu hash=%s cycles=%s late=%d marker=%s met=%s percpu=%s held=%s/%s/%s\n", slot(array, 0),
           exact ? "exact" : "wrong", cycles > 0 ? "some" : "none", late,
           marks.runs == slot(array, 1) ? "exact" : "wrong", slot(array, 3) > 0 ? "some" : "none",
           summed ? "exact" : "lost", counts[0], counts[1], counts[2]);
    return 0;
}
