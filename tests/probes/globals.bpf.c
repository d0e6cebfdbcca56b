/* Global data as libbpf has it: .bss counters, a .data weight, .rodata settings (const volatile) and a
 * string literal (.rodata.str1.1). */
#include "egpu.bpf.h"

__u64 hits;                          /* .bss */
__u64 weighted_bytes;                /* .bss */
__u64 weight = 3;                    /* .data */
const volatile __u32 min_size = 4;   /* .rodata: set before loading */
const char tag[8] = "egpu";          /* .rodata */

SEC("egpu/mem/*")
int weigh_accesses(struct egpu_ctx *ctx)
{
	if (ctx->size < min_size)
		return 0;
	__sync_fetch_and_add(&hits, 1);
	__sync_fetch_and_add(&weighted_bytes, ctx->size * weight);
	if (ctx->size > 8)
		bpf_trace_printk("wide %u\n", sizeof("wide %u\n"), ctx->size);
	return tag[ctx->site & 7];
}

char LICENSE[] SEC("license") = "GPL";
