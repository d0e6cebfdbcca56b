/* The cow tests' program (tests/test_cow_live.py) against the stand-in driver, entry points by dlsym.
 *
 *   app_cow records      copies, memsets, streams and events with the shim's records on; prints each
 *                        record ("op KIND FLAGS DST SRC SIZE STREAM"), the streams and the allocations
 *   app_cow cow          acts as the runtime: arms a checkpoint of four buffers itself and makes the
 *                        launches and copies the fast path must see (printing "mark WHAT" into the
 *                        stand-in's log between them), then prints the staged bytes and the counters
 *   app_cow loop STOP    a job to checkpoint: three buffers and a counter rewritten every step (buffer b
 *                        holds b * 1000000 + step in every word) and 4096 bytes of pinned host memory,
 *                        a launch per step, until STOP exists
 *   app_cow churn STOP   loop, and every 50 steps a fifth buffer is freed and another allocated
 *   app_cow resume       the same allocations, one launch (a --restore puts the snapshot back before
 *                        it), then prints every buffer's first word and the counter
 *   app_cow resume-captured  the same, but a launch captured into a graph (global mode) comes first:
 *                        prints "capture R", the capture's end
 *   app_cow streams N    a cut after the app made N streams: prints "cut_streams N armed R result R"
 *   app_cow overflow     a memset into an armed range whose end wraps: prints "overflow hook_copies N ..."
 *   app_cow huge-params  a launch whose parameter buffer claims 4 GiB, while armed: the same line
 *   app_cow anything     a launch of a kernel registered as writing anything, whose arguments point at no
 *                        range, while armed: the same line
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "egpu_shim.h"
#include "egpu_cow.h"

typedef int (*fn)();
#define WORDS 8
#define SIZE (WORDS * 8)

static const char PTX[] =
    ".version 8.0\n.target sm_90\n.address_size 64\n\n"
    ".visible .global .align 8 .u64 launches[1];\n\n"
    ".visible .entry k(\n\t.param .u64 p,\n\t.param .u64 n\n)\n{\n\tret;\n}\n\n"
    ".visible .entry k2(\n\t.param .u64 q\n)\n{\n\tret;\n}\n";

static void *cuda;
#define SYM(name) fn name = (fn)dlsym(cuda, #name)
#define API(name) __typeof__(&name) p_##name = dlsym(RTLD_DEFAULT, #name)

static void mark(const char *what) { /* a line in the stand-in's log, between the calls it logs */
    FILE *f = fopen(getenv("EGPU_STUB_LOG"), "a");
    if (f) {
        fprintf(f, "%d mark %s\n", (int)getpid(), what);
        fclose(f);
    }
}

static void fill(unsigned long long *w, unsigned long long v) {
    for (int i = 0; i < WORDS; i++) w[i] = v;
}

