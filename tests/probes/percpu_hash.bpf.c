/* Per-CPU hashes as libbpf-tools keep them, and Linux's other clocks: a count per kernel in a PERCPU_HASH
 * (each SM adds to its own value: atomically, as an SM runs many threads at once), a key written then
 * deleted (gone from every SM), an LRU_PERCPU_HASH's entries per site, and what bpf_ktime_get_boot_ns,
 * bpf_ktime_get_coarse_ns and bpf_get_numa_node_id give beside bpf_ktime_get_ns. */
#include "egpu.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 64);
	__type(key, __u64);
	__type(value, __u64);
} calls SEC(".maps");

struct seen {
	__u64 launch;
	__u64 times;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_PERCPU_HASH);
	__uint(max_entries, 8);
	__type(key, __u32);
	__type(value, struct seen);
} sites SEC(".maps");

/* 1 where the clock holds what Linux promises of it against ktime, and the node */
struct clocks {
	__u64 boot_not_before;    /* boot ns >= ktime ns read before it */
	__u64 coarse_within_tick; /* coarse ns within 10 ms (a tick at HZ 100) of ktime ns */
	__u64 numa_node;
};

struct clocks clocks;

SEC("kprobe/*")
int count_calls(struct egpu_ctx *ctx)
{
	__u64 t = bpf_ktime_get_ns(), key = ctx->kernel_id, one = 1, *n;
	__u32 site = ctx->site;
	struct seen first = {ctx->launch_id, 1}, *s;

	n = bpf_map_lookup_elem(&calls, &key);
	if (n) {
		__sync_fetch_and_add(n, 1);
	} else if (bpf_map_update_elem(&calls, &key, &one, BPF_NOEXIST) != 0) {
		n = bpf_map_lookup_elem(&calls, &key);
		if (n)
			__sync_fetch_and_add(n, 1);
	}
	key = ~key;
	bpf_map_update_elem(&calls, &key, &one, BPF_ANY);
	bpf_map_delete_elem(&calls, &key);

	bpf_map_update_elem(&sites, &site, &first, BPF_NOEXIST);
	site += 1;
	bpf_map_update_elem(&sites, &site, &first, BPF_ANY);
	s = bpf_map_lookup_elem(&sites, &site);
	if (s)
		__sync_fetch_and_add(&s->times, 1);

	clocks.boot_not_before = bpf_ktime_get_boot_ns() >= t;
	clocks.coarse_within_tick = bpf_ktime_get_coarse_ns() + 10000000 >= t;
	clocks.numa_node = bpf_get_numa_node_id();
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
