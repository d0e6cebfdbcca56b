/* A bpf_printk line from every thread at kernel entry, and the entries counted: a launch of more threads than
 * the trace_printk ring holds lines drops the rest, which the output must say (lines + dropped = entries). */
#include "egpu.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} entries SEC(".maps");

SEC("kprobe/*")
int print_entry(struct egpu_ctx *ctx)
{
	__u32 key = 0;
	__u64 *n = bpf_map_lookup_elem(&entries, &key);

	if (n)
		__sync_fetch_and_add(n, 1);
	bpf_printk("entry %llu", ctx->launch_id);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
