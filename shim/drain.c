/* drain.c: the --trace reader's copies out of a ring and its walk over the records (egpu_drain.h). */
#define _GNU_SOURCE   /* fallocate */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>

#include "egpu_drain.h"

#define EXPORT __attribute__((visibility("default")))

enum { REC_READY = 2, REC_DISCARD = 4 };   /* translate/devmaps.py */
#define LENGTH 0xFFFFFFFFULL
#define HEAD (LENGTH | 7ULL << 32)          /* a header's length and state */

static uint64_t word(const unsigned char *buf, uint64_t at)
{
    uint64_t w;
    memcpy(&w, buf + at, 8);
    return w;
}

EXPORT unsigned long long egpu_ring_walk(const void *buf, unsigned long long size, unsigned long long k,
                                         unsigned long long stop, long long *starts, unsigned long long *n,
                                         long long *runs, unsigned long long *nruns)
{
    const unsigned char *b = buf;
    uint64_t count = 0, nrun = 0, key = ~0ULL;
    if (stop > (size & ~7ULL))   /* a header is read whole, inside the buffer */
        stop = size & ~7ULL;
    while (k < stop) {
        uint64_t head = word(b, k);
        if (!(head >> 32 & (REC_READY | REC_DISCARD)))
            break;
        if ((head & HEAD) != key) {
            key = head & HEAD;
            if (runs) runs[nrun] = (long long)count;
            nrun++;
        }
        if (starts) starts[count] = (long long)k;
        count++;
        k += 8 + (((head & LENGTH) + 7) & ~7ULL);
    }
    *n = count;
    *nruns = nrun;
    return k;
}

EXPORT long long egpu_ring_pack(const void *buf, unsigned long long size, const long long *at,
                                unsigned long long n, void *data, unsigned long long room, long long *offsets,
                                unsigned int *sms)
{
    const unsigned char *b = buf;
    uint64_t m = 0, used = 0;
    offsets[0] = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (at[i] < 0 || (uint64_t)at[i] + 8 > size)
            return -1;
        uint64_t head = word(b, (uint64_t)at[i]), len = head & LENGTH;
        if (!(head >> 32 & REC_READY))
            continue;
        if (len > size - (uint64_t)at[i] - 8 || len > room - used)
            return -1;
        memcpy((unsigned char *)data + used, b + at[i] + 8, len);
        used += len;
        sms[m] = (unsigned int)(head >> 40);
        offsets[++m] = (long long)used;
    }
    return (long long)m;
}


static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

typedef int (*copy_out_fn)(void *dst, unsigned long long src, size_t n, void *stream); /* cuMemcpyDtoHAsync_v2 */
typedef int (*wait_fn)(void *stream);                                                  /* cuStreamSynchronize */

EXPORT int egpu_copy_out(void *copy, void *wait, void *dst, unsigned long long src, unsigned long long n,
                         void *stream, int *failed)
{
    int r = ((copy_out_fn)copy)(dst, src, (size_t)n, stream);
    *failed = r != 0 ? 0 : 1;
    if (r == 0)
        r = ((wait_fn)wait)(stream);
    return r;
}


/* ---- one pass over a ring (egpu_ring_pass) ---- */

typedef int (*copy_in_fn)(unsigned long long dst, const void *src, size_t n, void *stream); /* cuMemcpyHtoDAsync_v2 */

enum { HEADER = 64, LINE = 128, RING_NCPU = 32, CONSUMED = 16 };   /* translate/devmaps.py */
enum { CALL_OUT, CALL_IN, CALL_WAIT };
static const uint64_t NO_MARK = ~0ULL;   /* an SM's line: no size refused */

/* Each returns 0 or the driver's CUresult, naming the call in p->failed. */
static int out(struct egpu_ring_pass *p, void *dst, uint64_t src, uint64_t n)
{
    int r = ((copy_out_fn)p->copy_out)(dst, src, (size_t)n, p->stream);
    if (r) p->failed = CALL_OUT;
    return r;
}

static int in(struct egpu_ring_pass *p, uint64_t dst, const void *src, uint64_t n)
{
    int r = ((copy_in_fn)p->copy_in)(dst, src, (size_t)n, p->stream);
    if (r) p->failed = CALL_IN;
    return r;
}

static int sync_(struct egpu_ring_pass *p)
{
    int r = ((wait_fn)p->wait)(p->stream);
    if (r) p->failed = CALL_WAIT;
    return r;
}

/* The header, and the SMs' lines after it in p->head where p->lines (as many as head_size holds): one wait
 * for both copies. */
static int read_header(struct egpu_ring_pass *p, uint64_t *ncpu)
{
    unsigned char *h = p->head;
    uint32_t count;
    int r = out(p, h, p->addr, RING_NCPU + 4);
    if (!r) r = sync_(p);
    if (r) return r;
    memcpy(&count, h + RING_NCPU, 4);
    uint64_t room = (p->head_size - (RING_NCPU + 4)) / LINE;
    *ncpu = count < room ? count : room;
    p->head_pos = word(h, 0);
    p->dropped = word(h, 24);
    if (!p->lines || !*ncpu) return 0;
    r = out(p, h + RING_NCPU + 4, p->addr + p->lines_off, *ncpu * LINE);
    if (!r) r = sync_(p);
    if (r) return r;
    p->line_drops = 0;
    for (uint64_t c = 0; c < *ncpu; c++)
        p->line_drops += word(h, RING_NCPU + 4 + c * LINE + 8);
    return 0;
}

