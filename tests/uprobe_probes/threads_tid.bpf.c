/* Calls of a function by thread: bpf_get_current_pid_tgid()'s key, as uprobe tools key per-thread state (an
 * entry's argument or time, read back at the return). Bare: egpu-run --uprobe by_thread=PATH:SYMBOL. */
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, u64);
	__type(value, u64);
} calls SEC(".maps");

SEC("uprobe")
int BPF_KPROBE(by_thread)
{
	u64 key = bpf_get_current_pid_tgid(), one = 1, *n = bpf_map_lookup_elem(&calls, &key);

	if (n)
		__sync_fetch_and_add(n, 1);
	else
		bpf_map_update_elem(&calls, &key, &one, BPF_NOEXIST);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
