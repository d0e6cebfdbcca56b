"""egpu-ptxas: the ptxas Triton runs under egpu-run (TRITON_PTXAS_PATH), and how the runtime recognises
the cubins it made.

Triton compiles a kernel to PTX in the application's process, runs ``ptxas ... X.ptx -o X.cubin`` and
loads the cubin with cuModuleLoadData (torch.compile's inductor the same way, or with cuModuleLoad on
the cached file). A cubin has no PTX left to rewrite, so the rewrite happens here, at the PTX stage:

- ``main``: the probes come from the job's config (config.from_env, as in the runtime); the input PTX
  is instrumented, a marker global ``__egpu_ptxas_<key>`` (key: the first 16 hex digits of the SHA-256
  of the instrumented PTX) is added so the cubin names its record, the instrumented copy and the
  record go into ``<session>/ptxas/<key>.{ptx,msgpack}``, and the real ptxas runs on the copy with
  Triton's other arguments. Anything else (``--version``, no probe matches, no session) runs the real
  ptxas on the arguments as given.
- ``adopt``: on a cubin load, the runtime finds the marker, reads the record (per kernel: status,
  parameter count and launch-id offset, as the PTX path's rewrite.KernelStatus) and treats the module
  as instrumented: its map tables are filled and its kernels get the launch id appended. The original
  PTX is in the record too, so a module whose tables cannot be filled runs the original beside it.

The real ptxas: config ``ptxas`` (egpu-run keeps the job's own TRITON_PTXAS_PATH there), else the one
Triton bundles (triton/backends/nvidia/bin/ptxas), else ptxas on PATH.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import msgpack

from egpu_preload.bpf.ctx import kernel_id
from egpu_preload.errors import EgpuError
from egpu_preload.fatbin import ImageKind
from egpu_preload.runtime import config
from egpu_preload.translate.rewrite import KernelStatus

MARKER = "__egpu_ptxas_"
_MARKER_RE = re.compile(rb"__egpu_ptxas_([0-9a-f]{16})")


def real_ptxas(cfg: config.Config) -> str:
    if cfg.ptxas:
        return cfg.ptxas
    spec = importlib.util.find_spec("triton")
    for root in (spec.submodule_search_locations or []) if spec else []:
        bundled = Path(root) / "backends" / "nvidia" / "bin" / "ptxas"
        if bundled.is_file():
            return str(bundled)
    found = shutil.which("ptxas")
    if found is None:
        raise EgpuError("egpu-ptxas: no real ptxas (set TRITON_PTXAS_PATH, install Triton or the CUDA toolkit)")
    return found


def ptx_input(args: list[str]) -> int | None:
    """Index of the PTX file among ptxas's arguments (Triton passes exactly one, named *.ptx)."""
    found = [i for i, a in enumerate(args) if a.endswith(".ptx") and not a.startswith("-") and os.path.isfile(a)]
    return found[-1] if found else None


def instrument_file(text: str, cfg: config.Config) -> tuple[str, str, list[KernelStatus]] | None:
    """(key, instrumented PTX with the marker, kernel statuses), or None when no kernel was instrumented."""
    from egpu_preload.runtime.probes import load_probes
    from egpu_preload.translate.rewrite import instrument
    # the rings' back-pressure as the runtime's: one ring's producers must all wait or all drop (devmaps.py)
    specs = [s for p in load_probes(cfg.probes, wait=cfg.on_full == "wait") for s in p.specs]
    res = instrument(text, specs, cfg.kernel)
    if not any(k.status == "instrumented" for k in res.kernels):
        return None
    key = hashlib.sha256(res.text.encode()).hexdigest()[:16]
    marked = res.text.rstrip("\n") + f"\n\n.visible .global .align 1 .b8 {MARKER}{key}[1];\n"
    return key, marked, res.kernels


def write_record(session: Path, key: str, ptx: str, original: str, kernels: list[KernelStatus]) -> Path:
    """``<session>/ptxas/<key>.ptx`` (what the real ptxas compiles) and ``<key>.msgpack`` (the record)."""
    d = session / "ptxas"
    d.mkdir(exist_ok=True)
    (d / f"{key}.ptx").write_text(ptx)
    tmp = d / f".{key}.{os.getpid()}.tmp"
    tmp.write_bytes(msgpack.packb({
        "kernels": [[k.name, k.status, k.reason, k.calls, k.launch_param_offset, k.nparams] for k in kernels],
        "ptx": original}, use_bin_type=True))
    os.replace(tmp, d / f"{key}.msgpack")
    return d / f"{key}.ptx"


def read_record(session: Path, image: bytes) -> dict[str, Any] | None:
    """The record of a cubin egpu-ptxas made in this session, None for any other image."""
    m = _MARKER_RE.search(image)
    if m is None:
        return None
    try:
        return msgpack.unpackb((session / "ptxas" / f"{m.group(1).decode()}.msgpack").read_bytes(), raw=False)
    except (OSError, ValueError):
        return None


def adopt(runtime: Any, mod: Any, image: Any) -> bool:
    """Treat a cubin load as instrumented when egpu-ptxas made it (instrumenter.Runtime, Module,
    hooks.ModuleImage); False leaves the module to the caller."""
    if image.kind != ImageKind.ELF or runtime.cfg.session is None:
        return False
    rec = read_record(runtime.cfg.session, image.data)
    if rec is None:
        return False
    mod.kernels = {n: KernelStatus(n, s, r, c, off, np) for n, s, r, c, off, np in rec["kernels"]}
    for name in mod.kernels:
        runtime.kernel_names[kernel_id(name)] = name
    mod.image, mod.status = "cubin from egpu-ptxas", "instrumented"
    mod.ptx, mod.probes = rec["ptx"], tuple(runtime.probes)
    mod.original = rec["ptx"].encode() + b"\0"  # loaded beside through the driver's JIT if need be
    return True


def main(argv: list[str] | None = None) -> None:
    """Run as Triton's ptxas: instrument the PTX argument, then exec the real ptxas (never returns)."""
    args = list(sys.argv[1:] if argv is None else argv)
    cfg = config.from_env()
    try:
        real = real_ptxas(cfg)
    except EgpuError as e:
        print(e, file=sys.stderr)
        sys.exit(127)
    i = ptx_input(args)
    if i is not None and cfg.probes and cfg.session is not None:
        try:
            original = Path(args[i]).read_text()
            done = instrument_file(original, cfg)
            if done is not None:
                key, ptx, kernels = done
                args[i] = str(write_record(cfg.session, key, ptx, original, kernels))
        except (EgpuError, OSError) as e:  # Triton gets the kernel without probes, never a failed compile
            print(f"egpu-ptxas: {args[i]}: not instrumented: {e}", file=sys.stderr)
    os.execv(real, [real, *args])


if __name__ == "__main__":
    main()
