/* drain.c: the --trace reader's copies out of a ring and its walk over the records (egpu_drain.h). */
#define _GNU_SOURCE   /* fallocate */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>

#include "egpu_drain.h"

#define EXPORT __attribute__((visibility("default")))

enum { REC_READY = 2, REC_DISCARD = 4, REC_WRAP = 8 };   /* translate/devmaps.py */
#define LENGTH 0xFFFFFFFFULL
#define HEAD (LENGTH | 7ULL << 32)          /* a header's length and state */

static uint64_t word(const unsigned char *buf, uint64_t at)
{
    uint64_t w;
    memcpy(&w, buf + at, 8);
    return w;
}

/* How far ahead of a header the walk asks for memory: each header's place follows from the one before, so the
 * processor cannot run ahead of the walk by itself, and the stage was just written by the copy engine, so none of it
 * is in cache (a walk over 1 GiB of 80-byte records on the CI machine: 5.0 GB/s, 11.2-11.9 GB/s 4-8 KiB ahead). */
enum { WALK_AHEAD = 4096 };

EXPORT unsigned long long egpu_ring_walk(const void *buf, unsigned long long size, unsigned long long k,
                                         unsigned long long stop, long long *starts, unsigned long long *n,
                                         long long *runs, unsigned long long *nruns)
{
    const unsigned char *b = buf;
    uint64_t count = 0, nrun = 0, key = ~0ULL;
    if (stop > (size & ~7ULL))   /* a header is read whole, inside the buffer */
        stop = size & ~7ULL;
    while (k < stop) {
        if (k + WALK_AHEAD < stop)
            __builtin_prefetch(b + k + WALK_AHEAD);
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
typedef int (*record_fn)(void *event, void *stream);                                        /* cuEventRecord */
typedef int (*landed_fn)(void *event);                                                      /* cuEventSynchronize */

enum { HEADER = 64, LINE = 128, RING_NCPU = 32, CONSUMED = 16, COMMITTED = 24 };   /* translate/devmaps.py */
enum { LINES_AT = HEADER + 8 };   /* in p->head: the header and the data's first 8 bytes, then the lines */
/* How often a pass reads the lines and the header again while the records counted, short of head, still grow: those
 * being written as the pass began are done within microseconds, where a copy and its wait take about ten. */
enum { RECOUNTS = 8 };
enum { CALL_OUT, CALL_IN, CALL_WAIT, CALL_RECORD, CALL_LANDED };
_Static_assert(EGPU_PIECES == sizeof ((struct egpu_ring_pass *)0)->events / sizeof(void *), "egpu_drain.h: events[]");
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

/* The first ncpu SMs' lines into p->head after the header; their drop counts summed. */
static int read_lines(struct egpu_ring_pass *p, uint64_t ncpu)
{
    int r = out(p, (unsigned char *)p->head + LINES_AT, p->addr + p->lines_off, ncpu * LINE);
    if (!r) r = sync_(p);
    if (r) return r;
    p->line_drops = 0;
    for (uint64_t c = 0; c < ncpu; c++)
        p->line_drops += word(p->head, LINES_AT + c * LINE + 8);
    return 0;
}

/* The records counted on the lines read last. */
static uint64_t committed(const struct egpu_ring_pass *p)
{
    uint64_t sum = 0;
    for (uint64_t c = 0; c < p->ncpu; c++)
        sum += word(p->head, LINES_AT + c * LINE + COMMITTED);
    return sum;
}

/* The header (with the data's first 8 bytes) into p->head, and the SMs' lines after it where p->lines. For a raw
 * TAKE, once the ring's SMs are known, the lines are read before the header instead (devmaps.py COMMITTED): each
 * count is at most the bytes below head when it is read, and head only grows, so counts that sum to the head read
 * after them prove every record below it complete (*whole). A waiting ring's are read again while they fall short
 * and grow (records being written as the pass began, by producers that stop once the ring is full), RECOUNTS times at
 * most; a dropping ring's (p->lines: marks to reset) once, as its producers do not stop for the reader, whose every
 * wait then is records dropped. */
static int read_header(struct egpu_ring_pass *p, uint64_t *ncpu, int *whole)
{
    unsigned char *h = p->head;
    int early = p->raw && p->ncpu && p->mode == EGPU_PASS_TAKE, recounts = p->lines ? 0 : RECOUNTS, r;
    uint64_t sum = 0, before = 0;
    *whole = 0;
    for (int tries = 0;; tries++) {
        if (early && (r = read_lines(p, p->ncpu)))
            return r;
        sum = early ? committed(p) : 0;
        r = out(p, h, p->addr, LINES_AT);
        if (!r) r = sync_(p);
        if (r) return r;
        p->head_pos = word(h, 0);
        p->dropped = word(h, 24);
        if (!early || sum == p->head_pos || tries == recounts || (tries && sum == before))
            break;
        before = sum;
    }
    *whole = early && sum == p->head_pos;
    uint32_t count;
    memcpy(&count, h + RING_NCPU, 4);
    uint64_t room = (p->head_size - LINES_AT) / LINE;
    *ncpu = count < room ? count : room;
    p->ncpu = (unsigned int)*ncpu;
    return !early && p->lines && *ncpu ? read_lines(p, *ncpu) : 0;
}

/* A dropping ring's SMs that were refused may ask again now that there is room (devmaps.py): queued. */
static int reopen(struct egpu_ring_pass *p, uint64_t ncpu)
{
    for (uint64_t c = 0; c < ncpu; c++) {
        if (word(p->head, LINES_AT + c * LINE) == NO_MARK)
            continue;
        int r = in(p, p->addr + p->lines_off + c * LINE, &NO_MARK, 8);
        if (r) return r;
    }
    return 0;
}

/* A raw pass's copy of stage[from, upto) in pieces, an event recorded after each (egpu_drain.h events), so that the
 * walk reads each piece once it has landed while the copy engine goes on with the next: the walk and the copies take
 * turns no longer. */
struct landing {
    struct egpu_ring_pass *p;
    uint64_t from, end[EGPU_PIECES];   /* piece i: [end[i - 1] (from, for the first), end[i]) */
    unsigned int pieces, landed;       /* pieces copied; of them, those landed */
    uint64_t waited_ns;
    int r;                             /* the first failure */
};

enum { PIECE_MIN = 1 << 20 };   /* smaller pieces would cost more in calls than they save the walk */

static int copy_pieces(struct landing *l, unsigned char *stage, uint64_t src, uint64_t from, uint64_t upto)
{
    struct egpu_ring_pass *p = l->p;
    uint64_t piece = (upto - from + EGPU_PIECES - 1) / EGPU_PIECES;
    piece = piece < PIECE_MIN ? PIECE_MIN : (piece + 7) & ~7ULL;
    l->from = from;
    for (uint64_t at = from; at < upto; at += piece) {
        uint64_t n = upto - at < piece ? upto - at : piece;
        int r = out(p, stage + at, src + at, n);
        if (!r && (r = ((record_fn)p->record)(p->events[l->pieces], p->stream)))
            p->failed = CALL_RECORD;
        if (r) return r;
        l->end[l->pieces++] = at + n;
    }
    return 0;
}

/* Until stage[from, need) has landed, or every piece has: where what has landed ends. */
static uint64_t land(struct landing *l, uint64_t need)
{
    uint64_t t = now_ns();
    while (!l->r && l->landed < l->pieces && (l->landed ? l->end[l->landed - 1] : l->from) < need) {
        if ((l->r = ((landed_fn)l->p->landed)(l->p->events[l->landed])))
            l->p->failed = CALL_LANDED;
        else
            l->landed++;
    }
    l->waited_ns += now_ns() - t;
    return l->r ? 0 : l->landed ? l->end[l->landed - 1] : l->from;
}

/* egpu_ring_walk, each header read only once its piece has landed (l NULL: every byte has). */
static uint64_t walk(struct landing *l, const unsigned char *buf, uint64_t size, uint64_t k, uint64_t stop,
                     long long *starts, unsigned long long *n, long long *runs, unsigned long long *nruns)
{
    if (!l || k < l->from)   /* before the pieces, copied last: scan never walks there (if it did: none walked) */
        return l ? (*n = *nruns = 0, k) : egpu_ring_walk(buf, size, k, stop, starts, n, runs, nruns);
    unsigned long long count = 0, nrun = 0, c, r;
    for (;;) {
        uint64_t upto = land(l, k + 8 < stop ? k + 8 : stop), s = upto < stop ? upto : stop;
        uint64_t end = egpu_ring_walk(buf, size, k, s, starts ? starts + count : NULL, &c, runs ? runs + nrun : NULL,
                                      &r);
        for (unsigned long long i = 0; runs && i < r; i++)
            runs[nrun + i] += (long long)count;   /* a run cut where a piece ends: one more batch, no record less */
        count += c;
        nrun += r;
        if (end < s || end >= stop || l->r || upto < k + 8) {
            *n = count;
            *nruns = nrun;
            return end;
        }
        k = end;
    }
}

/* Every copy on the stream landed (none writes into the stage after the pass), r the pass's failure so far (0: none),
 * which stays the one reported. */
static int all_landed(struct egpu_ring_pass *p, int r)
{
    int failed = p->failed, w = sync_(p);
    if (!r) return w;
    p->failed = failed;
    return r;
}

/* Walk the records of buf[0, size) starting in [k, stop), taking (into starts, runs) those that start before
 * limit, then on without taking to the first one not complete. Returns where the walk ended; *took: the end
 * of the last record taken (-1: none); *stopped: whether it ended at a record not complete. With `raw`, records
 * that end at limit, at stop or before are taken unwalked: limit is a record's end (where an earlier walk ended),
 * every record before it complete since (only the reader clears one), so the walk would find what it already
 * knows. l: the copy's pieces, where it lands in pieces (walk). */
static uint64_t scan(struct landing *l, const unsigned char *buf, uint64_t size, uint64_t k, uint64_t stop,
                     long long limit, int raw, long long *starts, unsigned long long *n, long long *runs,
                     unsigned long long *nruns, long long *took, int *stopped)
{
    uint64_t bound = limit < 0 ? 0 : (uint64_t)limit < stop ? (uint64_t)limit : stop, end = k;
    unsigned long long skipped[2];
    *n = *nruns = 0;
    *took = -1;
    *stopped = 0;
    if (raw && bound == (uint64_t)limit && k < bound) {
        *took = (long long)bound;
        end = bound;
    } else if (k < bound) {
        end = walk(l, buf, size, k, bound, starts, n, runs, nruns);
        if (end > k) *took = (long long)end;
        if (end < bound) {
            *stopped = 1;
            return end;
        }
    }
    if (end < stop) {   /* complete, taken by the next pass */
        uint64_t k2 = end;
        end = walk(l, buf, size, k2, stop, NULL, skipped, NULL, skipped + 1);
        *stopped = end < stop;
    }
    return end;
}

/* What a pass took zeroed in the ring, `from_place` bytes from consumed's place (into the slack) and `from_start`
 * from the data's start, then consumed moved `took` bytes on and the marks reset; waited for. The zeros land before
 * consumed moves past them (a producer's BUSY flag is written after its position is taken: between the two the reader
 * must find no stale READY there); on one stream they land in order. Waited for here: on a stream of their own,
 * unwaited for, they landed behind the next pass's copies, and producers waited for the credit they give (vecadd's
 * warp trace on an H100 idled 0.38 s a run, 2026-12-06e call 4). */
static int give_back(struct egpu_ring_pass *p, uint64_t ncpu, uint64_t from_place, uint64_t from_start, uint64_t took)
{
    uint64_t t = now_ns(), consumed = p->consumed + took;
    int r = in(p, p->addr + HEADER + p->consumed % p->capacity, p->zeros, from_place);
    if (!r && from_start) r = in(p, p->addr + HEADER, p->zeros, from_start);
    if (!r) r = in(p, p->addr + CONSUMED, &consumed, 8);
    if (!r && p->lines) r = reopen(p, ncpu);
    if (!r) r = sync_(p);
    if (!r) p->consumed = consumed;
    p->ns[3] += now_ns() - t;
    return r;
}

/* TAKE's copies and walks; the zeros, consumed and the marks written. */
static int take(struct egpu_ring_pass *p, uint64_t ncpu)
{
    unsigned char *stage = p->stage;
    uint64_t cap = p->capacity, n = p->head_pos - p->consumed;   /* n <= capacity: egpu_ring_pass checked */
    uint64_t first = p->consumed % cap, straight = cap - first;  /* positions before the wrap */
    uint64_t src = p->addr + HEADER + first, stop = n < straight ? n : straight;
    long long limit = (long long)(p->seen - p->consumed), took_a, took_b = -1;
    struct landing pieces = {.p = p}, *l = p->raw && p->events[0] ? &pieces : NULL;
    int stopped, r;
    uint64_t t = now_ns();
    if (l) {   /* first what the walk reads (from where scan's walk starts: its raw take's end), then the rest */
        uint64_t from = limit > 0 && (uint64_t)limit <= stop ? (uint64_t)limit : 0;
        r = copy_pieces(l, stage, src, from, n);
        if (!r && from) r = out(p, stage, src, from);
    } else {
        r = out(p, stage, src, n);   /* first + n < 2 * capacity: the data and its slack */
        if (!r) r = sync_(p);
    }
    p->copied += n;
    uint64_t t1 = now_ns();
    p->ns[1] += t1 - t;
    if (r) return l ? all_landed(p, r) : r;
    uint64_t k = scan(l, stage, n, 0, stop, limit, p->raw, p->starts, &p->n[0], p->runs, &p->nruns[0], &took_a,
                      &stopped);
    t = now_ns();
    uint64_t waited = l ? l->waited_ns : 0;   /* for pieces: the copy's time */
    p->ns[1] += waited;
    p->ns[2] += t - t1 - waited;
    if (l) {   /* every copy landed, those it takes (copied last) among them, before zeros or the spool touch them */
        r = all_landed(p, l->r);
        t1 = now_ns();
        p->ns[1] += t1 - t;
        t = t1;
        if (r) return r;
    }
    if (!stopped && k < n) {
        /* On from the data area's start: a record crossing the wrap ran into the slack to k, so the ring's
         * bytes from k - straight on follow it, copied in after it (over slack the first copy held). */
        r = out(p, stage + k, p->addr + HEADER + (k - straight), n - k);
        if (!r) r = sync_(p);
        p->copied += n - k;
        t1 = now_ns();
        p->ns[1] += t1 - t;
        if (r) return r;
        k = scan(NULL, stage, n, k, n, limit, p->raw, p->starts + p->n[0], &p->n[1], p->runs + p->nruns[0],
                 &p->nruns[1], &took_b, &stopped);
        t = now_ns();
        p->ns[2] += t - t1;
    }
    /* Every record whose header is written lies below head (its producer took its position first), so a walk
     * past n met a header written over: taking it would zero the ring past what was copied (past the zeros'
     * capacity bytes, for a length up to 4 GiB) and move consumed past head. Nothing is written. */
    if (k > n)
        return EGPU_PASS_PAST_HEAD;
    /* past the walk's end: the positions later passes copy again. Not the slack a crossing pass copied over
     * from the data area's start, which no later pass copies (copied - n, where the pass crossed) */
    p->unwalked = n - k;
    p->size = n;
    p->seen = p->consumed + k;
    if (took_a < 0)
        return 0;
    return give_back(p, ncpu, (uint64_t)took_a, took_b < 0 ? 0 : (uint64_t)took_b - straight,
                     took_b < 0 ? (uint64_t)took_a : (uint64_t)took_b);
}

/* TAKE where read_header found every record below head complete: [consumed, head) copied once and taken, unwalked.
 * Where it crosses the wrap, the record at the end either ends there (the data's start then holds the next one's
 * header) or goes on in the slack, its mark at the data's start (REC_WRAP, devmaps.py) saying how far: the records
 * after it start there. Anything else there (none of the two, or a mark past head) and the pass walks, as take(). */
static int take_whole(struct egpu_ring_pass *p, uint64_t ncpu)
{
    uint64_t cap = p->capacity, n = p->head_pos - p->consumed, first = p->consumed % cap, straight = cap - first;
    uint64_t after = n > straight ? n - straight : 0, past = 0, mark = word(p->head, HEADER);
    if (after && mark >> 32 & REC_WRAP)
        past = mark & LENGTH;
    else if (after && !(mark >> 32 & (REC_READY | REC_DISCARD)))
        return take(p, ncpu);
    if (past > after || past & 7)
        return take(p, ncpu);
    uint64_t t = now_ns(), upto = n - after + past;   /* from consumed's place: the data, then the slack */
    int r = out(p, p->stage, p->addr + HEADER + first, upto);
    if (!r && n > upto) r = out(p, (unsigned char *)p->stage + upto, p->addr + HEADER + past, n - upto);
    if (!r) r = sync_(p);   /* the zeros would wait for it too (one stream): waited for here to time it apart */
    p->copied += n;
    p->ns[1] += now_ns() - t;
    if (r) return r;
    p->size = n;
    p->seen = p->head_pos;
    p->whole = n;
    return give_back(p, ncpu, upto, after, n);
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
    p->n[0] = p->n[1] = p->nruns[0] = p->nruns[1] = p->size = p->copied = p->unwalked = p->skipped = p->whole = 0;
    memset(p->ns, 0, sizeof p->ns);
    int whole, r = read_header(p, &ncpu, &whole);
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
    return whole ? take_whole(p, ncpu) : take(p, ncpu);
}


/* ---- passes over every ring in one call, into a spool (egpu_ring_burst) ---- */

/* Whether fd[f] still holds the spool's file f: never a write to, nor a hole in, a file of the job's. */
static int spool_ours(const struct egpu_spool *s, unsigned int f)
{
    struct stat st;
    return !fstat(s->fd[f], &st) && st.st_dev == s->dev[f] && st.st_ino == s->ino[f];
}

/* The chunk's head and bytes written whole to file f (a short write goes on where it stopped), then end[f] moved.
 * Returns 0 or the errno of the write that failed. */
static int spool_append(struct egpu_spool *s, unsigned int f, unsigned int index, const void *bytes, uint64_t n)
{
    if (!spool_ours(s, f))
        return EBADF;
    unsigned char head[EGPU_SPOOL_HEAD] = {0};
    uint32_t i = index;
    memcpy(head, &i, 4);
    memcpy(head + 8, &n, 8);
    struct iovec v[2] = {{head, sizeof head}, {(void *)bytes, (size_t)n}};
    struct iovec *at = v;
    int left = 2;
    while (left) {
        ssize_t w = writev(s->fd[f], at, left);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? errno : ENOSPC;
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
    __atomic_store_n(&s->end[f], s->end[f] + EGPU_SPOOL_HEAD + n, __ATOMIC_RELEASE);
    return 0;
}

EXPORT int egpu_spool_give_back(const struct egpu_spool *s, unsigned int file, unsigned long long from,
                                unsigned long long upto)
{
    if (upto <= from)
        return 0;
    if (file >= s->files)
        return EINVAL;
    if (!spool_ours(s, file))
        return EBADF;
    return fallocate(s->fd[file], FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)from, (off_t)(upto - from))
               ? errno : 0;
}

static void pause_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ULL), (long)(ns % 1000000000ULL)};
    while (nanosleep(&ts, &ts) && errno == EINTR)
        ;
}

