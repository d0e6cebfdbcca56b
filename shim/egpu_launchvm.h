/* egpu_launchvm.h: launch probes run in C (shim/launchvm.c), in the three parts of egpu_shim.h.
 *
 * An eBPF interpreter with the reference VM's semantics (egpu_preload/vm/machine.py, RFC 9669) and the
 * host maps a launch probe needs (ARRAY, PERCPU_ARRAY, HASH, LRU_HASH, PERCPU_HASH, LRU_PERCPU_HASH, QUEUE,
 * STACK, BLOOM_FILTER, global data), so that the runtime's thread turns launch records into map updates
 * without Python: a few hundred ns a record where the Python VM took tens of us. egpu_preload/runtime/native.py
 * decides which probe objects run here (only maps of those types, and helpers listed in launchvm.c), the rest
 * stay on the Python VM.
 *
 * Addresses are the VM's: region k at k << 36 (the context, one region per call frame, one per map's
 * values), every access bounds-checked against the value it falls in, so a verifier bug faults the run
 * instead of the application. As in the kernel (and unlike the VM, which keeps an orphaned value), a
 * pointer kept across a delete or an eviction reaches the slot's next value.
 * Threads: runs take no process-wide lock; a hash map has a lock of its own, arrays none, and a list of
 * programs replaced waits for the runs that may still read it (egpu_lvm_synchronize). The rule is in
 * launchvm.c's header.
 */
#ifndef EGPU_LAUNCHVM_H
#define EGPU_LAUNCHVM_H

/* ---- part 1: implemented in Python (embedding_api) ---- */

/* ---- part 2: C API for the runtime (cdef) ---- */

struct egpu_lvm_map;
struct egpu_lvm_prog;
struct egpu_lvm_router;

/* Why a run stopped early (the VM's VmError, by kind). */
enum egpu_lvm_fault {
    EGPU_LVM_OK = 0, EGPU_LVM_BAD_ACCESS, EGPU_LVM_READ_ONLY, EGPU_LVM_UNALIGNED, EGPU_LVM_NOT_A_MAP,
    EGPU_LVM_BAD_INSN, EGPU_LVM_DEPTH, EGPU_LVM_BUDGET, EGPU_LVM_NO_MEMORY
};

struct egpu_lvm_stats {
    unsigned long long runs, faults;
    int fault;                      /* the first fault: enum egpu_lvm_fault */
    unsigned int fault_pc;          /* its instruction */
    unsigned long long fault_launch;/* its launch id */
};

/* A map of `type` (bpf/program.py MAP_*); NULL for another type, a shape past launchvm.c's limits, an
 * array key other than 4 bytes, a queue, stack or bloom filter with a key, or no memory. `initial` (may be
 * NULL) fills the start of value 0, as global data's initial bytes; a read-only map refuses writes.
 * `map_extra`: a bloom filter's hash count (0: 5), as Linux's. */
struct egpu_lvm_map *egpu_lvm_map_new(int type, unsigned int key_size, unsigned int value_size,
                                      unsigned int max_entries, int readonly, const void *initial,
                                      size_t initial_size, unsigned int map_extra);
void egpu_lvm_map_free(struct egpu_lvm_map *m);
/* Log the keys programs change in `m` (a map GPU programs share: the runtime copies them into the
 * device's copy, runtime/mapsync.py): updated and deleted keys, and looked-up values written through
 * the pointer (compared after the run, as launches.py's Touched does). */
void egpu_lvm_map_track(struct egpu_lvm_map *m);
/* Take up to `max` of the logged keys, oldest first, each with its value now in `values` and
 * present[k] = 1 (0: the key is gone; its value zeros). Returns how many were logged before the take. */
size_t egpu_lvm_map_changes(struct egpu_lvm_map *m, void *keys, void *values, unsigned char *present,
                            size_t max);
