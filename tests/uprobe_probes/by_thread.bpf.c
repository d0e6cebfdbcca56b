/* Calls of a function by thread, under the two keys uprobe tools use for one: bpf_get_current_pid_tgid()
 * (per-thread state, an entry's argument or time read back at the return) and bpf_get_current_comm()
 * (libbpf-tools' counts by name); and the caller's bpf_get_current_uid_gid(), which tools filter on
 * (sslsniff's -u). Bare: egpu-run --uprobe by_thread=PATH:SYMBOL. */
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct comm {
	char name[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, u64);
	__type(value, u64);
} by_tid SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, struct comm);
	__type(value, u64);
} by_comm SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} uid_gid SEC(".maps");

static __always_inline void count(void *map, void *key)
{
	u64 one = 1, *n = bpf_map_lookup_elem(map, key);

	if (n)
		__sync_fetch_and_add(n, 1);
	else
		bpf_map_update_elem(map, key, &one, BPF_NOEXIST);
}

SEC("uprobe")
int BPF_KPROBE(by_thread)
{
	u64 tid = bpf_get_current_pid_tgid(), ids = bpf_get_current_uid_gid();
	u32 zero = 0;
	struct comm name;

	bpf_get_current_comm(name.name, sizeof(name.name));
	count(&by_tid, &tid);
	count(&by_comm, &name);
	bpf_map_update_elem(&uid_gid, &zero, &ids, BPF_ANY);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
