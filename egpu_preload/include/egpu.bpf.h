/* egpu.bpf.h: everything an egpu probe needs, in one header shipped with the package.
 *
 * Compile with `egpu compile probe.bpf.c` (clang -O2 -g -target bpf, this directory on the include path).
 *
 * Sections (what SEC() names; egpu_preload/bpf/sections.py parses them):
 *   kprobe/GLOB        kernel entry          kretprobe/GLOB    kernel exit (before every ret/exit)
 *   egpu/mem/GLOB      every global load and store        egpu/load/GLOB, egpu/store/GLOB: one kind only
 *   egpu/launch/GLOB   once per launch, on the host side of the launch (grid, block, stream)
 *   egpu/uvm/GLOB      once per unified-memory event CUPTI records, on the host, with struct egpu_uvm_ctx
 *                      (below); GLOB matches the event's kind: htod, dtoh, dtod, cpu_page_fault,
 *                      gpu_page_fault, thrashing, throttling, remote_map ("*" for all, "*_page_fault")
 * GLOB matches the mangled or demangled kernel name (fnmatch rules; "*" for every kernel).
 * Host-API sections run on the host, in C, after each call of a driver API whose name GLOB matches (the
 * API's name or the symbol called: egpu/memcpy/cuMemcpyHtoDAsync* takes cuMemcpyHtoDAsync_v2 and _v2_ptsz),
 * with struct egpu_host_ctx (below) instead of struct egpu_ctx:
 *   egpu/memcpy/GLOB   every copy (cuMemcpy*: 1D, 2D, 3D, peer, arrays, batches, sync and async)
 *   egpu/memset/GLOB   every set (cuMemsetD8/16/32, 2D, sync and async)
 *   egpu/alloc/GLOB    device, pitched, managed, pool (stream-ordered), pinned host and VMM allocations
 *   egpu/free/GLOB     their frees
 *   egpu/sync/GLOB     cuStreamSynchronize, cuEventSynchronize, cuCtxSynchronize, with the time blocked
 * Scope: the suffix ".warp" or ".block" on the word before the first "/" of a GPU section runs the probe
 * once per warp (lowest active lane) or once per block instead of in every thread:
 *   kprobe.warp/GLOB, kretprobe.block/GLOB, egpu/mem.warp/GLOB, egpu/store.block/GLOB.
 * egpu/launch and the host-API sections take no scope (they run once per launch or call already).
 *
 * The header may be combined with libbpf's <bpf/bpf_helpers.h> in either order: whichever comes first
 * defines SEC(), the map macros and the standard helpers, and the other adds only what it lacks.
 */
#ifndef __EGPU_BPF_H__
#define __EGPU_BPF_H__

/* Types and constants of linux/bpf.h: from the system's uapi headers when they are there, so that a later
 * #include <linux/bpf.h> agrees with us; otherwise the subset egpu implements. */
#if __has_include(<linux/bpf.h>)
#include <linux/types.h>
#include <linux/bpf.h>
#else
typedef signed char __s8;
typedef unsigned char __u8;
typedef short __s16;
typedef unsigned short __u16;
typedef int __s32;
typedef unsigned int __u32;
typedef long long __s64;
typedef unsigned long long __u64;
enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERF_EVENT_ARRAY = 4,
	BPF_MAP_TYPE_PERCPU_HASH = 5,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_LRU_HASH = 9,
	BPF_MAP_TYPE_LRU_PERCPU_HASH = 10,
	BPF_MAP_TYPE_QUEUE = 22,
	BPF_MAP_TYPE_STACK = 23,
	BPF_MAP_TYPE_RINGBUF = 27,
	BPF_MAP_TYPE_BLOOM_FILTER = 30,
};
enum { BPF_ANY = 0, BPF_NOEXIST = 1, BPF_EXIST = 2 };
enum { BPF_F_CURRENT_CPU = 0xffffffffULL };
#endif

/* ---- What libbpf's bpf_helpers.h also defines (same spelling, same ids). ---- */
#ifndef __BPF_HELPERS__
#define __BPF_HELPERS__ /* a later <bpf/bpf_helpers.h> is then a no-op: this block replaces it */

#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name
#define __array(name, val) typeof(val) *name[]
#define SEC(name) \
	_Pragma("GCC diagnostic push") \
	_Pragma("GCC diagnostic ignored \"-Wignored-attributes\"") \
	__attribute__((section(name), used)) \
	_Pragma("GCC diagnostic pop")
