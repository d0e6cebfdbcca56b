"""egpu-run --trace FILE inside the job: every ring and perf buffer of the probes (and each probe's
trace_printk ring) drained while kernels run (ring_drain.py) into the trace file (output/tracefile.py),
with the records host programs (launch, host-API, uprobes) output to them and their bpf_printk lines, which the
launch drainer hands on (launches.Drainer: ``host``) into the same columns, the host as CPU 0.

Opened at start where host programs output to a ring or print, else once the device maps exist, whose rings are
drained from then on (``read``) into a spool beside FILE (spool.py) that the writer reads back, so the reader
never waits for the writer; finished at exit after the context is synchronized (the reader keeps running
through that synchronize: kernels waiting for room in a ring need it), then every record left is taken, the
writer catches up with the spool, and the file is closed with each map's dropped count.

A job of several processes: the first to start claims FILE (O_EXCL: the launcher removed any old one),
each other writes FILE's name with its pid inserted beside it (``trace.1234.parquet``). An exec ends an image
as exit does (its file finished, its summary in the exec dump), and the image after it writes a file of its own,
``trace.1234.exec1.parquet`` (claim); an exec that fails leaves the image on with a new file of that kind, the
one it finished named in its next dump (``closed_traces``). A child forked after the trace began (after CUDA) writes
none, and lets go of its parent's spool and file (``let_go``). Live-attached probes are not drained (their rings
drop when full, as without --trace).
"""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from egpu_preload.bpf import btf as btfmod
from egpu_preload.control import process_exists
from egpu_preload.errors import EgpuError
from egpu_preload.outpaths import create_new
from egpu_preload.output import tracefile, warp_records
from egpu_preload.runtime.probes import RING_TYPES, Probe
from egpu_preload.runtime.ring_drain import (DRAIN_PHASES, PHASES, READ_PHASES, Memory, RingDrain, RingReader,
                                             Taken, count)
from egpu_preload.runtime.spool import Spool, Unreadable
from egpu_preload.translate import devmaps
from egpu_preload.translate.devmaps import DeviceMaps


def claim(path: Path, after_exec: bool = False) -> Path:
    """FILE if no other process of the job has it yet, else FILE with this pid before its suffix; after an exec
    of this process (``after_exec``: the image it made, or the one that goes on when it failed), whose earlier
    files stay as they were closed: the first free ``FILE.PID.execN``."""
    if not after_exec:
        return path if create_new(path) else own_name(path, os.getpid())
    n = 1
    while not create_new(own_name(path, os.getpid(), n)):
        n += 1
    return own_name(path, os.getpid(), n)


def own_name(path: Path, pid: int, image: int = 0) -> Path:
    """FILE with the pid before its suffix (``trace.1234.parquet``), and ``.execN`` after it for an image that an
    exec made (``trace.1234.exec1.parquet``): the suffix says the format (tracefile.ARROW_SUFFIXES)."""
    return path.with_name(f"{path.stem}.{pid}{f'.exec{image}' if image else ''}{path.suffix}")


# The writer's thread runs at the lowest priority (and so do the pyarrow threads it starts, which inherit it): its
# encoding, which lags the reader anyway (0.3-0.5 GB/s) and catches up at exit, took CPUs from the reader's
# passes, the spool's writes and the job's own threads (the suite runs a job on 4 CPUs).
WRITER_NICE = 19
Ring = tuple[str, tuple[int, Any], tracefile.RecordLayout | None]   # name, (map set, region), layout
WARP_LAYOUT = tracefile.whole_records(warp_records.RECORD_TYPE)   # expanded per lane by egpu trace


def rings(probes: list[Probe]) -> list[Ring]:
    """(name in the trace, (probe index: its device map set's, map index: its region's), record layout) of
    every ring to drain: map names, prefixed with the probe's name where the job has several probes."""
    out = []
    for k, probe in enumerate(probes):
        prefix = f"{probe.path.name.split('.')[0]}:" if len(probes) > 1 else ""
        btf = probe.obj.btf if isinstance(probe.obj.btf, btfmod.Btf) else None
        lay = _layout(btf)
        for i, m in enumerate(probe.obj.maps):
            if m.type in RING_TYPES:
                out.append((prefix + m.name, (k, i), WARP_LAYOUT if i in probe.warp_rings else lay))
        out.append((prefix + tracefile.TRACE_PRINTK, (k, len(probe.obj.maps)), None))
    return out


