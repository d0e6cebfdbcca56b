/* egpu_drain.h: the --trace reader's walk over a ring's records (shim/drain.c), in the three parts of
 * egpu_shim.h.
 *
 * The reader (egpu_preload/runtime/ring_drain.py) copies a ring's unread bytes into host memory and
 * finds the records in it: where their sizes are mixed (warp memory records), each record's place
 * follows from the one before, a walk Python took ~0.8 us a record over. Here it is a few ns; numpy
 * then cuts what was found into the batches the writer takes. Records are laid out as
 * translate/devmaps.py writes them: an 8-byte header (length | flags << 32 | SM id << 40), the data
 * padded to 8 bytes.
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
 * wait for that stream (`wait`: its cuStreamSynchronize): one call, so the reader lets the GIL go once
 * for the pair, not twice. Adds the nanoseconds spent inside the two driver calls to *driver_ns, so that
 * the reader can tell the driver's time from its own and from waiting for the GIL. Returns 0, or the
 * failing call's CUresult with *failed 0 (the copy) or 1 (the wait). */
int egpu_copy_out(void *copy, void *wait, void *dst, unsigned long long src, unsigned long long n, void *stream,
                  unsigned long long *driver_ns, int *failed);

/* ---- part 3: C only ---- */

#endif