#undef __always_inline
#define __always_inline inline __attribute__((always_inline))
#ifndef __noinline
#define __noinline __attribute__((noinline))
#endif
#ifndef __weak
#define __weak __attribute__((weak))
#endif
#define __hidden __attribute__((visibility("hidden")))
#ifndef NULL
#define NULL ((void *)0)
#endif
#ifndef offsetof
#define offsetof(type, member) __builtin_offsetof(type, member)
#endif
#ifndef barrier
#define barrier() asm volatile("" ::: "memory")
#endif
/* What libbpf's other headers (bpf_core_read.h) and map definitions (pinning) take from bpf_helpers.h. */
enum libbpf_pin_type { LIBBPF_PIN_NONE, LIBBPF_PIN_BY_NAME };
#define __kconfig __attribute__((section(".kconfig")))
#define __ksym __attribute__((section(".ksyms")))
#ifndef ___bpf_concat
#define ___bpf_concat(a, b) a ## b
#endif
#ifndef ___bpf_apply
#define ___bpf_apply(fn, n) ___bpf_concat(fn, n)
#endif
#ifndef ___bpf_nth
#define ___bpf_nth(_, _1, _2, _3, _4, _5, _6, _7, _8, _9, _a, _b, _c, N, ...) N
#endif
#ifndef ___bpf_narg
#define ___bpf_narg(...) ___bpf_nth(_, ##__VA_ARGS__, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#endif

/* Standard helpers (linux/bpf.h ids). */
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*bpf_map_update_elem)(void *map, const void *key, const void *value, __u64 flags) = (void *)2;
static long (*bpf_map_delete_elem)(void *map, const void *key) = (void *)3;
/* QUEUE, STACK (push, pop, peek) and BLOOM_FILTER (push adds, peek tests) maps, in host programs only */
static long (*bpf_map_push_elem)(void *map, const void *value, __u64 flags) = (void *)87;
static long (*bpf_map_pop_elem)(void *map, void *value) = (void *)88;
static long (*bpf_map_peek_elem)(void *map, void *value) = (void *)89;
static __u64 (*bpf_ktime_get_ns)(void) = (void *)5;           /* %globaltimer on the GPU */
/* CLOCK_BOOTTIME and CLOCK_MONOTONIC_COARSE on the host, on ktime's clock; %globaltimer on the GPU */
static __u64 (*bpf_ktime_get_boot_ns)(void) = (void *)125;
static __u64 (*bpf_ktime_get_coarse_ns)(void) = (void *)160;
static long (*bpf_get_numa_node_id)(void) = (void *)42;        /* the host CPU's node (getcpu); 0 on the GPU */
static long (*bpf_trace_printk)(const char *fmt, __u32 fmt_size, ...) = (void *)6; /* formatted on the host */
static __u32 (*bpf_get_prandom_u32)(void) = (void *)7;        /* for sampling, per thread (bpf/helpers.py) */
static __u32 (*bpf_get_smp_processor_id)(void) = (void *)8;   /* %smid on the GPU */
static __u64 (*bpf_get_current_pid_tgid)(void) = (void *)14;  /* tgid << 32 | tgid (host-called: | its thread) */
/* gid << 32 | uid, the real ids (host-called: its thread's; on the GPU the process's when its maps were laid out) */
static __u64 (*bpf_get_current_uid_gid)(void) = (void *)15;
/* The thread's name (a uprobe or host-API probe: the calling thread's; elsewhere the main thread's), 0 */
static long (*bpf_get_current_comm)(void *buf, __u32 size_of_buf) = (void *)16;
/* The application's memory (uprobes and host-API probes only): 0, or -EFAULT and dst zeroed; the _str forms
 * copy up to a NUL or size - 1 bytes, then a NUL, and return the length with it */
