"""The runtime egpu-run puts in every process of the job (EGPU_RUNTIME names this module; importing it
registers the instrumenter with hooks.register and does nothing else).

- Probes (config.EGPU_PROBES) are loaded, verified and translated once, when the first hook calls in.
- A module or library load: the PTX of the image (PTX text, or the fatbin's best PTX for the device) is
  instrumented and handed back as the replacement; the application's handles are then the instrumented
  module's. Nothing matched: None, the original loads unchanged. No PTX (cubin, SASS-only fatbin):
  recorded as "SASS only". The driver refused the replacement: "failed: driver JIT error N: " and the first
  lines of the driver's error log (ptxas's errors; the shim asks for it beside the app's JIT options), and the
  shim has loaded the original. A refused PTX link input has no log of egpu's (cuLinkAddData takes none).
- After an instrumented load: the device maps (one set per probe object, allocated on the first
  instrumented load in that load's context and shared by every module) go into the module's map
  table. Should that fail, the original is loaded beside it and every kernel handle is redirected to
  it, so the application never runs a probe without maps.
- Kernel handles (cuModuleGetFunction, cuLibraryGetKernel, cuKernelGetFunction) of instrumented
  kernels are registered with the shim to get the launch id appended (rewrite.py's launch contract).
- At exit (once, in the process that loaded the probes, while CUDA is still up): synchronize, read the
  maps back and write the dump (dump.py) into the session directory.
- Before an exec (shim/process.c; none runs an exit handler): synchronize and write the maps as ``egpu maps``
  reads them into the session (dump.write_exec), every thread left running but the trace, whose file is closed
  as at exit (streaming.py), and the map mirror, whose segment goes with its started mark (dump.mark_started):
  the next image owes a dump of its own, and egpu-run names it when it dies without one. A failed exec withdraws
  that dump, so the maps count on into the next exec's or the exit's, each launch once, and drains the rings on
  into a new trace file.
- Every process serves a control socket (live.py): probes attached, detached and swapped while it
  runs, maps and modules read. So the original PTX of every load is kept, even with no probe at all.
- Once maps exist, a thread copies them into shared memory every config.mirror seconds (mirror.py),
  where ``egpu maps PID --mirror`` reads them without asking the process; with config.trace another
  drains every ring into the trace file while kernels run (streaming.py).
- A child forked after the runtime started was forked after CUDA, where the driver refuses every call:
  no thread of ours is made again in it (no mirror, no drain), and its control socket answers every
  request but ping with why (live.Live.after_fork).

- PTX link inputs (cuLinkAddData/AddFile: numba, CuPy's linker) are instrumented like PTX loads; the
  cubin cuLinkComplete hands out is remembered by its digest, and the module later loaded from those
  bytes is adopted as instrumented (tables filled, launch ids appended).

Limits: one context holds the maps. A module loaded in another context (another device's, a second one on
the same device) and a library's copy in another context keep their tables unfilled, so their kernels run
without probes there (a probe finding its table unfilled returns at once); nothing in them reaches the maps'
memory, which would be an illegal address for another device's kernel. egpu-run says at exit how many loads
ran so (Module.elsewhere; the SASS back end counts its launches elsewhere, shim/sass.c); a library's copy in
another context is not counted. A module
linked from PTX keeps the probes it was linked with: live attach/detach/swap leave it (re-linking it
would need every input of the link, and the shim sees only the PTX ones), and should its map table
not fill, no original can be loaded beside it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import os
import resource
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from egpu_preload import fatbin
from egpu_preload.bpf.ctx import kernel_id
from egpu_preload.cow import live as cow_live
from egpu_preload.errors import EgpuError
from egpu_preload.fatbin import ImageKind
from egpu_preload.maps import MapsState
from egpu_preload.runtime import (config, dump, durations, hooks, launches, live, mirror, ptxas, sass, streaming,
                                  uprobes)
from egpu_preload.runtime.config import Config, from_env
from egpu_preload.runtime.driver import (ATTR_CC_MAJOR, ATTR_CC_MINOR, ATTR_SM_COUNT, ContextMemory, Driver,
                                         jit_refusal)
from egpu_preload.runtime.exit_hook import ExitHook
from egpu_preload.runtime.launch_counts import LaunchCounts
from egpu_preload.runtime.probes import Probe, load_probes
from egpu_preload.translate import devmaps
from egpu_preload.translate.demangle import matches
from egpu_preload.translate.devmaps import DeviceMaps
from egpu_preload.translate.rewrite import KernelStatus, instrument, launches_on_device
from egpu_preload.translate.sass_patch import has_sites

LIBRARY_APIS = ("LIBRARY_LOAD_DATA", "LIBRARY_LOAD_FROM_FILE")
COUNTED = "counted at the launch"   # a kernel whose every program a launch evaluates (launch_eval.py)
STATS = ("launches", "redirected", "records", "dropped", "untracked", "python_calls")


@dataclass
class Module:
    """One module or library load the runtime saw, and what became of it."""

    api: str
    call: int
    image: str                                   # ptx | fatbin compute_XX | cubin | ...
    status: str                                  # instrumented | untouched | SASS only | failed: why
    kernels: dict[str, KernelStatus] = field(default_factory=dict)
    original: bytes | None = None                # the app's image, until the load is done
    beside: int | None = None                    # the original loaded beside, when the maps could not go in
    registered: set[int] = field(default_factory=set)  # kernel handles given to the shim
    # live control (live.py): the original PTX, kept for re-instrumenting; the app's handle; the probes
    # its image was instrumented with; the copy serving its launches (None: the app's own image)
    ptx: str | None = None
    handle: int | None = None
    probes: tuple[Probe, ...] = ()
    serving: Any = None
    copies: list[Any] = field(default_factory=list)
    state: list[str] | None = None               # its module variables (modstate.py), once needed
    moved: list[tuple[int, int, int]] = field(default_factory=list)  # (app's address, serving copy's, size)
    generation: int = 0                          # live.generation when it was instrumented
    jit: tuple[tuple[int, int], ...] = ()        # the app's JIT options of a number (option, value): its copies'
    backend: str = ""                            # ptx | sass: the back end serving its kernels
    timing: dict[str, float] = field(default_factory=dict)  # ms: rewrite, driver (the replacement's load)
    replaced_at: float | None = None             # perf_counter when the replacement went to the driver
    context: int | None = None                   # a module's context (its load's); None: a library, in every one
    elsewhere: bool = False                      # loaded in another context than the maps': runs no probe
    # the PTX back end's: kernels of the app's image whose launches count the programs a launch evaluates,
    # which the image was instrumented without (Runtime._ptx_counts)
    counted: frozenset[str] = frozenset()

    @property
    def library(self) -> bool:
        return self.api in LIBRARY_APIS

    def report(self) -> dict[str, Any]:
        kernels = [[k.name, "instrumented", COUNTED] if k.name in self.counted and k.status == "untouched"
                   else [k.name, k.status, k.reason] for k in self.kernels.values()]
        status = "instrumented" if self.counted and self.status == "untouched" else self.status
        return {"api": self.api, "call": self.call, "image": self.image, "status": status,
                "backend": self.backend or ("ptx" if self.counted else ""), "timing": dict(self.timing),
                "elsewhere": self.elsewhere, "kernels": kernels}


class StartError(EgpuError):
    """The runtime's start failed partway, and what had started was stopped (Runtime._abandon): why."""


