/* egpu_drain.h: the --trace reader's pass over a ring and its walk over the records (shim/drain.c), in the
 * three parts of egpu_shim.h.
 *
 * The reader (egpu_preload/runtime/ring_drain.py) copies a ring's unread bytes into host memory and
 * finds the records in it: where their sizes are mixed (warp memory records), each record's place
 * follows from the one before, a walk Python took ~0.8 us a record over. Here it is a few ns; numpy
 * then cuts what was found into the batches the writer takes. Records are laid out as
 * translate/devmaps.py writes them: an 8-byte header (length | flags << 32 | SM id << 40), the data
 * padded to 8 bytes. A pass over a ring is one call here too (egpu_ring_pass): its ten or so driver calls,
 * each made from Python, let the GIL go and then waited behind the job's threads to get it back (up to the
 * 5 ms switch interval each: ~90% of a pass in a PyTorch eager job's trace on an H100).
 */
#ifndef EGPU_DRAIN_H
#define EGPU_DRAIN_H

/* ---- part 1: implemented in Python (embedding_api) ---- */

/* ---- part 2: C API for the runtime (cdef) ---- */

/* Walk the records of buf[0, size) that start in [k, stop) (8-aligned offsets) to the first one not
 * complete (neither READY nor DISCARD): each one's offset into starts, their count into *n; into runs,
 * the index in starts of each record whose length or state differs from the one before's (runs[0] = 0),
 * their count into *nruns (starts and runs have room for (stop - k) / 8 + 1, or are NULL: only counted).
 * Returns where the walk ended: the first record not complete, or the end of the last one (past stop
 * where it crosses it). */
unsigned long long egpu_ring_walk(const void *buf, unsigned long long size, unsigned long long k,
                                  unsigned long long stop, long long *starts, unsigned long long *n,
                                  long long *runs, unsigned long long *nruns);

/* The READY records among the n at offsets at[] (DISCARD ones left out), their data copied back to back
 * into data (room for `room` bytes): record i's to data[offsets[i], offsets[i + 1]), its SM id to
 * sms[i]. Returns how many; -1 (what was written is garbage) where one would reach past buf[0, size)
 * or past data's room. */
long long egpu_ring_pack(const void *buf, unsigned long long size, const long long *at, unsigned long long n,
                         void *data, unsigned long long room, long long *offsets, unsigned int *sms);

/* Copy n bytes of device memory at src into dst on stream (`copy`: the driver's cuMemcpyDtoHAsync_v2) and
 * wait for that stream (`wait`: its cuStreamSynchronize): one call, so the caller lets the GIL go once
 * for the pair, not twice (driver.Driver.dtoh_on: checkpoints, map reads). Returns 0, or the failing call's
 * CUresult with *failed 0 (the copy) or 1 (the wait). */
int egpu_copy_out(void *copy, void *wait, void *dst, unsigned long long src, unsigned long long n, void *stream,
                  int *failed);

/* One pass of the reader over one ring (egpu_ring_pass): what it is given, what it gives back. The driver's
 * calls come as addresses (copy_out: cuMemcpyDtoHAsync_v2, copy_in: cuMemcpyHtoDAsync_v2, wait:
 * cuStreamSynchronize, record: cuEventRecord, landed: cuEventSynchronize), all on `stream`. Host memory is the
 * reader's, page-locked where the driver gave it: `head` (head_size bytes) for the header and the data's first 8
 * bytes (a wrap's mark: HEADER + 8 bytes), and the SMs' lines after them; `stage` and `zeros` (capacity bytes
 * each, zeros all zero) and `starts`, `runs` (room for capacity / 8 + 2 each), NULL until the first pass that finds
 * records; `spares` (capacity bytes each, or NULL), a burst's other stages (egpu_ring_burst), which a pass alone
 * never uses. */
