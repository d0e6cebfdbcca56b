/* Global memory traffic: bytes loaded and stored, and touches per 4 KiB page (LRU, bounded). */
#include "egpu.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} bytes SEC(".maps");  /* 0: loaded, 1: stored */

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u64);
} pages SEC(".maps");

SEC("egpu/mem/*")
int trace_mem(struct egpu_ctx *ctx)
{
	__u32 dir = (ctx->flags & EGPU_F_STORE) ? 1 : 0;
	__u64 page = ctx->addr >> 12;
	__u64 one = 1;
	__u64 *n = bpf_map_lookup_elem(&bytes, &dir);

	if (n)
		__sync_fetch_and_add(n, ctx->size);
	n = bpf_map_lookup_elem(&pages, &page);
	if (n)
		__sync_fetch_and_add(n, 1);
	else
		bpf_map_update_elem(&pages, &page, &one, BPF_NOEXIST);
	return 0;
}

SEC("egpu/store.warp/*")
int warp_stores(struct egpu_ctx *ctx)
{
	__u32 key = 1;
	__u64 *n = bpf_map_lookup_elem(&bytes, &key);

	if (n && (ctx->flags & EGPU_F_ATOMIC))
		__sync_fetch_and_add(n, 0);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
