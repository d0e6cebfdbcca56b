"""Kernel durations for every kernel (SASS-only ones included), from CUPTI activity records, without
adding anything to the application's streams.

CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL makes the driver time each kernel on the GPU itself and hand the
records (start, end, name, correlation id) to buffers CUPTI fills on its own thread; nothing is
recorded on the application's streams and kernels keep running concurrently (the KIND_KERNEL variant
would serialize them). The runtime aggregates per mangled kernel name: count, total, min, max and a
log2 histogram of end - start. At exit it flushes CUPTI and the result goes into the process's dump
under "durations": [[name, count, total_ns, min_ns, max_ns, [[slot, count]...]]] and
"durations_error" (why there are none, or None). CUDA events around each launch were the other way
(bench/bench_shim.py measures what two cuEventRecord per launch cost).

libcupti comes from the process (a PyTorch that loaded its own), the library path, the nvidia-cuda-cupti
wheel, or the toolkit (extras/CUPTI/lib64, lib64). Only one client may own CUPTI's activity buffers:
torch.profiler in the same process takes them over.

Record layout read here (cupti_activity.h, CUpti_ActivityKernel4 through 10 share the first 112 bytes):
u32 kind at 0, u64 start at 16, u64 end at 24, u32 correlationId at 92, const char *name at 104.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

KIND_KERNEL, KIND_CONCURRENT_KERNEL = 3, 10
CUPTI_SUCCESS = 0
BUFFER_BYTES = 8 << 20
SLOTS = 64
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

    def __init__(self, lib: ctypes.CDLL, into: Durations) -> None:
        self.lib, self.into = lib, into
        self._buffers: dict[int, Any] = {}
        self._request, self._complete = _REQUEST(self._on_request), _COMPLETE(self._on_complete)
        lib.cuptiActivityGetNextRecord.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
        self._check("cuptiActivityRegisterCallbacks", lib.cuptiActivityRegisterCallbacks(self._request, self._complete))
        self._check("cuptiActivityEnable", lib.cuptiActivityEnable(KIND_CONCURRENT_KERNEL))

    def _check(self, what: str, r: int) -> None:
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
                    name = ctypes.c_char_p.from_address(rec.value + 104).value or b"?"
                    rows.append((kind, start, end, name.decode(errors="replace")))
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

    def finish(self, synchronize: Callable[[], None]) -> dict[str, Any]:
        """Wait for the kernels (``synchronize``), flush, and give the dump's fields."""
        if self.cupti is not None:
            try:
                synchronize()
            except Exception as e:  # the records of finished kernels still come
                self.error = f"kernels still running at exit: {e}"
            self.cupti.flush()
        return {"durations": self.durations.dump(), "durations_error": self.error}


def start() -> Recorder:
    d = Durations()
    try:
        return Recorder(d, Cupti(load_cupti(), d), None)
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
