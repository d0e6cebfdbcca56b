"""Kernel launches and ring-buffer events as a Chrome JSON trace (the Trace Event Format), which
ui.perfetto.dev and Perfetto's trace processor open.

One track per CUDA stream, a slice per launch (demangled name; mangled name, launch id, grid and block
in its args) and per memory copy or set on that stream (``Slice`` with an int track: bytes and direction
in its args); a track per other named timeline (host synchronizations, unified-memory migrations and
faults: ``Slice`` with a str track; a slice of no duration is an instant); one track per ring-buffer or
perf map, an instant per record that has an integer ``ts`` field (records without one have no place on a
timeline and are left out; its integer fields beyond 2**53, which the viewers' doubles round, as decimal
text). Launch times and record ``ts`` must be the same clock in ns (the GPU's
%globaltimer, as bpf_ktime_get_ns reads it).

A job's processes go into one file (``write_all``): a process track each (named with its argv and rank,
its dropped-record counts in its labels), all on one time base. Within a track events are in time order.

Timestamps are written relative to the earliest one, in µs with ns decimals: the format's ``ts`` is µs
and a float64 cannot keep ns of an epoch-based clock. ``otherData.base_ns`` holds the offset.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..translate.demangle import base_name
from ..errors import EgpuError
from .json import plain
from .text import kernel_name
from .values import KernelId, Records

TS_FIELD = "ts"
FLOAT_EXACT = 1 << 53   # integers up to this are exact in a double


@dataclass(frozen=True)
class Launch:
    kernel: str              # mangled name
    start_ns: int
    duration_ns: int
    stream: int              # the CUstream handle (0: the legacy default stream), or CUPTI's stream id
    launch_id: int | None    # egpu's launch id; None where unknown (CUPTI records carry a correlation id)
    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (1, 1, 1)
    correlation_id: int | None = None


@dataclass(frozen=True)
class Slice:
    """A span that is not a kernel: a copy or set (``track`` its stream, beside that stream's kernels), a
    synchronization or a migration (``track`` the name of a track of its own). ``duration_ns`` 0: an instant."""
    track: int | str
    name: str
    start_ns: int
    duration_ns: int
    category: str
    args: Mapping[str, object] = field(default_factory=dict)


@dataclass
class Trace:
    """Collects launches and records over a run; ``write`` produces the trace file."""

    pid: int
    process_name: str = ""
    kernel_names: Mapping[int, str] = field(default_factory=dict)
    launches: list[Launch] = field(default_factory=list)
    slices: list[Slice] = field(default_factory=list)
    records: dict[str, list[tuple[int, dict]]] = field(default_factory=dict)  # map -> (ts, args)
    labels: dict[str, object] = field(default_factory=dict)  # shown with the process (argv, rank, drops)

    def add_launch(self, launch: Launch) -> None:
        self.launches.append(launch)

    def add_slice(self, s: Slice) -> None:
        self.slices.append(s)

    def add_records(self, records: Records) -> None:
        """A snapshot's records of one map; those with an integer ``ts`` field become instants."""
        track = self.records.setdefault(records.name, [])
        for r in records.records:
            args = plain(r.value, lambda k: kernel_name(k, self.kernel_names))
            ts = r.value.get(TS_FIELD) if isinstance(r.value, dict) else None
            if isinstance(ts, int) and not isinstance(ts, (bool, KernelId)):
                track.append((ts, args if r.cpu is None else {**args, "sm": r.cpu}))

    def times(self) -> list[int]:
        return ([l.start_ns for l in self.launches] + [s.start_ns for s in self.slices]
                + [ts for rs in self.records.values() for ts, _ in rs])

    def document(self) -> dict:
        return document([self])

    def events(self, base: int) -> list[dict]:
        """This process's events, times relative to ``base`` ns."""
        def us(ns: int) -> float:
            return round((ns - base) / 1000, 3)

        events: list[dict] = [_meta("process_name", self.pid, 0, self.process_name or f"pid {self.pid}")]
        if self.labels:
            events.append({"ph": "M", "name": "process_labels", "pid": self.pid, "tid": 0,
                           "args": {"labels": ", ".join(f"{k}: {v}" for k, v in self.labels.items())}})
        tids: dict[int | str, int] = {}

        def tid(track: int | str) -> int:
            if track not in tids:
                tids[track] = len(tids) + 1
                name = f"stream {track:#x}" if isinstance(track, int) else track
                events.append(_meta("thread_name", self.pid, tids[track], name))
            return tids[track]

        on_streams: list[Launch | Slice] = [*self.launches, *(s for s in self.slices if isinstance(s.track, int))]
        for item in sorted(on_streams, key=lambda x: x.start_ns):
            if isinstance(item, Slice):
                events.append(_slice(item, self.pid, tid(item.track), us))
                continue
            launch = item
            events.append({"ph": "X", "cat": "kernel", "name": base_name(launch.kernel) or launch.kernel,
                           "pid": self.pid, "tid": tid(launch.stream), "ts": us(launch.start_ns),
                           "dur": round(launch.duration_ns / 1000, 3),
                           "args": {"kernel": launch.kernel, "grid": list(launch.grid), "block": list(launch.block),
                                    **{k: v for k, v in (("launch_id", launch.launch_id),
                                                         ("correlation_id", launch.correlation_id)) if v is not None}}})
        named = sorted((s for s in self.slices if isinstance(s.track, str)), key=lambda s: (s.track, s.start_ns))
        events += [_slice(s, self.pid, tid(s.track), us) for s in named]
        # Map tracks after the stream tracks; tids stay small ints (streams are 64-bit handles).
        for i, (name, track) in enumerate(sorted(self.records.items()), start=len(tids) + 1):
            events.append(_meta("thread_name", self.pid, i, f"@{name}"))
            events += [{"ph": "i", "s": "t", "cat": "event", "name": name, "pid": self.pid, "tid": i,
                        "ts": us(ts), "args": _exact(args)} for ts, args in sorted(track, key=lambda r: r[0])]
        return events

    def write(self, path: str | Path) -> None:
        write_all([self], path)


def document(traces: list[Trace]) -> dict:
    """One trace of several processes, on one time base."""
    base = min((t for trace in traces for t in trace.times()), default=0)
    events = [e for trace in traces for e in trace.events(base)]
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": {"base_ns": base}}


def write_all(traces: list[Trace], path: str | Path) -> None:
    """The trace file; EgpuError when it cannot be written."""
    try:
        Path(path).write_text(json.dumps(document(traces), separators=(",", ":")))
    except OSError as e:
        raise EgpuError(f"cannot write the trace: {e.strerror}", file=str(path)) from None


def _slice(s: Slice, pid: int, tid: int, us: Callable[[int], float]) -> dict:
    """A complete event, or an instant where the slice has no duration (Perfetto drops dur 0 slices)."""
    event = {"cat": s.category, "name": s.name, "pid": pid, "tid": tid, "ts": us(s.start_ns), "args": dict(s.args)}
    if s.duration_ns > 0:
        return {"ph": "X", **event, "dur": round(s.duration_ns / 1000, 3)}
    return {"ph": "i", "s": "t", **event}


def _exact(args: Mapping) -> dict:
    """A record's fields with the integers a double cannot hold (beyond 2**53, a ``ts`` in ns among them) as
    decimal text: the viewers read JSON numbers as JavaScript's doubles, which showed 2**64 - 255 as
    18446744073709552000 and rounded a ts to 256 ns."""
    return {k: str(v) if type(v) is int and abs(v) > FLOAT_EXACT else v for k, v in args.items()}


def _meta(kind: str, pid: int, tid: int, name: str) -> dict:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": name}}
