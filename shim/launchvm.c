/* launchvm.c: launch probes in C. The interface and its contract are egpu_launchvm.h; the semantics
 * are the reference VM's (egpu_preload/vm/machine.py, calls.py, maps.py), which the tests hold this
 * file to: tests/isa_cases.py run here, and every launch probe run on both over the same records.
 *
 * Threads. Runs take no process-wide lock: host uprobes and host-API probes run in whichever application
 * threads call their functions, at once, each run with state of its own (struct run: on the caller's
 * stack for uprobes and launch records, a per-thread block for host-API probes). What they share is made
 * safe as Linux makes BPF maps safe:
 * - array values are updated in place with no lock (a lookup is an index); a program's atomic instructions
 *   (BPF_ATOMIC) are the host's atomics on the value's memory, plain stores are not.
 * - a per-CPU array's or per-CPU hash's value is the running CPU's own in Linux, so programs update it with
 *   plain loads and stores; every host thread here is CPU 0, so the runs of a program that uses one take
 *   turns (cpu_lock), as runs on one CPU do. A per-CPU hash is thus a hash of CPU 0's values (the runtime
 *   puts them in SM 0's row of the device's copy: runtime/mapsync.py).
 * - a hash or LRU hash map has a lock of its own (struct spin), held across its index, its use order and
 *   an update's copy of the value. Its values are preallocated slots that live as long as the map: a
 *   pointer a lookup handed out stays valid memory, and after a delete or an eviction reaches the slot's
 *   next value (Linux's preallocated hash maps reuse an element so too, BPF_F_NO_PREALLOC aside).
 * - the keys a tracked map logs (dirty_add) are under that map's lock, an array's included. A run that wrote
 *   through a pointer logs the key when the value at its end differs from the one its lookup saw, and
 *   whatever the value when another run or the runtime's take looked at that map meanwhile (watch). A run
 *   with more lookups than it can keep values of logs the rest at the lookup, and until it ends a take
 *   leaves that map's keys logged (overflowing), so what it writes after a take reaches the next one.
 * - the records for the runtime (trace_printk, ring and perf buffer output) are under trace_lock.
 * - a program's counts (stats) are atomic; the first fault's details may trail its count for a moment.
 * Which programs run is read inside a read section (egpu_lvm_enter / egpu_lvm_leave: a count per epoch
 * parity, sharded by thread). A change to those lists (uprobe.c's hooks, egpu_lvm_route_api) publishes a
 * new list with one atomic store, then egpu_lvm_synchronize waits until every run that may have read the
 * old one has left (Linux's SRCU); only then is the old list reused or freed, or the detach returns: so no
 * program runs after the call that took it away returned. Launch records (egpu_lvm_run, egpu_lvm_drain) and
 * their routes, on the runtime's threads, share one mutex (route_lock). Any of these a thread holds or is
 * inside counts in egpu_lvm_held: a signal handler that interrupts it runs no probe (it could wait for
 * itself). Fork (egpu_lvm_fork) takes every lock, so that the child finds no map mid-update. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "egpu_shim.h"
#include "egpu_launchvm.h"
#include "egpu_gate.h" /* egpu_now_ns */

#define EXPORT __attribute__((visibility("default")))

enum { MAP_HASH = 1, MAP_ARRAY = 2, MAP_PERCPU_HASH = 5, MAP_PERCPU_ARRAY = 6, MAP_LRU_HASH = 9,
       MAP_LRU_PERCPU_HASH = 10, MAP_QUEUE = 22, MAP_STACK = 23, MAP_BLOOM_FILTER = 30 }; /* bpf/program.py */
enum { BPF_ANY, BPF_NOEXIST, BPF_EXIST };

#define REGION_SHIFT 36
#define OFFSET_MASK ((1ull << REGION_SHIFT) - 1)
#define MAX_FRAMES 8 /* the kernel's MAX_CALL_FRAMES */
#define STACK_SIZE 512
#define BUDGET 10000000
/* Regions: 0 is NULL's, then the context, a frame per call depth, then each map's values. */
#define R_CTX 1ull
#define R_FRAME 2ull
#define R_MAP (R_FRAME + MAX_FRAMES)
/* lddw map[k]: a handle in a region past any map's, so no access can use it (vm/machine.py's). */
#define MAP_HANDLE(k) ((((1ull << 27) - 1) << REGION_SHIFT) + (k))
/* lddw of a function's address (src 4, bpf_loop's callback): a handle past every map's, as the VM's */
#define FUNC_HANDLE(pc) (MAP_HANDLE(0) + (1ull << 32) + (pc))
#define HELPER_LOOP 181     /* bpf_loop: step() runs it, as it calls code of the program */
#define MAX_LOOPS (1u << 23) /* bpf_loop's BPF_MAX_LOOPS */
#define ROUND SIZE_MAX      /* the return pc of a bpf_loop callback's frame: its exit ends the round */
/* bpf_ringbuf_reserve's records: up to RESERVED held at once by a run, each a region below the handles'. */
#define RESERVED 4
#define R_RESERVED(k) ((1ull << 27) - 2 - (k))
#define TOMB (-1)
/* Shapes a map may have here (runtime/native.py sends larger ones to the Python VM): sizes stay far
 * from overflowing an int slot number or a size_t product. */
#define MAX_ENTRIES (1u << 24)
#define MAX_VALUE (1u << 20)
#define WATCHES 16
#define WATCH_BYTES 2048
#define OVERFLOWS 64 /* as many maps as Linux lets a program use (MAX_USED_MAPS) */

/* struct egpu_ctx (egpu_preload/bpf/ctx.py; test_launchvm.py compares egpu_lvm_context with it) */
#define CTX_SIZE 144
#define CTX_KERNEL_ID 0
#define CTX_LAUNCH_ID 8
#define CTX_KIND 36
#define CTX_GRID 108
#define CTX_BLOCK 120
#define CTX_STREAM 136
#define KIND_LAUNCH 3

__thread int egpu_lvm_held __attribute__((tls_model("initial-exec")));

/* Counted in before a lock is asked for or a run starts, out after: a signal handler on this thread meanwhile
 * that calls a function with a uprobe must not wait for that lock (uprobe.c). The fences keep the compiler
 * from moving the count past what it guards (a handler runs on this thread: no CPU fence is needed). */
static void hold(void) {
    egpu_lvm_held++;
    atomic_signal_fence(memory_order_seq_cst);
}

static void unhold(void) {
    atomic_signal_fence(memory_order_seq_cst);
    egpu_lvm_held--;
}

/* A hash map's lock, and trace_lock: held for a few hundred ns at most, by threads that are running
 * (never across a wait), so spinning beats sleeping, and its release is a plain store where a mutex's is an
 * atomic exchange. A holder the scheduler took off its CPU (two CPUs, eight threads) is let run: after
 * SPINS turns the waiter yields. (Not yet timed against a pthread mutex on a contended hash map.) */
struct spin { atomic_int held; };
#define SPINS 64

static void spin_lock(struct spin *l) {
    hold();
    for (int n = 0; atomic_exchange_explicit(&l->held, 1, memory_order_acquire); n++) {
        while (atomic_load_explicit(&l->held, memory_order_relaxed))
            if (++n < SPINS) __builtin_ia32_pause();
            else n = 0, sched_yield();
    }
}

static void spin_unlock(struct spin *l) {
    atomic_store_explicit(&l->held, 0, memory_order_release);
    unhold();
}

/* ---- the read section: which programs run ---- */

/* Runs in flight, by the parity of the epoch they started in, spread over READERS counts (a thread keeps
 * one: tls_reader) so that threads on different CPUs touch different cache lines. */
#define READERS 64
static struct { atomic_long n; char pad[64 - sizeof(atomic_long)]; } readers[2][READERS] __attribute__((aligned(64)));
static atomic_uint epoch, next_reader;
static __thread unsigned int tls_reader __attribute__((tls_model("initial-exec"))); /* its count + 1 */
static pthread_mutex_t sync_lock = PTHREAD_MUTEX_INITIALIZER; /* one egpu_lvm_synchronize at a time */
/* egpu_lvm_synchronize calls under way: a run waiting for room in the trace queue gives up (trace_waits), since
 * the change may hold what the drain thread needs (a live detach pauses uprobes under the drain's lock). */
static atomic_int synchronizing;

egpu_lvm_reader egpu_lvm_enter(void) {
    hold();
    if (!tls_reader) tls_reader = atomic_fetch_add_explicit(&next_reader, 1, memory_order_relaxed) % READERS + 1;
    unsigned int e = atomic_load_explicit(&epoch, memory_order_acquire);
    atomic_long *n = &readers[e & 1][tls_reader - 1].n;
    atomic_fetch_add_explicit(n, 1, memory_order_seq_cst); /* before any read of a list: a full fence */
    return n;
}

void egpu_lvm_leave(egpu_lvm_reader n) {
    atomic_fetch_sub_explicit(n, 1, memory_order_release);
    unhold();
}

/* Both parities in turn: a run that read its epoch before an earlier flip may count in either (SRCU's two
 * flips). Each wait ends: runs that start after a flip count in the other parity. */
void egpu_lvm_synchronize(void) {
    atomic_fetch_add(&synchronizing, 1);
    pthread_mutex_lock(&sync_lock);
    for (int flip = 0; flip < 2; flip++) {
        unsigned int old = atomic_fetch_add_explicit(&epoch, 1, memory_order_seq_cst) & 1;
        for (int k = 0; k < READERS; k++)
            while (atomic_load_explicit(&readers[old][k].n, memory_order_seq_cst)) sched_yield();
    }
    pthread_mutex_unlock(&sync_lock);
    atomic_fetch_sub(&synchronizing, 1);
}

/* ---- maps ---- */

struct egpu_lvm_map {
    struct spin lock;         /* a hash map's index, order and slots, and every map's dirty keys */
    struct egpu_lvm_map *older, *newer; /* every map (all_maps), for fork */
    int type, readonly;
    unsigned int key_size, value_size, max_entries;
    size_t stride;            /* between values: value_size rounded up to 8, so 8-byte atomics align */
    int stride_shift;         /* log2(stride) where it is a power of two, else -1 (at() divides then) */
    unsigned char *values;    /* max_entries + 1 slots of stride (a queue ring's one free); a bloom filter: 1, unused */
    /* hash maps */
    unsigned char *keys;      /* max_entries * key_size */
    int *index;               /* open addressing over slots: slot + 1, 0 empty, TOMB deleted */
    unsigned int index_mask, used, tombs;
    int *prev, *next, head, tail; /* live slots in the VM's order: insertion (LRU: use), oldest first */
    int *free_slots, nfree;
    unsigned char *scratch;   /* an update's key and value, copied before anything moves */
    /* shared with GPU programs (egpu_lvm_map_track): the keys changed since the runtime last took them */
    atomic_int track;
    /* runs holding values of it they looked up (watch), and a count of those lookups and of the runtime's
     * takes: a run whose look overlapped another's or a take logs the keys it looked at (settle) */
    atomic_uint watching, watch_gen;
    /* runs in flight that logged a key of it at their lookup, not their end (their watches were full): while
     * any is, a take leaves the keys it copies logged, so that what such a run writes after the take reaches
     * the next one */
    atomic_uint overflowing;
    unsigned char *dirty;     /* the keys, in the order they changed */
    size_t ndirty, dirty_mask;
    uint32_t *dirty_index;    /* open addressing over them: position + 1, 0 empty */
    /* queues and stacks (queue_stack_maps.c): values in a ring of max_entries + 1 slots, oldest at qtail, the
     * next push's at qhead, both under m->lock */
    unsigned int qhead, qtail;
    /* bloom filters: bits (program.py MapDef.bloom_bits, a power of two) and hash functions */
    unsigned char *bits;
    uint64_t bits_mask;
    unsigned int hashes;
};

static int is_hash_type(int type) {
    return type == MAP_HASH || type == MAP_LRU_HASH || type == MAP_PERCPU_HASH || type == MAP_LRU_PERCPU_HASH;
}

static int is_hash(const struct egpu_lvm_map *m) {
    return is_hash_type(m->type);
}

static int is_lru(const struct egpu_lvm_map *m) {
    return m->type == MAP_LRU_HASH || m->type == MAP_LRU_PERCPU_HASH;
}

/* A map whose values are per CPU: CPU 0's here (runs of programs using one take turns: cpu_lock). */
static int is_percpu(const struct egpu_lvm_map *m) {
    return m->type == MAP_PERCPU_ARRAY || m->type == MAP_PERCPU_HASH || m->type == MAP_LRU_PERCPU_HASH;
}

/* A map of values without keys: a queue, a stack or a bloom filter (push, pop, peek). */
static int is_keyless(int type) {
    return type == MAP_QUEUE || type == MAP_STACK || type == MAP_BLOOM_FILTER;
}

static struct egpu_lvm_map *all_maps; /* the newest */
static pthread_mutex_t maps_lock = PTHREAD_MUTEX_INITIALIZER;

static void map_listed(struct egpu_lvm_map *m, int listed) {
    pthread_mutex_lock(&maps_lock);
    if (listed) {
        m->older = all_maps, m->newer = NULL;
        if (all_maps) all_maps->newer = m;
        all_maps = m;
    } else {
        if (m->older) m->older->newer = m->newer;
        if (m->newer) m->newer->older = m->older; else all_maps = m->older;
    }
    pthread_mutex_unlock(&maps_lock);
}

EXPORT void egpu_lvm_map_free(struct egpu_lvm_map *m) {
    if (!m) return;
    map_listed(m, 0);
    free(m->values), free(m->keys), free(m->index), free(m->prev), free(m->next), free(m->free_slots);
    free(m->scratch), free(m->dirty), free(m->dirty_index), free(m->bits), free(m);
}