static int records(void) {
    SYM(cuMemAlloc_v2); SYM(cuMemcpyHtoD_v2); SYM(cuMemsetD8_v2); SYM(cuMemsetD32Async);
    SYM(cuMemcpyDtoDAsync_v2); SYM(cuMemcpy2D_v2); SYM(cuStreamCreateWithPriority); SYM(cuStreamDestroy_v2);
    SYM(cuEventCreate); SYM(cuEventRecord); SYM(cuStreamWaitEvent); SYM(cuMemFree_v2);
    API(egpu_cow_records); API(egpu_cow_drain); API(egpu_cow_streams); API(egpu_shim_allocations);
    API(egpu_cow_stats);
    p_egpu_cow_records(1);
    CUdeviceptr a = 0, b = 0, c = 0;
    void *s = NULL, *e = NULL;
    unsigned long long words[WORDS];
    fill(words, 7);
    int r = cuMemAlloc_v2(&a, SIZE) | cuMemAlloc_v2(&b, SIZE) | cuMemAlloc_v2(&c, SIZE) | cuMemFree_v2(c);
    r |= cuStreamCreateWithPriority(&s, 1, 0) | cuEventCreate(&e, 0);
    r |= cuMemcpyHtoD_v2(a, words, SIZE) | cuMemsetD8_v2(b, 0xab, 16) | cuMemsetD32Async(a, 5u, 4, s);
    r |= cuMemcpyDtoDAsync_v2(b, a, 24, s) | cuEventRecord(e, s) | cuStreamWaitEvent(NULL, e, 0);
    CUDA_MEMCPY2D m = {0};
    m.srcMemoryType = 2, m.srcDevice = a, m.srcPitch = 16;
    m.dstMemoryType = 2, m.dstDevice = b, m.dstXInBytes = 4, m.dstY = 1, m.dstPitch = 16;
    m.WidthInBytes = 8, m.Height = 2;
    r |= cuMemcpy2D_v2(&m);
    void *live[4];
    size_t nstreams = p_egpu_cow_streams(live, 4);
    r |= cuStreamDestroy_v2(s);
    printf("a %#llx b %#llx stream %p event %p streams %zu after %zu\n", a, b, s, e, nstreams,
           p_egpu_cow_streams(live, 4));
    struct egpu_op ops[64];
    size_t n = p_egpu_cow_drain(ops, 64);
    for (size_t i = 0; i < n; i++)
        printf("op %d %d %#llx %#llx %llu %p\n", ops[i].kind, ops[i].flags, ops[i].dst, ops[i].src,
               ops[i].size, ops[i].stream);
    struct egpu_alloc al[8];
    size_t na = p_egpu_shim_allocations(al, 8);
    for (size_t i = 0; i < na && i < 8; i++)
        printf("alloc %#llx %llu seq %llu\n", al[i].address, al[i].size, al[i].seq);
    struct egpu_cow_stats st;
    p_egpu_cow_stats(&st);
    printf("stats ops %llu allocations %llu overflow %llu result %d\n", st.ops, st.allocations, st.alloc_overflow, r);
    return r;
}

static int cow(void) {
    SYM(cuInit); SYM(cuMemAlloc_v2); SYM(cuMemcpyHtoD_v2); SYM(cuMemcpyDtoH_v2); SYM(cuModuleLoadData);
    SYM(cuModuleGetFunction); SYM(cuLaunchKernel); SYM(cuStreamCreateWithPriority);
    API(egpu_cow_arm); API(egpu_cow_copy_next); API(egpu_cow_disarm); API(egpu_cow_staging);
    API(egpu_cow_stats); API(egpu_cow_layout);
    CUdeviceptr buf[4];
    struct egpu_cow_range ranges[4];
    unsigned long long words[WORDS], n = 5, stray = 0x1234;
    void *mod = NULL, *k = NULL, *k2 = NULL, *s = NULL, *s2 = NULL, *side = NULL;
    int r = cuInit(0) | cuModuleLoadData(&mod, PTX) | cuModuleGetFunction(&k, mod, "k") |
            cuModuleGetFunction(&k2, mod, "k2");
    r |= cuStreamCreateWithPriority(&s, 1, 0) | cuStreamCreateWithPriority(&s2, 1, 0) |
         cuStreamCreateWithPriority(&side, 1, 0);
    for (int b = 0; b < 4; b++) {
        int host = 0;
        fill(words, 100 + b); /* "A" */
        r |= cuMemAlloc_v2(&buf[b], SIZE) | cuMemcpyHtoD_v2(buf[b], words, SIZE);
        ranges[b] = (struct egpu_cow_range){buf[b], SIZE, 0, 0};
        r |= p_egpu_cow_staging(SIZE, &ranges[b].staging, &host);
    }
    unsigned int off = 0, size = 8;
    r |= p_egpu_cow_layout(k2, &off, &size, 1, NULL, 0); /* k2 only reads through q */
    printf("streams %p %p side %p buffers %#llx %#llx %#llx %#llx\n", s, s2, side, buf[0], buf[1], buf[2], buf[3]);
    r |= p_egpu_cow_arm(ranges, 4, side);
    mark("armed");
    void *pa[] = {&buf[0], &n}, *pb[] = {&stray, &n}, *pc[] = {&buf[1]};
    r |= cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, s, pa, NULL);     /* writes buf0: copied first on s */
    mark("stray");
    r |= cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, s, pb, NULL);     /* no buffer: nothing */
    mark("reader");
    r |= cuLaunchKernel(k2, 1, 1, 1, 1, 1, 1, 0, s, pc, NULL);    /* reads buf1 only: nothing */
    mark("htod");
    fill(words, 200 + 2); /* "B" into buf2: copied first on the legacy stream */
    r |= cuMemcpyHtoD_v2(buf[2], words, SIZE);
    mark("other stream");
    r |= cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, s2, pa, NULL);    /* buf0 copied on s: s2 waits for it */
    mark("copier");
    long i, copied = 0;
    while ((i = p_egpu_cow_copy_next(side)) >= 0) copied++;
    r |= p_egpu_cow_disarm();
    mark("disarmed");
    r |= cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, s, pa, NULL);
    for (int b = 0; b < 4; b++) {
        r |= cuMemcpyDtoH_v2(words, ranges[b].staging, SIZE);
        printf("staged %d %llu\n", b, words[0]);
    }
    struct egpu_cow_stats st;
    p_egpu_cow_stats(&st);
    printf("cow hook_copies %llu hook_waits %llu copier_copies %llu copied %ld checked %llu unknown %llu "
           "cut_streams %llu armed %d result %d\n", st.hook_copies, st.hook_waits, st.copier_copies, copied,
           st.checked, st.unknown_layout, st.cut_streams, st.armed, r);
    return r;
}

