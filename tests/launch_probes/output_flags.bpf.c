/* What each output helper returns for its flags, kept in a map: a launch program in an object with a
 * host-API program, so that its ring and perf buffer calls run in C (runtime/native.py) as on the VM. */
#include "egpu.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 16);   /* room for every record of the tests' launches: none refused as full */
} ring SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __s64);
} results SEC(".maps");

static __always_inline void keep(__u32 k, __s64 v)
{
	__s64 *slot = bpf_map_lookup_elem(&results, &k);

	if (slot)
		*slot = v;
}

SEC("egpu/launch/*")
int output_flags(struct egpu_ctx *ctx)
{
	__u64 v = ctx->launch_id;

	keep(0, bpf_perf_event_output(ctx, &events, BPF_F_CURRENT_CPU, &v, sizeof(v)));
	keep(1, bpf_perf_event_output(ctx, &events, 1ULL << 33, &v, sizeof(v)));  /* not a CPU index: -EINVAL */
	keep(2, bpf_ringbuf_output(&ring, &v, sizeof(v), 2));   /* BPF_RB_FORCE_WAKEUP */
	keep(3, bpf_ringbuf_output(&ring, &v, sizeof(v), 7));   /* beyond the wakeup flags: -EINVAL */
	return 0;
}

SEC("egpu/sync/*")
int sync_seen(struct egpu_host_ctx *ctx)
{
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
