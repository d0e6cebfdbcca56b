"""Kernel durations for every kernel (SASS-only ones included), from CUPTI activity records, without
adding anything to the application's streams.

CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL makes the driver time each kernel on the GPU itself and hand the
records (start, end, name, correlation id) to buffers CUPTI fills on its own thread; nothing is
recorded on the application's streams and kernels keep running concurrently (the KIND_KERNEL variant
would serialize them). The runtime aggregates per mangled kernel name: count, total, min, max and a
log2 histogram of end - start. At exit it flushes CUPTI and the result goes into the process's dump
under "durations": [[name, count, total_ns, min_ns, max_ns, [[slot, count]...]]] and
"durations_error" (why there are none, or None). With a timeline (egpu-run --perfetto) each launch is
kept too, under "launches" (``Timeline.dump``), at most LAUNCH_LIMIT of them; the rest are counted.

Beside kernels, the same CUPTI session records memory copies and sets (runtime/copies.py: "copies",
per operation, direction and stream: count, bytes, device time; each one, and each synchronization,
under "copy_spans" with a timeline) and unified-memory faults and migrations (runtime/uvm.py: "uvm",
totals per counter kind and, with a timeline, each record; the records also go to egpu/uvm probes).
Each has its own "*_error": CUPTI may time kernels and still refuse unified-memory counters.

CUDA events around each launch were the other way. They cost less on the launching thread (bench_shim:
+3.0 µs a launch against CUPTI's +7.7 µs, one CPU, 2026-12-02), but they are work recorded on the
application's streams, a graph's replays never pass a launch hook to record them, and reading them
back needs a query per launch; CUPTI times every kernel, replayed or not, with nothing added to a
stream.

libcupti comes from the process (a PyTorch that loaded its own), the library path, the nvidia-cuda-cupti
wheel, or the toolkit (extras/CUPTI/lib64, lib64). Only one client may own CUPTI's activity buffers:
torch.profiler in the same process takes them over.

Record layout read here (cupti_activity.h, CUpti_ActivityKernel4 through 10 share the first 112 bytes):
u32 kind at 0, u64 start at 16, u64 end at 24, u32 streamId at 48, i32 gridX..Z at 52, i32 blockX..Z
at 64, u32 correlationId at 92, const char *name at 104.

Clock. CUPTI's timestamps are cuptiGetTimestamp()'s ns; on Linux recent CUPTIs base it on
CLOCK_REALTIME, but that is not promised. ``start`` reads cuptiGetTimestamp() and CLOCK_REALTIME once,
back to back, and the timeline's ``clock_offset_ns`` (REALTIME - CUPTI) puts kernel times on the clock of
ring-buffer ``ts`` fields (%globaltimer, which the driver keeps in ns since the Unix epoch): aligned to
the width of that two-call window (about a µs) plus however far %globaltimer is from the host's clock.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from egpu_preload.runtime import copies as copies_mod
from egpu_preload.runtime import uvm
from egpu_preload.runtime.spread import Spread

KIND_KERNEL, KIND_CONCURRENT_KERNEL = 3, 10
CUPTI_SUCCESS = 0
MULTIPLE_SUBSCRIBERS = 39   # CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
BUFFER_BYTES = 8 << 20
LAUNCH_LIMIT = 1_000_000
# start, end, name index, CUPTI stream id, correlation id, grid x y z, block x y z
LAUNCH_ROW = struct.Struct("<QQIII6i")
_REQUEST = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t),
                            ctypes.POINTER(ctypes.c_size_t))
_COMPLETE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t,
                             ctypes.c_size_t)
SONAMES = ("libcupti.so", "libcupti.so.13", "libcupti.so.12")
TOOLKIT_DIRS = ("/usr/local/cuda/extras/CUPTI/lib64", "/usr/local/cuda/lib64", "/usr/local/cuda/lib")


class CuptiError(Exception):
    pass


class Durations:
    """Per-kernel durations, filled from any thread."""

    def __init__(self) -> None:
        self.kernels: dict[str, Spread] = {}
        self._lock = threading.Lock()

    def add(self, name: str, ns: int) -> None:
        with self._lock:
            self.kernels.setdefault(name, Spread()).add(ns)

    def dump(self) -> list[list[Any]]:
        with self._lock:
            return [[n, *k.row()] for n, k in sorted(self.kernels.items())]


class Timeline:
    """Every kernel's record, packed (LAUNCH_ROW), filled from any thread; past ``limit`` only counted."""

    def __init__(self, clock_offset_ns: int, clock: str, limit: int = LAUNCH_LIMIT) -> None:
        self.clock_offset_ns, self.clock, self.limit = clock_offset_ns, clock, limit
        self.rows = bytearray()
        self.names: dict[str, int] = {}
        self.dropped = 0
        self._lock = threading.Lock()

    def add(self, start: int, end: int, name: str, stream: int, correlation: int,
            grid: tuple[int, int, int], block: tuple[int, int, int]) -> None:
        with self._lock:
            if len(self.rows) >= self.limit * LAUNCH_ROW.size:
                self.dropped += 1
                return
            index = self.names.setdefault(name, len(self.names))
            self.rows += LAUNCH_ROW.pack(start, end, index, stream, correlation, *grid, *block)

    def dump(self) -> dict[str, Any]:
        """{"names", "rows" (LAUNCH_ROW each), "dropped", "clock_offset_ns", "clock"}."""
        with self._lock:
            return {"names": list(self.names), "rows": bytes(self.rows), "dropped": self.dropped,
                    "clock_offset_ns": self.clock_offset_ns, "clock": self.clock}


