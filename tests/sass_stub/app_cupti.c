/* A job that turns on CUPTI after its first kernel, as torch.profiler does (tests/test_sass_live.py):
 * `app_cupti LIBCUPTI` dlopens the stand-in CUPTI locally and calls it through dlsym; built with
 * -DLINKED it calls the one it was linked with; `app_cupti LIBPROFILER start` dlopens profiler_lib.c's
 * library locally, which calls the libcupti it was linked with, as torch's kineto does. Prints
 * "cupti register=R enable=E launch=L". */
#include <dlfcn.h>
#include <stdio.h>

typedef int (*fn)();
#ifdef LINKED
int cuptiActivityRegisterCallbacks(void *requested, void *completed);
int cuptiActivityEnable(int kind);
#endif

static const char PTX[] = ".version 8.0\n.target sm_90\n.address_size 64\n\n.visible .entry step()\n{\n\tret;\n}\n";

int main(int argc, char **argv) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) return 3;
    fn init = (fn)dlsym(cuda, "cuInit"), load = (fn)dlsym(cuda, "cuModuleLoadData");
    fn get = (fn)dlsym(cuda, "cuModuleGetFunction"), launch = (fn)dlsym(cuda, "cuLaunchKernel");
    void *module = NULL, *f = NULL;
    if (init(0) || load(&module, PTX) || get(&f, module, "step") || launch(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL))
        return 4;
#ifdef LINKED
    (void)argc, (void)argv;
    int reg = cuptiActivityRegisterCallbacks(NULL, NULL), en = cuptiActivityEnable(10);
#else
    void *lib = argc > 1 ? dlopen(argv[1], RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!lib) return 5;
    int reg, en;
    if (argc > 2) {
        reg = ((int (*)(int *))dlsym(lib, "profiler_start"))(&en);
    } else {
        reg = ((fn)dlsym(lib, "cuptiActivityRegisterCallbacks"))(NULL, NULL);
        en = ((fn)dlsym(lib, "cuptiActivityEnable"))(10);
    }
#endif
    printf("cupti register=%d enable=%d launch=%d\n", reg, en, launch(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    return 0;
}
