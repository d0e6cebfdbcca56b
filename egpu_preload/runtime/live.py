"""Live control of a running job: the control socket's handlers inside every process that runs the
runtime (egpu attach/detach/swap/maps/modules/ps).

Images. Every module load with PTX keeps its original PTX (Module.ptx). Launches of a module's kernel
handles (the application's) run either the application's own image (``Module.serving`` None: the
original, or the image instrumented at load time) or a copy the runtime loaded beside it through the
real driver (``Copy``), instrumented with the probes attached now, or the original when none of them
matches. A change of probes (attach, detach, swap) computes the image every module must run, loads the
copies it lacks, fills their map tables, and then makes one flip for the whole process
(egpu_shim_swap): launches wait at the hooks, the context drains, module state is copied, every kernel
handle is retargeted, launches go on. So a launch runs all old or all new code, never neither, and
the new image starts from the state the old one left.

Module state: the ``.global`` and ``.const`` variables of the module's PTX (modstate.py), copied from
the image launches ran on to the image they will run on, device to device, in the flip. Memory the
application allocated is shared by every image and needs no copy. The application's own symbol
addresses (cuModuleGetGlobal, so cudaMemcpyToSymbol and cudaMemcpyFromSymbol, looked up before or
after the flip) name its own image: while a copy serves, the shim moves the application's linear
copies and memsets inside one of those variables to the same place in the serving copy's
(``Module.moved``, egpu_shim_swap's table, replaced in the flip with the copy gate held too), so what
it writes there is what the kernels read and what it reads is what they wrote, and the next flip
carries it on. Limit: other uses of such an address still reach the application's image: a pointer
to a variable passed to its own kernels (cudaGetSymbolAddress), 2D/3D copies, a copy that spans
more than one variable. The fix for those is copies that address the application's variables
instead of their own (a rewrite of their PTX), which would also make the state copy unnecessary.
What the application set on a kernel handle (cuFuncSetAttribute: the dynamic shared memory it may use, the
cache config) the shim sets on the copy's function too (shim/interpose.c, setting_made), and a copy is compiled
with the numeric JIT options of the application's load (the register cap, FMA, FTZ: Module.jit). A module
loaded in another context than the maps' keeps its own image: a copy would load in the maps' context, where
that context's launches cannot run it.

Old images. The flip drains the context first, so no launch of an old image is queued when it ends.
Right after it, every dead copy is unloaded: one not serving that was made with a probe no longer
attached (attaching a probe again loads a new Probe object, so no flip can choose such a copy again).
Except where a function of the copy escaped the launch hooks (egpu_shim_escaped): it went into a CUDA
graph kernel node (node retargeting happens at node set time; the node keeps that function), or it
was launched while a stream capture was in progress, anywhere in the process (the captured graph keeps
it). A graph may launch those at any later time, so they stay loaded until exit. So do copies of the
original (probes ``()``: the next detach reuses them) and the copies of a module the application
unloaded. A retired probe (``retired``) keeps its Probe object and map regions while such a copy made
with it stays (the copy's map table points at them; the object's id names copies, so it must not be
reused), and egpu-run's probes keep theirs until exit; once the change that retired the others is done,
their regions are freed (Live._release_retired), but those a probe still attached took over (swap). A
flip that fails unloads the copies it loaded.

Maps. A swap reuses the device region of every map the new probe declares exactly as the old one
(name, type, key and value size, max_entries, flags) and stripes alike (a counter both only add to has
the same rows per SM in both: striping.py): its contents survive. A counter the old probe only added to
and the new one also reads starts from zero. ``maps`` reads regions on a
non-blocking stream of the runtime's own, so no application stream waits for it and it waits for none:
each region is a copy taken while kernels may be writing it (aligned 8-byte words are read whole;
entries written during the copy may show either value; different maps are copied at different times).
The final maps a swap or detach replies with are exact: the flip itself copies the leaving probe's
regions after the context drained and before a launch runs the new code (Snapshot), so launches of a
new probe that took a map over do not show in the old one's reply. A probe's uprobes (uprobes.LiveUprobes,
or egpu-run's: the drainer's) keep their maps on the host; those they share with GPU programs are pushed into
its regions, the last keys before the change that retires them (its host programs stop first, and run again
if it fails), and a swap's new uprobes start from the regions they took over.
Every read (``maps``, the mirror, a detach's or swap's final maps) merges the host sides in with the exit
dump's own function (launches.dump_states): maps only host programs use (launch, host-API, egpu/uvm and
uprobe programs of the probes egpu-run started with; live uprobes) from their host copy, shared ones
from the device. A read makes no device maps: a job whose probes run only on the host has none.

SASS-only kernels (runtime/sass.py): the flip also commits the SASS back end's next generation, the
patch image of the probes attached after it, staged beforehand with its table block. Inside the same
hold, after the drain, shim/sass.c re-patches every module it serves, so a SASS-patched launch too runs
all old or all new probes; a re-patch that fails puts the old image back and fails the whole flip.

Limits: one context (where the maps live); launch programs (egpu/launch/...) are not run for probes
attached live; a module loaded by a thread while a swap runs is brought to the new probes at once
(Runtime.module_loaded -> ``loaded``).
"""

from __future__ import annotations

import gc
import hashlib
import os
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from egpu_preload.bpf.sections import HOST_RUN
from egpu_preload.control import ControlError, ControlServer
from egpu_preload.errors import EgpuError
from egpu_preload.maps import MapsState
from egpu_preload.runtime import config, dump, launches, uprobes
from egpu_preload.runtime.driver import ATTR_SM_COUNT
from egpu_preload.runtime.modstate import module_globals
from egpu_preload.runtime.probes import Probe, load_probe
from egpu_preload.runtime.sass import NO_PROGRAMS, table_block
from egpu_preload.translate import devmaps
from egpu_preload.translate.devmaps import DeviceMaps, apply_images
from egpu_preload.translate.rewrite import KernelStatus, instrument
from egpu_preload.translate.sass_patch import has_sites

if TYPE_CHECKING:
    from egpu_preload.runtime.driver import ContextMemory
    from egpu_preload.runtime.instrumenter import Module, Runtime