@dataclass(frozen=True)
class KernelRecord:
    """One launch from a dump's timeline, times on CLOCK_REALTIME (the offset applied)."""
    name: str
    start_ns: int
    end_ns: int
    stream: int
    correlation_id: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]


def timeline_records(timeline: dict[str, Any]) -> list[KernelRecord]:
    """The launches of a dump's "launches" field."""
    names, off = timeline["names"], timeline["clock_offset_ns"]
    return [KernelRecord(names[n], start + off, end + off, stream, corr, (gx, gy, gz), (bx, by, bz))
            for start, end, n, stream, corr, gx, gy, gz, bx, by, bz in LAUNCH_ROW.iter_unpack(timeline["rows"])]


def cupti_clock(lib: ctypes.CDLL) -> tuple[int, str]:
    """(CLOCK_REALTIME - cuptiGetTimestamp() in ns, how it was found), read once, back to back."""
    ts = ctypes.c_uint64()
    try:
        get = lib.cuptiGetTimestamp
    except AttributeError:
        return 0, "CUPTI timestamps as they are (no cuptiGetTimestamp)"
    before = time.clock_gettime_ns(time.CLOCK_REALTIME)
    r = get(ctypes.byref(ts))
    after = time.clock_gettime_ns(time.CLOCK_REALTIME)
    if r != CUPTI_SUCCESS:
        return 0, f"CUPTI timestamps as they are (cuptiGetTimestamp: CUptiResult {r})"
    return (before + after) // 2 - ts.value, f"CUPTI + offset = CLOCK_REALTIME (+-{(after - before + 1) // 2} ns)"


def parse_records(records: list[tuple[int, int, int, str]], into: Durations) -> None:
    """(kind, start, end, name) rows into ``into``: kernel kinds only."""
    for kind, start, end, name in records:
        if kind in (KIND_KERNEL, KIND_CONCURRENT_KERNEL) and end >= start:
            into.add(name, end - start)


def candidates() -> list[str]:
    """Where libcupti may be, in the order tried."""
    found = list(SONAMES)
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        found += sorted(glob.glob(os.path.join(root, "*", "lib", "libcupti.so*")), reverse=True)
    for d in TOOLKIT_DIRS:
        found += sorted(glob.glob(os.path.join(d, "libcupti.so*")), reverse=True)
    return found


def load_cupti() -> ctypes.CDLL:
    tried = candidates()
    for name in tried:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise CuptiError("no libcupti (tried " + ", ".join(tried) + ")")


