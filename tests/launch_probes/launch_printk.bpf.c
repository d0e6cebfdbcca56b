/* A launch probe that prints: bpf_trace_printk is not in the C engine, so this object stays on the
 * Python VM (runtime/native.py's refusal). */
#include "egpu.bpf.h"

SEC("egpu/launch/*")
int say_launch(struct egpu_ctx *ctx)
{
	bpf_printk("launch %llu", ctx->launch_id);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
