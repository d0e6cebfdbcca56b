/* What a kernel-site probe reads of the host process: bpf_get_current_pid_tgid, bpf_get_current_uid_gid and
 * bpf_get_current_comm, which the GPU reads from the trace ring's header (translate/devmaps.py TGID, UID_GID,
 * COMM). */
#include "egpu.bpf.h"

struct process {
	__u64 pid_tgid;
	__u64 uid_gid;
	char comm[16];
	char short_comm[4];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct process);
} seen SEC(".maps");

SEC("kprobe/*")
int who(struct egpu_ctx *ctx)
{
	__u32 k = 0;
	struct process *p = bpf_map_lookup_elem(&seen, &k);

	if (!p)
		return 0;
	p->pid_tgid = bpf_get_current_pid_tgid();
	p->uid_gid = bpf_get_current_uid_gid();
	bpf_get_current_comm(p->comm, sizeof(p->comm));
	bpf_get_current_comm(p->short_comm, sizeof(p->short_comm));   /* 3 bytes of the name and a NUL */
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
