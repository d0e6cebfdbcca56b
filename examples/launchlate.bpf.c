/* launchlate: bpftime's example/gpu/launchlate, written for egpu. How long after the CPU launches
 * vectorAdd does it start running on the GPU?
 *
 * bpftime pairs a uprobe on cudaLaunchKernel (host time, shifted by a realtime-monotonic offset it
 * measures) with a GPU kprobe in thread 0 of block 0, matching launches to kernel starts in FIFO order,
 * and counts the latencies in decade bins. egpu's launch probe runs when the launch is enqueued and
 * shares the launch id with the GPU probes, so no FIFO is needed: the host time is stored under the
 * launch id and block 0's thread 0 looks it up. The runtime aligns the launch probe's clock with
 * %globaltimer (see launch_latency.bpf.c, egpu's log2 version of this question, for what that means).
 *
 *   egpu-run -p examples/launchlate.bpf.c ./vec_add
 */
#include "egpu.bpf.h"

/* bpftime's bins; the key prints as these names. */
enum latency_bin {
	under_100ns,
	under_1us,
	under_10us,
	under_100us,
	under_1ms,
	under_10ms,
	under_100ms,
	under_1s,
	under_10s,
	over_10s,
	HIST_BINS,
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, HIST_BINS);
	__type(key, enum latency_bin);
	__type(value, __u64);
} time_histogram SEC(".maps");

/* launch_id -> host time at enqueue (LRU: launches never started on the GPU are evicted) */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024);
	__type(key, __u64);
	__type(value, __u64);
} launch_times SEC(".maps");

static __always_inline enum latency_bin bin_of(__u64 ns)
{
	__u64 limit = 100;

	for (int bin = under_100ns; bin < over_10s; bin++, limit *= 10)
		if (ns < limit)
			return bin;
	return over_10s;
}

SEC("egpu/launch/vectorAdd*")
int uprobe_cuda_launch(struct egpu_ctx *ctx)
{
	__u64 launch = ctx->launch_id, ts = bpf_ktime_get_ns();

	bpf_map_update_elem(&launch_times, &launch, &ts, BPF_ANY);
	return 0;
}

SEC("kprobe/vectorAdd*")
int cuda__probe(struct egpu_ctx *ctx)
{
	__u64 bx, by, bz, tx, ty, tz, launch = ctx->launch_id;
	__u64 now = bpf_get_globaltimer(), *launched;
	enum latency_bin bin;
	__u64 *count;

	bpf_get_block_idx(&bx, &by, &bz);
	bpf_get_thread_idx(&tx, &ty, &tz);
	if (bx | by | bz | tx | ty | tz)
		return 0;
	launched = bpf_map_lookup_elem(&launch_times, &launch);
	if (!launched)
		return 0;
	/* a start before the enqueue means the clocks disagree: it lands in the first bin */
	bin = bin_of(now > *launched ? now - *launched : 0);
	bpf_map_delete_elem(&launch_times, &launch);
	count = bpf_map_lookup_elem(&time_histogram, &bin);
	if (count)
		__sync_fetch_and_add(count, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
