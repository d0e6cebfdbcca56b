/* kernel_duration: how long do kernels run on the GPU?
 *
 * A kernel's duration here is from block 0's entry to the exit of the last block to finish, both read
 * from %globaltimer. Approximation: block 0 is dispatched in the first wave, so the start is late by at
 * most the first wave's dispatch spread (typically microseconds), and the time between the launch
 * reaching the GPU and block 0 starting is not counted (launch_latency.bpf.c measures that).
 * The histogram covers every kernel the section matches: narrow it (kprobe.block/gemm*) or pass
 * --kernel GLOB for one kernel's histogram; duration_by_kernel gives each kernel's count and total.
 *
 *   egpu-run -p examples/kernel_duration.bpf.c ./app
 */
#include "counters.bpf.h"

struct launch_state {
	__u64 start_ns;     /* block 0's entry; 0 until it has run */
	__u64 blocks_done;  /* blocks that have exited */
};

/* launch_id -> state, while the launch runs (deleted by its last block). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u64);
	__type(value, struct launch_state);
} running SEC(".maps");

/* log2 histogram of kernel durations in ns. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, HIST_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} hist_duration_ns SEC(".maps");

struct kernel_time {
	__u64 launches;
	__u64 total_ns;     /* mean = total_ns / launches */
};

/* kernel -> launches timed and their total duration. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct kernel_time);
} duration_by_kernel SEC(".maps");

/* The launch's state, created empty by whichever block gets here first. */
static __always_inline struct launch_state *launch_state(__u64 launch)
{
	struct launch_state *st = bpf_map_lookup_elem(&running, &launch);

	if (!st) {
		struct launch_state empty = {};

		bpf_map_update_elem(&running, &launch, &empty, BPF_NOEXIST);
		st = bpf_map_lookup_elem(&running, &launch);
	}
	return st;
}

SEC("kprobe.block/*")
int block_enter(struct egpu_ctx *ctx)
{
	__u64 x, y, z;
	struct launch_state *st;

	bpf_get_block_idx(&x, &y, &z);
	if (x | y | z)
		return 0;
	st = launch_state(ctx->launch_id);
	if (st)
		st->start_ns = bpf_get_globaltimer();
	return 0;
}

SEC("kretprobe.block/*")
int block_exit(struct egpu_ctx *ctx)
{
	__u64 now = bpf_get_globaltimer();
	__u64 launch = ctx->launch_id, kernel = ctx->kernel_id;
	__u64 gx, gy, gz, delta;
	struct launch_state *st;
	struct kernel_time *kt;

	bpf_get_grid_dim(&gx, &gy, &gz);
	st = launch_state(launch);
	if (!st)
		return 0;
	/* Only the last block to exit goes on: the fetch-add hands out each count once. */
	if (__sync_fetch_and_add(&st->blocks_done, 1) + 1 != gx * gy * gz)
		return 0;
	delta = st->start_ns ? now - st->start_ns : 0;
	bpf_map_delete_elem(&running, &launch);
	if (!delta)
		return 0; /* block 0's entry was not seen (the probe was attached mid-launch) */
	hist_add(&hist_duration_ns, delta);
	kt = bpf_map_lookup_elem(&duration_by_kernel, &kernel);
	if (!kt) {
		struct kernel_time zero = {};

		bpf_map_update_elem(&duration_by_kernel, &kernel, &zero, BPF_NOEXIST);
		kt = bpf_map_lookup_elem(&duration_by_kernel, &kernel);
		if (!kt)
			return 0;
	}
	__sync_fetch_and_add(&kt->launches, 1);
	__sync_fetch_and_add(&kt->total_ns, delta);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