class Runtime:
    """The Instrumenter the shim's hooks call (hooks.Instrumenter)."""

    def __init__(self, cfg: Config, ffi: Any, lib: Any) -> None:
        self.cfg = cfg
        self.ffi, self.lib = ffi, lib
        self.driver = Driver(ffi, lib)
        t0 = time.perf_counter()
        self.probes: list[Probe] = load_probes(cfg.probes, wait=cfg.on_full == "wait")
        self.probes_ms = (time.perf_counter() - t0) * 1e3  # load, verify, translate: once per process
        self.specs = [s for p in self.probes for s in p.specs]
        # id(probe) -> the lanes launches add to for its programs evaluated at the launch (the start-up probes')
        self.launch_counts = {id(p): LaunchCounts(ffi, p) for p in self.probes if p.evaluated}
        # what the PTX back end instruments modules with while launches count (_ptx_counts)
        self.uncounted = [s for p in self.probes for s in p.specs if s.program not in p.evaluated]
        self.loads: list[Module] = []                     # every load, in order (the report)
        self.modules: dict[int, Module] = {}              # module/library handle -> its load
        self.functions: dict[int, tuple[Module, str]] = {}  # kernel/function handle -> (load, name)
        self.kernel_names: dict[int, str] = {}
        self._pending: dict[int, Module] = {}             # call -> load, until module_loaded
        self.links: dict[int, list[Module]] = {}          # link state -> its instrumented PTX inputs
        self.linked: dict[str, list[Module]] = {}         # sha256 of a linked cubin -> those inputs
        self.context: int | None = None                   # where the maps live
        self.maps: list[DeviceMaps] = []                  # the attached probes' (live.py changes them)
        self.startup_maps: tuple[DeviceMaps, ...] = ()    # egpu-run's probes', in their order, detached or not
        self.memory: ContextMemory | None = None          # the maps context's memory and stream
        self.clock: int | None = None                     # host probes' offset once on %globaltimer (align_clocks)
        self.streaming: streaming.Streaming | None = None  # --trace: the rings drained while kernels run
        self._sm: dict[int, int] = {}                     # device -> compute capability (90)
        self._maps_lock = threading.Lock()                # loads on two threads: one set of maps
        self.exit = ExitHook(self.finish)
        self._exec_dump: Path | None = None               # this image's dump, written before an exec (exec_image)
        self._exec_trace: dict[str, Any] | None = None    # and its trace file's, closed for it
        self.closed_traces: list[dict[str, Any]] = []     # trace files closed before execs that failed
        self.after_exec = False                           # an image an exec made: its trace file's name (claim)
        self.drainer: launches.Drainer | None = None
        self.uprobes: uprobes.Uprobes | None = None
        self.live: live.Live | None = None
        self.mirror: mirror.Mirror | None = None
        try:
            self._start()
        except Exception as e:
            why = _why_not(e)   # before the descriptors it had are given back
            self._abandon(why)
            raise StartError(why) from None
        except BaseException as e:
            self._abandon(f"{type(e).__name__}")
            raise

    def _start(self) -> None:
        """The runtime's parts started, each on what the ones before it made."""
        cfg, lib = self.cfg, self.lib
        if cfg.session is not None:
            # its dump is due: egpu-run names it if none comes; an earlier image of the process left a dump before
            # it exec'd (or, owing none, its mark)
            self.after_exec = dump.mark_started(cfg.session) or dump.exec_dumps(cfg.session, os.getpid()) > 0
            lib.egpu_shim_exec_owner(os.getpid())         # and before an exec of this process (only)
        self.drainer = launches.attach(self)              # launch probes: a thread drains the shim's records
        self.uprobes = uprobes.attach(self)               # host uprobes, on the drainer's maps in C
        if cfg.trace is not None and self.drainer is not None and self.drainer.outputs:
            self.streaming = self._trace()                # host programs' records go there from the start
        uvm_sink = self.drainer.deliver_uvm if self.drainer and self.drainer.probes.has_uvm else None
        if (cfg.durations or uvm_sink) and not has_sites([p.obj for p in self.probes]):
            # CUPTI needs the driver's one tool slot; standby would hold it only for a later SASS attach.
            # (This runs inside a hook, where the shim's CUPTI wrappers pass straight through.)
            lib.egpu_sass_yield(b"egpu-run's CUPTI (--durations, --perfetto or egpu/uvm)")
        self.durations = (durations.start(cfg.timeline, cfg.durations, uvm_sink)  # CUPTI: kernels, copies, UVM
                          if cfg.durations or uvm_sink else None)
        self.live = live.start(self)                      # the control socket: attach, detach, swap, maps
        self.mirror = mirror.start(self.live.mirrored, cfg.mirror, cfg.session)  # the maps in shared memory
        self.cow = cow_live.attach(self)                  # checkpoint and restore (cow/), a --restore pending
        self.sass = sass.SassBackend(cfg, self.probes, self.ffi, lib)  # modules without PTX (shim/sass.c)
        self.sass_modules: dict[int, Module] = {}         # sanitizer module handle -> its patched kernels

    def _abandon(self, why: str) -> None:
        """A start that failed partway (out of descriptors under a low RLIMIT_NOFILE, say): the hooks never see this
        runtime, so it owes no exit dump (the hook's dump of a half-made runtime failed, on an attribute it never
        got), nor egpu-run a dump of it (its started mark replaced by one that says ``why``), and what had started
        stops: no thread of it runs on."""
        self.exit.done = True
        parts = ((self.live, "stop"), (self.mirror, "stop"), (self.drainer, "stop"), (self.uprobes, "detach"))
        for part, stop in parts:
            if part is not None:
                with contextlib.suppress(Exception):   # the start's own failure is the one to tell
                    getattr(part, stop)()
        with contextlib.suppress(Exception):
            self._close_trace()
        if self.cfg.session is not None:   # once their descriptors are back: out of them, the mark needs one
            dump.mark_no_start(self.cfg.session, why)

    # ---- hooks ---------------------------------------------------------------------------------------
    def module_load(self, image: hooks.ModuleImage) -> bytes | None:
        with self.live.lock:  # one set of probes from instrumenting to filling the tables
            return self._module_load(image)

    def _module_load(self, image: hooks.ModuleImage) -> bytes | None:
        link = image.api.startswith("LINK_")
        mod = Module(image.api, image.call, "ptx link input" if link else image.kind.value, "untouched")
        mod.jit = self.driver.load_jit()
        self._pending[image.call] = mod
        try:
            text, image_name = self._ptx(image)
            mod.image = mod.image if link else image_name
            if text is None and (ptxas.adopt(self, mod, image)      # a cubin egpu-ptxas instrumented (Triton)
                                 or self._adopt_linked(mod, image)):  # a cubin linked from instrumented PTX
                return None
            if text is None and link:
                mod.status = f"failed: {image_name}"
                return None
            if not link and sass.choose(self.cfg.backend, text is not None) != "ptx":
                self._serve_sass(mod, text is not None)
                return None
            mod.ptx, mod.generation = text, self.live.generation
            counts = not link and self._ptx_counts(text)
            t0 = time.perf_counter()
            res = instrument(text, self.specs, self.cfg.kernel, link_input=link)
            # counted where the programs would run in the kernel, so a flip changes no count
            counted = frozenset(k.name for k in res.kernels if k.status == "instrumented"
                                and self._evaluated_for(k.name)) if counts else frozenset()
            if counted and self.lib.egpu_shim_eval_begin():
                would, mod.counted = {k.name: k for k in res.kernels}, counted
                res = instrument(text, self.uncounted, self.cfg.kernel, link_input=link)
                res.kernels[:] = [would[k.name] if k.status == "untouched" and would[k.name].status == "failed" else k
                                  for k in res.kernels]   # refused with them: the report says why
            mod.timing["rewrite_ms"] = (time.perf_counter() - t0) * 1e3
        except EgpuError as e:  # a fatbin or PTX we cannot read: the module runs as it is
            mod.status = f"failed: {e}"
            return None
        mod.kernels = {k.name: k for k in res.kernels}
        for name in mod.kernels:
            self.kernel_names[kernel_id(name)] = name
        if not any(k.status == "instrumented" for k in res.kernels):
            return None
        mod.status, mod.backend = "instrumented", "ptx"
        mod.probes = tuple(self.probes)
        mod.original = image.data.rstrip(b"\0") + b"\0" if image.kind == ImageKind.PTX else image.data
        mod.replaced_at = time.perf_counter()
        return res.text.encode()

    def module_loaded(self, api: str, call: int, handle: int, result: int, replacement_result: int,
                      jit_log: str) -> None:
        # Lazy loading brings modules in at a kernel's first launch, which may be one being captured.
        with self.live.lock, self.driver.capture_relaxed():
            self._module_loaded(api, call, handle, result, replacement_result, jit_log)

    def _module_loaded(self, api: str, call: int, handle: int, result: int, replacement_result: int,
                       jit_log: str) -> None:
        mod = self._pending.pop(call, None)
        if mod is None or result != 0:
            return
        if api.startswith("LINK_"):  # handle: the link state
            if replacement_result > 0:
                self._fail(mod, jit_refusal(f"driver JIT error {replacement_result}", jit_log))
            elif mod.status == "instrumented":
                self.links.setdefault(handle, []).append(mod)
            mod.original = None
            self.loads.append(mod)
            return
        if mod.replaced_at is not None:  # the shim's driver call in between: load and JIT of the replacement
            mod.timing["driver_ms"] = (time.perf_counter() - mod.replaced_at) * 1e3
        if replacement_result > 0:
            self._fail(mod, jit_refusal(f"driver JIT error {replacement_result}", jit_log))
        elif replacement_result == 0 or mod.status == "instrumented" or mod.counted:
            # replaced, adopted as it is, or counted at the launch: the maps its launches add to must exist
            try:
                mod.context = None if mod.library else self.driver.context()   # the hook runs in the load's
                self._fill_tables(handle, mod)
            except EgpuError as e:
                unpatched = mod.status == "untouched"   # counted only: the image is the app's, without probes
                self._fail(mod, f"cannot fill the map table: {e}")
                try:
                    if not unpatched:
                        mod.beside = self.driver.load(mod.original or b"", mod.library, mod.jit)
                except EgpuError as e2:  # nothing safe left: the kernels will fault on their maps
                    print(f"egpu: {api}: {e}; loading the original beside failed too: {e2}", file=sys.stderr)
        mod.original = None
        mod.handle = handle
        if replacement_result > 0:  # the original loaded: its image has no probes
            mod.probes = ()
        self.loads.append(mod)
        self.modules[handle] = mod
        self.live.loaded(mod)
        if mod.counted and not mod.elsewhere:
            self._route_all(mod, handle)
        if mod.backend == "sass":
            self._sass_loaded(mod)
        self._log(1, f"{api} {mod.image}: {mod.status}"
                     f" ({sum(k.status == 'instrumented' for k in mod.kernels.values())}/{len(mod.kernels)} kernels)")

    def handle_found(self, api: str, owner: int, name: str | None, handle: int) -> None:
        with self.live.lock:
            self._handle_found(api, owner, name, handle)

    def _handle_found(self, api: str, owner: int, name: str | None, handle: int) -> None:
        if api in ("MODULE_GET_FUNCTION", "LIBRARY_GET_KERNEL") and name:
            self.kernel_names[kernel_id(name)] = name
            mod = self.modules.get(owner)
            if mod is not None:
                if mod.status == "SASS only":  # its kernels are known by these lookups only
                    mod.kernels.setdefault(name, KernelStatus(name, "SASS only", mod.image))
                self._route(mod, name, handle)
        elif api == "KERNEL_GET_FUNCTION" and owner in self.functions:
            self._route(*self.functions[owner], handle)
        elif api == "LIBRARY_GET_MODULE" and owner in self.modules:
            self.modules[handle] = self.modules[owner]
        elif api == "LINK_CREATE":
            self.links.pop(handle, None)   # a state the driver hands out again
        elif api == "LINK_COMPLETE" and self.links.get(owner):
            cubin = self.ffi.cast("const char *", handle)
            data = self.ffi.buffer(cubin, fatbin.elf_extent(self.ffi.buffer(cubin, 64)[:]))[:]
            self.linked[hashlib.sha256(data).hexdigest()] = self.links.pop(owner)

    def unloaded(self, api: str, handle: int) -> None:
        with self.live.lock:
            self._unloaded(handle)

    def _unloaded(self, handle: int) -> None:
        mod = self.modules.pop(handle, None)
        if mod is None:
            return
        for h in mod.registered:  # the driver may hand these addresses out again
            self.lib.egpu_shim_register(self.ffi.cast("void *", h), self.ffi.NULL)
        self.functions = {h: f for h, f in self.functions.items() if f[0] is not mod}
        if self.lib.egpu_shim_eval_on():   # the driver may hand the unloaded kernels' handles out again
            self.lib.egpu_shim_eval_forget()
        self.modules = {h: m for h, m in self.modules.items() if m is not mod}
        if self.drainer is not None:
            self.drainer.forget()
        self.live.unloaded(mod)

    def sass_kernel(self, module: int, name: str, generation: int) -> tuple[int, int]:
        """(program mask, kernel id) of a kernel in a module the SASS back end is about to patch (none
        selected: the module is left unpatched), or at its first launch under a generation. Runs inside the
        driver's load or launch call: no CUDA, no lock another thread could hold across a driver call."""
        choice = self.sass.kernel(generation, name)
        self.kernel_names[choice.kernel_id] = name
        mod = self.sass_modules.get(module)
        if mod is None:
            mod = self.sass_modules[module] = Module("SANITIZER_MODULE", 0, "cubin", "untouched", backend="sass")
            self.loads.append(mod)
        mod.kernels[name] = (KernelStatus(name, "instrumented", "SASS patch") if choice.mask
                             else KernelStatus(name, "instrumented", COUNTED) if self.sass.counts_in(name)
                             else KernelStatus(name, "untouched", "no probe matches"))
        mod.status = "instrumented" if any(k.status == "instrumented" for k in mod.kernels.values()) else "untouched"
        return choice.mask, choice.kernel_id

    def eval_handle(self, handle: int) -> None:
        """A kernel handle's first launch while launches count the start-up probes' evaluated programs
        (egpu_py_eval_handle): what its launches add, or, for a handle no hooked lookup returned (its kernel
        unknown), the end of the counting. Before the launch gate: a flip may run here."""
        found = self.functions.get(handle)
        if found is None:   # answered with nothing all the same: asked no more, should the end have failed
            self.end_counting("a kernel launched through a handle no hooked lookup returned")
        mod, name = found or (None, f"handle {handle:#x}")
        counted = self._counts_in(mod, name) if mod is not None and not mod.elsewhere else []
        adds = [a for k, program in counted for a in self.launch_counts[id(self.probes[k])].adds(program)]
        lanes = self.ffi.new("struct egpu_eval_add[]", max(1, len(adds)))
        for lane, (address, delta, width, scope) in zip(lanes, adds):
            lane.lane, lane.delta, lane.width, lane.scope = address, delta, width, scope
        if self.lib.egpu_shim_eval_set(self.ffi.cast("void *", handle), lanes, len(adds)):
            raise EgpuError(f"{name}: no memory for what its launches count")

    def _counts_in(self, mod: Module, name: str) -> list[tuple[int, int]]:
        """(probe index, program index) of every program launches of ``mod``'s kernel ``name`` count now."""
        if mod.backend == "sass":
            return self.sass.counts_in(name)
        return self._evaluated_for(name) if name in mod.counted and mod.serving is None else []

    def _evaluated_for(self, name: str) -> list[tuple[int, int]]:
        """(probe index, program index) of every program a launch evaluates whose glob selects kernel ``name``."""
        return [(k, e.program) for k, p in enumerate(self.probes) for e in p.evaluated.values()
                if matches(p.obj.programs[e.program].attach.glob, name)]

    def _ptx_counts(self, text: str) -> bool:
        """Whether a PTX module loaded now may leave out the programs a launch evaluates, its launches counting
        them: unless --in-kernel, and once one of its kernels would run them, where the shim begins the counting
        (egpu_shim_eval_begin: not after a flip). A module whose kernels launch kernels from the device ends the
        counting at the next launch instead, as such launches pass no hook."""
        if self.cfg.in_kernel or not self.launch_counts:
            return False
        if launches_on_device(text):
            self.lib.egpu_shim_eval_device_launches()
            return False
        return True

    def end_counting(self, why: str) -> None:
        """Put the programs launches have counted so far into the kernels, in one flip (egpu_py_eval_end: ``why``
        is about to make a graph, whose replays no hook sees): live.Live.end_counting. egpu-run says so where the
        flip fails, or a module's copy does."""
        with self.live.lock:
            if not self.lib.egpu_shim_eval_on():
                return
            if self.context is None:   # between the first counted load and its maps: no flip can run yet
                print(f"egpu: {why}: the probes counted at the launch could not be put into the kernels (their "
                      "first module is still loading): launches that no hook sees run without them", file=sys.stderr)
                return
            start = time.perf_counter()
            try:
                with self.driver.capture_relaxed():   # another thread may be capturing: its capture stands
                    failed = self.live.end_counting()
            except EgpuError as e:
                print(f"egpu: {why}: the probes counted at the launch could not be put into the kernels ({e}): "
                      "launches that no hook sees (graph replays) run without them", file=sys.stderr)
                return
        for line in failed:   # the flip stands: these modules' kernels run without the probes from now on
            print(f"egpu: {why}: {line}: its kernels run without probes from now on", file=sys.stderr)
        # the flip's time is the copies' rewrite and JIT, which the application waits for once
        ms = (time.perf_counter() - start) * 1e3
        self._log(1, f"{why}: probes counted at the launch are put into the kernels from now on (flip {ms:.0f} ms)")

    # ---- the pieces ----------------------------------------------------------------------------------
    def _adopt_linked(self, mod: Module, image: hooks.ModuleImage) -> bool:
        """A cubin cuLinkComplete made from instrumented PTX inputs: instrumented, with their kernels."""
        if image.kind != ImageKind.ELF:
            return False
        inputs = self.linked.get(hashlib.sha256(image.data).hexdigest())
        if inputs is None:
            return False
        mod.kernels = {n: k for m in inputs for n, k in m.kernels.items()}
        mod.image, mod.status, mod.probes = "cubin from cuLink", "instrumented", tuple(self.probes)
        return True

    def _serve_sass(self, mod: Module, has_ptx: bool) -> None:
        """A load the SASS back end serves (sass.choose), else "SASS only" (why: the dump's "sass")."""
        if sass.choose(self.cfg.backend, has_ptx) is None or self.sass.prepare(self._device_sm()):
            mod.status = "SASS only"
        else:  # "instrumented" once the maps are in (_sass_loaded); its kernels show as they launch
            mod.status, mod.backend = "SASS patch pending", "sass"

    def _sass_loaded(self, mod: Module) -> None:
        """After a SASS-served load: the maps exist and the shim has their tables."""
        try:
            with self._maps_lock:
                if self.context is None:
                    self._allocate_maps()
                with self.driver.current(self.context):
                    self.sass.set_tables(self.memory, self.maps)
        except EgpuError as e:
            mod.status, mod.backend = f"failed: cannot place the map tables: {e}", ""
            return
        mod.status = "instrumented"
        self.exit.arm()

    def _ptx(self, image: hooks.ModuleImage) -> tuple[str | None, str]:
        """The PTX to instrument and where it came from; None when the image has no usable PTX."""
        if image.kind == ImageKind.PTX:
            return image.data.rstrip(b"\0").decode(errors="replace"), "ptx"
        if image.kind in (ImageKind.WRAPPER, ImageKind.FATBIN):
            sm = self._device_sm()
            entry = fatbin.best_ptx(fatbin.find_fatbins(image.data), sm)
            if entry is None:
                return None, f"fatbin without PTX for sm_{sm}"
            return entry.ptx(), f"fatbin {fatbin.entry_name(entry)}"
        return None, "cubin" if image.kind == ImageKind.ELF else "unknown image"

    def _device_sm(self) -> int:
        dev = self.driver.device()
        if dev not in self._sm:
            self._sm[dev] = 10 * self.driver.attribute(ATTR_CC_MAJOR, dev) + self.driver.attribute(ATTR_CC_MINOR, dev)
        return self._sm[dev]

    def _fill_tables(self, handle: int, mod: Module) -> None:
        """Write every probe object's map addresses into the module's table of that object, in the maps'
        context: a library's copy there. A module loaded in another context keeps its table of zeros, so
        that its probes leave at once (emitter.table_check): addresses of the maps' memory would be an
        illegal address for a kernel of another device (or of another context on the same one)."""
        with self._maps_lock:
            if self.context is None:
                self._allocate_maps()
        if mod.context not in (None, self.context):
            mod.elsewhere = True   # job.module_report says so at exit
            self._log(1, f"{mod.api} {mod.image}: loaded in another context than the maps': its kernels run "
                         "without probes")
            return
        if mod.status != "instrumented":   # counted at the launch only: the application's image has no table
            return
        with self.driver.current(self.context):
            for probe, maps in zip(self.probes, self.maps):
                address = self.driver.global_address(handle, probe.table, mod.library)
                if address is not None:
                    self.memory.htod(address, maps.table())

    def _allocate_maps(self) -> None:
        """The device maps of every probe object, in the current context (or the primary one)."""
        ncpu = self.driver.attribute(ATTR_SM_COUNT, self.driver.device())  # PERCPU rows; higher SM ids share the last
        ctx = self.driver.maps_context()
        with self.driver.current(ctx):
            memory = ContextMemory(self.driver, ctx)
            maps = []
            try:
                free = self.driver.free_memory()
                devmaps.check_room([m for p in self.probes for m in p.obj.maps], ncpu, free,
                                   devmaps.host_available())
                for p in self.probes:
                    maps.append(DeviceMaps(memory, MapsState(p.obj.maps), ncpu))
            except Exception:
                for m in maps:
                    m.free()
                memory.close()   # the next module load tries again, with a stream of its own
                raise
        # Before the maps are published, so that no shared-map write is pushed on the unaligned clock.
        if self.drainer is not None and any(side and side.shared for side in self.drainer.probes.sides):
            self.align_clocks(memory)   # globaltimer_offset makes the maps' context current itself
        self.startup_maps = tuple(maps)   # made before any change: self.probes are egpu-run's
        self.context, self.maps, self.memory = ctx, maps, memory
        self.lib.egpu_sass_maps_context(self.ffi.cast("void *", ctx))   # SASS patches elsewhere run no probe
        if self.cfg.trace is not None:
            self.streaming = self.streaming or self._trace()
            self._read_rings()

    def _trace(self) -> streaming.Streaming:
        """The trace file (egpu-run --trace), fed the records of host programs (the drainer's) at once, of the
        device maps' rings once they exist."""
        trace = streaming.Streaming(self.cfg.trace, self.probes, after_write=self.exit.rearm_if_loaded,
                                    after_exec=self.after_exec)
        if self.drainer is not None:
            self.drainer.trace_to(trace.host, wait=self.cfg.on_full == "wait")
        self.exit.arm()   # after the writer's first use of pyarrow (tracefile.TraceWriter._warm_up)
        return trace

    def _read_rings(self) -> None:
        """The trace drains the device maps' rings from now on."""
        self.streaming.read(self.maps, self.memory)
        if self.cfg.on_full == "wait":   # waiting kernels need the reader: loads of code wait for them
            self.lib.egpu_shim_rings_wait(self.ffi.cast("void *", self.context))   # first (interpose.c)

    def _close_trace(self) -> dict[str, Any] | None:
        """The trace file finished (Streaming.finish, which runs once only) and closed; what the dump reports of
        it, None without one. Host programs' records go to their maps from then on."""
        trace, self.streaming = self.streaming, None
        if trace is None:
            return None
        if self.drainer is not None:
            self.drainer.trace_to(None, wait=False)
        return trace.finish()

    def align_clocks(self, memory: ContextMemory) -> int:
        """Put host probes' clock (launch, host-API and uprobes: CLOCK_MONOTONIC plus an offset) on the GPU's,
        once per process; the offset. Their times meet GPU probes' %globaltimer only through maps they share
        with GPU programs (at start-up, or a live attach: uprobes.LiveUprobes), and the measuring kernel is
        the one egpu launches of its own, which profilers see: only then. Not measured: CLOCK_REALTIME,
        which the driver keeps %globaltimer near."""
        if self.clock is not None:
            return self.clock
        self.clock = self.drainer.probes.offset if self.drainer is not None else launches.clock_offset()
        try:
            measured = memory.globaltimer_offset()
        except EgpuError as e:
            measured = None
            self._log(1, f"%globaltimer not measured ({e}): host probes keep CLOCK_REALTIME")
        if measured is not None:
            self.clock += measured[0]
            self._log(1, f"%globaltimer - CLOCK_REALTIME = {measured[0]} ns (+-{measured[1]} ns): "
                         "host probes' times moved onto the GPU's clock")
        if self.drainer is not None:
            self.drainer.probes.offset = self.clock
        self.lib.egpu_uprobe_clock(self.clock)
        return self.clock

    def _fail(self, mod: Module, reason: str) -> None:
        mod.status, mod.counted = f"failed: {reason}", frozenset()   # its kernels run no probe, counted or not
        mod.kernels = {n: dataclasses.replace(k, status="failed", reason=reason) if k.status == "instrumented"
                       else k for n, k in mod.kernels.items()}

    def _route(self, mod: Module, name: str, handle: int) -> None:
        """Make launches of a kernel handle of an instrumented load run what they must."""
        self.functions[handle] = (mod, name)
        if self.live.route(mod, name, handle):
            return
        k = mod.kernels.get(name)
        h = self.ffi.cast("void *", handle)
        if mod.beside is not None:
            target = self.driver.function(mod.beside, name, mod.library)
            self.lib.egpu_shim_register(h, self.ffi.cast("void *", target))
        elif mod.status == "instrumented" and k is not None and k.status == "instrumented":
            if self.lib.egpu_shim_register_launch_id(h, h, k.nparams, k.launch_param_offset or 0):
                print(f"egpu: {name}: the shim's function table is full; its launches will fail", file=sys.stderr)
            self.exit.arm()
        else:
            return
        mod.registered.add(handle)

    def _route_all(self, mod: Module, handle: int) -> None:
        """Route every kernel handle of a module (a library: CUkernel) counted at the launch, as the driver
        enumerates them: one the application gets from no hooked lookup (cuModuleEnumerateFunctions,
        cuLibraryEnumerateKernels) would end the counting at its first launch and, unknown to the flip, go on
        running the application's image, loaded without the programs the launches counted. A driver before CUDA
        12.4 cannot enumerate: such handles run without those programs."""
        try:
            found = self.driver.functions_of(handle, mod.library)
        except EgpuError:
            return
        for h, name in found:
            if name in mod.kernels and h not in self.functions:
                self._route(mod, name, h)

    def _log(self, level: int, line: str) -> None:
        if self.cfg.log >= level:
            print(f"egpu[{os.getpid()}]: {line}", file=sys.stderr)

    def id_names(self) -> list[list[Any]]:
        """[id, name] of every kernel the process loaded or looked up, then of every hooked API a host-API
        program runs on: the dump's and the live views' ``kernels`` (host-API probes' api ids print as the
        symbols they hash, as kernel ids print as kernel names)."""
        return [[k, n] for k, n in self.kernel_names.items()] + (self.drainer.api_names() if self.drainer else [])

    # ---- exit --------------------------------------------------------------------------------------
    def finish(self) -> None:
        """Read the maps back and write this process's dump (nothing if it loaded no module and the job has
        no host-API probe: one that only copied or allocated has their maps)."""
        self.cow.at_exit()
        self.live.stop()  # no daemon thread of ours runs on into the interpreter's finalization
        if self.mirror is not None:
            self.mirror.stop()
        # CUPTI's last records first: its unified-memory records still go to the drainer's probes
        cupti = self.durations.finish(self.driver.synchronize) if self.durations else {}
        uprobes_report = self.uprobes.detach() if self.uprobes is not None else None  # before their maps go
        live_host = self.live.host.detach_all()   # probes attached live: their uprobes' maps
        if self.drainer is not None:
            self.drainer.stop()
        if not self._owes_dump():
            return
        probes, error, states, trace = [], None, None, None
        if self.maps:
            try:
                with self.driver.current(self.context):
                    try:
                        self.driver.synchronize()   # the ring reader still runs: a kernel may wait for it
                    finally:   # the trace file closed even where the synchronize failed
                        trace = self._close_trace()
                    states = [m.read_back() for m in self.maps]
            except EgpuError as e:
                error = f"maps unreadable at exit: {e}"
            finally:
                self.lib.egpu_shim_rings_wait(self.ffi.NULL)   # no reader now: nothing to wait for
        # host programs' records only, or the maps' context could not be entered (destroyed): closed all the same
        trace = trace or self._close_trace()
        states = launches.dump_states(self.drainer, self.probes, states,
                                      [live_host.get(name, {}) for name in self.live.names], self.launch_counts)
        if states is not None:
            probes = [{"path": str(p.path), **dump.state_contents(s)} for p, s in zip(self.probes, states)]
        if not self.cfg.session.is_dir():   # this process outlived egpu-run, which removed it: no one reads it
            return
        stats = self.ffi.new("struct egpu_stats *")
        self.lib.egpu_shim_stats(stats)
        dump.write(self.cfg.session, {
            "pid": os.getpid(), "argv": config.argv(), "rank": config.rank(),
            "probes": probes, "error": error, "laid_out": self.context is not None,
            "kernels": self.id_names(),
            "modules": [m.report() for m in self.loads],
            "stats": {f: int(getattr(stats, f)) for f in STATS},
            "sass": self.sass.stats(),
            "timing": {"probes_ms": self.probes_ms},
            "launch_probes": self.drainer.report() if self.drainer else None,
            "trace": trace,
            **({"closed_traces": self.closed_traces} if self.closed_traces else {}),
            "uprobes": uprobes_report,
            **cupti,
        })


    def _owes_dump(self) -> bool:
        return self.cfg.session is not None and bool(self.loads or self.cfg.early_start or self.streaming)

    # ---- exec --------------------------------------------------------------------------------------
    def exec_image(self, failed: bool) -> None:
        """Dump this image's maps before an exec replaces it, stopping nothing but its trace, which is finished
        as at exit (the exec may well succeed, and then nothing else closes the file): should the exec fail, the
        dump is withdrawn and the process runs on with its probes (``failed``) and a new trace file, the old one
        named in its next dump. The maps are read as ``egpu maps`` reads them (live.Live.maps), once the launches
        so far are done and their records run."""
        if failed:
            self._exec_failed()
            return
        session = self.cfg.session
        if session is None or not self._owes_dump() or not session.is_dir():   # egpu-run gone: no one reads it
            return
        try:
            if self.maps:
                with self.driver.current(self.context):
                    self.driver.synchronize()   # the ring reader still runs: a kernel may wait for it
            if self.drainer is not None:
                self.drainer.drain()   # host programs' last records handed on to the trace
        finally:
            self._exec_trace = self._close_trace()
            self.lib.egpu_shim_rings_wait(self.ffi.NULL)   # no reader now: nothing to wait for
        with self.driver.capture_relaxed():
            doc = self.live.maps({})
        trace = {"trace": self._exec_trace, **({"closed_traces": self.closed_traces} if self.closed_traces else {})}
        self._exec_dump = dump.write_exec(session, {**doc, **trace})
        # this image owes nothing more: egpu-run must wait for the next image's dump, not take this one's for it,
        # nor this image's last mirror copy for the next one's (a copy made after the dump would count twice)
        dump.unmark_started(session)
        if self.mirror is not None:
            self.mirror.stop()

    def _exec_failed(self) -> None:
        """The exec failed: its dump withdrawn (the maps count on into the next), the trace file it closed kept
        for the next dump to name, and the image's records drained into a new one (claim: FILE.PID.execN)."""
        if self._exec_dump is not None:
            self._exec_dump.unlink(missing_ok=True)
            dump.mark_started(self.cfg.session)   # the dump is this image's exit dump again
            self.mirror = mirror.start(self.live.mirrored, self.cfg.mirror, self.cfg.session)
        self._exec_dump = None
        if self._exec_trace is None:
            return
        self.closed_traces.append(self._exec_trace)
        self._exec_trace, self.after_exec = None, True
        self.streaming = self._trace()
        if self.maps:
            self._read_rings()


