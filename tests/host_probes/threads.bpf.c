/* tests/uprobe_app/app_stress.c's calls, counted by host-API programs in the 8 threads that make them and
 * a launch program on the runtime's drainer, at once: totals (an array, atomic adds; EVENTS is added to by
 * both kinds) and by_thread (a hash keyed by the thread's index, which the calls carry: allocations of
 * 256 (t + 1) bytes, copies of 16 (t + 1), launches of grid t + 1), whose first value either kind may make;
 * tids, the allocating threads' bpf_get_current_pid_tgid(). */
#include "egpu.bpf.h"

enum { ALLOCS, ALLOC_BYTES, COPIES, COPY_BYTES, FREES, LAUNCHES, EVENTS, TOTALS };

struct per_thread {
	__u64 allocs, copies, launches;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TOTALS);
	__type(key, __u32);
	__type(value, __u64);
} totals SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16);
	__type(key, __u64);
	__type(value, struct per_thread);
} by_thread SEC(".maps");

/* the allocating thread's bpf_get_current_pid_tgid(): tgid << 32 | that thread's id, as in Linux */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16);
	__type(key, __u64);
	__type(value, __u64);
} tids SEC(".maps");

static __always_inline void add(__u32 k, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&totals, &k);
	if (v)
		__sync_fetch_and_add(v, n);
}

/* thread t's row, made by whichever of its calls comes first (another may make it between the two lookups) */
static __always_inline struct per_thread *row(__u64 t)
{
	struct per_thread *v = bpf_map_lookup_elem(&by_thread, &t), zero = {};
	if (v)
		return v;
	bpf_map_update_elem(&by_thread, &t, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&by_thread, &t);
}

SEC("egpu/alloc/cuMemAlloc_v2")
int on_alloc(struct egpu_host_ctx *c)
{
	struct per_thread *v = row(c->bytes / 256 - 1);
	if (v)
		__sync_fetch_and_add(&v->allocs, 1);
	__u64 tid = bpf_get_current_pid_tgid(), one = 1;
	bpf_map_update_elem(&tids, &tid, &one, BPF_ANY);
	add(ALLOCS, 1);
	add(ALLOC_BYTES, c->bytes);
	add(EVENTS, 1);
	return 0;
}

SEC("egpu/memcpy/cuMemcpy")
int on_copy(struct egpu_host_ctx *c)
{
	struct per_thread *v = row(c->bytes / 16 - 1);
	if (v)
		__sync_fetch_and_add(&v->copies, 1);
	add(COPIES, 1);
	add(COPY_BYTES, c->bytes);
	add(EVENTS, 1);
	return 0;
}

SEC("egpu/free/cuMemFree_v2")
int on_free(struct egpu_host_ctx *c)
{
	add(FREES, 1);
	add(EVENTS, 1);
	return 0;
}

SEC("egpu/launch/vecadd")
int on_launch(struct egpu_ctx *c)
{
	struct per_thread *v = row(c->grid[0] - 1);
	if (v)
		__sync_fetch_and_add(&v->launches, 1);
	add(LAUNCHES, 1);
	add(EVENTS, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
