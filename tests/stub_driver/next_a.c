#define _GNU_SOURCE
#include <dlfcn.h>
int next_value(void) { return 1; }
/* RTLD_NEXT is relative to the caller: this library, so the answer must be libnext_b.so's. */
int call_next(void) {
    int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "next_value");
    return next ? next() : -1;
}
