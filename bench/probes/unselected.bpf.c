/* A probe that selects no kernel (bench/bench_sass.py's "unselected" row): programs at kernel entry, exit
 * and every global access whose glob matches no kernel. The SASS back end weighs each module's kernels
 * against them and patches none, so the job should run as if no probe were attached. */
#include "egpu.bpf.h"

SEC("kprobe/__egpu_matches_no_kernel")
int on_entry(struct egpu_ctx *ctx)
{
	return 0;
}

SEC("kretprobe/__egpu_matches_no_kernel")
int on_exit(struct egpu_ctx *ctx)
{
	return 0;
}

SEC("egpu/mem/__egpu_matches_no_kernel")
int on_access(struct egpu_ctx *ctx)
{
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
