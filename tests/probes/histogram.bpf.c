/* log2 histogram of threads per launch (gridDim * blockDim), as bpftrace's hist(). */
#include "egpu.bpf.h"

#define SLOTS 64

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} hist SEC(".maps");

/* floor(log2(v)), 0 for v <= 1: a loop with a constant bound the verifier can prove ends. */
static __always_inline __u32 log2_u64(__u64 v)
{
	__u32 r = 0;

	for (int i = 0; i < SLOTS - 1; i++) {
		if (v <= 1)
			break;
		v >>= 1;
		r++;
	}
	return r;
}

SEC("egpu/launch/*")
int launch_threads(struct egpu_ctx *ctx)
{
	__u64 threads = (__u64)ctx->grid[0] * ctx->grid[1] * ctx->grid[2] *
			ctx->block[0] * ctx->block[1] * ctx->block[2];
	__u32 slot = log2_u64(threads);
	__u64 *n = bpf_map_lookup_elem(&hist, &slot);

	if (n)
		__sync_fetch_and_add(n, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
