/* mem_bytes: how many bytes does each kernel load and store, and at what bandwidth?
 *
 * Every thread's global memory access adds its size (thread scope, so the bytes are exact; a .warp
 * probe would see one lane's access per warp). An atomic counts as both a load and a store, as it
 * moves data both ways. The first and last access times give the window, and the achieved bandwidth
 * is computed on the host as in the eGPU paper:
 *
 *     BW = (loaded + stored) / (last_ns - first_ns)        bytes per ns = GB/s
 *
 * The window spans every launch of the kernel, including the gaps between launches: for one launch's
 * bandwidth, run a program that launches it once, or narrow the section to the kernel you study.
 * The bytes are what the kernel asks for, not DRAM traffic: cache hits count too.
 *
 *   egpu-run -p examples/mem_bytes.bpf.c ./app
 */
#include "egpu.bpf.h"

struct traffic {
	__u64 loaded;    /* bytes */
	__u64 stored;    /* bytes */
	__u64 first_ns;  /* %globaltimer at the first access */
	__u64 last_ns;   /* ... and at the latest one seen (the largest written wins, give or take a race) */
};

/* kernel -> its traffic */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct traffic);
} traffic SEC(".maps");

SEC("egpu/mem/*")
int count_bytes(struct egpu_ctx *ctx)
{
	__u64 kernel = ctx->kernel_id, now = bpf_get_globaltimer();
	struct traffic *t = bpf_map_lookup_elem(&traffic, &kernel);

	if (!t) {
		struct traffic zero = {};

		bpf_map_update_elem(&traffic, &kernel, &zero, BPF_NOEXIST);
		t = bpf_map_lookup_elem(&traffic, &kernel);
		if (!t)
			return 0;
	}
	if (ctx->flags & EGPU_F_LOAD)
		__sync_fetch_and_add(&t->loaded, ctx->size);
	if (ctx->flags & EGPU_F_STORE)
		__sync_fetch_and_add(&t->stored, ctx->size);
	/* The first thread to get here sets first_ns; the others find it taken. */
	if (!t->first_ns)
		__sync_val_compare_and_swap(&t->first_ns, 0, now);
	if (now > t->last_ns)
		t->last_ns = now;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
