/* mem_trace: bpftime's example/gpu/mem_trace, written for egpu. How many global memory accesses do
 * the kernels make?
 *
 * bpftime attaches to its memory-capture hook (SEC("kprobe/__memcapture")) and bumps counter[0] once
 * per access. egpu's memory sites are a section of their own, egpu/mem/GLOB, with the access in the
 * context, so this version also splits the count: counter[all] every access, then [loads],
 * [stores] and [atomics] (an atomic is also counted as a load and a store, as it is both). The counts are per
 * thread, like bpftime's, and exact: each add is atomic (bpftime's `*val = *val + 1` loses updates
 * when threads collide).
 *
 *   egpu-run -p examples/mem_trace.bpf.c ./vec_add
 */
#include "egpu.bpf.h"

/* The key prints as these names. */
enum access_kind { all, loads, stores, atomics };

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, enum access_kind);
	__type(value, __u64);
} counter SEC(".maps");

static __always_inline void bump(enum access_kind which)
{
	__u64 *val = bpf_map_lookup_elem(&counter, &which);

	if (val)
		__sync_fetch_and_add(val, 1);
}

SEC("egpu/mem/*")
int cuda__trace_cuda_kernel(struct egpu_ctx *ctx)
{
	bump(all);
	if (ctx->flags & EGPU_F_LOAD)
		bump(loads);
	if (ctx->flags & EGPU_F_STORE)
		bump(stores);
	if (ctx->flags & EGPU_F_ATOMIC)
		bump(atomics);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
