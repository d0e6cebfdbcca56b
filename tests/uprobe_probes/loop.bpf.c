/* bpf_loop in a uprobe, which runs only in C (tests/test_uprobes.py): each call of upt_add6(a, ...) sums the
 * indices below a into a struct on its stack, the callback stopping itself at index 4, and counts the rounds made;
 * a call with flags adds its -EINVAL. */
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct sum {
	long total;
};

/* [0] the indices summed, [1] the rounds made, [2] the refusals' -EINVAL */
long counts[3];

static long add_index(__u64 index, void *data)
{
	struct sum *s = data;

	s->total += index;
	return index == 4;   /* 1 stops the loop */
}

SEC("uprobe/libupt.so:upt_add6")
int BPF_KPROBE(loop, long a)
{
	struct sum s = {0};
	long made = bpf_loop(a, add_index, &s, 0);

	__sync_fetch_and_add(&counts[0], s.total);
	__sync_fetch_and_add(&counts[1], made);
	__sync_fetch_and_add(&counts[2], bpf_loop(a, add_index, &s, 1));
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
