/* Per-kernel launch statistics, keyed by kernel id: launches, threads, last stream. */
#include "egpu.bpf.h"

struct launch_stats {
	__u64 launches;
	__u64 threads;
	__u64 last_stream;
	__u32 last_grid[3];
	__u32 last_block[3];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 512);
	__type(key, __u64);
	__type(value, struct launch_stats);
} launches SEC(".maps");

SEC("egpu/launch/*")
int on_launch(struct egpu_ctx *ctx)
{
	__u64 id = ctx->kernel_id;
	__u64 threads = (__u64)ctx->grid[0] * ctx->grid[1] * ctx->grid[2] *
			ctx->block[0] * ctx->block[1] * ctx->block[2];
	struct launch_stats *s = bpf_map_lookup_elem(&launches, &id);

	if (!s) {
		struct launch_stats zero = {};

		bpf_map_update_elem(&launches, &id, &zero, BPF_NOEXIST);
		s = bpf_map_lookup_elem(&launches, &id);
		if (!s)
			return 0;
	}
	__sync_fetch_and_add(&s->launches, 1);
	__sync_fetch_and_add(&s->threads, threads);
	s->last_stream = ctx->stream;
	for (int i = 0; i < 3; i++) {
		s->last_grid[i] = ctx->grid[i];
		s->last_block[i] = ctx->block[i];
	}
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
