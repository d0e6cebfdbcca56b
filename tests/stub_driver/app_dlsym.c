/* Reaches the driver like PyTorch, Triton and CuPy: dlopen, then dlsym per exported symbol. */
#include "app_common.h"

static void *lib;

static void *by_dlsym(const char *api, int version, unsigned long long flags, const char *symbol) {
    return dlsym(lib, symbol);
}

int main(int argc, char **argv) {
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { printf("no libcuda: %s\n", dlerror()); return 2; }
    return app_main(argc, argv, by_dlsym);
}
