/* A probe egpu attach hooks into tests/uprobe_app/app_stress.c's 8 threads over and over while they run:
 * counts upt_add6's calls and returns, and the returns that are plausible (at least 4: the app's calls
 * return a + b + 4 with a, b >= 0), with atomic adds, in a map it shares with its GPU program, so what the
 * uprobes write is pushed to the device copy meanwhile (runtime/uprobes.py Pushes). */
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

enum { CALLS, RETURNS, RIGHT_RETURNS, GPU_LAUNCHES, COUNTERS };

struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, COUNTERS); __type(key, u32); __type(value, u64); }
	counts SEC(".maps");

static __always_inline void add(u32 k)
{
	u64 *v = bpf_map_lookup_elem(&counts, &k);
	if (v)
		__sync_fetch_and_add(v, 1);
}

SEC("uprobe/libupt.so:upt_add6")
int BPF_KPROBE(add6_entry)
{
	add(CALLS);
	return 0;
}

SEC("uretprobe/libupt.so:upt_add6")
int BPF_KRETPROBE(add6_exit, long rc)
{
	add(RETURNS);
	if (rc >= 4)
		add(RIGHT_RETURNS);
	return 0;
}

SEC("kprobe/vecadd")
int launched(void *ctx)
{
	add(GPU_LAUNCHES);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
