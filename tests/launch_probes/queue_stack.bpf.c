/* QUEUE, STACK and BLOOM_FILTER maps in a launch program: every push, pop and peek return code and value
 * summed into `results`, so that the C engine and the VM (tests/test_launchvm.py) must agree on each: a
 * full map (-E2BIG, or BPF_EXIST dropping the oldest), an empty one (-ENOENT with zeros), the order pops
 * take, flags Linux refuses (-EINVAL) and a bloom filter that never forgets a value it was given. */
#include "egpu.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_QUEUE);
	__uint(max_entries, 4);
	__type(value, __u64);
} fifo SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_STACK);
	__uint(max_entries, 3);
	__type(value, __u64);
} lifo SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_BLOOM_FILTER);
	__uint(max_entries, 64);
	__uint(map_extra, 3);   /* hash functions */
	__type(value, __u64);
} seen SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 16);
	__type(key, __u32);
	__type(value, __s64);
} results SEC(".maps");

static __always_inline void add(__u32 k, __s64 v)
{
	__s64 *slot = bpf_map_lookup_elem(&results, &k);

	if (slot)
		*slot += v;
}

SEC("egpu/launch/*")
int queue_stack(struct egpu_ctx *ctx)
{
	__u64 id = ctx->launch_id, v = 0, twice = 2 * ctx->launch_id, other = 2 * ctx->launch_id + 1;

	add(0, bpf_map_push_elem(&fifo, &id, 0));               /* -E2BIG once full */
	if (id % 3 == 0)
		add(1, bpf_map_push_elem(&fifo, &id, BPF_EXIST)); /* full: drops the oldest */
	add(2, bpf_map_push_elem(&fifo, &id, BPF_NOEXIST));     /* -EINVAL */
	if (id % 2) {
		add(3, bpf_map_pop_elem(&fifo, &v));
		add(4, v);
	}
	v = 7;
	add(5, bpf_map_peek_elem(&fifo, &v));
	add(6, v);
	if (id % 5 == 0)   /* drain the stack: the last pops find it empty (-ENOENT, v zeroed) */
		for (int i = 0; i < 4; i++) {
			v = 7;
			add(7, bpf_map_pop_elem(&lifo, &v));
			add(8, v * (i + 1));   /* weighted: the order pops take matters */
		}
	add(9, bpf_map_push_elem(&lifo, &id, id % 4 == 0 ? BPF_EXIST : 0));
	add(10, bpf_map_push_elem(&seen, &twice, 0));
	add(11, bpf_map_peek_elem(&seen, &twice));               /* 0: pushed, so never -ENOENT */
	add(12, bpf_map_peek_elem(&seen, &other) == 0);          /* false positives, the same on both engines */
	add(13, bpf_map_push_elem(&seen, &id, BPF_EXIST));       /* a bloom filter takes BPF_ANY only: -EINVAL */
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
