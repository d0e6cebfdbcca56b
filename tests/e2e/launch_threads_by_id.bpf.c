/* Every launch's threads (grid x block) by launch id, from egpu's own launch records (a launch probe:
 * it runs in C in the shim's drainer). tests/test_sass_live_gpu.py holds a live probe's per-launch entry
 * counts to it. Ids wrap at 2^18: the test paces its job to stay under that. */
#include "egpu.bpf.h"

#define IDS (1 << 18)

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, IDS);
	__type(key, __u32);
	__type(value, __u64);
} threads SEC(".maps");

SEC("egpu/launch/*")
int launch_threads(struct egpu_ctx *ctx)
{
	__u32 key = ctx->launch_id & (IDS - 1);
	__u64 *n = bpf_map_lookup_elem(&threads, &key);

	if (n)
		*n = (__u64)ctx->grid[0] * ctx->grid[1] * ctx->grid[2] * ctx->block[0] * ctx->block[1] * ctx->block[2];
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
