/* `app_uprobe calls N`: starts the stand-in driver (so the runtime comes up), loads one kernel, then N
 * times launches it (through cuLaunchKernel linked directly: under LD_PRELOAD it binds to the shim's
 * hook, as Triton's stub does) and calls libupt's upt_add6 through the PLT, upt_sum8 through a dlsym'd pointer and
 * upt_half; prints the sums, so a probe that changed an argument or a return value shows.
 * `app_uprobe loop STOP`: calls upt_add6(i, ..., i + 5) every 100 us until file STOP exists (a job to
 * attach to); prints how many calls and whether every result was right.
 * `app_uprobe bench N`: N calls of upt_inc through the PLT in timed batches of 10000 (about a ms); prints
 * the fastest batch's ns per call: on a shared machine most batches also hold time the CPU spent on other
 * processes (and on the runtime's threads), which is not the call's cost.
 * `app_uprobe bench_threads N T`: T threads (named upt-bench0, ...), started together, each making N such
 * calls; prints the median over the threads of each one's fastest batch (ns_per_call) and the wall time from
 * their start to the last one's end over the T * N calls (aggregate_ns_per_call: the inverse of the calls all
 * threads made a ns).
 * `app_uprobe direct N` / `app_uprobe direct_threads N`: N direct calls of upt_direct, a function of this
 * executable no GOT slot or dlsym reaches (an inline hook's case); direct_threads first starts two
 * threads calling it without pause, so the runtime hooks it while they run, and stops them after.
 * `app_uprobe direct_loop STOP`: as loop, calling upt_direct(i, 1).
 * `app_uprobe launch_loop STOP`: as loop, launching the kernel before each call.
 * `app_uprobe parked 0`: first starts a thread that blocks every signal, two that call upt_direct without
 * pause and one that enters upt_parked and stays blocked in its first bytes, then brings the runtime up,
 * calls upt_direct once and exits.
 * `app_uprobe owned_signal N`: as direct, with a handler of its own on SIGRTMAX - 5 (the signal an inline
 * hook's guard holds threads with) installed first, as direct_threads.
 * `app_uprobe late N`: once the runtime is up, dlopens libuptlate.so (libupt.c built again under that name by the
 * test: no object is it when the uprobes are attached) and calls its upt_add6 N times through dlsym's pointer.
 * `app_uprobe edge N`: N direct calls of upt_edge, which starts 7 bytes before a page ends.
 * `app_uprobe names N`: N calls of libupt's upt_name("alpha"), then one with a name of 26 bytes and one with NULL.
 * `app_uprobe near_loop STOP`: calls upt_near every 100 us until file STOP exists; once it finds upt_near
 * hooked inline it changes the constant of its instruction right after the jump's 5 bytes (as a debugger's
 * breakpoint or another tool's patch would); at the end it must be unhooked and the change still there. */
#define _GNU_SOURCE /* pthread_setname_np */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

long upt_add6(long a, long b, long c, long d, long e, long f);
double upt_half(double x);
int upt_inc(int x);
long upt_name(const char *s);
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void *stream, void **params, void **extra);

static const char PTX[] =
    ".version 8.0\n.target sm_90\n.address_size 64\n\n"
    ".visible .entry vecadd(\n\t.param .u64 a\n)\n{\n\tret;\n}\n";

typedef int (*fn)();

/* Starts with endbr64 (built with -fcf-protection) and a RIP-relative locked add: both move to the trampoline. */
long upt_direct_total;
__attribute__((noinline, aligned(16))) long upt_direct(long a, long b) {
    __atomic_fetch_add(&upt_direct_total, a, __ATOMIC_RELAXED);
    return 3 * a + b;
}

/* A read(2) of a pipe nobody writes, made by a syscall instruction 2 bytes into the function: a thread
 * in it is blocked there for good, and a signal it takes (restarted: SA_RESTART) finds it at that
 * instruction, inside the 5 bytes an inline hook's jump would cover. No branch in them: they can move. */
