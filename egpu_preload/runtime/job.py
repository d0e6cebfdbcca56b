"""egpu-run's work around the job: probes ready before it starts, the shim and the environment that put
the runtime into every process of it, the child with signals forwarded, the dumps read back and printed.

The environment is set in one place (``job_env``); what the runtime reads from it is config.Config.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from egpu_preload.errors import EgpuError
from egpu_preload.maps import MapsState
from egpu_preload.runtime import config, dump, durations
from egpu_preload.progress import Progress
from egpu_preload.runtime.probes import Probe, load_user_probe

if TYPE_CHECKING:
    from egpu_preload.bpf.program import BpfObject
    from egpu_preload.output.values import Snapshot

ROOT = Path(__file__).resolve().parent.parent.parent   # the checkout: shim/ and build/ live there
SHIM_ENV = "EGPU_SHIM"
RUNTIME_MODULE = "egpu_preload.runtime.instrumenter"
PTXAS_WRAPPER = Path(__file__).resolve().parent / "egpu-ptxas"
# What the runtime imports inside the job. The directories these live in here go to the job in IMPORT_DIRS_ENV,
# not on its PYTHONPATH, which would put them before a Python job's own packages: the shim's start-up code
# adds them to sys.path after the job's own (shim/build.py). The PYTHONPATH gets only JOB_PYTHONPATH, whose
# _cffi_backend stand-in lets cffi's embedding start before that code runs.
RUNTIME_IMPORTS = ("egpu_preload", "_cffi_backend", "msgpack", "elftools", "zstandard", "lz4", "capstone")
IMPORT_DIRS_ENV = "EGPU_IMPORT_DIRS"
OTHERS_POLL = 0.25   # seconds between looks for the job's processes egpu-run --wait-all waits for (processes_of)
RUN_PID_ENV = "EGPU_RUN_PID"   # the egpu-run whose job this is: an egpu-run inside it refuses (enclosing_run)
# What the shim's exec hooks put back into a new image's environment that lacks it (shim/process.c): every EGPU_*
# variable, the others CARRY_ENV names, egpu's entry of LD_PRELOAD (PRELOAD_ENV) and of PYTHONPATH (PYTHONPATH_ENV).
CARRY_ENV, PRELOAD_ENV, PYTHONPATH_ENV = "EGPU_CARRY", "EGPU_PRELOAD", "EGPU_PYTHONPATH"
JOB_PYTHONPATH = Path(__file__).resolve().parent / "pythonpath"


class ProgramError(EgpuError):
    """The job could not be started; exit_status is what a shell would return (127, 126)."""

    def __init__(self, reason: str, exit_status: int) -> None:
        super().__init__(reason)
        self.exit_status = exit_status


# ---- before the job ----------------------------------------------------------------------------------

def session_dir() -> Path:
    """A fresh private directory for this job's dumps, beside the control sockets (in a fallback
    directory when another user made the usual one: control.socket_dir)."""
    from egpu_preload.control import socket_dir
    return Path(tempfile.mkdtemp(prefix="session-", dir=socket_dir(create=True)))


def prepare_probes(paths: list[Path], session: Path, progress: Progress | None = None,
                   wait: bool = False) -> list[Probe]:
    """Compile .bpf.c sources into the session, then load, verify and translate every probe (``wait``:
    their rings make producers wait for room, as the job's runtime will translate them). Each source's
    object goes into a folder of its own under its own name: global-data maps are named after the object
    (``cxl_late.bss`` for cxl_latency.bpf.c, as libbpf names them), and egpu run-on-gpu, attach and maps
    name them so; a session copy ``0.cxl_latency.bpf.o`` printed ``@0.bss``."""
    for i in range(len(paths)):
        (session / str(i)).mkdir(exist_ok=True)
    return [load_user_probe(p, session / str(i) / f"{p.name.removesuffix('.c')}.o", progress=progress, wait=wait)
            for i, p in enumerate(paths)]


def find_shim() -> Path:
    """$EGPU_SHIM, else the checkout's build/libegpu_shim*.so, built (or rebuilt when its sources are
    newer) with shim/build.py."""
    if os.environ.get(SHIM_ENV):
        path = Path(os.environ[SHIM_ENV])
        if not path.is_file():
            raise EgpuError(f"{SHIM_ENV}={path}: no such file")
        return path
    built = sorted((ROOT / "build").glob("libegpu_shim*.so"))
    sources = [p for p in (ROOT / "shim").glob("*") if p.suffix in (".c", ".h", ".py")]
    if not sources:
        if built:
            return built[0]
        raise EgpuError(f"no libegpu_shim.so: build it with shim/build.py and set {SHIM_ENV}")
    if built and built[0].stat().st_mtime >= max(p.stat().st_mtime for p in sources):
        return built[0]
    print("egpu-run: building libegpu_shim.so", file=sys.stderr)
    done = subprocess.run([sys.executable, str(ROOT / "shim" / "build.py"), str(ROOT / "build")],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise EgpuError("building libegpu_shim.so failed", detail=done.stderr.strip() or None)
    return Path(done.stdout.strip().splitlines()[-1])


def import_dirs() -> list[str]:
    """The sys.path entries RUNTIME_IMPORTS come from in this Python."""
    dirs: list[str] = []
    for name in RUNTIME_IMPORTS:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin:
            continue
        origin = Path(spec.origin)
        d = str(origin.parent.parent if spec.submodule_search_locations else origin.parent)
        if d not in dirs:
            dirs.append(d)
    return dirs


def job_env(cfg: config.Config, shim: Path, base: Mapping[str, str]) -> dict[str, str]:
    """The job's environment: ``base`` plus the runtime's config, the preloaded shim (ahead of any
    preload already there), the runtime module, the runtime's import directories (IMPORT_DIRS_ENV: none on
    the job's PYTHONPATH, which keeps its own entries first and gets JOB_PYTHONPATH), egpu-run's pid
    (RUN_PID_ENV: enclosing_run), PTX from CuPy, and
    Triton's ptxas wrapped (runtime/ptxas.py) with Triton's and inductor's caches in the session, so no
    cubin compiled without the probes is reused and none compiled with them outlives the job; and what of it
    the shim puts back into a process the job execs with an environment of its own (CARRY_ENV)."""
    env = dict(base)
    theirs = base.get("TRITON_PTXAS_PATH", "")
    if theirs and Path(theirs).name != PTXAS_WRAPPER.name:
        cfg = dataclasses.replace(cfg, ptxas=theirs)
    env.update(config.to_env(cfg))
    tools = {"TRITON_PTXAS_PATH": str(PTXAS_WRAPPER),
             "CUPY_COMPILE_WITH_PTX": "1"}  # CuPy hands the driver PTX instead of NVRTC cubins
    if cfg.session is not None:
        tools.update(TRITON_CACHE_DIR=str(cfg.session / "triton"),
                     TORCHINDUCTOR_CACHE_DIR=str(cfg.session / "inductor"))
    env.update(tools)
    env["EGPU_PYTHON"] = sys.executable
    env["LD_PRELOAD"] = " ".join(p for p in (str(shim), base.get("LD_PRELOAD", "")) if p)
    env["EGPU_RUNTIME"] = RUNTIME_MODULE
    paths = [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths + [str(JOB_PYTHONPATH)] * (str(JOB_PYTHONPATH) not in paths))
    env[IMPORT_DIRS_ENV] = os.pathsep.join(import_dirs())
    env[RUN_PID_ENV] = str(os.getpid())
    env.update({CARRY_ENV: " ".join(tools), PRELOAD_ENV: str(shim), PYTHONPATH_ENV: str(JOB_PYTHONPATH)})
    return env


def enclosing_run(env: Mapping[str, str]) -> int | None:
    """The pid of the egpu-run whose job this process is part of, while it runs (job_env names it), or None. An
    egpu-run inside it would set its own probes and session for its job, replacing the outer one's: the outer
    probes would never reach those processes, and the outer report would say no process loaded CUDA code.
    Its session directory must be there too: a daemon of the job outlives egpu-run, which removes the session
    as it ends, and the pid it names comes to be another process's."""
    from egpu_preload.control import process_exists
    pid, session = env.get(RUN_PID_ENV, ""), env.get(config.SESSION, "")
    live = pid.isdigit() and session and Path(session).is_dir() and process_exists(int(pid))
    return int(pid) if live else None


