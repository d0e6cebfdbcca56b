"""The ranks of a running job, for ``egpu attach/detach/swap/maps --rank R | --all JOBPID``.

JOBPID is egpu-run's pid or torchrun's (any ancestor of the ranks). The job's processes are the live
sessions (control.list_sessions) whose process is JOBPID or descends from it (parent pids from
/proc/PID/stat); each session's ping says its rank (config.rank in that process). A rank's children
inherit its RANK (DataLoader or compile workers that touch CUDA): a session below another session of
the same rank is that rank's helper, so ``--rank`` addresses the rank's own process, ``--all`` every
session of the job. Requests to several processes go out together, so a swap reaches every rank at
about the same time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from egpu_preload.control import NoSession, SessionInfo, list_sessions, proc_stat, socket_path
from egpu_preload.errors import EgpuError

PROC = Path("/proc")


@dataclass(frozen=True)
class Target:
    """A process a request goes to, with its rank (None: not known or none)."""

    pid: int
    rank: int | None = None


def parent(pid: int, proc: Path = PROC) -> int | None:
    """PID's parent, or None when PID is gone (control.proc_stat: ``state ppid ...``)."""
    fields = proc_stat(pid, proc)
    return int(fields[1]) if fields and len(fields) > 1 else None


def ancestors(pid: int, parent_of: Callable[[int], int | None] = parent) -> list[int]:
    """PID's ancestors, nearest first (up to pid 1, or where the chain breaks)."""
    chain: list[int] = []
    p = parent_of(pid)
    while p and p not in chain and p != pid:
        chain.append(p)
        p = parent_of(p)
    return chain


def job_targets(root: int, sessions: list[SessionInfo],
                parent_of: Callable[[int], int | None] = parent) -> list[tuple[Target, bool]]:
    """(target, is a rank's helper) for every session that is ``root`` or below it, by rank then pid."""
    def rank(s: SessionInfo) -> int | None:
        r = (s.info or {}).get("rank")
        return r if isinstance(r, int) else None

    lineage = {s.pid: ancestors(s.pid, parent_of) for s in sessions}
    mine = [s for s in sessions if s.pid == root or root in lineage[s.pid]]
    ranks = {s.pid: rank(s) for s in mine}
    out = []
    for s in mine:
        r = ranks[s.pid]
        helper = r is not None and any(ranks.get(a) == r for a in lineage[s.pid])
        out.append((Target(s.pid, r), helper))
    return sorted(out, key=lambda th: (th[0].rank is None, th[0].rank or 0, th[0].pid))


def runs_egpu_run(pid: int) -> bool:
    """Whether ``pid`` is an egpu-run (its console script, or launcher.run_main as the tests start it)."""
    try:
        args = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(Path(a.decode(errors="replace")).name == "egpu-run" or b"run_main()" in a for a in args)


def select(root: int, rank: int | None = None, every: bool = False, sessions: list[SessionInfo] | None = None,
           parent_of: Callable[[int], int | None] = parent,
           is_egpu_run: Callable[[int], bool] = runs_egpu_run) -> list[Target]:
    """The processes a request addresses: ``root`` itself (neither rank nor every; when it is an egpu-run,
    which has no session, the one process of its job that has: never any other ancestor's, which would
    reach every job of a shell or of pid 1 unasked), the job's processes of rank ``rank`` (helpers left
    out), or all of the job's processes (``every``: the CLI refuses it beside a rank, a usage error)."""
    if rank is None and not every:
        if sessions is None and socket_path(root).exists() or not is_egpu_run(root):
            return [Target(root)]
        sessions = list_sessions() if sessions is None else sessions
        below = [t for t, _ in job_targets(root, sessions, parent_of)]
        if not below:   # "no egpu session in process R" named the egpu-run alone, as if it were the job
            raise NoSession(f"no egpu session in process {root} (egpu-run) or below it: no process of its job "
                            "has started egpu's runtime (yet)")
        if any(t.pid == root for t in below):
            return [Target(root)]
        if len(below) == 1:
            return below
        raise EgpuError(f"no egpu session in process {root}, but in {len(below)} processes below it "
                        f"({', '.join(str(t.pid) for t in below)}): give one of them, --rank R or --all")
    found = job_targets(root, list_sessions() if sessions is None else sessions, parent_of)
    if not found:
        raise EgpuError(f"no egpu session in process {root} or below it")
    if every:
        return [t for t, _ in found]
    chosen = [t for t, helper in found if t.rank == rank and not helper]
    if not chosen:
        have = sorted({t.rank for t, _ in found if t.rank is not None})
        raise EgpuError(f"no process of job {root} has rank {rank} "
                        f"({'ranks: ' + ', '.join(map(str, have)) if have else 'none has a rank'})")
    return chosen


def fan_out(targets: list[Target], fn: Callable[[int], Any]) -> list[tuple[Target, Any]]:
    """fn(pid) for every target at once; (target, its result or the EgpuError it raised), in order. Daemon
    threads: a Ctrl-C meanwhile ends egpu at once, where a pool's exit waited for every process's reply."""
    results: list[tuple[Target, Any]] = [(t, None) for t in targets]
    raised: list[Exception] = []   # any other exception: re-raised here, as the pool's map did

    def call(i: int) -> None:
        try:
            results[i] = (targets[i], fn(targets[i].pid))
        except EgpuError as e:
            results[i] = (targets[i], e)
        except Exception as e:
            raised.append(e)

    if len(targets) == 1:
        call(0)
    else:
        threads = [threading.Thread(target=call, args=(i,), daemon=True) for i in range(len(targets))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if raised:
        raise raised[0]
    return results
