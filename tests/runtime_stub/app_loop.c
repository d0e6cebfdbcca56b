/* A job to attach to (tests/test_live.py): `app_loop STOP MAX_S [library]` loads one PTX module (with
 * `library`: a library, as cudart loads, its kernel a CUkernel) whose kernel
 * `step` keeps __device__ state (.global .u64 launches[1], which the stand-in bumps at every launch of
 * the module), sets that state to 1000 the way cudaMemcpyToSymbol does (cuModuleGetGlobal +
 * cuMemcpyHtoD), prints "ready", then launches `step` every millisecond until the file STOP exists
 * (or MAX_S seconds passed), reads the state back and prints launches, state and the OR of all
 * results. With the state carried through every swap, state == 1000 + launches. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static const char PTX[] =
    ".version 8.0\n.target sm_90\n.address_size 64\n\n"
    ".visible .global .align 8 .u64 launches[1];\n\n"
    ".visible .entry step(\n\t.param .u64 a\n)\n{\n"
    "\t.reg .b64 %rd<4>;\n\tld.param.u64 %rd1, [a];\n\tld.global.u64 %rd2, [launches];\n"
    "\tadd.u64 %rd2, %rd2, 1;\n\tst.global.u64 [launches], %rd2;\n\tret;\n}\n";

typedef int (*fn)();

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) return 2;
    int library = argc == 4;
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) return 2;
#define SYM(name) fn name = (fn)dlsym(cuda, #name)
    SYM(cuInit); SYM(cuModuleLoadData); SYM(cuModuleGetFunction); SYM(cuLaunchKernel); SYM(cuCtxSynchronize);
    SYM(cuModuleGetGlobal_v2); SYM(cuMemcpyHtoD_v2); SYM(cuMemcpyDtoH_v2);
    SYM(cuLibraryLoadData); SYM(cuLibraryGetKernel); SYM(cuLibraryGetGlobal);
    fn get_global = library ? cuLibraryGetGlobal : cuModuleGetGlobal_v2;
    void *mod = NULL, *f = NULL;
    unsigned long long state = 1000, global = 0, arg = 7;
    size_t size = 0;
    int r = cuInit(0);
    if (library)
        r |= cuLibraryLoadData(&mod, PTX, NULL, NULL, 0, NULL, NULL, 0) | cuLibraryGetKernel(&f, mod, "step");
    else
        r |= cuModuleLoadData(&mod, PTX) | cuModuleGetFunction(&f, mod, "step");
    r |= get_global(&global, &size, mod, "launches") | cuMemcpyHtoD_v2(global, &state, sizeof state);
    void *params[] = {&arg};
    unsigned long long k = 0;
    double end = now() + atof(argv[2]);
    printf("ready\n");
    fflush(stdout);
    while (access(argv[1], F_OK) != 0 && now() < end) {
        r |= cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
        k++;
        usleep(1000);
    }
    r |= cuCtxSynchronize();
    r |= get_global(&global, &size, mod, "launches") | cuMemcpyDtoH_v2(&state, global, sizeof state);
    printf("app_loop launches=%llu state=%llu result=%d\n", k, state, r);
    return r ? 1 : 0;
}
