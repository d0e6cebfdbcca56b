/* sync_wait: how long does the host wait for the GPU, and on what?
 *
 * Runs on the host when cuStreamSynchronize, cuEventSynchronize or cuCtxSynchronize returns, with the
 * time the calling thread was blocked in it. (cudaMemcpy to the host blocks too: memcpy_bytes.bpf.c
 * counts that.) Keyed by stream; by call site once host uprobes can name the caller.
 *
 *   egpu-run -p examples/sync_wait.bpf.c ./app
 */
#include "counters.bpf.h"

struct waits {
	__u64 calls, blocked_ns, max_ns;
};

/* what was waited for: the stream (cuStreamSynchronize), else the event, or 0 (the whole context) ->
 * waits; printed as pointers */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, void *);
	__type(value, struct waits);
} blocked_by_handle SEC(".maps");

/* EGPU_SYNC_STREAM / _EVENT / _CONTEXT -> ns blocked */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4);
	__type(key, enum egpu_sync_kind);
	__type(value, __u64);
} blocked_ns_by_kind SEC(".maps");

/* log2 histogram of ns blocked per call */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, HIST_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} hist_blocked_ns SEC(".maps");

SEC("egpu/sync/*")
int on_sync(struct egpu_host_ctx *ctx)
{
	enum egpu_sync_kind kind = ctx->kind;
	void *handle = (void *)(ctx->kind == EGPU_SYNC_STREAM ? ctx->stream : ctx->handle);
	__u64 ns = ctx->blocked_ns;
	struct waits *w = bpf_map_lookup_elem(&blocked_by_handle, &handle);

	if (!w) {
		struct waits zero = {};

		bpf_map_update_elem(&blocked_by_handle, &handle, &zero, BPF_NOEXIST);
		w = bpf_map_lookup_elem(&blocked_by_handle, &handle);
		if (!w)
			return 0;
	}
	w->calls++;
	w->blocked_ns += ns;
	if (w->max_ns < ns)
		w->max_ns = ns;
	count_add(&blocked_ns_by_kind, &kind, ns);
	hist_add(&hist_blocked_ns, ns);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
