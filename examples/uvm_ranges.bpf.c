/* uvm_ranges: which address ranges does unified memory migrate, and how often does it fault?
 *
 * Runs on the host once per unified-memory event CUPTI records (egpu/uvm/*, struct egpu_uvm_ctx):
 * bytes migrated host-to-device and device-to-host per 2 MiB range (the key is the range's base
 * address), and events per kind (EGPU_UVM_*: 1 htod, 2 dtoh, 3 CPU faults, 4 GPU faults). A kernel
 * touching managed memory the CPU wrote last faults, and the driver migrates the pages it needs: the
 * ranges that come back again and again are the ones worth prefetching or keeping resident.
 * examples/uvm_lru.py replays the same migrations (from egpu-run --perfetto) through LRU and LFU caches.
 *
 *   egpu-run -p examples/uvm_ranges.bpf.c ./app
 */
#include "counters.bpf.h"

#define RANGE_SHIFT 21 /* 2 MiB */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, void *);  /* range base address */
	__type(value, __u64); /* bytes migrated to the GPU */
} htod_bytes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, void *);  /* range base address */
	__type(value, __u64); /* bytes migrated to the host */
} dtoh_bytes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 9);
	__type(key, __u32);   /* EGPU_UVM_* */
	__type(value, __u64); /* events */
} events SEC(".maps");

SEC("egpu/uvm/*")
int count_uvm(struct egpu_uvm_ctx *ctx)
{
	__u32 kind = ctx->kind;
	void *range = (void *)(ctx->addr >> RANGE_SHIFT << RANGE_SHIFT);

	count_add(&events, &kind, 1);
	if (kind == EGPU_UVM_HTOD)
		count_add(&htod_bytes, &range, ctx->bytes);
	else if (kind == EGPU_UVM_DTOH)
		count_add(&dtoh_bytes, &range, ctx->bytes);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
