/* For tests/test_hostapi_gpu.py: copies and sets counted by (kind, bytes), allocations and frees of
 * device memory by size, stream waits with the time blocked. */
#include "egpu.bpf.h"

struct sized {
	__u32 kind, pad;
	__u64 bytes;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct sized);
	__type(value, __u64);
} copies SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct sized);
	__type(value, __u64);
} allocs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct sized);
	__type(value, __u64);
} frees SEC(".maps");

__u64 stream_syncs, stream_blocked_ns;

static __always_inline void count(void *map, __u32 kind, __u64 bytes)
{
	struct sized k = {.kind = kind, .bytes = bytes};
	__u64 *n = bpf_map_lookup_elem(map, &k), one = 1;

	if (n)
		__sync_fetch_and_add(n, 1);
	else
		bpf_map_update_elem(map, &k, &one, BPF_NOEXIST);
}

SEC("egpu/memcpy/*")
int on_copy(struct egpu_host_ctx *c)
{
	if (!c->result)
		count(&copies, c->kind, c->bytes);
	return 0;
}

SEC("egpu/memset/*")
int on_set(struct egpu_host_ctx *c)
{
	if (!c->result)
		count(&copies, c->kind, c->bytes);
	return 0;
}

SEC("egpu/alloc/*")
int on_alloc(struct egpu_host_ctx *c)
{
	if (!c->result)
		count(&allocs, c->kind, c->bytes);
	return 0;
}

SEC("egpu/free/*")
int on_free(struct egpu_host_ctx *c)
{
	if (!c->result)
		count(&frees, c->kind, c->bytes);
	return 0;
}

SEC("egpu/sync/cuStreamSynchronize*")
int on_stream_sync(struct egpu_host_ctx *c)
{
	stream_syncs++;
	stream_blocked_ns += c->blocked_ns;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
