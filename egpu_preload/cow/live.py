"""Live checkpoint of a running job (``egpu checkpoint PID DIR``), in the process, while it keeps running.

1. Staging memory for every device allocation (shim table, cow/allocations.py) and every module
   global (the runtime's modules, runtime/modstate.py): device memory, pinned host memory when the
   device is short (egpu_cow_staging).
2. The cut (egpu_cow_arm, shim/cow.c): launches and copies pause at the hooks for the few
   microseconds it takes to record an event on every stream the application made and on the legacy
   stream (that hold is measured: ``cut_hold_ns``); the pending table is published with it. What was
   issued before is in the snapshot, what comes after is not. If the allocations live at the cut are not
   those staged (the table's digest differs: one was freed, or made, in between), nothing is copied and
   it starts again, CUT_TRIES times.
3. Soft copy-on-write: until every range is copied, a launch or copy that may write a pending range
   copies it first on its own stream, after waiting for every stream's cut event (shim/cow.c); this
   thread's copier copies the rest, one range at a time, on a stream of its own that waits for the cut
   events too. So every copy holds its range as of the cut, whoever made it. The kernels' PTX write sets
   (cow/rwsets.py) tell the hook which parameter words are written through; a kernel they cannot follow
   (a pointer loaded from memory, a call without a body) copies every pending range first; kernels without
   PTX get their layout from the driver and every word counts.
4. Disarm (every copy finished), then the staging memory goes to DIR through snapshot.SnapshotWriter,
   with what the checkpoint cost the application in the manifest's ``info``: the stall, time inside hooks
   on copy-on-write (``stall_ns`` and ``stall_max_ns``: a writer copying its ranges first), which leaves
   out the cut's hold on launches and copies (``cut_hold_ns``, from the gates closing to their opening),
   and the window it ran in (CLOCK_MONOTONIC, as the application's clocks).
   ``stop_the_world`` first copies the same bytes the way a stopping checkpointer does (launches held,
   context drained, device-to-device copies: egpu_shim_swap) and reports how long that held the job;
   ``download_s`` is what copying them to the host took (a stopping checkpointer to host holds that).

Module globals are one unit: the first launch after the cut (any kernel may write a global) copies them
all on its stream after waiting for every cut event, or waits for the copier's copy.

Limits: one context (the runtime's, or the primary one); host memory (cuMemHostAlloc, registered) is
the process's own and is not saved, nor are the globals of modules without PTX (the reply's ``not_saved``
counts both, by kind); a per-thread default stream of another thread cannot carry a cut
event (its work is cut by the legacy stream only when it synchronizes with it); graph launches
(cuGraphLaunch) are not checked while armed; an allocation freed during the checkpoint keeps its
staging copy as of the cut only if a writer or the copier reached it before the free.
"""

from __future__ import annotations

import functools
import hashlib
import os
import secrets
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from egpu_preload.cow import rwsets
from egpu_preload.cow.allocations import Allocation, AllocationTable, AllocKind, param_offsets, read_shim
from egpu_preload.cow.snapshot import CHUNK, Job, Program, SnapshotWriter, file_sha256, saved
from egpu_preload.errors import CowError, EgpuError
from egpu_preload.runtime import config, dump
from egpu_preload.runtime.modstate import module_globals

if TYPE_CHECKING:
    from egpu_preload.runtime.instrumenter import Module, Runtime

STW_GAP_S = 0.2   # between the stop-the-world comparison and the live checkpoint
CUT_TRIES = 3     # cuts taken again when the job's allocations changed between the table's read and the cut
STATS = ("launches_at_cut", "cut_streams", "hook_copies", "hook_waits", "copier_copies", "checked",
         "unknown_layout", "stall_ns", "stall_max_ns", "cut_hold_ns")


_process: tuple[int, str] = (0, "")   # (pid, token) of process_token