/* The spool's writes, on threads of the burst's own, one a file (started at its first chunk, joined before the burst
 * returns): the reader goes on passing while the chunks it took are written. Chunk g goes to file g % files; each
 * file's chunks are written in order. After one fails, every chunk not yet written is dropped: the spool's reader,
 * reading in g's order, stops at the first chunk missing, so the bytes from there on (those written after it in
 * other files too) are counted lost. */
_Static_assert(EGPU_SPOOL_FILES == sizeof ((struct egpu_spool *)0)->fd / sizeof(int), "egpu_drain.h: fd[]");
_Static_assert(EGPU_STAGES == 1 + sizeof ((struct egpu_ring_pass *)0)->spares / sizeof(void *), "spares[]");

struct chunk {
    unsigned int index;   /* the ring's, in the burst's array */
    const void *bytes;
    uint64_t n, before;   /* before: the bytes of the burst's chunks handed before it */
};

struct writer;
struct file_writer {
    struct writer *w;
    unsigned int f;
    uint64_t handed, done;   /* the file's chunks (of the spool's life) handed, and written or dropped */
    int started;             /* 1: its thread runs; -1: none could be started, the reader writes its chunks */
    pthread_cond_t work;     /* a chunk handed to it or the burst's end: each thread woken for its own alone */
    pthread_t thread;
};