class Cupti:
    """CUPTI's activity API: kernel records feed a Durations (and a Timeline) when ``into`` is given;
    other kinds go to the handlers ``enable`` registers."""

    def __init__(self, lib: ctypes.CDLL, into: Durations | None, timeline: Timeline | None = None) -> None:
        self.lib, self.into, self.timeline = lib, into, timeline
        self.handlers: dict[int, tuple[int, Callable[[bytes], None]]] = {}  # kind -> (bytes read, handler)
        self.ends: list[Callable[[], None]] = []  # called after each buffer: a batch's end
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        self._buffers: dict[int, Any] = {}
        self._request, self._complete = _REQUEST(self._on_request), _COMPLETE(self._on_complete)
        lib.cuptiActivityGetNextRecord.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
        self._check("cuptiActivityRegisterCallbacks", lib.cuptiActivityRegisterCallbacks(self._request, self._complete))
        if into is not None:
            self.enable(KIND_CONCURRENT_KERNEL)

    def _check(self, what: str, r: int) -> None:
        if r == MULTIPLE_SUBSCRIBERS:
            raise CuptiError(f"{what} failed: another tool holds the driver's one tool slot (CUptiResult {r}; "
                             "the SASS back end keeps it while its probes are attached)")
        if r != CUPTI_SUCCESS:
            raise CuptiError(f"{what} failed: CUptiResult {r}")

    def enable(self, kind: int, handler: tuple[int, Callable[[bytes], None]] | None = None) -> None:
        """Records of ``kind`` on; ``handler`` (bytes read, function): each record's first bytes go there."""
        if handler is not None:
            self.handlers[kind] = handler
        self._check(f"cuptiActivityEnable({kind})", self.lib.cuptiActivityEnable(kind))

    def configure_uvm(self) -> None:
        """Unified-memory counters on (runtime/uvm.py): every one CUPTI knows, else the basic four;
        CuptiError when CUPTI takes neither."""
        tried = []
        for kinds in (tuple(uvm.COUNTERS), uvm.BASIC):
            conf = ctypes.create_string_buffer(uvm.config(kinds))
            r = self.lib.cuptiActivityConfigureUnifiedMemoryCounter(conf, len(kinds))
            if r == CUPTI_SUCCESS:
                return
            tried.append(f"{len(kinds)} counters: CUptiResult {r}")
        raise CuptiError("cuptiActivityConfigureUnifiedMemoryCounter failed (" + ", ".join(tried) + ")")

    def flush_every(self, ms: int) -> None:
        """A thread hands completed records over every ``ms``, full buffers or not (cuptiActivityFlushAll(0):
        cuptiActivityFlushPeriod would hand over only full ones), until ``flush``."""
        def loop() -> None:
            while not self._stop.wait(ms / 1000):
                self.lib.cuptiActivityFlushAll(0)
        self._flusher = threading.Thread(target=loop, name="egpu-cupti-flush", daemon=True)
        self._flusher.start()

    def _on_request(self, buf: Any, size: Any, max_records: Any) -> None:
        b = ctypes.create_string_buffer(BUFFER_BYTES + 8)
        addr = (ctypes.addressof(b) + 7) & ~7  # CUPTI wants 8-byte aligned buffers
        self._buffers[addr] = b
        buf[0], size[0], max_records[0] = addr, BUFFER_BYTES, 0

    def _on_complete(self, _ctx: Any, _stream: int, buf: int, _size: int, valid: int) -> None:
        rows, rec = [], ctypes.c_void_p()
        try:
            while self.lib.cuptiActivityGetNextRecord(buf, valid, ctypes.byref(rec)) == CUPTI_SUCCESS:
                kind, = struct.unpack("<I", ctypes.string_at(rec.value, 4))
                if kind in (KIND_KERNEL, KIND_CONCURRENT_KERNEL):
                    start, end = struct.unpack("<QQ", ctypes.string_at(rec.value + 16, 16))
                    name = (ctypes.c_char_p.from_address(rec.value + 104).value or b"?").decode(errors="replace")
                    rows.append((kind, start, end, name))
                    if self.timeline is not None and end >= start:
                        stream, *dims = struct.unpack("<I6i", ctypes.string_at(rec.value + 48, 28))
                        corr, = struct.unpack("<I", ctypes.string_at(rec.value + 92, 4))
                        self.timeline.add(start, end, name, stream, corr, tuple(dims[:3]), tuple(dims[3:]))
                elif kind in self.handlers:
                    size, handle = self.handlers[kind]
                    handle(ctypes.string_at(rec.value, size))
            if self.into is not None:
                parse_records(rows, self.into)
        finally:
            self._buffers.pop(buf, None)
            for end in self.ends:
                end()

    def flush(self) -> None:
        """Hand every buffer over, completed kernels' records included (CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
        the periodic flushes end first."""
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join()
        self.lib.cuptiActivityFlushAll(1)


