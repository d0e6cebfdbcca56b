/* Launches that name no kernel parameters (kernelParams NULL, and extra NULL or holding no buffer: a
 * CU_LAUNCH_PARAM_BUFFER_POINTER without its size has no effect) of handles registered with a launch id
 * (egpu_shim_register_launch_id). A kernel with parameters: the driver gets the application's own NULL and
 * extra, to answer as it would without the shim. A kernel with none: the launch id alone. Made-up handles,
 * the stand-in not logging; it keeps what the last launch gave it (egpu_stub_last_launch). Prints
 * "STEP result=R params=null|ID extra=app|null", one line per launch. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>

#include "egpu_shim.h"

typedef void *H;
typedef CUresult (*launch_fn)(H, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, H,
                              void **, void **);
typedef CUresult (*launch_ex_fn)(const CUlaunchConfig *, H, void **, void **);

static void (*last)(void ***params, void ***extra);

static void show(const char *step, CUresult r, void **app_extra) {
    void **params, **extra;
    last(&params, &extra);
    printf("%s result=%d params=", step, r);
    if (params) printf("%llu", *(unsigned long long *)params[0]);
    else printf("null");
    printf(" extra=%s\n", extra == app_extra && extra ? "app" : extra ? "other" : "null");
}

int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    launch_fn launch = (launch_fn)dlsym(h, "cuLaunchKernel");
    launch_ex_fn launch_ex = (launch_ex_fn)dlsym(h, "cuLaunchKernelEx");
    int (*reg)(void *, void *, unsigned int, unsigned int) = dlsym(RTLD_DEFAULT, "egpu_shim_register_launch_id");
    last = dlsym(h, "egpu_stub_last_launch");
    if (!launch || !launch_ex || !reg || !last) return 2;
    H two = (H)0x1000, none = (H)0x2000;   /* kernels of 2 parameters (16 bytes) and of none */
    reg(two, (H)0x1100, 2, 16);
    reg(none, (H)0x2100, 0, 0);
    char buffer[16] = {0};
    void *pointer_only[] = {(void *)1, buffer, NULL};   /* CU_LAUNCH_PARAM_BUFFER_POINTER, no size */
    CUlaunchConfig config = {1, 1, 1, 1, 1, 1, 0, NULL, NULL, 0};
    show("null", launch(two, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL), NULL);
    show("pointer_only", launch(two, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, pointer_only), pointer_only);
    show("ex_null", launch_ex(&config, two, NULL, NULL), NULL);
    show("no_params", launch(none, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL), NULL);
    show("ex_no_params", launch_ex(&config, none, NULL, NULL), NULL);
    return 0;
}
