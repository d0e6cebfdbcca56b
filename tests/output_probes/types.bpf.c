/* Maps of every BTF shape a user may give a key or value; the tests fill them byte by byte (by the
 * BTF's offsets) and pin text and JSON: ints of each width and sign, bool, strings, arrays, nested,
 * anonymous and union members, enums (signed, 64-bit, unnamed values), bitfields, pointers, floats,
 * typedef/const/volatile, zero-length arrays, padding, struct keys, PERCPU structs, empty maps. */
#include "egpu.bpf.h"

enum sgn { NEG = -2, ZERO = 0, POS = 3 };
enum big64 { HUGE = 0x8000000000000001ULL, SMALL = 1 };
enum plain { P_A = 1, P_B = 2 };
typedef const volatile __s32 cv_s32;

struct ints { __s8 s8; __u8 u8; __s16 s16; __u16 u16; __s32 s32; __u32 u32; __s64 s64; __u64 u64; _Bool b; };

struct bits {
	int sb : 4;
	unsigned ub : 3;
	enum plain eb : 3;
	_Bool bb : 1;
	int : 2;
	__u64 wide : 40;
};

struct inner { __u32 a; char name[4]; };

struct outer {
	struct inner in;
	union { __u32 u; float f; } un;
	struct { __u16 x; __u16 y; };	/* anonymous: its fields are outer's */
	union { __u32 ua; __s32 ub; };
	__u8 hole;			/* 3 bytes of padding follow */
	__u64 after;
	void *ptr;
	double d;
	cv_s32 cv;
	enum sgn e;
	enum big64 e64;
	enum plain ep;
	__u32 arr[3];
	__u32 zero[0];
};

struct key { __u32 id; char tag[6]; };
struct sm_stats { __u64 kernel_id; __u64 n; char tag[4]; enum plain e; void *p; _Bool seen; __s32 neg; };

#define MAP(T, NAME, K, V, N) \
	struct { __uint(type, T); __uint(max_entries, N); __type(key, K); __type(value, V); } NAME SEC(".maps")

MAP(BPF_MAP_TYPE_HASH, ints, __s8, struct ints, 8);
MAP(BPF_MAP_TYPE_HASH, s16, __s16, __s16, 8);
MAP(BPF_MAP_TYPE_HASH, s64, __s64, __s64, 8);
MAP(BPF_MAP_TYPE_HASH, flags, __u32, _Bool, 8);
MAP(BPF_MAP_TYPE_HASH, strs, __u32, char[8], 8);
MAP(BPF_MAP_TYPE_HASH, bits, __u32, struct bits, 8);
MAP(BPF_MAP_TYPE_HASH, nested, struct key, struct outer, 8);
MAP(BPF_MAP_TYPE_HASH, floats, __u32, float, 8);
MAP(BPF_MAP_TYPE_HASH, enums, enum sgn, enum big64, 8);
MAP(BPF_MAP_TYPE_PERCPU_ARRAY, per_sm, __u32, struct sm_stats, 1);
MAP(BPF_MAP_TYPE_LRU_HASH, lru, __u32, __u64, 4);
MAP(BPF_MAP_TYPE_HASH, empty, __u32, __u64, 4);
MAP(BPF_MAP_TYPE_ARRAY, empty_array, __u32, __u64, 4);
struct { __uint(type, BPF_MAP_TYPE_RINGBUF); __uint(max_entries, 4096); } no_records SEC(".maps");

/* Deletes what it adds at site 1: the LRU map holds sites 0, 2 and 3. */
SEC("egpu/mem/*")
int types(struct egpu_ctx *ctx)
{
	__u32 k = ctx->site;
	__u64 one = 1;

	bpf_map_update_elem(&lru, &k, &one, BPF_ANY);
	if (k == 1)
		bpf_map_delete_elem(&lru, &k);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