static long (*bpf_probe_read)(void *dst, __u32 size, const void *unsafe_ptr) = (void *)4;
static long (*bpf_probe_read_str)(void *dst, __u32 size, const void *unsafe_ptr) = (void *)45;
static long (*bpf_probe_read_user)(void *dst, __u32 size, const void *unsafe_ptr) = (void *)112;
static long (*bpf_probe_read_user_str)(void *dst, __u32 size, const void *unsafe_ptr) = (void *)114;
static long (*bpf_perf_event_output)(void *ctx, void *map, __u64 flags, void *data, __u64 size) = (void *)25;
static long (*bpf_ringbuf_output)(void *ringbuf, void *data, __u64 size, __u64 flags) = (void *)130;
static void *(*bpf_ringbuf_reserve)(void *ringbuf, __u64 size, __u64 flags) = (void *)131;
static void (*bpf_ringbuf_submit)(void *data, __u64 flags) = (void *)132;
static void (*bpf_ringbuf_discard)(void *data, __u64 flags) = (void *)133;
/* callback_fn(index, callback_ctx) for index 0, 1, ... below nr_loops until it returns 1 (it returns 0 or 1); the
 * calls made, -E2BIG past 1 << 23, -EINVAL for flags but 0. callback_fn: a static function; callback_ctx: a
 * pointer to the stack or a map value, or NULL. GPU probes and those the Python VM runs (launch, egpu/uvm): the
 * C engine, which runs uprobes and host-API probes, calls no callbacks */
static long (*bpf_loop)(__u32 nr_loops, void *callback_fn, void *callback_ctx, __u64 flags) = (void *)181;

/* bpf_printk("fmt", a, b, c): up to three arguments, like libbpf's short form (more would reach clang's
 * BPF back end as "too many arguments" with no line to it). */