EXPORT struct egpu_lvm_map *egpu_lvm_map_new(int type, unsigned int key_size, unsigned int value_size,
                                             unsigned int max_entries, int readonly, const void *initial,
                                             size_t initial_size, unsigned int map_extra) {
    int hash = is_hash_type(type), keyless = is_keyless(type);
    if (!hash && !keyless && type != MAP_ARRAY && type != MAP_PERCPU_ARRAY) return NULL;
    if (max_entries > MAX_ENTRIES || !value_size || value_size > MAX_VALUE || key_size > MAX_VALUE ||
        (keyless ? key_size != 0 || !max_entries : !key_size) || (!hash && !keyless && key_size != 4))
        return NULL;
    struct egpu_lvm_map *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    *m = (struct egpu_lvm_map){.type = type, .readonly = readonly, .key_size = key_size, .value_size = value_size,
                               .max_entries = max_entries, .stride = (value_size + 7u) & ~7u};
    m->head = m->tail = -1;
    m->stride_shift = m->stride & (m->stride - 1) ? -1 : __builtin_ctzll(m->stride);
    /* a bloom filter keeps bits, no values: max_entries of them (2^24 of 1 MiB) need not fit */
    m->values = calloc(type == MAP_BLOOM_FILTER ? 1 : (size_t)max_entries + 1, m->stride);
    m->scratch = malloc((size_t)key_size + value_size + 1);
    int ok = m->values && m->scratch;
    if (ok && hash) {
        unsigned int size = 8;
        while (size < 2u * max_entries + 2) size <<= 1; /* at most 2^26: MAX_ENTRIES */
        m->index_mask = size - 1;
        m->index = calloc(size, sizeof *m->index);
        m->keys = malloc((size_t)max_entries * key_size + 1);
        m->prev = malloc(((size_t)max_entries + 1) * sizeof(int));
        m->next = malloc(((size_t)max_entries + 1) * sizeof(int));
        m->free_slots = malloc(((size_t)max_entries + 1) * sizeof(int));
        ok = m->index && m->keys && m->prev && m->next && m->free_slots;
        for (unsigned int i = 0; ok && i < max_entries; i++) m->free_slots[i] = (int)(max_entries - 1 - i);
        m->nfree = (int)max_entries;
    }
    if (ok && type == MAP_BLOOM_FILTER) { /* bloom_filter.c's size: entries * hashes * 7 / 5 bits, a power of 2 */
        m->hashes = map_extra & 0xf ? map_extra & 0xf : 5;
        uint64_t want = (uint64_t)max_entries * m->hashes / 5 * 7, bits = 64;
        while (bits < want) bits <<= 1; /* at most 2^29: MAX_ENTRIES */
        m->bits_mask = bits - 1;
        ok = (m->bits = calloc(bits / 8, 1)) != NULL;
    }
    map_listed(m, 1);
    if (!ok) {
        egpu_lvm_map_free(m);
        return NULL;
    }
    if (initial && max_entries)
        memcpy(m->values, initial, initial_size < value_size ? initial_size : value_size);
    return m;
}

static unsigned int hash_key(const unsigned char *k, unsigned int n) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (unsigned int i = 0; i < n; i++) h = (h ^ k[i]) * 16777619u;
    return h;
}

/* The slot holding `key` (-1: none); *pos: its index entry, or where to insert it. */
static int hash_find(const struct egpu_lvm_map *m, const unsigned char *key, unsigned int *pos) {
    unsigned int i = hash_key(key, m->key_size) & m->index_mask, free_at = UINT32_MAX;
    for (;; i = (i + 1) & m->index_mask) {
        int e = m->index[i];
        if (e == 0) {
            *pos = free_at != UINT32_MAX ? free_at : i;
            return -1;
        }
        if (e == TOMB) {
            if (free_at == UINT32_MAX) free_at = i;
        } else if (!memcmp(m->keys + (size_t)(e - 1) * m->key_size, key, m->key_size)) {
            *pos = i;
            return e - 1;
        }
    }
}

static void unlink_slot(struct egpu_lvm_map *m, int s) {
    if (m->prev[s] >= 0) m->next[m->prev[s]] = m->next[s]; else m->head = m->next[s];
    if (m->next[s] >= 0) m->prev[m->next[s]] = m->prev[s]; else m->tail = m->prev[s];
}

static void link_tail(struct egpu_lvm_map *m, int s) {
    m->prev[s] = m->tail, m->next[s] = -1;
    if (m->tail >= 0) m->next[m->tail] = s; else m->head = s;
    m->tail = s;
}

/* Deleted entries make probes longer; past 3/4 full the index is rebuilt from the live slots. */
static void reindex(struct egpu_lvm_map *m) {
    memset(m->index, 0, ((size_t)m->index_mask + 1) * sizeof *m->index);
    m->tombs = 0;
    for (int s = m->head; s >= 0; s = m->next[s]) {
        unsigned int pos;
        hash_find(m, m->keys + (size_t)s * m->key_size, &pos);
        m->index[pos] = s + 1;
    }
}

static void hash_remove(struct egpu_lvm_map *m, int s, unsigned int pos) {
    m->index[pos] = TOMB;
    m->tombs++, m->used--;
    unlink_slot(m, s);
    m->free_slots[m->nfree++] = s;
}

static void dirty_reindex(struct egpu_lvm_map *m) {
    memset(m->dirty_index, 0, (m->dirty_mask + 1) * sizeof *m->dirty_index);
    for (size_t k = 0; k < m->ndirty; k++) {
        size_t i = hash_key(m->dirty + k * m->key_size, m->key_size) & m->dirty_mask;
        while (m->dirty_index[i]) i = (i + 1) & m->dirty_mask;
        m->dirty_index[i] = (uint32_t)(k + 1);
    }
}

/* Log `key` of a tracked map as changed (once until taken); -1 when memory is out. Under m->lock. */
static int dirty_add(struct egpu_lvm_map *m, const unsigned char *key) {
    if (!atomic_load_explicit(&m->track, memory_order_relaxed)) return 0;
    if (2 * (m->ndirty + 1) > m->dirty_mask + 1) { /* the index at most half full, the keys beside it */
        size_t mask = m->dirty_mask ? 2 * m->dirty_mask + 1 : 15;
        unsigned char *keys = realloc(m->dirty, (mask + 1) / 2 * m->key_size);
        if (!keys) return -1;
        m->dirty = keys;
        uint32_t *index = realloc(m->dirty_index, (mask + 1) * sizeof *index);
        if (!index) return -1;
        m->dirty_index = index, m->dirty_mask = mask;
        dirty_reindex(m);
    }
    size_t i = hash_key(key, m->key_size) & m->dirty_mask;
    for (; m->dirty_index[i]; i = (i + 1) & m->dirty_mask)
        if (!memcmp(m->dirty + (size_t)(m->dirty_index[i] - 1) * m->key_size, key, m->key_size)) return 0;
    memcpy(m->dirty + m->ndirty * m->key_size, key, m->key_size);
    m->dirty_index[i] = (uint32_t)++m->ndirty;
    return 0;
}

EXPORT void egpu_lvm_map_track(struct egpu_lvm_map *m) {
    spin_lock(&m->lock);
    atomic_store_explicit(&m->track, 1, memory_order_relaxed);
    spin_unlock(&m->lock);
}

static unsigned int array_index(const unsigned char *key) {
    uint32_t i;
    memcpy(&i, key, 4);
    return i;
}

/* The slot of `key` (-1: none), without counting as use. A hash map's under m->lock. */
static int map_peek(const struct egpu_lvm_map *m, const unsigned char *key) {
    unsigned int pos;
    if (is_keyless(m->type)) return -1;
    if (!is_hash(m)) return array_index(key) < m->max_entries ? (int)array_index(key) : -1;
    return hash_find(m, key, &pos);
}

/* The slot of `key` (-1: none). An LRU lookup counts as use (maps.py LruHashStorage). An array's is an index,
 * a hash map's taken under its lock. */
static int map_lookup(struct egpu_lvm_map *m, const unsigned char *key) {
    if (!is_hash(m)) return map_peek(m, key);
    spin_lock(&m->lock);
    int s = map_peek(m, key);
    if (s >= 0 && is_lru(m)) unlink_slot(m, s), link_tail(m, s);
    spin_unlock(&m->lock);
    return s;
}

/* maps.py's update, return codes and order of checks included (arraymap.c, hashtab.c). A hash map's under
 * m->lock (an array's value is copied in place without it). */
static long long map_update(struct egpu_lvm_map *m, const unsigned char *key, const unsigned char *value,
                            uint64_t flags) {
    if (flags > BPF_EXIST || is_keyless(m->type)) return -EINVAL;
    if (!is_hash(m)) {
        unsigned int i = array_index(key);
        if (i >= m->max_entries) return -E2BIG;
        if (flags == BPF_NOEXIST) return -EEXIST;
        memcpy(m->values + (size_t)i * m->stride, value, m->value_size);
        return 0;
    }
    /* key or value may point into this map's own values, which an eviction could reuse */
    memcpy(m->scratch, key, m->key_size);
    memcpy(m->scratch + m->key_size, value, m->value_size);
    key = m->scratch, value = m->scratch + m->key_size;
    unsigned int pos;
    int s = hash_find(m, key, &pos);
    if (s >= 0 && flags == BPF_NOEXIST) return -EEXIST;
    if (s < 0 && flags == BPF_EXIST) return -ENOENT;
    if (s < 0) {
        if (m->used >= m->max_entries) {
            if (!is_lru(m) || m->head < 0) return -E2BIG;
            unsigned int old;
            hash_find(m, m->keys + (size_t)m->head * m->key_size, &old);
            hash_remove(m, m->head, old);
            hash_find(m, key, &pos); /* the eviction may have freed an earlier entry of the probe */
        }
        if (m->used + m->tombs + 1 > (m->index_mask + 1) / 4 * 3) {
            reindex(m);
            hash_find(m, key, &pos);
        }
        s = m->free_slots[--m->nfree];
        memcpy(m->keys + (size_t)s * m->key_size, key, m->key_size);
        if (m->index[pos] == TOMB) m->tombs--;
        m->index[pos] = s + 1;
        m->used++;
        link_tail(m, s);
    } else if (is_lru(m)) {
        unlink_slot(m, s), link_tail(m, s);
    }
    memcpy(m->values + (size_t)s * m->stride, value, m->value_size);
    return 0;
}

/* Under m->lock. */
static long long map_delete(struct egpu_lvm_map *m, const unsigned char *key) {
    if (!is_hash(m)) return -EINVAL; /* array elements cannot be deleted */
    unsigned int pos;
    int s = hash_find(m, key, &pos);
    if (s < 0) return -ENOENT;
    hash_remove(m, s, pos);
    return 0;
}

/* ---- queues, stacks and bloom filters (maps.py QueueStorage, StackStorage, BloomStorage), under m->lock ---- */

static unsigned int ring_next(const struct egpu_lvm_map *m, unsigned int i) {
    return i + 1 > m->max_entries ? 0 : i + 1; /* max_entries + 1 slots: one stays free, full != empty */
}

static unsigned int queue_len(const struct egpu_lvm_map *m) {
    return (m->qhead + m->max_entries + 1 - m->qtail) % (m->max_entries + 1);
}

/* queue_stack_map_push_elem: BPF_EXIST makes room in a full map by dropping the oldest value. */
static long long queue_push(struct egpu_lvm_map *m, const unsigned char *value, uint64_t flags) {
    if (flags & BPF_NOEXIST || flags > BPF_EXIST) return -EINVAL;
    if (queue_len(m) == m->max_entries) {
        if (!(flags & BPF_EXIST)) return -E2BIG;
        m->qtail = ring_next(m, m->qtail);
    }
    memcpy(m->values + (size_t)m->qhead * m->stride, value, m->value_size);
    m->qhead = ring_next(m, m->qhead);
    return 0;
}

/* The slot pop or peek takes next: a queue's oldest, a stack's newest; -1 when empty. */
static int queue_next(const struct egpu_lvm_map *m) {
    if (m->qhead == m->qtail) return -1;
    if (m->type == MAP_QUEUE) return (int)m->qtail;
    return (int)(m->qhead ? m->qhead - 1 : m->max_entries);
}

static void queue_drop(struct egpu_lvm_map *m) {
    if (m->type == MAP_QUEUE) m->qtail = ring_next(m, m->qtail);
    else m->qhead = m->qhead ? m->qhead - 1 : m->max_entries;
}

/* maps.py bloom_hash: FNV-1a 32 over the function's index (4 bytes, little-endian), then the value. */
static uint64_t bloom_bit(const struct egpu_lvm_map *m, const unsigned char *value, uint32_t index) {
    uint32_t h = 2166136261u;
    for (int i = 0; i < 4; i++) h = (h ^ (index >> 8 * i & 0xff)) * 16777619u;
    for (unsigned int i = 0; i < m->value_size; i++) h = (h ^ value[i]) * 16777619u;
    return h & m->bits_mask;
}

/* bloom_map_push_elem (flags BPF_ANY only) and bloom_map_peek_elem (0: maybe there, -ENOENT: never pushed). */
static long long bloom(struct egpu_lvm_map *m, const unsigned char *value, int push, uint64_t flags) {
    if (push && flags != BPF_ANY) return -EINVAL;
    for (uint32_t i = 0; i < m->hashes; i++) {
        uint64_t b = bloom_bit(m, value, i);
        if (push) m->bits[b >> 3] |= (unsigned char)(1u << (b & 7));
        else if (!(m->bits[b >> 3] >> (b & 7) & 1)) return -ENOENT;
    }
    return 0;
}

