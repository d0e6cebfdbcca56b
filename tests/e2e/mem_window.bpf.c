/* Counts global memory accesses per launch id in the HASH launch_window.bpf.c declares, adding 1 << 32
 * per access: swapped in for launch_window on a running job (tests/test_sass_live_gpu.py), it takes that
 * map over, so a launch id with low bits set and high bits set ran both probes. */
#include "egpu.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 32768);
	__type(key, __u64);
	__type(value, __u64);
} by_launch SEC(".maps");

SEC("egpu/mem/*")
int count_launch_accesses(struct egpu_ctx *ctx)
{
	__u64 key = ctx->launch_id;
	__u64 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&by_launch, &key);

	if (!n) {
		bpf_map_update_elem(&by_launch, &key, &zero, BPF_NOEXIST);
		n = bpf_map_lookup_elem(&by_launch, &key);
	}
	if (n)
		__sync_fetch_and_add(n, 1ULL << 32);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