def _start() -> None:
    """The runtime registered with the hooks; where it cannot start, one line why, and the program runs on without
    probes, its exit status its own."""
    ffi, lib = hooks.shim()
    try:
        hooks.register(Runtime(from_env(), ffi, lib))
    except Exception as e:  # noqa: BLE001  (any part's failure: the program must not pay for it)
        why = str(e) if isinstance(e, StartError) else _why_not(e)
        print(f"egpu: cannot start: {why}; the program runs without probes", file=sys.stderr)


def _why_not(e: Exception) -> str:
    """What stopped the start: out of descriptors is said as such, whatever error it surfaced as (tempfile's "No
    usable temporary directory", where its files could not be made)."""
    if _out_of_descriptors(e):
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return f"too many open files (RLIMIT_NOFILE {soft})"
    return str(e) if isinstance(e, EgpuError) else f"{type(e).__name__}: {e}"


def _out_of_descriptors(e: BaseException | None) -> bool:
    """Whether ``e`` or an error behind it is EMFILE, or no descriptor is free now."""
    while e is not None:
        if isinstance(e, OSError) and e.errno == errno.EMFILE:
            return True
        e = e.__cause__ or e.__context__
    try:
        os.close(os.dup(2))
    except OSError as full:
        return full.errno == errno.EMFILE
    return False


_start()
