/* The lower-addressed of two slots (a lock order, say): clang compares the two value pointers, an ordered
 * comparison the kernel allows where pointers may leak (every tracing program). Slot 0 is looked up first,
 * so it is the lower address on the VM (a region per value, in lookup order) as on the GPU. */
#include "egpu.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} slots SEC(".maps");

SEC("kprobe/*")
int lower_slot(struct egpu_ctx *ctx)
{
	__u32 k0 = 0, k1 = (ctx->site & 3) | 1;
	__u64 *a = bpf_map_lookup_elem(&slots, &k0);
	__u64 *b = bpf_map_lookup_elem(&slots, &k1);

	if (!a || !b)
		return 0;
	__sync_fetch_and_add(a < b ? a : b, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