/* Put n entries (keys key_size each, values value_size each) into `m` as BPF_ANY updates (a queue or stack:
 * pushes, oldest first), logging none
 * (a live probe's host copy of a shared map starts from the device's, live.py); returns how many went in
 * (fewer: the map is full). */
size_t egpu_lvm_map_load(struct egpu_lvm_map *m, const void *keys, const void *values, size_t n);
/* Copy up to `max` entries, in the order the reference VM keeps them (index order; hash: insertion
 * order, LRU: least recent first; queue and stack: oldest first, no key; a bloom filter has none), into
 * keys (key_size each) and values (value_size each); returns how many the map holds. */
size_t egpu_lvm_map_read(struct egpu_lvm_map *m, void *keys, void *values, size_t max);
/* A bloom filter's bits, which egpu_lvm_map_read and egpu_lvm_map_load pass over (maps.py BloomStorage.bits:
 * bit b is byte b / 8's bit b % 8): `load` 0 copies them into `bits`, 1 ORs `bits` into them, `size` bytes at
 * most; returns how many bytes they take (0: no bloom filter). */
size_t egpu_lvm_map_bits(struct egpu_lvm_map *m, void *bits, size_t size, int load);

/* A program (`n` eBPF slots, map references as lddw map-index pseudo sources) over `maps`; NULL when
 * memory is out. The maps must outlive it. */
struct egpu_lvm_prog *egpu_lvm_prog_new(const void *insns, size_t n, struct egpu_lvm_map *const *maps,
                                        size_t nmaps);
void egpu_lvm_prog_free(struct egpu_lvm_prog *p);
void egpu_lvm_prog_stats(const struct egpu_lvm_prog *p, struct egpu_lvm_stats *out);
/* vm.execute's contract (tests/isa_cases.py): r1 = mem (writable, len bytes), r2 = len. Returns the
 * fault (0: none), r0 in *r0, the faulting pc in *pc. */
int egpu_lvm_exec(struct egpu_lvm_prog *p, void *mem, size_t len, unsigned long long *r0, unsigned int *pc);

/* One bpf_trace_printk call of a program in C, formatted by the runtime (maps.TraceRecord): the format's
 * first EGPU_LVM_TRACE_FMT bytes (a longer one is cut there) and the three arguments. Or (map >= 0) one
 * record a bpf_ringbuf_output or bpf_perf_event_output call sent to the program's map `map`, in fmt (a
 * record longer than EGPU_LVM_TRACE_FMT is refused: the helper returns -E2BIG). */
enum { EGPU_LVM_TRACE_FMT = 256 };
struct egpu_lvm_trace {
    const struct egpu_lvm_prog *prog;
    int map;
    unsigned long long args[3];
    unsigned int size;
    unsigned char fmt[256];
};
/* Take up to `max` of the trace records programs made, oldest first, into `out`; returns how many. */
size_t egpu_lvm_trace_take(struct egpu_lvm_trace *out, size_t max);
/* Called by the thread that takes (egpu_lvm_trace_take), the runtime's, as it starts and before it ends: from
 * stall_ns > 0 on, a run whose record finds the buffer full waits for room (egpu-run --on-full wait) until the
 * take has not run for stall_ns (the record then lost, as under 0: no wait). launchvm.c's trace_waits says which
 * runs never wait. */
void egpu_lvm_trace_wait(unsigned long long stall_ns);
/* Take what program p's runs lost to a full trace buffer since the last take, by kind, into `lost` (its
 * nmaps + 1 entries): lost[0] bpf_printk lines, lost[1 + k] bpf_ringbuf_output, bpf_ringbuf_submit and
 * bpf_perf_event_output records for map k. */
void egpu_lvm_prog_lost(const struct egpu_lvm_prog *p, unsigned long long *lost);

/* Which programs each launched handle runs: filled by the runtime as it meets handles. */
struct egpu_lvm_router *egpu_lvm_router_new(void);
void egpu_lvm_router_free(struct egpu_lvm_router *r);
/* Launches of `function` run `progs` with ctx->kernel_id = kernel_id, and go on to the runtime's
 * Python programs too when `python`. Returns 0, or -1 when memory is out. */
