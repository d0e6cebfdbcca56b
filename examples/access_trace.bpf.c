/* access_trace: which thread touched which address, when? A record per global memory access.
 *
 * Meant for the timeline: `--perfetto` turns each record into an event on the track of its SM, with
 * the kernel's name, the address and the thread. Every access of every thread is a record, so keep the
 * program small or narrow the section to one kernel (egpu/mem/stencil*). When the host drains the
 * buffer more slowly than the GPU fills it, records are dropped, never waited for: the runtime counts
 * the drops and prints them with the records.
 *
 *   egpu-run -p examples/access_trace.bpf.c --perfetto trace.json ./app
 */
#include "egpu.bpf.h"

struct mem_event {
	__u64 ts;           /* %globaltimer, ns */
	void *addr;         /* generic address (a pointer, so it prints in hex) */
	__u64 kernel_id;    /* printed as the kernel's name */
	__u64 launch_id;
	__u32 site;         /* which load/store instruction of the kernel */
	__u32 size;         /* bytes */
	__u32 flags;        /* EGPU_F_LOAD | EGPU_F_STORE | EGPU_F_ATOMIC */
	__u32 sm;
	__u32 block[3];
	__u32 thread[3];
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 24); /* 16 MiB: about 200,000 records of 72 bytes in flight */
} events SEC(".maps");

/* Not inlined, on purpose: a function taking struct mem_event * is what makes clang describe the struct
 * in the object's BTF, which is how egpu prints the records with their field names. */
static __noinline void fill(struct mem_event *e, const struct egpu_ctx *ctx)
{
	__u64 x, y, z;

	e->ts = bpf_get_globaltimer();
	e->addr = (void *)ctx->addr;
	e->kernel_id = ctx->kernel_id;
	e->launch_id = ctx->launch_id;
	e->site = ctx->site;
	e->size = ctx->size;
	e->flags = ctx->flags;
	e->sm = bpf_get_sm_id();
	bpf_get_block_idx(&x, &y, &z);
	e->block[0] = x;
	e->block[1] = y;
	e->block[2] = z;
	bpf_get_thread_idx(&x, &y, &z);
	e->thread[0] = x;
	e->thread[1] = y;
	e->thread[2] = z;
}

SEC("egpu/mem/*")
int trace_access(struct egpu_ctx *ctx)
{
	struct mem_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);

	if (!e)
		return 0; /* buffer full: counted as a drop */
	fill(e, ctx);
	bpf_ringbuf_submit(e, 0);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