EXPORT size_t egpu_lvm_map_read(struct egpu_lvm_map *m, void *keys, void *values, size_t max) {
    unsigned char *k = keys, *v = values;
    size_t n = 0;
    spin_lock(&m->lock); /* a hash map's order; array values change in place all the same */
    if (is_keyless(m->type)) { /* a queue's or stack's values, oldest first; a bloom filter's bits are none */
        for (unsigned int i = m->qtail; i != m->qhead; i = ring_next(m, i), n++)
            if (n < max) memcpy(v + n * m->value_size, m->values + (size_t)i * m->stride, m->value_size);
    } else if (!is_hash(m)) {
        for (; n < m->max_entries; n++) {
            if (n >= max) continue;
            uint32_t i = (uint32_t)n;
            memcpy(k + n * 4, &i, 4);
            memcpy(v + n * m->value_size, m->values + n * m->stride, m->value_size);
        }
    } else {
        for (int s = m->head; s >= 0; s = m->next[s], n++) {
            if (n >= max) continue;
            memcpy(k + n * m->key_size, m->keys + (size_t)s * m->key_size, m->key_size);
            memcpy(v + n * m->value_size, m->values + (size_t)s * m->stride, m->value_size);
        }
    }
    spin_unlock(&m->lock);
    return n;
}

EXPORT size_t egpu_lvm_map_load(struct egpu_lvm_map *m, const void *keys, const void *values, size_t n) {
    size_t k = 0;
    spin_lock(&m->lock);
    for (; k < n && m->type != MAP_BLOOM_FILTER; k++) { /* a bloom filter's bits are no entries: map_bits */
        const unsigned char *value = (const unsigned char *)values + k * m->value_size;
        if (is_keyless(m->type) ? queue_push(m, value, BPF_ANY)   /* a queue's or stack's, oldest first */
                                : map_update(m, (const unsigned char *)keys + k * m->key_size, value, BPF_ANY))
            break;
    }
    spin_unlock(&m->lock);
    return k;
}

EXPORT size_t egpu_lvm_map_bits(struct egpu_lvm_map *m, void *bits, size_t size, int load) {
    if (m->type != MAP_BLOOM_FILTER) return 0;
    size_t bytes = (size_t)(m->bits_mask + 1) / 8;
    unsigned char *b = bits;
    spin_lock(&m->lock);
    for (size_t i = 0; i < size && i < bytes; i++)
        if (load) m->bits[i] |= b[i];
        else b[i] = m->bits[i];
    spin_unlock(&m->lock);
    return bytes;
}

EXPORT size_t egpu_lvm_map_changes(struct egpu_lvm_map *m, void *keys, void *values, unsigned char *present,
                                   size_t max) {
    spin_lock(&m->lock);
    size_t total = m->ndirty, n = total < max ? total : max;
    for (size_t k = 0; k < n; k++) {
        const unsigned char *key = m->dirty + k * m->key_size;
        int s = map_peek(m, key);
        unsigned char *value = (unsigned char *)values + k * m->value_size;
        memcpy((unsigned char *)keys + k * m->key_size, key, m->key_size);
        present[k] = s >= 0;
        if (s >= 0) memcpy(value, m->values + (size_t)s * m->stride, m->value_size);
        else memset(value, 0, m->value_size);
    }
    if (n) {
        atomic_fetch_add(&m->watch_gen, 1); /* runs that looked at values meanwhile log them (settle) */
        if (!atomic_load(&m->overflowing)) { /* else kept: a run that logged them at lookup may write them yet */
            memmove(m->dirty, m->dirty + n * m->key_size, (total - n) * m->key_size);
            m->ndirty = total - n;
            dirty_reindex(m);
        }
    }
    spin_unlock(&m->lock);
    return total;
}

/* ---- programs ---- */

struct insn {
    uint8_t code, regs; /* regs: dst in the low nibble, src in the high */
    int16_t off;
    int32_t imm;
};

/* A program's instructions decoded once, when it is loaded, for execute()'s fast path: one operation per
 * operation, width and operand kind, taken only where every check the instruction needs holds whatever the
 * registers hold (registers in range, a known operation, a jump's target inside the program or its end,
 * where the run faults as it falls off). Anything else, and what is rare, is OP_SLOW: step() runs it from
 * the raw instruction, checking each field as it goes. Both paths are the VM's semantics for what the VM's
 * decoder accepts (the runtime hands C nothing else; reserved fields are not checked here): decoding moves
 * checks to load time and decides nothing new. */
#define ALU_OPS(F) F(ADD) F(SUB) F(MUL) F(OR) F(AND) F(XOR) F(MOV) F(LSH) F(RSH) F(ARSH)
#define JMP_OPS(F) F(JEQ) F(JGT) F(JGE) F(JSET) F(JNE) F(JSGT) F(JSGE) F(JLT) F(JLE) F(JSLT) F(JSLE)
/* each in four forms, in this order: 64-bit with the immediate, 64-bit with a register, then 32-bit */
#define FORMS(NAME) OP_##NAME##64K, OP_##NAME##64X, OP_##NAME##32K, OP_##NAME##32X,
enum operation {
    OP_SLOW, OP_END, OP_LDDW, OP_CALL, OP_EXIT, OP_JA,
    OP_LDX1, OP_LDX2, OP_LDX4, OP_LDX8, OP_ST1, OP_ST2, OP_ST4, OP_ST8, OP_STX1, OP_STX2, OP_STX4, OP_STX8,
    ALU_OPS(FORMS) JMP_OPS(FORMS) OP_COUNT
};

struct decoded {
    uint8_t op, dst, src;
    uint8_t start; /* an instruction starts here, not an lddw's second half: where a callback may start */
    int32_t off;  /* loads and stores: the offset; jumps: the target's pc */
    uint64_t imm; /* the immediate as the operation takes it: sign-extended, cut to 32 bits in 32-bit forms */
};

/* by the instruction's operation (code >> 4): the 64-bit immediate form, 0 where step() runs it */
static const uint8_t alu_ops[16] = {
    [0x0] = OP_ADD64K, [0x1] = OP_SUB64K, [0x2] = OP_MUL64K, [0x4] = OP_OR64K, [0x5] = OP_AND64K,
    [0x6] = OP_LSH64K, [0x7] = OP_RSH64K, [0xa] = OP_XOR64K, [0xb] = OP_MOV64K, [0xc] = OP_ARSH64K,
};
static const uint8_t jmp_ops[16] = {
    [0x1] = OP_JEQ64K, [0x2] = OP_JGT64K, [0x3] = OP_JGE64K, [0x4] = OP_JSET64K, [0x5] = OP_JNE64K,
    [0x6] = OP_JSGT64K, [0x7] = OP_JSGE64K, [0xa] = OP_JLT64K, [0xb] = OP_JLE64K, [0xc] = OP_JSLT64K,
    [0xd] = OP_JSLE64K,
};

/* insns[0, n) into ops[0, n], ops[n] the end a program must not run into. */
static void decode(const struct insn *insns, size_t n, size_t nmaps, struct decoded *ops) {
    static const uint8_t by_size[4] = {2, 1, 0, 3}; /* the size field (W, H, B, DW) to 4, 2, 1, 8's index */
    size_t next_start = 0;
    for (size_t pc = 0; pc < n; pc++) {
        const struct insn *i = &insns[pc];
        struct decoded *o = &ops[pc];
        int cls = i->code & 7, mode = i->code & 0xe0, sized = by_size[(i->code >> 3) & 3];
        int form = (cls == 4 || cls == 6 ? 2 : 0) + (i->code & 0x08 ? 1 : 0), op = i->code >> 4;
        int64_t target = (int64_t)pc + 1 + i->off;
        *o = (struct decoded){OP_SLOW, i->regs & 15, i->regs >> 4, pc == next_start, i->off,
                              (uint64_t)(int64_t)i->imm};
        if (o->start) next_start = pc + (i->code == 0x18 ? 2 : 1);
        if (o->dst > 10 || o->src > 10) continue;
        if (form >= 2) o->imm &= 0xffffffffull;
        switch (cls) {
        case 4: case 7:
            if (o->dst != 10 && !i->off && alu_ops[op]) o->op = (uint8_t)(alu_ops[op] + form);
            break;
        case 1:
            if (o->dst != 10 && mode == 0x60) o->op = (uint8_t)(OP_LDX1 + sized);
            break;
        case 2: case 3:
            if (mode == 0x60) o->op = (uint8_t)((cls == 2 ? OP_ST1 : OP_STX1) + sized);
            break;
        case 0: {
            if (i->code != 0x18 || pc + 1 >= n || o->dst == 10) break;
            uint64_t lo = (uint32_t)i->imm, hi = (uint32_t)insns[pc + 1].imm;
            if (o->src == 0) o->op = OP_LDDW, o->imm = hi << 32 | lo;
            else if (o->src == 5 && !hi && lo < nmaps) o->op = OP_LDDW, o->imm = MAP_HANDLE(lo);
            else if (o->src == 4) o->op = OP_LDDW, o->imm = FUNC_HANDLE(pc + 1 + (uint64_t)(int64_t)i->imm);
            break;
        }
        case 5: case 6:
            if (op == 0x0) {
                target = (int64_t)pc + 1 + (cls == 5 ? i->off : i->imm);
                if (target >= 0 && (size_t)target <= n) o->op = OP_JA, o->off = (int32_t)target;
            } else if (op == 0x9 && cls == 5) {
                o->op = OP_EXIT;
            } else if (op == 0x8 && cls == 5 && o->src == 0 && i->imm != HELPER_LOOP) {
                o->op = OP_CALL;
            } else if (jmp_ops[op] && target >= 0 && (size_t)target <= n) {
                o->op = (uint8_t)(jmp_ops[op] + form), o->off = (int32_t)target;
            }
            break;
        }
    }
    ops[n] = (struct decoded){.op = OP_END};
}

struct egpu_lvm_prog {
    struct insn *insns;
    struct decoded *ops;   /* decode()'s, n + 1 */
    size_t n;
    struct egpu_lvm_map **maps;
    size_t nmaps;
    int percpu;            /* it uses a per-CPU map: its runs hold cpu_lock */
    struct egpu_lvm_stats stats;
    /* what its runs lost to a full trace buffer, under trace_lock: [0] bpf_printk lines, [1 + k] records for
     * map k (egpu_lvm_prog_lost) */
    unsigned long long *lost;
};

EXPORT struct egpu_lvm_prog *egpu_lvm_prog_new(const void *insns, size_t n, struct egpu_lvm_map *const *maps,
                                               size_t nmaps) {
    struct egpu_lvm_prog *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->insns = malloc(n * sizeof *p->insns + 1);
    p->ops = malloc((n + 1) * sizeof *p->ops);
    p->maps = malloc(nmaps * sizeof *p->maps + 1);
    p->lost = calloc(nmaps + 1, sizeof *p->lost);
    if (!p->insns || !p->ops || !p->maps || !p->lost) {
        egpu_lvm_prog_free(p);
        return NULL;
    }
    memcpy(p->insns, insns, n * sizeof *p->insns);
    if (nmaps) memcpy(p->maps, maps, nmaps * sizeof *p->maps); /* maps may be NULL then: memcpy must not see it */
    p->n = n, p->nmaps = nmaps;
    for (size_t k = 0; k < nmaps; k++) p->percpu |= maps[k] && is_percpu(maps[k]);
    decode(p->insns, n, nmaps, p->ops);
    return p;
}

EXPORT void egpu_lvm_prog_free(struct egpu_lvm_prog *p) {
    if (!p) return;
    free(p->insns), free(p->ops), free(p->maps), free(p->lost), free(p);
}

EXPORT void egpu_lvm_prog_stats(const struct egpu_lvm_prog *p, struct egpu_lvm_stats *out) {
    out->faults = __atomic_load_n(&p->stats.faults, __ATOMIC_ACQUIRE);
    out->runs = __atomic_load_n(&p->stats.runs, __ATOMIC_RELAXED);
    out->fault = __atomic_load_n(&p->stats.fault, __ATOMIC_RELAXED);
    out->fault_pc = __atomic_load_n(&p->stats.fault_pc, __ATOMIC_RELAXED);
    out->fault_launch = __atomic_load_n(&p->stats.fault_launch, __ATOMIC_RELAXED);
}

/* One run of p counted, from any thread: the first fault's details kept (they may land just after its
 * count, where egpu_lvm_prog_stats reads them). */
static void count_run(struct egpu_lvm_prog *p, int fault, unsigned int pc, unsigned long long launch) {
    __atomic_fetch_add(&p->stats.runs, 1, __ATOMIC_RELAXED);
    if (!fault || __atomic_fetch_add(&p->stats.faults, 1, __ATOMIC_RELAXED)) return;
    __atomic_store_n(&p->stats.fault_pc, pc, __ATOMIC_RELAXED);
    __atomic_store_n(&p->stats.fault_launch, launch, __ATOMIC_RELAXED);
    __atomic_store_n(&p->stats.fault, fault, __ATOMIC_RELAXED);
}

/* ---- the interpreter ---- */

