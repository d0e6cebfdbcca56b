/* A string argument read as libbpf tools read one (bashreadline, sslsniff): bpf_probe_read_user_str into a
 * map key, and bpf_probe_read_user of its first bytes; each call's results counted. Targets libupt's
 * upt_name (app_uprobe names N): "alpha", a name longer than the key, and NULL (-EFAULT, the key zeroed). */
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct name {
	char s[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16);
	__type(key, struct name);
	__type(value, u64);
} names SEC(".maps");

/* key: what bpf_probe_read_user_str returned; + 1000: what bpf_probe_read_user of 4 bytes returned, and
 * + 2000 the first of those bytes */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16);
	__type(key, s64);
	__type(value, u64);
} results SEC(".maps");

static __always_inline void count(void *map, void *key)
{
	u64 zero = 0, *n;

	bpf_map_update_elem(map, key, &zero, BPF_NOEXIST);   /* fails where the key is there */
	n = bpf_map_lookup_elem(map, key);
	if (n)
		__sync_fetch_and_add(n, 1);
}

SEC("uprobe/libupt.so:upt_name")
int BPF_KPROBE(upt_name, const char *s)
{
	struct name name = {};
	char head[4] = {1, 1, 1, 1};
	s64 str = bpf_probe_read_user_str(name.s, sizeof(name.s), s);
	s64 raw = bpf_probe_read_user(head, sizeof(head), s) + 1000, first = head[0] + 2000;

	count(&names, &name);
	count(&results, &str);
	count(&results, &raw);
	count(&results, &first);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
