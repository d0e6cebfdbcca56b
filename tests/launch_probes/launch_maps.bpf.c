/* Every map semantic a launch probe can reach, for running the C engine (shim/launchvm.c) against the
 * Python VM over the same launches: a small LRU that evicts, a hash that fills up and has keys
 * deleted, update flags and their return codes, a per-cpu array, global data of each kind, a call to
 * a function of its own, signed arithmetic and the helpers that read the launch. */
#include "egpu.bpf.h"

struct seen {
	__u64 count;
	__u64 last_launch;
	__s64 skew;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4);
	__type(key, __u64);
	__type(value, struct seen);
} recent SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 5);
	__type(key, __u32);
	__type(value, __u64);
} small SEC(".maps");

/* -return code of each update and delete -> how often */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 32);
	__type(key, __u32);
	__type(value, __u64);
} codes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} per_cpu SEC(".maps");

__u64 threads;                 /* .bss */
__u64 seed = 3;                /* .data */
const volatile __u64 scale = 5; /* .rodata */
__u64 last_time, dims;

static void count_code(long rc)
{
	__u32 k = (__u32)(-rc) & 31;
	__u64 *n = bpf_map_lookup_elem(&codes, &k);

	if (n)
		__sync_fetch_and_add(n, 1);
}

static __noinline __u64 mix(__u64 a, __u64 b)
{
	__u64 buf[4] = {a, b, a ^ b, a * 31 + b};
	__s64 s = (__s64)buf[2] - (__s64)(b << 3);

#if __BPF_CPU_VERSION__ >= 4 /* sdiv, smod */
	return buf[3] + (__u64)(s / 7) + (__u64)(s % 5);
#else
	return buf[3] + (__u64)s / 7 + (__u64)s % 5;
#endif
}

SEC("egpu/launch/*")
int on_launch(struct egpu_ctx *ctx)
{
	__u64 id = ctx->launch_id, key = id % 3 ? id % 7 : 0, bx, by, bz; /* 0 is hot: it stays if hits count */
	__u32 small_key = (__u32)(id % 9), zero = 0, one = 1;
	struct seen *s = bpf_map_lookup_elem(&recent, &key);
	__u64 *p;

	if (s) {
		__sync_fetch_and_add(&s->count, 1);
		s->last_launch = id;
		s->skew = (__s64)id - 100;
	} else {
		struct seen fresh = {1, id, -(__s64)id};

		count_code(bpf_map_update_elem(&recent, &key, &fresh, BPF_NOEXIST));
	}
	if (id % 3 == 0) {
		count_code(bpf_map_delete_elem(&small, &small_key));
	} else {
		__u64 v = mix(id, seed) * scale;

		count_code(bpf_map_update_elem(&small, &small_key, &v, id % 4 == 1 ? BPF_EXIST : BPF_ANY));
		count_code(bpf_map_update_elem(&small, &small_key, &v, BPF_NOEXIST));
	}
	count_code(bpf_map_update_elem(&codes, &zero, &id, 7)); /* bad flags: -EINVAL */
	p = bpf_map_lookup_elem(&per_cpu, id & 1 ? &one : &zero);
	if (p)
		*p += ctx->grid[0] + bpf_get_smp_processor_id();
	__sync_fetch_and_add(&threads, (__u64)ctx->grid[0] * ctx->grid[1] * ctx->block[0]);
	seed = seed * 6364136223846793005ull + 1442695040888963407ull;
	last_time = bpf_ktime_get_ns();
	bpf_get_block_dim(&bx, &by, &bz);
	dims = bx << 32 | by << 16 | bz;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
