/* Which targets egpu_shim_escaped reports: a target given to a graph kernel node, or launched while a
 * stream capture is in progress (by any of the begin hooks), escaped; one only launched plainly, or
 * launched once every capture ended or was refused, did not. Made-up handles, the stand-in not logging
 * (as app_threads). Prints "escaped STEP 0|1", one line per step. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>

#include "egpu_shim.h"

typedef void *H;
typedef CUresult (*launch_fn)(H, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, H,
                              void **, void **);
typedef CUresult (*begin1_fn)(H);
typedef CUresult (*begin2_fn)(H, int);
typedef CUresult (*to_graph_fn)(H, H, const H *, const void *, size_t, int);
typedef CUresult (*end_fn)(H, H *);

static launch_fn launch;
static int (*reg)(void *, void *);
static int (*escaped)(void *, void *);
static const H stream = (H)0x5, other = (H)0x6;

/* Orig handle n, its target n + 0x100 (never a key of the table). */
static H orig(int n) { return (H)(uintptr_t)(0x1000 * n); }
static H target(int n) { return (H)(uintptr_t)(0x1000 * n + 0x100); }

static void fresh(int n) { reg(orig(n), target(n)); }
static void run(int n, H s) { launch(orig(n), 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL); }
static void show(const char *step, int n) { printf("escaped %s %d\n", step, escaped(orig(n), target(n))); }

int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    launch = (launch_fn)dlsym(h, "cuLaunchKernel");
    CUresult (*add_node)(H *, H, const H *, size_t, const CUDA_KERNEL_NODE_PARAMS_v2 *) =
        dlsym(h, "cuGraphAddKernelNode_v2");
    CUresult (*exec_set)(H, H, const CUDA_KERNEL_NODE_PARAMS_v1 *) = dlsym(h, "cuGraphExecKernelNodeSetParams");
    begin1_fn begin = (begin1_fn)dlsym(h, "cuStreamBeginCapture");
    begin1_fn begin_ptsz = (begin1_fn)dlsym(h, "cuStreamBeginCapture_ptsz");
    begin2_fn begin_v2 = (begin2_fn)dlsym(h, "cuStreamBeginCapture_v2");
    begin2_fn begin_v2_ptsz = (begin2_fn)dlsym(h, "cuStreamBeginCapture_v2_ptsz");
    to_graph_fn to_graph = (to_graph_fn)dlsym(h, "cuStreamBeginCaptureToGraph");
    to_graph_fn to_graph_ptsz = (to_graph_fn)dlsym(h, "cuStreamBeginCaptureToGraph_ptsz");
    end_fn end = (end_fn)dlsym(h, "cuStreamEndCapture"), end_ptsz = (end_fn)dlsym(h, "cuStreamEndCapture_ptsz");
    void *(*real)(const char *) = dlsym(RTLD_DEFAULT, "egpu_shim_real");
    begin2_fn real_begin = real ? (begin2_fn)real("cuStreamBeginCapture_v2") : NULL;
    reg = dlsym(RTLD_DEFAULT, "egpu_shim_register");
    escaped = dlsym(RTLD_DEFAULT, "egpu_shim_escaped");
    if (!launch || !add_node || !exec_set || !begin || !begin_ptsz || !begin_v2 || !begin_v2_ptsz || !to_graph ||
        !to_graph_ptsz || !end || !end_ptsz || !real_begin || !reg || !escaped)
        return 2;
    H node, graph;

    fresh(1);
    run(1, NULL);
    run(1, stream);
    show("plain", 1);

    fresh(2);
    CUDA_KERNEL_NODE_PARAMS_v2 p2 = {.func = orig(2), .gridDimX = 1, .blockDimX = 1};
    add_node(&node, (H)0x9, NULL, 0, &p2);
    show("node", 2);
    fresh(3);
    CUDA_KERNEL_NODE_PARAMS_v1 p3 = {.func = orig(3), .gridDimX = 1, .blockDimX = 1};
    exec_set((H)0x9, node, &p3);
    show("exec_node", 3);
    printf("escaped unregistered %d\n", escaped(orig(4), orig(4))); /* a node of a handle with no target */
    CUDA_KERNEL_NODE_PARAMS_v2 p4 = {.func = orig(4), .gridDimX = 1, .blockDimX = 1};
    add_node(&node, (H)0x9, NULL, 0, &p4);

    /* one capture per begin hook, each with a launch of its own target into it */
    int n = 10;
    const char *names[] = {"capture", "capture_ptsz", "capture_v2", "capture_v2_ptsz", "capture_to_graph",
                           "capture_to_graph_ptsz"};
    for (int i = 0; i < 6; i++, n++) {
        CUresult r = i == 0 ? begin(stream) : i == 1 ? begin_ptsz(stream) : i == 2 ? begin_v2(stream, 0)
                     : i == 3 ? begin_v2_ptsz(stream, 1) : i == 4 ? to_graph(stream, (H)0x9, NULL, NULL, 0, 0)
                     : to_graph_ptsz(stream, (H)0x9, NULL, NULL, 0, 2);
        fresh(n);
        run(n, stream);
        (i % 2 ? end_ptsz : end)(stream, &graph);
        show(names[i], n);
        if (r) printf("begin %s failed %d\n", names[i], r);
    }
    fresh(n);
    run(n, stream);
    show("after_captures", n++);

    begin_v2(NULL, 0);              /* the legacy stream cannot capture: refused, not counted */
    fresh(n);
    run(n, stream);
    show("refused_begin", n++);

    begin_v2(stream, 0);
    end(other, &graph);             /* not capturing: refused, the capture on `stream` goes on */
    fresh(n);
    run(n, other);                  /* any launch while a capture is in progress */
    show("refused_end", n++);
    end(stream, &graph);
    real_begin(stream, 0);          /* a capture begun past the shim, ended through it: counts nothing off */
    end(stream, &graph);
    begin_v2(stream, 0);
    fresh(n);
    run(n, stream);
    show("second_capture", n++);
    end(stream, &graph);
    fresh(n);
    run(n, stream);
    show("after_second", n++);

    /* the history outlives later targets and unregistering: a target once escaped stays so */
    reg(orig(2), target(1));
    reg(orig(2), NULL);
    show("node_history", 2);
    printf("escaped other_function %d\n", escaped(orig(2), target(1)));
    return 0;
}