struct run {
    uint64_t r[11];
    const struct egpu_lvm_prog *p;
    unsigned char *ctx;
    size_t ctx_size;
    int ctx_writable, depth, fault;
    uint64_t now;                 /* ktime_get_ns and get_globaltimer */
    /* a host probe's run (egpu_lvm_run_host): ktime_get_ns and get_globaltimer read CLOCK_MONOTONIC + now
     * at the call, and frame 0 starts as the thread's stack left it, not cleared: the verifier proved
     * that no byte is read before the program writes it (its "stack init" check), and clearing it cost as
     * much as a tenth of a uprobe's call */
    int host;
    /* in the application's thread that called (a uprobe's or host-API probe's run): get_current_comm gives
     * that thread's name, where others give the main thread's */
    int caller;
    const unsigned int *grid, *block;
    struct { size_t ret; uint64_t saved[4]; } calls[MAX_FRAMES];
    /* bpf_loop calls under way, innermost last (each callback a frame deeper than its call) */
    int nloops;
    struct { size_t callback, ret; uint64_t ctx; uint32_t rounds, index; } loops[MAX_FRAMES];
    /* values of tracked maps a lookup handed out, as they were: a key whose value differs after the
     * run was written through the pointer (launches.py's Touched) */
    int nwatch;
    size_t watch_used;
    struct { struct egpu_lvm_map *m; size_t at; unsigned int gen; int shared; } watches[WATCHES];
    unsigned char watch_buf[WATCH_BYTES];
    /* maps whose keys this run logged at lookup (watch's overflow), counted in their overflowing until settle */
    int noverflow;
    struct egpu_lvm_map *overflow[OVERFLOWS];
    /* records bpf_ringbuf_reserve handed out and no submit or discard released yet (the verifier proved
     * that each is released before the program ends) */
    struct { int map, held; unsigned int size; } reserved[RESERVED];
    /* aligned as map values are, so that an aligned eBPF address is an aligned host one (atomics) */
    _Alignas(8) unsigned char reserved_buf[RESERVED][EGPU_LVM_TRACE_FMT];
    _Alignas(8) unsigned char frames[MAX_FRAMES][STACK_SIZE];
};

/* Watches of x's before its k-th on that one's map. */
static unsigned int own_watches(const struct run *x, int k, int from, int to) {
    unsigned int n = 0;
    for (int j = from; j < to; j++) n += j != k && x->watches[j].m == x->watches[k].m;
    return n;
}

/* Remember slot `s` of `m` (looked up by `key`) as it is now; a value too big to keep is logged as
 * changed at once. Counted in m's watching and watch_gen first, so that settle knows whether another
 * run looked at m meanwhile (then a value put back as it was handed out may still differ from what the
 * runtime took: another's change it saw, or one the runtime took in the middle). */
static int watch(struct run *x, struct egpu_lvm_map *m, const unsigned char *key, int s) {
    if (!atomic_load_explicit(&m->track, memory_order_relaxed) || s < 0) return 0;
    for (int k = 0; k < x->nwatch; k++) /* the value as it was first handed out counts */
        if (x->watches[k].m == m && !memcmp(x->watch_buf + x->watches[k].at, key, m->key_size)) return 0;
    size_t need = (size_t)m->key_size + m->value_size;
    if (x->nwatch == WATCHES || x->watch_used + need > WATCH_BYTES) {
        /* logged now, before the run writes it: counted in m's overflowing until settle, so that a take
         * meanwhile leaves it logged (past OVERFLOWS maps, which the loader never gives a program, not) */
        int k = 0;
        while (k < x->noverflow && x->overflow[k] != m) k++;
        spin_lock(&m->lock);
        if (k == x->noverflow && k < OVERFLOWS) x->overflow[x->noverflow++] = m, atomic_fetch_add(&m->overflowing, 1);
        int rc = dirty_add(m, key);
        spin_unlock(&m->lock);
        return rc;
    }
    unsigned char *w = x->watch_buf + x->watch_used;
    int k = x->nwatch;
    x->watches[k].m = m, x->watches[k].at = x->watch_used;
    x->watches[k].gen = atomic_fetch_add(&m->watch_gen, 1);
    x->watches[k].shared = atomic_fetch_add(&m->watching, 1) > own_watches(x, k, 0, k);
    memcpy(w, key, m->key_size);
    memcpy(w + m->key_size, m->values + (size_t)s * m->stride, m->value_size);
    x->nwatch++, x->watch_used += need;
    return 0;
}

/* After a run: log the watched keys whose values changed (a deleted key logged itself), and every one of a
 * map another run or a take looked at while this run did (watch). */
static void settle(struct run *x) {
    for (int k = 0; k < x->nwatch; k++) {
        struct egpu_lvm_map *m = x->watches[k].m;
        const unsigned char *key = x->watch_buf + x->watches[k].at;
        spin_lock(&m->lock);
        int shared = x->watches[k].shared ||
                     atomic_load(&m->watch_gen) != x->watches[k].gen + 1 + own_watches(x, k, k + 1, x->nwatch);
        int s = map_peek(m, key);
        if (s >= 0 && (shared || memcmp(m->values + (size_t)s * m->stride, key + m->key_size, m->value_size)) &&
            dirty_add(m, key))
            x->fault = x->fault ? x->fault : EGPU_LVM_NO_MEMORY;
        spin_unlock(&m->lock);
    }
    for (int k = 0; k < x->nwatch; k++) atomic_fetch_sub(&x->watches[k].m->watching, 1);
    for (int k = 0; k < x->noverflow; k++) atomic_fetch_sub(&x->overflow[k]->overflowing, 1);
    x->nwatch = 0, x->watch_used = 0, x->noverflow = 0;
}

/* The host address of [addr, addr + size) in the run's memory; NULL (and the fault set) if outside. */
static inline __attribute__((always_inline)) unsigned char *at(struct run *x, uint64_t addr, size_t size, int write) {
    uint64_t region = addr >> REGION_SHIFT, off = addr & OFFSET_MASK, limit;
    unsigned char *base;
    int writable = 1;
    if (region == R_CTX) {
        base = x->ctx, limit = x->ctx_size, writable = x->ctx_writable;
    } else if (region >= R_FRAME && region - R_FRAME <= (uint64_t)x->depth) {
        base = x->frames[region - R_FRAME], limit = STACK_SIZE;
    } else if (region >= R_MAP && region - R_MAP < x->p->nmaps && x->p->maps[region - R_MAP]) {
        /* one value: the VM maps each value as a region of its own */
        const struct egpu_lvm_map *m = x->p->maps[region - R_MAP];
        uint64_t slot = m->stride_shift >= 0 ? off >> m->stride_shift : off / m->stride;
        base = m->values, writable = !m->readonly;
        limit = slot < m->max_entries && !is_keyless(m->type) ? slot * m->stride + m->value_size : 0;
    } else if (region <= R_RESERVED(0) && region > R_RESERVED(RESERVED) &&
               x->reserved[R_RESERVED(0) - region].held) {
        base = x->reserved_buf[R_RESERVED(0) - region], limit = x->reserved[R_RESERVED(0) - region].size;
    } else {
        x->fault = EGPU_LVM_BAD_ACCESS;
        return NULL;
    }
    if (off + size > limit || (!base && size)) {
        x->fault = EGPU_LVM_BAD_ACCESS;
        return NULL;
    }
    if (write && !writable) {
        x->fault = EGPU_LVM_READ_ONLY;
        return NULL;
    }
    return base + off;
}

/* memcpy of 1, 2, 4 or 8 bytes (the only sizes the decoder yields), each a constant: a call to memcpy with a
 * variable size was 5% of a host uprobe's run. The low bytes of a value, as the host is little endian. */
static inline __attribute__((always_inline)) void copy_sized(void *to, const void *from, unsigned int size) {
    switch (size) {
    case 1: memcpy(to, from, 1); return;
    case 2: memcpy(to, from, 2); return;
    case 4: memcpy(to, from, 4); return;
    default: memcpy(to, from, 8); return;
    }
}

static inline __attribute__((always_inline)) int load(struct run *x, uint64_t addr, unsigned int size, uint64_t *out) {
    unsigned char *p = at(x, addr, size, 0);
    if (!p) return -1;
    uint64_t v = 0;
    copy_sized(&v, p, size); /* little endian, as the VM's int.from_bytes(..., "little") */
    *out = v;
    return 0;
}

static inline __attribute__((always_inline)) int store(struct run *x, uint64_t addr, unsigned int size, uint64_t v) {
    unsigned char *p = at(x, addr, size, 1);
    if (!p) return -1;
    copy_sized(p, &v, size);
    return 0;
}

/* The map r[reg] names (a handle from lddw); NULL and the fault set otherwise. */
static struct egpu_lvm_map *map_of(struct run *x, int reg, size_t *index) {
    uint64_t k = x->r[reg] - MAP_HANDLE(0);
    if (k >= x->p->nmaps || !x->p->maps[k]) {
        x->fault = EGPU_LVM_NOT_A_MAP;
        return NULL;
    }
    *index = (size_t)k;
    return x->p->maps[k];
}

static uint64_t value_address(size_t index, const struct egpu_lvm_map *m, int slot) {
    return slot < 0 ? 0 : ((R_MAP + index) << REGION_SHIFT) + (uint64_t)slot * m->stride;
}

static uint64_t mask(int bits) {
    return bits == 64 ? ~0ull : 0xffffffffull;
}

static int64_t sext(uint64_t v, int bits) {
    return bits == 64 ? (int64_t)v : bits == 32 ? (int32_t)v : bits == 16 ? (int16_t)v : (int8_t)v;
}

/* RFC 9669 4.1, as bpf/alu.py: x / 0 = 0, x % 0 = x, INT_MIN / -1 wraps, remainders take the
 * dividend's sign. Operands come truncated to `bits`. */
static uint64_t sdiv(uint64_t a, uint64_t b, int bits) {
    int64_t x = sext(a, bits), y = sext(b, bits);
    if (y == 0) return 0;
    return (y == -1 ? (uint64_t)0 - (uint64_t)x : (uint64_t)(x / y)) & mask(bits);
}

static uint64_t smod(uint64_t a, uint64_t b, int bits) {
    int64_t x = sext(a, bits), y = sext(b, bits);
    if (y == 0) return a;
    return (y == -1 ? 0 : (uint64_t)(x % y)) & mask(bits);
}

static uint64_t bswap(uint64_t v, int bits) {
    return bits == 16 ? __builtin_bswap16((uint16_t)v) : bits == 32 ? __builtin_bswap32((uint32_t)v)
                                                                      : __builtin_bswap64(v);
}

static inline __attribute__((always_inline)) int alu(struct run *x, const struct insn *i, int bits) {
    int dst = i->regs & 15, src = i->regs >> 4, op = i->code & 0xf0;
    uint64_t m = mask(bits), a = x->r[dst] & m, b = ((i->code & 0x08) ? x->r[src] : (uint64_t)(int64_t)i->imm) & m;
    uint64_t s = b & (uint64_t)(bits - 1);
    switch (op) {
    case 0x00: a += b; break;
    case 0x10: a -= b; break;
    case 0x20: a *= b; break;
    case 0x30: if (i->off > 1) return -1;
               a = i->off ? sdiv(a, b, bits) : b ? a / b : 0; break;
    case 0x40: a |= b; break;
    case 0x50: a &= b; break;
    case 0x60: a <<= s; break;
    case 0x70: a >>= s; break;
    case 0x80: a = (uint64_t)0 - a; break;
    case 0x90: if (i->off > 1) return -1;
               a = i->off ? smod(a, b, bits) : b ? a % b : a; break;
    case 0xa0: a ^= b; break;
    case 0xb0: /* mov; movsx with off 8/16/32 */
        if (i->off == 0) a = b;
        else if (i->off == 8 || i->off == 16 || (i->off == 32 && bits == 64)) a = (uint64_t)sext(x->r[src], i->off);
        else return -1;
        break;
    case 0xc0: a = bits == 64 ? (uint64_t)((int64_t)a >> s) : (uint64_t)(uint32_t)((int32_t)a >> s); break;
    case 0xd0: { /* le (ALU, K): truncate; be (ALU, X) and bswap (ALU64): reverse */
        int n = i->imm;
        if (n != 16 && n != 32 && n != 64) return -1;
        uint64_t v = x->r[dst] & mask(n == 64 ? 64 : 32) & (n == 16 ? 0xffffull : ~0ull);
        a = (bits == 32 && !(i->code & 0x08)) ? v : bswap(v, n);
        x->r[dst] = a;
        return 0;
    }
    default: return -1;
    }
    x->r[dst] = a & m;
    return 0;
}

static inline __attribute__((always_inline)) int taken(const struct insn *i, uint64_t a, uint64_t b, int bits) {
    switch (i->code & 0xf0) {
    case 0x10: return a == b;
    case 0x20: return a > b;
    case 0x30: return a >= b;
    case 0x40: return (a & b) != 0;
    case 0x50: return a != b;
    case 0x60: return sext(a, bits) > sext(b, bits);
    case 0x70: return sext(a, bits) >= sext(b, bits);
    case 0xa0: return a < b;
    case 0xb0: return a <= b;
    case 0xc0: return sext(a, bits) < sext(b, bits);
    case 0xd0: return sext(a, bits) <= sext(b, bits);
    default: return -1;
    }
}

static int store_dim3(struct run *x, const unsigned int *v) {
    static const unsigned int zero[3];
    v = v ? v : zero; /* block_idx, thread_idx */
    for (int k = 0; k < 3; k++)
        if (store(x, x->r[k + 1], 8, v[k])) return -1;
    x->r[0] = 0;
    return 0;
}

/* ---- trace_printk and ring or perf buffer output: records kept for the runtime (egpu_lvm_trace_take),
 * which hands them to the probe's host maps, under trace_lock ----
 * A record that finds the queue full is dropped and counted, unless the runtime asked runs to wait for room
 * (egpu_lvm_trace_wait: egpu-run --on-full wait) and may: then it sleeps until the take makes room, or gives up
 * (dropped and counted) once the take has taken nothing for the stall time, as a device probe made to wait
 * gives up (translate/devmaps.py). trace_waits says who may not wait. */

