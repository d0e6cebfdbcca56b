"""Unified-memory page faults and migrations from CUPTI's unified-memory counter activity records: the
record (``UvmRecord``), its totals per counter kind, its spans for a timeline, and the context
``SEC("egpu/uvm/GLOB")`` probes receive (``struct egpu_uvm_ctx`` in egpu.bpf.h).

CUPTI is told which counters to record with cuptiActivityConfigureUnifiedMemoryCounter (COUNTERS below,
scope PROCESS_SINGLE_DEVICE on device 0: the scope is deprecated since CUDA 7 but still read), then
CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER is enabled. A configuration the driver refuses (e.g. GPU fault
records on a device without them) is retried with the four counters every UVM device has (BASIC).

Record layout (cupti_activity.h, CUDA 13.0, CUpti_ActivityUnifiedMemoryCounter3, offsets checked with
offsetof): u32 kind at 0, u32 counterKind at 4, u64 value at 8, u64 start at 16, u64 end at 24,
u64 address at 32, u32 srcId at 40, u32 dstId at 44, u32 streamId at 48, u32 processId at 52,
u32 flags at 56. ``value`` is bytes for transfers, thrashing and remote maps, the number of fault groups
for a GPU page fault, and the faulting instruction's PC for a CPU page fault.

Delivery. CUPTI hands records over a buffer at a time, on its own thread or the one that flushes, when a
buffer fills, every FLUSH_PERIOD_MS (a thread of ours calls cuptiActivityFlushAll(0), which hands over partly
filled buffers too; cuptiActivityFlushPeriod would hand over only full ones), and at exit. ``Uvm.add`` takes
each record and passes the batch of one buffer to ``sink`` (runtime/launches.Drainer.deliver_uvm runs the
egpu/uvm probes on the Python VM); so a probe sees a migration within about FLUSH_PERIOD_MS of CUPTI recording
it, in CUPTI's order. The sink's interface is one call with a list of UvmRecord: a C runner can take the same
records packed as ``context_bytes`` makes them.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

KIND_UNIFIED_MEMORY_COUNTER = 25
# CUpti_ActivityUnifiedMemoryCounterKind -> the name egpu/uvm/GLOB matches and the text prints.
COUNTERS = {1: "htod", 2: "dtoh", 3: "cpu_page_fault", 4: "gpu_page_fault", 5: "thrashing", 6: "throttling",
            7: "remote_map", 8: "dtod"}
BASIC = (1, 2, 3, 4)
CPU_PAGE_FAULT = 3
BYTE_COUNTERS = frozenset({1, 2, 5, 7, 8})  # value is bytes
SCOPE_PROCESS_SINGLE_DEVICE = 1
FLUSH_PERIOD_MS = 100
RECORD_BYTES = 60
SPAN_LIMIT = 1_000_000
_RECORD = struct.Struct("<IIQQQQIIIII")  # kind, counterKind, value, start, end, address, src, dst, stream, pid, flags
# start, end, counter kind, flags, src, dst, value, address
SPAN_ROW = struct.Struct("<QQIIIIQQ")
# struct egpu_uvm_ctx (egpu.bpf.h): addr, bytes, value, start_ns, end_ns, kind, flags, src, dst, stream, pad
CONTEXT = struct.Struct("<QQQQQIIIIII")
CONFIG = struct.Struct("<IIII")        # CUpti_ActivityUnifiedMemoryCounterConfig: scope, kind, deviceId, enable


@dataclass(frozen=True)
class UvmRecord:
    """One unified-memory event. Times in ns on the clock the producer says (CUPTI's, until moved)."""
    kind: int           # CUpti_ActivityUnifiedMemoryCounterKind: COUNTERS's keys
    address: int        # the first page's virtual address (faults: the faulting page)
    value: int          # bytes (BYTE_COUNTERS), fault groups (GPU faults) or the faulting PC (CPU faults)
    start_ns: int
    end_ns: int         # == start_ns where CUPTI gives none (CPU faults, thrashing, remote maps)
    src: int            # source device (CPU: CUPTI's CPU id)
    dst: int
    flags: int          # GPU faults: access type; transfers: migration cause (CUPTI's enums)
    stream: int

    @property
    def name(self) -> str:
        return COUNTERS.get(self.kind, str(self.kind))

    @property
    def bytes(self) -> int:
        return self.value if self.kind in BYTE_COUNTERS else 0


def parse(raw: bytes) -> UvmRecord | None:
    """A record's first RECORD_BYTES bytes -> UvmRecord; None for other kinds."""
    kind, counter, value, start, end, address, src, dst, stream, _pid, flags = _RECORD.unpack_from(raw)
    if kind != KIND_UNIFIED_MEMORY_COUNTER:
        return None
    ends = counter in (1, 2, 4, 6, 8)  # the others have no end timestamp
    return UvmRecord(counter, address, value, start, end if ends and end >= start else start, src, dst, flags, stream)


def context_bytes(r: UvmRecord) -> bytes:
    """``struct egpu_uvm_ctx`` of an egpu/uvm probe."""
    return CONTEXT.pack(r.address, r.bytes, r.value, r.start_ns, r.end_ns, r.kind, r.flags, r.src, r.dst,
                        r.stream, 0)


def config(kinds: tuple[int, ...]) -> bytes:
    """The CUpti_ActivityUnifiedMemoryCounterConfig array enabling ``kinds`` on device 0."""
    return b"".join(CONFIG.pack(SCOPE_PROCESS_SINGLE_DEVICE, k, 0, 1) for k in kinds)


class Uvm:
    """Totals per counter kind, spans when ``timeline``, and the records handed to ``sink`` (times
    moved by ``clock_offset_ns`` first); filled from CUPTI's thread."""

    def __init__(self, clock_offset_ns: int = 0, timeline: bool = False,
                 sink: Callable[[list[UvmRecord]], None] | None = None, limit: int = SPAN_LIMIT) -> None:
        self.offset, self.timeline, self.sink, self.limit = clock_offset_ns, timeline, sink, limit
        self.totals: dict[int, list[int]] = {}   # kind -> [records, sum of value]
        self.rows = bytearray()
        self.dropped = 0
        self._lock = threading.Lock()

    def add(self, records: list[UvmRecord]) -> None:
        with self._lock:
            for r in records:
                t = self.totals.setdefault(r.kind, [0, 0])
                t[0] += 1
                t[1] += r.value if r.kind != CPU_PAGE_FAULT else 0  # a PC: no sum means anything
                if not self.timeline:
                    continue
                if len(self.rows) >= self.limit * SPAN_ROW.size:
                    self.dropped += 1
                    continue
                self.rows += SPAN_ROW.pack(r.start_ns, r.end_ns, r.kind, r.flags, r.src, r.dst, r.value, r.address)
        if self.sink is not None and records:
            off = self.offset
            self.sink([UvmRecord(r.kind, r.address, r.value, r.start_ns + off, r.end_ns + off, r.src, r.dst,
                                 r.flags, r.stream) for r in records])

    def dump(self) -> dict[str, Any]:
        """{"counters": [[name, records, sum of value (0 for CPU faults)]...], "rows" (SPAN_ROW each,
        CUPTI clock), "dropped"}."""
        with self._lock:
            return {"counters": [[COUNTERS.get(k, str(k)), n, v] for k, (n, v) in sorted(self.totals.items())],
                    "rows": bytes(self.rows), "dropped": self.dropped}


def spans(dumped: dict[str, Any], clock_offset_ns: int = 0) -> list[UvmRecord]:
    """The records of a dump's "uvm" rows, times moved by ``clock_offset_ns`` (stream not kept: 0)."""
    return [UvmRecord(kind, address, value, start + clock_offset_ns, end + clock_offset_ns, src, dst, flags, 0)
            for start, end, kind, flags, src, dst, value, address in SPAN_ROW.iter_unpack(dumped["rows"])]
