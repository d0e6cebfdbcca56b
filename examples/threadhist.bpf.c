/* threadhist: bpftime's example/gpu/threadhist, written for egpu. Do all threads of vectorAdd do
 * the same share of the work?
 *
 * Every thread counts its exits from the kernel in a slot of its own; with a grid-stride loop or an
 * early return, a thread that ran fewer times stands out. bpftime keeps one counter per GPU thread in
 * its per-thread array map; egpu indexes a plain array by the global thread index
 * (blockIdx.x * blockDim.x + threadIdx.x), and its name, lhist_*, prints it as one bar per thread.
 * Threads beyond MAX_THREADS are not counted. As in bpftime, the mangled name is matched; a glob
 * (kretprobe/vectorAdd*) would match every overload.
 *
 *   egpu-run -p examples/threadhist.bpf.c ./vec_add
 */
#include "egpu.bpf.h"

#define MAX_THREADS 1024

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_THREADS);
	__type(key, __u32);
	__type(value, __u64);
} lhist_calls_per_thread SEC(".maps");

SEC("kretprobe/_Z9vectorAddPKfS0_Pf")
int retprobe__cuda(struct egpu_ctx *ctx)
{
	__u64 bx, by, bz, dx, dy, dz, tx, ty, tz;
	__u32 thread;
	__u64 *cnt;

	bpf_get_block_idx(&bx, &by, &bz);
	bpf_get_block_dim(&dx, &dy, &dz);
	bpf_get_thread_idx(&tx, &ty, &tz);
	thread = bx * dx + tx;
	cnt = bpf_map_lookup_elem(&lhist_calls_per_thread, &thread);
	if (cnt)
		__sync_fetch_and_add(cnt, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
