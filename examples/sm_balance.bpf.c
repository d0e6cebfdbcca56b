/* sm_balance: is the work spread evenly over the SMs and the warp slots?
 *
 * Once per warp (kprobe.warp / kretprobe.warp run in the warp's lowest active lane): count the warps
 * each SM ran, and add up how long they stayed, per SM. An SM whose busy time stands out did more of
 * the work (a tail of long blocks, or a grid too small for the GPU: an H200 has 132 SMs).
 * %warpid is the warp's slot on its SM (0..63 on sm_90), so while a warp runs, (SM, slot) names it
 * uniquely and its start time needs no hash. PTX ISA: %smid and %warpid are volatile and may change
 * if a warp is preempted and rescheduled (a debugger, or a GPU time-sliced between processes).
 * Maps named lhist* print as bars per SM / slot: no PERCPU_ARRAY is needed, the SM is the index.
 *
 *   egpu-run -p examples/sm_balance.bpf.c ./app
 */
#include "counters.bpf.h"

#define MAX_SMS 256
#define WARP_SLOTS 64

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SMS);
	__type(key, __u32);
	__type(value, __u64);
} lhist_warps_per_sm SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SMS);
	__type(key, __u32);
	__type(value, __u64);
} lhist_busy_ns_per_sm SEC(".maps");  /* sum over the SM's warps of exit - entry */

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, WARP_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} lhist_warps_per_slot SEC(".maps");

/* SM * WARP_SLOTS + slot -> entry time of the warp running there */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SMS * WARP_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} warp_start SEC(".maps");

SEC("kprobe.warp/*")
int warp_enter(struct egpu_ctx *ctx)
{
	__u32 sm = bpf_get_sm_id(), slot = bpf_get_warp_id();
	__u32 where = sm * WARP_SLOTS + slot;
	__u64 *start;

	if (sm >= MAX_SMS || slot >= WARP_SLOTS)
		return 0;
	count_add(&lhist_warps_per_sm, &sm, 1);
	count_add(&lhist_warps_per_slot, &slot, 1);
	start = bpf_map_lookup_elem(&warp_start, &where);
	if (start)
		*start = bpf_get_globaltimer();
	return 0;
}

SEC("kretprobe.warp/*")
int warp_exit(struct egpu_ctx *ctx)
{
	__u32 sm = bpf_get_sm_id(), slot = bpf_get_warp_id();
	__u32 where = sm * WARP_SLOTS + slot;
	__u64 *start;

	if (sm >= MAX_SMS || slot >= WARP_SLOTS)
		return 0;
	start = bpf_map_lookup_elem(&warp_start, &where);
	if (!start || !*start)
		return 0;
	count_add(&lhist_busy_ns_per_sm, &sm, bpf_get_globaltimer() - *start);
	*start = 0;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