def process_token() -> str:
    """A name for this process that no other has had, even one with the same pid (a re-run in a fresh
    container often gets it): checkpoints carry it, and a rollback goes only into the process named."""
    global _process
    if _process[0] != os.getpid():   # first call, or a forked child
        _process = (os.getpid(), secrets.token_hex(16))
    return _process[1]


def this_job() -> Job:
    return Job(process_token(), os.getpid(), tuple(config.argv()))


@functools.cache   # the executable of a process never changes but by exec, which starts a new runtime
def this_program() -> Program:
    """This process's executable: its path and the sha256 of the file it runs (read through /proc, so a
    rebuild written over the path since it started does not count)."""
    return Program(os.readlink("/proc/self/exe"), file_sha256("/proc/self/exe"))


def module_key(mod: "Module") -> str:
    """A module's name in a checkpoint: its PTX's digest, the same in every run of the program."""
    return hashlib.sha256((mod.ptx or "").encode()).hexdigest()[:16]


def modules_with_ptx(rt: "Runtime") -> list["Module"]:
    seen: dict[int, Module] = {}
    for m in rt.modules.values():
        if m.ptx is not None and m.handle is not None:
            seen.setdefault(id(m), m)
    return list(seen.values())


def live_globals(rt: "Runtime") -> dict[tuple[str, str], tuple[int, int]]:
    """(module key, symbol) -> (address, size) of every global of every loaded module with PTX, in the
    current context."""
    out = {}
    for mod in modules_with_ptx(rt):
        if mod.state is None:
            mod.state = module_globals(mod.ptx)
        key = module_key(mod)
        for name in mod.state:
            found = rt.driver.global_symbol(mod.handle, name, mod.library)
            if found and found[1]:
                out[(key, name)] = found
    return out


def not_saved(rt: "Runtime", live: list[Allocation]) -> dict[str, dict[str, int]]:
    """What the process holds that a checkpoint leaves out, by kind: {"HOST": {"allocations": 2, "bytes":
    8192}}; "modules without PTX" counts modules whose globals go unsaved (their bytes are not known)."""
    out: dict[str, dict[str, int]] = {}
    for a in live:   # a VMM handle's memory is saved (or not) through its mappings
        if not saved(a) and a.kind != AllocKind.VMM_HANDLE and a.size:
            row = out.setdefault(a.kind.name, {"allocations": 0, "bytes": 0})
            row["allocations"] += 1
            row["bytes"] += a.size
    opaque = {id(m) for m in rt.modules.values() if m.ptx is None and m.handle is not None}
    if opaque:
        out["modules without PTX"] = {"modules": len(opaque)}
    return out


def live_allocations(rt: "Runtime") -> list[Allocation]:
    """The shim's allocation table now, by creation number; CowError if it ever dropped one (full table)."""
    stats = rt.ffi.new("struct egpu_cow_stats *")
    rt.lib.egpu_cow_stats(stats)
    if stats.alloc_overflow:   # counted once made, never listed: it may still be live, unseen
        raise CowError(f"{stats.alloc_overflow} allocations were made while the shim's table was full and are not "
                       "in the shim's table: a checkpoint or restore would leave them out")
    table = AllocationTable()
    table.sync(read_shim(rt.ffi, rt.lib))
    return table.by_creation()


def alloc_state(rt: "Runtime") -> tuple[int, int, int]:
    """The shim's allocation table: (changes so far, digest of the allocations live now, that digest at the
    last cut); equal digests, equal sets of live allocations."""
    stats = rt.ffi.new("struct egpu_cow_stats *")
    rt.lib.egpu_cow_stats(stats)
    return int(stats.alloc_changes), int(stats.alloc_digest), int(stats.alloc_digest_at_cut)


def context(rt: "Runtime") -> int:
    """The context the job's memory lives in: the maps' one, else the current or primary one."""
    return rt.context if rt.context is not None else rt.driver.maps_context()


