"""The runtime side of the SASS back end: which back end serves a module, the patch images handed to
shim/sass.c as generations, the map tables the patches read, and the programs each patched kernel runs.

shim/sass.c subscribes to the Compute Sanitizer in the cuInit hook (EGPU_BACKEND sass|auto) and
records every module the PTX back end did not instrument. A generation is the patch image of one set
of probe objects (translate/sass_patch.py; ptxas once per probe set and device, cached in the session
directory) with its table block. The start-up probes are generation 1, committed at the first module
load this back end serves (``prepare``); every live attach, detach and swap stages the next one
(``stage``), which egpu_shim_swap commits inside its flip: the contexts drain and every module is
re-patched with the new image, or all stay on the old one. A job started with no probe waits in
standby: subscribed, nothing patched. Which of a generation's programs run in a kernel: the same globs
(mangled or demangled) and --kernel selection as the PTX back end. The shim asks ``kernel`` when a
patched kernel first launches; every kernel asked about so far is answered again for each new
generation when it is staged (``stage``), so the launches after a flip find their answer in C.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from egpu_preload.bpf.ctx import kernel_id
from egpu_preload.bpf.program import BpfObject
from egpu_preload.errors import EgpuError
from egpu_preload.runtime.config import Config
from egpu_preload.runtime.probes import Probe
from egpu_preload.translate.demangle import matches
from egpu_preload.translate.sass_patch import PatchModule, build_image, has_sites, patch_module

BACKENDS = ("auto", "ptx", "sass")
STATES = {0: "not started", 2: "subscribed", 3: "off", 4: "gave way to CUPTI", -1: "failed"}
STAT_FIELDS = ("modules_seen", "modules_patched", "modules_skipped", "modules_unselected", "launches", "probed",
               "errors", "flips", "asked", "flip_us", "drain_us", "generation", "modules_loaded", "patched_now",
               "other_context")
NO_PROGRAMS = "no kernel-site probes"
MODULES_KEPT = 16   # patch modules kept translated, by probe set: attached again, a set skips translation
MASKS_KEPT = 1 << 20   # kernels' program masks remembered, over every probe set, before starting afresh


def choose(backend: str, has_ptx: bool) -> str | None:
    """The back end that serves a module: ``ptx`` rewrites its PTX, ``sass`` patches its SASS, None
    leaves it alone (``--backend ptx`` and a module without PTX: "SASS only")."""
    if backend == "sass":
        return "sass"
    if has_ptx:
        return "ptx"
    return "sass" if backend == "auto" else None


def cache_dir(cfg: Config) -> Path | None:
    return cfg.session / "sass" if cfg.session is not None else None


@dataclass(frozen=True)
class KernelChoice:
    mask: int        # bit k: PatchProgram k runs in the kernel
    kernel_id: int


@dataclass(frozen=True)
class Staged:
    generation: int
    module: PatchModule
    tables: int | None   # the table block's device address (None: set once the maps exist)
    phases_ms: dict[str, float]   # translate (the patch module), image (cache or ptxas), stage (the shim's copy)


def globs(module: PatchModule) -> tuple[str, ...]:
    """The programs' kernel globs in bit order: all a kernel's mask under ``module`` depends on."""
    return tuple(p.attach.glob for p in module.programs)


class KernelTable:
    """Kernel names and ids as egpu_sass_generation takes them (the shim copies them at each stage), and
    each probe set's masks over them, kept for the sets staged again."""

    def __init__(self, ffi: Any, known: list[tuple[str, int]]) -> None:
        self.ffi, self.kernels = ffi, [n for n, _ in known]
        encoded = [n.encode() + b"\0" for n in self.kernels]
        self._buffer = ffi.from_buffer(b"".join(encoded))   # one buffer, pointers into it: not a cdata each
        starts, at = [], ffi.cast("char *", self._buffer)
        for e in encoded:
            starts.append(at)
            at += len(e)
        self.names = ffi.new("char *[]", starts or 1)
        self.ids = ffi.new("unsigned long long[]", [k for _, k in known] or 1)
        self._masks: dict[tuple[tuple[str, ...], int], Any] = {}

    def __len__(self) -> int:
        return len(self.kernels)

    def masks(self, module: PatchModule, mask: Callable[[PatchModule, str], int], counted: int = 0) -> Any:
        """Each kernel's mask, less the programs ``counted`` at the launch."""
        key = (globs(module), counted)
        if key not in self._masks:
            if len(self._masks) >= MODULES_KEPT:
                del self._masks[next(iter(self._masks))]
            self._masks[key] = self.ffi.new("unsigned long long[]",
                                            [mask(module, n) & ~counted for n in self.kernels] or 1)
        return self._masks[key]


