/* Host uprobes that send records (tests/test_uprobes.py): upt_add6's first two arguments at each call to
 * a ring buffer, its return value at each return to a perf buffer, from C. */
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

char LICENSE[] SEC("license") = "GPL";
