/* A bounded loop kept as a loop (no unrolling): xorshift-hash the kernel id into one of 16 slots. */
#include "egpu.bpf.h"

#define SLOTS 16

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} slots SEC(".maps");

SEC("kprobe/*")
int hash_slots(struct egpu_ctx *ctx)
{
	__u64 h = ctx->kernel_id ^ ctx->launch_id;

#pragma clang loop unroll(disable)
	for (int i = 0; i < 10; i++) {
		h ^= h << 13;
		h ^= h >> 7;
		h ^= h << 17;
	}
	__u32 key = h % SLOTS;
	__u64 *n = bpf_map_lookup_elem(&slots, &key);

	if (n)
		__sync_fetch_and_add(n, 1);
	return key;
}

char LICENSE[] SEC("license") = "GPL";
