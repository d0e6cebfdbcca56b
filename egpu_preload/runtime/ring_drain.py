"""The reader that drains ring and perf buffers while kernels run (egpu-run --trace): records are taken
as they are committed, their bytes cleared and ``consumed`` moved, so producers find room again and a
ring made to wait (devmaps.py, ``--on-full wait``) loses nothing while this reader keeps taking records
(its producers give up, counted, only once it has taken nothing for devmaps.WAIT_STALL_NS).

The regions stay in device memory, where the producers' atomics are cheap; the reader copies on the
runtime's own stream (driver.ContextMemory.copies: a non-blocking stream, never the application's, so the
application never synchronizes with it and its kernels keep running while the copies do). A pass over a
ring is one call into C (shim/drain.c egpu_ring_pass): the header read, the records' copies, the walk from
record to record, the zeros and ``consumed`` written back, every driver call of it made there, because
cffi lets the GIL go around each call into C and the reader then waits behind the job's threads to get it
back (up to the 5 ms switch interval: ~90% of a pass when each of its ten or so calls was made from Python,
a PyTorch eager job's trace on an H100); Python then cuts what the walk found into the batches it hands on.
The header, the SMs' lines, the records' bytes and the zeros that clear them go through page-locked memory
of each reader's own, made at its first pass (the records': the first with records) and freed when the
drain stops: from pageable memory the driver copies through a bounce buffer of its own, and a buffer made
per pass is zero-filled besides. (Headers read into pageable memory took 3.0-3.8 ms a pass in a PyTorch
eager step's trace on the H200, 2026-12-05b, the records' copies into page-locked 0.3-0.5 ms.) What a pass
hands on is copied out of that memory, once: the writer holds records past the next pass, which overwrites
it. The reader's thread holds the maps' context for its whole run (ContextMemory.entered).

A copy engine reads a range in no particular order, so one copy may hold a record's READY flag and an
older copy of its bytes. A record is therefore taken only from a copy made after an earlier copy had
already seen its flag: the producer published the bytes before the flag (st.release.sys), so they were
complete before this copy began. Each pass copies ``[consumed, head)`` (where the records cross the ring's
end, the part after the wrap by a second copy) and takes the records an earlier pass saw complete; a record
reaches the sink one pass after it was committed. A burst's pass (below) copies the bytes it walks first, in
pieces with an event recorded after each, and walks each piece as it lands while the copy engine goes on with the
next, then waits for every copy before anything reads what it takes: walk and copies overlap instead of taking
turns (driver.ContextMemory.copies: events shared by the readers, whose passes run one at a time).

A burst's pass needs neither the second copy nor the walk where the ring's SMs' lines, read before its header, count
every record below head as committed (devmaps.py COMMITTED: each producer adds its record's bytes, with a release
after the flag): it copies ``[consumed, head)`` once, finds the records after the wrap where the mark of the one
crossing it says (devmaps.py REC_WRAP), and takes them all. That is the usual pass while producers wait for room:
they finish what they reserved within microseconds and reserve no more. Where records are still being written
(a waiting ring's lines and header are read again a few times while the count grows), the pass walks as above.

Before ``consumed`` moves past records, their bytes are zeroed by copies from zeros, never a memset (a
kernel, which under --on-full wait never starts while the producers' blocks hold every SM: a hang on the
H200, 2026-12-04), and on the same stream, so they land first (the producer's BUSY flag is written after
its position is taken, so between the two the reader must find no stale READY there: devmaps.py's "the
host clears the headers"), and waited for: on a stream of their own, unwaited for, they landed behind the next
pass's copies and the producers waited for the credit they give (2026-12-06e). A dropping ring's per-SM full marks
are reset once it has room again; a waiting ring's per-SM lines, where its producers count only records larger
than the ring, are read by a burst's passes for their counts (above), and by a pass alone only once, when the drain
stops.

A reader that fails (a copy that errs) goes on moving ``consumed`` to ``head`` unread until stopped,
counting what it passed over: producers made to wait would otherwise spin, and the job with them.

Under egpu-run --trace the drain's thread hands nothing to Python while the job runs: one call into C
(egpu_ring_burst) makes the passes over every ring until stop() sets its flag, appending what
each pass takes, as the ring held it, to a spool (spool.py) that the writer reads back and cuts into batches. A
reader that went back to Python after every pass waited there for the GIL (1.2-1.5 ms a pass in PyTorch eager's
warp trace on an H100, 2026-12-05f), cut the records with numpy, and waited for the writer whenever it lagged
(QUEUED batches): the producers, made to wait, waited with it. The spool's writes are made by threads of the
burst's own in C while the passes go on, one a spool file (a filesystem writes one file's buffered writes one at
a time), each ring's passes copying into one of its page-locked stages while the others' records are written (the
spares made at the first burst with records): written by the passes' thread, they were 40% of its busy time in
that trace on an H100 (0.84 s a run against 1.21 s of passes, 2026-12-06); by one thread of their own, they still
held the passes up 1.14 s of vecadd's 2.81 s (writing at 5.6 GB/s, 2026-12-06b).
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

from egpu_preload.errors import EgpuError
from egpu_preload.runtime.driver import PASS_CALLS, StreamCopies
from egpu_preload.translate.devmaps import HEADER, LINE, RING_NCPU, REC_READY, MapLayout

# The pause after a pass that found nothing new (in a burst: once passes have found nothing for as long); a pass
# that found records goes on at once.
IDLE_S = 0.001
# Into a spool: how long one call into C goes on passing before the reader's thread takes the GIL back
# (RingDrain._burst; stop() ends it at once); None: until stopped. Each return waits for the GIL, and the rings
# for the reader meanwhile: beside the writer, cutting the spool's records with numpy and pyarrow, a return a
# second cost vecadd's warp trace 0.69-0.73 s of its 2.5 s of passes a run on one H100 (2026-12-06d, call 3),
# 0.01 s on another (2026-12-06e, call 1).
BURST_S: float | None = None
UNTIL_STOPPED = (1 << 64) - 1   # egpu_ring_burst's budget_ns: no time runs it out
# The pinned memory a ring's spare stages take at most (RingReader._stage): a burst's passes copy into one stage
# while the spool's threads write the others' records, so a ring keeps as many writes in flight as it has spares.
SPARE_BYTES = 64 << 20
# Where a reader's time goes (RingReader.phases, RingDrain.phases): the header read, the records' copies, the
# scan that finds them (C's walk, then numpy cutting them out), the zeros and ``consumed`` written back (the
# first four measured in C, by egpu_ring_pass), the wait for the GIL after the pass's call (cffi lets it go
# around the call; the job's threads may hold it up to the switch interval); the hand-off to the writer
# (waiting while QUEUED batches are unwritten) and the pauses after passes that found nothing. What sets a
# drain's pace. Into a spool (RingDrain._burst): the scan is C's walk alone (the writer cuts the records, in its
# time), the GIL is waited for once a burst, the hand-off is the passes' wait for the spool's writes, which a
# thread of the burst's for each spool file makes while the passes go on (their own time: RingDrain.spool_write_s),
# and ``handing`` the rest of the burst's time: its chunks handed to those threads (their lock, their wake-ups,
# their starts) and its own loop.
PHASES = ("header", "copy", "scan", "clear", "gil_wait")
DRAIN_PHASES = ("hand_off", "handing", "idle")
# The phases whose time is the driver's calls (RingReader.in_driver): egpu_ring_pass times them around the
# header's and the records' copies, little else.
READ_PHASES = ("header", "copy")


class Memory(Protocol):
    """Device memory the reader can copy from any thread (driver.ContextMemory): a ring's SM count once and its
    head at the end with read(); every pass's copies in C, through the driver's functions copies() gives, inside
    entered(), into memory from pinned()."""

    def read(self, addr: int, n: int) -> bytes: ...
    def copies(self) -> StreamCopies: ...
    def pinned(self, size: int) -> memoryview: ...
    def unpin(self, buf: memoryview) -> None: ...
    def entered(self) -> AbstractContextManager[Any]: ...   # the copies' context set up once for a block


Record = tuple[int, bytes]   # (SM id: perf and trace_printk records carry it, ringbuf records 0; data)
RUN = 32   # records taken at once (numpy) rather than one by one: a run of one size, or as many of mixed sizes


@dataclass(frozen=True)
class Block:
    """Records of one size in a row, taken at once: record i is (``cpus[i]``, ``rows[i]``), numpy arrays
    of uint32 and of uint8 rows (a memory trace is mostly this: one fixed-size struct per access)."""

    cpus: Any
    rows: Any

    def __len__(self) -> int:
        return len(self.cpus)

    def records(self) -> list[Record]:
        return [(int(c), r.tobytes()) for c, r in zip(self.cpus, self.rows)]


@dataclass(frozen=True)
class Packed:
    """Records of mixed sizes, taken at once: record i is (``cpus[i]``, ``data[offsets[i]:offsets[i + 1]]``),
    numpy arrays of uint32, of uint8 (the records' bytes back to back) and of int64 (warp memory records,
    whose size follows from their lanes, are mostly this)."""

    cpus: Any
    data: Any
    offsets: Any

    def __len__(self) -> int:
        return len(self.cpus)

    def records(self) -> list[Record]:
        d, o = self.data, self.offsets.tolist()
        return [(int(c), d[o[i]:o[i + 1]].tobytes()) for i, c in enumerate(self.cpus)]


Taken = list[Record | Block | Packed]


def count(items: Taken) -> int:
    return sum(1 if isinstance(x, tuple) else len(x) for x in items)


@dataclass
class RingReader:
    """One ring region at ``addr`` of layout ``lay``: take() returns what is newly complete."""

    mem: Memory
    addr: int
    lay: MapLayout
    consumed: int = 0      # the reader's copy of the header's consumed: only the reader writes it
    seen: int = 0          # the end of the records an earlier pass saw complete
    taken: int = 0         # records handed out
    dropped: int = 0       # the producers' count (header plus per-SM lines; a waiting ring's lines: at stop)
    skipped: int = 0       # bytes of records passed over unread after the reader failed (skip)
    copied: int = 0        # bytes copied out of the ring, every pass's (a walked record by two passes at least)
    took: int = 0          # of those, bytes of the records taken (headers included), each once
    whole: int = 0         # of those, bytes taken by passes that found every record below head complete: unwalked
    unwalked: int = 0      # of those, bytes no walk went over: past a record not yet complete, copied again later
    phases: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0), compare=False)   # seconds
    # page-locked memory (or, where the driver gives none, pageable): the records' staging and its zeros
    # (_staging), the header with the SMs' lines after it (_head); _unpin: those of them the driver gave, which
    # close() gives back; _starts, _runs: where the walk puts the records' offsets
    _staging: memoryview | None = field(default=None, init=False, repr=False, compare=False)
    _head: memoryview | None = field(default=None, init=False, repr=False, compare=False)
    _unpin: list[memoryview] = field(default_factory=list, init=False, repr=False, compare=False)
    _starts: Any = field(default=None, init=False, repr=False, compare=False)
    _runs: Any = field(default=None, init=False, repr=False, compare=False)
    # the C pass's arguments (struct egpu_ring_pass), made at the first pass, and the buffers it points at; the
    # driver's calls it makes
    _pass: Any = field(default=None, init=False, repr=False, compare=False)
    _buffers: list[Any] = field(default_factory=list, init=False, repr=False, compare=False)
    _copies: StreamCopies | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def in_driver(self) -> dict[str, float]:
        """Of the header and copy phases, the seconds inside the driver's calls: all of either, as the C pass
        times them (egpu-run's pace line prints them beside the phases that hold them)."""
        return {p: self.phases[p] for p in READ_PHASES}

    def take(self) -> Taken:
        """The records complete since an earlier pass (in ring order), their bytes cleared and
        ``consumed`` moved past them."""
        p = self._run("EGPU_PASS_TAKE", lines=not self.lay.wait)   # a waiting ring's marks stay as they are
        t = time.perf_counter()
        out: Taken = []
        at = runs = 0
        for n, nruns in zip(p.n, p.nruns):   # the records before the ring's wrap, then those after
            if n:
                _hand_on(_numpy(), self._staging[:p.size], self._starts[at:at + n], self._runs[runs:runs + nruns], out)
            at, runs = at + n, runs + nruns
        self.phases["scan"] += time.perf_counter() - t
        self.taken += count(out)
        return out

    def skip(self) -> None:
        """``consumed`` moved to ``head`` unread, the bytes counted in ``skipped``: what a failed reader
        does so that producers made to wait go on (and a dropping ring's refused SMs may ask again)."""
        self._run("EGPU_PASS_SKIP", lines=True)

    def count_drops(self) -> None:
        """``dropped`` brought up to date with the per-SM lines: a waiting ring's passes alone leave them unread
        (its producers count there only records larger than the ring; a burst's read them for the records' counts),
        so its count is read once more, at the end."""
        self._run("EGPU_PASS_COUNT", lines=True)

    def empty(self) -> bool:
        """Nothing left between consumed and head (the producers are done: the job's kernels finished)."""
        (head,) = struct.unpack("<Q", self.mem.read(self.addr, 8))
        return head == self.consumed

    def _run(self, mode: str, lines: bool) -> Any:
        """One pass in C (shim/drain.c egpu_ring_pass; ``mode`` names its EGPU_PASS_ constant), its arguments
        made at the first and the staging at the first that finds records; the reader's state and counts moved
        as it says. Returns its arguments, which hold what it took; raises what the memory makes of a driver
        call that failed, and EgpuError for a ring the job wrote over (a record past head)."""
        ffi, lib = _shim()
        p = self._ready(ffi, lines)
        p.mode = getattr(lib, mode)
        r = self._call(lib, p)
        if r == lib.EGPU_PASS_NO_STAGING:
            self._stage(ffi, p)
            r = self._call(lib, p)
        self._settle(lib, p, r, p.copied, p.unwalked, p.whole)
        return p

    def _ready(self, ffi: Any, lines: bool) -> Any:
        """The C pass's arguments (made at the first pass) with the reader's state."""
        p = self._pass or self._arguments(ffi)
        p.lines, p.consumed, p.seen = lines, self.consumed, self.seen
        return p

    def _settle(self, lib: Any, p: Any, r: int, copied: int, unwalked: int, whole: int) -> None:
        """The reader's state and counts moved as the pass (or a burst's passes, which ``copied``, ``unwalked`` and
        ``whole``) left them; raises for the pass's failure ``r``."""
        self.took += p.consumed - self.consumed - p.skipped
        self.consumed, self.seen = p.consumed, p.seen
        self.copied += copied
        self.unwalked += unwalked
        self.whole += whole
        self.skipped += p.skipped
        self.dropped = p.dropped + p.line_drops
        self._raise_for(lib, p, r)

    def _raise_for(self, lib: Any, p: Any, r: int) -> None:
        """Raises for a pass's failure ``r`` (0: none)."""
        if r == lib.EGPU_PASS_PAST_HEAD:
            raise EgpuError(f"the ring at {self.addr:#x} holds a record that runs past its head (its header "
                            f"written over by the job?)")
        if r:
            raise self._copies.failure(PASS_CALLS[p.failed], r)

    def _call(self, lib: Any, p: Any) -> int:
        """egpu_ring_pass in the memory's context, its phases' time added up; what it took beyond them is the
        wait for the GIL once the call returned (cffi lets it go around the call)."""
        with self.mem.entered():
            t = time.perf_counter()
            r = lib.egpu_ring_pass(p)
            spent = time.perf_counter() - t
        for phase, ns in zip(PHASES, p.ns):   # all but the GIL's
            self.phases[phase] += ns / 1e9
        self.phases["gil_wait"] += max(spent - sum(p.ns) / 1e9, 0.0)
        return r

    def _arguments(self, ffi: Any) -> Any:
        """The C pass's arguments for this ring: the driver's calls, the layout, the header's memory (the SMs'
        count read once to size it)."""
        self._copies = c = self.mem.copies()
        (ncpu,) = struct.unpack("<I", self.mem.read(self.addr + RING_NCPU, 4))
        self._head = self._pin(HEADER + 8 + ncpu * LINE)   # with the data's first 8 bytes: a wrap's mark
        p = ffi.new("struct egpu_ring_pass *")
        p.copy_out, p.copy_in, p.wait, p.stream, p.record, p.landed = (
            ffi.cast("void *", a) for a in (c.copy_out, c.copy_in, c.wait, c.stream, c.record, c.landed))
        for k, event in enumerate(c.events[:len(p.events)]):
            p.events[k] = ffi.cast("void *", event)
        p.addr, p.capacity, p.lines_off = self.addr, self.lay.capacity, self.lay.lines_off
        self._buffers = [ffi.from_buffer(self._head, require_writable=True)]   # kept while p points at them
        p.head, p.head_size = self._buffers[0], len(self._head)
        self._pass = p
        return p

    def _stage(self, ffi: Any, p: Any, spares: int = 0) -> None:
        """Where a pass's copies land and the zeros that clear what it took (``capacity`` bytes each, as a copy
        is at most what is unread), and room for the walk's offsets (a record takes 8 bytes at least); with
        ``spares``, the other stages of a burst's passes, which copy into one while the others' records are
        spooled (egpu_ring_burst), SPARE_BYTES of them at most but one at least; made at the first pass that has
        records, kept until close(). Where the driver has no pinned memory to give (rings of gigabytes), pageable
        memory does, slower: a reader that failed for it would pass every ring's records over unread."""
        cap = self.lay.capacity
        self._staging = self._pin(2 * cap)
        self._staging[cap:] = bytes(cap)
        np = _numpy()
        self._starts, self._runs = _longs(np, cap // 8 + 2), _longs(np, cap // 8 + 2)
        self._buffers += [ffi.from_buffer(self._staging, require_writable=True),
                          ffi.from_buffer("long long[]", self._starts, require_writable=True),
                          ffi.from_buffer("long long[]", self._runs, require_writable=True)]
        stage, p.starts, p.runs = self._buffers[-3:]
        p.stage, p.zeros = stage, stage + cap
        for k in range(min(spares, max(1, SPARE_BYTES // cap), len(p.spares))):
            self._buffers.append(ffi.from_buffer(self._pin(cap), require_writable=True))
            p.spares[k] = self._buffers[-1]

    def _pin(self, size: int) -> memoryview:
        try:
            self._unpin.append(self.mem.pinned(size))
        except EgpuError:
            return memoryview(bytearray(size))
        return self._unpin[-1]

    def close(self) -> None:
        """The pinned memory freed (no pass runs any more; a later one would make it again), the rest
        freed whatever the first free raised."""
        bufs, self._unpin, self._buffers = self._unpin, [], []
        self._staging = self._head = self._pass = None
        failed: Exception | None = None
        for buf in bufs:
            try:
                self.mem.unpin(buf)
            except Exception as e:  # noqa: BLE001  (raised once the other is freed)
                failed = failed or e
        if failed is not None:
            raise failed


LENGTH = (1 << 32) - 1   # of a header word (length | flags << 32 | SM id << 40): the data's length


def _footprint(length: int) -> int:
    """A record's bytes in the ring: its 8-byte header and its data padded to 8 (devmaps.py)."""
    return 8 + (length + 7 & ~7)


def _longs(np: Any, n: int) -> Any:
    """Room for ``n`` int64s the C fills: numpy's, or a memoryview's without numpy."""
    return np.empty(n, np.int64) if np is not None else memoryview(bytearray(8 * n)).cast("q")


def _shim() -> tuple[Any, Any]:
    """(ffi, lib) of the loaded shim, whose C the passes run (tests and benchmarks load it themselves)."""
    from egpu_preload.runtime import hooks
    return hooks.shim()


def _hand_on(np: Any, buf: memoryview, at: Any, runs: Any, out: Taken) -> None:
    """The committed records at ``at`` (consecutive offsets; discarded ones left out), whose headers' length
    and state change at the indices ``runs`` (egpu_ring_walk's), appended to ``out``: runs of RUN or more
    committed records of one size as Blocks, the records between as one Packed; one by one when fewer than
    RUN in all (or without numpy)."""
    if np is None or len(at) < RUN:
        _single(buf, at.tolist(), out)
        return
    heads = np.frombuffer(buf, np.uint64)[at[runs] >> 3]
    ends = np.append(runs[1:], len(at))
    long = np.flatnonzero((ends - runs >= RUN) & (heads >> np.uint64(32) & np.uint64(7) == REC_READY))
    done = 0
    for i in long.tolist():
        a, b = int(runs[i]), int(ends[i])
        _packed(np, buf, at[done:a], out)
        out.append(_block(np, buf, int(at[a]), b - a, int(heads[i]) & LENGTH))
        done = b
    _packed(np, buf, at[done:], out)


def _block(np: Any, buf: memoryview, k: int, n: int, length: int) -> Block:
    """The ``n`` records of ``length`` bytes from ``k`` on as a Block: their SM ids and bytes copied out."""
    rows = np.frombuffer(buf, np.uint8, n * _footprint(length), k).reshape(n, -1)
    return Block(rows[:, 4:8].copy().view(np.uint32)[:, 0] >> 8, rows[:, 8:8 + length].copy())


def _packed(np: Any, buf: memoryview, at: Any, out: Taken) -> None:
    """The committed records at ``at`` (a numpy array; discarded ones left out) appended to ``out`` as one
    Packed (in C: shim/drain.c), or one by one when fewer than RUN are at ``at``."""
    if len(at) < RUN:
        _single(buf, at.tolist(), out)
        return
    last = int(at[-1])
    data = np.empty(last + 8 + (buf[last:last + 8].cast("Q")[0] & LENGTH) - int(at[0]), np.uint8)   # the span
    offsets, sms = np.empty(len(at) + 1, np.int64), np.empty(len(at), np.uint32)
    ffi, lib = _shim()
    n = lib.egpu_ring_pack(ffi.from_buffer(buf), len(buf), ffi.from_buffer("long long[]", at), len(at),
                           ffi.from_buffer(data), len(data), ffi.from_buffer("long long[]", offsets),
                           ffi.from_buffer("unsigned int[]", sms))
    if n < 0:
        raise EgpuError("a ring record reaches past the bytes copied out of the ring")
    if n:
        out.append(Packed(sms[:n], data[:offsets[n]], offsets[:n + 1]))


def _single(buf: memoryview, starts: list[int], out: Taken) -> None:
    """The committed records at ``starts`` appended to ``out`` one by one (discarded ones left out)."""
    words = buf.cast("Q")
    for k in starts:
        head = words[k >> 3]
        if head >> 32 & REC_READY:
            out.append((head >> 40, buf[k + 8:k + 8 + (head & LENGTH)].tobytes()))


def records_in(buf: memoryview) -> Taken:
    """The records of ``buf``, whole records with their headers as a ring held them (a spool's chunk: spool.py),
    as a pass hands them on (discarded ones left out)."""
    ffi, lib, np = *_shim(), _numpy()
    starts, runs = _longs(np, len(buf) // 8 + 1), _longs(np, len(buf) // 8 + 1)
    n, nruns = ffi.new("unsigned long long *"), ffi.new("unsigned long long *")
    end = lib.egpu_ring_walk(ffi.from_buffer(buf), len(buf), 0, len(buf), ffi.from_buffer("long long[]", starts), n,
                             ffi.from_buffer("long long[]", runs), nruns)
    if end != len(buf):
        raise EgpuError(f"a spooled chunk of {len(buf):,} bytes holds a record not complete at byte {end:,}")
    out: Taken = []
    _hand_on(np, buf, starts[:n[0]], runs[:nruns[0]], out)
    return out


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        return None
    return numpy


Sink = Callable[[int, Taken], None]   # (the ring's index among the drained, its new records)


class RingDrain:
    """A thread that passes over every ring until stopped, handing each ring's records to ``sink``, or, given a
    spool (spool.py), appending them to it in C, in one call until stopped (BURST_S)."""

    def __init__(self, readers: list[RingReader], sink: Sink, idle_s: float = IDLE_S,
                 hold: Callable[[], AbstractContextManager[Any]] = nullcontext, spool: Any = None) -> None:
        """``hold``: entered once around the thread's passes (ContextMemory.entered: the maps' context
        current on it for good, not pushed and popped around every copy). ``spool``: a spool.Spool, whose
        reader then hands the records on, and ``sink`` has none."""
        self.readers, self.sink, self.idle_s, self.hold, self.spool = readers, sink, idle_s, hold, spool
        self._bursts: Any = None   # the C burst's array of the readers' arguments (made at the first burst)
        # set by stop(): the C burst's flag, made here so that no burst can start on a flag stop() did not set
        self._halt = _shim()[0].new("int *") if spool is not None else None
        self.error: BaseException | None = None
        self.passes = 0
        self.phases = dict.fromkeys(DRAIN_PHASES, 0.0)   # seconds; the readers' own in RingReader.phases
        self.spool_write_s = 0.0   # the spool's writes, on the bursts' threads of their own
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="egpu-ring-drain", daemon=True)

    def start(self) -> "RingDrain":
        self._thread.start()
        return self

    def drain_once(self) -> int:
        """One pass over every ring; how many records it took (into a spool: how many bytes of records)."""
        if self.spool is not None:
            return self._burst(0)
        n = 0
        for i, r in enumerate(self.readers):
            taken = r.take()
            if taken:
                t = time.perf_counter()
                self.sink(i, taken)
                self.phases["hand_off"] += time.perf_counter() - t
                n += count(taken)
        self.passes += 1
        return n

    def _run(self) -> None:
        try:
            with self.hold():
                while not self._stop.is_set():
                    if self.spool is not None:
                        self._burst(BURST_S)
                    elif not self.drain_once():
                        t = time.perf_counter()
                        self._stop.wait(self.idle_s)
                        self.phases["idle"] += time.perf_counter() - t
        except BaseException as e:   # reported by stop(): a reader that dies must not kill the job,
            self.error = e           # nor stop it: producers made to wait would spin for good
            self._release()

    def _burst(self, budget_s: float | None) -> int:
        """Passes over every ring for ``budget_s`` (one round at least; None: until stop() sets the flag) in one
        call into C (egpu_ring_burst), each one's records appended to the spool; the bytes of records taken. Where
        the GIL went after the call (``gil_wait``) is the first reader's to count: it is the burst's, not one
        ring's; the spool's writes are the drain's hand-off, its writes (on threads of the burst's, one a spool
        file, summed) spool_write_s."""
        if not self.readers:
            return 0
        ffi, lib = _shim()
        ps = [r._ready(ffi, lines=not r.lay.wait) for r in self.readers]   # a waiting ring's marks stay as they are
        for p in ps:
            p.total_ns, p.total_copied, p.total_unwalked, p.total_taken, p.total_whole = [0] * 4, 0, 0, 0, 0
        if self._bursts is None:
            self._bursts = ffi.new("struct egpu_ring_pass *[]", ps)
        which, lost = ffi.new("unsigned int *"), ffi.new("unsigned long long *")
        out = ffi.new("unsigned long long[5]")
        with self.readers[0].mem.entered():
            t = time.perf_counter()
            budget_ns = UNTIL_STOPPED if budget_s is None else int(budget_s * 1e9)
            r = lib.egpu_ring_burst(self._bursts, len(ps), self.spool.c, budget_ns, int(self.idle_s * 1e9), self._halt,
                                    which, lost, out)
            spent = time.perf_counter() - t
        phased = (out[1] + out[2]) / 1e9
        for reader, p in zip(self.readers, ps):
            for phase, ns in zip(PHASES, p.total_ns):
                reader.phases[phase] += ns / 1e9
                phased += ns / 1e9
        self.readers[0].phases["gil_wait"] += max(spent - out[4] / 1e9, 0.0)
        self.phases["idle"] += out[1] / 1e9
        self.phases["hand_off"] += out[2] / 1e9   # the passes' wait for the spool's writes
        self.phases["handing"] += max(out[4] / 1e9 - phased, 0.0)   # chunks to the spool's threads, their wake-ups
        self.spool_write_s += out[3] / 1e9
        self.passes += out[0]
        taken = sum(p.total_taken for p in ps)
        for reader, p in zip(self.readers, ps):
            reader._settle(lib, p, 0, p.total_copied, p.total_unwalked, p.total_whole)
        if not r:
            return taken
        reader, p = self.readers[which[0]], ps[which[0]]
        if r == lib.EGPU_PASS_NO_STAGING:   # its staging made; the next burst takes its records
            reader._stage(ffi, p, spares=self.spool.files)
            return taken + 1
        if r == lib.EGPU_PASS_SPOOL:
            why = self.spool.lost() or os.strerror(self.spool.c.error)
            raise EgpuError(f"cannot write the trace's spool beside the trace file: {why} ({lost[0]:,} bytes of "
                            "records taken and lost)")
        reader._raise_for(lib, p, r)
        return taken

    def _release(self) -> None:
        """After a failure: every ring's records passed over unread until stopped (RingReader.skip)."""
        try:
            while not self._stop.is_set():
                for r in self.readers:
                    r.skip()
                self._stop.wait(self.idle_s)
        except Exception:   # noqa: BLE001  (the memory itself fails: nothing more can be done from here)
            pass

    def stop(self, timeout_s: float = 10.0) -> None:
        """After the job's kernels have finished: the thread joined, then every record left taken (a
        record is taken one pass after it is seen, so passes go on until every ring is empty), then the
        readers' pinned memory freed, after a failure too; the first failure raised."""
        self._stop.set()
        if self._halt is not None:
            self._halt[0] = 1
        if self._thread.is_alive():
            self._thread.join()
        if self.error is None:
            try:
                self._last_passes(timeout_s)
            except BaseException as e:   # raised below, once the memory is freed
                self.error = e
        self._count_drops()
        self._close()
        if self.error is not None:
            raise self.error

    def _last_passes(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.drain_once() or not all(r.empty() for r in self.readers):
            if time.monotonic() > deadline:   # a record left BUSY: a probe reserved and never submitted
                break

    def _count_drops(self) -> None:
        """Every waiting ring's dropped count completed from its per-SM lines (RingReader.count_drops), after
        a failed pass too; a ring whose lines cannot be read keeps the count it had."""
        for r in self.readers:
            if r.lay.wait:
                try:
                    r.count_drops()
                except Exception:  # noqa: BLE001  (the memory itself fails: stop() reports the pass's failure)
                    pass

    def _close(self) -> None:
        """Every reader closed, each whatever another's close raised; where a pass failed, that failure is
        the one stop() raises, else the first close's."""
        failed: Exception | None = None
        for r in self.readers:
            try:
                r.close()
            except Exception as e:  # noqa: BLE001  (the driver's: the other readers' memory is freed still)
                failed = failed or e
        if failed is not None and self.error is None:
            raise failed
