/* The suite's memory-access counter: every global load, store and atomic of every thread adds 1 to
 * its kind's slot (the counting half of bpftime's mem_trace, with no per-kernel key). */
#include "egpu.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} accesses SEC(".maps"); /* 0: loads, 1: stores (an atomic counts as a store) */

SEC("egpu/mem/*")
int count_access(struct egpu_ctx *ctx)
{
	__u32 key = (ctx->flags & EGPU_F_STORE) ? 1 : 0;
	__u64 *n = bpf_map_lookup_elem(&accesses, &key);

	if (n)
		__sync_fetch_and_add(n, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
