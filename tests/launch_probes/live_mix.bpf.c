/* A launch probe beside a GPU probe, for the maps read while a job runs (tests/test_live.py): counts, an
 * ARRAY both sides use (so the device copy is the one to read): [0] the GPU's (with EGPU_STUB_PROBE_COUNTS
 * the stand-in driver adds 1 to slot 0 of the probe's first map at every launch of a module carrying it,
 * where this kprobe, which never runs there, would count each thread), [1] the launches the launch probe
 * saw, which reach the device only by the runtime's pushes; by_kernel, the launch probe's alone (the
 * host copy is the one to read): launches by kernel. */
#include "egpu.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16);
	__type(key, __u64);
	__type(value, __u64);
} by_kernel SEC(".maps");

SEC("egpu/launch/*")
int on_launch(struct egpu_ctx *ctx)
{
	__u32 k = 1;
	__u64 id = ctx->kernel_id, one = 1;
	__u64 *v = bpf_map_lookup_elem(&counts, &k);

	if (v)
		*v += 1;
	v = bpf_map_lookup_elem(&by_kernel, &id);
	if (v)
		*v += 1;
	else
		bpf_map_update_elem(&by_kernel, &id, &one, BPF_ANY);
	return 0;
}

SEC("kprobe/step")
int on_entry(struct egpu_ctx *ctx)
{
	__u32 k = 0;
	__u64 *v = bpf_map_lookup_elem(&counts, &k);

	if (v)
		__sync_fetch_and_add(v, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
