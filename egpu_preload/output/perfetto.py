"""Kernel launches and ring-buffer events as a Chrome JSON trace (the Trace Event Format), which
ui.perfetto.dev and Perfetto's trace processor open.

One track per CUDA stream, a slice per launch (demangled name; mangled name, launch id, grid and block
in its args); one track per ring-buffer or perf map, an instant per record that has an integer ``ts``
field (records without one have no place on a timeline and are left out). Launch times and record
``ts`` must be the same clock in ns (the GPU's %globaltimer, as bpf_ktime_get_ns reads it).

Timestamps are written relative to the earliest one, in µs with ns decimals: the format's ``ts`` is µs
and a float64 cannot keep ns of an epoch-based clock. ``otherData.base_ns`` holds the offset.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..translate.demangle import base_name
from .json import plain
from .text import kernel_name
from .values import KernelId, Records

TS_FIELD = "ts"


@dataclass(frozen=True)
class Launch:
    kernel: str              # mangled name
    start_ns: int
    duration_ns: int
    stream: int              # the CUstream handle (0: the legacy default stream)
    launch_id: int
    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (1, 1, 1)


@dataclass
class Trace:
    """Collects launches and records over a run; ``write`` produces the trace file."""

    pid: int
    process_name: str = ""
    kernel_names: Mapping[int, str] = field(default_factory=dict)
    launches: list[Launch] = field(default_factory=list)
    records: dict[str, list[tuple[int, dict]]] = field(default_factory=dict)  # map -> (ts, args)

    def add_launch(self, launch: Launch) -> None:
        self.launches.append(launch)

    def add_records(self, records: Records) -> None:
        """A snapshot's records of one map; those with an integer ``ts`` field become instants."""
        track = self.records.setdefault(records.name, [])
        for r in records.records:
            args = plain(r.value, lambda k: kernel_name(k, self.kernel_names))
            ts = r.value.get(TS_FIELD) if isinstance(r.value, dict) else None
            if isinstance(ts, int) and not isinstance(ts, (bool, KernelId)):
                track.append((ts, args if r.cpu is None else {**args, "sm": r.cpu}))

    def document(self) -> dict:
        times = [l.start_ns for l in self.launches] + [ts for rs in self.records.values() for ts, _ in rs]
        base = min(times, default=0)

        def us(ns: int) -> float:
            return round((ns - base) / 1000, 3)

        events: list[dict] = [_meta("process_name", self.pid, 0, self.process_name or f"pid {self.pid}")]
        tids: dict[int, int] = {}
        for launch in self.launches:
            if launch.stream not in tids:
                tids[launch.stream] = len(tids) + 1
                events.append(_meta("thread_name", self.pid, tids[launch.stream], f"stream {launch.stream:#x}"))
            events.append({"ph": "X", "cat": "kernel", "name": base_name(launch.kernel) or launch.kernel,
                           "pid": self.pid, "tid": tids[launch.stream], "ts": us(launch.start_ns),
                           "dur": round(launch.duration_ns / 1000, 3),
                           "args": {"kernel": launch.kernel, "launch_id": launch.launch_id,
                                    "grid": list(launch.grid), "block": list(launch.block)}})
        # Map tracks after the stream tracks; tids stay small ints (streams are 64-bit handles).
        for i, (name, track) in enumerate(sorted(self.records.items()), start=len(tids) + 1):
            events.append(_meta("thread_name", self.pid, i, f"@{name}"))
            events += [{"ph": "i", "s": "t", "cat": "event", "name": name, "pid": self.pid, "tid": i,
                        "ts": us(ts), "args": args} for ts, args in track]
        return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": {"base_ns": base}}

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.document(), separators=(",", ":")))


def _meta(kind: str, pid: int, tid: int, name: str) -> dict:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": name}}