#define TRACE_RECORDS 16384
static struct spin trace_lock;
static struct egpu_lvm_trace *trace_ring; /* allocated before the first record */
static size_t trace_head, trace_count;
static _Atomic unsigned long long trace_stall_ns; /* 0: a full queue drops (egpu_lvm_trace_wait) */
static _Atomic unsigned long long trace_taken_ns; /* when the take last ran (egpu_now_ns) */
static __thread int tls_trace_taker __attribute__((tls_model("initial-exec"))); /* the thread that takes */
/* the take waits for cpu_lock, which a waiting run may hold: its thread does, one that holds the GIL, or a fork */
static atomic_int taker_blocked;

/* Whether a run whose record found the queue full waits for room. Never on the thread that takes (it would wait
 * for itself), nor while the take waits for cpu_lock (the waiting run may hold it: taker_blocked) or a change of
 * programs waits for runs to end (egpu_lvm_synchronize), nor in a thread that holds the GIL, which the runtime's
 * take needs (letting it go in the middle of whatever function a uprobe is on is not ours to do). */
static int trace_waits(void) {
    unsigned long long stall = atomic_load(&trace_stall_ns);
    if (!stall || tls_trace_taker || atomic_load(&taker_blocked) || atomic_load(&synchronizing)) return 0;
    if (egpu_now_ns() - atomic_load(&trace_taken_ns) >= stall) return 0;
    return !egpu_gil_held();
}

/* One record queued for the runtime: for map k, or (k = -1) a trace_printk line with its three
 * arguments (args; NULL for a record); 0 when the queue is full and x waits no more (trace_waits): the record is
 * counted lost as what it was, program x's bpf_printk line or its record for map k. */
static int queue_record(const struct run *x, int k, const unsigned char *data, unsigned int size,
                        const uint64_t *args) {
    if (!atomic_load_explicit((_Atomic(struct egpu_lvm_trace *) *)&trace_ring, memory_order_acquire)) {
        /* outside the lock: malloc may take its own, and a record is rare */
        struct egpu_lvm_trace *ring = malloc(TRACE_RECORDS * sizeof *ring), *none = NULL;
        if (ring && !atomic_compare_exchange_strong((_Atomic(struct egpu_lvm_trace *) *)&trace_ring, &none, ring))
            free(ring);
    }
    for (int tries = 0;; tries++) {
        spin_lock(&trace_lock);
        int none = !trace_ring; /* no memory for it: nothing to wait for */
        if (!none && trace_count < TRACE_RECORDS) {
            struct egpu_lvm_trace *t = &trace_ring[(trace_head + trace_count++) % TRACE_RECORDS];
            t->prog = x->p, t->map = k, t->size = size;
            for (int i = 0; i < 3; i++) t->args[i] = args ? args[i] : 0;
            memcpy(t->fmt, data, size);
            spin_unlock(&trace_lock);
            return 1;
        }
        spin_unlock(&trace_lock);
        if (none || !trace_waits()) break;
        /* the take runs every 2 ms (launches.PERIOD_S): a few turns given away, then sleeps of 50 us */
        if (tries < 8) sched_yield();
        else nanosleep(&(struct timespec){.tv_nsec = 50000}, NULL);
    }
    spin_lock(&trace_lock);
    x->p->lost[k + 1]++;
    spin_unlock(&trace_lock);
    return 0;
}

static int trace_printk(struct run *x) {
    unsigned int size = x->r[2] < EGPU_LVM_TRACE_FMT ? (unsigned int)x->r[2] : EGPU_LVM_TRACE_FMT;
    const unsigned char *fmt = at(x, x->r[1], size, 0);
    if (!fmt) return -1;
    queue_record(x, -1, fmt, size, &x->r[3]);
    x->r[0] = 0;
    return 0;
}

/* The ring or perf buffer map r[reg] names, which the runtime keeps (no C copy: map_of has none); -1 and
 * the fault set otherwise. */
static int output_map(struct run *x, int reg, int *k) {
    uint64_t index = x->r[reg] - MAP_HANDLE(0);
    if (index >= x->p->nmaps) {
        x->fault = EGPU_LVM_NOT_A_MAP;
        return -1;
    }
    *k = (int)index;
    return 0;
}

/* bpf_ringbuf_output, bpf_perf_event_output: 0 once queued (a map found full then counts it dropped
 * there), -ENOSPC when the queue is full. */
static int output(struct run *x, int map_reg, int data_reg, int size_reg) {
    uint64_t size = x->r[size_reg];
    int k;
    if (output_map(x, map_reg, &k)) return -1;
    if (size > EGPU_LVM_TRACE_FMT) {
        x->r[0] = (uint64_t)-E2BIG;
        return 0;
    }
    const unsigned char *data = at(x, x->r[data_reg], size, 0);
    if (!data) return -1;
    x->r[0] = queue_record(x, k, data, (unsigned int)size, NULL) ? 0 : (uint64_t)-ENOSPC;
    return 0;
}

/* bpf_ringbuf_reserve(map, size, flags): a zeroed record of the run's own (as the VM's), NULL for flags
 * (ringbuf.c takes none), when RESERVED are held, or when it is longer than a queued record may be. */
static int reserve(struct run *x) {
    uint64_t size = x->r[2];
    int k;
    if (output_map(x, 1, &k)) return -1;
    x->r[0] = 0;
    for (int s = 0; s < RESERVED && !x->r[3] && size <= EGPU_LVM_TRACE_FMT; s++)
        if (!x->reserved[s].held) {
            x->reserved[s].map = k, x->reserved[s].held = 1, x->reserved[s].size = (unsigned int)size;
            memset(x->reserved_buf[s], 0, size);
            x->r[0] = R_RESERVED(s) << REGION_SHIFT;
            break;
        }
    return 0;
}

/* bpf_ringbuf_submit / bpf_ringbuf_discard(data, flags): the record queued as bpf_ringbuf_output's (or
 * dropped), its region released. */
static int release(struct run *x, int submit) {
    uint64_t region = x->r[1] >> REGION_SHIFT, s = R_RESERVED(0) - region;
    if ((x->r[1] & OFFSET_MASK) || region > R_RESERVED(0) || s >= RESERVED || !x->reserved[s].held) {
        x->fault = EGPU_LVM_BAD_ACCESS;
        return -1;
    }
    if (submit) queue_record(x, x->reserved[s].map, x->reserved_buf[s], x->reserved[s].size, NULL);
    x->reserved[s].held = 0;
    x->r[0] = 0;
    return 0;
}

EXPORT void egpu_lvm_trace_wait(unsigned long long stall_ns) {
    tls_trace_taker = stall_ns != 0;
    atomic_store(&trace_taken_ns, egpu_now_ns());
    atomic_store(&trace_stall_ns, stall_ns);
}

EXPORT size_t egpu_lvm_trace_take(struct egpu_lvm_trace *out, size_t max) {
    size_t n = 0;
    atomic_store(&trace_taken_ns, egpu_now_ns());
    spin_lock(&trace_lock);
    for (; n < max && trace_count; n++, trace_count--, trace_head = (trace_head + 1) % TRACE_RECORDS)
        out[n] = trace_ring[trace_head];
    spin_unlock(&trace_lock);
    return n;
}

EXPORT void egpu_lvm_prog_lost(const struct egpu_lvm_prog *p, unsigned long long *lost) {
    spin_lock(&trace_lock);
    for (size_t k = 0; k <= p->nmaps; k++) lost[k] = p->lost[k], p->lost[k] = 0;
    spin_unlock(&trace_lock);
}

/* get_current_comm's names (bpf/helpers.py), TASK_COMM_LEN bytes. A thread's is read at its first call there
 * (prctl: a syscall a thread, not one a call; a name it takes later is not seen); the main thread's, for runs
 * no application thread makes (launch records, on the runtime's thread), once from /proc/self/comm (the thread
 * group leader's), and again in a forked child (egpu_lvm_fork), whose main thread is the one that forked. */
#define COMM_LEN 16
static __thread char tls_comm[COMM_LEN] __attribute__((tls_model("initial-exec")));
static char main_comm[COMM_LEN];
static pthread_once_t main_comm_once = PTHREAD_ONCE_INIT;

static void main_comm_read(void) {
    int fd = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, main_comm, COMM_LEN - 1) : 0;
    if (fd >= 0) close(fd);
    n = n < 0 ? 0 : n;
    memset(main_comm + n, 0, COMM_LEN - (size_t)n);
    char *nl = strchr(main_comm, '\n');
    if (nl) *nl = 0;
}

static const char *comm(const struct run *x) {
    if (!x->caller) {
        pthread_once(&main_comm_once, main_comm_read);
        return main_comm;
    }
    if (!tls_comm[0]) prctl(PR_GET_NAME, tls_comm);
    return tls_comm;
}

/* get_prandom_u32 (bpf/helpers.py): splitmix64 (Steele, Lea, Flood 2014) on a state of the calling thread, so
 * threads share nothing; seeded at a thread's first call from the clock and its id (0: not seeded), and again
 * in a forked child (egpu_lvm_fork), which would otherwise repeat its parent's numbers. */
static __thread uint64_t tls_prandom __attribute__((tls_model("initial-exec")));

static uint32_t prandom_u32(void) {
    if (!tls_prandom) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        tls_prandom = ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^ (uint64_t)syscall(SYS_gettid) << 40;
    }
    uint64_t z = tls_prandom += 0x9e3779b97f4a7c15u;
    z = (z ^ z >> 30) * 0xbf58476d1ce4e5b9u;
    z = (z ^ z >> 27) * 0x94d049bb133111ebu;
    return (uint32_t)((z ^ z >> 31) >> 32);
}

/* bpf_get_current_comm(buf, size): the name as Linux's strscpy_pad copies it, its first size - 1 bytes at most,
 * then zeros to the buffer's end; 0. */
static int get_comm(struct run *x) {
    uint64_t size = x->r[2] <= OFFSET_MASK ? x->r[2] : OFFSET_MASK + 1; /* past any region: at() faults */
    unsigned char *buf = size ? at(x, x->r[1], size, 1) : NULL;
    if (size && !buf) return -1;
    const char *name = comm(x);
    size_t n = size ? strnlen(name, size - 1) : 0;
    if (size) memcpy(buf, name, n), memset(buf + n, 0, size - n);
    x->r[0] = 0;
    return 0;
}

/* n bytes of the application's memory at src into dst, through process_vm_readv on this process, so that an
 * address it has not mapped is an error, not a fault of the thread that called: 0, or -errno (-EFAULT) with
 * dst zeroed, as Linux's bpf_probe_read_user leaves it. */
static long read_user(unsigned char *dst, uint64_t src, size_t n) {
    struct iovec local = {dst, n}, remote = {(void *)(uintptr_t)src, n};
    ssize_t got = syscall(SYS_process_vm_readv, getpid(), &local, 1ul, &remote, 1ul, 0ul);
    if (got == (ssize_t)n) return 0;
    long err = got < 0 ? -errno : -EFAULT; /* a short read: the range ran into an unmapped page */
    memset(dst, 0, n);
    return err;
}

/* bpf_probe_read_user_str's copy (Linux's strncpy_from_user_nofault), size > 0: up to a NUL or size - 1 bytes,
 * then a NUL; the length with the NUL, or -EFAULT with dst zeroed. Linux reads all size bytes before it makes
 * the last a NUL, so that byte unmapped is -EFAULT too. Read a page at a time, as the page after the NUL may be
 * unmapped; bytes copied past the NUL are zeroed, as Linux copies none. */
static long read_user_str(unsigned char *dst, uint64_t src, size_t size) {
    size_t n = 0;
    while (n < size) {
        size_t chunk = 4096 - ((src + n) & 4095), left = size - n;
        chunk = chunk < left ? chunk : left;
        long err = read_user(dst + n, src + n, chunk);
        if (err) {
            memset(dst, 0, size);
            return err;
        }
        unsigned char *nul = memchr(dst + n, 0, chunk);
        if (nul) {
            memset(nul, 0, (size_t)(dst + n + chunk - nul));
            return nul - dst + 1;
        }
        n += chunk;
    }
    dst[size - 1] = 0;
    return (long)size;
}

/* bpf_probe_read(_user)(dst, size, src) and their _str forms (helpers.py; the verifier lets only programs in
 * the application's threads call them). */
static int probe_read(struct run *x, int str) {
    uint64_t size = x->r[2] <= OFFSET_MASK ? x->r[2] : OFFSET_MASK + 1; /* past any region: at() faults */
    unsigned char *buf = size ? at(x, x->r[1], size, 1) : NULL;
    if (size && !buf) return -1;
    x->r[0] = (uint64_t)(!size ? 0 : str ? read_user_str(buf, x->r[3], size) : read_user(buf, x->r[3], size));
    return 0;
}

static uint64_t clock_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Helpers of bpf/helpers.py that need neither Python nor the GPU (runtime/native.py NATIVE_HELPERS).
 * Returns 0, 1 when the probe ends (exit), -1 on a fault. The host is SM 0, warp 0, lane 0 of block 0,
 * thread 0, as the VM's ThreadSim of a launch. */
