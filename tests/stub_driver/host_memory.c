/* host_memory.c: the three driver calls of the ring reader's pass (shim/drain.c egpu_ring_pass:
 * cuMemcpyDtoHAsync_v2, cuMemcpyHtoDAsync_v2, cuStreamSynchronize) over memory of this process, for the
 * reader's tests and benchmark (tests/host_memory.py): the "stream" is a struct stub_memory whose base is
 * device address 0, so that device addresses stay offsets into a bytearray that producer threads write.
 * A copy is done when it returns: a plain memcpy, no lock, while producers write the same bytes, as the
 * GPU's do while a copy engine reads. Each copy is logged (where log is not NULL), and the copies out of
 * [fail_lo, fail_hi) fail with fail_result, every one after the first fail_after of them. */
#include <string.h>

struct stub_copy { int call; unsigned long long device, n, host; };   /* call: 0 out, 1 in */
struct stub_memory {
    unsigned char *base;
    unsigned long long fail_lo, fail_hi;
    long long fail_after;              /* -1: none fails */
    int fail_result;
    struct stub_copy *log;
    unsigned long long room, logged;   /* log's entries; copies made (those past room not kept) */
};

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
    memcpy(dst, m->base + src, n);
    note(m, 0, src, n, dst);
    return 0;
}

int stub_copy_in(unsigned long long dst, const void *src, size_t n, void *stream)
{
    struct stub_memory *m = stream;
    memcpy(m->base + dst, src, n);
    note(m, 1, dst, n, src);
    return 0;
}

int stub_wait(void *stream)
{
    (void)stream;
    return 0;
}

/* The GPU's producers at full speed, in one call (no GIL, as no GPU producer needs it): n records whose
 * bytes lie back to back in data (record k's, its 8-byte header included, at [starts[k], starts[k + 1]),
 * numbered as ring positions) written into the ring of `ring` bytes at device address addr as room appears:
 * the bytes of as many as fit before consumed + ring and start in the current lap (one that crosses the lap's
 * end runs into the slack), then reserved and head moved past them. */
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
        memcpy(m->base + addr + 64 + (unsigned long long)starts[j] % ring, data + starts[j],
               (size_t)(starts[e] - starts[j]));
        __atomic_store_n(&words[1], (unsigned long long)starts[e], __ATOMIC_RELEASE);
        __atomic_store_n(&words[0], (unsigned long long)starts[e], __ATOMIC_RELEASE);
        j = e;
    }
}
