/* Never touches CUDA: a thread holds the loader's lock (dlopen of loader_busy.so, whose constructor waits for
 * the main thread) while the main thread vforks and the child execs /bin/true. The parent runs on only once
 * the child has exec'd, so a child that took the loader's lock before exec'ing never would: its alarm ends it
 * (signal=14). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void *opener(void *lib) { return dlopen(lib, RTLD_NOW); }

int main(int argc, char **argv) {
    int ready[2], go[2];
    char fds[32], c;
    if (argc != 2 || pipe(ready) || pipe(go)) return 2;
    snprintf(fds, sizeof fds, "%d %d", ready[1], go[0]);
    setenv("LOADER_BUSY_FDS", fds, 1);
    pthread_t t;
    pthread_create(&t, NULL, opener, argv[1]);
    if (read(ready[0], &c, 1) != 1) return 2; /* the opener is in the constructor, the lock held */
    pid_t pid = vfork();
    if (pid == 0) {
        char *args[] = {"/bin/true", NULL};
        alarm(5);
        execv(args[0], args);
        _exit(127);
    }
    if (write(go[1], "g", 1) != 1) return 2;
    void *lib;
    pthread_join(t, &lib);
    int status;
    waitpid(pid, &status, 0);
    printf("child exit=%d signal=%d lib=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1,
           WIFSIGNALED(status) ? WTERMSIG(status) : 0, lib != NULL);
    return 0;
}
