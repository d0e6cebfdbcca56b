/* counters.bpf.h: counting into maps, shared by the examples (like libbpf-tools' bits.bpf.h and
 * maps.bpf.h). Thousands of GPU threads update the same keys at once, so every count is an atomic add
 * and a missing key is created with BPF_NOEXIST before adding: a racing insert loses harmlessly. */
#ifndef __EGPU_EXAMPLES_COUNTERS_H__
#define __EGPU_EXAMPLES_COUNTERS_H__

#include "egpu.bpf.h"

/* Slots of a log2 histogram: egpu prints maps named hist* with slot k as [2^k, 2^(k+1)). */
#define HIST_SLOTS 64

/* floor(log2(v)), 0 for v <= 1: five compare-and-shift steps, no loop and no branch. */
static __always_inline __u32 log2_u32(__u32 v)
{
	__u32 r, shift;

	r = (v > 0xFFFF) << 4;
	v >>= r;
	shift = (v > 0xFF) << 3;
	v >>= shift;
	r |= shift;
	shift = (v > 0xF) << 2;
	v >>= shift;
	r |= shift;
	shift = (v > 0x3) << 1;
	v >>= shift;
	r |= shift;
	return r | (v >> 1);
}

static __always_inline __u32 log2_u64(__u64 v)
{
	__u32 hi = v >> 32;

	return hi ? log2_u32(hi) + 32 : log2_u32((__u32)v);
}

/* *map[key] += by, creating the entry at 0 first (hash maps; array slots always exist). */
static __always_inline void count_add(void *map, const void *key, __u64 by)
{
	__u64 *v = bpf_map_lookup_elem(map, key);

	if (!v) {
		__u64 zero = 0;

		bpf_map_update_elem(map, key, &zero, BPF_NOEXIST);
		v = bpf_map_lookup_elem(map, key);
		if (!v)
			return; /* the map is full */
	}
	__sync_fetch_and_add(v, by);
}

/* One more value in a log2 histogram (an ARRAY of HIST_SLOTS u64 counts keyed by u32 slot). */
static __always_inline void hist_add(void *hist, __u64 value)
{
	__u32 slot = log2_u64(value);

	count_add(hist, &slot, 1);
}

#endif /* __EGPU_EXAMPLES_COUNTERS_H__ */
