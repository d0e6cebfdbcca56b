/* Calls of a function by thread name: bpf_get_current_comm()'s key, as libbpf-tools key their counts. Bare:
 * egpu-run --uprobe by_comm=PATH:SYMBOL. */
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct comm {
	char name[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, struct comm);
	__type(value, u64);
} calls SEC(".maps");

SEC("uprobe")
int BPF_KPROBE(by_comm)
{
	struct comm key;
	u64 one = 1, *n;

	bpf_get_current_comm(key.name, sizeof(key.name));
	n = bpf_map_lookup_elem(&calls, &key);
	if (n)
		__sync_fetch_and_add(n, 1);
	else
		bpf_map_update_elem(&calls, &key, &one, BPF_NOEXIST);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
