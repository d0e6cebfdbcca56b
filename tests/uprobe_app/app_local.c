/* A C program (no libstdc++, no libgcc_s) that opens libcatch.so RTLD_LOCAL: its unwinder is in no global scope. */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) return fprintf(stderr, "%s\n", dlerror()), 2;
    int (*f)(int) = (int (*)(int))dlsym(h, "catch_one");
    printf("caught %d\n", f(1));
    return 0;
}