CAPTURE_WAIT_S = 1.0   # how long a flip waits for the application's stream captures to end
VERIFIED_KEPT = 16     # probe objects kept loaded, verified and translated for an attach again
NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
# egpu_shim.h's row structs, and their fields in the order of the rows the runtime keeps
COPY = ("struct egpu_copy", ("dst", "src", "size"))
MOVED = ("struct egpu_moved", ("orig", "moved", "size"))


@dataclass
class Copy:
    """An image of a module the runtime loaded beside the application's."""

    handle: int
    probes: tuple[int, ...]              # ids of the Probe objects instrumented in; () the original
    kernels: dict[str, KernelStatus]
    functions: dict[str, int] = field(default_factory=dict)  # kernel name -> handle in this copy


@dataclass(frozen=True)
class Flip:
    orig: int
    repl: int | None
    nparams: int = 0
    param_offset: int = 0
    launch_id: bool = False


def no_collection(handler: Callable[[dict], dict]) -> Callable[[dict], dict]:
    """``handler`` run with the cyclic collector paused: a full collection in a PyTorch process can take
    tens of milliseconds, and none starts during a change (one the application asks for still runs, and
    the reply's gc phase shows it). The GIL's prompt handoff during requests is control.prompt_gil's."""
    def run(fields: dict) -> dict:
        collecting = gc.isenabled()
        gc.disable()
        try:
            return handler(fields)
        finally:
            if collecting:
                gc.enable()
    return run


NAME_RULE = "letters, digits, _ . - (at most 64)"


def name_ok(name: str) -> bool:
    """Whether ``name`` may name an attached probe (NAME_RULE; not starting with a dot)."""
    return bool(name) and len(name) <= 64 and set(name) <= NAME_CHARS and not name.startswith(".")


def probe_name(path: Path) -> str:
    """A probe's default name: its file name without .bpf.o / .bpf.c (``count.bpf.o`` -> ``count``)."""
    name = path.name
    for suffix in (".bpf.o", ".bpf.c", ".o"):
        if name.endswith(suffix):
            return name[:-len(suffix)]
    return name


CAPTURING = (f"the application is capturing a CUDA graph (still after {CAPTURE_WAIT_S:g} s): egpu must "
             "drain the context, which the driver refuses during a capture, and the capture would fail")


def swap_outside_captures(rt: "Runtime", ctx: int, *args: Any) -> int:
    """egpu_shim_swap(ctx, *args), tried again while the application captures a graph (most captures end
    within milliseconds), for at most CAPTURE_WAIT_S; its result (EGPU_SWAP_CAPTURING if still)."""
    deadline = time.monotonic() + CAPTURE_WAIT_S
    while True:
        r = rt.lib.egpu_shim_swap(rt.ffi.cast("void *", ctx), *args)
        if r != rt.lib.EGPU_SWAP_CAPTURING or time.monotonic() > deadline:
            return r
        time.sleep(0.005)


def swap_failure(rt: "Runtime", r: int) -> str:
    """What a failed egpu_shim_swap (result ``r``, not EGPU_SWAP_CAPTURING) ran into."""
    if r == rt.lib.EGPU_SWAP_SASS:
        return f"SASS back end: {rt.sass.stats()['error']}"
    if r == rt.lib.EGPU_SWAP_TIMEOUT:
        return (f"the application's work did not finish within {rt.lib.egpu_shim_hold_limit(0) / 1000:g} s of "
                "holding its launches (a kernel that runs long or never ends); its launches went on")
    return rt.driver.error_name(r) if r > 0 else "the shim's function table is full or memory ran out"


def same_map(a: Any, b: Any) -> bool:
    """Maps whose device regions are interchangeable (a swap keeps the region): declared alike, and
    both striped alike (striping.py: rows per SM or one copy, as each probe uses the map)."""
    return (a.name, a.type, a.key_size, a.value_size, a.max_entries, a.flags, a.stripe) == \
           (b.name, b.type, b.key_size, b.value_size, b.max_entries, b.flags, b.stripe)


@dataclass
class Snapshot:
    """Copies of the map regions of probes a flip retires, made inside the flip (egpu_shim_swap copies
    after the context drained and before any launch runs the new code): maps a new probe takes over
    (identically declared) go on counting after the flip, these copies do not."""
    probes: list[tuple[str, Probe, DeviceMaps]]
    addrs: list[list[int]] = field(default_factory=list)

    def stage(self, memory: "ContextMemory") -> list[tuple[int, int, int]]:
        """Allocate the copies; the (dst, src, size) device copies the flip must make."""
        copies = []
        try:
            for _, _, maps in self.probes:
                self.addrs.append([])
                for addr, lay in zip(maps.addrs, maps.layouts):
                    size = lay.region_size(maps.ncpu)
                    self.addrs[-1].append(memory.alloc(size))
                    copies.append((self.addrs[-1][-1], addr, size))
        except EgpuError:
            self.free(memory)
            raise
        return copies

    def free(self, memory: "ContextMemory") -> None:
        for a in (a for probe in self.addrs for a in probe):
            memory.free(a)
        self.addrs = []


