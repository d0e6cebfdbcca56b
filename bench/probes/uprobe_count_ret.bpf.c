/* bench/bench_uprobe.py: uprobe_count.bpf.c with its return probe too. */
#define RETURNS
#include "uprobe_count.bpf.c"
