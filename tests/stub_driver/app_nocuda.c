/* Never touches CUDA: the shim must stay out of its way (no Python, dlsym semantics intact).
 * call_next() in libnext_a.so asks dlsym(RTLD_NEXT, "next_value") for libnext_b.so's definition. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

int call_next(void);

static void report(const char *who) {
    int (*initialized)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "Py_IsInitialized");
    printf("%s next=%d puts=%d python=%d\n", who, call_next(), dlsym(RTLD_DEFAULT, "puts") == (void *)puts,
           initialized ? initialized() : -1);
    fflush(stdout);
}

int main(void) {
    pid_t pid = fork();
    if (pid == 0) { report("child"); _exit(0); }
    waitpid(pid, NULL, 0);
    report("parent");
    return 0;
}
