/* Every shape the output renderers print: a struct key with a kernel id and an enum, a linear
 * histogram, a multi-slot PERCPU_ARRAY, ring-buffer records of a named struct, .bss/.data globals and
 * trace_printk. */
#include "egpu.bpf.h"

enum dir { DIR_LOAD = 1, DIR_STORE = 2 };

struct site_key {
	__u64 kernel_id;
	__u32 site;
	enum dir dir;
};

struct event {
	__u64 kernel_id;
	__u64 ts;
	char tag[8];
	__u32 sm;
	__u32 size;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, struct site_key);
	__type(value, __u64);
} sites SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 16);
	__type(key, __u32);
	__type(value, __u64);
} lhist4_size SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} dir_bytes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} events SEC(".maps");

__u64 accesses;           /* .bss */
char mode[8] = "sum";     /* .data */

/* Takes struct event by pointer so clang puts the type in BTF: the renderer prints records with it. */
static __noinline void fill(struct event *e, struct egpu_ctx *ctx)
{
	e->kernel_id = ctx->kernel_id;
	e->ts = bpf_ktime_get_ns();
	__builtin_memcpy(e->tag, "access", 7);
	e->sm = bpf_get_smp_processor_id();
	e->size = ctx->size;
}

SEC("egpu/mem/*")
int shapes(struct egpu_ctx *ctx)
{
	struct site_key key = {
		.kernel_id = ctx->kernel_id,
		.site = ctx->site,
		.dir = (ctx->flags & EGPU_F_STORE) ? DIR_STORE : DIR_LOAD,
	};
	__u64 one = 1, *n;
	__u32 slot = ctx->size / 4, d = key.dir == DIR_STORE;
	struct event *e;

	n = bpf_map_lookup_elem(&sites, &key);
	if (n)
		__sync_fetch_and_add(n, 1);
	else
		bpf_map_update_elem(&sites, &key, &one, BPF_NOEXIST);
	n = bpf_map_lookup_elem(&lhist4_size, &slot);
	if (n)
		__sync_fetch_and_add(n, 1);
	n = bpf_map_lookup_elem(&dir_bytes, &d);
	if (n)
		*n += ctx->size;
	__sync_fetch_and_add(&accesses, 1);
	if (ctx->site == 0) {
		e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
		if (e) {
			fill(e, ctx);
			bpf_ringbuf_submit(e, 0);
		}
	}
	if (ctx->size > 12)
		bpf_trace_printk("wide access of %u bytes at site %u\n", 37, ctx->size, ctx->site);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
