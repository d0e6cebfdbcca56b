/* One bpf_printk line, one ring buffer record and one perf buffer record at each call of a function, made
 * faster than egpu-run's drain thread takes them out of C's buffer (tests/test_uprobes.py): what is lost
 * must be counted as what it was. Bare: egpu-run --uprobe lossy=PATH:SYMBOL. */
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 24);
} calls SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(u32));
	__uint(value_size, sizeof(u32));
} also SEC(".maps");

SEC("uprobe")
int BPF_KPROBE(lossy)
{
	u64 one = 1;

	bpf_printk("call");
	bpf_ringbuf_output(&calls, &one, sizeof(one), 0);
	bpf_perf_event_output(ctx, &also, BPF_F_CURRENT_CPU, &one, sizeof(one));
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
