/* Callers of libthrow's functions through the PLT, each a frame a probe's return programs wait on while
 * its callee is left: thr_outer catches what thr_maybe throws, thr_guard what thr_clean passes on, thr_shelter
 * what thr_relay throws again, thr_nest is where thr_jump longjmps to;
 * and thr_tail, whose tail call (built -O2: a jmp) enters thr_add with thr_tail's return slot. */
#include <csetjmp>
#include <stdexcept>

extern "C" long thr_maybe(long x);
extern "C" long thr_jump(std::jmp_buf *env, long x);
extern "C" long thr_add(long x);
extern "C" long thr_clean(long x);
extern "C" long thr_relay(long x);

extern "C" __attribute__((noinline)) long thr_outer(long x) {
    try {
        return thr_maybe(x);
    } catch (const std::runtime_error &) {
        return -1;
    }
}

extern "C" __attribute__((noinline)) long thr_guard(long x) {
    try {
        return thr_clean(x);
    } catch (const std::runtime_error &) {
        return -1;
    }
}

extern "C" __attribute__((noinline)) long thr_shelter(long x) {
    try {
        return thr_relay(x);
    } catch (const std::runtime_error &) {
        return -3;
    }
}

extern "C" __attribute__((noinline)) long thr_nest(long x) {
    std::jmp_buf env;
    if (setjmp(env)) return -2;
    return thr_jump(&env, x) + 1;
}

extern "C" __attribute__((noinline)) long thr_tail(long x) { return thr_add(x + 1); }
