/* hot_pages: which memory pages do kernels hit the most?
 *
 * Counts global memory accesses per 64 KiB page: the granularity at which CUDA unified memory
 * migrates and prefetches (its "big page"), so the hottest pages here are the ones worth pinning,
 * prefetching or placing in faster memory. (cudaMalloc memory is mapped with 2 MiB pages; shift by 21
 * to see those.) The key is the page's base address, printed in hex.
 * LRU_HASH: when more pages are touched than the map holds, the least recently used is evicted, so the
 * map never fills and the hot pages stay. Every thread's access counts; egpu/mem.warp/* would cost
 * less but count one lane per warp.
 *
 *   egpu-run -p examples/hot_pages.bpf.c ./app
 */
#include "counters.bpf.h"

#define PAGE_SHIFT 16 /* 64 KiB */

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, void *);  /* page base address */
	__type(value, __u64); /* accesses */
} page_accesses SEC(".maps");

SEC("egpu/mem/*")
int count_page(struct egpu_ctx *ctx)
{
	void *page = (void *)(ctx->addr >> PAGE_SHIFT << PAGE_SHIFT);

	count_add(&page_accesses, &page, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