class UvmBatches:
    """Parses unified-memory records as they come and hands each buffer's batch to ``into`` at its end."""

    def __init__(self, into: uvm.Uvm) -> None:
        self.into = into
        self.batch: list[uvm.UvmRecord] = []

    def record(self, raw: bytes) -> None:
        r = uvm.parse(raw)
        if r is not None:
            self.batch.append(r)

    def end(self) -> None:
        batch, self.batch = self.batch, []
        if batch:
            self.into.add(batch)


@dataclass
class Recorder:
    """What the runtime keeps: kernel durations, copies, unified-memory events, and CUPTI or why it
    could not start. ``durations`` None: only unified memory was asked for (egpu/uvm probes)."""
    durations: Durations | None
    cupti: Cupti | None
    error: str | None
    timeline: Timeline | None = None
    copies: copies_mod.Copies | None = None
    copies_error: str | None = None
    uvm: uvm.Uvm | None = None
    uvm_error: str | None = None

    def finish(self, synchronize: Callable[[], None]) -> dict[str, Any]:
        """Wait for the kernels (``synchronize``), flush, and give the dump's fields."""
        if self.cupti is not None:
            try:
                synchronize()
            except Exception as e:  # the records of finished kernels still come
                self.error = f"kernels still running at exit: {e}"
            self.cupti.flush()
        out: dict[str, Any] = {"uvm": self.uvm.dump() if self.uvm else None, "uvm_error": self.uvm_error}
        if self.durations is not None:
            out |= {"durations": self.durations.dump(), "durations_error": self.error,
                    "copies": self.copies.dump() if self.copies else [], "copies_error": self.copies_error}
        if self.timeline is not None:
            out["launches"] = self.timeline.dump()
            out["copy_spans"] = self.copies.dump_spans() if self.copies else None
        return out


def start(timeline: bool = False, kernels: bool = True,
          uvm_sink: Callable[[list[uvm.UvmRecord]], None] | None = None) -> Recorder:
    """CUPTI on: kernel durations, copies and sets (each launch, copy and sync too when ``timeline``) when
    ``kernels``; unified-memory counters, their records handed to ``uvm_sink`` as they come."""
    d = Durations() if kernels else None
    try:
        lib = load_cupti()
        offset, clock = cupti_clock(lib)
        t = Timeline(offset, clock) if timeline and kernels else None
        cupti = Cupti(lib, d, t)
    except (CuptiError, AttributeError, OSError) as e:
        return Recorder(d, None, str(e), copies_error=str(e), uvm_error=str(e))
    rec = Recorder(d, cupti, None, t)
    if kernels:
        rec.copies = copies_mod.Copies(timeline)
        spans = copies_mod.COPY_KINDS + ((copies_mod.KIND_SYNC,) if timeline else ())
        try:
            for kind in spans:
                cupti.enable(kind, (copies_mod.RECORD_BYTES[kind], _copy_handler(rec.copies)))
        except (CuptiError, AttributeError) as e:
            rec.copies_error = str(e)
    try:
        rec.uvm = uvm.Uvm(offset, timeline and kernels, uvm_sink)
        batches = UvmBatches(rec.uvm)
        cupti.configure_uvm()
        cupti.ends.append(batches.end)
        cupti.enable(uvm.KIND_UNIFIED_MEMORY_COUNTER, (uvm.RECORD_BYTES, batches.record))
        if uvm_sink is not None:
            cupti.flush_every(uvm.FLUSH_PERIOD_MS)
    except (CuptiError, AttributeError) as e:
        rec.uvm, rec.uvm_error = None, str(e)
    return rec


def _copy_handler(into: copies_mod.Copies) -> Callable[[bytes], None]:
    def handle(raw: bytes) -> None:
        span = copies_mod.parse(raw)
        if span is not None:
            into.add(span)
    return handle


