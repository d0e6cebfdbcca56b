/* bpf_loop in a launch program, so that the C engine and the VM (tests/test_launchvm.py) must agree on each
 * result summed into `results`: a callback stopping itself early on a struct on the stack, one whose rounds are
 * read from a map and which updates a map value through its context, and the refusals (flags: -EINVAL, past
 * 1 << 23 rounds: -E2BIG), none of which calls the callback. */
#include "egpu.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 8);
	__type(key, __u32);
	__type(value, __s64);
} results SEC(".maps");   /* 0: sums, 1: rounds made, 2: runs, 3: squares, 4: -EINVAL, 5: -E2BIG,
				 * 6: rounds from the map */

struct sum {
	__u64 total;
	__u64 stop_at;
};

static long add_index(__u64 index, void *data)
{
	struct sum *s = data;

	s->total += index * (index + 1);   /* weighted: which rounds ran matters */
	return index + 1 >= s->stop_at;    /* 1 stops the loop */
}

static long add_square(__u64 index, void *data)
{
	*(__s64 *)data += index * index;
	return 0;
}

static __s64 *slot(__u32 key)
{
	return bpf_map_lookup_elem(&results, &key);
}

SEC("egpu/launch/*")
int loop(struct egpu_ctx *ctx)
{
	struct sum s = {.total = 0, .stop_at = ctx->launch_id % 13};   /* 0 stops after the first round */
	__s64 *sums = slot(0), *made = slot(1), *runs = slot(2), *squares = slot(3), *einval = slot(4),
	      *e2big = slot(5), *from_map = slot(6);

	if (!sums || !made || !runs || !squares || !einval || !e2big || !from_map)
		return 0;
	*made += bpf_loop(10, add_index, &s, 0);
	*sums += s.total;
	/* as many rounds as the map says, modulo 16: the launches so far */
	*from_map += bpf_loop(*runs & 15, add_square, squares, 0);
	*runs += 1;
	*einval += bpf_loop(3, add_index, &s, ctx->launch_id % 2 + 1);
	*e2big += bpf_loop((1 << 23) + 1 + ctx->launch_id % 3, add_index, &s, 0);
	*sums += s.total;   /* unchanged by the refused calls */
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