def register_layouts(rt: "Runtime") -> int:
    """Give the shim every known kernel handle's parameter layout and PTX write set; returns how many."""
    sets: dict[int, dict[str, rwsets.KernelRW]] = {}
    ffi, n = rt.ffi, 0
    for handle, (mod, name) in list(rt.functions.items()):
        if mod.ptx is None:
            continue
        if id(mod) not in sets:
            try:
                sets[id(mod)] = rwsets.analyse(mod.ptx)
            except EgpuError:
                sets[id(mod)] = {}
        rw = sets[id(mod)].get(name)
        if rw is None:
            continue
        offsets = param_offsets(rw.params)
        where = dict(zip((p.name for p in rw.params), offsets))
        writes = sorted({where[p] + off for (p, off), mode in rw.access.items() if "w" in mode})
        nwrites = len(writes) if rw.exact else rt.lib.EGPU_COW_ANYTHING   # a loaded pointer may reach any range
        if rt.lib.egpu_cow_layout(ffi.cast("void *", handle), ffi.new("unsigned int[]", offsets),
                                  ffi.new("unsigned int[]", [p.size for p in rw.params]), len(offsets),
                                  ffi.new("unsigned int[]", writes or [0]), nwrites) == 0:
            n += 1
    return n


@dataclass
class Staged:
    """One range and where its copy goes."""

    what: str
    address: int
    size: int
    staging: int
    host: bool
    alloc: Allocation | None = None
    symbol: tuple[str, str] | None = None   # (module key, name) of a global


