"""The spool between the --trace reader and its writer: unlinked files beside the trace file, which the reader's
bursts append to in C (shim/drain.c egpu_ring_burst, on threads of the burst's own while its passes go on, one a
file: each pass's records as the ring held them, a chunk a pass, the chunks dealt to the files in turn) and the
writer's thread reads back in the order they were taken, at its own pace (``taken``). Several files because a
filesystem writes one file's buffered writes one at a time (under its inode's lock): one thread appending to one
file wrote 5.6 GB/s on an H100's host and held the passes up 1.14 s of vecadd's 2.81 s (2026-12-06b); on the CI
machine two threads wrote two files 2x faster than one, and one file no faster.

Why a file and not a queue: the reader must never wait, or producers made to wait (``--on-full wait``) stall the
job's kernels, while the writer (Python and pyarrow) runs only when it has the GIL, which a job's busy threads hold
up to the switch interval at a time (in PyTorch eager's warp trace on an H100 the reader that waited for it and for
the writer made a traced step 753-876 ms, the reader in C with this spool 154-168 ms:
docs/gpu-results/2026-12-06-h100.md). A queue held in memory would make the job's memory the bound on a trace's
backlog; the spool's bound is the disk the trace goes to, and the page cache keeps what the writer reads back soon.
What the writer has read back is given back to the disk (a hole punched, GIVE_BACK at a time), so the spool holds
about what the writer lags by, not the whole trace's raw bytes until exit (where the filesystem has no holes, it
does). Unlinked at once, so a job killed mid-trace leaves none behind (its trace file keeps what the writer had
written).
"""

from __future__ import annotations

import os
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

from egpu_preload.descriptors import Held, high
from egpu_preload.errors import EgpuError
from egpu_preload.runtime import ring_drain
from egpu_preload.runtime.ring_drain import Taken, records_in

HEAD = struct.Struct("<IIQ")   # a chunk's: the ring's index, 0, the bytes after (shim/egpu_drain.h egpu_spool)
READ = 64 << 20                # bytes read back at once (whole chunks; one chunk larger is read alone)
GIVE_BACK = 16 << 20           # bytes read back before they are given back to the disk (a multiple of its blocks)
# Files written at once, at most (shim/egpu_drain.h EGPU_SPOOL_FILES): one for every CPUS_A_FILE CPUs, since each
# file's thread competes with the reader, the writer and the job (on the CI machine's two CPUs, two files made the
# reader's copies and walk slower than one file did: bench/bench_drain.py beside a busy thread).
FILES = 4
CPUS_A_FILE = 4


def _unlinked(directory: Path) -> int:
    """A file of no name in ``directory`` open for reading and writing, on a number of egpu's (descriptors.high):
O_TMPFILE, or where the filesystem has none, one made and unlinked at once."""
    try:
        return high(os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600))
    except (AttributeError, OSError):
        fd, name = tempfile.mkstemp(dir=directory, prefix=".egpu-spool-")
        os.unlink(name)
        return high(fd)


class Unreadable(EgpuError):
    """The spool could not be read back: an OS error, or bytes that are no chunks (never written so by the C)."""


class Spool:
    """The spool of the trace file ``near``: ``c``, the shim's struct egpu_spool the reader's bursts append to;
    ``taken()``, the chunks written since the last call, as each ring's records."""

    def __init__(self, near: Path, files: int | None = None) -> None:
        """``files``: how many (by default one for every CPUS_A_FILE CPUs; FILES at most). Raises OSError where no
        file can be made beside ``near``."""
        self.files = min(files or max(1, (os.cpu_count() or 1) // CPUS_A_FILE), FILES)
        ffi, self._lib = ring_drain._shim()   # the shim's (or a test's)
        self.held: list[Held] = []
        try:
            for _ in range(self.files):
                self.held.append(Held(_unlinked(near.parent), pin=True))
        except OSError:
            for held in self.held:
                held.close()
            raise
        self.c = ffi.new("struct egpu_spool *")
        self.c.files = self.files
        for f, held in enumerate(self.held):
            self.c.fd[f] = held.fd
            self.c.dev[f], self.c.ino[f] = held.file
        self.next = 0                        # the chunk taken() hands on next (chunk g: in file g % files)
        self.read_at = [0] * self.files      # each file's chunks handed on end there
        # each file's bytes before it given back to the disk (None: the filesystem can't)
        self.given_back: list[int | None] = [0] * self.files

    def pending(self) -> bool:
        """Whether a whole chunk waits that taken() has not handed on."""
        f = self.next % self.files
        return self.c.end[f] > self.read_at[f]

    def taken(self) -> Iterator[tuple[int, Taken]]:
        """(ring index, its records) of the whole chunks written when the call began and not handed on yet, in the
        order they were taken: READ bytes of them at most (one larger chunk whole), so that a writer behind a reader
        that never pauses goes back between calls to what else it does (its queue, the records due:
        tracefile.flush_due)."""
        self._give_back()
        ends, handed = list(self.c.end[0:self.files]), 0
        while handed < READ:
            f = self.next % self.files
            at, end = self.read_at[f], ends[f]
            if end <= at:
                return
            if end - at < HEAD.size:
                raise Unreadable(f"its file {f}'s chunk at byte {at:,} runs past its end ({end:,})")
            index, _, n = HEAD.unpack(self._read(f, at, HEAD.size))
            if at + HEAD.size + n > end:
                raise Unreadable(f"its file {f}'s chunk at byte {at:,} runs past its end ({end:,})")
            if handed and handed + n > READ:
                return
            chunk = self._read(f, at + HEAD.size, n)
            self.read_at[f] = at + HEAD.size + n   # before the yield: a caller that stops there has had this chunk
            self.next += 1
            handed += n
            try:
                taken = records_in(memoryview(chunk))
            except EgpuError as e:
                raise Unreadable(str(e)) from None
            yield index, taken

    def lost(self) -> str | None:
        """Why a file of the spool is no longer egpu's, where one is not: a job that closes its descriptors (a
        daemon) closed it, and what is on its number now, if anything, is the job's. Such a file cannot be opened
        again (it has no name)."""
        for f, held in enumerate(self.held):
            if held.fd >= 0 and not held.ours():
                return f"the job closed egpu's descriptor of its file {f} (fd {held.fd}), as a daemon closes every one"
        return None

    def _read(self, f: int, at: int, n: int) -> bytes:
        if (why := self.lost()) is not None:   # never a read of the job's file
            raise Unreadable(why)
        try:
            buf = os.pread(self.held[f].fd, n, at)
        except OSError as e:
            raise Unreadable(str(e)) from None
        if len(buf) < n:
            raise Unreadable(f"{n:,} bytes at byte {at:,} of its file {f} read as {len(buf):,}")
        return buf

    def _give_back(self) -> None:
        """Each file's bytes read back given back to the disk, GIVE_BACK at a time; where the filesystem has no
        holes (or fails to punch one), the spool keeps them until it is closed."""
        for f, done in enumerate(self.given_back):
            upto = self.read_at[f] // GIVE_BACK * GIVE_BACK
            if done is None or upto <= done:
                continue
            if self._lib.egpu_spool_give_back(self.c, f, done, upto):
                self.given_back[f] = None
                continue
            self.given_back[f] = upto

    def close(self) -> None:
        """The files closed, once (a forked child closes its parent's: streaming.Streaming.let_go), each where its
        number is still egpu's (a job that closed it may have reused it); the C's appends fail after (EBADF), never
        reaching a file opened later under the same number."""
        for f, held in enumerate(self.held):
            held.close()
            self.c.fd[f] = -1