/* streams N: a checkpoint's cut after the app made N streams. overflow 1: a memset whose end wraps past
 * the top of the address space, into the armed range; 2: a launch whose parameter buffer claims 4 GiB. */
static int cut_after(int nstreams, int overflow) {
    SYM(cuInit); SYM(cuMemAlloc_v2); SYM(cuStreamCreateWithPriority); SYM(cuMemsetD32Async);
    API(egpu_cow_arm); API(egpu_cow_copy_next); API(egpu_cow_disarm); API(egpu_cow_staging); API(egpu_cow_stats);
    void *side = NULL;
    CUdeviceptr buf = 0;
    int host = 0, r = cuInit(0);
    for (int i = 0; i < nstreams; i++) r |= cuStreamCreateWithPriority(&side, 1, 0);
    struct egpu_cow_range range = {0, SIZE, 0, 0};
    r |= cuMemAlloc_v2(&buf, SIZE) | p_egpu_cow_staging(SIZE, &range.staging, &host);
    range.address = buf;
    int armed = p_egpu_cow_arm(&range, 1, side);
    if (overflow == 1) /* 4 * (2^62 - 2) bytes from buf + 8 end at buf + 2^64: the sum wraps to buf */
        r |= cuMemsetD32Async(buf + 8, 0u, (1ull << 62) - 2, side);
    if (overflow == 2) { /* a parameter buffer that says it is 4 GiB: the driver refuses the launch */
        SYM(cuModuleLoadData); SYM(cuModuleGetFunction); SYM(cuLaunchKernel);
        void *mod = NULL, *k = NULL;
        unsigned long long params[2] = {buf, 1};
        size_t size = (1ull << 32) - 4;
        void *extra[] = {(void *)1, params, (void *)2, &size, NULL};
        r |= cuModuleLoadData(&mod, PTX) | cuModuleGetFunction(&k, mod, "k");
        cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, side, NULL, extra);
    }
    if (overflow == 3) { /* a kernel that writes through a pointer it loads: no argument points at buf */
        SYM(cuModuleLoadData); SYM(cuModuleGetFunction); SYM(cuLaunchKernel); API(egpu_cow_layout);
        void *mod = NULL, *k = NULL;
        unsigned long long table = 0x1234, n = 1;
        unsigned int offsets[2] = {0, 8}, sizes[2] = {8, 8};
        void *params[] = {&table, &n};
        r |= cuModuleLoadData(&mod, PTX) | cuModuleGetFunction(&k, mod, "k");
        r |= p_egpu_cow_layout(k, offsets, sizes, 2, NULL, EGPU_COW_ANYTHING);
        r |= cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, side, params, NULL);
    }
    while (p_egpu_cow_copy_next(side) >= 0) {}
    struct egpu_cow_stats st;
    p_egpu_cow_stats(&st);
    r |= armed ? 0 : p_egpu_cow_disarm();
    if (overflow) printf("overflow hook_copies %llu unknown %llu result %d\n", st.hook_copies, st.unknown_layout, r);
    else printf("cut_streams %llu armed %d result %d\n", st.cut_streams, armed, r);
    return r;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* loop and resume: the same allocations, in the same order. */