/* A dropping ring's SMs that were refused may ask again now that there is room (devmaps.py): queued. */
static int reopen(struct egpu_ring_pass *p, uint64_t ncpu)
{
    for (uint64_t c = 0; c < ncpu; c++) {
        if (word(p->head, RING_NCPU + 4 + c * LINE) == NO_MARK)
            continue;
        int r = in(p, p->addr + p->lines_off + c * LINE, &NO_MARK, 8);
        if (r) return r;
    }
    return 0;
}

/* Walk the records of buf[0, size) starting in [k, stop), taking (into starts, runs) those that start before
 * limit, then on without taking to the first one not complete. Returns where the walk ended; *took: the end
 * of the last record taken (-1: none); *stopped: whether it ended at a record not complete. */
static uint64_t scan(const unsigned char *buf, uint64_t size, uint64_t k, uint64_t stop, long long limit,
                     long long *starts, unsigned long long *n, long long *runs, unsigned long long *nruns,
                     long long *took, int *stopped)
{
    uint64_t bound = limit < 0 ? 0 : (uint64_t)limit < stop ? (uint64_t)limit : stop, end = k;
    unsigned long long skipped[2];
    *n = *nruns = 0;
    *took = -1;
    *stopped = 0;
    if (k < bound) {
        end = egpu_ring_walk(buf, size, k, bound, starts, n, runs, nruns);
        if (end > k) *took = (long long)end;
        if (end < bound) {
            *stopped = 1;
            return end;
        }
    }
    if (end < stop) {   /* complete, taken by the next pass */
        uint64_t k2 = end;
        end = egpu_ring_walk(buf, size, k2, stop, NULL, skipped, NULL, skipped + 1);
        *stopped = end < stop;
    }
    return end;
}

/* TAKE's copies and walks; the zeros, consumed and the marks written. */
static int take(struct egpu_ring_pass *p, uint64_t ncpu)
{
    unsigned char *stage = p->stage;
    uint64_t cap = p->capacity, n = p->head_pos - p->consumed;   /* n <= capacity: egpu_ring_pass checked */
    uint64_t first = p->consumed % cap, straight = cap - first;  /* positions before the wrap */
    long long limit = (long long)(p->seen - p->consumed), took_a, took_b = -1;
    int stopped, r;
    uint64_t t = now_ns();
    r = out(p, stage, p->addr + HEADER + first, n);   /* first + n < 2 * capacity: the data and its slack */
    if (!r) r = sync_(p);
    p->copied += n;
    uint64_t t1 = now_ns();
    p->ns[1] += t1 - t;
    if (r) return r;
    uint64_t k = scan(stage, n, 0, n < straight ? n : straight, limit, p->starts, &p->n[0], p->runs, &p->nruns[0],
                      &took_a, &stopped);
    t = now_ns();
    p->ns[2] += t - t1;
    if (!stopped && k < n) {
        /* On from the data area's start: a record crossing the wrap ran into the slack to k, so the ring's
         * bytes from k - straight on follow it, copied in after it (over slack the first copy held). */
        r = out(p, stage + k, p->addr + HEADER + (k - straight), n - k);
        if (!r) r = sync_(p);
        p->copied += n - k;
        t1 = now_ns();
        p->ns[1] += t1 - t;
        if (r) return r;
        k = scan(stage, n, k, n, limit, p->starts + p->n[0], &p->n[1], p->runs + p->nruns[0], &p->nruns[1],
                 &took_b, &stopped);
        t = now_ns();
        p->ns[2] += t - t1;
    }
    /* Every record whose header is written lies below head (its producer took its position first), so a walk
     * past n met a header written over: taking it would zero the ring past what was copied (past the zeros'
     * capacity bytes, for a length up to 4 GiB) and move consumed past head. Nothing is written. */
    if (k > n)
        return EGPU_PASS_PAST_HEAD;
    p->size = n;
    p->seen = p->consumed + k;
    if (took_a < 0)
        return 0;
    /* Zeros copied in before consumed moves past them (a producer's BUSY flag is written after its position is
     * taken: between the two the reader must find no stale READY there); on one stream they land in order. */
    uint64_t zero_a = (uint64_t)took_a, zero_b = took_b < 0 ? 0 : (uint64_t)took_b - straight;
    r = in(p, p->addr + HEADER + first, p->zeros, zero_a);
    if (!r && zero_b) r = in(p, p->addr + HEADER, p->zeros, zero_b);
    uint64_t consumed = p->consumed + (took_b < 0 ? zero_a : (uint64_t)took_b);
    if (!r) r = in(p, p->addr + CONSUMED, &consumed, 8);
    if (!r && p->lines) r = reopen(p, ncpu);
    if (!r) r = sync_(p);
    if (!r) p->consumed = consumed;
    p->ns[3] += now_ns() - t;
    return r;
}

