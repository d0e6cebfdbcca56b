/* Per-CPU hashes on the host (the C engine against the Python VM, over the same launches): a count per
 * kernel in a PERCPU_HASH that fills up, keys deleted, an LRU_PERCPU_HASH too small for its keys (it
 * evicts), and Linux's other clocks against bpf_ktime_get_ns. The host is CPU 0: every value is CPU 0's. */
#include "egpu.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 3);
	__type(key, __u64);
	__type(value, __u64);
} per_kernel SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_PERCPU_HASH);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} recent SEC(".maps");

/* launches whose boot ns was not before their ktime ns, and whose coarse ns was within a tick of it; updates
 * and deletes that gave 0, -E2BIG (7) and -EEXIST (17) */
__u64 boot_not_before, coarse_within_tick, ok, full, exists;

static void tally(long rc)
{
	__sync_fetch_and_add(rc == 0 ? &ok : rc == -7 ? &full : &exists, rc == 0 || rc == -7 || rc == -17);
}

SEC("egpu/launch/*")
int on_launch(struct egpu_ctx *ctx)
{
	__u64 id = ctx->launch_id, kernel = ctx->kernel_id, one = 1, *n, t = bpf_ktime_get_ns();
	__u32 key = id % 2 ? (__u32)(id % 7) : 0;   /* 0 is hot (its NOEXIST updates meet it), the rest evict */

	n = bpf_map_lookup_elem(&per_kernel, &kernel);
	if (n)
		*n += 1;
	else
		tally(bpf_map_update_elem(&per_kernel, &kernel, &one, BPF_NOEXIST));
	if (id % 5 == 0)
		tally(bpf_map_delete_elem(&per_kernel, &kernel));
	tally(bpf_map_update_elem(&recent, &key, &id, id % 2 ? BPF_ANY : BPF_NOEXIST));
	n = bpf_map_lookup_elem(&recent, &key);
	if (n)
		*n += ctx->grid[0];
	boot_not_before += bpf_ktime_get_boot_ns() >= t;
	coarse_within_tick += bpf_ktime_get_coarse_ns() + 10000000 >= t;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
