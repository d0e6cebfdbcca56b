/* stragglers: which blocks take much longer than the rest, and on which SM?
 *
 * Times every block from its entry to its exit (kprobe.block / kretprobe.block, %globaltimer), keeps a
 * log2 histogram of block durations, and sends each block slower than threshold_ns to a ring buffer
 * with its kernel, launch, block index, SM and times. The histogram shows what "slow" means for this
 * program; set threshold_ns from it (const volatile: a loader may set it before loading, or edit it).
 * Typical causes: data-dependent loops (sparse rows, early exits), blocks of the last wave running
 * alone, or one SM shared with another kernel.
 *
 *   egpu-run -p examples/stragglers.bpf.c ./app
 */
#include "counters.bpf.h"

const volatile __u64 threshold_ns = 100000; /* 100 us */

struct block_key {
	__u64 launch_id;
	__u64 block;  /* linear block index: x + y * gridDim.x + z * gridDim.x * gridDim.y */
};

/* running block -> its entry time */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384); /* resident blocks: 132 SMs x up to 32 blocks each, with room */
	__type(key, struct block_key);
	__type(value, __u64);
} block_start SEC(".maps");

/* log2 histogram of block durations in ns */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, HIST_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} hist_block_ns SEC(".maps");

struct straggler {
	__u64 kernel_id;
	__u64 launch_id;
	__u64 ts;           /* the block's start: --perfetto places the record there */
	__u64 duration_ns;
	__u32 block[3];
	__u32 sm;
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} stragglers SEC(".maps");

/* This block's key. */
static __always_inline struct block_key this_block(struct egpu_ctx *ctx)
{
	__u64 x, y, z, gx, gy, gz;
	struct block_key k = { .launch_id = ctx->launch_id };

	bpf_get_block_idx(&x, &y, &z);
	bpf_get_grid_dim(&gx, &gy, &gz);
	k.block = x + (y + z * gy) * gx;
	return k;
}

/* Not inlined, on purpose: a function taking struct straggler * is what makes clang describe the struct
 * in the object's BTF, which is how egpu prints the records with their field names. */
static __noinline void fill(struct straggler *s, const struct egpu_ctx *ctx, __u64 start, __u64 end)
{
	__u64 x, y, z;

	s->kernel_id = ctx->kernel_id;
	s->launch_id = ctx->launch_id;
	s->ts = start;
	s->duration_ns = end - start;
	bpf_get_block_idx(&x, &y, &z);
	s->block[0] = x;
	s->block[1] = y;
	s->block[2] = z;
	s->sm = bpf_get_sm_id();
}

SEC("kprobe.block/*")
int block_enter(struct egpu_ctx *ctx)
{
	struct block_key k = this_block(ctx);
	__u64 now = bpf_get_globaltimer();

	bpf_map_update_elem(&block_start, &k, &now, BPF_ANY);
	return 0;
}

SEC("kretprobe.block/*")
int block_exit(struct egpu_ctx *ctx)
{
	__u64 now = bpf_get_globaltimer();
	struct block_key k = this_block(ctx);
	struct straggler *s;
	__u64 start, *startp;

	startp = bpf_map_lookup_elem(&block_start, &k);
	if (!startp)
		return 0;
	start = *startp;
	bpf_map_delete_elem(&block_start, &k);
	hist_add(&hist_block_ns, now - start);
	if (now - start <= threshold_ns)
		return 0;
	s = bpf_ringbuf_reserve(&stragglers, sizeof(*s), 0);
	if (!s)
		return 0;
	fill(s, ctx, start, now);
	bpf_ringbuf_submit(s, 0);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
