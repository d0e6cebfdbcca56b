/* Static subprograms in .text, nested two deep and shared by two programs in different sections. */
#include "egpu.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} classes SEC(".maps");

static __noinline __u32 bucket(__u32 size)
{
	if (size <= 1)
		return 0;
	if (size <= 4)
		return 1;
	if (size <= 8)
		return 2;
	return 3;
}

static __noinline int bump(__u32 size, __u64 by)
{
	__u32 key = bucket(size);
	__u64 *n = bpf_map_lookup_elem(&classes, &key);

	if (!n)
		return 0;
	__sync_fetch_and_add(n, by);
	return key;
}

SEC("egpu/load/*")
int loads(struct egpu_ctx *ctx)
{
	return bump(ctx->size, 1);
}

SEC("egpu/store/*")
int stores(struct egpu_ctx *ctx)
{
	return bump(ctx->size, 1) + bucket(ctx->size);
}

char LICENSE[] SEC("license") = "GPL";