struct egpu_ring_pass {
    void *copy_out, *copy_in, *wait, *stream;
    void *record, *landed;     /* where events[0] is not NULL */
    void *events[8];           /* EGPU_PIECES: a burst's pass copies the bytes it walks in pieces, an event recorded
                                * after each, and walks each piece once it has landed while the next ones are copied
                                * (NULL: in one copy, waited for) */
    unsigned long long addr, capacity, lines_off;    /* the ring region's device address; its layout */
    int mode;                  /* EGPU_PASS_TAKE, EGPU_PASS_SKIP or EGPU_PASS_COUNT */
    int lines;                 /* read the SMs' lines (and, taking or skipping, reopen the refused ones) */
    int raw;                   /* TAKE: the records' bytes alone wanted (a burst's, spooled as the ring held them):
                                * those an earlier pass saw complete are taken without a walk into starts and
                                * runs, from the start of the segment (before the wrap, or after it) where they
                                * end to their end (n and nruns then count none of them) */
    void *head, *stage, *zeros;
    void *spares[4];           /* EGPU_STAGES - 1 */
    unsigned long long head_size;
    unsigned int ncpu;                   /* the SMs' lines the header counts (those head_size holds), once read */
    long long *starts, *runs;
    unsigned long long consumed, seen;   /* the reader's state, moved by the pass */
    /* out, this pass's */
    unsigned long long head_pos;         /* the header's head */
    unsigned long long dropped;          /* the header's dropped count */
    unsigned long long line_drops;       /* the lines' drop counts, summed, at the last pass that read them */
    unsigned long long copied;           /* bytes copied out of the ring's data */
    unsigned long long unwalked;         /* of those, bytes past the first record not complete, which a later
                                          * pass copies again (not the slack a copy from the data area's start
                                          * replaced: copied counts that, this does not) */
    unsigned long long skipped;          /* bytes passed over unread (EGPU_PASS_SKIP) */
    unsigned long long whole;            /* bytes taken with no walk, every record below head found complete */
    unsigned long long size;             /* stage[0, size): the records taken, in ring order */
    unsigned long long n[2], nruns[2];   /* the two segments' records (starts from 0, then from n[0]) and runs
                                          * (runs from 0, then from nruns[0]), as egpu_ring_walk gives them */
    unsigned long long ns[4];            /* nanoseconds: header, copy, scan, clear (the first two: the driver's
                                          * calls that read the header and copy the records, and little else) */
    int failed;                          /* the call that failed: 0 copy_out, 1 copy_in, 2 wait, 3 record, 4 landed */
    /* summed over a burst's passes (egpu_ring_burst; its caller zeroes them): ns, copied, unwalked, the bytes
     * taken, those of them taken whole */
    unsigned long long total_ns[4], total_copied, total_unwalked, total_taken, total_whole;
};

enum { EGPU_PASS_TAKE = 0, EGPU_PASS_SKIP = 1, EGPU_PASS_COUNT = 2 };
enum { EGPU_PASS_NO_STAGING = -1, EGPU_PASS_PAST_HEAD = -2 };

/* One pass over the ring, every driver call of it in this one call (the GIL let go once, not per call):
 * the header read (with the SMs' lines where p->lines; for a raw TAKE, once the SMs are known, the lines before
 * it, both read again while the records the lines count (devmaps.py COMMITTED), short of head, still grow, a few
 * times at most), then by mode
 * - TAKE: where head has moved past consumed, the bytes [consumed, head) copied to stage (the data area and
 *   its slack from consumed's place; where the walk crosses the wrap, the rest from the data area's start,
 *   after what the first copy held), walked (egpu_ring_walk) over the records complete in this copy that an
 *   earlier pass saw complete (those starting before seen) into starts and runs, then on to the first not
 *   complete (seen moves there); what it took zeroed in the ring by copies from zeros (never a memset: a
 *   memset is a kernel, which waiting producers may keep from starting), then consumed written past it, then
 *   the refused SMs' marks reset (p->lines); one wait for the writes, in that order on the stream. A raw pass
 *   (a burst's) with events copies the bytes it walks first, in pieces, walking each as it lands, then those it
 *   takes, and waits for every copy before it writes. A raw pass whose lines count every record below head
 *   complete copies [consumed, head) once, walks none of it and takes it all (whole counts it);
 * - SKIP: consumed moved to head unread (skipped counts it), the marks reset (p->lines);
 * - COUNT: nothing more (the counts read).
 * A head before consumed or more than capacity past it (read while being written, or written over) is not acted
 * on by TAKE or SKIP: the ring is left as it is for the next pass.
 * Returns 0; EGPU_PASS_NO_STAGING where records are there and stage is NULL (nothing written: give it and
 * pass again); EGPU_PASS_PAST_HEAD where a record's length runs past head (its header written over: nothing
 * written, seen unmoved); or the failing driver call's CUresult, p->failed naming it. */
