/* A C program (no libstdc++, no libgcc_s) that opens each library named RTLD_LOCAL: their unwinders are in no
 * global scope, and each may have a C++ runtime of its own. Each opened, thrown in twice (in turn) and closed,
 * twice: the second time their libraries are loaded anew unless kept. */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
    int caught = 0, n = argc - 1;
    void *h[4];
    int (*f[4])(int);
    if (n < 1 || n > 4) return 2;
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < n; i++) {
            if (!(h[i] = dlopen(argv[i + 1], RTLD_NOW | RTLD_LOCAL))) return fprintf(stderr, "%s\n", dlerror()), 2;
            f[i] = (int (*)(int))dlsym(h[i], "catch_one");
        }
        for (int j = 0; j < 2; j++)
            for (int i = 0; i < n; i++) caught += f[i](1);
        for (int i = 0; i < n; i++) dlclose(h[i]);
    }
    printf("caught %d\n", caught);
    return 0;
}
