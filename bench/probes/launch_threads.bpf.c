/* The suite's witness for entry counts (bench/probe_check.py): every launch the shim records, whatever
 * kernel and whether instrumented or not, adds its threads (grid x block) to slot 0 and 1 to slot 1. An
 * entry/exit counter that ran in every thread counted exactly slot 0 entries and as many exits. */
#include "egpu.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} launched SEC(".maps"); /* 0: threads, 1: launches */

static __always_inline void add(__u32 key, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&launched, &key);

	if (v)
		__sync_fetch_and_add(v, n);
}

SEC("egpu/launch/*")
int count_threads(struct egpu_ctx *ctx)
{
	add(0, (__u64)ctx->grid[0] * ctx->grid[1] * ctx->grid[2] * ctx->block[0] * ctx->block[1] * ctx->block[2]);
	add(1, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
