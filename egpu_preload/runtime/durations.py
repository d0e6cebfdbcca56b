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
from dataclasses import dataclass, field
from typing import Any

KIND_KERNEL, KIND_CONCURRENT_KERNEL = 3, 10
CUPTI_SUCCESS = 0
MULTIPLE_SUBSCRIBERS = 39   # CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
BUFFER_BYTES = 8 << 20
SLOTS = 64
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


def log2_slot(ns: int) -> int:
    """Slot k counts [2^k, 2^(k+1)) ns; 0 and 1 ns share slot 0."""
    return min(max(ns, 1).bit_length() - 1, SLOTS - 1)


@dataclass
class KernelDurations:
    count: int = 0
    total: int = 0
    low: int = 0
    high: int = 0
    slots: dict[int, int] = field(default_factory=dict)

    def add(self, ns: int) -> None:
        self.low = ns if not self.count else min(self.low, ns)
        self.high = max(self.high, ns)
        self.count += 1
        self.total += ns
        s = log2_slot(ns)
        self.slots[s] = self.slots.get(s, 0) + 1


class Durations:
    """Per-kernel durations, filled from any thread."""

    def __init__(self) -> None:
        self.kernels: dict[str, KernelDurations] = {}
        self._lock = threading.Lock()

    def add(self, name: str, ns: int) -> None:
        with self._lock:
            self.kernels.setdefault(name, KernelDurations()).add(ns)

    def dump(self) -> list[list[Any]]:
        with self._lock:
            return [[n, k.count, k.total, k.low, k.high, sorted([s, c] for s, c in k.slots.items())]
                    for n, k in sorted(self.kernels.items())]


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
    """CUPTI's activity API, kernel records only, feeding a Durations."""

    def __init__(self, lib: ctypes.CDLL, into: Durations, timeline: Timeline | None = None) -> None:
        self.lib, self.into, self.timeline = lib, into, timeline
        self._buffers: dict[int, Any] = {}
        self._request, self._complete = _REQUEST(self._on_request), _COMPLETE(self._on_complete)
        lib.cuptiActivityGetNextRecord.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
        self._check("cuptiActivityRegisterCallbacks", lib.cuptiActivityRegisterCallbacks(self._request, self._complete))
        self._check("cuptiActivityEnable", lib.cuptiActivityEnable(KIND_CONCURRENT_KERNEL))

    def _check(self, what: str, r: int) -> None:
        if r == MULTIPLE_SUBSCRIBERS:
            raise CuptiError(f"{what} failed: another tool holds the driver's one tool slot (CUptiResult {r}; "
                             "the SASS back end keeps it while its probes are attached)")
        if r != CUPTI_SUCCESS:
            raise CuptiError(f"{what} failed: CUptiResult {r}")

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
            parse_records(rows, self.into)
        finally:
            self._buffers.pop(buf, None)

    def flush(self) -> None:
        """Hand every buffer over, completed kernels' records included (CUPTI_ACTIVITY_FLAG_FLUSH_FORCED)."""
        self.lib.cuptiActivityFlushAll(1)


@dataclass
class Recorder:
    """What the runtime keeps: the durations, and CUPTI or why it could not start."""
    durations: Durations
    cupti: Cupti | None
    error: str | None
    timeline: Timeline | None = None

    def finish(self, synchronize: Callable[[], None]) -> dict[str, Any]:
        """Wait for the kernels (``synchronize``), flush, and give the dump's fields."""
        if self.cupti is not None:
            try:
                synchronize()
            except Exception as e:  # the records of finished kernels still come
                self.error = f"kernels still running at exit: {e}"
            self.cupti.flush()
        out = {"durations": self.durations.dump(), "durations_error": self.error}
        return out if self.timeline is None else {**out, "launches": self.timeline.dump()}


def start(timeline: bool = False) -> Recorder:
    """CUPTI on, feeding per-kernel durations, and each launch too when ``timeline``."""
    d = Durations()
    try:
        lib = load_cupti()
        t = Timeline(*cupti_clock(lib)) if timeline else None
        return Recorder(d, Cupti(lib, d, t), None, t)
    except (CuptiError, AttributeError, OSError) as e:
        return Recorder(d, None, str(e))


# ---- after the job ---------------------------------------------------------------------------------------

def render(docs: list[dict[str, Any]]) -> str:
    """Per process with durations: each kernel's count, total, mean, min, max and its log2 histogram."""
    from egpu_preload.output.text import histogram
    from egpu_preload.output.values import Histogram
    out = []
    for doc in docs:
        if doc.get("durations_error"):
            out.append(f"durations: pid {doc['pid']}: none ({doc['durations_error']})\n")
            continue
        rows = doc.get("durations") or []
        for name, count, total, low, high, slots in sorted(rows, key=lambda r: -r[2]):
            lines = [f"@duration_ns[{name}]: count {count}, total {total}, mean {total // count}, "
                     f"min {low}, max {high}\n"]
            first, last = slots[0][0], slots[-1][0]
            counts = dict((s, c) for s, c in slots)
            h = Histogram("duration_ns", "log2", 1, 1 << first,
                          tuple(1 << (s + 1) for s in range(first, last + 1)),
                          tuple(counts.get(s, 0) for s in range(first, last + 1)))
            out.append("".join(lines) + histogram(h))
        if len(docs) > 1 and rows:
            out[-len(rows)] = f"pid {doc['pid']}:\n" + out[-len(rows)]
    return "\n".join(out)


def render_json(docs: list[dict[str, Any]], now: float) -> str:
    """One JSON line per process with durations: {"time", "pid", "durations": {name: {...}}}."""
    import json
    lines = []
    for doc in docs:
        if "durations" not in doc:
            continue
        kernels = {name: {"count": c, "total_ns": t, "min_ns": lo, "max_ns": hi,
                          "hist_log2_ns": {str(s): n for s, n in slots}}
                   for name, c, t, lo, hi, slots in doc["durations"]}
        lines.append(json.dumps({"time": now, "pid": doc["pid"], "durations": kernels,
                                 "error": doc.get("durations_error")}, separators=(",", ":")) + "\n")
    return "".join(lines)
