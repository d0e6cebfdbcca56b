/* host_memory.c: the three driver calls of the ring reader's pass (shim/drain.c egpu_ring_pass:
 * cuMemcpyDtoHAsync_v2, cuMemcpyHtoDAsync_v2, cuStreamSynchronize) over memory of this process, for the
 * reader's tests and benchmark (tests/host_memory.py): the "stream" is a struct stub_memory whose base is
 * device address 0, so that device addresses stay offsets into a bytearray that producer threads write.
 * A copy is done when it returns: a plain memcpy, no lock, while producers write the same bytes, as the
 * GPU's do while a copy engine reads. Each copy is logged (where log is not NULL), and the copies out of
 * [fail_lo, fail_hi) fail with fail_result, every one after the first fail_after of them.
 *
 * A lazy stream is a copy engine at its slowest: its copies out land only when something waits for them (the
 * stream, or an event recorded after them: cuEventRecord, cuEventSynchronize), in order, and a copy in on it
 * lands after them. A reader that reads what it has not waited for reads what the stage held before. */
#include <string.h>

struct stub_copy { int call; unsigned long long device, n, host; };   /* call: 0 out, 1 in */
struct stub_pending { unsigned char *dst; unsigned long long src, n; };
enum { PENDING = 64 };
struct stub_memory {
    unsigned char *base;
    unsigned long long fail_lo, fail_hi;
    long long fail_after;              /* -1: none fails */
    int fail_result;
    struct stub_copy *log;
    unsigned long long room, logged;   /* log's entries; copies made (those past room not kept) */
    int lazy, head_first, counts;      /* counts: the producers count what they commit (stub_produce) */
    struct stub_pending pending[PENDING];
    unsigned long long queued, landed; /* copies out queued on a lazy stream, and of them those landed */
};
struct stub_event { struct stub_memory *stream; unsigned long long upto; };

/* The lazy stream's copies out, up to the upto-th queued, landed. */
static void land(struct stub_memory *m, unsigned long long upto)
{
    for (; m->landed < upto; m->landed++) {
        struct stub_pending *c = &m->pending[m->landed % PENDING];
        memcpy(c->dst, m->base + c->src, c->n);
    }
}

static void note(struct stub_memory *m, int call, unsigned long long device, unsigned long long n, const void *host)
{
    if (m->log && m->logged < m->room)
        m->log[m->logged] = (struct stub_copy){call, device, n, (unsigned long long)host};
    m->logged++;
}

int stub_copy_out(void *dst, unsigned long long src, size_t n, void *stream)
{
    struct stub_memory *m = stream;
    if (m->fail_after >= 0 && m->fail_lo <= src && src < m->fail_hi) {
        if (m->fail_after == 0)
            return m->fail_result;
        m->fail_after--;
    }
    note(m, 0, src, n, dst);
    if (!m->lazy) {
        memcpy(dst, m->base + src, n);
        return 0;
    }
    if (m->queued - m->landed == PENDING)
        land(m, m->landed + 1);
    m->pending[m->queued++ % PENDING] = (struct stub_pending){dst, src, n};
    return 0;
}

int stub_copy_in(unsigned long long dst, const void *src, size_t n, void *stream)
{
    struct stub_memory *m = stream;
    land(m, m->queued);
    memcpy(m->base + dst, src, n);
    note(m, 1, dst, n, src);
    return 0;
}

int stub_wait(void *stream)
{
    struct stub_memory *m = stream;
    land(m, m->queued);
    return 0;
}

int stub_record(void *event, void *stream)
{
    struct stub_event *e = event;
    e->stream = stream;
    e->upto = e->stream->queued;
    return 0;
}

int stub_landed(void *event)
{
    struct stub_event *e = event;
    land(e->stream, e->upto);
    return 0;
}

/* The GPU's producers at full speed, in one call (no GIL, as no GPU producer needs it): n records whose
 * bytes lie back to back in data (record k's, its 8-byte header included, at [starts[k], starts[k + 1]),
 * numbered as ring positions) written into the ring of `ring` bytes at device address addr as room appears:
 * the bytes of as many as fit before consumed + ring and start in the current lap (one that crosses the lap's
 * end runs into the slack), then reserved and head moved past them. With head_first, as the GPU's producers take
 * their positions before they write: reserved and head moved first, then each record's bytes after its header,
 * its header last (a release store), so that passes find records below head not complete yet. A record that crosses
 * the lap's end marks the data's start with the bytes it has past it (devmaps.py REC_WRAP), as the GPU's do; with
 * counts, the bytes of each batch are added to the first SM's line (devmaps.py COMMITTED) once it is written whole
 * and head is past it. */
void stub_produce(struct stub_memory *m, unsigned long long addr, const long long *starts, unsigned long long n,
                  const unsigned char *data, unsigned long long ring)
{
    unsigned long long *words = (unsigned long long *)(m->base + addr);   /* head, reserved, consumed */
    unsigned long long j = 0;
    while (j < n) {
        unsigned long long room = __atomic_load_n(&words[2], __ATOMIC_ACQUIRE) + ring;
        unsigned long long lap = ((unsigned long long)starts[j] / ring + 1) * ring, e = j;
        while (e < n && (unsigned long long)starts[e + 1] <= room && (unsigned long long)starts[e] < lap)
            e++;
        if (e == j)
            continue;
        unsigned char *at = m->base + addr + 64 + (unsigned long long)starts[j] % ring;
        if ((unsigned long long)starts[e] > lap)   /* written before the record is counted */
            __atomic_store_n(&words[8], ((unsigned long long)starts[e] - lap) | 8ULL << 32, __ATOMIC_RELAXED);
        if (m->head_first) {
            __atomic_store_n(&words[1], (unsigned long long)starts[e], __ATOMIC_RELEASE);
            __atomic_store_n(&words[0], (unsigned long long)starts[e], __ATOMIC_RELEASE);
            for (unsigned long long k = j; k < e; k++) {
                unsigned char *rec = at + (starts[k] - starts[j]);
                unsigned long long header;
                memcpy(rec + 8, data + starts[k] + 8, (size_t)(starts[k + 1] - starts[k] - 8));
                memcpy(&header, data + starts[k], 8);
                __atomic_store_n((unsigned long long *)rec, header, __ATOMIC_RELEASE);
            }
        } else {
            memcpy(at, data + starts[j], (size_t)(starts[e] - starts[j]));
            __atomic_store_n(&words[1], (unsigned long long)starts[e], __ATOMIC_RELEASE);
            __atomic_store_n(&words[0], (unsigned long long)starts[e], __ATOMIC_RELEASE);
        }
        if (m->counts)
            __atomic_fetch_add(&words[(64 + 2 * ring + 24) / 8], (unsigned long long)(starts[e] - starts[j]),
                               __ATOMIC_RELEASE);
        j = e;
    }
}
