/* A job for the SASS back end's live tests (tests/test_sass_live.py): `app_threads_loop STOP THREADS [graph]`
 * loads two PTX modules (kernels `step` and `step2`, no parameters) and launches them in turn from
 * THREADS threads, each about every 200 us, until the file STOP exists; then prints
 * "app_threads_loop launches N failed F". With `graph`, one more thread replays a graph
 * (cuGraphLaunch; the stand-in keeps no graphs, so the handle is made up) as often. APP_CUBINS=A:B loads
 * the cubin files A and B (nvcc's, holding step and step2) in place of the PTX. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char PTX[] = ".version 8.0\n.target sm_90\n.address_size 64\n\n.visible .entry step()\n{\n\tret;\n}\n";
static const char PTX2[] = ".version 8.0\n.target sm_90\n.address_size 64\n\n.visible .entry step2()\n{\n\tret;\n}\n";

typedef int (*fn)();
static fn launch, graph_launch;
static void *functions[2];
static const char *stop;
static atomic_long launches, failed;

static void *worker(void *arg) {
    (void)arg;
    for (unsigned i = 0; access(stop, F_OK); i++) {
        int r = launch(functions[i & 1], 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
        atomic_fetch_add(r ? &failed : &launches, 1);
        usleep(200);
    }
    return NULL;
}

/* The file at `path`, whole, in memory that is never freed; NULL when it cannot be read. */
static const void *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    char *data = f ? malloc(1 << 20) : NULL;
    size_t n = data ? fread(data, 1, 1 << 20, f) : 0;
    if (f) fclose(f);
    return n ? data : NULL;
}

static void *replayer(void *arg) {
    (void)arg;
    while (access(stop, F_OK)) {
        atomic_fetch_add(graph_launch((void *)0x6a, NULL) ? &failed : &launches, 1);
        usleep(200);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    stop = argv[1];
    int n = atoi(argv[2]);
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) return 3;
    fn init = (fn)dlsym(cuda, "cuInit"), load = (fn)dlsym(cuda, "cuModuleLoadData");
    fn get = (fn)dlsym(cuda, "cuModuleGetFunction");
    launch = (fn)dlsym(cuda, "cuLaunchKernel");
    void *module = NULL, *module2 = NULL;
    const void *image = PTX, *image2 = PTX2;
    const char *cubins = getenv("APP_CUBINS");
    if (cubins && *cubins) {
        char first[4096];
        snprintf(first, sizeof first, "%.*s", (int)strcspn(cubins, ":"), cubins);
        image = slurp(first);
        image2 = strchr(cubins, ':') ? slurp(strchr(cubins, ':') + 1) : NULL;
        if (!image || !image2) return 5;
    }
    if (init(0) || load(&module, image) || get(&functions[0], module, "step") || load(&module2, image2) ||
        get(&functions[1], module2, "step2"))
        return 4;
    pthread_t threads[65];
    if (n < 1 || n > 64) return 2;
    for (int i = 0; i < n; i++) pthread_create(&threads[i], NULL, worker, NULL);
    if (argc > 3 && !strcmp(argv[3], "graph")) {
        if (!(graph_launch = (fn)dlsym(cuda, "cuGraphLaunch"))) return 4;
        pthread_create(&threads[n++], NULL, replayer, NULL);
    }
    for (int i = 0; i < n; i++) pthread_join(threads[i], NULL);
    printf("app_threads_loop launches %ld failed %ld\n", atomic_load(&launches), atomic_load(&failed));
    return 0;
}
