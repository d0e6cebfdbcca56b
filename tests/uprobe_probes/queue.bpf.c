/* QUEUE, STACK and BLOOM_FILTER maps in uprobes, which run only in C (tests/test_uprobes.py): each call of
 * upt_add6 pushes its first argument into a queue (BPF_EXIST: a full one drops its oldest), a stack (no
 * flag: a full one refuses, -E2BIG, counted) and a bloom filter; each return pops the stack once every
 * third call and counts the bloom filter's answers for the argument pushed and for one never pushed. */
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct {
	__uint(type, BPF_MAP_TYPE_QUEUE);
	__uint(max_entries, 4);
	__type(value, long);
} fifo SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_STACK);
	__uint(max_entries, 4);
	__type(value, long);
} lifo SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_BLOOM_FILTER);
	__uint(max_entries, 256);
	__type(value, long);
} seen SEC(".maps");

/* [0] stack pushes refused, [1] bloom filter misses of pushed values, [2] pops */
long counts[3];
long last_a;

SEC("uprobe/libupt.so:upt_add6")
int BPF_KPROBE(push, long a)
{
	last_a = a;
	bpf_map_push_elem(&fifo, &a, BPF_EXIST);
	if (bpf_map_push_elem(&lifo, &a, 0) == -7)
		__sync_fetch_and_add(&counts[0], 1);
	bpf_map_push_elem(&seen, &a, 0);
	return 0;
}

SEC("uretprobe/libupt.so:upt_add6")
int BPF_KRETPROBE(pop, long rc)
{
	long a = last_a, v;

	if (bpf_map_peek_elem(&seen, &a))
		__sync_fetch_and_add(&counts[1], 1);
	if ((unsigned long)a % 3 == 0 && bpf_map_pop_elem(&lifo, &v) == 0)
		__sync_fetch_and_add(&counts[2], 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