int egpu_lvm_route(struct egpu_lvm_router *r, void *function, unsigned long long kernel_id,
                   struct egpu_lvm_prog *const *progs, size_t nprogs, int python);
/* Forget every route. */
void egpu_lvm_router_clear(struct egpu_lvm_router *r);
/* Run the routed programs on one record (ktime = time_ns + offset_ns); 0, or -1 if not routed. */
int egpu_lvm_run(struct egpu_lvm_router *r, const struct egpu_launch_record *rec, long long offset_ns);
/* Take records from the shim's ring (egpu_shim_drain) in launch order and run their programs, until
 * the ring is empty, `max` records are in `out`, or one's handle is not routed yet. `out` gets the
 * records the runtime must still see: those routed with `python`, and the unrouted one (last; the
 * runtime routes it, then egpu_lvm_run). Returns how many are in `out`; *taken: records taken. */
size_t egpu_lvm_drain(struct egpu_lvm_router *r, struct egpu_launch_record *out, size_t max,
                      long long offset_ns, unsigned long long *taken);
/* struct egpu_ctx of a launch probe for `rec` (144 bytes; egpu_preload/bpf/ctx.py). */
void egpu_lvm_context(const struct egpu_launch_record *rec, unsigned long long kernel_id, void *out);

/* Host-API probes (shim/hostapi.c): calls of API `api` (an index of egpu_host_apis) run `progs` in the
 * calling thread from now on (n 0: none; the previous list is forgotten once no run reads it, so its
 * programs may be freed once this returns). Returns 0, or -1 when memory is out or `api` is past
 * EGPU_LVM_APIS. */
int egpu_lvm_route_api(unsigned int api, struct egpu_lvm_prog *const *progs, size_t n);
/* ktime_get_ns in host-API probes: CLOCK_MONOTONIC + offset_ns (the launch probes' offset, kept equal). */
void egpu_lvm_api_clock(long long offset_ns);

/* ---- part 3: C only ---- */

/* Host probes (shim/uprobe.c): read which programs to run, and run them with egpu_lvm_run_host, between
 * egpu_lvm_enter and egpu_lvm_leave (a read section: any number of threads at once, nothing waited for);
 * a list of programs is changed by publishing a new one (an atomic store), then egpu_lvm_synchronize,
 * which returns once every read section that began before it has ended: then the old list may be reused
 * and its programs freed. Never call it inside a read section (it would wait for itself). A run is on a
 * read-only context of `size` bytes; ktime_get_ns reads CLOCK_MONOTONIC + offset_ns when called. */
typedef _Atomic long *egpu_lvm_reader;
egpu_lvm_reader egpu_lvm_enter(void);
void egpu_lvm_leave(egpu_lvm_reader in);
void egpu_lvm_synchronize(void);
/* Nonzero while this thread is in a run or a read section, or holds or waits for a lock of launchvm.c's: a
 * uprobe then runs no program (a signal handler that interrupted the holder could wait for itself). */
extern __thread int egpu_lvm_held __attribute__((tls_model("initial-exec")));
void egpu_lvm_run_host(struct egpu_lvm_prog *p, void *ctx, size_t size, long long offset_ns);

#define EGPU_LVM_APIS 256          /* host APIs a route can name (hostapi.c checks its table fits) */
/* Whether calls of `api` run programs now: one relaxed load, for the hooks' fast path. */
int egpu_lvm_api_routed(unsigned int api);
/* Run `api`'s programs on `ctx` (`size` bytes, read-only to them), ktime = now on egpu_lvm_api_clock's clock;
 * none from a signal handler on a thread counted in egpu_lvm_held. */
void egpu_lvm_run_api(unsigned int api, const void *ctx, size_t size);

#endif
