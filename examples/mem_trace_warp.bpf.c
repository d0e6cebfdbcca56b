/* mem_trace_warp: every global memory access, at a record per warp instruction instead of one per lane.
 *
 * access_trace.bpf.c writes 72 bytes per lane: 2,560 bytes of ring for a warp's a[threadIdx.x]. Here the
 * lanes that make an access together write one struct egpu_warp_mem (egpu.bpf.h) by their lowest lane:
 * 72 bytes when their addresses are affine in the lane number, plus 4 (or 8) bytes per lane when not.
 * The reader expands each record into the lanes' struct mem_event records, the very trace
 * access_trace.bpf.c writes (egpu_preload/output/warp_records.py: expand), each lane with the leader's ts.
 * A ring with no room drops the record and counts it.
 *
 *   egpu-run --trace trace.arrow -p examples/mem_trace_warp.bpf.c ./app
 *   egpu trace trace.arrow        (a row per lane; printed at exit without --trace, the records are hex)
 */
#include "egpu.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 24); /* 16 MiB: 230,000 affine warp instructions in flight */
} warp_events SEC(".maps");

SEC("egpu/mem/*")
int trace_warp_access(struct egpu_ctx *ctx)
{
	egpu_warp_mem_record(&warp_events, ctx);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
