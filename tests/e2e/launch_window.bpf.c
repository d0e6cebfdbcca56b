/* Counts threads per launch id in a HASH, adding STEP per thread (1 here; launch_window_b.bpf.c adds
 * 1 << 32). tests/test_swap_gpu.py swaps the two on a running job: a launch id whose count is
 * neither threads nor threads << 32 ran half of each, a missing one ran neither. SITE is where it
 * runs (mem_window.bpf.c: at every global access). */
#include "egpu.bpf.h"

#ifndef STEP
#define STEP 1ULL
#endif
#ifndef SITE
#define SITE "kprobe/*"
#endif

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 32768);
	__type(key, __u64);
	__type(value, __u64);
} by_launch SEC(".maps");

SEC(SITE)
int count_launch_threads(struct egpu_ctx *ctx)
{
	__u64 key = ctx->launch_id;
	__u64 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&by_launch, &key);

	if (!n) {
		/* Another thread may have inserted it meanwhile: then NOEXIST fails and the lookup finds it. */
		bpf_map_update_elem(&by_launch, &key, &zero, BPF_NOEXIST);
		n = bpf_map_lookup_elem(&by_launch, &key);
	}
	if (n)
		__sync_fetch_and_add(n, STEP);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
