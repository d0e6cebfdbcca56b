/* Every host-API section, for tests/test_hostapi.py: per driver symbol (api_id), how often it ran and the
 * bytes, and the last call's context; a glob that picks one API's variants; and a launch program that
 * shares a map with the host-API programs (one object, one set of maps). */
#include "egpu.bpf.h"

struct call {
	__u64 count, bytes, dst, src, stream, handle;
	__u32 kind, flags;
	__s32 result;
	__u32 timed;   /* calls whose blocked_ns was not 0 */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u64);
	__type(value, struct call);
} calls SEC(".maps");

/* [0] launches, [1] copies, [2] cuMemcpyHtoDAsync calls (any variant) */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 3);
	__type(key, __u32);
	__type(value, __u64);
} events SEC(".maps");

static __always_inline void bump(__u32 k)
{
	__u64 *n = bpf_map_lookup_elem(&events, &k);
	if (n)
		__sync_fetch_and_add(n, 1);
}

static __always_inline int note(struct egpu_host_ctx *c)
{
	__u64 id = c->api_id;
	struct call *v = bpf_map_lookup_elem(&calls, &id);
	if (!v) {
		struct call zero = {};
		bpf_map_update_elem(&calls, &id, &zero, BPF_NOEXIST);
		v = bpf_map_lookup_elem(&calls, &id);
		if (!v)
			return 0;
	}
	v->count++;
	v->bytes += c->bytes;
	v->dst = c->dst;
	v->src = c->src;
	v->stream = c->stream;
	v->handle = c->handle;
	v->kind = c->kind;
	v->flags = c->flags;
	v->result = c->result;
	v->timed += c->blocked_ns != 0;
	return 0;
}

SEC("egpu/memcpy/*")
int on_copy(struct egpu_host_ctx *c)
{
	bump(1);
	return note(c);
}

SEC("egpu/memset/*")
int on_set(struct egpu_host_ctx *c) { return note(c); }

SEC("egpu/alloc/*")
int on_alloc(struct egpu_host_ctx *c) { return note(c); }

SEC("egpu/free/*")
int on_free(struct egpu_host_ctx *c) { return note(c); }

SEC("egpu/sync/*")
int on_sync(struct egpu_host_ctx *c) { return note(c); }

SEC("egpu/memcpy/cuMemcpyHtoDAsync*")
int on_htod_async(struct egpu_host_ctx *c)
{
	bump(2);
	return 0;
}

SEC("egpu/launch/*")
int on_launch(struct egpu_ctx *c)
{
	bump(0);
	return 0;
}