int egpu_ring_pass(struct egpu_ring_pass *p);

/* The spool a burst appends to (egpu_ring_burst): `files` files (fd[0, files)), each of chunks, each a 16-byte head
 * (the ring's index in the burst's array, 4 bytes of zero, the bytes that follow: all little-endian) and then the
 * bytes a pass took from that ring, records with their headers as the ring held them, in ring order. Chunk g of the
 * spool's life (`chunks` counts them: the next one's number) is in file g % files, after that file's chunks before
 * it: a file is written by one thread, so several are written at once (a filesystem writes one file's buffered
 * writes one at a time, under its inode's lock). `end[f]`: the bytes of whole chunks written to file f, moved (a
 * release store) after each chunk is; a reader on another thread reads up to it, in g's order. `error`: the errno
 * of the first chunk, in g's order, whose write failed (EBADF where fd[f] no longer holds the file dev[f], ino[f]:
 * a job that closes every descriptor, as a daemon does, may have opened a file of its own on that number). */
struct egpu_spool {
    int fd[4];                       /* EGPU_SPOOL_FILES */
    unsigned int files;
    int error;
    unsigned long long chunks;
    unsigned long long end[4];
    unsigned long long dev[4], ino[4];   /* each file's st_dev, st_ino: written only while fd[f] still holds it */
};

enum { EGPU_PASS_SPOOL = -3, EGPU_SPOOL_HEAD = 16, EGPU_SPOOL_FILES = 4, EGPU_STAGES = 5, EGPU_PIECES = 8 };

/* Passes over rings[0, n) in turn (TAKE, with each one's own `lines`), what each takes appended to spool as a
 * chunk, round after round until budget_ns has passed since the call or *halt is set by another thread (one
 * round at least); a round that took nothing sleeps idle_ns first where none has taken any for idle_ns (before that
 * the rings are polled at once: a pass that found nothing new may have come just before the producers' next
 * records, and on an H100 vecadd's warp trace slept 1.2 s a run in 1 ms pauses where passes came that fast).
 * Every driver call of every pass in this one call: a reader thread that lets the GIL go once a burst waits once
 * for it to come back, not once a pass. Each pass's counts add up into the ring's `total_*` (the burst's caller
 * zeroes them).
 * The chunks are written by threads of the burst's own, one a file, while the passes go on: a ring's passes take
 * its `stage` and its `spares` (those not NULL) in turn, a pass copying into the one whose chunk is written,
 * waiting for the write where it is not yet; the burst returns once every chunk handed is written (or, after a
 * write failed, dropped), `stage` as it was given.
 * Returns 0; or what egpu_ring_pass returned, with *which the ring's index: that ring's consumed and seen are as
 * that pass left them; or EGPU_PASS_SPOOL where a spool write failed (spool->error; whatever a pass returned),
 * with *which the ring of the chunk that failed: the records of the first chunk not written and of those taken
 * after it (which the spool's reader, reading in order, never reaches) were taken from their rings and lost, their
 * bytes counted in *lost. out[0]: the rounds made; out[1]: nanoseconds
 * slept; out[2]: nanoseconds the passes waited for the spool's writes; out[3]: nanoseconds the writes took (every
 * thread's summed); out[4]: nanoseconds the call took. */
int egpu_ring_burst(struct egpu_ring_pass **rings, unsigned int n, struct egpu_spool *spool,
                    unsigned long long budget_ns, unsigned long long idle_ns, const int *halt, unsigned int *which,
                    unsigned long long *lost, unsigned long long *out);

/* The bytes [from, upto) of the spool's file `file`, which its reader has read back, given back to the disk: a hole
 * punched, the file's size and the offsets past it kept (the appender goes on at its end). Returns 0 or the errno
 * (EOPNOTSUPP: the filesystem has no holes). */
int egpu_spool_give_back(const struct egpu_spool *spool, unsigned int file, unsigned long long from,
                         unsigned long long upto);

/* ---- part 3: C only ---- */

#endif
