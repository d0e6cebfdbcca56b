/* A probe that reserves a second record while it holds the first unsubmitted, in a ring that holds one
 * of them: with --on-full wait the second waits for a reader that stops at the first. Once per block. */
#include "egpu.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} events SEC(".maps");

struct big {
	__u64 words[375]; /* 3000 bytes: two never fit */
};

SEC("kprobe.block/*")
int twice(struct egpu_ctx *ctx)
{
	struct big *first = bpf_ringbuf_reserve(&events, sizeof(struct big), 0);
	if (!first)
		return 0;
	struct big *second = bpf_ringbuf_reserve(&events, sizeof(struct big), 0);
	first->words[0] = 1;
	bpf_ringbuf_submit(first, 0);
	if (second) {
		second->words[0] = 2;
		bpf_ringbuf_submit(second, 0);
	}
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
