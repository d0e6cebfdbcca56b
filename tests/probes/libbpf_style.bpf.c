/* Written against libbpf's headers only, the way bpftime's GPU examples are: GPU helpers declared by
 * hand, a legacy SEC("maps") definition beside a BTF-defined map, bpf_printk from bpf_helpers.h. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

static const __u64 (*bpf_get_globaltimer)(void) = (void *)502;
static const __u64 (*bpf_get_block_idx)(__u64 *x, __u64 *y, __u64 *z) = (void *)503;

/* struct bpf_map_def as libbpf < 1.0 declared it. */
struct bpf_map_def {
	unsigned int type;
	unsigned int key_size;
	unsigned int value_size;
	unsigned int max_entries;
	unsigned int map_flags;
};

struct bpf_map_def SEC("maps") legacy_counts = {
	.type = BPF_MAP_TYPE_ARRAY,
	.key_size = sizeof(__u32),
	.value_size = sizeof(__u64),
	.max_entries = 2,
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 128);
	__type(key, __u64);
	__type(value, __u64);
	__uint(map_flags, 0);
} last_seen SEC(".maps");

SEC("kprobe/_Z9vectorAddPKfS0_Pf")
int cuda__vector_add()
{
	__u64 x, y, z, ts = bpf_get_globaltimer();
	__u32 key = 0;
	__u64 *n;

	bpf_get_block_idx(&x, &y, &z);
	key = x & 1;
	n = bpf_map_lookup_elem(&legacy_counts, &key);
	if (n)
		__sync_fetch_and_add(n, 1);
	bpf_map_update_elem(&last_seen, &x, &ts, BPF_ANY);
	if (x == 0)
		bpf_printk("block 0 at %llu", ts);
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
