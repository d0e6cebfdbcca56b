/* A probe egpu attach hooks into a running tests/uprobe_app (app_uprobe direct_loop) inline: counts
 * upt_direct's calls and returns, and the returns that are 3 * first argument + 1, as its are there. */
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 3);
	__type(key, u32);
	__type(value, u64);
} counts SEC(".maps");

/* the thread's last first argument (one thread calls) */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} first SEC(".maps");

static __always_inline void count(u32 k)
{
	u64 *v = bpf_map_lookup_elem(&counts, &k);
	if (v)
		*v += 1;
}

SEC("uprobe/app_uprobe:upt_direct")
int BPF_KPROBE(direct_entry, long a)
{
	u32 zero = 0;
	u64 value = a;
	bpf_map_update_elem(&first, &zero, &value, BPF_ANY);
	count(0);
	return 0;
}

SEC("uretprobe/app_uprobe:upt_direct")
int BPF_KRETPROBE(direct_exit, long rc)
{
	u32 zero = 0;
	u64 *a = bpf_map_lookup_elem(&first, &zero);
	count(1);
	if (a && rc == 3 * *a + 1)
		count(2);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