struct writer {
    struct egpu_spool *spool;
    pthread_mutex_t lock;
    pthread_cond_t progress;         /* a chunk done */
    struct chunk *queue;             /* `room` chunks a file: each ring's stages all handed at most */
    unsigned int room;
    int closing, failed;
    unsigned int failed_index;       /* the ring of the first chunk (in g's order) not written */
    uint64_t first_lost;             /* its `before` */
    uint64_t handed_bytes, write_ns; /* the burst's chunks' bytes; time in the writes, every thread's summed */
    struct file_writer files[EGPU_SPOOL_FILES];
};

/* File f's next chunk written (or dropped: it comes after one that failed), counted; called with the lock held,
 * which it lets go around the write. A chunk before the first one lost is still written: the spool's reader
 * reaches it. */
static void write_next(struct file_writer *fw)
{
    struct writer *w = fw->w;
    struct chunk c = w->queue[fw->f * w->room + fw->done % w->room];
    int dropped = w->failed && c.before > w->first_lost;
    pthread_mutex_unlock(&w->lock);
    uint64_t t = now_ns();
    int r = dropped ? 0 : spool_append(w->spool, fw->f, c.index, c.bytes, c.n);
    t = now_ns() - t;
    pthread_mutex_lock(&w->lock);
    w->write_ns += t;
    if (r && (!w->failed || c.before < w->first_lost)) {   /* the first chunk lost, in g's order, so far */
        w->failed_index = c.index;
        w->first_lost = c.before;
        w->spool->error = r;
        __atomic_store_n(&w->failed, 1, __ATOMIC_RELAXED);   /* the reader looks between passes, unlocked */
    }
    fw->done++;
    pthread_cond_signal(&w->progress);   /* the reader alone waits on it */
}

