/* Every atomic on a reserved ring-buffer record (the kernel's PTR_TO_MEM): add, or, and, xor, fetching
 * and not, xchg and cmpxchg, 64 and 32 bits. A record reads (size + 3, 0x31, size + 1). */
#include "egpu.bpf.h"

struct tally {
	__u64 sum;
	__u32 bits;
	__u32 swapped;
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} tallies SEC(".maps");

SEC("kprobe/*")
int record_atomics(struct egpu_ctx *ctx)
{
	struct tally *t = bpf_ringbuf_reserve(&tallies, sizeof(*t), 0);
	__u64 before;
	__u32 old;

	if (!t)
		return 0;
	t->sum = 1;
	t->bits = 0;
	t->swapped = 0;
	__sync_fetch_and_add(&t->sum, ctx->size);
	before = __sync_fetch_and_add(&t->sum, 2);
	__sync_fetch_and_or(&t->bits, 0xf0);
	__sync_fetch_and_and(&t->bits, 0x3c);
	__sync_fetch_and_xor(&t->bits, 0x01);
	old = __sync_lock_test_and_set(&t->swapped, 7);
	__sync_val_compare_and_swap(&t->swapped, 7, (__u32)before + old);
	bpf_ringbuf_submit(t, 0);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
