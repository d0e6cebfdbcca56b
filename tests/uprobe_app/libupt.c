/* The library the uprobe tests and bench/bench_uprobe.py probe: functions of known signatures. */
#include <string.h>

long upt_add6(long a, long b, long c, long d, long e, long f) { return a + b + c + d + e + f; }
/* two arguments on the stack: the stub must leave them where the callee looks */
long upt_sum8(long a, long b, long c, long d, long e, long f, long g, long h) {
    return a + 2 * b + 3 * c + 4 * d + 5 * e + 6 * f + 7 * g + 8 * h;
}
double upt_half(double x) { return x / 2; }
int upt_inc(int x) { return x + 1; }
/* a string argument, as libbpf tools read one (bpf_probe_read_user_str); NULL is -1 */
long upt_name(const char *s) { return s ? (long)strlen(s) : -1; }
/* calls back: the caller holds its thread inside a probed call for as long as it likes */
long upt_call(long (*fn)(long), long a) { return fn(a) + 1; }