static int helper(struct run *x, int32_t id) {
    struct egpu_lvm_map *m;
    size_t index;
    unsigned char *key, *value, index_key[4];
    switch (id) {
    case 1: { /* map_lookup_elem */
        if (!(m = map_of(x, 1, &index))) return -1;
        if (is_keyless(m->type)) { /* as Linux's queue, stack and bloom filter maps: no value to point at */
            x->r[0] = 0;
            return 0;
        }
        if (!(key = at(x, x->r[2], m->key_size, 0))) return -1;
        int s = map_lookup(m, key);
        if (watch(x, m, key, s)) break;
        x->r[0] = value_address(index, m, s);
        return 0;
    }
    case 2: { /* map_update_elem */
        if (!(m = map_of(x, 1, &index))) return -1;
        if (is_keyless(m->type)) {
            x->r[0] = (uint64_t)-EINVAL;
            return 0;
        }
        if (!(key = at(x, x->r[2], m->key_size, 0)) ||
            !(value = at(x, x->r[3], m->value_size, 0)))
            return -1;
        if (!is_hash(m)) memcpy(index_key, key, 4); /* an array's update may overwrite where the key was */
        /* an untracked array's value is copied in place unlocked (maps are tracked before programs run) */
        int locked = is_hash(m) || atomic_load_explicit(&m->track, memory_order_relaxed), lost = 0;
        if (locked) spin_lock(&m->lock);
        x->r[0] = (uint64_t)(m->readonly ? -EINVAL : map_update(m, key, value, x->r[4]));
        /* a hash update left the key in scratch */
        if (x->r[0] == 0 && locked) lost = dirty_add(m, is_hash(m) ? m->scratch : index_key);
        if (locked) spin_unlock(&m->lock);
        if (lost) break;
        return 0;
    }
    case 3: { /* map_delete_elem */
        if (!(m = map_of(x, 1, &index))) return -1;
        if (is_keyless(m->type)) {
            x->r[0] = (uint64_t)-EINVAL;
            return 0;
        }
        if (!(key = at(x, x->r[2], m->key_size, 0))) return -1;
        int lost = 0;
        spin_lock(&m->lock);
        x->r[0] = (uint64_t)map_delete(m, key);
        if (x->r[0] == 0) lost = dirty_add(m, key);
        spin_unlock(&m->lock);
        if (lost) break;
        return 0;
    }
    case 87: case 88: case 89: { /* map_push_elem(map, value, flags), map_pop_elem(map, value), map_peek_elem */
        int bloomy;
        if (!(m = map_of(x, 1, &index))) return -1;
        if (!is_keyless(m->type) || (id == 88 && m->type == MAP_BLOOM_FILTER)) {
            x->fault = EGPU_LVM_NOT_A_MAP; /* the verifier lets none through: check_map_func_compatibility */
            return -1;
        }
        bloomy = m->type == MAP_BLOOM_FILTER;
        /* a bloom filter reads the value, pop and peek write it */
        if (!(value = at(x, x->r[2], m->value_size, id != 87 && !bloomy))) return -1;
        spin_lock(&m->lock);
        if (bloomy) {
            x->r[0] = (uint64_t)bloom(m, value, id == 87, x->r[3]);
        } else if (id == 87) {
            x->r[0] = (uint64_t)queue_push(m, value, x->r[3]);
        } else {
            int s = queue_next(m);
            if (s < 0) memset(value, 0, m->value_size);
            else memcpy(value, m->values + (size_t)s * m->stride, m->value_size);
            if (s >= 0 && id == 88) queue_drop(m);
            x->r[0] = s < 0 ? (uint64_t)-ENOENT : 0;
        }
        spin_unlock(&m->lock);
        return 0;
    }
    case 5: case 502: /* ktime_get_ns, get_globaltimer */
        x->r[0] = x->now + (x->host ? clock_ns(CLOCK_MONOTONIC) : 0);
        return 0;
    case 125: { /* ktime_get_boot_ns: CLOCK_BOOTTIME on ktime's clock (helpers.py); a record's or host-API call's
                 * run, whose ktime is that time: it plus the time the machine slept, BOOTTIME - MONOTONIC */
        uint64_t mono = x->host ? 0 : clock_ns(CLOCK_MONOTONIC); /* first: the difference is not negative */
        x->r[0] = x->now + clock_ns(CLOCK_BOOTTIME) - mono;
        return 0;
    }
    case 160: /* ktime_get_coarse_ns: CLOCK_MONOTONIC_COARSE on ktime's clock; a record's run: its time */
        x->r[0] = x->now + (x->host ? clock_ns(CLOCK_MONOTONIC_COARSE) : 0);
        return 0;
    case 42: { /* get_numa_node_id: the node of the CPU this thread runs on (getcpu(2)); 0 where it cannot say */
        unsigned int cpu, node;
        x->r[0] = syscall(SYS_getcpu, &cpu, &node, NULL) ? 0 : node;
        return 0;
    }
    case 6: return trace_printk(x);
    case 25: { /* perf_event_output(ctx, map, flags, data, size): flags beyond the CPU index get -EINVAL and
                * no record (bpf_trace.c), as on the VM and the GPU */
        int k;
        if (x->r[3] <= 0xffffffffu) return output(x, 2, 4, 5);
        if (output_map(x, 2, &k)) return -1;
        x->r[0] = (uint64_t)-EINVAL;
        return 0;
    }
    case 130: { /* ringbuf_output(map, data, size, flags): flags beyond BPF_RB_NO_WAKEUP | BPF_RB_FORCE_WAKEUP
                 * get -EINVAL and no record (ringbuf.c) */
        int k;
        if (x->r[4] <= 3) return output(x, 1, 2, 3);
        if (output_map(x, 1, &k)) return -1;
        x->r[0] = (uint64_t)-EINVAL;
        return 0;
    }
    case 131: return reserve(x);
    case 132: case 133: return release(x, id == 132); /* ringbuf_submit, ringbuf_discard */
    case 14: /* get_current_pid_tgid: tgid << 32 | its main thread (helpers.py); a run in the thread that called
              * (uprobes, host-API probes), | that thread, as Linux's (per-thread state is kept under it) */
        x->r[0] = (uint64_t)getpid() << 32 | (uint32_t)(x->caller ? syscall(SYS_gettid) : getpid());
        return 0;
    case 7: /* get_prandom_u32 */
        x->r[0] = prandom_u32();
        return 0;
    case 15: /* get_current_uid_gid: gid << 32 | uid, the real ids of the thread that runs it (helpers.py), as
              * Linux's current_uid_gid; a launch run's are the runtime thread's, the process's */
        x->r[0] = (uint64_t)getgid() << 32 | getuid();
        return 0;
    case 16: return get_comm(x);
    case 4: case 112: return probe_read(x, 0);   /* probe_read, probe_read_user */
    case 45: case 114: return probe_read(x, 1);  /* probe_read_str, probe_read_user_str */
    case 8: case 509: case 510: case 511: case 506: /* smp_processor_id, sm, warp, lane; membar */
        x->r[0] = 0;
        return 0;
    case 503: case 505: return store_dim3(x, NULL); /* block_idx, thread_idx */
    case 504: return store_dim3(x, x->block);
    case 508: return store_dim3(x, x->grid);
    case 507: /* exit: the probe ends, r0 = 0 */
        x->r[0] = 0;
        return 1;
    default:
        x->fault = EGPU_LVM_BAD_INSN;
        return -1;
    }
    x->fault = EGPU_LVM_NO_MEMORY; /* a tracked map's change could not be logged */
    return -1;
}

#define FAIL(kind) do { x->fault = (kind); goto out; } while (0)
#define WRITES_R10(i) (((i)->regs & 15) == 10)

/* BPF_ATOMIC `op` (RFC 9669 5.3: add, or, and, xor, each with BPF_FETCH or not; xchg; cmpxchg against
 * `expected`) on the aligned 4- or 8-byte value at p, as one host atomic (seq_cst, as Linux's fetch forms
 * are fully ordered); *old: the value before. Returns -1 for an unknown op (nothing done). */
#define RMW(T) do { \
        T *v = (T *)(void *)p, o; \
        switch (op) { \
        case 0x00: case 0x01: o = __atomic_fetch_add(v, (T)operand, __ATOMIC_SEQ_CST); break; \
        case 0x40: case 0x41: o = __atomic_fetch_or(v, (T)operand, __ATOMIC_SEQ_CST); break; \
        case 0x50: case 0x51: o = __atomic_fetch_and(v, (T)operand, __ATOMIC_SEQ_CST); break; \
        case 0xa0: case 0xa1: o = __atomic_fetch_xor(v, (T)operand, __ATOMIC_SEQ_CST); break; \
        case 0xe1: o = __atomic_exchange_n(v, (T)operand, __ATOMIC_SEQ_CST); break; \
        case 0xf1: \
            o = (T)expected; \
            __atomic_compare_exchange_n(v, &o, (T)operand, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); \
            break; \
        default: return -1; \
        } \
        *old = o; \
    } while (0)

static int atomic_rmw(unsigned char *p, int size, int32_t op, uint64_t operand, uint64_t expected, uint64_t *old) {
    if (size == 4) RMW(uint32_t);
    else RMW(uint64_t);
    return 0;
}

/* The C library's memset, never inlined: gcc's inline `rep stos` for a frame took 40% of a host uprobe's
 * run (bench/bench_uprobe.py), where the library's vector stores take a few ns. */
static void *(*volatile clear)(void *, int, size_t) = memset;

/* A bpf-to-bpf call's fresh, zeroed frame, r6-r9 saved; `ret` is where the callee's exit goes. Returns -1 (the
 * fault set) past MAX_FRAMES. */
static int enter_frame(struct run *x, size_t ret) {
    if (x->depth + 1 >= MAX_FRAMES) {
        x->fault = EGPU_LVM_DEPTH;
        return -1;
    }
    x->calls[x->depth].ret = ret;
    memcpy(x->calls[x->depth].saved, &x->r[6], sizeof x->calls[x->depth].saved);
    x->depth++;
    memset(x->frames[x->depth], 0, STACK_SIZE);
    x->r[10] = ((R_FRAME + (uint64_t)x->depth) << REGION_SHIFT) + STACK_SIZE;
    return 0;
}

/* The innermost bpf_loop's next round: its callback called (Linux's callback(i, ctx, 0, 0, 0)) in a fresh frame
 * one deeper than the call, which is never past MAX_FRAMES (the call's first round was not). Returns its pc. */
static size_t enter_round(struct run *x) {
    enter_frame(x, ROUND);
    x->r[1] = x->loops[x->nloops - 1].index, x->r[2] = x->loops[x->nloops - 1].ctx;
    x->r[3] = x->r[4] = x->r[5] = 0;
    return x->loops[x->nloops - 1].callback;
}

/* bpf_loop(nr_loops, callback, ctx, flags) at *pc_at, as Linux's and the VM's (vm/machine.py): flags other than 0
 * give -EINVAL, nr_loops (its low 32 bits) past MAX_LOOPS -E2BIG, 0 rounds r0 = 0, all without a call; else the
 * first round, *pc_at the callback's. Returns -1 (the fault set) when r2 is no function's address or the frame
 * would be past MAX_FRAMES. */
static int bpf_loop(struct run *x, size_t *pc_at) {
    uint32_t rounds = (uint32_t)x->r[1];
    uint64_t callback = x->r[2] - FUNC_HANDLE(0);
    if (x->r[4] || !rounds || rounds > MAX_LOOPS) {
        x->r[0] = x->r[4] ? (uint64_t)-EINVAL : rounds ? (uint64_t)-E2BIG : 0;
        ++*pc_at;
        return 0;
    }
    if (callback >= x->p->n || !x->p->ops[callback].start) {
        x->fault = EGPU_LVM_BAD_INSN;
        return -1;
    }
    if (x->depth + 1 >= MAX_FRAMES) {
        x->fault = EGPU_LVM_DEPTH;
        return -1;
    }
    x->loops[x->nloops].callback = callback, x->loops[x->nloops].ret = *pc_at + 1, x->loops[x->nloops].ctx = x->r[3];
    x->loops[x->nloops].rounds = rounds, x->loops[x->nloops].index = 0;
    x->nloops++;
    *pc_at = enter_round(x);
    return 0;
}

/* A bpf-to-bpf call's exit: the caller's r6-r9 and frame back; returns where the caller goes on. A callback's
 * ends its round: a non-zero r0 (1: the verifier allows no other) or the last index ends the loop with r0 = the
 * rounds made, else the next round starts. */
static size_t leave_frame(struct run *x) {
    x->depth--;
    memcpy(&x->r[6], x->calls[x->depth].saved, sizeof x->calls[x->depth].saved);
    x->r[10] = ((R_FRAME + (uint64_t)x->depth) << REGION_SHIFT) + STACK_SIZE;
    if (x->calls[x->depth].ret != ROUND) return x->calls[x->depth].ret;
    uint32_t made = ++x->loops[x->nloops - 1].index;
    if (!x->r[0] && made < x->loops[x->nloops - 1].rounds) return enter_round(x);
    x->r[0] = made;
    return x->loops[--x->nloops].ret;
}

/* The instruction at *pc_at the long way, each field checked as it is used: what decode() leaves to
 * OP_SLOW (bad instructions, bpf-to-bpf calls, bpf_loop, atomics, division, sign extension, ...). Returns 0 with
 * *pc_at moved on, 1 when the program ends, -1 on a fault (x->fault set, *pc_at left at the instruction). */
