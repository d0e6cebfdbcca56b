"""Probe objects ready to splice: loaded, every program verified, kernel-site programs translated.

egpu-run does this before the job starts (a bad probe stops it there); the runtime in each instrumented
process does it again from the same paths, so both agree on every name (the map table symbol depends
on the object's path: module.object_tag).
"""

from __future__ import annotations

import stat
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from egpu_preload.bpf.compile import compile_probe
from egpu_preload.bpf.elf import load_object
from egpu_preload.bpf.helpers import BY_NAME
from egpu_preload.bpf.lineinfo import located
from egpu_preload.bpf.program import HOST_ONLY_MAPS, MAP_PERF_EVENT_ARRAY, MAP_RINGBUF, MAP_TYPE_NAMES, BpfObject
from egpu_preload.bpf.sections import HOST_SIDE
from egpu_preload.bpf.verifier import VerifiedProgram, verify
from egpu_preload.errors import EgpuError
from egpu_preload.progress import Progress
from egpu_preload.runtime.native import api_refusal, maps_used
from egpu_preload.translate.launch_eval import Evaluated, evaluated
from egpu_preload.translate.module import object_tag, table_symbol
from egpu_preload.translate.rewrite import ProbeSpec, probe_specs

RING_TYPES = (MAP_RINGBUF, MAP_PERF_EVENT_ARRAY)


@dataclass(frozen=True)
class Probe:
    path: Path
    obj: BpfObject
    specs: tuple[ProbeSpec, ...]   # kernel-site programs (entry, exit, memory), translated
    table: str                     # the .const map table symbol instrumented modules declare
    warp_rings: frozenset[int] = frozenset()   # rings that only egpu_warp_mem_record writes (warp_rings())
    evaluated: Mapping[int, Evaluated] = field(default_factory=dict)   # programs a launch can count (launch_eval.py)


def load_probe(path: Path, wait: bool = False) -> Probe:
    """Load, verify and translate one .bpf.o; EgpuError (file:section:insn: reason) when it cannot run.
    ``wait``: its ring and perf buffers make producers wait for room (egpu-run --on-full wait)."""
    try:
        obj = load_object(path)
        if wait:
            obj.maps[:] = [replace(m, wait=True) if m.type in RING_TYPES else m for m in obj.maps]
        verified = verify_each(obj, str(path))
        host_only_refusal(obj)
        specs = tuple(probe_specs(obj, verified))
        why = api_refusal(obj)
        if why is not None:
            raise EgpuError(why)
    except EgpuError as e:
        raise e.where(file=str(path))
    if not obj.programs:
        raise EgpuError("no programs in the object", file=str(path))
    return Probe(Path(path), obj, specs, table_symbol(object_tag(obj)), warp_rings(verified),
                 evaluated(obj, verified))


def verify_each(obj: BpfObject, file: str) -> list[VerifiedProgram]:
    """Every program of ``obj`` verified; a refusal names its program, which bpf/lineinfo.py's located needs
    where the section holds others (two SEC("kprobe/*")): neither the source line nor which was refused
    was said."""
    verified = []
    for prog in obj.programs:
        try:
            verified.append(verify(prog.code, obj.maps, file=file, section=prog.section))
        except EgpuError as e:
            raise e.where(program=prog.name)
    return verified


def host_only_refusal(obj: BpfObject) -> None:
    """A GPU program using a QUEUE, STACK or BLOOM_FILTER map: EgpuError naming the program and the map (only host
    programs, in C or the VM, keep such maps)."""
    for p in obj.programs:
        if p.attach.kind in HOST_SIDE:
            continue
        for i in sorted(maps_used(p.code)):
            m = obj.maps[i]
            if m.type in HOST_ONLY_MAPS:
                raise EgpuError(f"{MAP_TYPE_NAMES[m.type].upper()} maps are host-only: GPU program {p.name} "
                                f"({p.section}) uses map {m.name}; use it from a launch, host-API or uprobe program")


_WARP = BY_NAME["egpu_warp_mem_record"].id
_RECORDS = frozenset(BY_NAME[h].id for h in ("ringbuf_output", "ringbuf_reserve", "perf_event_output"))


def warp_rings(verified: list[VerifiedProgram]) -> frozenset[int]:
    """The maps every record of which is a warp memory record: egpu_warp_mem_record writes them and no
    other helper does (a trace reader expands those records into per-lane rows: output/warp_records.py).
    None at all when a call that writes other records may take any map."""
    warp: set[int] = set()
    other: set[int] = set()
    for v in verified:
        for insn in v.insns:
            if insn.op != "call" or insn.src != 0 or insn.pc not in v.maps:
                continue
            index = v.maps[insn.pc]
            if insn.imm == _WARP and index is not None:
                warp.add(index)
            elif insn.imm in _RECORDS:
                if index is None:   # paths pass different maps: which get other records is not known
                    return frozenset()
                other.add(index)
    return frozenset(warp - other)


def load_probes(paths: tuple[Path, ...] | list[Path], wait: bool = False) -> list[Probe]:
    return [load_probe(p, wait) for p in paths]


def _is_pipe(path: Path) -> bool:
    try:
        mode = path.stat().st_mode
    except OSError:   # a path that is not there is read_input's to name
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def load_user_probe(path: Path, compiled: Path, *, progress: Progress | None = None, wait: bool = False) -> Probe:
    """A probe the user named, a .bpf.o or a .bpf.c (compiled to ``compiled``, clang's warnings said on
    ``progress``): loaded, verified and translated as load_probe does. A refusal names ``path`` and, from
    the object's line info, the source line (bpf/lineinfo.py), never the compiled copy."""
    progress = progress or Progress.quiet()
    obj = path
    if not path.name.endswith(".c") and _is_pipe(path):   # -p <(...): read here, then gone for the job's read
        raise EgpuError("is a pipe, not a file: each process of the job reads the probe again (give it a file)",
                        file=str(path))
    if path.name.endswith(".c"):
        with progress.step(f"compiling {path}"):
            obj = compile_probe(path, compiled, warn=progress.say)
    try:
        with progress.step(f"verifying and translating {path}"):
            return load_probe(obj.resolve(), wait)
    except EgpuError as e:
        try:
            data = obj.read_bytes()
        except OSError:
            data = b""
        raise located(e, data, str(path)) from None
