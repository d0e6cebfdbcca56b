"""The runtime side of the SASS back end: which back end serves a module, the patch image handed to
shim/sass.c, the map tables the patches read, and the programs each patched kernel runs.

shim/sass.c subscribes to the Compute Sanitizer in the cuInit hook (EGPU_BACKEND sass|auto) and
patches every module whose cubin the PTX back end did not instrument. This side, on the load of a
module it serves (``choose``), builds the patch image (translate/sass_patch.py; ptxas once per probe
set and device, cached in the session directory, normally prebuilt by egpu-run) and configures the
shim with it; after the load, it writes every probe object's map table into one device block and gives
the shim its address. When a patched kernel first launches, the shim asks ``kernel`` which programs
run in it: the same globs (mangled or demangled) and --kernel selection as the PTX back end.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from egpu_preload.bpf.ctx import kernel_id
from egpu_preload.errors import EgpuError
from egpu_preload.runtime.config import Config
from egpu_preload.runtime.probes import Probe
from egpu_preload.translate.demangle import matches
from egpu_preload.translate.sass_patch import PatchModule, build_image, patch_module

BACKENDS = ("auto", "ptx", "sass")
STATES = {0: "not started", 2: "subscribed", 3: "off", -1: "failed"}
STAT_FIELDS = ("modules_seen", "modules_patched", "modules_skipped", "launches", "probed", "errors")


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


class SassBackend:
    """One per process; ``ffi``/``lib`` are the shim's (egpu_sass.h part 2)."""

    def __init__(self, cfg: Config, probes: list[Probe], ffi: Any, lib: Any) -> None:
        self.cfg, self.ffi, self.lib = cfg, ffi, lib
        self.module: PatchModule | None = None
        if cfg.backend != "ptx":
            self.module = patch_module([p.obj for p in probes])
        self.configured: str | None = None   # None: not yet; "": ready; else why it cannot serve
        self.tables: int | None = None       # the table block's device address

    # ---- state -------------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        s = self.ffi.new("struct egpu_sass_stats *")
        self.lib.egpu_sass_stats(s)
        out = {"state": STATES.get(s.state, str(s.state)), "error": self.ffi.string(s.error).decode(errors="replace"),
               "serving": self.configured}   # None: never asked; "": ready; else why not
        out.update({f: int(getattr(s, f)) for f in STAT_FIELDS})
        return out

    def prepare(self, sm: int) -> str:
        """Make the shim ready to patch (once): "" when it is, else why the SASS back end cannot serve."""
        if self.configured is not None:
            return self.configured
        self.configured = self._configure(sm)
        return self.configured

    def _configure(self, sm: int) -> str:
        if self.module is None or not self.module.programs:
            return "no kernel-site probes"
        stats = self.stats()
        if stats["state"] != "subscribed":
            return f"sanitizer {stats['state']}" + (f": {stats['error']}" if stats["error"] else "")
        cache = cache_dir(self.cfg)
        if cache is None:
            return "no session directory for the patch image"
        try:
            image = build_image(self.module.ptx, sm, cache).read_bytes()
        except (EgpuError, OSError) as e:
            return f"patch image: {e}"
        if self.lib.egpu_sass_configure(self.ffi.from_buffer(image), len(image), self.module.instruction_classes()):
            return "the shim refused the patch image"
        return ""

    def set_tables(self, memory: Any, maps: list[Any]) -> None:
        """Write every object's map table into one device block (``memory``: the maps' context's, current)
        and hand the shim its address; launches run probes from then on."""
        if self.tables is not None:
            return
        block = b"".join(m.table() for m in maps)
        self.tables = memory.alloc(len(block))
        memory.htod(self.tables, block)
        self.lib.egpu_sass_tables(self.tables)

    # ---- the shim's question ---------------------------------------------------------------------------
    def kernel(self, name: str) -> KernelChoice:
        """The programs that run in kernel ``name`` (mangled, as the sanitizer reports it)."""
        mask = 0
        if self.module is not None and (self.cfg.kernel is None or matches(self.cfg.kernel, name)):
            for p in self.module.programs:
                if matches(p.attach.glob, name):
                    mask |= 1 << p.bit
        return KernelChoice(mask, kernel_id(name))


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


def for_job(cfg: Config, probes: list[Probe]) -> tuple[Config, list[str]]:
    """The job's Config with the back end settled (``ptx`` when no probe has a kernel-site program, so
    the shim never loads the sanitizer for nothing) and the sanitizer found; the patch image prebuilt
    in the session for every GPU nvidia-smi shows, so the job's processes need no ptxas. Returns notes
    for stderr (a failed prebuild: the processes try again and report)."""
    if cfg.backend not in BACKENDS:
        raise EgpuError(f"--backend {cfg.backend}: must be one of {', '.join(BACKENDS)}")
    module = patch_module([p.obj for p in probes]) if cfg.backend != "ptx" else None
    if module is None or not module.programs:
        return dataclasses.replace(cfg, backend="ptx"), []
    cfg = dataclasses.replace(cfg, sanitizer=cfg.sanitizer or sanitizer_library())
    notes, cache = [], cache_dir(cfg)
    for sm in visible_sms() if cache is not None else []:
        try:
            build_image(module.ptx, sm, cache)
        except EgpuError as e:
            notes.append(f"egpu-run: SASS back end: {e}")
    return cfg, notes
