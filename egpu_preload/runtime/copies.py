"""Memory copies, sets and synchronizations from CUPTI activity records: each one's device time, bytes,
direction and stream, aggregated per (operation, direction, stream), and kept as spans for a timeline.

Kinds read (cupti_activity.h, CUDA 13.0; offsets checked there with offsetof):
- CUPTI_ACTIVITY_KIND_MEMCPY (1), CUpti_ActivityMemcpy6: u32 kind at 0, u8 copyKind at 4 (the direction,
  CUpti_ActivityMemcpyKind), u64 bytes at 8, u64 start at 16, u64 end at 24, u32 deviceId at 32,
  u32 streamId at 40, u32 correlationId at 44.
- CUPTI_ACTIVITY_KIND_MEMCPY2 (22, peer copies), CUpti_ActivityMemcpyPtoP4: the same first 44 bytes but
  correlationId at 60 (srcDeviceId at 44, dstDeviceId at 52 in between).
- CUPTI_ACTIVITY_KIND_MEMSET (2), CUpti_ActivityMemset4: bytes at 8, start at 16, end at 24, deviceId at
  32, streamId at 40, correlationId at 44, u16 memoryKind at 50 (CUpti_ActivityMemoryKind: where the set
  memory is, which stands for its direction).
- CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (38), CUpti_ActivitySynchronization2: u32 type at 4, start at 8,
  end at 16, correlationId at 24, streamId at 32 (CUPTI_SYNCHRONIZATION_INVALID_VALUE for a context sync).
  Only with a timeline: a sync's span is the time the host was blocked, not device work.

The stream is CUPTI's stream id (as for kernels), not the CUstream handle. Copies the runtime makes for
itself (the maps' mirror and read-back, when probes have maps) are CUPTI records too and are counted.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass, field
from typing import Any

from egpu_preload.runtime.spread import Spread

KIND_MEMCPY, KIND_MEMSET, KIND_MEMCPY2, KIND_SYNC = 1, 2, 22, 38
COPY_KINDS = (KIND_MEMCPY, KIND_MEMSET, KIND_MEMCPY2)
OPERATIONS = {KIND_MEMCPY: "memcpy", KIND_MEMSET: "memset", KIND_MEMCPY2: "memcpy_peer", KIND_SYNC: "sync"}
DIRECTIONS = ("unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD", "HtoH", "PtoP")
MEMORY_KINDS = ("unknown", "pageable", "pinned", "device", "array", "managed", "device_static", "managed_static")
SYNC_TYPES = ("unknown", "event_synchronize", "stream_wait_event", "stream_synchronize", "context_synchronize")
RECORD_BYTES = {KIND_MEMCPY: 48, KIND_MEMCPY2: 64, KIND_MEMSET: 52, KIND_SYNC: 36}  # what parse reads
INVALID = 0xFFFFFFFF  # CUPTI_SYNCHRONIZATION_INVALID_VALUE: a sync's stream where it has none
SPAN_LIMIT = 1_000_000
# start, end, CUPTI kind, detail (direction, memory kind or sync type), stream, correlation id, bytes
SPAN_ROW = struct.Struct("<QQIIIIQ")
_COPY = struct.Struct("<IB3xQQQI4xII")     # kind, copyKind, bytes, start, end, deviceId, streamId, correlationId
_MEMSET = struct.Struct("<I4xQQQI4xII2xH")  # kind, bytes, start, end, deviceId, streamId, correlationId, memoryKind
_SYNC = struct.Struct("<IIQQI4xI")          # kind, type, start, end, correlationId, streamId


def _name(names: tuple[str, ...], i: int) -> str:
    return names[i] if 0 <= i < len(names) else str(i)


@dataclass(frozen=True)
class Span:
    """One copy, set or synchronization, times in CUPTI's clock (ns)."""
    kind: int           # KIND_*
    detail: int         # memcpy: CUpti_ActivityMemcpyKind; memset: CUpti_ActivityMemoryKind; sync: its type
    start_ns: int
    end_ns: int
    stream: int         # CUPTI's stream id
    correlation_id: int
    bytes: int = 0

    @property
    def operation(self) -> str:
        return OPERATIONS.get(self.kind, str(self.kind))

    @property
    def direction(self) -> str:
        """HtoD ... for copies, the memory kind for sets, the sync type for synchronizations."""
        names = {KIND_MEMSET: MEMORY_KINDS, KIND_SYNC: SYNC_TYPES}.get(self.kind, DIRECTIONS)
        return _name(names, self.detail)


def parse(raw: bytes) -> Span | None:
    """A record's first RECORD_BYTES[kind] bytes -> Span; None for other kinds."""
    kind, = struct.unpack_from("<I", raw)
    if kind in (KIND_MEMCPY, KIND_MEMCPY2):
        _, direction, nbytes, start, end, _device, stream, corr = _COPY.unpack_from(raw)
        if kind == KIND_MEMCPY2:
            corr, = struct.unpack_from("<I", raw, 60)
        return Span(kind, direction, start, end, stream, corr, nbytes)
    if kind == KIND_MEMSET:
        _, nbytes, start, end, _device, stream, corr, memory = _MEMSET.unpack_from(raw)
        return Span(kind, memory, start, end, stream, corr, nbytes)
    if kind == KIND_SYNC:
        _, sync_type, start, end, corr, stream = _SYNC.unpack_from(raw)
        return Span(kind, sync_type, start, end, stream, corr)
    return None


@dataclass
class CopyStats:
    bytes: int = 0
    time: Spread = field(default_factory=Spread)


class Copies:
    """Copies and sets per (operation, direction, stream), and each span (syncs too) when ``timeline``;
    filled from any thread. Spans past ``limit`` are counted, not kept."""

    def __init__(self, timeline: bool = False, limit: int = SPAN_LIMIT) -> None:
        self.stats: dict[tuple[str, str, int], CopyStats] = {}
        self.timeline, self.limit = timeline, limit
        self.rows = bytearray()
        self.dropped = 0
        self._lock = threading.Lock()

    def add(self, span: Span) -> None:
        with self._lock:
            if span.kind in COPY_KINDS and span.end_ns >= span.start_ns:
                key = (span.operation, span.direction, span.stream)
                stats = self.stats.setdefault(key, CopyStats())
                stats.bytes += span.bytes
                stats.time.add(span.end_ns - span.start_ns)
            if not self.timeline:
                return
            if len(self.rows) >= self.limit * SPAN_ROW.size:
                self.dropped += 1
                return
            self.rows += SPAN_ROW.pack(span.start_ns, span.end_ns, span.kind, span.detail, span.stream,
                                       span.correlation_id, span.bytes)

    def dump(self) -> list[list[Any]]:
        """[[operation, direction, stream, count, bytes, total_ns, min_ns, max_ns, [[slot, count]...]]...]"""
        with self._lock:
            return [[*key, s.time.count, s.bytes, *s.time.row()[1:]] for key, s in sorted(self.stats.items())]

    def dump_spans(self) -> dict[str, Any]:
        """{"rows" (SPAN_ROW each, CUPTI clock), "dropped"}."""
        with self._lock:
            return {"rows": bytes(self.rows), "dropped": self.dropped}


def spans(dumped: dict[str, Any], clock_offset_ns: int = 0) -> list[Span]:
    """The spans of a dump's "copy_spans", times moved by ``clock_offset_ns``."""
    return [Span(kind, detail, start + clock_offset_ns, end + clock_offset_ns, stream, corr, nbytes)
            for start, end, kind, detail, stream, corr, nbytes in SPAN_ROW.iter_unpack(dumped["rows"])]