__asm__(".text\n.globl upt_parked\n.type upt_parked, @function\n.p2align 4\nupt_parked:\n"
        "\t.byte 0x66, 0x90\n\tsyscall\n\tnop\n\tret\n.size upt_parked, .-upt_parked\n");
/* 1 byte past an 8-byte boundary and 7 bytes before a page ends: the jump's 5 bytes lie in this page, the
 * 8 bytes from the function's start do not. Returns a + 2b. */
__asm__(".text\n.globl upt_edge\n.type upt_edge, @function\n.p2align 12\n.skip 4089, 0xcc\nupt_edge:\n"
        "\tendbr64\n\tlea (%rdi,%rsi,2), %rax\n\tret\n.size upt_edge, .-upt_edge\n");
long upt_edge(long a, long b);

/* endbr64 and push (the jump's 5 bytes), then `mov $1, %eax`: its constant is byte 6. */
__asm__(".text\n.globl upt_near\n.type upt_near, @function\n.p2align 4\nupt_near:\n"
        "\tendbr64\n\tpush %rbp\n\tmov $1, %eax\n\tpop %rbp\n\tret\n.size upt_near, .-upt_near\n");
int upt_near(void);

/* Another writer of upt_near's code than the hook: its `mov` returns `value` from now on. */
static void near_returns(unsigned char value) {
    unsigned char *code = (unsigned char *)(void *)upt_near;
    void *page = (void *)((uintptr_t)code & ~(uintptr_t)4095);
    mprotect(page, 4096, PROT_READ | PROT_WRITE | PROT_EXEC);
    code[6] = value;
    mprotect(page, 4096, PROT_READ | PROT_EXEC);
}

static atomic_int parked;
static int park_pipe[2];
static char park_byte;

/* A thread that blocks every signal, as the CUDA driver's own do: the hook's guard cannot hold it. */
static void *deaf_worker(void *arg) {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    for (;;) pause();
    return arg;
}

static void own_handler(int sig) {
    (void)sig;
}

static void *parked_worker(void *arg) {
    long nr = 0 /* read */, fd = park_pipe[0], buf = (long)&park_byte, len = 1;
    atomic_store(&parked, 1);
    __asm__ volatile("sub $128, %%rsp\n\tcall upt_parked\n\tadd $128, %%rsp"   /* past the red zone */
                     : "+a"(nr), "+D"(fd), "+S"(buf), "+d"(len)
                     : : "rcx", "r8", "r9", "r10", "r11", "memory", "cc");
    return arg;
}

static atomic_int stop_workers;
static atomic_long workers_wrong;

/* bench: `calls` calls of upt_inc in batches of BATCH; ns: the fastest batch's ns per call */
#define BATCH 10000
struct bench { long calls; int together; double ns; int x; };   /* together: one of bench_threads' */
static pthread_barrier_t bench_start;

static void *bench_worker(void *arg) {
    struct bench *b = arg;
    volatile int x = 0;
    b->ns = 1e30;
    if (b->together) pthread_barrier_wait(&bench_start);
    for (long done = 0; done + BATCH <= b->calls; done += BATCH) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (long i = 0; i < BATCH; i++) x = upt_inc(x);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ns = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / BATCH;
        b->ns = ns < b->ns ? ns : b->ns;
    }
    b->x = x;
    return NULL;
}

static int by_ns(const void *a, const void *b) {
    double x = ((const struct bench *)a)->ns, y = ((const struct bench *)b)->ns;
    return (x > y) - (x < y);
}

