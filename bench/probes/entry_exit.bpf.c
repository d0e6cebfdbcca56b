/* The suite's entry/exit counter: every thread of every kernel adds 1 at entry and 1 at exit, the
 * simplest kprobe/kretprobe pair (bpftime's cuda-counter without its clock reads). */
#include "egpu.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} calls SEC(".maps"); /* 0: entries, 1: exits */

static __always_inline int bump(struct egpu_ctx *ctx, __u32 key)
{
	__u64 *n = bpf_map_lookup_elem(&calls, &key);

	if (!n)
		return 0;
#ifdef ONE_COPY /* entry_exit_one_copy.bpf.c: a read no launch makes keeps the counter in one copy */
	if (ctx->size == 0xdead)
		return *n;
#endif
	__sync_fetch_and_add(n, 1);
	return 0;
}

SEC("kprobe/*")
int on_entry(struct egpu_ctx *ctx)
{
	return bump(ctx, 0);
}

SEC("kretprobe/*")
int on_exit(struct egpu_ctx *ctx)
{
	return bump(ctx, 1);
}

char LICENSE[] SEC("license") = "GPL";
