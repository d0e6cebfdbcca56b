/* One ring-buffer record per kernel launch, at its enqueue time: the instants of egpu-run --perfetto. */
#include "egpu.bpf.h"

struct launch_event {
	__u64 ts;        /* %globaltimer ns: --perfetto places the record there */
	__u64 kernel_id;
	__u64 launch_id;
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} launch_events SEC(".maps");

/* Not inlined: a function taking struct launch_event * is what makes clang describe the struct in BTF. */
static __noinline void fill(struct launch_event *e, const struct egpu_ctx *ctx)
{
	e->ts = bpf_ktime_get_ns();
	e->kernel_id = ctx->kernel_id;
	e->launch_id = ctx->launch_id;
}

SEC("egpu/launch/*")
int on_launch(struct egpu_ctx *ctx)
{
	struct launch_event *e = bpf_ringbuf_reserve(&launch_events, sizeof(*e), 0);

	if (!e)
		return 0;
	fill(e, ctx);
	bpf_ringbuf_submit(e, 0);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
