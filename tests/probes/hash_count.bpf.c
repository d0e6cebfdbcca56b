/* Counts entries per kernel: a HASH keyed by ctx->kernel_id, inserted with BPF_NOEXIST on first sight. */
#include "egpu.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u64);
	__type(value, __u64);
} per_kernel SEC(".maps");

SEC("kprobe/*")
int count_per_kernel(struct egpu_ctx *ctx)
{
	__u64 key = ctx->kernel_id;
	__u64 one = 1;
	__u64 *n = bpf_map_lookup_elem(&per_kernel, &key);

	if (n) {
		__sync_fetch_and_add(n, 1);
		return 0;
	}
	/* Another thread may have inserted it meanwhile: then add to its slot. */
	if (bpf_map_update_elem(&per_kernel, &key, &one, BPF_NOEXIST) != 0) {
		n = bpf_map_lookup_elem(&per_kernel, &key);
		if (n)
			__sync_fetch_and_add(n, 1);
	}
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
