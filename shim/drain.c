/* drain.c: the --trace reader's copies out of a ring and its walk over the records (egpu_drain.h). */
#include <stdint.h>
#include <string.h>
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
                         void *stream, unsigned long long *driver_ns, int *failed)
{
    uint64_t t0 = now_ns();
    int r = ((copy_out_fn)copy)(dst, src, (size_t)n, stream);
    *failed = r != 0 ? 0 : 1;
    if (r == 0)
        r = ((wait_fn)wait)(stream);
    *driver_ns += now_ns() - t0;
    return r;
}
