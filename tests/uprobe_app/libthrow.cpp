/* Functions left otherwise than by their return (tests/test_uprobes.py's unwinding test): thr_maybe throws
 * for multiples of 3, thr_jump longjmps out for multiples of 4, thr_exit ends its thread; thr_add returns. */
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
