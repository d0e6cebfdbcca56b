"""The exit dump: what one instrumented process leaves in the session directory, ``<pid>.msgpack``.

The runtime writes it when the process exits; egpu-run reads every dump after the job and rebuilds each
probe's MapsState from it (it loaded the same objects, in the same order). An image the process replaced by
its Nth exec left ``<pid>.exec<N>.msgpack`` (write_exec): the maps as ``egpu maps PID`` reads them, with
``exec``: N. Fields:

    version  1
    pid, argv (list of str), rank (config.rank(): RANK, else LOCAL_RANK, as an int; or None)
    probes   per probe object, in EGPU_PROBES order: {"path", "maps": [storage per map], "trace": [...],
             "trace_dropped"}
             storage: ARRAY {"values": [bytes]}, PERCPU_ARRAY {"per_cpu": [[sm, [bytes]]]},
             HASH/LRU_HASH {"entries": [[key, value]]}, PERCPU_HASH/LRU_PERCPU_HASH {"per_cpu_entries":
             [[key, [[sm, value]]]]}, RINGBUF {"records": [bytes], "drops"},
             PERF_EVENT_ARRAY {"records": [[sm, bytes]], "drops"}, QUEUE/STACK {"queued": [bytes]} (oldest first),
             BLOOM_FILTER {"bits": bytes}; trace: [[fmt, a1, a2, a3, sm]];
             trace_dropped: the lines the device's trace_printk ring dropped
    error    why the maps could not be read (then probes is empty), or None
    laid_out whether the device maps were ever laid out in the process (an instrumented load, or a live attach,
             detach or swap): where not, probes empty means no kernel was instrumented, not that every probe
             was detached; absent (True) in the exec dump and the mirror's
    kernels  [[kernel id, mangled name]] for every kernel the process loaded or looked up
    modules  [{"api", "call", "image", "status", "backend", "timing", "kernels": [[name, status, reason]]}]
             per load; timing (ms): rewrite_ms (PTX instrumented), driver_ms (the shim's load of the
             replacement, the driver's JIT included)
    stats    the shim's counters (egpu_shim.h struct egpu_stats) by field name
    timing   {"probes_ms"}: loading, verifying and translating the probes in this process
    launch_probes  None without launch or uvm programs, else {"in_c": [path], "python_vm": {path: why},
             "python_records": records the Python VM ran probes on, "uvm_records": unified-memory records
             delivered to egpu/uvm programs} (runtime/launches.py)
    durations, copies, uvm, launches, copy_spans and their *_error: CUPTI's records (runtime/durations.py)
    trace    egpu-run --trace: the image's trace file as it closed it (streaming.Streaming.finish), or None;
             closed_traces: those it closed before execs that failed, where there are any
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import msgpack

from egpu_preload.errors import EgpuError
from egpu_preload.runtime import config
from egpu_preload.outpaths import create_new
from egpu_preload.maps import (ArrayStorage, BloomStorage, HashStorage, MapsState, MapStorage, PercpuArrayStorage,
                               PercpuHashStorage, PerfStorage, QueueStorage, RingbufStorage, TraceRecord)

VERSION = 1
SUFFIX = ".msgpack"
STARTED = ".started"   # <pid>.started: the process runs the runtime, so its dump is due (mark_started); it holds
                       # the process's command (command()), empty in marks of egpu before it did
COMMAND_CHARS = 60     # of a command as egpu-run names a process, as much as a ps column shows
NO_START = ".nostart"   # <pid>.nostart: its runtime could not start; its command and why (mark_no_start)
RESTORING = ".restoring"   # <pid>.restoring: the process armed egpu-run --restore (cow/live.py)


def storage_contents(s: MapStorage) -> dict[str, Any]:
    if isinstance(s, PercpuArrayStorage):
        return {"per_cpu": [[cpu, [bytes(v) for v in s.per_cpu[cpu]]] for cpu in s.cpus()]}
    if isinstance(s, ArrayStorage):
        return {"values": [bytes(v) for v in s.values]}
    if isinstance(s, PercpuHashStorage):
        return {"per_cpu_entries": [[bytes(k), [[cpu, bytes(v)] for cpu, v in sorted(values.items())]]
                                    for k, values in s.entries.items()]}
    if isinstance(s, HashStorage):
        return {"entries": [[bytes(k), bytes(v)] for k, v in s.entries.items()]}
    if isinstance(s, RingbufStorage):
        return {"records": list(s.records), "drops": s.drops}
    if isinstance(s, PerfStorage):
        return {"records": [[cpu, data] for cpu, data in s.records], "drops": s.drops}
    if isinstance(s, QueueStorage):
        return {"queued": list(s.values)}
    if isinstance(s, BloomStorage):
        return {"bits": bytes(s.bits)}
    raise EgpuError(f"map {s.mapdef.name}: no dump format for {type(s).__name__}")


def restore_storage(s: MapStorage, d: dict[str, Any]) -> None:
    """Put dumped contents back into a fresh storage of the same map."""
    if isinstance(s, PercpuArrayStorage):
        for cpu, values in d["per_cpu"]:
            s.per_cpu[cpu] = [bytearray(v) for v in values]
    elif isinstance(s, ArrayStorage):
        s.values = [bytearray(v) for v in d["values"]]
    elif isinstance(s, PercpuHashStorage):
        s.entries.clear()
        s.entries.update((bytes(k), {cpu: bytearray(v) for cpu, v in values}) for k, values in d["per_cpu_entries"])
    elif isinstance(s, HashStorage):
        s.entries.clear()
        s.entries.update((bytes(k), bytearray(v)) for k, v in d["entries"])
    elif isinstance(s, RingbufStorage):
        s.records, s.drops = [bytes(r) for r in d["records"]], d["drops"]
    elif isinstance(s, PerfStorage):
        s.records, s.drops = [(cpu, bytes(data)) for cpu, data in d["records"]], d["drops"]
    elif isinstance(s, QueueStorage):
        s.values.clear()
        s.values.extend(bytes(v) for v in d["queued"])
    elif isinstance(s, BloomStorage):
        s.bits[:] = d["bits"]


def state_contents(state: MapsState) -> dict[str, Any]:
    return {"maps": [storage_contents(s) for s in state.storages],
            "trace": [[t.fmt, *t.args, t.cpu] for t in state.trace], "trace_dropped": state.trace_dropped}


def restore_state(state: MapsState, d: dict[str, Any]) -> MapsState:
    if len(d["maps"]) != len(state.storages):
        raise EgpuError(f"dump has {len(d['maps'])} maps, the probe {len(state.storages)}")
    for s, contents in zip(state.storages, d["maps"]):
        restore_storage(s, contents)
    state.trace[:] = [TraceRecord(bytes(fmt), (a1, a2, a3), cpu) for fmt, a1, a2, a3, cpu in d["trace"]]
    state.trace_dropped = d.get("trace_dropped", 0)   # absent from dumps and mirror copies made before b0263d6
    return state


def write(session: Path, doc: dict[str, Any], name: str | None = None) -> Path:
    """``session/<name>.msgpack`` (name: the pid), written whole or not at all (a reader never sees half a file)."""
    name = name or str(doc["pid"])
    path = session / f"{name}{SUFFIX}"
    tmp = session / f".{name}{SUFFIX}.tmp"
    tmp.write_bytes(msgpack.packb({"version": VERSION, **doc}, use_bin_type=True))
    os.replace(tmp, path)
    return path


def write_exec(session: Path, doc: dict[str, Any]) -> Path:
    """The dump of an image its process is replacing by exec: ``<pid>.exec<N>.msgpack``, N the first free (an
    image exec'd from an exec'd image finds its predecessor's), so that the next image's dumps, under the same
    pid, leave it alone."""
    n = exec_dumps(session, doc["pid"]) + 1
    return write(session, {**doc, "exec": n}, f"{doc['pid']}.exec{n}")


def exec_dumps(session: Path, pid: int) -> int:
    """How many images of process ``pid`` an exec replaced after they dumped (write_exec)."""
    n = 0
    while (session / f"{pid}.exec{n + 1}{SUFFIX}").exists():
        n += 1
    return n


def mark_started(session: Path, marker: str = STARTED) -> bool:
    """Tell egpu-run that this process runs probes, so a dump of it is due: one that ends without it (SIGTERM,
    as Pool's exit ends its workers; os._exit; SIGKILL) loses its counts since its last mirror copy, or all of
    them, and egpu-run names it instead of printing the others' maps as if they were the job's (job.report).
    Made once an image, where the runtime starts: a child forked later runs none of its own and owes none, and
    an image that dumped before an exec withdraws it (unmark_started), so that the next one owes its own. True
    when the mark was there already: an image of this process that made it owed no dump when it exec'd. The mark
    holds this image's command, for egpu-run to name the process by (marked_command)."""
    path = session / f"{os.getpid()}{marker}"
    try:
        existed = not create_new(path)
    except OSError:   # egpu-run gone, its session with it (a process that outlived the job): no one to tell
        return False
    try:
        path.write_text(command(config.argv()) + "\n")
    except OSError:   # the mark stands without it: egpu-run names the pid alone
        pass
    return existed


def command(argv: list[str]) -> str:
    """A command line as egpu-run names a process by: the program's base name and its arguments ("python
    train.py --lr 3e-4"), what cannot print as "?" (as ps shows it), cut to COMMAND_CHARS with "..."."""
    text = "".join(c if c.isprintable() else "?" for c in " ".join([os.path.basename(argv[0]), *argv[1:]])) \
        if argv else ""
    return text if len(text) <= COMMAND_CHARS else text[:COMMAND_CHARS - 3] + "..."


def marked_command(session: Path, pid: int, marker: str = STARTED) -> str:
    """The command process ``pid`` wrote into its mark (mark_started); "" for none, or a mark without one."""
    try:
        return (session / f"{pid}{marker}").read_text(errors="replace").strip()
    except OSError:
        return ""


def mark_no_start(session: Path, why: str) -> None:
    """This process's runtime could not start (``why``): the program runs without probes, and egpu-run says so
    (failed_starts) instead of that no process loaded CUDA code. Its started mark is withdrawn first."""
    unmark_started(session)
    with contextlib.suppress(OSError):   # egpu-run gone, its session with it: no one to tell
        (session / f"{os.getpid()}{NO_START}").write_text(f"{command(config.argv())}\n{why}\n")


def failed_starts(session: Path) -> dict[int, tuple[str, str]]:
    """pid -> (its command, why its runtime could not start) of every process that said so (mark_no_start)."""
    out = {}
    for p in session.glob(f"*{NO_START}"):
        pid = p.name[:-len(NO_START)]
        with contextlib.suppress(OSError, ValueError):
            cmd, why = p.read_text(errors="replace").split("\n")[:2]
            out[int(pid)] = (cmd, why)
    return out


def unmark_started(session: Path) -> None:
    """Withdraw this process's mark (mark_started): the image dumped before an exec, and owes nothing more."""
    (session / f"{os.getpid()}{STARTED}").unlink(missing_ok=True)


def started(session: Path, marker: str = STARTED) -> set[int]:
    """The pids of every process that marked itself (mark_started)."""
    return {int(p.name[:-len(marker)]) for p in session.glob(f"*{marker}") if p.name[:-len(marker)].isdigit()}


def other_version(doc: Any) -> str | None:
    """Why ``doc`` (a dump, a "maps" reply, a mirror's) is not of this egpu's VERSION, or None when it is: one
    of another egpu's (a job started before an upgrade) is rendered wrong, or not at all (a traceback)."""
    version = doc.get("version") if isinstance(doc, dict) else None
    return None if version == VERSION else f"document version {version!r}, not {VERSION}"


def read_all(session: Path) -> list[dict[str, Any]]:
    """Every dump in the session, by pid, a process's images in the order it exec'd them; unreadable ones are
    EgpuErrors naming the file."""
    docs = []
    for path in session.glob(f"*{SUFFIX}"):
        if path.name.startswith("."):
            continue
        try:
            doc = msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False)
        except (OSError, ValueError, msgpack.UnpackException) as e:
            raise EgpuError(f"unreadable dump ({e})", file=str(path)) from None
        if other_version(doc) is not None:
            raise EgpuError("not an egpu dump of this version", file=str(path))
        docs.append(doc)
    return sorted(docs, key=lambda d: (d["pid"], "exec" not in d, d.get("exec", 0)))
