/* bpf_loop (Linux 5.17+), the loop libbpf-era probes write: a callback summing its indices into a struct on the
 * stack until it stops itself, one adding into a map value, a count read from a map, and the helper's refusals. */
#include "egpu.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 6);
	__type(key, __u32);
	__type(value, __u64);
} results SEC(".maps");   /* 0: sum, 1: rounds, 2: squares, 3: runs, 4: flags' -EINVAL, 5: -E2BIG */

struct sum {
	__u64 total;
	__u64 stop_at;
};

static long add_index(__u64 index, void *data)
{
	struct sum *s = data;

	s->total += index;
	return index + 1 >= s->stop_at;   /* 1 stops the loop */
}

static long add_square(__u64 index, void *data)
{
	*(__u64 *)data += index * index;
	return 0;
}

static __u64 *slot(__u32 key)
{
	return bpf_map_lookup_elem(&results, &key);
}

SEC("kprobe/*")
int loop_sum(struct egpu_ctx *ctx)
{
	struct sum s = {.total = 0, .stop_at = (ctx->kernel_id & 7) + 4};
	long rounds = bpf_loop(10, add_index, &s, 0);
	__u64 *sum = slot(0), *made = slot(1), *squares = slot(2), *runs = slot(3), *einval = slot(4), *e2big = slot(5);

	if (!sum || !made || !squares || !runs || !einval || !e2big)
		return 0;
	*sum += s.total;
	*made += rounds;
	/* as many rounds as earlier runs, read from the map */
	bpf_loop(*runs & 15, add_square, squares, 0);
	*runs += 1;
	*einval = bpf_loop(1, add_index, &s, 1);
	*e2big = bpf_loop((1 << 23) + 1, add_index, &s, 0);
	return rounds;
}

char LICENSE[] SEC("license") = "GPL";
