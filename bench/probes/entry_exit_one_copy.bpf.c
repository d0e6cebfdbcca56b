/* bench_counters' control for striping: the suite's entry/exit counter kept in one copy. The probe
 * also reads the counter, in a branch no launch takes (a context size of 0xdead), and a counter a
 * probe reads is not striped (translate/striping.py), so every warp's aggregated atomic lands on one
 * L2 line, as every ARRAY counter's did before striping. */
#define ONE_COPY
#include "entry_exit.bpf.c"