class Checkpointer:
    """The ``checkpoint`` and ``restore`` control commands of one process."""

    def __init__(self, rt: "Runtime") -> None:
        self.rt = rt
        self.busy = threading.Lock()
        self._side: int | None = None    # the copier's stream (one per process, in the job's context)
        self.download_s = 0.0            # staging to host, this checkpoint
        self.pending: Any = None         # the --restore Manifest until it is put back

    # ---- checkpoint ---------------------------------------------------------------------------------
    def checkpoint(self, fields: dict) -> dict:
        directory = Path(fields["dir"])
        if not directory.is_absolute():
            raise CowError(f"{directory}: the checkpoint directory must be an absolute path")
        if not self.busy.acquire(blocking=False):
            raise CowError("a checkpoint or restore is already running in this process")
        try:
            return self._checkpoint(directory, bool(fields.get("stop_the_world")))
        finally:
            self.busy.release()

    def _checkpoint(self, directory: Path, stop_the_world: bool) -> dict:
        rt, ffi, lib = self.rt, self.rt.ffi, self.rt.lib
        job = this_job()
        writer = SnapshotWriter(directory, pid=job.pid, argv=job.argv, cut={}, process=job.process,
                                program=this_program())
        with writer:
            ctx = context(rt)
            info = None
            for _ in range(CUT_TRIES):
                staged: list[Staged] = []
                try:
                    with rt.driver.current(ctx):
                        staged, writer.allocations_made, left_out, digest = self._stage(rt)
                        layouts = register_layouts(rt)
                        side = self._stream()
                        stw = {}
                        if stop_the_world:  # first, and apart, so that the job's timings can tell them apart
                            stw = self._stop_the_world(staged, ctx)
                            time.sleep(STW_GAP_S)
                        info = self._copy(staged, side, ctx, digest)
                        if info is None:
                            continue
                        info.update(stw, layouts=layouts, not_saved=left_out)
                        t0, self.download_s = time.monotonic(), 0.0
                        for s in staged:
                            data = self._read(s, side)
                            if s.alloc is not None:
                                writer.add_allocation(s.alloc, data)
                            else:
                                writer.add_global(*s.symbol, data, s.size)
                        info.update(write_s=round(time.monotonic() - t0, 3), download_s=round(self.download_s, 3),
                                    t_written_ns=time.monotonic_ns())
                        break
                finally:
                    with rt.driver.current(ctx):
                        for s in staged:
                            lib.egpu_cow_staging_free(s.staging, int(s.host))
            if info is None:
                raise CowError(f"the job's allocations at the cut were not those read just before, {CUT_TRIES} "
                               "times (it allocates or frees all the time): try again (nothing was saved)")
            writer.cut.update({int(ffi.cast("uintptr_t", h)): info["launches_at_cut"] for h in self._streams()})
            writer.cut.setdefault(0, info["launches_at_cut"])
            writer.info.update(info)
            manifest = writer.commit()
        return {"dir": str(directory), "allocations": len(manifest.allocations), "globals": len(manifest.globals),
                **info}

    def _stage(self, rt: "Runtime") -> tuple[list[Staged], int, dict[str, dict[str, int]], int]:
        """A staging buffer for every device allocation and module global; how many allocations the
        process had made (one past the newest live one: any older one not live now never will be again);
        what the checkpoint leaves out (not_saved), for the reply to say the snapshot is partial; and the
        digest of the allocations listed (_copy checks they still were the live ones at the cut)."""
        ffi, lib = rt.ffi, rt.lib
        while True:   # the digest of the very table read
            changes, digest, _ = alloc_state(rt)
            live = live_allocations(rt)
            if alloc_state(rt)[0] == changes:
                break
        ranges = [Staged(f"allocation #{a.seq}", a.address, a.size, 0, False, alloc=a) for a in live if saved(a)]
        ranges += [Staged(f"global {sym}", addr, size, 0, False, symbol=(key, sym))
                   for (key, sym), (addr, size) in live_globals(rt).items()]
        out, host = ffi.new("unsigned long long *"), ffi.new("int *")
        staged = []
        try:
            for s in ranges:
                r = lib.egpu_cow_staging(s.size, out, host)
                if r:
                    raise CowError(f"no memory to stage {s.what} ({s.size} bytes): {rt.driver.error_name(r)}")
                s.staging, s.host = int(out[0]), bool(host[0])
                staged.append(s)
        except Exception:
            for s in staged:
                lib.egpu_cow_staging_free(s.staging, int(s.host))
            raise
        return ranges, max((a.seq for a in live), default=-1) + 1, not_saved(rt, live), digest

    def _stream(self) -> int:
        if self._side is None:
            self._side = self.rt.driver.stream()
        return self._side

    def _streams(self) -> list[Any]:
        ffi, lib = self.rt.ffi, self.rt.lib
        buf = ffi.new("void *[]", 4096)
        n = lib.egpu_cow_streams(buf, 4096)
        return [buf[i] for i in range(min(n, 4096))]

    def _copy(self, staged: list[Staged], side: int, ctx: int, digest: int) -> dict | None:
        """Cut, arm, copy everything, disarm; what it cost the application. None, with nothing copied, when
        the allocations live at the cut are not those staged (``digest``): one staged was freed since (its
        address may be another's now), or one made meanwhile, written before the cut, would be missing."""
        rt, ffi, lib = self.rt, self.rt.ffi, self.rt.lib
        table = ffi.new("struct egpu_cow_range[]", max(len(staged), 1))
        for i, s in enumerate(staged):
            table[i].address, table[i].size, table[i].staging = s.address, s.size, s.staging
            table[i].always = int(s.symbol is not None)
        side_p = ffi.cast("void *", side)
        with rt.live.lock:   # no hot swap holds the launch gate meanwhile
            t_cut = time.monotonic_ns()
            r = lib.egpu_cow_arm(table, len(staged), side_p)
        if r:
            why = (rt.driver.error_name(r) if r > 0 else
                   "a launch or copy stayed in the driver past the hold limit" if r == lib.EGPU_COW_TIMEOUT else
                   "a stream the application made is not known to the shim" if r == lib.EGPU_COW_STREAMS else
                   "already armed or bad ranges")
            raise CowError(f"cannot take the cut: {why}")
        if alloc_state(rt)[2] != digest:
            with rt.live.lock:
                lib.egpu_cow_disarm()   # its error: the ranges never copied
            return None
        try:
            while lib.egpu_cow_copy_next(side_p) >= 0:
                pass
        finally:
            with rt.live.lock:
                r = lib.egpu_cow_disarm()
        t_copied = time.monotonic_ns()
        stats = ffi.new("struct egpu_cow_stats *")
        lib.egpu_cow_stats(stats)
        if r:
            why = rt.driver.error_name(r) if r > 0 else "a range was never copied"
            raise CowError(f"a copy of the checkpoint failed: {why}")
        info = {f: int(getattr(stats, f)) for f in STATS}
        info.update(bytes=sum(s.size for s in staged), t_cut_ns=t_cut, t_copied_ns=t_copied,
                    copy_ms=round((t_copied - t_cut) / 1e6, 3), host_staging=sum(s.host for s in staged))
        return info

    def _read(self, s: Staged, side: int) -> Iterator[bytes | memoryview]:
        """The staged bytes, in pieces (pinned host staging is read in place)."""
        ffi = self.rt.ffi
        if s.host:
            yield ffi.buffer(ffi.cast("char *", s.staging), s.size)
            return
        for off in range(0, s.size, CHUNK):
            t0 = time.monotonic()
            piece = self.rt.driver.dtoh_on(side, s.staging + off, min(CHUNK, s.size - off))
            self.download_s += time.monotonic() - t0
            yield piece

    def _stop_the_world(self, staged: list[Staged], ctx: int) -> dict:
        """The same bytes copied the stopping way: launches held, the context drained, copied, drained."""
        from egpu_preload.runtime.live import swap_failure
        ffi, lib = self.rt.ffi, self.rt.lib
        copies = ffi.new("struct egpu_copy[]", max(len(staged), 1))
        for i, s in enumerate(staged):
            copies[i].dst, copies[i].src, copies[i].size = s.staging, s.address, s.size
        launches = ffi.new("unsigned long long *")
        with self.rt.live.lock:
            t0 = time.monotonic_ns()
            r = lib.egpu_shim_swap(ffi.cast("void *", ctx), copies, len(staged), ffi.NULL, 0, ffi.NULL, 0, launches)
            t1 = time.monotonic_ns()
        if r:
            raise CowError(f"the stop-the-world copy failed: {swap_failure(self.rt, r)}")
        return {"stw_t0_ns": t0, "stw_t1_ns": t1, "stw_ms": round((t1 - t0) / 1e6, 3)}

    def at_exit(self) -> None:
        """A --restore that never fired (fewer allocations than the checkpoint's, or no launch after them)
        says so: the job exits as it would have run without it, and nothing else would tell."""
        if self.pending is not None:
            from egpu_preload.cow import restore
            print(restore.never_put_back(self.rt, self.pending), file=sys.stderr)

    # ---- rollback -----------------------------------------------------------------------------------
    def restore(self, fields: dict) -> dict:
        from egpu_preload.cow import restore
        directory = Path(fields["dir"])
        if not self.busy.acquire(blocking=False):
            raise CowError("a checkpoint or restore is already running in this process")
        try:
            return restore.rollback(self.rt, directory)
        finally:
            self.busy.release()


def attach(rt: "Runtime") -> Checkpointer:
    """Serve ``checkpoint`` and ``restore`` on the runtime's control socket; arm a pending --restore."""
    cp = Checkpointer(rt)
    rt.live.serve("checkpoint", cp.checkpoint)
    rt.live.serve("restore", cp.restore)
    if rt.cfg.restore is not None:
        from egpu_preload.cow import restore
        if rt.cfg.session is not None:   # this process says what becomes of it; egpu-run, where none did
            dump.mark_started(rt.cfg.session, dump.RESTORING)
        try:
            cp.pending = restore.arm_at_start(rt, rt.cfg.restore, lambda: setattr(cp, "pending", None))
        except EgpuError as e:  # the launcher checked the directory: this is rare, and fatal
            print(f"egpu: --restore refused: {e}", file=sys.stderr)
            os._exit(1)
    return cp

