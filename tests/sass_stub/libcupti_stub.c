/* A stand-in libcupti for CI: the driver lends one tool slot, held here by the stand-in sanitizer
 * (EGPU_SANITIZER_LIB) while it is subscribed. Each call that takes the slot returns 39
 * (CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) while the sanitizer holds it, else 0. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>

static int slot(void) {
    const char *path = getenv("EGPU_SANITIZER_LIB");
    void *h = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    int (*held)(void) = h ? (int (*)(void))dlsym(h, "egpu_stub_sanitizer_subscribed") : NULL;
    return held && held() ? 39 : 0;
}

int cuptiSubscribe(void **subscriber, void *callback, void *userdata) {
    (void)callback, (void)userdata;
    *subscriber = (void *)1;
    return slot();
}
int cuptiActivityRegisterCallbacks(void *requested, void *completed) {
    (void)requested, (void)completed;
    return slot();
}
int cuptiActivityEnable(int kind) { return kind < 0 ? 1 : slot(); }
