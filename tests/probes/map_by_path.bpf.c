/* One helper call site, the map chosen per path (Linux varies the call's map pointer and runs that map's own
 * operations; egpu emits the call once per map): a __noinline bump() called for two maps of two types, and a
 * call whose map the context picks. */
#include "egpu.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} calls SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16);
	__type(key, __u32);
	__type(value, __u64);
} sites SEC(".maps");

static __noinline int bump(void *map, __u32 key, __u64 by)
{
	__u64 *v = bpf_map_lookup_elem(map, &key);

	if (v) {
		__sync_fetch_and_add(v, by);
		return 0;
	}
	return bpf_map_update_elem(map, &key, &by, BPF_NOEXIST);
}

SEC("kprobe/*")
int by_path(struct egpu_ctx *ctx)
{
	bump(&calls, 1, 1);
	bump(&sites, 2, 3);
	return bump(ctx->site & 1 ? (void *)&sites : (void *)&calls, 3, 5) + 7;
}

char LICENSE[] SEC("license") = "GPL";
