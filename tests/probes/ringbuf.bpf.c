/* One event per block on entry (ringbuf_reserve/submit) and on exit (ringbuf_output). */
#include "egpu.bpf.h"

struct event {
	__u64 kernel_id;
	__u64 launch_id;
	__u64 ts;
	__u32 sm;
	__u32 kind;
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} events SEC(".maps");

SEC("kprobe.block/*")
int block_enter(struct egpu_ctx *ctx)
{
	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);

	if (!e)
		return 0;
	e->kernel_id = ctx->kernel_id;
	e->launch_id = ctx->launch_id;
	e->ts = bpf_ktime_get_ns();
	e->sm = bpf_get_smp_processor_id();
	e->kind = ctx->kind;
	if (e->ts == 0) {  /* never on a GPU: %globaltimer runs */
		bpf_ringbuf_discard(e, 0);
		return 0;
	}
	bpf_ringbuf_submit(e, 0);
	return 0;
}

SEC("kretprobe.block/*")
int block_exit(struct egpu_ctx *ctx)
{
	struct event e = {
		.kernel_id = ctx->kernel_id,
		.launch_id = ctx->launch_id,
		.ts = bpf_ktime_get_ns(),
		.sm = bpf_get_smp_processor_id(),
		.kind = ctx->kind,
	};

	bpf_ringbuf_output(&events, &e, sizeof(e), 0);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