/* bench_threads: `threads` threads of `calls` calls each, released together */
static void bench_threads(long calls, int threads, int r) {
    pthread_t t[64];
    struct bench b[64];
    struct timespec t0, t1;
    threads = threads < 1 ? 1 : threads > 64 ? 64 : threads;
    pthread_barrier_init(&bench_start, NULL, (unsigned)threads + 1);
    for (int k = 0; k < threads; k++) {
        char name[16];
        b[k] = (struct bench){calls, 1, 0, 0}, pthread_create(&t[k], NULL, bench_worker, &b[k]);
        snprintf(name, sizeof name, "upt-bench%d", k); /* named before the barrier lets it call */
        pthread_setname_np(t[k], name);
    }
    pthread_barrier_wait(&bench_start);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int k = 0; k < threads; k++) pthread_join(t[k], NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    qsort(b, (size_t)threads, sizeof *b, by_ns);
    long total = calls / BATCH * BATCH * threads;
    printf("app_uprobe bench_threads calls=%ld threads=%d ns_per_call=%.2f aggregate_ns_per_call=%.2f result=%d\n",
           total, threads, b[threads / 2].ns, ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / total, r);
}

static void *direct_worker(void *arg) {
    long wrong = 0;
    for (long i = 0; !atomic_load_explicit(&stop_workers, memory_order_relaxed); i++)
        wrong += upt_direct(i, 1) != 3 * i + 1;
    atomic_fetch_add(&workers_wrong, wrong);
    return arg;
}

