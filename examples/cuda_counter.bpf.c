/* cuda_counter: bpftime's example/gpu/cuda-counter, written for egpu. How many threads enter
 * vectorAdd, and how long do they spend in it?
 *
 * Same sections, helpers and maps as bpftime's, so its probes carry over: the exact mangled name
 * vectorAdd(const float*, const float*, float*) in SEC(), bpftime's helper ids (502 globaltimer, 503
 * block index, 505 thread index, from egpu.bpf.h). Like bpftime's, both probes run in every thread: on
 * entry a thread stores the time under its block's x index and counts one call; on exit it adds
 * (now - that time) to the total. egpu has no pid, so the counters are keyed by the kernel instead,
 * and updated with atomics (thousands of threads add at once). bpftime prints a line per thread; this
 * version prints once per block (thread 0) to keep the trace readable.
 *
 *   egpu-run -p examples/cuda_counter.bpf.c ./vec_add
 */
#include "counters.bpf.h"

/* block x -> when its latest thread entered */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u64);
	__type(value, __u64);
} start_ts SEC(".maps");

/* kernel -> summed (exit - block entry) over threads, ns */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u64);
	__type(value, __u64);
} total_time_ns SEC(".maps");

/* kernel -> thread entries */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u64);
	__type(value, __u64);
} call_count SEC(".maps");

SEC("kprobe/_Z9vectorAddPKfS0_Pf")
int cuda__probe(struct egpu_ctx *ctx)
{
	__u64 ts = bpf_get_globaltimer(), kernel = ctx->kernel_id;
	__u64 x, y, z, tx, ty, tz;

	bpf_get_block_idx(&x, &y, &z);
	bpf_get_thread_idx(&tx, &ty, &tz);
	bpf_map_update_elem(&start_ts, &x, &ts, BPF_ANY);
	count_add(&call_count, &kernel, 1);
	if (tx == 0)
		bpf_printk("Entered _Z9vectorAddPKfS0_Pf x=%lu, ts=%lu\n", x, ts);
	return 0;
}

SEC("kretprobe/_Z9vectorAddPKfS0_Pf")
int cuda__retprobe(struct egpu_ctx *ctx)
{
	__u64 x, y, z, tx, ty, tz, delta, kernel = ctx->kernel_id;
	__u64 *tsp;

	bpf_get_block_idx(&x, &y, &z);
	bpf_get_thread_idx(&tx, &ty, &tz);
	tsp = bpf_map_lookup_elem(&start_ts, &x);
	if (!tsp) {
		if (tx == 0)
			bpf_printk("Exited (without tsp) _Z9vectorAddPKfS0_Pf x=%lu\n", x);
		return 0;
	}
	delta = bpf_get_globaltimer() - *tsp;
	count_add(&total_time_ns, &kernel, delta);
	if (tx == 0)
		bpf_printk("Exited _Z9vectorAddPKfS0_Pf x=%lu duration=%lu ns\n", x, delta);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
