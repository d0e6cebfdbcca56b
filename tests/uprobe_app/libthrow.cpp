/* Functions left otherwise than by their return (tests/test_uprobes.py's unwinding test): thr_maybe throws
 * for multiples of 3, thr_jump longjmps out for multiples of 4, thr_exit ends its thread; thr_add returns;
 * thr_clean passes thr_maybe's throw on, and its frame's cleanup throws and catches one more; thr_relay
 * catches thr_maybe's and throws it again. */
#include <pthread.h>

#include <csetjmp>
#include <stdexcept>

extern "C" __attribute__((noinline)) long thr_maybe(long x) {
    if (x % 3 == 0) throw std::runtime_error("three");
    return x + 1;
}

extern "C" __attribute__((noinline)) long thr_jump(std::jmp_buf *env, long x) {
    if (x % 4 == 0) std::longjmp(*env, 1);
    return x + 2;
}

extern "C" __attribute__((noinline)) long thr_exit(long x) {
    if (x) pthread_exit(nullptr);
    return x + 3;
}

extern "C" __attribute__((noinline)) long thr_add(long x) { return x + 4; }

/* Its destructor runs on every way out of thr_clean: in the unwind of thr_maybe's throw, a throw of its own
 * and a catch before that unwind goes on. */
struct Rethrown {
    ~Rethrown() {
        try {
            thr_maybe(3);
        } catch (const std::runtime_error &) {
        }
    }
};

extern "C" __attribute__((noinline)) long thr_clean(long x) {
    Rethrown r;
    return thr_maybe(x);
}

extern "C" __attribute__((noinline)) long thr_relay(long x) {
    try {
        return thr_maybe(x);
    } catch (...) {
        throw;
    }
}
