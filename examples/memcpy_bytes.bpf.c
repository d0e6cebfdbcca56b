/* memcpy_bytes: how many bytes move between host and device, in which direction, on which stream, and
 * how fast?
 *
 * Runs on the host after every copy the driver API offers (cuMemcpy*, 1D/2D/3D, peer, sync and async,
 * the per-thread twins), in the application's thread, in C. A synchronous copy returns when its bytes
 * have arrived, so the time the caller spent in it (blocked_ns) gives its bandwidth; an async copy
 * returns once queued, so only its bytes are counted here (its device time is CUPTI's: egpu-run
 * --durations). Copies captured into a CUDA graph, or added to one as nodes, are seen once, when made:
 * a replay repeats them without calling the driver (the flag EGPU_HOST_F_GRAPH marks them).
 *
 *   egpu-run -p examples/memcpy_bytes.bpf.c ./app
 */
#include "counters.bpf.h"

struct direction {
	__u64 copies, bytes;
	__u64 sync_bytes, sync_ns;  /* synchronous copies only: their bytes and the time they blocked */
	__u64 sync_mb_per_s;        /* sync_bytes / sync_ns, in MB/s (10^6 bytes) */
};

/* direction (EGPU_COPY_H2D, ...) -> totals */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8);
	__type(key, enum egpu_copy_kind);
	__type(value, struct direction);
} by_direction SEC(".maps");

/* stream (a CUstream, printed as a pointer; 0 the legacy default stream, 2 the per-thread one) -> bytes */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, void *);
	__type(value, __u64);
} bytes_by_stream SEC(".maps");

/* log2 histogram of bytes per copy */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, HIST_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} hist_copy_bytes SEC(".maps");

__u64 captured_copies; /* .bss: copies made into a CUDA graph (captured, or nodes added) */

SEC("egpu/memcpy/*")
int on_copy(struct egpu_host_ctx *ctx)
{
	enum egpu_copy_kind kind = ctx->kind;
	void *stream = (void *)ctx->stream;
	__u64 bytes = ctx->bytes;
	struct direction *d;

	if (ctx->result)
		return 0; /* the driver refused it: nothing moved */
	d = bpf_map_lookup_elem(&by_direction, &kind);
	if (!d) {
		struct direction zero = {};

		bpf_map_update_elem(&by_direction, &kind, &zero, BPF_NOEXIST);
		d = bpf_map_lookup_elem(&by_direction, &kind);
		if (!d)
			return 0;
	}
	d->copies++;
	d->bytes += bytes;
	if (!(ctx->flags & EGPU_HOST_F_ASYNC)) {
		d->sync_bytes += bytes;
		d->sync_ns += ctx->blocked_ns;
		if (d->sync_ns)
			d->sync_mb_per_s = d->sync_bytes * 1000 / d->sync_ns;
	}
	count_add(&bytes_by_stream, &stream, bytes);
	hist_add(&hist_copy_bytes, bytes);
	if (ctx->flags & EGPU_HOST_F_GRAPH)
		__sync_fetch_and_add(&captured_copies, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
