/* The floor of the SASS back end's memory-access cost (bench/bench_sass.py): a program at every global
 * access whose glob matches no kernel, so every module is patched at each access and every patch
 * returns at once (no launch gets a record). */
#include "egpu.bpf.h"

SEC("egpu/mem/__egpu_floor_matches_no_kernel")
int on_access(struct egpu_ctx *ctx)
{
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