def _layout(btf: btfmod.Btf | None) -> tracefile.RecordLayout | None:
    """The probe's record layout; None (raw bytes) where BTF names none or describes it oddly."""
    rec = tracefile.record_struct(btf)
    if btf is None or rec is None:
        return None
    try:
        return tracefile.record_layout(btf, rec)
    except EgpuError:
        return None


QUEUED = 32   # batches taken and not yet written; the reader waits for the writer beyond (a bound on memory)
SPOOL_POLL_S = 0.01   # how often the writer looks for what the reader spooled, when it has nothing else to do
_UNFINISHED: weakref.WeakSet[Streaming] = weakref.WeakSet()   # this process's, let go of in a forked child
_FORKED_WRITERS: list[tracefile.TraceWriter] = []   # in a forked child, the parent's writers it let go of


class Streaming:
    """The reader thread, the writer thread and the trace file of one process: the reader copies records
    out of the rings while the writer encodes the batches before (pyarrow lets the GIL go meanwhile)."""

    def __init__(self, path: Path, probes: list[Probe], maps: list[DeviceMaps] | None = None,
                 memory: Memory | None = None, after_write: Callable[[], None] = lambda: None,
                 after_exec: bool = False) -> None:
        """``maps`` (in the order of ``probes``) and their ``memory``: drained at once; None: none yet (``read``).
        ``after_write``: called on the writer's thread after each batch written (the exit hook re-arms there
        when the writer loaded libraries). ``after_exec``: the file of an image after an exec (claim)."""
        drained = rings(probes)
        self.names = [name for name, _, _ in drained]
        self.slots = {at: n for n, (_, at, _) in enumerate(drained)}   # (probe, map) -> the writer's index
        self._probe = {id(p): k for k, p in enumerate(probes)}
        self.readers: list[RingReader] = []
        self.drain: RingDrain | None = None
        self.spool: Spool | None = None   # where the reader's records wait for the writer (read)
        self.host_dropped = [0] * len(drained)   # what host programs' maps dropped, by the writer's index
        self.host_taken = 0   # records host programs handed on (the readers count their own)
        self._host_held: deque[tuple[int, Taken]] = deque()   # host records the writer's full queue refused
        self.path = claim(path, after_exec)
        self.error: str | None = None
        try:
            self.writer: tracefile.TraceWriter | None = tracefile.TraceWriter(
                self.path, [(name, lay) for name, _, lay in drained])
        except EgpuError as e:   # still drained, so that rings made to wait never stop the job
            self.writer, self.error = None, str(e)
            print(f"egpu[{os.getpid()}]: {e}; the job's records are read and thrown away", file=sys.stderr)
        _UNFINISHED.add(self)
        self.after_write = after_write
        self.write_s = 0.0   # the writer's encoding and writing, its flushes' included
        self._batches: queue.Queue[tuple[int, Taken] | None] = queue.Queue(QUEUED)
        self._writing = threading.Thread(target=self._write_all, name="egpu-trace-writer", daemon=True)
        self._writing.start()
        if maps is not None and memory is not None:
            self.read(maps, memory)

    def read(self, maps: list[DeviceMaps], memory: Memory) -> None:
        """Drain the device maps' rings from now on (once they exist), through a spool where the file is written
        and one can be made beside it, else through the writer's queue."""
        self.readers = [RingReader(memory, maps[k].addrs[i], maps[k].layouts[i]) for k, i in self.slots]
        if self.writer is not None:
            try:
                self.spool = Spool(self.path)
            except OSError as e:
                print(f"egpu[{os.getpid()}]: no spool beside {self.path} ({e.strerror or e}): the trace's records "
                      "go through memory, and the reader waits whenever the writer lags", file=sys.stderr)
        self.drain = RingDrain(self.readers, lambda index, taken: self._batches.put((index, taken)),
                               hold=memory.entered, spool=self.spool).start()

    def let_go(self) -> None:
        """In a child forked from this process (after CUDA: none of its threads, no reader nor writer): the spool
        closed, not truncated nor punched, and the trace file let go of unwritten (tracefile.TraceWriter.let_go),
        so that the spool's disk space is the parent's alone, given back at its close rather than at the last of
        its children's exits, and nothing the child does writes into either. The child writes no trace."""
        if self.spool is not None:
            self.spool.close()
        if self.writer is not None:
            self.writer.let_go()
            _FORKED_WRITERS.append(self.writer)   # never freed here: the parent's writer thread may have been inside
            # pyarrow at the fork, and freeing it closes it (a lock the child's copy holds for good)
        self.spool, self.drain, self.readers, self.writer = None, None, [], None

    def host(self, probe: Probe, map_index: int, records: list[Any], dropped: int) -> None:
        """Records host programs of ``probe`` (one of ``probes``) output to map ``map_index`` (a ring's bytes, a
        perf buffer's (cpu, bytes)), in order, and how many that map has dropped so far; from the launch
        drainer's thread, onto the writer's queue as the reader's batches go."""
        index = self.slots[self._probe[id(probe)], map_index]
        self.host_dropped[index] = dropped
        self.host_taken += len(records)
        if records:
            self._host_held.append((index, [r if isinstance(r, tuple) else (0, r) for r in records]))
        self._hand_host(wait=False)

    def _hand_host(self, wait: bool) -> None:
        """Host records held onto the writer's queue, in order; while it is full they stay held (``wait``: not),
        as the drainer's thread must go on taking launch records, which a full shim ring would drop."""
        while self._host_held:
            try:
                self._batches.put(self._host_held[0], block=wait)
            except queue.Full:
                return
            self._host_held.popleft()

    def _write_all(self) -> None:
        """The writer's thread, until finish() hands it None; the host's batches and what the reader spooled written
        as they come, records held tracefile.FLUSH_S written after each batch, and between batches (woken a few
        times as often). A file that cannot be written (disk full) must not stop the reader, or a ring made to wait
        would stop the job: from then on batches are taken and not written. A spool that cannot be read back ends
        the writing; the queue is still emptied to its end (where the writer has not taken it yet: finish() hands
        it once), or the host's hand-off and finish() would wait on it for good."""
        with contextlib.suppress(OSError):   # a higher nice is anyone's to take; a platform without it, none
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICE)
        ended = False
        try:
            while (batch := self._next()) is not None:
                self._write([batch] if batch else [])
                self._write(self._spooled())
            ended = True
            while self.spool is not None and self.spool.pending():
                self._write(self._spooled())
        except Unreadable as e:
            self._failed(f"cannot read the trace's spool back: {e}")
            while not ended and self._batches.get() is not None:
                pass

    def _spooled(self) -> Iterator[tuple[int, Taken]]:
        """What the reader spooled since the last call, each batch counted as its reader's."""
        for index, taken in self.spool.taken() if self.spool is not None else ():
            self.readers[index].taken += count(taken)
            yield index, taken

    def _write(self, batches: Iterable[tuple[int, Taken]]) -> None:
        """``batches`` written (taken and thrown away once the file cannot be), then the records due."""
        if self.writer is None or self.error is not None:
            for _ in batches:
                pass
            return
        try:
            t = time.perf_counter()
            for batch in batches:
                self.writer.add(*batch)
            self.writer.flush_due()
            self.write_s += time.perf_counter() - t
            self.after_write()
        except Unreadable:
            raise
        except Exception as e:  # noqa: BLE001  (pyarrow's and the OS's errors alike)
            self._failed(f"cannot write the trace: {e}")
            self._write(batches)   # the rest taken and thrown away

    def _failed(self, why: str) -> None:
        """The writing ended for ``why`` (where it had not already, for the cause it keeps), which the dump reports
        and the writer's thread says now, naming the file."""
        self.error = self.error or why
        print(f"egpu[{os.getpid()}]: {self.path}: {self.error}", file=sys.stderr)

    def _next(self) -> tuple[int, Taken] | tuple[()] | None:
        """The next batch; () when none came for a quarter of tracefile.FLUSH_S, or, while the reader spools, for
        SPOOL_POLL_S (the spool is looked at after each), at once where the spool holds more to read back."""
        wait = (tracefile.FLUSH_S / 4 if self.spool is None else 0 if self.spool.pending() else SPOOL_POLL_S)
        try:
            return self._batches.get(timeout=wait)
        except queue.Empty:
            return ()

    def finish(self) -> dict[str, Any]:
        """After the context's work has finished: the rest taken, the file closed; what the dump reports. Once
        only (the writer is gone after). A reader that failed (its context destroyed, say) still leaves the file
        closed, with what it took before."""
        unread = None
        try:
            if self.drain is not None:
                self.drain.stop()
        except Exception as e:  # noqa: BLE001  (the reader's failure, reported in the dump)
            skipped = sum(r.skipped for r in self.readers)
            unread = f"the ring reader failed: {e}; {skipped:,} bytes of records after it passed over unread"
        self._hand_host(wait=True)
        self._batches.put(None)
        self._writing.join()
        if self.spool is not None:
            self.spool.close()
        dropped = dict(zip(self.names, self.host_dropped))
        for name, r in zip(self.names, self.readers):
            dropped[name] += r.dropped
        if self.writer is not None and self.error is None:
            try:
                t = time.perf_counter()
                self.writer.close(dropped)   # the last flush
                self.write_s += time.perf_counter() - t
            except Exception as e:  # noqa: BLE001
                self.error = f"cannot write the trace: {e}"
        taken = sum(r.taken for r in self.readers) + self.host_taken
        written = self.writer.written if self.writer is not None else 0
        unwritten = self.error and f"{self.error} ({taken - written:,} records taken and not written)"
        error = "; ".join(e for e in (unread, unwritten) if e) or None
        waited = any(r.lay.wait for r in self.readers)   # a waiting ring drops only what the note says
        _UNFINISHED.discard(self)
        return {"path": str(self.path), "records": written, "dropped": sum(dropped.values()), "error": error,
                "drain": self.pace(), **({"stall_s": devmaps.WAIT_STALL_NS / 1e9} if waited else {})}

    def pace(self) -> dict[str, Any]:
        """Where the drain's time went (ring_drain.PHASES, DRAIN_PHASES; seconds; of the header and copy
        phases, the part inside the driver's calls as ``header_driver_s``, ``copy_driver_s``), its passes and
        the bytes they copied (of those, the records' bytes taken, and those copied past a record not yet complete,
        which later passes copy again), the spool's writes (``spool_write_s``, where the reader spools: threads of
        their own make them, one a file of ``spool_files``, their times summed) and the writer's time: what says
        whether the reader, the writer or the link sets the pace of a trace."""
        drain = self.drain.phases if self.drain is not None else dict.fromkeys(DRAIN_PHASES, 0.0)
        phases = {p: sum(r.phases[p] for r in self.readers) for p in PHASES} | drain
        in_driver = {f"{p}_driver": sum(r.in_driver[p] for r in self.readers) for p in READ_PHASES}
        spooled = ({"spool_write_s": round(self.drain.spool_write_s, 3), "spool_files": self.spool.files}
                   if self.spool is not None else {})
        return {"passes": self.drain.passes if self.drain is not None else 0,
                "copied_bytes": sum(r.copied for r in self.readers),
                "taken_bytes": sum(r.took for r in self.readers),
                "whole_bytes": sum(r.whole for r in self.readers),
                "unwalked_bytes": sum(r.unwalked for r in self.readers),
                **{f"{p}_s": round(v, 3) for p, v in (phases | in_driver).items()}, **spooled,
                "write_s": round(self.write_s, 3)}