class Live:
    """The runtime's live control: which probes are attached, the images serving every module, the flip."""

    def __init__(self, rt: "Runtime") -> None:
        self.rt = rt
        self.lock = threading.RLock()     # the runtime's load hooks take it too
        self.generation = 0               # bumped by every flip
        self.names = self._unique([probe_name(p.path) for p in rt.probes])
        self.retired: list[tuple[Probe, DeviceMaps]] = []  # while a copy needs them ("Old images")
        self.server: ControlServer | None = None
        self.forked_from: int | None = None   # the parent, in a child forked after the runtime started
        self._refused: str | None = None      # there: why the driver refuses CUDA ("" it does not), once asked
        self.flips = 0
        self._workdir: Path | None = None
        self._verified: dict[Path, Probe] = {}   # object path -> the probe loaded from it, oldest first
        self.extra: dict[str, Any] = {}   # handlers other parts of the runtime serve (serve())
        self.host = uprobes.LiveUprobes(rt)  # attached probes' host uprobes and their maps

    @property
    def memory(self) -> "ContextMemory":
        """The maps context's memory (the runtime's: one stream of our own for all copies)."""
        return self.rt.memory

    # ---- the server ------------------------------------------------------------------------------
    def start(self) -> "Live":
        """Serve this process's control socket; a process without one still runs (one line on stderr)."""
        handlers = {cmd: self._served(cmd, h) for cmd, h in {
            "ping": self.ping, "attach": self._settled(self.attach), "detach": self._settled(self.detach),
            "swap": self._settled(self.swap), "maps": self.maps, "modules": self.modules, **self.extra}.items()}
        try:
            self.server = ControlServer(handlers).start()
        except EgpuError as e:
            print(f"egpu[{os.getpid()}]: no control socket: {e}", file=sys.stderr)
        return self

    def _settled(self, handler: Callable[[dict], dict]) -> Callable[[dict], dict]:
        """A change's handler (no_collection) that, done or failed, frees what the probes it retired no longer
        need (_release_retired): only then, as a swap put back or an attach taken back flips to them again."""
        def run(fields: dict) -> dict:
            try:
                return no_collection(handler)(fields)
            finally:
                with self.lock:
                    self._release_retired()
        return run

    def serve(self, cmd: str, handler: Any) -> None:
        """Answer control command ``cmd`` with ``handler`` from now on (and in forked children)."""
        self.extra[cmd] = handler
        if self.server is not None:
            self.server.handlers[cmd] = self._served(cmd, handler)

    def _served(self, cmd: str, handler: Any) -> Any:
        """How ``handler`` answers ``cmd``: relaxed (below); in a child forked after CUDA (after_fork), only
        where the driver serves the child (cuda_here), ping always (it asks the driver nothing)."""
        if self.forked_from is None:
            return self._relaxed(handler)
        if cmd == "ping":
            return handler

        def run(fields: dict) -> dict:
            self.cuda_here()
            return self._relaxed(handler)(fields)
        return run

    def cuda_here(self) -> None:
        """In a child forked after CUDA: ControlError saying why it has no maps, unless the driver serves it
        (a stand-in may). The driver refuses every call there (CUDA_ERROR_NOT_INITIALIZED); asked once, with
        cuInit, on the first request, so a child no one asks calls nothing."""
        if self._refused is None:
            try:
                self.rt.driver.call("cuInit", 0)
                self._refused = ""
            except EgpuError as e:
                self._refused = str(e)
        if self._refused:
            raise ControlError(f"process {os.getpid()} was forked from {self.forked_from} after CUDA started there, "
                               f"and the driver refuses CUDA in it ({self._refused}): it has no maps, modules or "
                               f"probes of its own (egpu maps {self.forked_from} reads its parent's)")

    def _relaxed(self, handler: Any) -> Any:
        """``handler`` run in relaxed capture mode: the control thread allocates and copies while the
        application's threads may be capturing graphs (driver.capture_relaxed)."""
        def run(fields: dict) -> dict:
            with self.rt.driver.capture_relaxed():
                return handler(fields)
        return run

    def stop(self) -> None:
        if self.server is not None and self.server.path.exists():
            self.server.stop()
        self.server = None

    def after_fork(self) -> None:
        """A forked child is a process of its own: its own socket (the parent's thread is not there). The
        runtime starts at a process's first CUDA work, and the driver refuses every call in a child forked
        after cuInit (a DataLoader worker's): its handlers ask it first (cuda_here) and say why not."""
        self.server = None
        self.lock = threading.RLock()
        self.forked_from = os.getppid()
        self.start()

    # ---- handlers ---------------------------------------------------------------------------------
    def ping(self, fields: dict) -> dict:
        return {"pid": os.getpid(), "uid": os.getuid(), "argv": config.argv(), "probes": list(self.names),
                "session": str(self.rt.cfg.session) if self.rt.cfg.session else None,
                "rank": config.rank(), "launches": self._launches()}

    def attach(self, fields: dict) -> dict:
        t0 = time.perf_counter()
        name = self._check_name(fields["name"])
        with self.lock:
            if name in self.names:
                raise ControlError(f"a probe named {name} is attached already")
            probe = self._load(fields["probe"], name)
            t1 = time.perf_counter()
            maps = self._new_maps(probe, None)
            loaded = {"verify": t1 - t0, "maps": time.perf_counter() - t1}
            try:
                result, _ = self._change(self._probes() + [(name, probe, maps)], t0)
            except BaseException:
                self._drop_maps(maps)
                raise
            try:
                result["uprobes"] = self.host.attach(name, probe, maps)
            except EgpuError as e:   # after the flip: its GPU programs run, and the reply must not say otherwise
                raise ControlError(f"{name}: attached, but its uprobes could not be hooked: {e}; its other "
                                   "programs run (egpu detach takes it off)") from e
            idle = uprobes.none_hooked(probe, result["uprobes"])
            if idle is not None:   # as bpftool's failed attach: nothing stays attached, the status says so
                self.host.detach(name)
                try:
                    _, snapshot = self._change([p for p in self._probes() if p[0] != name], t0)
                except EgpuError as e:   # its "nothing changed" is the take-back's: the attach stands
                    raise ControlError(f"{name}: nothing of it can run ({idle}), and taking it off again failed: "
                                       f"{e}; it stays attached, running nothing (egpu detach takes it off)") from e
                self._free(snapshot)   # its regions: retired, freed once the attach is done (_settled)
                raise ControlError(f"{name}: nothing of it can run, so it was not attached: {idle}")
        result["phases_ms"] = {**{k: round(1e3 * v, 3) for k, v in loaded.items()}, **result["phases_ms"]}
        return {"name": name, "seconds": time.perf_counter() - t0, **result}

    def detach(self, fields: dict) -> dict:
        t0 = time.perf_counter()
        with self.lock:
            name = fields.get("name")
            if name is not None and name not in self.names:
                raise ControlError(f"no probe named {name} is attached (attached: {self._listing()})")
            if not self.names:
                raise ControlError("no probe is attached")
            self._context()   # the maps first: a job whose probes run only on the host has none before
            gone = [p for p in self._probes() if name is None or p[0] == name]
            try:
                for n, probe, _ in gone:
                    self._stop(n, probe)
                result, snapshot = self._change([p for p in self._probes() if p not in gone], t0)
            except BaseException:   # nothing flipped: the probes run on as they were
                for n, probe, _ in gone:
                    self._resume(n, probe)
                raise
            host = {n: self._retire(n, probe) for n, probe, _ in gone}
            seconds = time.perf_counter() - t0
            final = self._read_snapshot(snapshot, host)
        return {"names": [n for n, _, _ in gone], "seconds": seconds, "final": final, "argv": config.argv(),
                "kernel_names": self._kernels(), **result}

    def swap(self, fields: dict) -> dict:
        t0 = time.perf_counter()
        new_name = self._check_name(fields["new_name"])
        with self.lock:
            old = fields["old"]
            if old not in self.names:
                raise ControlError(f"no probe named {old} is attached (attached: {self._listing()})")
            if new_name != old and new_name in self.names:
                raise ControlError(f"a probe named {new_name} is attached already")
            probe = self._load(fields["new_probe"], new_name)
            self._context()   # the maps first: a job whose probes run only on the host has none before
            current = self._probes()
            i = self.names.index(old)
            old_probe, old_maps = current[i][1:]
            t1 = time.perf_counter()
            maps = None
            try:
                self._stop(old, old_probe)
                maps = self._new_maps(probe, (old_probe, old_maps))
                current[i] = (new_name, probe, maps)
                loaded = {"verify": t1 - t0, "maps": time.perf_counter() - t1}
                result, snapshot = self._change(current, t0)
            except BaseException:   # nothing flipped: the old probe runs on, as it was
                if maps is not None:
                    self._drop_maps(maps, old_maps.addrs)
                self._resume(old, old_probe)
                raise
            result["phases_ms"] = {**{k: round(1e3 * v, 3) for k, v in loaded.items()}, **result["phases_ms"]}
            seconds = time.perf_counter() - t0
            try:
                result["uprobes"] = self.host.attach(new_name, probe, maps)
            except EgpuError as e:   # after the flip: its GPU programs run, and the reply must not say otherwise
                self._retire(old, old_probe)
                self._free(snapshot)
                raise ControlError(f"{new_name}: swapped in for {old}, but its uprobes could not be hooked: {e}; "
                                   "its other programs run (egpu detach takes it off)") from e
            idle = uprobes.none_hooked(probe, result["uprobes"])
            if idle is not None:   # as attach: a swap to nothing that runs is refused, the old probe put back
                gap = self._put_back(i, current[i], (old, old_probe, old_maps), snapshot, result["to_flip_ms"], t0)
                self._resume(old, old_probe)
                raise ControlError(f"{new_name}: nothing of it can run, so {old} was put back ({old} ran nothing for "
                                   f"the {gap:.1f} ms between the two flips): {idle}")
            host = {old: self._retire(old, old_probe)}
            # the new probe may write maps it took over: read the copy
            final = self._read_snapshot(snapshot, host)
        return {"old": old, "name": new_name, "seconds": seconds, "final": final, "argv": config.argv(),
                "kernel_names": self._kernels(), **result}

    def _put_back(self, i: int, new: tuple[str, Probe, DeviceMaps], old: tuple[str, Probe, DeviceMaps],
                  snapshot: Snapshot, flipped_ms: float, asked: float) -> float:
        """Undo a swap that flipped to ``new``, only uprobes of which none was hooked: a second flip serves
        ``old`` again (at index ``i``), with the regions it left (nothing wrote them since: ``new`` ran
        nothing), and ``new``'s own regions and the flips' copies are freed; the ms between the flips.
        Raises ControlError when the second flip fails: ``new`` stays, running nothing."""
        self.host.detach(new[0])
        current = self._probes()
        current[i] = old
        try:
            back, copies = self._change(current, asked)
        except EgpuError as e:
            self._retire(*old[:2])
            self._free(snapshot)
            raise ControlError(f"{new[0]}: nothing of it can run, and putting {old[0]} back failed: {e}; {new[0]} "
                               f"stays attached, running nothing (egpu swap or detach takes it off)") from e
        self._free(snapshot, copies)   # ``new``'s own regions: retired, freed once the swap is done (_settled)
        return back["to_flip_ms"] - flipped_ms

    def _free(self, *snapshots: Snapshot) -> None:
        with self.rt.driver.current(self._context()):
            for snapshot in snapshots:
                snapshot.free(self.memory)

    def _stop(self, name: str, probe: Probe) -> None:
        """Probe ``name``, about to be detached or swapped out: its host programs stop (egpu-run's probes'
        launch, host-API and egpu/uvm programs in the drainer; its uprobes, egpu-run's or hooked live, paused,
        still hooked) and what they wrote in shared maps is pushed into its regions, so the flip's snapshot
        holds every write and no push reaches a region after the flip retired it. A change that fails runs
        them again (_resume), which cannot fail; one that flips unhooks them (_retire)."""
        if self.rt.drainer is not None:
            self.rt.drainer.retire(probe, self.rt.uprobes)
        self.host.pause(name)

    def _resume(self, name: str, probe: Probe) -> None:
        """Probe ``name``, which a change that failed or was undone leaves attached, runs as before it."""
        if self.rt.drainer is not None:
            self.rt.drainer.restore(probe, self.rt.uprobes)
        self.host.resume(name)

    def _retire(self, name: str, probe: Probe) -> dict[int, Any]:
        """Probe ``name``, detached or swapped out: its paused uprobes are unhooked; the host-only maps its
        live uprobes left (LiveUprobes.retire)."""
        if self.rt.uprobes is not None:
            self.rt.uprobes.detach_probe(probe)
        return self.host.retire(name)

    def maps(self, fields: dict) -> dict:
        """A dump-like document (dump.py) of the attached probes' maps, read while the job runs."""
        return self._document(self._now())

    def mirrored(self) -> dict | None:
        """What the map mirror (mirror.py) writes: the maps document, once there are maps to read, on the
        device or the host (None before: the mirror never makes device maps)."""
        if self.rt.context is None and self.rt.drainer is None:
            return None
        with self.rt.driver.capture_relaxed():
            return self._document(self._now())

    def _now(self) -> list[dict]:
        """The attached probes' maps now, merged as the exit dump merges them (_decode). Reading makes no
        device maps: a job whose probes have only host programs (launch, host-API, uprobes) never needs
        any, and before a module loads there is nothing in them."""
        with self.lock:
            probes = self._probes()
            fetched = self._fetch(probes) if self.rt.context is not None else None
            host = [self.host.maps(n) for n, _, _ in probes]
        return self._decode(probes, fetched, host)

    def _document(self, probes: list[dict]) -> dict:
        return {"version": dump.VERSION, "pid": os.getpid(), "argv": config.argv(),
                "rank": config.rank(), "time": time.time(), "probes": probes,
                "error": None, "kernels": self._kernels(),
                "modules": self._module_reports(), "stats": self._stats()}

    def modules(self, fields: dict) -> dict:
        with self.lock:
            return {"pid": os.getpid(), "probes": list(self.names), "modules": self._module_reports(),
                    "stats": self._stats(), "sass": self.rt.sass.stats()}

    # ---- hooks from the runtime -----------------------------------------------------------------
    def route(self, mod: "Module", name: str, handle: int) -> bool:
        """Route a kernel handle found after a copy started serving its module; False: not ours."""
        if mod.serving is None:
            return False
        flip = self._flip(mod, mod.serving, name, handle)
        fn = self.rt.lib.egpu_shim_register_launch_id if flip.launch_id else self.rt.lib.egpu_shim_register
        args = (flip.nparams, flip.param_offset) if flip.launch_id else ()
        if fn(self.rt.ffi.cast("void *", handle), self.rt.ffi.cast("void *", flip.repl or 0), *args):
            print(f"egpu: {name}: the shim's function table is full", file=sys.stderr)
        mod.registered.add(handle)
        return True

    def loaded(self, mod: "Module") -> None:
        """A load that was instrumented under other probes than the attached ones (a swap ran while the
        driver loaded it): serve it from a copy with the attached probes (no kernel handle exists yet)."""
        if mod.ptx is None or mod.generation == self.generation or mod.elsewhere:
            return
        with self.lock:
            with self.rt.driver.current(self._context()):
                mod.serving = self._copy_for(mod, self._probes())
                mod.moved = self._moved(mod, mod.serving)
            if mod.moved:  # the application has no handle of it yet: none of its copies can be in flight
                self._publish_moved()

    def unloaded(self, mod: "Module") -> None:
        """A module is gone: its addresses are the driver's to hand out again, no longer moved."""
        if mod.moved:
            mod.moved = []
            self._publish_moved()

    # ---- the change of probes ---------------------------------------------------------------------
    def _probes(self) -> list[tuple[str, Probe, DeviceMaps]]:
        return list(zip(self.names, self.rt.probes, self.rt.maps or [None] * len(self.rt.probes)))

    def _change(self, new: list[tuple[str, Probe, DeviceMaps]], asked: float) -> tuple[dict, Snapshot]:
        """Serve every module with ``new``'s probes in one flip; what changed, and the maps of the probes
        that left as the flip found them (read them with _read_snapshot). ``to_flip_ms``: from ``asked``
        (the request, perf_counter) to the flip's end, when the next launch runs the new probes (what
        follows, publish and unload, delays the reply, not them). ``phases_ms``: instrument (the
        PTX copies made: rewrite and the driver's load and JIT), sass (staging the SASS generation: its
        table block, and under ``sass`` its translate, image and stage), flip (egpu_shim_swap: the hold,
        the drain, state copies, the SASS commit, whose drain and re-patch ``sass`` shows), publish,
        unload (copies no flip can choose again), gc (the interpreter's collections meanwhile, on any
        thread: they hold the GIL the change needs)."""
        rt = self.rt
        collected = GcPauses()
        t0 = time.perf_counter()
        ctx = self._context()
        plan: list[tuple[Module, Copy | None, list[tuple[int, int, int]]]] = []
        copies: list[tuple[int, int, int]] = []
        flips: list[Flip] = []
        failed: list[str] = []
        kept = {id(p) for _, p, _ in new}
        snapshot = Snapshot([(n, p, m) for n, p, m in self._probes() if id(p) not in kept and m is not None])
        with rt.driver.current(ctx):
            for mod in self._live_modules():
                target = self._target(mod, new, failed)
                plan.append((mod, target, self._moved(mod, target)))
                copies += self._state_copies(mod, target)
                for handle, name in self._handles(mod).items():
                    flips.append(self._flip(mod, target, name, handle))
            copies += snapshot.stage(self.memory)
            ts = time.perf_counter()
            try:
                sass_note, sass_phases = self._stage_sass(new)
            except BaseException:   # refused, nothing changed: the copies staged for the flip are not made
                snapshot.free(self.memory)
                raise
        t1 = time.perf_counter()
        try:
            launches = self._flip_all(ctx, copies, flips, [r for _, _, rows in plan for r in rows])
        except Exception:   # nothing published: nothing staged or loaded for ``new`` may stay
            with rt.driver.current(ctx):
                snapshot.free(self.memory)
                self._unstage_sass()
            self._unload_dead(ctx)  # the copies loaded for ``new``: nothing ever pointed at them
            collected.stop()
            raise
        t2 = time.perf_counter()
        with rt.driver.current(ctx):
            retired_block = rt.sass.committed()
            if retired_block is not None:
                self.memory.free(retired_block)
        old = {id(p): (p, m) for _, p, m in self._probes()}
        self.retired += [pm for i, pm in old.items() if i not in kept]
        for mod, target, moved in plan:
            mod.serving, mod.moved = target, moved
        self.names = [n for n, _, _ in new]
        rt.probes[:] = [p for _, p, _ in new]
        rt.maps[:] = [m for _, _, m in new]
        rt.specs[:] = [s for p in rt.probes for s in p.specs]
        self.generation += 1
        self.flips += 1
        t3 = time.perf_counter()
        unloaded = self._unload_dead(ctx)
        phases = {"instrument": ts - t0, "sass": t1 - ts, "flip": t2 - t1, "publish": t3 - t2,
                  "unload": time.perf_counter() - t3, "gc": collected.stop()}
        rt.exit.arm()
        instrumented = sum(1 for mod, t, _ in plan for k in (t.kernels if t else mod.kernels).values()
                           if k.status == "instrumented")
        return {"modules": len(plan), "kernels": instrumented, "launches": launches, "failed": failed,
                "to_flip_ms": round(1e3 * (t2 - asked), 3),
                "probes": list(self.names), "unloaded": unloaded,
                "sass": {**self._sass_report(sass_note), **sass_phases},
                "phases_ms": {k: round(1e3 * v, 3) for k, v in phases.items()}}, snapshot

    def end_counting(self) -> list[str]:
        """One flip that serves the probes attached now with every program in the kernels, as any flip does
        (egpu_shim_swap ends the counting at the launch): modules instrumented without the programs launches
        counted get copies with them (_target), the SASS back end a generation that patches them. The modules
        whose copy the driver refused (they run without probes after it). Raises ControlError (nothing
        changed)."""
        result, _ = self._change(self._probes(), time.perf_counter())   # no probe leaves: nothing to snapshot
        return result["failed"]

    def _stage_sass(self, new: list[tuple[str, Probe, DeviceMaps]]) -> tuple[str, dict]:
        """Stage the SASS back end's generation for ``new`` (the flip commits it): "" when staged, else
        why SASS-only kernels keep what they run (the reply says it); and the staging's phases
        ({"phases_ms": ...}, or none). Raises ControlError for a probe set whose patch image cannot be
        built: nothing changes then. In the maps' context."""
        rt = self.rt
        why = rt.sass.unavailable()
        if why:
            return why, {}
        objects = [p.obj for _, p, _ in new]
        sites = has_sites(objects)
        current = rt.sass.module()
        if not sites and (current is None or not current.programs):
            return NO_PROGRAMS, {}
        tables = table_block(self.memory, [m for _, _, m in new]) if sites else None
        try:
            staged = rt.sass.stage(objects, rt._device_sm(), tables)
        except EgpuError as e:
            if tables is not None:
                self.memory.free(tables)
            raise ControlError(f"SASS back end: {e}; nothing changed") from e
        return "", {"phases_ms": staged.phases_ms}

    def _unstage_sass(self) -> None:
        staged = self.rt.sass.staged
        self.rt.sass.unstage()
        if staged is not None and staged.tables is not None:
            self.memory.free(staged.tables)

    def _sass_report(self, note: str) -> dict:
        """What the SASS back end runs after a flip: modules patched of those loaded, the generation, the
        re-patch time; or why it was left as it was."""
        stats = self.rt.sass.stats()
        report = {"generation": stats["generation"], "modules_patched": stats["patched_now"],
                  "modules": stats["modules_loaded"], "patch_ms": round(stats["flip_us"] / 1e3, 3),
                  "drain_ms": round(stats["drain_us"] / 1e3, 3), "asked": stats["asked"]}
        return report if not note else {**report, "unchanged": note}

    def _unload_dead(self, ctx: int) -> int:
        """Unload every dead copy (loaded in context ``ctx``); how many went. Dead: not serving, and made
        with a probe no longer attached, so no flip can choose it again (a re-attach loads a new Probe;
        copies of the original, probes ``()``, stay for reuse). Safe for every copy none of whose
        functions escaped the launch hooks (egpu_shim_escaped): launches reach it only through a target,
        and the flip that moved the last target off it drained the context. A copy the driver does not
        unload stays, and is tried again after the next flip."""
        attached = {id(p) for p in self.rt.probes}
        unloaded = 0
        try:
            with self.rt.driver.current(ctx):
                for mod in self._live_modules():
                    for c in [c for c in mod.copies if c is not mod.serving and not set(c.probes) <= attached]:
                        if not self._escaped(mod, c):
                            self.rt.driver.unload(c.handle, mod.library)
                            mod.copies.remove(c)
                            unloaded += 1
        except EgpuError as e:  # the flip stands; what is left goes after the next one
            print(f"egpu: retired module copies stay loaded: {e}", file=sys.stderr)
        return unloaded

    def _release_retired(self) -> None:
        """Free the regions of retired probes nothing can reach any more, and forget the probes: a probe
        attached again is live, not retired; one that a copy still loaded was made with (escaped the hooks,
        of a module unloaded, not unloaded yet) stays, as do egpu-run's (its ring readers and host programs
        keep their regions); the others' regions go but those a probe still kept takes over (swap). Without
        this every attach and detach kept a probe's regions (its trace ring alone is ~2 MB) until exit."""
        attached = {id(p) for p in self.rt.probes}
        named = {i for mod in self.rt.loads for c in mod.copies for i in c.probes}
        startup = {id(m) for m in self.rt.startup_maps}
        unreachable = [(p, m) for p, m in self.retired if id(p) not in attached | named and id(m) not in startup]
        gone = {id(p) for p, _ in unreachable}
        self.retired = [(p, m) for p, m in self.retired if id(p) not in attached | gone]
        held = {a for m in [*self.rt.maps, *(m for _, m in self.retired)] for a in m.addrs}
        freed = {a for _, m in unreachable for a in m.addrs if a not in held}
        if not freed:
            return
        try:
            with self.rt.driver.current(self._context()):
                for addr in freed:
                    self.rt.driver.free(addr)
        except EgpuError as e:   # the change stands; the memory stays taken
            print(f"egpu: the maps of detached probes stay allocated: {e}", file=sys.stderr)

    def _escaped(self, mod: "Module", copy: Copy) -> bool:
        """Whether a function of ``copy`` went where launches bypass the hooks (a graph kernel node, a
        stream capture): such a graph may launch it at any time. Only ``mod``'s kernel handles were
        ever retargeted to it."""
        ffi, lib = self.rt.ffi, self.rt.lib
        return any(lib.egpu_shim_escaped(ffi.cast("void *", h), ffi.cast("void *", copy.functions[name]))
                   for h, name in self._handles(mod).items() if name in copy.functions)

    def _flip_all(self, ctx: int, copies: list[tuple[int, int, int]], flips: list[Flip],
                  moved: list[tuple[int, int, int]]) -> int:
        ffi, lib = self.rt.ffi, self.rt.lib
        c, m = self._array(COPY, copies), self._array(MOVED, moved)
        f = ffi.new("struct egpu_flip[]", max(len(flips), 1))
        for i, fl in enumerate(flips):
            f[i].orig = ffi.cast("void *", fl.orig)
            f[i].repl = ffi.cast("void *", fl.repl or 0)
            f[i].nparams, f[i].param_offset, f[i].launch_id = fl.nparams, fl.param_offset, int(fl.launch_id)
        launches = ffi.new("unsigned long long *")
        r = swap_outside_captures(self.rt, ctx, c, len(copies), f, len(flips), m, len(moved), launches)
        if r == lib.EGPU_SWAP_CAPTURING:
            raise ControlError(f"{CAPTURING}; nothing changed, try again once it has ended")
        if r:
            raise ControlError(f"the flip failed: {swap_failure(self.rt, r)}: nothing changed")
        return int(launches[0])

    def _array(self, struct: tuple[str, tuple[str, ...]], rows: list[tuple[int, ...]]) -> Any:
        """``rows`` as a C array of ``struct`` (COPY, MOVED), one element at least (cffi's arrays are
        never empty)."""
        ctype, fields = struct
        out = self.rt.ffi.new(f"{ctype}[]", max(len(rows), 1))
        for i, row in enumerate(rows):
            for name, v in zip(fields, row):
                setattr(out[i], name, v)
        return out

    def _publish_moved(self) -> None:
        """The shim's table of moved variables, now, from every module's (outside a flip)."""
        rows = [r for mod in self._live_modules() for r in mod.moved]
        if self.rt.lib.egpu_shim_move(self._array(MOVED, rows), len(rows)):
            print("egpu: out of memory for the table of moved module variables", file=sys.stderr)

    def _target(self, mod: "Module", probes: list, failed: list[str]) -> Copy | None:
        """The image ``mod`` must run for ``probes``: None for the application's own image, else a copy."""
        if mod.elsewhere:   # a copy would load in the maps' context, where another context's launches cannot run it
            return None     # (its table unfilled, its own image runs no probe)
        if tuple(id(p) for _, p, _ in probes) == tuple(id(p) for p in mod.probes) and not mod.counted:
            return None   # the image the application loaded has exactly these probes (or none)
        try:
            return self._copy_for(mod, probes)
        except EgpuError as e:  # the driver refused it: this module runs without probes
            failed.append(f"{mod.api} {mod.image}: {e}")
            return self._copy_for(mod, [])

    def _copy_for(self, mod: "Module", probes: list) -> Copy | None:
        """A copy of ``mod`` instrumented with ``probes``, loaded, its map tables filled (a copy of the
        same probes is reused); None when none matches and the application's image is the original."""
        res = instrument(mod.ptx, [s for _, p, _ in probes for s in p.specs], self.rt.cfg.kernel)
        kernels = {k.name: k for k in res.kernels}
        used = tuple(id(p) for _, p, _ in probes) if any(k.status == "instrumented" for k in res.kernels) else ()
        if not used and not mod.probes:
            return None
        for c in mod.copies:
            if c.probes == used:
                return c
        text = res.text if used else mod.ptx
        handle = self.rt.driver.load(text.rstrip("\0").encode() + b"\0", mod.library, mod.jit)
        copy = Copy(handle, used, kernels)
        mod.copies.append(copy)
        for _, p, maps in probes:
            if id(p) in used:
                address = self.rt.driver.global_address(handle, p.table, mod.library)
                if address is not None:
                    self.memory.htod(address, maps.table())
        return copy

    def _state_copies(self, mod: "Module", target: Copy | None) -> list[tuple[int, int, int]]:
        """(dst, src, size) of every module variable, from the image serving now to ``target``."""
        src = mod.serving.handle if mod.serving is not None else mod.handle
        dst = target.handle if target is not None else mod.handle
        if src == dst or src is None or dst is None:
            return []
        return [(b, a, size) for a, b, size in self._variables(mod, src, dst)]

    def _moved(self, mod: "Module", target: Copy | None) -> list[tuple[int, int, int]]:
        """(application's address, ``target``'s, size) of every module variable: where the application's
        copies must go while ``target`` serves (none while its own image does)."""
        return self._variables(mod, mod.handle, target.handle) if target is not None else []

    def _variables(self, mod: "Module", a: int, b: int) -> list[tuple[int, int, int]]:
        """(address in image ``a``, address in image ``b``, size) of every module variable both define."""
        if mod.state is None:
            mod.state = module_globals(mod.ptx)
        out = []
        for name in mod.state:
            x = self.rt.driver.global_symbol(a, name, mod.library)
            y = self.rt.driver.global_symbol(b, name, mod.library)
            if x and y:
                out.append((x[0], y[0], min(x[1], y[1])))
        return out

    def _flip(self, mod: "Module", target: Copy | None, name: str, handle: int) -> Flip:
        """What launches of the application's ``handle`` (kernel ``name``) run under ``target``."""
        if target is None:
            k = mod.kernels.get(name)
            if mod.probes and k is not None and k.status == "instrumented":
                return Flip(handle, handle, k.nparams, k.launch_param_offset or 0, True)
            return Flip(handle, None)
        fn = target.functions.get(name)
        if fn is None:
            fn = target.functions[name] = self.rt.driver.function(target.handle, name, mod.library)
        k = target.kernels.get(name)
        if k is not None and k.status == "instrumented" and target.probes:
            return Flip(handle, fn, k.nparams, k.launch_param_offset or 0, True)
        return Flip(handle, fn)

    def _handles(self, mod: "Module") -> dict[int, str]:
        return {h: n for h, (m, n) in self.rt.functions.items() if m is mod}

    def _live_modules(self) -> list["Module"]:
        seen: dict[int, Module] = {}
        for m in self.rt.modules.values():
            if m.ptx is not None and m.handle is not None:
                seen.setdefault(id(m), m)
        return list(seen.values())

    # ---- probes and maps --------------------------------------------------------------------------
    def _check_name(self, name: str) -> str:
        if not name_ok(name):
            raise ControlError(f"bad probe name {name!r}: {NAME_RULE}")
        return name

    def _load(self, data: bytes, name: str) -> Probe:
        """Write the object where the exit dump can name it, then load, verify and translate it here. The
        path (which names the probe's PTX symbols: module.object_tag) is the object's content and name,
        so a probe attached again makes the same PTX, which the driver's JIT cache has compiled. The last
        VERIFIED_KEPT objects are kept verified and translated: attached again, they skip that too."""
        if self._workdir is None:
            self._workdir = self.rt.cfg.session or Path(tempfile.mkdtemp(prefix="egpu-live-"))
        path = self._workdir / f"{os.getpid()}.{hashlib.sha256(data).hexdigest()[:16]}.{name}.bpf.o"
        probe = self._verified.pop(path, None)
        if probe is None:
            path.write_bytes(data)
            probe = load_probe(path)
            host_run = [p.attach.kind for p in probe.obj.programs if p.attach.kind in HOST_RUN]
            if host_run:
                what = {"launch": "launch", "uvm": "unified-memory"}.get(host_run[0], "host-API")
                raise ControlError(f"{name}: {what} programs (egpu/{host_run[0]}/...) cannot be attached to a "
                                   "running job yet")
            why = uprobes.live_refusal(probe)
            if why is not None:
                raise ControlError(f"{name}: {why}")
        self._verified[path] = probe
        while len(self._verified) > VERIFIED_KEPT:
            del self._verified[next(iter(self._verified))]
        return replace(probe)   # a probe of its own: its copies and maps are found by its identity

    def _context(self) -> int:
        rt = self.rt
        with rt._maps_lock:
            if rt.context is None:
                rt._allocate_maps()
        return rt.context

    def _new_maps(self, probe: Probe, old: tuple[Probe, DeviceMaps] | None) -> DeviceMaps:
        """Device maps for ``probe``; regions of maps ``old`` declares identically are taken over."""
        ctx = self._context()
        driver = self.rt.driver
        with driver.current(ctx):
            ncpu = driver.attribute(ATTR_SM_COUNT, driver.device())
            devmaps.check_room(probe.obj.maps, ncpu, driver.free_memory(), devmaps.host_available())
            maps = DeviceMaps(self.memory, MapsState(probe.obj.maps), ncpu)
            if old is not None:
                old_probe, old_maps = old
                for i, m in enumerate(probe.obj.maps):
                    j = next((j for j, o in enumerate(old_probe.obj.maps) if same_map(m, o)), None)
                    if j is not None:
                        driver.free(maps.addrs[i])
                        maps.addrs[i] = old_maps.addrs[j]
        return maps

    def _drop_maps(self, maps: DeviceMaps, kept: Sequence[int] = ()) -> None:
        """Free the regions made for a probe a change failed to attach, but those in ``kept`` (taken over
        from the probe a swap leaves attached)."""
        with self.rt.driver.current(self._context()):
            for addr in maps.addrs:
                if addr not in kept:
                    self.rt.driver.free(addr)

    def _read_snapshot(self, snapshot: "Snapshot", host: dict[str, dict[int, Any]]) -> list[dict]:
        """The maps a flip copied (exact: no launch ran between the drain and the copy), then freed; ``host``:
        the leaving probes' live uprobes' host-only maps, by name (LiveUprobes.detach)."""
        try:
            fetched = self._fetch(snapshot.probes, snapshot.addrs)
        finally:
            self._free(snapshot)
        return self._decode(snapshot.probes, fetched, [host.get(n, {}) for n, _, _ in snapshot.probes])

    def _fetch(self, probes: list[tuple[str, Probe, DeviceMaps]],
               addrs: list[list[int]] | None = None) -> list[list[bytes]]:
        """Each probe's region images, copied from the device (under Live.lock: a change frees regions), from
        its regions or from copies of them at ``addrs`` (one list per probe)."""
        if not probes:
            return []
        out = []
        with self.rt.driver.current(self._context()):
            for k, (_, _, maps) in enumerate(probes):
                out.append([self.memory.dtoh(addr, lay.region_size(maps.ncpu))
                            for addr, lay in zip(addrs[k] if addrs else maps.addrs, maps.layouts)])
        return out

    def _decode(self, probes: list[tuple[str, Probe, DeviceMaps]], fetched: list[list[bytes]] | None,
                host: list[dict[int, Any]]) -> list[dict]:
        """Each probe's maps as the exit dump has them ({"name", "path", "maps", "trace"}): _fetch's images
        (None: no device maps yet) with the host sides merged in by the exit dump's own function
        (launches.dump_states: launch, host-API and uprobe programs' maps, the drainer's; ``host``, by probe,
        the live uprobes' host-only maps); with neither, every map as it begins. Outside Live.lock for maps
        and the mirror: decoding a large map is Python that competes with the application's threads for the
        GIL, and a change waiting for the lock would wait for it (on the H200 4 of 30 detaches spent 75-160
        ms before their change began; the likely holder, the mirror reading a 32,768-entry hash map every
        second)."""
        device = None if fetched is None else [apply_images(MapsState(probe.obj.maps), images)
                                               for (_, probe, _), images in zip(probes, fetched)]
        states = (launches.dump_states(self.rt.drainer, [p for _, p, _ in probes], device, host, self.rt.launch_counts)
                  or [MapsState(p.obj.maps) for _, p, _ in probes])
        return [{"name": name, "path": str(probe.path), **dump.state_contents(state)}
                for (name, probe, _), state in zip(probes, states)]

    def _listing(self) -> str:
        return ", ".join(self.names) or "none"

    @staticmethod
    def _unique(names: list[str]) -> list[str]:
        out: list[str] = []
        for n in names:
            k, m = 1, n
            while m in out:
                k += 1
                m = f"{n}.{k}"
            out.append(m)
        return out

    # ---- reports --------------------------------------------------------------------------------
    def _module_reports(self) -> list[dict]:
        names = {id(p): n for n, p in zip(self.names, self.rt.probes)}
        out = []
        for mod in self.rt.loads:
            r = mod.report()
            if mod.serving is not None:
                ids = mod.serving.probes
                r["kernels"] = [[k.name, k.status, k.reason] for k in mod.serving.kernels.values()]
                r["status"] = "instrumented" if ids else "untouched"
            else:
                ids = tuple(id(p) for p in mod.probes)
            r["probes"] = [names[i] for i in ids if i in names]
            out.append(r)
        return out

    def _stats(self) -> dict:
        from egpu_preload.runtime.instrumenter import STATS
        stats = self.rt.ffi.new("struct egpu_stats *")
        self.rt.lib.egpu_shim_stats(stats)
        return {f: int(getattr(stats, f)) for f in STATS}

    def _kernels(self) -> list[list]:
        return self.rt.id_names()

    def _launches(self) -> int:
        return self._stats()["launches"]


class GcPauses:
    """Seconds the interpreter spent collecting garbage from now to ``stop()``, on any thread."""

    def __init__(self) -> None:
        self.total, self._began = 0.0, 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        elif self._began:
            self.total += time.perf_counter() - self._began

    def stop(self) -> float:
        if self._on in gc.callbacks:
            gc.callbacks.remove(self._on)
        return self.total


def start(rt: "Runtime") -> Live:
    """Live control for ``rt``: its socket served now and in every forked child."""
    live = Live(rt).start()
    os.register_at_fork(after_in_child=live.after_fork)
    return live

