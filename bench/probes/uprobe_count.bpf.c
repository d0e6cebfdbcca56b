/* bench/bench_uprobe.py: count the calls of libupt's upt_inc (tests/uprobe_app) at entry, and with
 * RETURNS (uprobe_count_ret.bpf.c) at return too. */
#include "egpu.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} calls SEC(".maps");

static __always_inline void count(__u32 k)
{
	__u64 *v = bpf_map_lookup_elem(&calls, &k);
	if (v)
		__sync_fetch_and_add(v, 1); /* atomic: the threads case's runs overlap */
}

SEC("uprobe/libupt.so:upt_inc")
int entry(void *ctx)
{
	count(0);
	return 0;
}

#ifdef RETURNS
SEC("uretprobe/libupt.so:upt_inc")
int exit_(void *ctx)
{
	count(1);
	return 0;
}
#endif

char LICENSE[] SEC("license") = "GPL";
