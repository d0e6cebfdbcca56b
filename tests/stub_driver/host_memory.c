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
