/* launch_latency: how long does a launch wait between being enqueued and starting on the GPU?
 *
 * Two probes, two clocks. egpu/launch/* runs on the host when the application enqueues the launch and
 * stores bpf_ktime_get_ns() under the launch's id; kprobe.block/* runs on the GPU, and the first block
 * of that launch to start takes the stored time and adds (its %globaltimer - enqueue time) to the
 * histogram. This measures queueing behind earlier work on the stream, driver and dispatch time.
 *
 * The difference is only meaningful because the runtime puts launch probes on the GPU's clock: it
 * converts the enqueue time to CLOCK_REALTIME, then adds %globaltimer - CLOCK_REALTIME, which a
 * one-thread kernel measures when the maps are made (egpu-run -v prints it and its uncertainty). The
 * PTX ISA only calls %globaltimer a global nanosecond timer; the driver keeps it near the Unix epoch,
 * not on it (1.19 ms ahead on an H200), where bpftime's launchlate takes the two clocks as one. What
 * is left of the misalignment shows up as negative differences: those are counted in clock_skew
 * instead of the histogram, so a non-zero count says not to trust the smallest buckets.
 * launchlate.bpf.c is bpftime's version of the same question.
 *
 *   egpu-run -p examples/launch_latency.bpf.c ./app
 */
#include "counters.bpf.h"

/* launch_id -> host time at enqueue, until the launch's first block takes it. LRU: launches whose kernel
 * was not instrumented (SASS only) never take theirs, and are evicted. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u64);
} enqueue_ns SEC(".maps");

/* log2 histogram of enqueue -> first block start, ns */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, HIST_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} hist_launch_latency_ns SEC(".maps");

__u64 clock_skew; /* .bss: launches whose first block seemed to start before the enqueue */

SEC("egpu/launch/*")
int on_enqueue(struct egpu_ctx *ctx)
{
	__u64 launch = ctx->launch_id, now = bpf_ktime_get_ns();

	bpf_map_update_elem(&enqueue_ns, &launch, &now, BPF_ANY);
	return 0;
}

SEC("kprobe.block/*")
int on_block_start(struct egpu_ctx *ctx)
{
	__u64 now = bpf_get_globaltimer();
	__u64 launch = ctx->launch_id, enqueued;
	__u64 *slot = bpf_map_lookup_elem(&enqueue_ns, &launch);

	if (!slot)
		return 0;
	/* The exchange hands the enqueue time to exactly one block: the first to get here. */
	enqueued = __sync_lock_test_and_set(slot, 0);
	if (!enqueued)
		return 0;
	bpf_map_delete_elem(&enqueue_ns, &launch);
	if (now < enqueued)
		__sync_fetch_and_add(&clock_skew, 1);
	else
		hist_add(&hist_launch_latency_ns, now - enqueued);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
