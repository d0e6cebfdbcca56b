/* entry_exit.bpf.c with its counters in a PERCPU_ARRAY (one slot per SM), the eBPF idiom for hot
 * counters: warps of different SMs no longer serialize on one address. */
#include "egpu.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} calls SEC(".maps"); /* 0: entries, 1: exits; summed over SMs when printed */

static __always_inline void bump(__u32 key)
{
	__u64 *n = bpf_map_lookup_elem(&calls, &key);

	if (n)
		__sync_fetch_and_add(n, 1);
}

SEC("kprobe/*")
int on_entry(struct egpu_ctx *ctx)
{
	bump(0);
	return 0;
}

SEC("kretprobe/*")
int on_exit(struct egpu_ctx *ctx)
{
	bump(1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