static int step(struct run *x, size_t *pc_at) {
    const struct egpu_lvm_prog *p = x->p;
    size_t pc = *pc_at;
    const struct insn *i = &p->insns[pc];
    int cls = i->code & 7, dst = i->regs & 15, src = i->regs >> 4, size, bits;
    uint64_t v;
    if (dst > 10 || src > 10) FAIL(EGPU_LVM_BAD_INSN);
    switch (cls) {
    case 4: case 7: /* ALU, ALU64 */
        if (WRITES_R10(i) || alu(x, i, cls == 7 ? 64 : 32)) FAIL(EGPU_LVM_BAD_INSN);
        pc++;
        break;
    case 0: { /* lddw */
        if (i->code != 0x18 || pc + 1 >= p->n || WRITES_R10(i)) FAIL(EGPU_LVM_BAD_INSN);
        uint32_t lo = (uint32_t)i->imm, hi = (uint32_t)p->insns[pc + 1].imm;
        if (src == 0) {
            x->r[dst] = (uint64_t)hi << 32 | lo;
        } else if (src == 5) { /* map by index (NULL: a ring or perf buffer the runtime keeps: output) */
            if (hi || lo >= p->nmaps) FAIL(EGPU_LVM_NOT_A_MAP);
            x->r[dst] = MAP_HANDLE(lo);
        } else if (src == 4) { /* a function's address (bpf_loop's callback), relative to the next slot */
            x->r[dst] = FUNC_HANDLE(pc + 1 + (uint64_t)(int64_t)i->imm);
        } else if (src == 6) { /* a map's value 0 (global data) + offset */
            if (lo >= p->nmaps || !p->maps[lo] || is_hash(p->maps[lo]) || is_keyless(p->maps[lo]->type))
                FAIL(EGPU_LVM_NOT_A_MAP);
            static const unsigned char key0[4];
            int s0 = p->maps[lo]->max_entries ? 0 : -1;
            if (watch(x, p->maps[lo], key0, s0)) FAIL(EGPU_LVM_NO_MEMORY);
            x->r[dst] = value_address(lo, p->maps[lo], s0) + hi;
        } else {
            FAIL(EGPU_LVM_BAD_INSN);
        }
        pc += 2;
        break;
    }
    case 1: /* ldx: mem, memsx */
        size = (int[]){4, 2, 1, 8}[(i->code >> 3) & 3];
        if (((i->code & 0xe0) != 0x60 && (i->code & 0xe0) != 0x80) || WRITES_R10(i)) FAIL(EGPU_LVM_BAD_INSN);
        if (load(x, x->r[src] + (uint64_t)(int64_t)i->off, size, &v)) goto out;
        x->r[dst] = (i->code & 0xe0) == 0x80 ? (uint64_t)sext(v, 8 * size) : v;
        pc++;
        break;
    case 2: case 3: { /* st, stx: mem, atomic */
        size = (int[]){4, 2, 1, 8}[(i->code >> 3) & 3];
        uint64_t addr = x->r[dst] + (uint64_t)(int64_t)i->off;
        if ((i->code & 0xe0) == 0x60) {
            if (store(x, addr, size, cls == 2 ? (uint64_t)(int64_t)i->imm : x->r[src])) goto out;
            pc++;
            break;
        }
        if (cls != 3 || (i->code & 0xe0) != 0xc0 || (size != 4 && size != 8)) FAIL(EGPU_LVM_BAD_INSN);
        if (addr % size) FAIL(EGPU_LVM_UNALIGNED);
        uint64_t m = mask(8 * size), old, operand = x->r[src] & m;
        unsigned char *host = at(x, addr, (unsigned int)size, 1);
        if (!host && x->fault != EGPU_LVM_READ_ONLY) goto out;
        x->fault = 0; /* read-only: the steps below fault as the VM does, a failed cmpxchg not at all */
        if (host && !((uintptr_t)host % (uintptr_t)size)) { /* memory other threads may share: the host's atomic */
            int r = atomic_rmw(host, size, i->imm, operand, x->r[0] & m, &old);
            if (r < 0) FAIL(EGPU_LVM_BAD_INSN);
            if (i->imm == 0xf1) x->r[0] = old;
            else if (i->imm & 1) x->r[src] = old;
            pc++;
            break;
        }
        if (load(x, addr, size, &old)) goto out;
        switch (i->imm) {
        case 0x00: case 0x01: v = old + operand; break;
        case 0x40: case 0x41: v = old | operand; break;
        case 0x50: case 0x51: v = old & operand; break;
        case 0xa0: case 0xa1: v = old ^ operand; break;
        case 0xe1: v = operand; break;
        case 0xf1: /* cmpxchg: compares with r0, which gets the old value */
            if (old == (x->r[0] & m) && store(x, addr, size, x->r[src])) goto out;
            x->r[0] = old;
            pc++;
            goto done;
        default: FAIL(EGPU_LVM_BAD_INSN);
        }
        if (store(x, addr, size, v)) goto out;
        if (i->imm & 1) x->r[src] = old;
        pc++;
        break;
    }
    case 5: case 6: { /* jmp, jmp32 */
        int op = i->code & 0xf0;
        bits = cls == 5 ? 64 : 32;
        if (op == 0x00) { /* ja; ja32 (gotol) jumps by imm */
            size_t to = pc + 1 + (size_t)(int64_t)(cls == 5 ? i->off : i->imm);
            if (to > p->n) FAIL(EGPU_LVM_BAD_INSN); /* n itself is the end, reached to fault there */
            pc = to;
            break;
        }
        if (op == 0x90 && cls == 5) { /* exit */
            if (x->depth == 0) return 1;
            pc = leave_frame(x);
            break;
        }
        if (op == 0x80 && cls == 5) { /* call */
            if (src == 0 && i->imm == HELPER_LOOP) {
                if (bpf_loop(x, &pc)) goto out;
            } else if (src == 0) {
                int r = helper(x, i->imm);
                if (r < 0) goto out;
                if (r > 0) return 1;
                pc++;
            } else if (src == 1) {
                if (pc + 1 + (size_t)(int64_t)i->imm >= p->n) FAIL(EGPU_LVM_BAD_INSN);
                if (enter_frame(x, pc + 1)) goto out;
                pc += 1 + (size_t)(int64_t)i->imm;
            } else {
                FAIL(EGPU_LVM_BAD_INSN);
            }
            break;
        }
        uint64_t m = mask(bits);
        int t = taken(i, x->r[dst] & m, ((i->code & 0x08) ? x->r[src] : (uint64_t)(int64_t)i->imm) & m, bits);
        if (t < 0 || pc + 1 + (size_t)(int64_t)i->off > p->n) FAIL(EGPU_LVM_BAD_INSN); /* taken or not */
        pc += 1 + (t ? (size_t)(int64_t)i->off : 0);
        break;
    }
    }
done:
    *pc_at = pc;
    return 0;
out:
    return -1;
}

/* Run from pc 0 with r1, r2 set; returns the fault (0: none), the faulting pc in *fault_pc. */
static int execute(struct run *x, unsigned int *fault_pc) {
#define FORM_LABELS(NAME) [OP_##NAME##64K] = &&NAME##64K, [OP_##NAME##64X] = &&NAME##64X, \
    [OP_##NAME##32K] = &&NAME##32K, [OP_##NAME##32X] = &&NAME##32X,
    static const void *const labels[OP_COUNT] = {
        [OP_SLOW] = &&slow, [OP_END] = &&end, [OP_LDDW] = &&lddw, [OP_CALL] = &&call, [OP_EXIT] = &&exit,
        [OP_JA] = &&ja, [OP_LDX1] = &&ldx1, [OP_LDX2] = &&ldx2, [OP_LDX4] = &&ldx4, [OP_LDX8] = &&ldx8,
        [OP_ST1] = &&st1, [OP_ST2] = &&st2, [OP_ST4] = &&st4, [OP_ST8] = &&st8,
        [OP_STX1] = &&stx1, [OP_STX2] = &&stx2, [OP_STX4] = &&stx4, [OP_STX8] = &&stx8,
        ALU_OPS(FORM_LABELS) JMP_OPS(FORM_LABELS)
    };
    const struct egpu_lvm_prog *p = x->p;
    const struct decoded *o;
    uint64_t *r = x->r;
    size_t pc = 0;
    long budget = BUDGET;
    r[10] = ((R_FRAME + 0) << REGION_SHIFT) + STACK_SIZE;
    if (!x->host) clear(x->frames[0], 0, STACK_SIZE);
#define DISPATCH() do { o = &p->ops[pc]; if (--budget < 0) goto spent; goto *labels[o->op]; } while (0)
#define NEXT(k) do { pc += (k); DISPATCH(); } while (0)
    DISPATCH();
slow:
    switch (step(x, &pc)) {
    case 0: DISPATCH();
    case 1: return EGPU_LVM_OK;
    default: goto out;
    }
end:
    FAIL(EGPU_LVM_BAD_INSN);
spent: /* the end is checked before the budget, as step() did when it ran every instruction */
    FAIL(pc >= p->n ? EGPU_LVM_BAD_INSN : EGPU_LVM_BUDGET);
lddw:
    r[o->dst] = o->imm;
    NEXT(2);
call: {
    int k = helper(x, (int32_t)o->imm);
    if (k < 0) goto out;
    if (k > 0) return EGPU_LVM_OK;
    NEXT(1);
}
exit:
    if (x->depth == 0) return EGPU_LVM_OK;
    pc = leave_frame(x);
    DISPATCH();
ja:
    pc = (size_t)o->off;
    DISPATCH();
#define LDX(S) ldx##S: { \
        uint64_t v; \
        if (load(x, r[o->src] + (uint64_t)(int64_t)o->off, S, &v)) goto out; \
        r[o->dst] = v; \
        NEXT(1); \
    }
#define ST(S, NAME, VALUE) NAME##S: \
    if (store(x, r[o->dst] + (uint64_t)(int64_t)o->off, S, VALUE)) goto out; \
    NEXT(1);
    LDX(1) LDX(2) LDX(4) LDX(8)
    ST(1, st, o->imm) ST(2, st, o->imm) ST(4, st, o->imm) ST(8, st, o->imm)
    ST(1, stx, r[o->src]) ST(2, stx, r[o->src]) ST(4, stx, r[o->src]) ST(8, stx, r[o->src])
#define M32 0xffffffffull
#define ALU(NAME, E64, E32) \
    NAME##64K: { uint64_t a __attribute__((unused)) = r[o->dst], b = o->imm; r[o->dst] = (E64); NEXT(1); } \
    NAME##64X: { uint64_t a __attribute__((unused)) = r[o->dst], b = r[o->src]; r[o->dst] = (E64); NEXT(1); } \
    NAME##32K: { uint64_t a __attribute__((unused)) = r[o->dst] & M32, b = o->imm; r[o->dst] = (E32) & M32; NEXT(1); } \
    NAME##32X: { \
        uint64_t a __attribute__((unused)) = r[o->dst] & M32, b = r[o->src] & M32; \
        r[o->dst] = (E32) & M32; \
        NEXT(1); \
    }
    ALU(ADD, a + b, a + b)
    ALU(SUB, a - b, a - b)
    ALU(MUL, a * b, a * b)
    ALU(OR, a | b, a | b)
    ALU(AND, a & b, a & b)
    ALU(XOR, a ^ b, a ^ b)
    ALU(MOV, b, b)
    ALU(LSH, a << (b & 63), a << (b & 31))
    ALU(RSH, a >> (b & 63), a >> (b & 31))
    ALU(ARSH, (uint64_t)((int64_t)a >> (b & 63)), (uint32_t)((int32_t)a >> (b & 31)))
#define JUMP_IF(COND) do { if (COND) pc = (size_t)o->off; else pc++; DISPATCH(); } while (0)
#define JMP(NAME, T64, T32, OP) \
    NAME##64K: JUMP_IF((T64)r[o->dst] OP (T64)o->imm); \
    NAME##64X: JUMP_IF((T64)r[o->dst] OP (T64)r[o->src]); \
    NAME##32K: JUMP_IF((T32)r[o->dst] OP (T32)o->imm); \
    NAME##32X: JUMP_IF((T32)r[o->dst] OP (T32)r[o->src]);
    JMP(JEQ, uint64_t, uint32_t, ==)
    JMP(JGT, uint64_t, uint32_t, >)
    JMP(JGE, uint64_t, uint32_t, >=)
    JMP(JSET, uint64_t, uint32_t, &)
    JMP(JNE, uint64_t, uint32_t, !=)
    JMP(JSGT, int64_t, int32_t, >)
    JMP(JSGE, int64_t, int32_t, >=)
    JMP(JLT, uint64_t, uint32_t, <)
    JMP(JLE, uint64_t, uint32_t, <=)
    JMP(JSLT, int64_t, int32_t, <)
    JMP(JSLE, int64_t, int32_t, <=)
out:
    *fault_pc = (unsigned int)pc;
    return x->fault;
}

/* CPU 0, the one every host thread runs on (launchvm.c's header): held across a run of a program with a per-CPU
 * map (a mutex: a run may take a while), inside route_lock, outside the maps' locks. */
static pthread_mutex_t cpu_lock = PTHREAD_MUTEX_INITIALIZER;

/* One run of `p` from fresh registers and frames: r1 = the context (`ctx`, `size` bytes; 0 when NULL),
 * r2 = `r2`; the watched values settled after. Counted in egpu_lvm_held. Returns the fault (0: none), its pc in
 * *fault_pc. */
