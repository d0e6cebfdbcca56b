/* alloc_hist: what sizes does the program allocate, of which kind, and how many bytes are live at most?
 *
 * Runs on the host after every allocation and free of the driver API: device (cuMemAlloc, pitched),
 * managed, stream-ordered pool (cuMemAllocAsync, cuMemAllocFromPoolAsync), pinned host (cuMemAllocHost,
 * cuMemHostAlloc, cuMemHostRegister) and VMM (cuMemCreate, cuMemMap). A free's context carries the size
 * the shim recorded when that address was allocated (0 if it never saw it).
 *
 * PyTorch's caching allocator calls the driver rarely: it takes large segments once (cudaMalloc) and
 * then serves tensors from them, so this shows the segments it reserved, not every tensor it made
 * (torch.cuda.memory_stats() has those). PYTORCH_NO_CUDA_MEMORY_CACHING=1 makes every tensor a driver
 * allocation, at a cost.
 *
 *   egpu-run -p examples/alloc_hist.bpf.c ./app
 */
#include "counters.bpf.h"

struct totals {
	__u64 allocs, bytes, frees, freed_bytes;
};

/* kind (EGPU_ALLOC_DEVICE, ...) -> totals */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16);
	__type(key, enum egpu_alloc_kind);
	__type(value, struct totals);
} by_kind SEC(".maps");

/* log2 histogram of bytes per allocation */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, HIST_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} hist_alloc_bytes SEC(".maps");

/* second since the first allocation -> the most bytes live during it (the last slot takes the rest) */
#define SECONDS 64
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SECONDS);
	__type(key, __u32);
	__type(value, __u64);
} peak_live_by_second SEC(".maps");

__u64 live_bytes, peak_live_bytes, first_ns; /* .bss; VMM handles not counted as live: their mappings are */

static __always_inline struct totals *totals_of(enum egpu_alloc_kind kind)
{
	struct totals *t = bpf_map_lookup_elem(&by_kind, &kind);

	if (!t) {
		struct totals zero = {};

		bpf_map_update_elem(&by_kind, &kind, &zero, BPF_NOEXIST);
		t = bpf_map_lookup_elem(&by_kind, &kind);
	}
	return t;
}

static __always_inline void note_live(void)
{
	__u64 now = bpf_ktime_get_ns(), *slot;
	__u32 second;

	if (!first_ns)
		first_ns = now;
	second = (now - first_ns) / 1000000000ull;
	if (second >= SECONDS)
		second = SECONDS - 1;
	slot = bpf_map_lookup_elem(&peak_live_by_second, &second);
	if (slot && *slot < live_bytes)
		*slot = live_bytes;
	if (peak_live_bytes < live_bytes)
		peak_live_bytes = live_bytes;
}

SEC("egpu/alloc/*")
int on_alloc(struct egpu_host_ctx *ctx)
{
	struct totals *t;

	if (ctx->result)
		return 0;
	t = totals_of(ctx->kind);
	if (!t)
		return 0;
	t->allocs++;
	t->bytes += ctx->bytes;
	hist_add(&hist_alloc_bytes, ctx->bytes);
	if (ctx->kind != EGPU_ALLOC_VMM_HANDLE)
		live_bytes += ctx->bytes;
	note_live();
	return 0;
}

SEC("egpu/free/*")
int on_free(struct egpu_host_ctx *ctx)
{
	struct totals *t;

	if (ctx->result || !ctx->kind)
		return 0; /* refused, or an address the shim never saw allocated */
	t = totals_of(ctx->kind);
	if (!t)
		return 0;
	t->frees++;
	t->freed_bytes += ctx->bytes;
	if (ctx->kind != EGPU_ALLOC_VMM_HANDLE)
		live_bytes -= ctx->bytes < live_bytes ? ctx->bytes : live_bytes;
	note_live();
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
