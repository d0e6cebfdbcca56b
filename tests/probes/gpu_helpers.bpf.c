/* Every GPU helper: where each warp leader runs (block, thread, SM, warp, lane, time), sent as a perf
 * event, and warp leaders counted per SM in a PERCPU_ARRAY. */
#include "egpu.bpf.h"

struct where {
	__u64 block[3];
	__u64 thread[3];
	__u64 block_dim[3];
	__u64 grid_dim[3];
	__u64 ts;
	__u64 sm;
	__u64 warp;
	__u64 lane;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} per_sm SEC(".maps");

SEC("kprobe.warp/*")
int where_am_i(struct egpu_ctx *ctx)
{
	struct where w = {};
	__u32 zero = 0;
	__u64 *n;

	bpf_get_block_idx(&w.block[0], &w.block[1], &w.block[2]);
	bpf_get_thread_idx(&w.thread[0], &w.thread[1], &w.thread[2]);
	bpf_get_block_dim(&w.block_dim[0], &w.block_dim[1], &w.block_dim[2]);
	bpf_get_grid_dim(&w.grid_dim[0], &w.grid_dim[1], &w.grid_dim[2]);
	w.ts = bpf_get_globaltimer();
	w.sm = bpf_get_sm_id();
	w.warp = bpf_get_warp_id();
	w.lane = bpf_get_lane_id();
	if (w.lane != 0)
		bpf_exit();  /* a .warp probe runs in the lowest active lane: not always lane 0 */
	bpf_perf_event_output(ctx, &events, BPF_F_CURRENT_CPU, &w, sizeof(w));
	bpf_membar();
	n = bpf_map_lookup_elem(&per_sm, &zero);
	if (n)
		*n += 1;  /* one slot per SM: no atomics needed within a warp leader's SM slot */
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
