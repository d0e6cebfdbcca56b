/* A C program (no libstdc++, no libgcc_s) that opens libcatch.so RTLD_LOCAL: its unwinder is in no global scope.
 * Opened, thrown in twice and closed, twice: the second time its libraries are loaded anew unless kept. */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
    int caught = 0;
    for (int k = 0; k < 2; k++) {
        void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
        if (!h) return fprintf(stderr, "%s\n", dlerror()), 2;
        int (*f)(int) = (int (*)(int))dlsym(h, "catch_one");
        caught += f(1) + f(1);
        dlclose(h);
    }
    printf("caught %d\n", caught);
    return 0;
}
