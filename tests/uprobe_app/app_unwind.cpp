/* `app_unwind N`: starts the stand-in driver (so the runtime comes up), then N times calls libthrow's
 * thr_maybe (catching what it throws) and libouter's thr_outer, thr_guard and thr_shelter, then N times
 * libthrow's thr_jump (a setjmp here taking its longjmp) and libouter's thr_nest and thr_tail; then a
 * thread calls thr_exit, which ends it, while an object of its frame waits for its destructor. Prints what the calls returned, how many
 * were left by a throw or a jump, and how many destructors the thread's end ran. */
#include <dlfcn.h>
#include <pthread.h>

#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

extern "C" long thr_maybe(long x);
extern "C" long thr_jump(std::jmp_buf *env, long x);
extern "C" long thr_outer(long x);
extern "C" long thr_nest(long x);
extern "C" long thr_exit(long x);
extern "C" long thr_tail(long x);
extern "C" long thr_guard(long x);
extern "C" long thr_shelter(long x);

typedef int (*fn)(...);
static const char PTX[] = ".version 8.0\n.target sm_90\n.address_size 64\n\n"
                          ".visible .entry vecadd(\n\t.param .u64 a\n)\n{\n\tret;\n}\n";
static std::jmp_buf env;
static int destroyed;

struct Guard {
    ~Guard() { destroyed++; }
};

static void *exiting(void *) {
    Guard g;
    thr_exit(0);
    thr_exit(1);
    return nullptr;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) return 2;
    fn cuInit = (fn)dlsym(cuda, "cuInit"), cuModuleLoadData = (fn)dlsym(cuda, "cuModuleLoadData");
    void *mod = nullptr;
    int r = cuInit(0) | cuModuleLoadData(&mod, PTX);
    long n = atol(argv[1]), sum = 0, caught = 0, jumped = 0;
    for (long i = 0; i < n; i++) {
        try {
            sum += thr_maybe(i);
        } catch (const std::runtime_error &) {
            caught++;
        }
        sum += thr_outer(i) + thr_guard(i) + thr_shelter(i);
    }
    for (long i = 0; i < n; i++) {   /* apart: a throw puts every swapped address back, a jump's entry too */
        if (setjmp(env))
            jumped++;
        else
            sum += thr_jump(&env, i);
        sum += thr_nest(i) + thr_tail(i);
    }
    pthread_t t;
    pthread_create(&t, nullptr, exiting, nullptr);
    pthread_join(t, nullptr);
    printf("app_unwind n=%ld sum=%ld caught=%ld jumped=%ld destroyed=%d result=%d\n", n, sum, caught, jumped,
           destroyed, r);
    return 0;
}
