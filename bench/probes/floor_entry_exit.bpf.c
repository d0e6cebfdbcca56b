/* The floor of the SASS back end's entry/exit cost (bench/bench_sass.py): programs at kernel entry and
 * exit whose glob matches no kernel. Every module is still patched at block enter and exit, since the
 * patch classes follow the programs' kinds; no launch gets a record, so every patch returns at once.
 * What is left is the mechanism alone: the sanitizer's launch callback, its trampoline and the call. */
#include "egpu.bpf.h"

SEC("kprobe/__egpu_floor_matches_no_kernel")
int on_entry(struct egpu_ctx *ctx)
{
	return 0;
}

SEC("kretprobe/__egpu_floor_matches_no_kernel")
int on_exit(struct egpu_ctx *ctx)
{
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