/* SKIP: consumed moved to head unread; the marks reset. */
static int skip(struct egpu_ring_pass *p, uint64_t ncpu)
{
    uint64_t head = p->head_pos;
    int r = 0;
    if (head != p->consumed)
        r = in(p, p->addr + CONSUMED, &head, 8);
    if (!r && p->lines) r = reopen(p, ncpu);
    if (!r) r = sync_(p);
    if (!r) {
        p->skipped += head - p->consumed;
        p->consumed = head;
    }
    return r;
}

EXPORT int egpu_ring_pass(struct egpu_ring_pass *p)
{
    uint64_t ncpu = 0, t = now_ns();
    p->n[0] = p->n[1] = p->nruns[0] = p->nruns[1] = p->size = p->copied = p->skipped = 0;
    memset(p->ns, 0, sizeof p->ns);
    int r = read_header(p, &ncpu);
    p->ns[0] = now_ns() - t;
    if (r || p->mode == EGPU_PASS_COUNT)
        return r;
    /* A producer's position stays within the reader's credit (devmaps.py): head - consumed <= capacity. A head
     * outside that was read while being written or was written over: copying [consumed, head) would run past
     * the staging (capacity bytes) and moving consumed to it could move it back, so the ring is left as it is
     * and the next pass reads the header again. */
    if (p->head_pos - p->consumed > p->capacity)
        return 0;
    if (p->mode == EGPU_PASS_SKIP)
        return skip(p, ncpu);
    if (p->head_pos == p->consumed)
        return 0;
    if (!p->stage)
        return EGPU_PASS_NO_STAGING;
    return take(p, ncpu);
}


/* ---- passes over every ring in one call, into a spool (egpu_ring_burst) ---- */

/* The chunk's head and bytes written whole (a short write goes on where it stopped), then spool->end moved. */
static int spool_append(struct egpu_spool *s, unsigned int index, const void *bytes, uint64_t n)
{
    unsigned char head[EGPU_SPOOL_HEAD] = {0};
    uint32_t i = index;
    memcpy(head, &i, 4);
    memcpy(head + 8, &n, 8);
    struct iovec v[2] = {{head, sizeof head}, {(void *)bytes, (size_t)n}};
    struct iovec *at = v;
    int left = 2;
    while (left) {
        ssize_t w = writev(s->fd, at, left);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            s->error = w < 0 ? errno : ENOSPC;
            return EGPU_PASS_SPOOL;
        }
        while (left && (size_t)w >= at->iov_len) {
            w -= (ssize_t)at->iov_len;
            at++;
            left--;
        }
        if (left) {
            at->iov_base = (unsigned char *)at->iov_base + w;
            at->iov_len -= (size_t)w;
        }
    }
    __atomic_store_n(&s->end, s->end + EGPU_SPOOL_HEAD + n, __ATOMIC_RELEASE);
    return 0;
}

EXPORT int egpu_spool_give_back(const struct egpu_spool *s, unsigned long long from, unsigned long long upto)
{
    if (upto <= from)
        return 0;
    return fallocate(s->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)from, (off_t)(upto - from)) ? errno : 0;
}

static void pause_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ULL), (long)(ns % 1000000000ULL)};
    while (nanosleep(&ts, &ts) && errno == EINTR)
        ;
}

EXPORT int egpu_ring_burst(struct egpu_ring_pass **rings, unsigned int n, struct egpu_spool *spool,
                           unsigned long long budget_ns, unsigned long long idle_ns, const int *halt,
                           unsigned int *which, unsigned long long *lost, unsigned long long *out)
{
    uint64_t start = now_ns();
    out[0] = out[1] = out[2] = 0;
    do {
        int took = 0;
        for (unsigned int i = 0; i < n; i++) {
            struct egpu_ring_pass *p = rings[i];
            uint64_t before = p->consumed;
            p->mode = EGPU_PASS_TAKE;
            int r = egpu_ring_pass(p);
            for (int k = 0; k < 4; k++)
                p->total_ns[k] += p->ns[k];
            p->total_copied += p->copied;
            if (!r && p->consumed != before) {   /* stage[0, that): what the pass took, in ring order */
                took = 1;
                uint64_t t = now_ns();
                p->total_taken += p->consumed - before;
                r = spool_append(spool, i, p->stage, p->consumed - before);
                if (r) *lost = p->consumed - before;
                out[2] += now_ns() - t;
            }
            if (r) {
                *which = i;
                return r;
            }
        }
        out[0]++;
        if (!took && idle_ns) {
            uint64_t t = now_ns();
            pause_ns(idle_ns);
            out[1] += now_ns() - t;
        }
    } while (now_ns() - start < budget_ns && !__atomic_load_n(halt, __ATOMIC_ACQUIRE));
    return 0;
}
