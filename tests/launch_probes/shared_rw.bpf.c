/* Maps a launch probe and a GPU probe share, touched every way a launch probe can: a value only read,
 * one written through the looked-up pointer, updates, deletes (present and absent) and a global. The
 * keys the C engine logs as changed must be the Python VM's (launches.py Touched): reads alone are
 * not copied to the device. */
#include "egpu.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 3);
	__type(key, __u64);
	__type(value, __u64);
} by_launch SEC(".maps");

__u64 launches_seen;

SEC("egpu/launch/*")
int on_launch(struct egpu_ctx *ctx)
{
	__u64 id = ctx->launch_id, gone = id - 2, sum = 0;
	__u32 k;
	__u64 *v;

	k = 0; /* read only */
	v = bpf_map_lookup_elem(&slots, &k);
	if (v)
		sum = *v;
	k = 1; /* written through the pointer, every other launch */
	v = bpf_map_lookup_elem(&slots, &k);
	if (v && id % 2)
		*v += id;
	k = 2; /* written back unchanged: not a change */
	v = bpf_map_lookup_elem(&slots, &k);
	if (v)
		*v = *v;
	k = 3;
	if (id % 3 == 0)
		bpf_map_update_elem(&slots, &k, &id, BPF_ANY);
	bpf_map_update_elem(&by_launch, &id, &sum, BPF_ANY);
	if (id % 4 == 0)
		bpf_map_delete_elem(&by_launch, &gone);
	bpf_map_delete_elem(&by_launch, &sum); /* absent: -ENOENT, no change */
	if (id % 5 == 0)
		launches_seen++;
	return 0;
}

SEC("kprobe/*")
int on_entry(struct egpu_ctx *ctx)
{
	__u32 k = 0;
	__u64 *v = bpf_map_lookup_elem(&slots, &k), launch = ctx->launch_id;

	if (v && bpf_map_lookup_elem(&by_launch, &launch))
		__sync_fetch_and_add(v, launches_seen);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