int main(int argc, char **argv) {
    if (argc != 3 && (argc != 4 || strcmp(argv[1], "bench_threads"))) return 2;
    long n = atol(argv[2]); /* loop: 0 */
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) return 2;
    fn cuInit = (fn)dlsym(cuda, "cuInit"), cuModuleLoadData = (fn)dlsym(cuda, "cuModuleLoadData");
    fn cuModuleGetFunction = (fn)dlsym(cuda, "cuModuleGetFunction");
    fn cuCtxSynchronize = (fn)dlsym(cuda, "cuCtxSynchronize");
    void *mod = NULL, *f = NULL;
    pthread_t workers[2];
    if (!strcmp(argv[1], "parked")) {
        pthread_t worker, deaf, busy[2];
        if (pipe(park_pipe)) return 2;
        pthread_create(&deaf, NULL, deaf_worker, NULL);
        for (int k = 0; k < 2; k++) pthread_create(&busy[k], NULL, direct_worker, NULL);   /* compete for the CPUs */
        pthread_create(&worker, NULL, parked_worker, NULL);
        while (!atomic_load(&parked)) usleep(100);
        usleep(1000);   /* past its first instruction */
        int r = cuInit(0) | cuModuleLoadData(&mod, PTX) | cuModuleGetFunction(&f, mod, "vecadd");
        printf("app_uprobe parked direct=%ld result=%d\n", upt_direct(1, 2), r);
        fflush(stdout);
        return 0;   /* the parked thread never returns: exit ends it */
    }
    int owned = !strcmp(argv[1], "owned_signal"), threaded = owned || !strcmp(argv[1], "direct_threads");
    if (owned) signal(SIGRTMAX - 5, own_handler);
    for (int k = 0; threaded && k < 2; k++) pthread_create(&workers[k], NULL, direct_worker, NULL);
    int r = cuInit(0) | cuModuleLoadData(&mod, PTX) | cuModuleGetFunction(&f, mod, "vecadd");
    if (!strcmp(argv[1], "direct") || threaded) {   /* the runtime is up, its uprobes hooked */
        long sum = 0, wrong = 0;
        for (long i = 0; i < n; i++) {
            long v = upt_direct(i, i + 1);
            sum += v, wrong += v != 4 * i + 1;
        }
        atomic_store(&stop_workers, 1);
        for (int k = 0; threaded && k < 2; k++) pthread_join(workers[k], NULL);
        printf("app_uprobe %s calls=%ld sum=%ld wrong=%ld result=%d\n", argv[1], n, sum,
               wrong + atomic_load(&workers_wrong), r);
        return 0;
    }
    if (!strcmp(argv[1], "late")) {
        void *late = dlopen("libuptlate.so", RTLD_NOW);
        long (*add6)(long, long, long, long, long, long) = late ? dlsym(late, "upt_add6") : NULL;
        long wrong = 0;
        for (long i = 0; add6 && i < n; i++) wrong += add6(i, i + 1, i + 2, i + 3, i + 4, i + 5) != 6 * i + 15;
        printf("app_uprobe late loaded=%d wrong=%ld result=%d\n", add6 != NULL, wrong, r);
        return 0;
    }
    if (!strcmp(argv[1], "edge")) {
        long wrong = 0;
        for (long i = 0; i < n; i++) wrong += upt_edge(i, 1) != i + 2;
        printf("app_uprobe edge calls=%ld wrong=%ld result=%d\n", n, wrong, r);
        return 0;
    }
    if (!strcmp(argv[1], "names")) {
        long total = upt_name("a-name-of-twenty-six-bytes") + upt_name(NULL);
        for (long i = 0; i < n; i++) total += upt_name("alpha");
        printf("app_uprobe names calls=%ld total=%ld result=%d\n", n + 2, total, r);
        return 0;
    }
    if (!strcmp(argv[1], "near_loop")) {   /* wrong: a call's result; at the end, still hooked or the change gone */
        const volatile unsigned char *code = (const volatile unsigned char *)(void *)upt_near;
        long i = 0, wrong = 0;
        int changed = 0;
        for (; access(argv[2], F_OK) != 0; i++) {
            if (!changed && code[0] == 0xe9) near_returns(2), changed = 1;   /* hooked */
            wrong += upt_near() != 1 + changed;
            usleep(100);
        }
        wrong += !changed || code[0] == 0xe9 || upt_near() != 2;
        printf("app_uprobe near_loop calls=%ld wrong=%ld result=%d\n", i, wrong, r);
        return 0;
    }
    if (!strcmp(argv[1], "loop") || !strcmp(argv[1], "direct_loop") || !strcmp(argv[1], "launch_loop")) {
        long i = 0, wrong = 0;
        int launch = !strcmp(argv[1], "launch_loop");
        unsigned long long a = 0;
        void *params[] = {&a};
        for (int direct = argv[1][0] == 'd'; access(argv[2], F_OK) != 0; i++) {
            if (launch) r |= cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
            wrong += direct ? upt_direct(i, 1) != 3 * i + 1
                            : upt_add6(i, i + 1, i + 2, i + 3, i + 4, i + 5) != 6 * i + 15;
            usleep(100);
        }
        printf("app_uprobe loop calls=%ld wrong=%ld result=%d\n", i, wrong, r);
        return 0;
    }
    if (!strcmp(argv[1], "bench")) {
        struct bench b = {n, 0, 0, 0};
        bench_worker(&b);
        printf("app_uprobe bench calls=%ld ns_per_call=%.2f x=%d result=%d\n", n / BATCH * BATCH, b.ns, b.x, r);
        return 0;
    }
    if (!strcmp(argv[1], "bench_threads")) {
        bench_threads(n, atoi(argv[3]), r);
        return 0;
    }
    long (*sum8)(long, long, long, long, long, long, long, long) =
        (long (*)(long, long, long, long, long, long, long, long))dlsym(RTLD_DEFAULT, "upt_sum8");
    unsigned long long a = 0;
    void *params[] = {&a};
    long add = 0, sum = 0;
    double half = 0;
    for (long i = 0; i < n; i++) {
        r |= cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
        add += upt_add6(i, i + 1, i + 2, i + 3, i + 4, i + 5);
        sum += sum8(i, i, i, i, i, i, i, i + 1);
        half += upt_half((double)i);
    }
    r |= cuCtxSynchronize();
    printf("app_uprobe calls=%ld add=%ld sum=%ld half=%.1f result=%d\n", n, add, sum, half, r);
    return 0;
}
