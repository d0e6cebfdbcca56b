"""Putting a checkpoint back: into a re-run of the program (``egpu-run --restore DIR CMD``), or into the
running job (``egpu restore PID DIR``).

Re-run. The launcher validates DIR before the job starts (snapshot.load hashes every file). In the job
the runtime loads it again, refuses a checkpoint of another executable (snapshot.check_program; egpu-run
--restore-other-build skips that, for a rebuild known to allocate the same way), and arms the shim's
trigger (egpu_cow_restore_at) at the snapshot's
allocation count: once the program has made that many allocations, the next launch calls back here
first, on the launching thread, in its context. The live allocations (creation number, size, kind)
and module globals (module PTX digest, symbol) are matched by snapshot.plan_restore, which refuses any
mismatch before a byte is written; then every file is copied in. A refusal ends the job (exit 1): it
asked for a restore, and running on from a half-made state would be worse. Globals of modules not
loaded by then are left as the program made them (the reply line counts them). A trigger never reached
(the program made fewer allocations, or launched nothing after them) is said at exit (never_put_back).

Rollback. Only into the process that took the checkpoint (snapshot.Job: its pid, argv and a token no
other process has had). The snapshot is matched against the job as it runs now, whole: every
allocation of the cut at its address, every global, nothing missing. Then it is staged into
memory of the runtime's own and written in one egpu_shim_swap: launches held, the context
drained, device-to-device copies, drained again, launches go on. Nothing of the job is written
unless everything matched and was staged.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from egpu_preload.cow.live import context, live_allocations, live_globals, this_job, this_program
from egpu_preload.cow.snapshot import CHUNK, Manifest, RestorePlan, check_program, load, plan_restore
from egpu_preload.errors import CowError, EgpuError

if TYPE_CHECKING:
    from egpu_preload.runtime.instrumenter import Runtime


def restore_count(m: Manifest) -> int:
    """How many allocations the program must have made before the snapshot can go back."""
    return max((e.index for e in m.allocations), default=-1) + 1


def put_back(rt: "Runtime", m: Manifest) -> str:
    """Match and write the snapshot into the allocations and loaded globals of the current context."""
    live = live_allocations(rt)
    globs = live_globals(rt)
    present = tuple(g for g in m.globals if (g.module, g.symbol) in globs)
    plan = plan_restore(dataclasses.replace(m, globals=present), live, globs)
    plan.execute(rt.driver.htod)
    skipped = len(m.globals) - len(present)
    return (f"{m.directory}: {len(m.allocations)} allocations, {len(present)} globals, {plan.bytes} bytes"
            + (f" ({skipped} globals of modules not loaded left as they are)" if skipped else ""))


def arm_at_start(rt: "Runtime", directory: Path, restored: Callable[[], None] = lambda: None) -> Manifest:
    """Restore ``directory`` before the first launch after the program remade its allocations; refused at
    once when it is a checkpoint of another executable (unless --restore-other-build)."""
    m = load(directory)
    if not rt.cfg.restore_other_build:
        check_program(m, this_program())
    ffi, lib = rt.ffi, rt.lib

    def fatal(reason: str) -> None:
        print(f"egpu: --restore {directory} refused: {reason}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)

    @ffi.def_extern(name="egpu_py_cow_restore", onerror=lambda t, e, tb: fatal(f"{t.__name__}: {e}"))
    def egpu_py_cow_restore() -> None:
        try:
            print(f"egpu: restored {put_back(rt, m)}", file=sys.stderr)
            restored()
        except EgpuError as e:
            fatal(str(e))

    lib.egpu_cow_restore_at(restore_count(m))
    return m


def never_put_back(rt: "Runtime", m: Manifest) -> str:
    """Why an armed --restore has not fired (said at exit: the job then ran from its start)."""
    stats = rt.ffi.new("struct egpu_cow_stats *")
    rt.lib.egpu_cow_stats(stats)
    return (f"egpu: --restore {m.directory} was never put back: the job made {stats.allocations} allocations, the "
            f"checkpoint is put back at the first launch after {restore_count(m)} (a checkpoint of other "
            "arguments?); the job ran from its start")


class _Staging:
    """Memory of the runtime's own holding the snapshot's bytes, by the live address they go to."""

    def __init__(self, rt: "Runtime", plan: RestorePlan) -> None:
        self.rt = rt
        self.rows: list[tuple[int, int, int, bool]] = []   # (address, size, staging, host), by address
        out, host = rt.ffi.new("unsigned long long *"), rt.ffi.new("int *")
        try:
            for c in sorted(plan.copies, key=lambda c: c.address):
                r = rt.lib.egpu_cow_staging(c.size, out, host)
                if r:
                    raise CowError(f"no memory to stage {c.what} ({c.size} bytes): {rt.driver.error_name(r)}")
                self.rows.append((c.address, c.size, int(out[0]), bool(host[0])))
        except Exception:
            self.free()
            raise
        self._starts = [r[0] for r in self.rows]

    def write(self, address: int, data: Any) -> None:
        row = self.rows[bisect.bisect_right(self._starts, address) - 1]
        dst = row[2] + address - row[0]
        if row[3]:
            self.rt.ffi.memmove(self.rt.ffi.cast("char *", dst), data, len(data))
        else:
            self.rt.driver.htod(dst, data)

    def free(self) -> None:
        for _, _, staging, host in self.rows:
            self.rt.lib.egpu_cow_staging_free(staging, int(host))
        self.rows = []


def rollback(rt: "Runtime", directory: Path) -> dict:
    """Write ``directory`` back into the running job (the control command ``restore``)."""
    from egpu_preload.runtime.live import CAPTURING, swap_failure, swap_outside_captures
    m = load(directory)
    ffi, lib = rt.ffi, rt.lib
    ctx = context(rt)
    with rt.driver.current(ctx):
        plan = plan_restore(m, live_allocations(rt), live_globals(rt), this_job())
        staging = _Staging(rt, plan)
        try:
            plan.execute(staging.write, CHUNK)
            copies = ffi.new("struct egpu_copy[]", max(len(staging.rows), 1))
            for i, (address, size, src, _) in enumerate(staging.rows):
                copies[i].dst, copies[i].src, copies[i].size = address, src, size
            launches = ffi.new("unsigned long long *")
            with rt.live.lock:
                t0 = time.monotonic_ns()
                r = swap_outside_captures(rt, ctx, copies, len(staging.rows), ffi.NULL, 0, ffi.NULL, 0, launches)
                t1 = time.monotonic_ns()
        finally:
            staging.free()
    if r == lib.EGPU_SWAP_CAPTURING:
        raise CowError(f"{CAPTURING}; nothing was written, try again once it has ended")
    if r:
        raise CowError(f"writing the checkpoint back failed: {swap_failure(rt, r)}; nothing was written")
    return {"dir": str(directory), "allocations": len(m.allocations), "globals": len(m.globals),
            "bytes": plan.bytes, "held_ms": round((t1 - t0) / 1e6, 3), "launch": int(launches[0])}
