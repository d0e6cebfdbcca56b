/* Legal C the verifier once refused (issue 20, item 8): a subprogram's result clang drops, and a length
 * whose bounds clang tests on a copy. */
#include "egpu.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} sizes SEC(".maps");

/* The caller ignores the result, so clang leaves r0 unset on the path that adds. */
static __noinline int note(__u64 *v, __u32 by)
{
	if (!v)
		return 0;
	__sync_fetch_and_add(v, by);
	return 1;
}

SEC("kprobe/*")
int dropped_result(struct egpu_ctx *ctx)
{
	__u32 k = 0;

	note(bpf_map_lookup_elem(&sizes, &k), ctx->size);
	return 0;
}

/* clang tests n - 1 <= 31 on a copy of n: the bound reaches n only through the link between them. */
SEC("kprobe/*")
int printk_len(struct egpu_ctx *ctx)
{
	char buf[32] = "site %d\n";
	__u32 n = ctx->size;

	if (n > 0 && n <= 32)
		bpf_trace_printk(buf, n, ctx->site);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
