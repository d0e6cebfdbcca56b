/* A probe egpu attach hooks into a running tests/uprobe_app (app_uprobe loop): counts upt_add6's calls
 * and returns, and the returns that are 6 * first argument + 15, as upt_add6's always are. Built with
 * -DDIRECT (app_uprobe direct_loop): the same on upt_direct, hooked inline, whose returns are 3a + 1;
 * with -DNEAR: the same on upt_near (app_uprobe near_loop), hooked inline, which returns 1 or 2 (RESULT is
 * not its); with -DBIG: the same with a large map besides. */
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#ifdef DIRECT
#define TARGET "app_uprobe:upt_direct"
#define RESULT(a) (3 * (a) + 1)
#elif defined(NEAR)
#define TARGET "app_uprobe:upt_near"
#define RESULT(a) 2
#else
#define TARGET "libupt.so:upt_add6"
#define RESULT(a) (6 * (a) + 15)
#endif

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

#ifdef BIG
/* 8 MiB of device map: more than a device the test makes small holds (a swap to it fails) */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1 << 20);
	__type(key, u32);
	__type(value, u64);
} ballast SEC(".maps");
#endif

static __always_inline void count(u32 k)
{
	u64 *v = bpf_map_lookup_elem(&counts, &k);
	if (v)
		*v += 1;
}

SEC("uprobe/" TARGET)
int BPF_KPROBE(add6_entry, long a)
{
	u32 zero = 0;
	u64 value = a;
	bpf_map_update_elem(&first, &zero, &value, BPF_ANY);
	count(0);
	return 0;
}

SEC("uretprobe/" TARGET)
int BPF_KRETPROBE(add6_exit, long rc)
{
	u32 zero = 0;
	u64 *a = bpf_map_lookup_elem(&first, &zero);
	count(1);
	if (a && rc == RESULT(*a))
		count(2);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