class SassBackend:
    """One per process; ``ffi``/``lib`` are the shim's (egpu_sass.h part 2)."""

    def __init__(self, cfg: Config, probes: list[Probe], ffi: Any, lib: Any) -> None:
        self.cfg, self.ffi, self.lib = cfg, ffi, lib
        self.probes = probes   # the runtime's list, which live flips change in place: the probes attached now
        self.generations: dict[int, PatchModule] = {}   # committed or staged, by id (kernel() reads them)
        self.counted: dict[int, int] = {}   # by generation: the programs launches count (launch_eval.py), not patched
        self.current = 0                                 # the committed generation (0: none yet)
        self.staged: Staged | None = None
        self.block: int | None = None                    # the current generation's table block
        self.seen: dict[str, int] = {}                   # every kernel name asked about -> its kernel id
        # (object ids) -> (the objects, kept so that their ids stay theirs; their patch module), oldest first
        self._modules: dict[tuple[int, ...], tuple[tuple[BpfObject, ...], PatchModule]] = {}
        self._next = 1
        self.configured: str | None = None   # None: not yet; "": ready; else why it cannot serve
        # (the programs' globs in bit order, kernel name) -> mask: a stage weighs every loaded kernel
        # (thousands in a PyTorch job, ~10 us each against a glob), and live cycles stage the same sets again
        self._masks: dict[tuple[tuple[str, ...], str], int] = {}
        self._listed = b""                   # egpu_sass_kernel_names' answer at the last stage
        self._table: KernelTable | None = None   # every kernel seen, as the shim takes them

    # ---- state -------------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        s = self.ffi.new("struct egpu_sass_stats *")
        self.lib.egpu_sass_stats(s)
        out = {"state": STATES.get(s.state, str(s.state)), "error": self.ffi.string(s.error).decode(errors="replace"),
               "serving": self.configured}   # None: never asked; "": ready; else why not
        out.update({f: int(getattr(s, f)) for f in STAT_FIELDS})
        return out

    def unavailable(self) -> str:
        """Why this process cannot patch SASS ("" when it can): the reason a live attach reports."""
        if self.cfg.backend == "ptx":   # asked for, or what egpu-run made of --backend auto (for_job)
            return self.cfg.backend_why or ("the job runs --backend ptx (start it with --backend auto --live-sass "
                                            "to attach into SASS-only kernels)")
        stats = self.stats()
        if stats["state"] != "subscribed":
            return f"sanitizer {stats['state']}" + (f": {stats['error']}" if stats["error"] else "")
        if cache_dir(self.cfg) is None:
            return "no session directory for the patch image"
        return ""

    def module(self) -> PatchModule | None:
        """The committed generation's patch module."""
        return self.generations.get(self.current)

    def prepare(self, sm: int) -> str:
        """At a module load this back end serves: commit the generation of the probes attached now, once,
        unless a live flip committed one first; "" when kernels will be patched, else why not ("no
        kernel-site probes": standby)."""
        if self.configured is not None:
            return self.configured
        if self.current or self.staged is not None:   # a live flip came first: its generation stands
            self.configured = ""
            return self.configured
        objects = [p.obj for p in self.probes]
        if self.cfg.backend == "ptx" or not has_sites(objects):
            self.configured = NO_PROGRAMS
            return self.configured
        why = self.unavailable()
        count = not self.cfg.in_kernel
        while not why:
            try:
                self.stage(objects, sm, None, count=count)
            except EgpuError as e:
                why = f"patch image: {e}"
                break
            if self.lib.egpu_sass_commit_now():
                why = f"cannot patch: {self.stats()['error']}"
                self.unstage()
                break
            self.committed()
            if not self.counting or self.lib.egpu_shim_eval_on():
                break
            count = False   # the shim refused to count (a graph was made already): patch them all, no module is yet
        self.configured = why
        return why

    # ---- generations -------------------------------------------------------------------------------
    def stage(self, objects: list[BpfObject], sm: int, tables: int | None, count: bool = False) -> Staged:
        """Stage the generation of ``objects`` (raises EgpuError: a probe the translator or ptxas refuses;
        nothing is staged then). With no kernel-site program, the generation patches nothing: standby.
        ``count``: the programs a launch can evaluate (Probe.evaluated) are left out of every kernel's mask,
        and the shim counts their launches instead while this generation patches (the start-up probes')."""
        t0 = time.perf_counter()
        module = self._patch_module(objects)
        counted = self._evaluated(module, objects) if count else 0
        t1 = time.perf_counter()
        image = b""
        if module.programs:
            cache = cache_dir(self.cfg)
            if cache is None:
                raise EgpuError("no session directory for the patch image")
            image = build_image(module.ptx, sm, cache).read_bytes()
        t2 = time.perf_counter()
        gen = self._next
        ffi = self.ffi
        # every cdata the struct points to is held here until the call returns (the shim copies them)
        entry_strings = [ffi.new("char[]", e.encode()) if e else ffi.NULL for e in module.entry_names()]
        table = self._kernel_table() if module.programs else None
        arrays = (ffi.from_buffer(image) if image else ffi.NULL, ffi.new("char *[]", entry_strings),
                  table.names if table else ffi.new("char *[]", 1),
                  table.masks(module, self._mask, counted) if table else ffi.new("unsigned long long[]", 1),
                  table.ids if table else ffi.new("unsigned long long[]", 1))
        g = ffi.new("struct egpu_sass_generation *")
        g.image, g.entries, g.names, g.masks, g.kernel_ids = arrays
        g.size, g.classes, g.nkernels = len(image), module.instruction_classes(), len(table) if table else 0
        g.image_id, g.id, g.tables, g.evaluates = module.image_id, gen, tables or 0, counted != 0
        if self.lib.egpu_sass_stage(g):
            raise EgpuError("the shim refused the patch image (out of memory, or the sanitizer is not subscribed)")
        self._next += 1
        self.generations[gen] = module
        self.counted[gen] = counted
        phases = {"translate": t1 - t0, "image": t2 - t1, "stage": time.perf_counter() - t2}
        self.staged = Staged(gen, module, tables, {k: round(1e3 * v, 3) for k, v in phases.items()})
        return self.staged

    def _evaluated(self, module: PatchModule, objects: list[BpfObject]) -> int:
        """The bits of ``module``'s programs that a launch can evaluate."""
        by_object = {id(p.obj): p.evaluated for p in self.probes}
        return sum(1 << p.bit for p in module.programs if p.program in by_object.get(id(objects[p.obj]), ()))

    @property
    def counting(self) -> bool:
        """Whether launches count programs of the committed generation (shim: egpu_shim_eval_on)."""
        return self.counted.get(self.current, 0) != 0

    def counts_in(self, name: str) -> list[tuple[int, int]]:
        """(probe index, program index) of every program launches of kernel ``name`` count now."""
        counted, module = self.counted.get(self.current, 0), self.module()
        if not counted or module is None or (self.cfg.kernel is not None and not matches(self.cfg.kernel, name)):
            return []
        return [(p.obj, p.program) for p in module.programs if counted >> p.bit & 1 and matches(p.attach.glob, name)]

    def _kernel_table(self) -> KernelTable:
        """Every kernel seen (those of the modules loaded now among them: the flip weighs them without
        asking Python), built again only when one was added: a PyTorch job has thousands, and live cycles
        stage again and again while none is loaded."""
        listed = self._loaded_kernels()
        if listed != self._listed:
            self._listed = listed
            for name in filter(None, listed.decode().split("\0")):
                if name not in self.seen:
                    self.seen[name] = kernel_id(name)
        if self._table is None or len(self._table) != len(self.seen):
            self._table = KernelTable(self.ffi, list(self.seen.items()))
        return self._table

    def _loaded_kernels(self) -> bytes:
        """egpu_sass_kernel_names: the kernels of every module loaded that the back end may patch."""
        need = self.lib.egpu_sass_kernel_names(self.ffi.NULL, 0)
        if not need:
            return b""
        buf = self.ffi.new("char[]", need)   # modules loaded meanwhile are left out: their loads ask Python
        self.lib.egpu_sass_kernel_names(buf, need)
        return self.ffi.buffer(buf, need)[:]

    def _patch_module(self, objects: list[BpfObject]) -> PatchModule:
        """patch_module(objects), translated once per probe set: live attach, swap and detach cycles among
        a few probe objects (live.py keeps each loaded object) stage the same sets again and again."""
        key = tuple(id(o) for o in objects)
        kept = self._modules.pop(key, None)
        module = kept[1] if kept is not None else patch_module(objects)
        self._modules[key] = (tuple(objects), module)
        while len(self._modules) > MODULES_KEPT:
            del self._modules[next(iter(self._modules))]
        return module

    def committed(self) -> int | None:
        """The staged generation patches now (egpu_sass_commit_now or a flip said so); the table block of
        the one it replaced, which no launch reads any more (the flip drained them), for the caller to free."""
        if self.staged is None:
            return None
        retired, self.block = self.block, self.staged.tables
        self.current, self.staged = self.staged.generation, None
        self.generations = {g: m for g, m in self.generations.items() if g == self.current}
        self.counted = {g: c for g, c in self.counted.items() if g == self.current}
        return retired

    def unstage(self) -> None:
        """The staged generation will not patch (its flip failed or never ran)."""
        self.lib.egpu_sass_unstage()
        if self.staged is not None:
            self.generations.pop(self.staged.generation, None)
            self.counted.pop(self.staged.generation, None)
            self.staged = None

    def set_tables(self, memory: Any, maps: list[Any]) -> None:
        """The start-up generation's table block, once the maps exist (``memory``: their context's, current):
        launches run probes from then on."""
        if self.current == 0 or self.block is not None:
            return
        self.block = table_block(memory, maps)
        self.lib.egpu_sass_tables(self.block)

    # ---- the shim's question ---------------------------------------------------------------------------
    def kernel(self, generation: int, name: str) -> KernelChoice:
        """The programs of ``generation`` that run in kernel ``name`` (mangled, as the sanitizer reports it)."""
        kid = self.seen.setdefault(name, kernel_id(name))
        module = self.generations.get(generation)
        mask = self._mask(module, name) & ~self.counted.get(generation, 0) if module is not None else 0
        return KernelChoice(mask, kid)

    def _mask(self, module: PatchModule, name: str) -> int:
        key = (globs(module), name)   # the mask follows from these alone
        mask = self._masks.get(key)
        if mask is None:
            if len(self._masks) >= MASKS_KEPT:
                self._masks.clear()
            mask = 0 if self.cfg.kernel is not None and not matches(self.cfg.kernel, name) else \
                sum(1 << p.bit for p in module.programs if matches(p.attach.glob, name))
            self._masks[key] = mask
        return mask


