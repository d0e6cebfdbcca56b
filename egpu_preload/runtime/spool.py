"""The spool between the --trace reader and its writer: an unlinked file beside the trace file, which the
reader's bursts append to in C (shim/drain.c egpu_ring_burst, on a thread of the burst's own while its passes go
on: each pass's records as the ring held them, a chunk a pass) and the writer's thread reads back at its own pace
(``taken``).

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

from egpu_preload.errors import EgpuError
from egpu_preload.runtime import ring_drain
from egpu_preload.runtime.ring_drain import Taken, records_in

HEAD = struct.Struct("<IIQ")   # a chunk's: the ring's index, 0, the bytes after (shim/egpu_drain.h egpu_spool)
READ = 64 << 20                # bytes read back at once (whole chunks; one chunk larger is read alone)
GIVE_BACK = 16 << 20           # bytes read back before they are given back to the disk (a multiple of its blocks)


def _unlinked(directory: Path) -> int:
    """A file of no name in ``directory`` open for reading and writing: O_TMPFILE, or where the filesystem has
    none, one made and unlinked at once."""
    try:
        return os.open(directory, os.O_TMPFILE | os.O_RDWR, 0o600)
    except (AttributeError, OSError):
        fd, name = tempfile.mkstemp(dir=directory, prefix=".egpu-spool-")
        os.unlink(name)
        return fd


class Unreadable(EgpuError):
    """The spool could not be read back: an OS error, or bytes that are no chunks (never written so by the C)."""


class Spool:
    """The spool of the trace file ``near``: ``c``, the shim's struct egpu_spool the reader's bursts append to;
    ``taken()``, the chunks written since the last call, as each ring's records."""

    def __init__(self, near: Path) -> None:
        """Raises OSError where no file can be made beside ``near``."""
        self.fd = _unlinked(near.parent)
        ffi, self._lib = ring_drain._shim()   # the shim's (or a test's)
        self.c = ffi.new("struct egpu_spool *")
        self.c.fd = self.fd
        self.read_at = 0   # the end of the chunks taken() has handed on
        self.given_back: int | None = 0   # the bytes before it given back to the disk (None: the filesystem can't)

    def pending(self) -> bool:
        """Whether whole chunks wait that taken() has not handed on."""
        return self.c.end > self.read_at

    def taken(self) -> Iterator[tuple[int, Taken]]:
        """(ring index, its records) of the whole chunks not handed on yet, in the order they were written: READ
        bytes of them at most (one larger chunk whole), so that a writer behind a reader that never pauses goes
        back between calls to what else it does (its queue, the records due: tracefile.flush_due)."""
        self._give_back()
        base, end = self.read_at, self.c.end
        if end <= base:
            return
        buf = self._read(base, min(end - base, READ))
        at = 0
        while at + HEAD.size <= len(buf):
            index, _, n = HEAD.unpack_from(buf, at)
            if base + at + HEAD.size + n > end:
                raise Unreadable(f"its chunk at byte {base + at:,} runs past its end ({end:,})")
            if at + HEAD.size + n > len(buf):
                if at:
                    break
                buf = self._read(base, HEAD.size + n)   # one chunk larger than READ: read whole
                continue
            chunk = memoryview(buf)[at + HEAD.size:at + HEAD.size + n]
            at += HEAD.size + n
            self.read_at = base + at   # before the yield: a caller that stops there has had this chunk
            try:
                taken = records_in(chunk)
            except EgpuError as e:
                raise Unreadable(str(e)) from None
            yield index, taken

    def _read(self, at: int, n: int) -> bytes:
        try:
            buf = os.pread(self.fd, n, at)
        except OSError as e:
            raise Unreadable(str(e)) from None
        if len(buf) < n:
            raise Unreadable(f"{n:,} bytes at byte {at:,} read as {len(buf):,}")
        return buf

    def _give_back(self) -> None:
        """The bytes read back given back to the disk, GIVE_BACK at a time; where the filesystem has no holes (or
        fails to punch one), the spool keeps them until it is closed."""
        upto = self.read_at // GIVE_BACK * GIVE_BACK
        if self.given_back is None or upto <= self.given_back:
            return
        if self._lib.egpu_spool_give_back(self.c, self.given_back, upto):
            self.given_back = None
            return
        self.given_back = upto

    def close(self) -> None:
        """The file closed, once (a forked child closes its parent's: streaming.Streaming.let_go); the C's appends
        fail after (EBADF), never reaching a file opened later under the same number."""
        if self.fd >= 0:
            os.close(self.fd)
        self.fd = self.c.fd = -1