def resolve_program(name: str, env: Mapping[str, str]) -> str:
    """The executable a shell would run for ``name``; ProgramError 127 / 126 as a shell exits."""
    path = name if "/" in name else shutil.which(name, path=env.get("PATH", os.defpath))
    if path is None or not os.path.exists(path):
        raise ProgramError(f"{name}: command not found" if "/" not in name else f"{name}: no such file", 127)
    if os.path.isdir(path):   # as a shell says it (exit 126), not as a permission
        raise ProgramError(f"{name}: is a directory", 126)
    if not os.access(path, os.X_OK):
        raise ProgramError(f"{name}: permission denied", 126)
    return path


# ---- the job -----------------------------------------------------------------------------------------

def _interpreter(path: str) -> str:
    """What runs ``path``, which exec found but could not start for a file missing: its #! interpreter (a
    script written elsewhere, #!/usr/local/bin/python3) or its ELF's dynamic loader (a musl or Nix build)."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        head = b""
    if head.startswith(b"#!") and head[2:].split():
        return f"its interpreter {head[2:].split()[0].decode(errors='replace')}"
    return "its dynamic loader (the ELF's program interpreter)" if head.startswith(b"\x7fELF") else "a file it needs"


def _terminal_foreground() -> bool:
    """True when a terminal's Ctrl-C reaches the job by itself (we are its foreground process group). Asked
    of fd 0, not sys.stdin: with stdin closed (<&-) that is None, and the AttributeError in the handler was a
    traceback that left the job running."""
    try:
        return os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


def run_child(cmd: list[str], env: Mapping[str, str], every: tuple[float, Callable[[], None]] | None = None,
              others: Callable[[], list[int]] | None = None) -> int:
    """Run the job, forwarding SIGTERM, SIGHUP and SIGINT (the latter unless the terminal already
    delivered it); its exit status, 128 + signal when a signal ended it. ``every`` (seconds, fn): call fn
    each time that many seconds pass while the job runs (egpu-run --interval). ``others`` (egpu-run
    --wait-all): the pids of the job's other processes still running, waited for once the main one ended
    (its daemons, children of no process of egpu-run's), and the signals forwarded to them then."""
    try:
        proc = subprocess.Popen(cmd, env=dict(env))
    except FileNotFoundError as e:
        found = cmd[0] if "/" in cmd[0] else shutil.which(cmd[0], path=env.get("PATH", os.defpath))
        if found is not None and os.path.isfile(found):   # it is there: what it needs to run is not (as bash says)
            raise ProgramError(f"{cmd[0]}: cannot execute: {_interpreter(found)} not found", 127) from None
        raise ProgramError(f"{cmd[0]}: {e.strerror}", 127) from None
    except PermissionError as e:
        raise ProgramError(f"{cmd[0]}: {e.strerror}", 126) from None
    except OSError as e:   # found but cannot be executed: a script without a #! line (ENOEXEC), ... as env says
        hint = " (not a program for this machine, or a script without a #! line)" if e.errno == errno.ENOEXEC else ""
        raise ProgramError(f"{cmd[0]}: {e.strerror.lower() if e.strerror else e}{hint}", 126) from None

    waiting: list[int] = []   # others, once the main process ended

    def forward(sig: int, _frame: Any) -> None:
        for pid in waiting:   # a daemon left the terminal's process group (setsid): its Ctrl-C comes from here
            with contextlib.suppress(OSError):
                if sig != signal.SIGINT or not _terminal_foreground() or os.getpgid(pid) != os.getpgrp():
                    os.kill(pid, sig)
        if sig == signal.SIGINT and _terminal_foreground():
            return
        if proc.poll() is None:
            proc.send_signal(sig)

    sigs = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
    old = {s: signal.signal(s, forward) for s in sigs}
    try:
        while True:
            try:
                status = proc.wait(timeout=every[0] if every else None)
                break
            except subprocess.TimeoutExpired:
                every[1]()
        due = time.monotonic() + every[0] if every else None
        while others is not None and (waiting := others()):   # children of init now: polled, not waited on
            time.sleep(OTHERS_POLL)
            if due is not None and time.monotonic() >= due:
                every[1]()
                due += every[0]
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return 128 - status if status < 0 else status


def run_job(cmd: list[str], cfg: config.Config, shim: Path,
            every: tuple[float, Callable[[], None]] | None = None, wait_all: bool = False) -> int:
    """Start the job under the shim and wait for it (calling ``every`` as run_child does), with ``wait_all``
    for every process of it (processes_of); the exit status of its main process."""
    env = job_env(cfg, shim, os.environ)
    resolve_program(cmd[0], env)
    session = cfg.session
    others = (lambda: [pid for pid, _ in processes_of(session)]) if wait_all and session is not None else None
    return run_child(cmd, env, every, others)


# ---- after the job -----------------------------------------------------------------------------------

def snapshots(probes: list[Probe], doc: dict[str, Any],
              event_types: Callable[["BpfObject"], dict[str, str]] | None = None) -> "Snapshot":
    """One Snapshot of every probe's maps in a dump (output.values), kernel names from the dump. A probe
    the dump names by a path none of ``probes`` has (attached while the job ran) is read from there.
    ``event_types``: a probe object's ring-buffer record types (values.snapshot's event_types)."""
    from egpu_preload.bpf.elf import load_object
    from egpu_preload.output.values import Snapshot, Trace, snapshot
    names = {k: n for k, n in doc["kernels"]}
    objs = {str(p.path): p.obj for p in probes}
    snaps = []
    for d in doc["probes"]:
        obj = objs.get(d["path"]) or load_object(Path(d["path"]))
        snaps.append(snapshot(dump.restore_state(MapsState(obj.maps), d), obj, names,
                              event_types(obj) if event_types else None))
    lines = tuple(line for s in snaps for line in s.trace.lines)
    return Snapshot(_qualified(doc["probes"], snaps), Trace(lines, sum(s.trace.dropped for s in snaps)), names)


def _qualified(docs: list[dict[str, Any]], snaps: list["Snapshot"]) -> tuple:
    """Every probe's maps, a name two probes share given as PROBE:MAP (PROBE: its attach name, or its file's
    stem, or its folder's name and stem where two probes' stems are one: a/x.bpf.o and b/x.bpf.o, or two sources
    named alike, each compiled into a folder of the session): printed twice unlabelled, and one JSON key, one of
    them was lost."""
    seen: dict[str, int] = {}
    for s in snaps:
        for m in s.maps:
            seen[m.name] = seen.get(m.name, 0) + 1
    stems = [d.get("name") or Path(d["path"]).name.split(".bpf.")[0] for d in docs]
    out = []
    for d, s, stem in zip(docs, snaps, stems):
        probe = f"{Path(d['path']).parent.name}/{stem}" if stems.count(stem) > 1 else stem
        out += [dataclasses.replace(m, name=f"{probe}:{m.name}") if seen[m.name] > 1 else m for m in s.maps]
    return tuple(out)


def render(probes: list[Probe], dumps: list[dict[str, Any]], as_json: bool, view: str = "auto") -> str:
    """The maps of every process that has some, by rank (then pid, then exec): text (a header per process when
    several, an image a process replaced by exec as one of its own) or one JSON document per process; and
    their sum (output/combine.py: a section "all ranks",
    JSON rank "all", pid null; a line per map left out of it, "left_out" in JSON). ``view``: per-rank, sum,
    or auto: the sum too when the processes have two ranks or more (a torchrun job)."""
    from egpu_preload.output import json as json_out
    from egpu_preload.output import text as text_out
    from egpu_preload.output.combine import sum_snapshots
    with_maps = sorted((d for d in dumps if d["probes"]),
                       key=lambda d: (d["rank"] is None, d["rank"] or 0, d["pid"]))
    snaps = [snapshots(probes, doc) for doc in with_maps]
    ranks = {d["rank"] for d in with_maps if d["rank"] is not None}
    per_rank = view != "sum"
    summed = view == "sum" or (view == "auto" and len(ranks) > 1)
    now = time.time()
    out = []
    if per_rank:
        for doc, snap in zip(with_maps, snaps):
            if as_json:
                out.append(json_out.render(snap, time=now, pid=doc["pid"], rank=doc["rank"],
                                           before_exec=doc.get("exec")))
                continue
            body = text_out.render(snap)
            if len(with_maps) > 1:
                rank = f" rank {doc['rank']}" if doc["rank"] is not None else ""
                image = f" before exec {doc['exec']}" if "exec" in doc else ""   # an image the process replaced
                body = f"pid {doc['pid']}{rank}{image}: {' '.join(doc['argv'])}\n" + body
            out.append(body)
    if summed and snaps:
        total, left_out = sum_snapshots(snaps)
        if as_json:
            out.append(json_out.render(total, time=now, pid=None, rank="all", left_out=left_out))
        else:
            head = f"all ranks (sum of {len(snaps)} processes):\n" if len(snaps) > 1 else ""
            out.append(head + "".join(f"not summed: {why}\n" for why in left_out) + text_out.render(total))
    return "".join(out) if as_json else "\n".join(out)   # NDJSON: each document is already a line


def module_report(dumps: list[dict[str, Any]], verbose: bool, in_kernels: bool = True,
                  killed_by: int | None = None, mirror_s: float = config.Config.mirror,
                  no_start: bool = False) -> list[str]:
    """Lines for stderr: every load and kernel when verbose; maps that could not be read; launch records
    lost to the shim's full ring; a warning when no kernel was instrumented though some program
    (``in_kernels``) runs in kernels: launch, host-API and uprobe programs need no kernel of their own.
    ``killed_by``: the signal that ended the job, when one did (no dumps then is no news about CUDA);
    ``mirror_s``: how often its processes copied their maps (egpu-run --mirror); ``no_start``: a process's runtime
    could not start, which report says instead of that no process loaded CUDA code."""
    lines = [f"egpu-run: pid {d['pid']}: {d['error']}" for d in dumps if d["error"]]
    for d in dumps:
        stats = d.get("stats", {})
        lost, seen = stats.get("dropped", 0), stats.get("records", 0)
        if lost:   # like bpftrace's "Lost N events": the launch probes (and --durations) missed those launches
            lines.append(f"egpu-run: pid {d['pid']}: {lost} of {lost + seen} launch records lost (the launch "
                         "ring was full: launch probes ran slower than the job launched)")
    lines += elsewhere(dumps)
    modules = [(d["pid"], m) for d in dumps for m in d["modules"]]
    if verbose:
        for pid, m in modules:
            lines.append(f"egpu-run: pid {pid}: {m['api']} {m['image']}: {m['status']}")
            lines += [f"egpu-run:   {name}: {status}" + (f" ({reason})" if reason else "")
                      for name, status, reason in m["kernels"]]
        for d in dumps:
            where = d.get("launch_probes") or {}
            lines += [f"egpu-run: pid {d['pid']}: launch probes of {path}: in C" for path in where.get("in_c", [])]
            lines += [f"egpu-run: pid {d['pid']}: launch probes of {path}: on the Python VM ({why})"
                      for path, why in where.get("python_vm", {}).items()]
    if not dumps and killed_by is not None:
        every = f"--mirror {mirror_s:g}: a copy every {mirror_s:g} s" if mirror_s > 0 else "--mirror 0: no copies"
        lines.append(f"egpu-run: no maps: the job was killed by {_signal(killed_by)} before any copy of its maps "
                     f"({every})")
    elif not dumps:
        if not no_start:   # report names the processes whose runtime could not start, and why
            lines.append("egpu-run: no maps: no process of the job loaded CUDA code and exited normally")
    elif in_kernels and not any(m["status"] == "instrumented" for _, m in modules):
        counts: dict[str, int] = {}
        for _, m in modules:
            counts[m["status"]] = counts.get(m["status"], 0) + 1
        lines.append("egpu-run: no kernel was instrumented ("
                     + ", ".join(f"{n} {'load' if n == 1 else 'loads'} {s}" for s, n in counts.items()) + ")"
                     + ("" if verbose else ": egpu-run -v says why, kernel by kernel"))   # --kernel GLOB, no sites
    return lines


def elsewhere(dumps: list[dict[str, Any]]) -> list[str]:
    """Lines for kernels that ran without probes because they ran in another context than the maps' (another
    GPU's: the maps live in one context, instrumenter.py): modules loaded there, and launches of SASS-patched
    kernels there. Their counts are not in the maps, and the maps must not read as the whole job's."""
    lines = []
    for d in dumps:
        loads = sum(1 for m in d["modules"] if m.get("elsewhere"))
        launches = (d.get("sass") or {}).get("other_context", 0)
        if loads:
            lines.append(f"egpu-run: pid {d['pid']}: {loads} {'load' if loads == 1 else 'loads'} in another context "
                         "than the maps' (another GPU's): their kernels ran without probes")
        if launches:
            lines.append(f"egpu-run: pid {d['pid']}: {launches} {'launch' if launches == 1 else 'launches'} of "
                         "SASS-patched kernels in another context than the maps' (another GPU's) ran without probes")
    return lines


def _signal(n: int) -> str:
    try:
        return f"signal {n} ({signal.Signals(n).name})"
    except ValueError:   # a real-time signal
        return f"signal {n}"


def _process(session: Path, pid: int) -> str:
    """A process of the job as egpu-run's lines name it: "pid 1234 (python train.py)", by the command its
    started mark holds (dump.mark_started); the pid alone for a mark without one."""
    cmd = dump.marked_command(session, pid)
    return f"pid {pid} ({cmd})" if cmd else f"pid {pid}"


def processes_of(session: Path) -> list[tuple[int, str]]:
    """(pid, command as dump.command names it) of every running process whose environment names ``session``
    (job_env's, which the shim keeps in every image the job execs): the job's processes, its daemons among them,
    which were its main process's children or grandchildren but are egpu-run's no longer once reparented."""
    key = f"{config.SESSION}={session}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:   # a zombie's environment reads empty; one of another user's, or gone since, does not read
            if key not in Path(entry.path, "environ").read_bytes().split(b"\0"):
                continue
            argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")[:-1]
        except OSError:
            continue
        found.append((int(entry.name), dump.command([os.fsdecode(a) for a in argv])))
    return sorted(found)


def _ended_by(status: int) -> int | None:
    """The signal that ended a job of exit status ``status`` (128 + N, as run_child and shells report it)."""
    return status - 128 if 128 < status < 128 + signal.NSIG else None


def report(probes: list[Probe], session: Path, as_json: bool, verbose: bool,
           view: str = "auto", with_durations: bool = True, traced: bool = False,
           status: int = 0, mirror_s: float = config.Config.mirror, maps_asked: bool = False
           ) -> tuple[str, list[str]]:
    """(maps for stdout, lines for stderr) from the dumps the job's processes left in the session, and
    for a process killed before its dump, or still running when the job's main process ended (daemonized,
    orphaned: its dump comes after this report), its last map mirror (said on stderr: how old, which signal
    ended the job of exit ``status``), or where it made no copy, a line that its counts are missing, or
    where it had not started CUDA yet (a daemon that double-forked: processes_of finds it), a line that its
    kernels are in no map; kernel durations too when ``with_durations`` and the dumps have them. ``traced``
    (egpu-run --trace): the rings' records went into the trace file, so maps empty at exit are no news.
    ``mirror_s``: how often the processes copied their maps (egpu-run --mirror). ``maps_asked`` (--json or
    -o FILE): a job that ran no probe says so, where an empty output would pass for maps that stayed empty;
    without it a job with no probe (--restore, --durations, --live-sass waiting for an attach) prints no line
    about maps."""
    from egpu_preload.control import process_running
    from egpu_preload.runtime import mirror
    dumps = dump.read_all(session)
    signum, now = _ended_by(status), time.time()
    how = f"was ended by {_signal(signum)}" if signum else "ended (killed?)"
    unfinished = []   # processes of the job that ended before their dump
    running = "was still running when the job's main process ended"
    # a process is done with its exit dump; a dump before an exec is its image's, and the next image owes its own
    exited = {d["pid"] for d in dumps if "exec" not in d}
    for doc, when, alive in mirror.left_behind(session, exited):
        unfinished.append(f"egpu-run: {_process(session, doc['pid'])} "
                          f"{running if alive else how + ' before its exit dump'}: its maps are as of its last copy, "
                          f"{max(now - when, 0):.1f} s old")
        dumps.append(doc)
    lost = sorted(dump.started(session) - {d["pid"] for d in dumps if "exec" not in d})
    if probes and (dumps or signum is None):   # none at all of a killed job: module_report says that already
        unfinished += [f"egpu-run: {_process(session, pid)} "
                       f"{running + ',' if process_running(pid) else how + ' before its exit dump and'} before any "
                       "copy of its maps: its counts are missing" for pid in lost]
    no_start = dump.failed_starts(session)
    unfinished += [f"egpu-run: pid {pid} ({cmd}) ran without probes: egpu could not start in it ({why})"
                   for pid, (cmd, why) in sorted(no_start.items())]
    if probes:   # a daemon that had not started CUDA yet (it double-forked, its parent ended): no mark, no copy
        known = dump.started(session) | {d["pid"] for d in dumps} | set(no_start)
        unfinished += [f"egpu-run: pid {pid} ({cmd}) {running}, before it started CUDA: what it runs on the GPU "
                       "from now on is in no map here (egpu-run --wait-all waits for it)"
                       for pid, cmd in processes_of(session) if pid not in known]
    dumps.sort(key=lambda d: d["pid"])
    out = render(probes, dumps, as_json, view)
    if with_durations and any("durations" in d for d in dumps):  # egpu-run --durations
        out += durations.render_json(dumps, time.time()) if as_json else ("\n" if out else "") + durations.render(dumps)
    from egpu_preload.bpf.sections import HOST_SIDE
    in_kernels = any(prog.attach.kind not in HOST_SIDE for p in probes for prog in p.obj.programs)
    notes = unfinished + (module_report(dumps, verbose, in_kernels, signum, mirror_s, bool(no_start)) if probes
                          else [])
    # empty maps print nothing (bpftrace's way)
    if not out and not as_json and not traced and any(d["probes"] for d in dumps):
        notes.append("egpu-run: every map is empty: no probe program stored anything")
    elif not out and not any(d["probes"] for d in dumps) and (dumps if probes else maps_asked):
        notes.append("egpu-run: no maps: " + (_why_no_maps(probes, dumps) if probes or _attached(dumps) else
                                              "no probe was given (-p PROBE) nor attached while the job ran "
                                              "(egpu attach)"))
    return out, notes


def _attached(dumps: list[dict[str, Any]]) -> bool:
    """Whether a process of a job started without -p laid its maps out: only an egpu attach does that there."""
    return any(d.get("laid_out", False) for d in dumps)


def _why_no_maps(probes: list[Probe], dumps: list[dict[str, Any]]) -> str:
    """Why processes that ran ``probes`` left no maps: every probe was detached live, or no process laid its
    maps out, which an instrumented load does (or a live change): none loaded a kernel the probes instrument."""
    if any(d.get("laid_out", True) for d in dumps):
        return "every probe was detached before the job ended (egpu detach printed their final maps)"
    from egpu_preload.bpf.sections import HOST_SIDE
    named = dict.fromkeys(g.section for p in probes for g in p.obj.programs if g.attach.kind not in HOST_SIDE)
    return "the probes' maps were never laid out: no module the job loaded was instrumented" + \
        (f" for {', '.join(named)}" if named else "")
