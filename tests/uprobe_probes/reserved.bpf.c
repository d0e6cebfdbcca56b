/* Host uprobes that reserve their records (tests/test_uprobes.py): at each call of upt_add6 a record of
 * its first two arguments reserved in a ring buffer, submitted unless the first is a multiple of 3
 * (then discarded); two held at once at each return, the second submitted first. */
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct call {
	long a;
	long b;
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 16);
} calls SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 16);
} returns SEC(".maps");

SEC("uprobe/libupt.so:upt_add6")
int BPF_KPROBE(add6_entry, long a, long b)
{
	struct call *c = bpf_ringbuf_reserve(&calls, sizeof(*c), 0);

	if (!c)
		return 0;
	c->a = a;
	c->b = b;
	if ((unsigned long)a % 3 == 0)
		bpf_ringbuf_discard(c, 0);
	else
		bpf_ringbuf_submit(c, 0);
	return 0;
}

SEC("uretprobe/libupt.so:upt_add6")
int BPF_KRETPROBE(add6_exit, long rc)
{
	long *first = bpf_ringbuf_reserve(&returns, sizeof(long), 0);
	long *second;

	if (!first)
		return 0;
	second = bpf_ringbuf_reserve(&returns, sizeof(long), 0);
	if (!second) {
		bpf_ringbuf_discard(first, 0);
		return 0;
	}
	*first = rc;
	*second = -rc;
	bpf_ringbuf_submit(second, 0);
	bpf_ringbuf_submit(first, 0);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