static void *write_chunks(void *arg)
{
    struct file_writer *fw = arg;
    struct writer *w = fw->w;
    pthread_mutex_lock(&w->lock);
    for (;;) {
        while (fw->done == fw->handed && !w->closing)
            pthread_cond_wait(&fw->work, &w->lock);
        if (fw->done == fw->handed)
            break;
        write_next(fw);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

/* ring `index`'s bytes handed to their file's writer (started at its first; where no thread can be started, written
 * here, as before there were any). Returns the chunk's number g + 1, which wait_done takes. */
static uint64_t hand(struct writer *w, unsigned int index, const void *bytes, uint64_t n)
{
    pthread_mutex_lock(&w->lock);
    uint64_t g = w->spool->chunks++;
    struct file_writer *fw = &w->files[g % w->spool->files];
    w->queue[fw->f * w->room + fw->handed % w->room] = (struct chunk){index, bytes, n, w->handed_bytes};
    fw->handed++;
    w->handed_bytes += n;
    if (!fw->started) {   /* with every signal blocked: the job's signals stay with its own threads */
        sigset_t all, was;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &was);
        fw->started = pthread_create(&fw->thread, NULL, write_chunks, fw) == 0 ? 1 : -1;
        pthread_sigmask(SIG_SETMASK, &was, NULL);
    }
    if (fw->started > 0)
        pthread_cond_signal(&fw->work);
    else
        write_next(fw);
    pthread_mutex_unlock(&w->lock);
    return g + 1;
}

/* Until chunk `seq` - 1 is written (0: none); the nanoseconds waited. */
static uint64_t wait_done(struct writer *w, uint64_t seq)
{
    if (!seq)
        return 0;
    struct file_writer *fw = &w->files[(seq - 1) % w->spool->files];
    uint64_t t = now_ns(), nth = (seq - 1) / w->spool->files;   /* its place among its file's chunks */
    pthread_mutex_lock(&w->lock);
    int waited = fw->done <= nth;
    while (fw->done <= nth)
        pthread_cond_wait(&w->progress, &w->lock);
    pthread_mutex_unlock(&w->lock);
    return waited ? now_ns() - t : 0;
}

/* Every chunk handed written, the threads joined; the nanoseconds waited. */
static uint64_t finish(struct writer *w)
{
    uint64_t t = now_ns();
    pthread_mutex_lock(&w->lock);
    w->closing = 1;
    for (unsigned int f = 0; f < w->spool->files; f++)
        pthread_cond_signal(&w->files[f].work);
    pthread_mutex_unlock(&w->lock);
    for (unsigned int f = 0; f < w->spool->files; f++)
        if (w->files[f].started > 0)
            pthread_join(w->files[f].thread, NULL);
    return now_ns() - t;
}

/* A ring's stages (stage[1..]: its spares, where it has them) and the chunk each was last handed as (0: none), which
 * must be written before a pass copies into that stage again. */
struct lane {
    void *stage[EGPU_STAGES];
    uint64_t chunk[EGPU_STAGES];
    unsigned int stages, cur;
};

EXPORT int egpu_ring_burst(struct egpu_ring_pass **rings, unsigned int n, struct egpu_spool *spool,
                           unsigned long long budget_ns, unsigned long long idle_ns, const int *halt,
                           unsigned int *which, unsigned long long *lost, unsigned long long *out)
{
    uint64_t start = now_ns();
    out[0] = out[1] = out[2] = out[3] = out[4] = 0;
    if (spool->files < 1 || spool->files > EGPU_SPOOL_FILES) {
        spool->error = EINVAL;
        *which = 0;
        *lost = 0;
        return EGPU_PASS_SPOOL;
    }
    unsigned int rooms = n ? n : 1;
    struct lane lanes[rooms];
    struct chunk queue[EGPU_SPOOL_FILES * EGPU_STAGES * rooms];   /* a file's room: every ring's stages handed */
    struct writer w = {.spool = spool, .queue = queue, .room = EGPU_STAGES * rooms};
    pthread_mutex_init(&w.lock, NULL);
    pthread_cond_init(&w.progress, NULL);
    for (unsigned int f = 0; f < spool->files; f++) {   /* the file's chunks of the spool's life before this burst */
        uint64_t before = (spool->chunks + spool->files - 1 - f) / spool->files;
        w.files[f] = (struct file_writer){.w = &w, .f = f, .handed = before, .done = before};
        pthread_cond_init(&w.files[f].work, NULL);
    }
    for (unsigned int i = 0; i < n; i++) {
        lanes[i] = (struct lane){.stage = {rings[i]->stage}, .stages = 1};
        for (unsigned int k = 0; k < EGPU_STAGES - 1; k++)
            if (rings[i]->spares[k])
                lanes[i].stage[lanes[i].stages++] = rings[i]->spares[k];
    }
    int r = 0;
    uint64_t took_at = start;   /* when a round last took records */
    do {
        int took = 0;
        for (unsigned int i = 0; i < n && !r && !__atomic_load_n(&w.failed, __ATOMIC_RELAXED); i++) {
            struct egpu_ring_pass *p = rings[i];
            struct lane *l = &lanes[i];
            uint64_t before = p->consumed;
            out[2] += wait_done(&w, l->chunk[l->cur]);   /* the stage this pass copies into is in no chunk */
            p->stage = l->stage[l->cur];
            p->mode = EGPU_PASS_TAKE;
            p->raw = 1;   /* spooled as the ring held them */
            r = egpu_ring_pass(p);
            p->raw = 0;
            for (int k = 0; k < 4; k++)
                p->total_ns[k] += p->ns[k];
            p->total_copied += p->copied;
            p->total_whole += p->whole;
            p->total_unwalked += p->unwalked;
            if (r) {
                *which = i;
            } else if (p->consumed != before) {   /* stage[0, that): what the pass took, in ring order */
                took = 1;
                p->total_taken += p->consumed - before;
                l->chunk[l->cur] = hand(&w, i, p->stage, p->consumed - before);
                l->cur = (l->cur + 1) % l->stages;
            }
        }
        if (r || __atomic_load_n(&w.failed, __ATOMIC_RELAXED))
            break;
        out[0]++;
        if (took)
            took_at = now_ns();
        else if (idle_ns && now_ns() - took_at >= idle_ns) {
            uint64_t t = now_ns();
            pause_ns(idle_ns);
            out[1] += now_ns() - t;
        }
    } while (now_ns() - start < budget_ns && !__atomic_load_n(halt, __ATOMIC_ACQUIRE));
    out[2] += finish(&w);
    out[3] = w.write_ns;
    out[4] = now_ns() - start;
    for (unsigned int i = 0; i < n; i++)
        rings[i]->stage = lanes[i].stage[0];   /* as the caller made it, every chunk written */
    if (w.failed) {   /* reported before a pass's failure: the records it lost are counted */
        *which = w.failed_index;
        *lost = w.handed_bytes - w.first_lost;
        r = EGPU_PASS_SPOOL;
    }
    for (unsigned int f = 0; f < spool->files; f++)
        pthread_cond_destroy(&w.files[f].work);
    pthread_cond_destroy(&w.progress);
    pthread_mutex_destroy(&w.lock);
    return r;
}
