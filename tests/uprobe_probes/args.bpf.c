/* Host uprobes on libupt (tests/uprobe_app), built with bpftime's flags (vmlinux.h, bpf_tracing.h):
 * arguments and return values recorded exactly, one counter map shared with a launch probe. */
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

enum { ADD6_CALLS, ADD6_RETURNS, SUM8_CALLS, SUM8_RETURNS, LAUNCHES, HALF_RETURNS, DRIVER_LAUNCHES, COUNTERS };

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, COUNTERS);
	__type(key, u32);
	__type(value, u64);
} counts SEC(".maps");

/* upt_add6's first argument -> the other five, packed a byte each (each is first + 1..5) */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, u64);
	__type(value, u64);
} add6_args SEC(".maps");

/* return values seen -> how often */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u64);
	__type(value, u64);
} returns SEC(".maps");

static __always_inline void count(u32 k)
{
	u64 *v = bpf_map_lookup_elem(&counts, &k);
	if (v)
		__sync_fetch_and_add(v, 1);
}

static __always_inline void seen(u64 rc)
{
	u64 one = 1, *v = bpf_map_lookup_elem(&returns, &rc);
	if (v)
		*v += 1;
	else
		bpf_map_update_elem(&returns, &rc, &one, BPF_ANY);
}

SEC("uprobe/libupt.so:upt_add6")
int add6_entry(struct pt_regs *ctx)
{
	long a = PT_REGS_PARM1(ctx), b = PT_REGS_PARM2(ctx), c = PT_REGS_PARM3(ctx), d = PT_REGS_PARM4(ctx);
	long e = PT_REGS_PARM5(ctx), f = ctx->r9; /* PT_REGS_PARM6 (this libbpf stops at 5) */
	u64 key = a, packed = (b - a) | (c - a) << 8 | (d - a) << 16 | (e - a) << 24 | (u64)(f - a) << 32;
	count(ADD6_CALLS);
	bpf_map_update_elem(&add6_args, &key, &packed, BPF_ANY);
	return 0;
}

SEC("uretprobe/libupt.so:upt_add6")
int BPF_KRETPROBE(add6_exit, long rc)
{
	count(ADD6_RETURNS);
	seen(rc);
	return 0;
}

/* bare: egpu-run --uprobe sum8_entry=libupt.so:upt_sum8 */
SEC("uprobe")
int BPF_KPROBE(sum8_entry, long a)
{
	count(SUM8_CALLS);
	return 0;
}

SEC("uretprobe")
int BPF_KRETPROBE(sum8_exit, long rc)
{
	count(SUM8_RETURNS);
	seen(rc);
	return 0;
}

/* a double comes back in xmm0: rax holds whatever the function left there, so only count */
SEC("uretprobe/libupt.so:upt_half")
int half_exit(struct pt_regs *ctx)
{
	count(HALF_RETURNS);
	bpf_printk("upt_half returned, sp %lx", PT_REGS_SP(ctx) & 0xf); /* 0: 16-aligned after the return */
	return 0;
}

/* the app's GOT slot for cuLaunchKernel is bound to the shim's hook, not to the stand-in's function: left
 * alone, so this never runs and the shim still sees every launch */
SEC("uprobe/libcuda.so.1:cuLaunchKernel")
int driver_launch(struct pt_regs *ctx)
{
	count(DRIVER_LAUNCHES);
	return 0;
}

SEC("egpu/launch/*")
int launch(void *ctx)
{
	count(LAUNCHES);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