static int run_program(struct run *x, const struct egpu_lvm_prog *p, unsigned char *ctx, size_t size, int writable,
                       uint64_t r2, uint64_t now, const unsigned int *grid, const unsigned int *block,
                       unsigned int *fault_pc) {
    memset(x->r, 0, sizeof x->r);
    x->p = p, x->ctx = ctx, x->ctx_size = size, x->ctx_writable = writable, x->depth = 0, x->nloops = 0, x->fault = 0;
    x->now = now, x->grid = grid, x->block = block, x->nwatch = 0, x->watch_used = 0, x->noverflow = 0;
    memset(x->reserved, 0, sizeof x->reserved);
    x->r[1] = ctx ? R_CTX << REGION_SHIFT : 0, x->r[2] = r2;
    *fault_pc = 0;
    if (p->percpu && pthread_mutex_trylock(&cpu_lock)) {
        /* the take waits for this thread too where it holds the GIL: a run waiting for room with cpu_lock must
         * give up, or the take, and the job's Python with it, stands still for the stall */
        int blocks = tls_trace_taker || (atomic_load(&trace_stall_ns) && egpu_gil_held());
        if (blocks) atomic_fetch_add(&taker_blocked, 1);
        pthread_mutex_lock(&cpu_lock);
        if (blocks) atomic_fetch_sub(&taker_blocked, 1);
    }
    execute(x, fault_pc);
    settle(x);
    if (p->percpu) pthread_mutex_unlock(&cpu_lock);
    return x->fault;
}

EXPORT int egpu_lvm_exec(struct egpu_lvm_prog *p, void *mem, size_t len, unsigned long long *r0, unsigned int *pc) {
    static const unsigned int one[3] = {1, 1, 1}; /* a 1x1x1 launch, as the VM's default ThreadSim */
    struct run x; /* 8 KiB of stack: too big for the static TLS a preloaded library may use */
    x.host = 0, x.caller = 0;
    hold(); /* the caller's program: no list to read, but map locks to take */
    int fault = run_program(&x, p, mem, len, 1, len, 0, one, one, pc);
    unhold();
    *r0 = x.r[0];
    return fault;
}

/* ---- host probes (shim/uprobe.c) ---- */

void egpu_lvm_run_host(struct egpu_lvm_prog *p, void *ctx, size_t size, long long offset_ns) {
    static const unsigned int one[3] = {1, 1, 1};
    struct run x; /* 8 KiB of stack, as run_route's */
    unsigned int pc;
    x.host = 1, x.caller = 1;
    int fault = run_program(&x, p, ctx, size, 0, 0, (uint64_t)offset_ns, one, one, &pc);
    count_run(p, fault, pc, 0);
}

/* ---- routes and the drain ---- */

struct route {
    void *function;
    unsigned long long kernel_id;
    int python;
    size_t n;
    struct egpu_lvm_prog **progs;
};

struct egpu_lvm_router {
    struct route *slots;
    size_t mask, count;
};

/* Every router's routes and runs: the runtime's threads route and drain, no application thread. */
static pthread_mutex_t route_lock = PTHREAD_MUTEX_INITIALIZER;

static void route_hold(void) {
    hold();
    pthread_mutex_lock(&route_lock);
}

static void route_release(void) {
    pthread_mutex_unlock(&route_lock);
    unhold();
}

EXPORT struct egpu_lvm_router *egpu_lvm_router_new(void) {
    struct egpu_lvm_router *r = calloc(1, sizeof *r);
    if (r && !(r->slots = calloc(64, sizeof *r->slots))) {
        free(r);
        return NULL;
    }
    if (r) r->mask = 63;
    return r;
}

EXPORT void egpu_lvm_router_clear(struct egpu_lvm_router *r) {
    route_hold();
    for (size_t i = 0; i <= r->mask; i++) free(r->slots[i].progs);
    memset(r->slots, 0, (r->mask + 1) * sizeof *r->slots);
    r->count = 0;
    route_release();
}

EXPORT void egpu_lvm_router_free(struct egpu_lvm_router *r) {
    if (!r) return;
    egpu_lvm_router_clear(r);
    free(r->slots), free(r);
}

/* Handles are keys; NULL, which the app may launch by mistake, is stored as 1 (no handle is). */
static struct route *route_slot(struct route *slots, size_t mask, void *function) {
    function = function ? function : (void *)1;
    size_t i = ((uintptr_t)function >> 4) * 0x9e3779b97f4a7c15ull & mask;
    while (slots[i].function && slots[i].function != function) i = (i + 1) & mask;
    return &slots[i];
}

/* Under route_lock. */
static int route_locked(struct egpu_lvm_router *r, void *function, unsigned long long kernel_id,
                        struct egpu_lvm_prog *const *progs, size_t nprogs, int python) {
    if (2 * (r->count + 1) > r->mask + 1) { /* grow: at most half full */
        size_t mask = 2 * r->mask + 1;
        struct route *slots = calloc(mask + 1, sizeof *slots);
        if (!slots) return -1;
        for (size_t i = 0; i <= r->mask; i++)
            if (r->slots[i].function) *route_slot(slots, mask, r->slots[i].function) = r->slots[i];
        free(r->slots);
        r->slots = slots, r->mask = mask;
    }
    struct egpu_lvm_prog **copy = malloc(nprogs * sizeof *copy + 1);
    if (!copy) return -1;
    memcpy(copy, progs, nprogs * sizeof *copy);
    struct route *s = route_slot(r->slots, r->mask, function);
    if (!s->function) r->count++;
    free(s->progs);
    *s = (struct route){function ? function : (void *)1, kernel_id, python != 0, nprogs, copy};
    return 0;
}

EXPORT int egpu_lvm_route(struct egpu_lvm_router *r, void *function, unsigned long long kernel_id,
                          struct egpu_lvm_prog *const *progs, size_t nprogs, int python) {
    route_hold();
    int rc = route_locked(r, function, kernel_id, progs, nprogs, python);
    route_release();
    return rc;
}

EXPORT void egpu_lvm_context(const struct egpu_launch_record *rec, unsigned long long kernel_id, void *out) {
    unsigned char *c = out;
    unsigned long long stream = (uintptr_t)rec->stream;
    unsigned int kind = KIND_LAUNCH;
    memset(c, 0, CTX_SIZE);
    memcpy(c + CTX_KERNEL_ID, &kernel_id, 8);
    memcpy(c + CTX_LAUNCH_ID, &rec->launch_id, 8);
    memcpy(c + CTX_KIND, &kind, 4);
    memcpy(c + CTX_GRID, rec->grid, 12);
    memcpy(c + CTX_BLOCK, rec->block, 12);
    memcpy(c + CTX_STREAM, &stream, 8);
}

/* Under route_lock. */
static void run_route(const struct route *rt, const struct egpu_launch_record *rec, long long offset_ns) {
    struct run x; /* 8 KiB of stack: too big for the static TLS a preloaded library may use */
    unsigned char ctx[CTX_SIZE];
    x.host = 0, x.caller = 0;
    egpu_lvm_context(rec, rt->kernel_id, ctx);
    for (size_t k = 0; k < rt->n; k++) {
        struct egpu_lvm_prog *p = rt->progs[k];
        unsigned int pc;
        int fault = run_program(&x, p, ctx, CTX_SIZE, 0, 0, rec->time_ns + (unsigned long long)offset_ns, rec->grid,
                                rec->block, &pc);
        count_run(p, fault, pc, rec->launch_id);
    }
}

EXPORT int egpu_lvm_run(struct egpu_lvm_router *r, const struct egpu_launch_record *rec, long long offset_ns) {
    route_hold();
    const struct route *rt = route_slot(r->slots, r->mask, rec->function);
    int found = rt->function != NULL;
    if (found) run_route(rt, rec, offset_ns);
    route_release();
    return found ? 0 : -1;
}

EXPORT size_t egpu_lvm_drain(struct egpu_lvm_router *r, struct egpu_launch_record *out, size_t max,
                             long long offset_ns, unsigned long long *taken) {
    struct egpu_launch_record rec;
    size_t n = 0;
    unsigned long long t = 0;
    route_hold();
    while (n < max && egpu_shim_drain(&rec, 1)) {
        t++;
        const struct route *rt = route_slot(r->slots, r->mask, rec.function);
        if (!rt->function) {
            out[n++] = rec;
            break;
        }
        run_route(rt, &rec, offset_ns);
        if (rt->python) out[n++] = rec;
    }
    route_release();
    if (taken) *taken = t;
    return n;
}

/* ---- host-API probes (shim/hostapi.c): routes by API, runs in the calling thread ---- */

struct api_route {
    size_t n;
    struct egpu_lvm_prog *progs[];
};
/* Read by egpu_lvm_api_routed (a hint) and by runs, in a read section; a list replaced is freed after
 * egpu_lvm_synchronize. */
static _Atomic(struct api_route *) api_routes[EGPU_LVM_APIS];
static _Atomic long long api_offset_ns;
static pthread_mutex_t api_lock = PTHREAD_MUTEX_INITIALIZER; /* one change of the lists at a time */
/* An application thread's stack is not ours to take 7 KiB of: each thread that runs host-API probes gets
 * its run state from the heap, freed when it ends (api_run_key). A handler that interrupts a run on its
 * thread runs none (egpu_lvm_held), so one run at a time uses it. */
static __thread struct run *tls_api_run __attribute__((tls_model("initial-exec")));
static pthread_key_t api_run_key;
static pthread_once_t api_run_once = PTHREAD_ONCE_INIT;

/* The thread ends: its run state freed, and forgotten, since a later key's destructor may still call an API with
 * a program (then the state is made again, and glibc runs this again for it). */
static void api_run_free(void *x) {
    tls_api_run = NULL;
    free(x);
}

static void api_run_key_new(void) {
    if (pthread_key_create(&api_run_key, api_run_free)) api_run_key = (pthread_key_t)-1;
}

/* This thread's run state; NULL when memory is out. */
static struct run *api_run(void) {
    if (tls_api_run) return tls_api_run;
    pthread_once(&api_run_once, api_run_key_new);
    struct run *x = malloc(sizeof *x);
    if (!x || api_run_key == (pthread_key_t)-1 || pthread_setspecific(api_run_key, x)) {
        free(x);
        return NULL;
    }
    x->host = 0; /* its runs' `now` holds the clock already (malloc's bytes may read as a uprobe's run) */
    x->caller = 1;
    return tls_api_run = x;
}

EXPORT int egpu_lvm_route_api(unsigned int api, struct egpu_lvm_prog *const *progs, size_t n) {
    if (api >= EGPU_LVM_APIS) return -1;
    struct api_route *r = NULL;
    if (n) {
        if (!(r = malloc(sizeof *r + n * sizeof *progs))) return -1;
        r->n = n;
        memcpy(r->progs, progs, n * sizeof *progs);
    }
    pthread_mutex_lock(&api_lock);
    struct api_route *old = atomic_exchange(&api_routes[api], r);
    egpu_lvm_synchronize(); /* no run reads the old list any more */
    pthread_mutex_unlock(&api_lock);
    free(old);
    return 0;
}

EXPORT void egpu_lvm_api_clock(long long offset_ns) { atomic_store(&api_offset_ns, offset_ns); }

int egpu_lvm_api_routed(unsigned int api) {
    return atomic_load_explicit(&api_routes[api], memory_order_relaxed) != NULL;
}

void egpu_lvm_run_api(unsigned int api, const void *ctx, size_t size) {
    static const unsigned int one[3] = {1, 1, 1};
    if (egpu_lvm_held) return; /* a signal handler's call, on a thread inside a run or holding a lock of ours */
    unsigned long long now = egpu_now_ns() + (unsigned long long)atomic_load(&api_offset_ns);
    egpu_lvm_reader in = egpu_lvm_enter();
    const struct api_route *r = atomic_load_explicit(&api_routes[api], memory_order_acquire);
    struct run *x = r ? api_run() : NULL;
    for (size_t k = 0; x && k < r->n; k++) {
        struct egpu_lvm_prog *p = r->progs[k];
        unsigned int pc;
        int fault = run_program(x, p, (unsigned char *)ctx, size, 0, 0, now, one, one, &pc); /* read-only */
        count_run(p, fault, pc, 0);
    }
    egpu_lvm_leave(in);
}

/* ---- fork (process.c): no map mid-update in the child ---- */

/* Every lock but the maps' (and the maps' list) taken or let go, in the order the code takes them. */
static void fork_locks(int take) {
    pthread_mutex_t *locks[] = {&api_lock, &sync_lock, &route_lock, &cpu_lock, &maps_lock};
    for (size_t k = 0; k < sizeof locks / sizeof *locks; k++) {
        if (take) pthread_mutex_lock(locks[k]);
        else pthread_mutex_unlock(locks[sizeof locks / sizeof *locks - 1 - k]);
    }
}

/* The child: the other threads are gone, with the runs they were in; their locks are let go as the parent's. */
void egpu_lvm_fork(enum egpu_fork_phase phase) {
    if (phase == EGPU_FORK_PREPARE) {
        hold();
        /* a run waiting for room may hold cpu_lock, and the take waits for route_lock (or the GIL) held here */
        atomic_fetch_add(&taker_blocked, 1);
        fork_locks(1);
        for (struct egpu_lvm_map *m = all_maps; m; m = m->older) spin_lock(&m->lock);
        spin_lock(&trace_lock);
        return;
    }
    spin_unlock(&trace_lock);
    for (struct egpu_lvm_map *m = all_maps; m; m = m->older) {
        if (phase == EGPU_FORK_CHILD) /* the runs of threads gone */
            atomic_store(&m->watching, 0), atomic_store(&m->overflowing, 0);
        spin_unlock(&m->lock);
    }
    if (phase == EGPU_FORK_CHILD) {
        memset(readers, 0, sizeof readers);
        pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
        api_lock = sync_lock = route_lock = cpu_lock = maps_lock = fresh;
        main_comm_once = (pthread_once_t)PTHREAD_ONCE_INIT;
        tls_prandom = 0;
        atomic_store(&trace_stall_ns, 0); /* the thread that takes is gone: a full trace queue drops */
        atomic_store(&taker_blocked, 0), atomic_store(&synchronizing, 0);
    } else {
        fork_locks(0);
        atomic_fetch_sub(&taker_blocked, 1);
    }
    unhold();
}
