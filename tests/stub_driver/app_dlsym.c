/* Reaches the driver like PyTorch, Triton and CuPy: dlopen, then dlsym per exported symbol. Built with
 * -DBY_DLVSYM (app_dlvsym): dlvsym for the stand-in's symbol version (libcuda_stub.map) instead. */
#include "app_common.h"

static void *lib;

static void *by_dlsym(const char *api, int version, unsigned long long flags, const char *symbol) {
#ifdef BY_DLVSYM
    return dlvsym(lib, symbol, "EGPU_STUB_1.0");
#else
    return dlsym(lib, symbol);
#endif
}

int main(int argc, char **argv) {
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { printf("no libcuda: %s\n", dlerror()); return 2; }
    return app_main(argc, argv, by_dlsym);
}
