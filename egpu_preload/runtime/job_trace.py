"""egpu-run --perfetto FILE: the job's exit dumps as one trace (output/perfetto.py).

Per process (a track named with its argv and rank): a slice per kernel launch CUPTI timed (the dump's
"launches", runtime/durations.Timeline; times put on CLOCK_REALTIME), one track per stream, with the
copies and sets on that stream (the dump's "copy_spans", runtime/copies.py); a track for the time the
host was blocked in synchronizations; a track per unified-memory counter kind (the dump's "uvm" rows,
runtime/uvm.py: migrations as slices, CPU faults as instants); and an instant per ring-buffer or perf
record that has a ``ts`` field, one track per map. Dropped launches, copies, migrations and ring-buffer
records are counted in the process's labels.

A ring buffer has no record type in BTF; the record type is the probe's one named struct with a ``ts``
member (``struct egpu_ctx`` aside). A probe with none or several gets no instants (its records print as
hex in the maps output as before).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from egpu_preload.bpf import btf as btfmod
from egpu_preload.bpf import program as prog
from egpu_preload.bpf.program import BpfObject
from egpu_preload.errors import EgpuError
from egpu_preload.output import perfetto
from egpu_preload.output.values import CTX_STRUCT, Records
from egpu_preload.runtime import copies, durations, job, uvm
from egpu_preload.runtime.probes import Probe

SYNC_TRACK = "host synchronization"


def record_types(obj: BpfObject) -> dict[str, str]:
    """Ring-buffer and perf map name -> "struct NAME" of their records, where the probe has exactly one
    struct with a ``ts`` member."""
    btf = obj.btf if isinstance(obj.btf, btfmod.Btf) else None
    if btf is None:
        return {}
    timed = {t.name for t in btf.types[1:] if t.kind == btfmod.KIND_STRUCT and t.name and t.name != CTX_STRUCT
             and any(m.name == perfetto.TS_FIELD for m in t.members)}
    if len(timed) != 1:
        return {}
    (name,) = timed
    return {m.name: f"struct {name}" for m in obj.maps if m.type in (prog.MAP_RINGBUF, prog.MAP_PERF_EVENT_ARRAY)}


def process_trace(probes: list[Probe], doc: dict[str, Any]) -> perfetto.Trace:
    """One process's launches and timed records."""
    rank = f" (rank {doc['rank']})" if doc.get("rank") is not None else ""
    names = {k: n for k, n in doc["kernels"]}
    trace = perfetto.Trace(doc["pid"], " ".join(doc["argv"]) + rank, names)
    launches = doc.get("launches")
    if launches is not None:
        for r in durations.timeline_records(launches):
            trace.add_launch(perfetto.Launch(r.name, r.start_ns, r.end_ns - r.start_ns, r.stream, None,
                                             r.grid, r.block, r.correlation_id))
        trace.labels.update({"launches dropped": launches["dropped"], "clock": launches["clock"]})
        offset = launches["clock_offset_ns"]
        if doc.get("copy_spans"):
            for span in copies.spans(doc["copy_spans"], offset):
                trace.add_slice(copy_slice(span))
            trace.labels["copies dropped"] = doc["copy_spans"]["dropped"]
        if doc.get("uvm"):
            for r in uvm.spans(doc["uvm"], offset):
                trace.add_slice(uvm_slice(r))
            trace.labels["unified memory records dropped"] = doc["uvm"]["dropped"]
    if doc.get("durations_error"):
        trace.labels["no launches"] = doc["durations_error"]
    if doc.get("rank") is not None:
        trace.labels["rank"] = doc["rank"]
    if doc["probes"]:
        for m in job.snapshots(probes, doc, record_types).maps:
            if isinstance(m, Records):
                trace.add_records(m)
                trace.labels[f"@{m.name} dropped"] = m.dropped
    return trace


def copy_slice(span: copies.Span) -> perfetto.Slice:
    """A copy or set on its stream's track; a synchronization on the host's."""
    if span.kind == copies.KIND_SYNC:
        stream = {} if span.stream == copies.INVALID else {"stream": span.stream}
        return perfetto.Slice(SYNC_TRACK, span.direction, span.start_ns, span.end_ns - span.start_ns, "sync",
                              {**stream, "correlation_id": span.correlation_id})
    return perfetto.Slice(span.stream, f"{span.operation} {span.direction}", span.start_ns,
                          span.end_ns - span.start_ns, span.operation,
                          {"bytes": span.bytes, "direction": span.direction, "correlation_id": span.correlation_id})


def uvm_slice(r: uvm.UvmRecord) -> perfetto.Slice:
    """A migration, fault or thrashing event on its counter kind's track."""
    args = {"address": f"{r.address:#x}", "value": r.value, "src": r.src, "dst": r.dst, "flags": r.flags}
    return perfetto.Slice(f"unified memory {r.name}", r.name, r.start_ns, r.end_ns - r.start_ns, "uvm", args)


def check_writable(path: Path) -> None:
    """Before the job starts: FILE's directory exists and FILE can be written there."""
    target = path if path.exists() else path.parent
    if path.is_dir():
        raise EgpuError("--perfetto: is a directory", file=str(path))
    if not target.is_dir() and not path.exists():
        raise EgpuError("--perfetto: no such directory", file=str(path.parent))
    if not os.access(target, os.W_OK):
        raise EgpuError("--perfetto: permission denied", file=str(path))


def write(probes: list[Probe], dumps: list[dict[str, Any]], path: Path) -> int:
    """The job's trace in ``path``; how many kernel slices it holds."""
    traces = [process_trace(probes, d) for d in dumps]
    perfetto.write_all(traces, path)
    return sum(len(t.launches) for t in traces)