#define bpf_printk(fmt, ...) \
	({ _Static_assert(___bpf_narg(__VA_ARGS__) <= 3, "bpf_printk takes at most three arguments"); \
	   static const char ____fmt[] = fmt; bpf_trace_printk(____fmt, sizeof(____fmt), ##__VA_ARGS__); })
#endif /* __BPF_HELPERS__ */

/* ---- GPU helpers: bpftime's ids and names, so its probes run unchanged. ---- */
static __u64 (*bpf_get_globaltimer)(void) = (void *)502;
static long (*bpf_get_block_idx)(__u64 *x, __u64 *y, __u64 *z) = (void *)503;
static long (*bpf_get_block_dim)(__u64 *x, __u64 *y, __u64 *z) = (void *)504;
static long (*bpf_get_thread_idx)(__u64 *x, __u64 *y, __u64 *z) = (void *)505;
static long (*bpf_membar)(void) = (void *)506;
/* Ends the probe (the kernel's thread goes on): killing a thread would change what the kernel computes. */
static void (*bpf_exit)(void) = (void *)507;
static long (*bpf_get_grid_dim)(__u64 *x, __u64 *y, __u64 *z) = (void *)508;
static __u64 (*bpf_get_sm_id)(void) = (void *)509;
static __u64 (*bpf_get_warp_id)(void) = (void *)510;
static __u64 (*bpf_get_lane_id)(void) = (void *)511;

/* ---- The context a probe receives in r1 (egpu_preload/bpf/ctx.py is the ABI; tests check the offsets). ---- */
#define EGPU_MAX_ARGS 8
enum egpu_kind { EGPU_KIND_ENTRY = 0, EGPU_KIND_EXIT = 1, EGPU_KIND_MEM = 2, EGPU_KIND_LAUNCH = 3 };
enum egpu_flags { EGPU_F_LOAD = 1, EGPU_F_STORE = 2, EGPU_F_ATOMIC = 4 };

struct egpu_ctx {
	__u64 kernel_id;   /* FNV-1a 64 of the mangled kernel name */
	__u64 launch_id;   /* counts launches of instrumented kernels, process-wide */
	__u64 addr;        /* memory sites: the effective (generic) address */
	__u32 site;        /* index of the instrumented instruction within the kernel */
	__u32 size;        /* memory sites: bytes accessed */
	__u32 flags;       /* EGPU_F_* */
	__u32 kind;        /* EGPU_KIND_* */
	__u64 args[EGPU_MAX_ARGS]; /* the kernel's first parameters, each zero-extended to 64 bits */
	__u32 nargs;       /* 0, args all 0, in launch probes and on the SASS back end: neither sees them */
	__u32 grid[3];     /* gridDim (kernel sites too: %nctaid) */
	__u32 block[3];    /* blockDim (kernel sites too: %ntid) */
	__u32 pad;
	__u64 stream;      /* the CUstream handle: launch probes; kernel sites on the SASS back end */
};
_Static_assert(sizeof(struct egpu_ctx) == 144, "struct egpu_ctx must match egpu_preload/bpf/ctx.py");

/* ---- Warp memory records: one ring record per warp instruction (egpu_preload/output/warp_records.py). ----
 * Called from a thread-scope memory probe (egpu/mem/GLOB, not .warp: the helper elects its own leader
 * among the lanes that call it), egpu_warp_mem_record(&ring, ctx) has the lanes that make the access
 * together (same site, size and flags) write one struct egpu_warp_mem, by the lowest of them: what
 * they share, their mask, and their addresses as a stride (affine lanes) or a tail of one s32 offset from
 * base (EGPU_WARP_OFFSETS) or one u64 address (EGPU_WARP_ADDRS) per active lane, in lane order. The reader
 * expands it into the per-lane records of a per-thread trace (examples/access_trace.bpf.c's struct
 * mem_event). Returns 0; a record the ring has no room for is dropped and counted, as ringbuf_output's. */
enum egpu_warp_form { EGPU_WARP_AFFINE = 0, EGPU_WARP_OFFSETS = 1, EGPU_WARP_ADDRS = 2 };

struct egpu_warp_mem {
	__u64 ts;            /* the leader's %globaltimer */
	__u64 base;          /* the leader's (lowest active lane's) address */
	__u64 kernel_id;
	__u64 launch_id;
	__s64 stride;        /* EGPU_WARP_AFFINE: lane i's address is base + stride * (i - leader) */
	__u32 site;
	__u32 mask;          /* bit i: lane i made the access */
	__u32 block[3];      /* blockIdx */
	__u16 block_dim[2];  /* blockDim.x, .y: a lane's threadIdx from its linear index warp * 32 + lane */
	__u16 warp;          /* the warp's index in its block: linear thread index / 32 */
	__u16 sm;
	__u16 size;          /* bytes each lane accessed */
	__u8 flags;          /* EGPU_F_* */
	__u8 form;           /* enum egpu_warp_form; the tail follows */
};
_Static_assert(sizeof(struct egpu_warp_mem) == 72, "struct egpu_warp_mem must match output/warp_records.py");

/* The helper proper: site, flags and size packed as the inline below does. */
static long (*bpf_egpu_warp_mem_record)(void *ringbuf, __u64 addr, __u64 kernel_id, __u64 launch_id,
					__u64 site_flags_size) = (void *)1000;

static __always_inline long egpu_warp_mem_record(void *ringbuf, const struct egpu_ctx *ctx)
{
	return bpf_egpu_warp_mem_record(ringbuf, ctx->addr, ctx->kernel_id, ctx->launch_id,
					(__u64)ctx->site << 32 | (__u64)(ctx->flags & 0xffff) << 16 | (ctx->size & 0xffff));
}

/* ---- The context of egpu/uvm probes (egpu_preload/bpf/ctx.py UVM_CTX is the ABI). ----
 * One record of CUPTI's unified-memory counters (runtime/uvm.py), delivered within about 100 ms of CUPTI
 * recording it (its buffers are flushed that often), in CUPTI's order. bpf_ktime_get_ns() in the probe
 * is start_ns. */
enum egpu_uvm_kind {
	EGPU_UVM_HTOD = 1,           /* migration host -> device: bytes */
	EGPU_UVM_DTOH = 2,           /* migration device -> host: bytes */
	EGPU_UVM_CPU_PAGE_FAULT = 3, /* value: the faulting instruction's PC; no end time */
	EGPU_UVM_GPU_PAGE_FAULT = 4, /* value: fault groups for the page; flags: access type */
	EGPU_UVM_THRASHING = 5,      /* bytes of the region; no end time */
	EGPU_UVM_THROTTLING = 6,
	EGPU_UVM_REMOTE_MAP = 7,     /* bytes; no end time */
	EGPU_UVM_DTOD = 8,           /* migration device -> device: bytes */
};

struct egpu_uvm_ctx {
	__u64 addr;      /* the first page's virtual address (faults: the faulting page) */
	__u64 bytes;     /* migrations, thrashing, remote maps: bytes moved or concerned; faults: 0 */
	__u64 value;     /* CUPTI's value as it is (bytes, fault groups, or a CPU fault's PC) */
	__u64 start_ns;  /* CLOCK_REALTIME ns */
	__u64 end_ns;    /* == start_ns where CUPTI gives no end */
	__u32 kind;      /* EGPU_UVM_* */
	__u32 flags;     /* GPU faults: access type (1 read, 2 write, 3 atomic, 4 prefetch); migrations: cause
	                    (1 user, 2 coherence, 3 prefetch, 4 eviction, 5 access counters) */
	__u32 src;       /* source processor (CUPTI's device id; the CPU has its own) */
	__u32 dst;       /* destination processor */
	__u32 stream;    /* CUPTI's stream id (CUPTI says it is not valid for these records) */
	__u32 pad;
};
_Static_assert(sizeof(struct egpu_uvm_ctx) == 64, "struct egpu_uvm_ctx must match egpu_preload/bpf/ctx.py");

/* ---- The context of a host-API section (egpu/memcpy, memset, alloc, free, sync): one driver call, seen
 * after it returned. Its fields start where struct egpu_ctx's end, so the verifier refuses a GPU field read
 * in a host section and the reverse (egpu_preload/bpf/ctx.py HOST is the ABI). ---- */
enum egpu_copy_kind { /* egpu/memcpy: direction (cuMemcpy/cuMemcpyAsync: by the pointers' memory types) */
	EGPU_COPY_H2D = 1, EGPU_COPY_D2H = 2, EGPU_COPY_D2D = 3, EGPU_COPY_H2H = 4, EGPU_COPY_PEER = 5,
	EGPU_COPY_SET = 6 /* egpu/memset */
};
enum egpu_alloc_kind { /* egpu/alloc and egpu/free */
	EGPU_ALLOC_DEVICE = 1, EGPU_ALLOC_PITCH = 2, EGPU_ALLOC_MANAGED = 3, EGPU_ALLOC_POOL = 4,
	EGPU_ALLOC_HOST = 5, EGPU_ALLOC_HOST_REGISTERED = 6, EGPU_ALLOC_VMM_HANDLE = 7, EGPU_ALLOC_VMM_MAPPING = 8
};
enum egpu_sync_kind { EGPU_SYNC_STREAM = 1, EGPU_SYNC_EVENT = 2, EGPU_SYNC_CONTEXT = 3 };
enum egpu_host_flags {
	EGPU_HOST_F_ASYNC = 1,      /* an ...Async call */
	EGPU_HOST_F_PER_THREAD = 2, /* the _ptds/_ptsz twin (stream 0 means the per-thread stream) */
	EGPU_HOST_F_STRIDED = 4,    /* 2D/3D */
	EGPU_HOST_F_GRAPH = 8       /* goes into a CUDA graph (made while its stream was captured, or a node
	                               added): the graph's replays repeat it without another call */
};

struct egpu_host_ctx {
	__u8 __egpu_ctx_part[144];  /* reserved: struct egpu_ctx's offsets */
	__u64 api_id;      /* FNV-1a 64 of the driver symbol called, e.g. "cuMemcpyHtoDAsync_v2" */
	union {
		__u64 dst;     /* copy/set: the destination */
		__u64 addr;    /* alloc/free: the address */
	};
	__u64 src;         /* copy: the source; set: the value */
	__u64 bytes;       /* bytes copied, set or allocated (2D/3D: width x height x depth); free: 0 */
	__u64 stream;      /* the CUstream (0: legacy default stream; per-thread twins: 2) */
	__u64 handle;      /* sync: the event or stream waited for; pool alloc: the pool */
	__u64 blocked_ns;  /* ns the calling thread spent in the call (sync: blocked; a sync copy: its duration) */
	__u32 kind;        /* enum egpu_copy_kind / egpu_alloc_kind / egpu_sync_kind */
	__u32 flags;       /* enum egpu_host_flags */
	__s32 result;      /* the CUresult the driver returned (0: success) */
	__u32 pad;
};
_Static_assert(sizeof(struct egpu_host_ctx) == 216, "struct egpu_host_ctx must match egpu_preload/bpf/ctx.py");

/* Legacy map definitions in SEC("maps"), for probes written before BTF-defined maps. */
struct egpu_map_def {
	unsigned int type;
	unsigned int key_size;
	unsigned int value_size;
	unsigned int max_entries;
	unsigned int map_flags;
};

#endif /* __EGPU_BPF_H__ */
