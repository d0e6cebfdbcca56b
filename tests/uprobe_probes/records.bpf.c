/* Host uprobes that send records (tests/test_uprobes.py), from C: upt_add6's first two arguments at each
 * call to a ring buffer, its return value at each return to a perf buffer; and the same reserved in
 * place in two more rings: a call's record discarded where the first argument is a multiple of 3, else
 * submitted, its second field left unwritten (so zero) where the first is 2 more than one; at each
 * return two held at once, filled by atomic adds, the second submitted first, and a reserve with flags
 * (NULL). */
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
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(u32));
	__uint(value_size, sizeof(u32));
} returns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 16);
} reserved_calls SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 16);
} reserved_returns SEC(".maps");

SEC("uprobe/libupt.so:upt_add6")
int BPF_KPROBE(add6_entry, long a, long b)
{
	struct call c = { .a = a, .b = b };

	bpf_ringbuf_output(&calls, &c, sizeof(c), 0);
	return 0;
}

SEC("uretprobe/libupt.so:upt_add6")
int BPF_KRETPROBE(add6_exit, long rc)
{
	bpf_perf_event_output(ctx, &returns, BPF_F_CURRENT_CPU, &rc, sizeof(rc));
	return 0;
}

SEC("uprobe/libupt.so:upt_add6")
int BPF_KPROBE(add6_reserve, long a, long b)
{
	struct call *c = bpf_ringbuf_reserve(&reserved_calls, sizeof(*c), 0);

	if (!c)
		return 0;
	c->a = -1; /* discarded: the next record, in the same place, must not show it */
	c->b = -1;
	bpf_ringbuf_discard(c, 0);
	c = bpf_ringbuf_reserve(&reserved_calls, sizeof(*c), 0);
	if (!c)
		return 0;
	c->a = a;
	if ((unsigned long)a % 3 == 1)
		c->b = b;
	if ((unsigned long)a % 3 == 0)
		bpf_ringbuf_discard(c, 0);
	else
		bpf_ringbuf_submit(c, 0);
	return 0;
}

SEC("uretprobe/libupt.so:upt_add6")
int BPF_KRETPROBE(add6_reserve_exit, long rc)
{
	long *first = bpf_ringbuf_reserve(&reserved_returns, sizeof(long), 0);
	long *second, *flagged = bpf_ringbuf_reserve(&reserved_returns, sizeof(long), 1);

	if (flagged) { /* reserve takes no flags: NULL, as the kernel's */
		*flagged = 0;
		bpf_ringbuf_submit(flagged, 0);
	}
	if (!first)
		return 0;
	second = bpf_ringbuf_reserve(&reserved_returns, sizeof(long), 0);
	if (!second) {
		bpf_ringbuf_discard(first, 0);
		return 0;
	}
	*first = 0;
	*second = 0;
	__sync_fetch_and_add(first, rc); /* atomics on a record, which the kernel allows (PTR_TO_MEM) */
	__sync_fetch_and_add(second, -rc);
	bpf_ringbuf_submit(second, 0);
	bpf_ringbuf_submit(first, 0);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