# ---- after the job ---------------------------------------------------------------------------------------

def render(docs: list[dict[str, Any]]) -> str:
    """Per process with durations: each kernel's count, total, mean, min, max and its log2 histogram; then
    each kind of copy and set (per direction and stream) with its bytes and bandwidth; then the
    unified-memory counters."""
    out = []
    for doc in docs:
        if doc.get("durations_error"):
            out.append(f"durations: pid {doc['pid']}: none ({doc['durations_error']})\n")
            continue
        blocks = []
        for name, count, total, low, high, slots in sorted(doc.get("durations") or [], key=lambda r: -r[2]):
            blocks.append(_spread(f"@duration_ns[{name}]: count {count}", count, total, low, high, slots))
        for op, direction, stream, count, nbytes, total, low, high, slots in sorted(
                doc.get("copies") or [], key=lambda r: -r[5]):
            rate = f", {nbytes / total:.2f} GB/s" if total else ""
            blocks.append(_spread(f"@copy_ns[{op} {direction} stream {stream}]: count {count}, bytes {nbytes}",
                                  count, total, low, high, slots, rate))
        if doc.get("copies_error"):
            blocks.append(f"copies: none ({doc['copies_error']})\n")
        counters = (doc.get("uvm") or {}).get("counters") or []
        if counters:
            blocks.append("".join(f"@uvm[{name}]: count {n}{_uvm_value(name, v)}\n" for name, n, v in counters))
        if doc.get("uvm_error"):
            blocks.append(f"uvm: none ({doc['uvm_error']})\n")
        if len(docs) > 1 and blocks:
            blocks[0] = f"pid {doc['pid']}:\n" + blocks[0]
        out += blocks
    return "\n".join(out)


def _spread(head: str, count: int, total: int, low: int, high: int, slots: list[list[int]], tail: str = "") -> str:
    """One series' line and its log2 histogram, empty buckets between kept."""
    from egpu_preload.output.text import histogram
    from egpu_preload.output.values import Histogram
    first, last = slots[0][0], slots[-1][0]
    counts = dict((s, c) for s, c in slots)
    h = Histogram("duration_ns", "log2", 1, 1 << first, tuple(1 << (s + 1) for s in range(first, last + 1)),
                  tuple(counts.get(s, 0) for s in range(first, last + 1)))
    return f"{head}, total {total}, mean {total // count}, min {low}, max {high}{tail}\n" + histogram(h)


def _uvm_value(name: str, value: int) -> str:
    """What a counter's summed value means: bytes moved, fault groups, or nothing (CPU faults: PCs)."""
    if name == "gpu_page_fault":
        return f", fault groups {value}"
    if name in {uvm.COUNTERS[k] for k in uvm.BYTE_COUNTERS}:
        return f", bytes {value}"
    return ""


def render_json(docs: list[dict[str, Any]], now: float) -> str:
    """One JSON line per process with durations: {"time", "pid", "durations": {name: {...}}, "copies":
    [{...}], "uvm": {counter: {"count", "value"}}, "error", "copies_error", "uvm_error"}."""
    import json
    lines = []
    for doc in docs:
        if "durations" not in doc:
            continue
        kernels = {name: {"count": c, "total_ns": t, "min_ns": lo, "max_ns": hi,
                          "hist_log2_ns": {str(s): n for s, n in slots}}
                   for name, c, t, lo, hi, slots in doc["durations"]}
        moved = [{"operation": op, "direction": d, "stream": st, "count": c, "bytes": b, "total_ns": t,
                  "min_ns": lo, "max_ns": hi, "hist_log2_ns": {str(s): n for s, n in slots}}
                 for op, d, st, c, b, t, lo, hi, slots in doc.get("copies") or []]
        um = {name: {"count": n, "value": v} for name, n, v in (doc.get("uvm") or {}).get("counters") or []}
        lines.append(json.dumps({"time": now, "pid": doc["pid"], "durations": kernels, "copies": moved, "uvm": um,
                                 "error": doc.get("durations_error"), "copies_error": doc.get("copies_error"),
                                 "uvm_error": doc.get("uvm_error")}, separators=(",", ":")) + "\n")
    return "".join(lines)
