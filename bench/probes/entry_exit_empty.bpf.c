/* The entry/exit pair with no body: what a call site costs (context, call, lane regrouping) without
 * any map traffic. bench/bench_counters.py sets it beside the counters. */
#include "egpu.bpf.h"

SEC("kprobe/*")
int on_entry(struct egpu_ctx *ctx)
{
	return 0;
}

SEC("kretprobe/*")
int on_exit(struct egpu_ctx *ctx)
{
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
