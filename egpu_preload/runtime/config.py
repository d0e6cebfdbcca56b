"""What the launcher tells the runtime inside the job: one typed object, and the two functions that are
the only place its environment variables are named (``to_env`` in egpu-run, ``from_env`` in the job).

    EGPU_PROBES   the probe objects (.bpf.o), absolute paths, as a JSON list of strings (a path may hold
                  any character but NUL: ':' and newlines included; undecodable bytes go as surrogates)
    EGPU_SESSION  the session directory egpu-run made: every instrumented process writes <pid>.msgpack there
    EGPU_KERNEL   an extra kernel glob: only kernels it matches (mangled or demangled) are instrumented
    EGPU_LOG      verbosity: 0 quiet, 1 one line per module load, 2 and more per kernel
    EGPU_DURATIONS  1: time every kernel (CUPTI activity records, runtime/durations.py)
    EGPU_TIMELINE   1: keep each kernel's CUPTI record too, for egpu-run --perfetto (durations.Timeline)
    EGPU_BACKEND  auto | ptx | sass (runtime/sass.py); the shim loads the sanitizer only when it is set
    EGPU_BACKEND_WHY  why egpu-run made --backend auto ptx (sass.for_job), for the replies that say so
    EGPU_SANITIZER_LIB  libsanitizer-public.so for the SASS back end (shim/sass.c has a default)
    EGPU_PTXAS    the real ptxas egpu-ptxas runs for Triton (runtime/ptxas.py); empty: Triton's own
    EGPU_RESTORE  a checkpoint directory to put back once the job has remade its allocations (cow/restore.py)
    EGPU_RESTORE_OTHER_BUILD  1: put EGPU_RESTORE back even into another executable than the one it was
                  taken of (egpu-run --restore-other-build; the allocations are matched all the same)
    EGPU_MIRROR   seconds between copies of the maps into shared memory (runtime/mirror.py); 0: none
    EGPU_LAUNCH_VM  c | python: where launch probes run (runtime/native.py; python: all on the Python VM)
    EGPU_TRACE    the trace file: every ring record goes there while the job runs (runtime/streaming.py)
    EGPU_ON_FULL  drop | wait: what a probe's record meets in a full ring (translate/devmaps.py)
    EGPU_IN_KERNEL  1: every kernel-site probe runs in the kernel on the SASS back end, even one whose
                  effect a launch gives (translate/launch_eval.py: counted by the shim at the launch)
    EGPU_UPROBES  targets of bare uprobes (egpu-run --uprobe), a JSON object {PROG: "PATH:SYMBOL"}
    EGPU_EARLY_START  1: the runtime starts with CUDA (the shim's cuInit hook, else its first copy,
                  allocation or sync hook), not at the first module load: host-API probes and CUPTI
                  (--durations, --perfetto, egpu/uvm) see a job from its first call, even one that loads
                  no code, and CUPTI's unified-memory counters are set before the first context

Not egpu's own: RANK, else LOCAL_RANK (set by torchrun for each worker) name a process's rank (``rank``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from egpu_preload.errors import EgpuError

PROBES, SESSION, KERNEL, LOG = "EGPU_PROBES", "EGPU_SESSION", "EGPU_KERNEL", "EGPU_LOG"
DURATIONS, PTXAS = "EGPU_DURATIONS", "EGPU_PTXAS"
BACKEND, SANITIZER, BACKEND_WHY = "EGPU_BACKEND", "EGPU_SANITIZER_LIB", "EGPU_BACKEND_WHY"
RESTORE, RESTORE_OTHER_BUILD = "EGPU_RESTORE", "EGPU_RESTORE_OTHER_BUILD"
TIMELINE = "EGPU_TIMELINE"
MIRROR = "EGPU_MIRROR"
LAUNCH_VM = "EGPU_LAUNCH_VM"
LAUNCH_VMS = ("c", "python")
TRACE, ON_FULL = "EGPU_TRACE", "EGPU_ON_FULL"
ON_FULLS = ("drop", "wait")
UPROBES = "EGPU_UPROBES"
EARLY_START = "EGPU_EARLY_START"
IN_KERNEL = "EGPU_IN_KERNEL"


@dataclass(frozen=True)
class Config:
    probes: tuple[Path, ...] = ()
    session: Path | None = None
    kernel: str | None = None
    log: int = 0
    durations: bool = False
    ptxas: str | None = None
    backend: str = "auto"
    backend_why: str | None = None   # auto settled as ptx: why (sass.for_job)
    sanitizer: str | None = None
    restore: Path | None = None
    restore_other_build: bool = False
    timeline: bool = False
    mirror: float = 1.0
    launch_vm: str = "c"
    trace: Path | None = None
    on_full: str = "drop"
    uprobes: Mapping[str, str] = field(default_factory=dict)
    early_start: bool = False
    in_kernel: bool = False


def from_env(env: Mapping[str, str] = os.environ) -> Config:
    """The job's Config; unset or empty variables give the defaults, a malformed EGPU_LOG counts as 0;
    a malformed EGPU_PROBES is an EgpuError (the job was asked for probes: never run it with none)."""
    probes = _probes(env.get(PROBES, ""))
    log = env.get(LOG, "0")
    return Config(probes=probes, session=Path(env[SESSION]) if env.get(SESSION) else None,
                  kernel=env.get(KERNEL) or None, log=int(log) if log.isdigit() else 0,
                  durations=env.get(DURATIONS) == "1", ptxas=env.get(PTXAS) or None,
                  backend=env.get(BACKEND) or "auto", backend_why=env.get(BACKEND_WHY) or None,
                  sanitizer=env.get(SANITIZER) or None,
                  restore=Path(env[RESTORE]) if env.get(RESTORE) else None,
                  restore_other_build=env.get(RESTORE_OTHER_BUILD) == "1",
                  timeline=env.get(TIMELINE) == "1", mirror=_seconds(env.get(MIRROR), Config.mirror),
                  launch_vm=env.get(LAUNCH_VM) if env.get(LAUNCH_VM) in LAUNCH_VMS else Config.launch_vm,
                  trace=Path(env[TRACE]) if env.get(TRACE) else None,
                  on_full=env.get(ON_FULL) if env.get(ON_FULL) in ON_FULLS else Config.on_full,
                  uprobes=_uprobes(env.get(UPROBES, "")),
                  early_start=env.get(EARLY_START) == "1", in_kernel=env.get(IN_KERNEL) == "1")


def to_env(cfg: Config) -> dict[str, str]:
    """The variables that make ``from_env`` return ``cfg`` (all of them, so a stale one never leaks in)."""
    return {PROBES: json.dumps([os.fspath(p) for p in cfg.probes]) if cfg.probes else "",
            SESSION: str(cfg.session) if cfg.session else "",
            KERNEL: cfg.kernel or "",
            LOG: str(cfg.log),
            DURATIONS: "1" if cfg.durations else "",
            PTXAS: cfg.ptxas or "",
            BACKEND: cfg.backend,
            BACKEND_WHY: cfg.backend_why or "",
            SANITIZER: cfg.sanitizer or "",
            RESTORE: str(cfg.restore) if cfg.restore else "",
            RESTORE_OTHER_BUILD: "1" if cfg.restore_other_build else "",
            TIMELINE: "1" if cfg.timeline else "",
            MIRROR: str(cfg.mirror),
            LAUNCH_VM: cfg.launch_vm,
            TRACE: str(cfg.trace) if cfg.trace else "",
            ON_FULL: cfg.on_full,
            UPROBES: json.dumps(dict(cfg.uprobes)) if cfg.uprobes else "",
            EARLY_START: "1" if cfg.early_start else "",
            IN_KERNEL: "1" if cfg.in_kernel else ""}


def _probes(text: str) -> tuple[Path, ...]:
    """EGPU_PROBES's paths: a JSON list of strings, or empty."""
    if not text:
        return ()
    try:
        paths = json.loads(text)
    except ValueError as e:
        raise EgpuError(f"{PROBES} is not JSON: {e}") from None
    if not isinstance(paths, list) or not all(isinstance(p, str) and p for p in paths):
        raise EgpuError(f"{PROBES} is not a JSON list of paths")
    return tuple(Path(p) for p in paths)


def _uprobes(text: str) -> dict[str, str]:
    """EGPU_UPROBES's targets: a JSON object of strings, or empty."""
    if not text:
        return {}
    try:
        targets = json.loads(text)
    except ValueError as e:
        raise EgpuError(f"{UPROBES} is not JSON: {e}") from None
    if not isinstance(targets, dict) or not all(isinstance(v, str) for v in targets.values()):
        raise EgpuError(f"{UPROBES} is not a JSON object of PATH:SYMBOL strings")
    return targets


def _seconds(text: str | None, default: float) -> float:
    """A non-negative number of seconds; the default when unset or malformed."""
    try:
        value = float(text) if text else default
    except ValueError:
        return default
    return value if value >= 0 else default


def rank(env: Mapping[str, str] = os.environ) -> int | None:
    """This process's rank in a distributed job: RANK (torchrun's global rank), else LOCAL_RANK; None
    outside one."""
    for name in ("RANK", "LOCAL_RANK"):
        value = env.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def argv() -> list[str]:
    """This process's command line: /proc/self/cmdline, which is right also where the shim started Python
    inside a C program (sys.orig_argv is empty there)."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0")[:-1]]
    except OSError:
        return list(sys.orig_argv)
