/* A probe egpu attach hooks into a running tests/uprobe_app (app_uprobe launch_loop) whose uprobes share
 * both maps with its GPU program, so what they write reaches the device copy only by the runtime's
 * pushes (runtime/uprobes.py Pushes). counts: see the enum; GPU_LAUNCHES is the GPU's alone (with
 * EGPU_STUB_PROBE_COUNTS the stand-in driver adds 1 to slot 0 of the probe's first map at every launch of
 * a module carrying it, where this kprobe, which never runs there, would count each thread). seen:
 * upt_add6's calls by first argument modulo MOD.
 * -DSECOND: MOD 4, the same maps (egpu swap takes both regions over). -DQUIET: the same maps, its uprobes on
 * upt_half, which launch_loop never calls (a swap to it takes the regions over and counts no call). */
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#ifdef SECOND
#define MOD 4
#else
#define MOD 8
#endif
#ifdef QUIET
#define TARGET "libupt.so:upt_half"
#else
#define TARGET "libupt.so:upt_add6"
#endif

/* FIRST: the first call's argument + 1, set once (0: none yet); LAST: the last call's argument */
enum { GPU_LAUNCHES, CALLS, RETURNS, RIGHT_RETURNS, CALL_TIME, FIRST, LAST, COUNTERS };

struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, COUNTERS); __type(key, u32); __type(value, u64); }
	counts SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 64); __type(key, u64); __type(value, u64); }
	seen SEC(".maps");

/* counter k; a macro: through an inline function clang emitted seen first, and counts must be the first map */
#define slot(k) ({ u32 key_ = (k); (u64 *)bpf_map_lookup_elem(&counts, &key_); })

SEC("uprobe/" TARGET)
int BPF_KPROBE(add6_entry, long a)
{
	u64 *v, one = 1, key = (u64)a % MOD;
	if ((v = slot(CALLS)))
		*v += 1;
	if ((v = slot(CALL_TIME)))
		*v = bpf_ktime_get_ns();
	if ((v = slot(FIRST)) && !*v)
		*v = a + 1;
	if ((v = slot(LAST)))
		*v = a;
	v = bpf_map_lookup_elem(&seen, &key);
	if (v)
		*v += 1;
	else
		bpf_map_update_elem(&seen, &key, &one, BPF_ANY);
	return 0;
}

SEC("uretprobe/" TARGET)
int BPF_KRETPROBE(add6_exit, long rc)
{
	u64 *v, *a = slot(LAST);
	if ((v = slot(RETURNS)))
		*v += 1;
	if (a && rc == 6 * *a + 15 && (v = slot(RIGHT_RETURNS)))
		*v += 1;
	return 0;
}

SEC("kprobe/vecadd")
int launched(void *ctx)
{
	u64 *v, key = 0;
	if ((v = slot(GPU_LAUNCHES)))
		__sync_fetch_and_add(v, 1);
	if ((v = bpf_map_lookup_elem(&seen, &key)))   /* a GPU reader of seen: the map is shared */
		__sync_fetch_and_add(v, 0);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