static int job(const char *stop, int captured, int churn) {
    SYM(cuInit); SYM(cuMemAlloc_v2); SYM(cuMemcpyHtoD_v2); SYM(cuMemcpyDtoH_v2); SYM(cuModuleLoadData);
    SYM(cuModuleGetFunction); SYM(cuLaunchKernel); SYM(cuCtxSynchronize); SYM(cuStreamCreate);
    SYM(cuStreamBeginCapture_v2); SYM(cuStreamEndCapture); SYM(cuMemAllocHost_v2); SYM(cuMemFree_v2);
    CUdeviceptr buf[3], counter;
    void *mod = NULL, *k = NULL, *pinned = NULL;
    unsigned long long words[WORDS], n = 1;
    int r = cuInit(0) | cuModuleLoadData(&mod, PTX) | cuModuleGetFunction(&k, mod, "k");
    for (int b = 0; b < 3; b++) r |= cuMemAlloc_v2(&buf[b], SIZE);
    r |= cuMemAlloc_v2(&counter, 8);
    r |= cuMemAllocHost_v2(&pinned, 4096); /* pinned host memory: a checkpoint leaves it out, and says so */
    void *params[] = {&buf[0], &n};
    if (captured) {
        void *s = NULL, *graph = NULL;
        r |= cuStreamCreate(&s, 1) | cuStreamBeginCapture_v2(s, 0);
        r |= cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, s, params, NULL);
        int end = cuStreamEndCapture(s, &graph);
        printf("capture %d\n", end);
        r |= end;
    }
    if (!stop) { /* resume: the restore happens before this launch */
        r |= cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL) | cuCtxSynchronize();
        for (int b = 0; b < 3; b++) {
            r |= cuMemcpyDtoH_v2(words, buf[b], SIZE);
            printf("buffer %d %llu\n", b, words[WORDS - 1]);
        }
        r |= cuMemcpyDtoH_v2(words, counter, 8);
        printf("counter %llu result %d\n", words[0], r);
        return r;
    }
    printf("ready\n");
    fflush(stdout);
    unsigned long long s = 0;
    CUdeviceptr tmp = 0;
    double end = now() + 40;
    while (access(stop, F_OK) != 0 && now() < end) {
        s++;
        for (int b = 0; b < 3; b++) {
            fill(words, b * 1000000ull + s);
            r |= cuMemcpyHtoD_v2(buf[b], words, SIZE);
        }
        r |= cuMemcpyHtoD_v2(counter, &s, 8);
        if (churn && s % 50 == 1) {
            if (tmp) r |= cuMemFree_v2(tmp);
            r |= cuMemAlloc_v2(&tmp, SIZE) | cuMemcpyHtoD_v2(tmp, words, SIZE);
        }
        r |= cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
        usleep(300);
    }
    printf("app_cow steps=%llu result=%d\n", s, r);
    return r ? 1 : 0;
}

int main(int argc, char **argv) {
    cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda || argc < 2) return 2;
    if (!strcmp(argv[1], "records")) return records() ? 1 : 0;
    if (!strcmp(argv[1], "cow")) return cow() ? 1 : 0;
    if (!strcmp(argv[1], "streams") && argc == 3) return cut_after(atoi(argv[2]), 0) ? 1 : 0;
    if (!strcmp(argv[1], "overflow")) return cut_after(1, 1) ? 1 : 0;
    if (!strcmp(argv[1], "huge-params")) return cut_after(1, 2) ? 1 : 0;
    if (!strcmp(argv[1], "anything")) return cut_after(1, 3) ? 1 : 0;
    if (!strcmp(argv[1], "loop") && argc == 3) return job(argv[2], 0, 0);
    if (!strcmp(argv[1], "churn") && argc == 3) return job(argv[2], 0, 1);
    if (!strcmp(argv[1], "resume")) return job(NULL, 0, 0) ? 1 : 0;
    if (!strcmp(argv[1], "resume-captured")) return job(NULL, 1, 0) ? 1 : 0;
    return 2;
}