def _forked() -> None:
    for trace in list(_UNFINISHED):
        trace.let_go()


# os.fork runs it, and so does the shim's fork handler in a C fork() while its Python is up (shim/process.c)
os.register_at_fork(after_in_child=_forked)


def traces(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The trace files a dump's image finished: those before execs that failed, then its own (none: no trace)."""
    return [*doc.get("closed_traces", []), *([doc["trace"]] if doc.get("trace") else [])]


def notes(dumps: list[dict[str, Any]]) -> list[str]:
    """egpu-run's lines about the job's trace files, from the processes' dumps."""
    out = []
    for t in (t for doc in dumps for t in traces(doc)):
        why = ("ring full" if "stall_s" not in t else
               f"larger than the ring, or waiting on a reader that took nothing for {t['stall_s']:g} s")
        dropped = (f", {t['dropped']:,} dropped by the probes ({why})" if t["dropped"] else
                   "" if t.get("error") else ", none dropped")
        out.append(f"egpu-run: {t['records']:,} record{'s' * (t['records'] != 1)} in {t['path']}{dropped}"
                   + (f"; {t['error']}" if t.get("error") else ""))
        if t.get("drain", {}).get("copied_bytes"):
            out.append(pace_line(t["drain"]))
    return out


def unclosed(path: Path, dumps: list[dict[str, Any]], started: set[int]) -> list[str]:
    """egpu-run's lines about the trace files that processes of the job left unclosed: FILE, or a process's
    ``FILE.PID`` or ``FILE.PID.execN`` (claim), that no dump names and that exists; its process killed before its
    exit dump, or still running (daemonized: it closes the file at its exit). FILE's process is any of those
    without an exit dump (an exec dump is its replaced image's)."""
    closed = {Path(t["path"]) for d in dumps for t in traces(d)}
    undumped = started - {d["pid"] for d in dumps if "exec" not in d}
    running = {pid for pid in undumped if process_exists(pid)}
    owners = [(path, undumped)] + [(f, {pid}) for pid in sorted(started) for f in _own_files(path, pid)]
    out = []
    for f, pids in owners:
        if f in closed or not f.exists():
            continue
        if pids and pids <= running:
            out.append(f"egpu-run: {f} is still open: its process was still running when the job's main process "
                       "ended (it closes it at exit)")
        else:
            how = "ended before its exit dump" + (", or still runs and closes it at exit" if pids & running else "")
            what = ("`egpu trace` reads the records written before (all but those of its last second or so, and "
                    "those its writer had not yet read back from the spool: a ring's are written once "
                    f"{tracefile.FLUSH_ROWS:,} have built up or the oldest has waited {tracefile.FLUSH_S:g} s), the "
                    "dropped counts unknown" if tracefile.arrow_name(f) else
                    "its records are lost: a Parquet file is read through the footer its close writes (a trace in "
                    "Arrow IPC, --trace FILE.arrow, keeps what was written)")
            out.append(f"egpu-run: {f} was never closed (its process {how}): {what}")
    return out


def _own_files(path: Path, pid: int) -> list[Path]:
    """The names a process's images may have written (claim): FILE.PID, then each FILE.PID.execN there is."""
    out = [own_name(path, pid)]
    while (f := own_name(path, pid, len(out))).exists():
        out.append(f)
    return out


def in_driver(d: dict[str, Any], phase: str) -> str:
    """`` (0.02 s in the driver)`` after a phase that copies (READ_PHASES); nothing after the others."""
    s = d.get(f"{phase}_driver_s")
    return f" ({s:.2f} s in the driver)" if s is not None else ""


def pace_line(d: dict[str, Any]) -> str:
    """The drain's pace as egpu-run prints it under its trace line: the reader's phases (into a spool, its hand
    off the wait for the spool's writes), the spool's writes on threads of their own (summed, with the files they
    wrote where more than one), the writer's time."""
    spent = ", ".join(f"{p.replace('_', ' ')} {d[f'{p}_s']:.2f} s" + in_driver(d, p) for p in (*PHASES, *DRAIN_PHASES))
    files = f" into {d['spool_files']} files" if d.get("spool_files", 1) > 1 else ""
    spooled = f"; spool writes {d['spool_write_s']:.2f} s{files}" if "spool_write_s" in d else ""
    return (f"egpu-run:   drained in {d['passes']:,} passes, {d['copied_bytes'] / 1e6:,.1f} MB copied "
            f"({d['taken_bytes'] / 1e6:,.1f} MB of records taken, {d['whole_bytes'] / 1e6:,.1f} MB of them "
            f"unwalked, {d['unwalked_bytes'] / 1e6:,.1f} MB past a record not yet complete); reader: {spent}{spooled}; "
            f"writer {d['write_s']:.2f} s")
