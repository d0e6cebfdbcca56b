/* Calls and returns of tests/uprobe_app's functions left by throws and longjmps (app_unwind): one counter
 * each in `counts`, calls at even keys, returns at the odd key after. */
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 22);
	__type(key, u32);
	__type(value, u64);
} counts SEC(".maps");

static void bump(u32 k)
{
	u64 *n = bpf_map_lookup_elem(&counts, &k);

	if (n)
		__sync_fetch_and_add(n, 1);
}

SEC("uprobe/libthrow.so:thr_maybe") int BPF_KPROBE(maybe_call) { bump(0); return 0; }
SEC("uretprobe/libthrow.so:thr_maybe") int BPF_KRETPROBE(maybe_return) { bump(1); return 0; }
SEC("uprobe/libthrow.so:thr_jump") int BPF_KPROBE(jump_call) { bump(2); return 0; }
SEC("uretprobe/libthrow.so:thr_jump") int BPF_KRETPROBE(jump_return) { bump(3); return 0; }
SEC("uprobe/libouter.so:thr_outer") int BPF_KPROBE(outer_call) { bump(4); return 0; }
SEC("uretprobe/libouter.so:thr_outer") int BPF_KRETPROBE(outer_return) { bump(5); return 0; }
SEC("uprobe/libouter.so:thr_nest") int BPF_KPROBE(nest_call) { bump(6); return 0; }
SEC("uretprobe/libouter.so:thr_nest") int BPF_KRETPROBE(nest_return) { bump(7); return 0; }
SEC("uprobe/libthrow.so:thr_exit") int BPF_KPROBE(exit_call) { bump(8); return 0; }
SEC("uretprobe/libthrow.so:thr_exit") int BPF_KRETPROBE(exit_return) { bump(9); return 0; }
SEC("uprobe/libouter.so:thr_tail") int BPF_KPROBE(tail_call) { bump(10); return 0; }
SEC("uretprobe/libouter.so:thr_tail") int BPF_KRETPROBE(tail_return) { bump(11); return 0; }
SEC("uprobe/libthrow.so:thr_add") int BPF_KPROBE(add_call) { bump(12); return 0; }
SEC("uretprobe/libthrow.so:thr_add") int BPF_KRETPROBE(add_return) { bump(13); return 0; }
SEC("uprobe/libthrow.so:thr_clean") int BPF_KPROBE(clean_call) { bump(14); return 0; }
SEC("uretprobe/libthrow.so:thr_clean") int BPF_KRETPROBE(clean_return) { bump(15); return 0; }
SEC("uprobe/libouter.so:thr_guard") int BPF_KPROBE(guard_call) { bump(16); return 0; }
SEC("uretprobe/libouter.so:thr_guard") int BPF_KRETPROBE(guard_return) { bump(17); return 0; }
SEC("uprobe/libthrow.so:thr_relay") int BPF_KPROBE(relay_call) { bump(18); return 0; }
SEC("uretprobe/libthrow.so:thr_relay") int BPF_KRETPROBE(relay_return) { bump(19); return 0; }
SEC("uprobe/libouter.so:thr_shelter") int BPF_KPROBE(shelter_call) { bump(20); return 0; }
SEC("uretprobe/libouter.so:thr_shelter") int BPF_KRETPROBE(shelter_return) { bump(21); return 0; }

char LICENSE[] SEC("license") = "GPL";