def table_block(memory: Any, maps: list[Any]) -> int:
    """Every object's map table back to back in device memory (``memory``: their context's, current)."""
    block = b"".join(m.table() for m in maps) or b"\0" * 8
    address = memory.alloc(len(block))
    memory.htod(address, block)
    return address


# ---- egpu-run's side ---------------------------------------------------------------------------------

SANITIZER_LIB = "compute-sanitizer/libsanitizer-public.so"


def sanitizer_library(env: dict[str, str] | None = None) -> str | None:
    """EGPU_SANITIZER_LIB if set, else the first libsanitizer-public.so under CUDA_HOME or /usr/local/cuda."""
    env = dict(os.environ) if env is None else env
    if env.get("EGPU_SANITIZER_LIB"):
        return env["EGPU_SANITIZER_LIB"]
    for root in (env.get("CUDA_HOME"), "/usr/local/cuda"):
        if root and (Path(root) / SANITIZER_LIB).exists():
            return str(Path(root) / SANITIZER_LIB)
    return None


def visible_sms() -> list[int]:
    """Compute capabilities of the GPUs nvidia-smi lists (90 for 9.0), without initialising CUDA here."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    sms = set()
    for line in out.split():
        major, _, minor = line.strip().partition(".")
        if major.isdigit() and minor.isdigit():
            sms.add(10 * int(major) + int(minor))
    return sorted(sms)


def for_job(cfg: Config, probes: list[Probe], standby: bool = False) -> tuple[Config, list[str]]:
    """The job's Config with the back end settled and the sanitizer found, and the start-up probes'
    patch image prebuilt in the session for every GPU nvidia-smi shows, so the job's processes need no
    ptxas. A job with no kernel-site probe subscribes in standby only with ``standby`` (egpu-run
    --live-sass) or --backend sass, so that a probe attached later reaches SASS-only kernels (a
    subscription made after CUDA started sees no launch); otherwise it runs --backend ptx. Standby is
    asked for, not the default, because the subscribed sanitizer holds the driver's one tool slot, which
    CUPTI users (torch.profiler, --durations, Nsight) need: on the H200 they timed nothing beside it.
    Returns notes for stderr (a failed prebuild: the processes try again and report)."""
    if cfg.backend not in BACKENDS:
        raise EgpuError(f"--backend {cfg.backend}: must be one of {', '.join(BACKENDS)}")
    if cfg.backend == "ptx":
        return cfg, []
    cfg = dataclasses.replace(cfg, sanitizer=cfg.sanitizer or sanitizer_library())
    notes = []
    if cfg.sanitizer is None and (cfg.backend == "sass" or standby):   # the job only said "SASS only" of its kernels
        asked = "--backend sass" if cfg.backend == "sass" else "--live-sass"
        lost = "no kernel" if cfg.backend == "sass" else "no SASS-only kernel"
        notes.append(f"egpu-run: {asked}, but no Compute Sanitizer library was found (EGPU_SANITIZER_LIB, "
                     f"CUDA_HOME): {lost} can be instrumented in this job")
    objects = [p.obj for p in probes]
    if not has_sites(objects):   # standby only where asked for, and a sanitizer is there to subscribe
        if cfg.backend == "sass" or (standby and cfg.sanitizer):
            return cfg, notes
        why = ("--live-sass, but no Compute Sanitizer library was found (EGPU_SANITIZER_LIB, CUDA_HOME)" if standby
               else "no probe given at its start patches kernels, and no --live-sass kept the Compute Sanitizer "
                    "loaded (start the job with egpu-run --live-sass to attach into SASS-only kernels)")
        return dataclasses.replace(cfg, backend="ptx", backend_why=f"--backend auto ran the job as ptx: {why}"), notes
    module = patch_module(objects)
    cache = cache_dir(cfg)
    for sm in visible_sms() if cache is not None else []:
        try:
            build_image(module.ptx, sm, cache)
        except EgpuError as e:
            notes.append(f"egpu-run: SASS back end: {e}")
    return cfg, notes
