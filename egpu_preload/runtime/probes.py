"""Probe objects ready to splice: loaded, every program verified, kernel-site programs translated.

egpu-run does this before the job starts (a bad probe stops it there); the runtime in each instrumented
process does it again from the same paths, so both agree on every name (the map table symbol depends
on the object's path: module.object_tag).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from egpu_preload.bpf.elf import load_object
from egpu_preload.bpf.program import BpfObject
from egpu_preload.bpf.verifier import verify
from egpu_preload.errors import EgpuError
from egpu_preload.translate.module import object_tag, table_symbol
from egpu_preload.translate.rewrite import ProbeSpec, probe_specs


@dataclass(frozen=True)
class Probe:
    path: Path
    obj: BpfObject
    specs: tuple[ProbeSpec, ...]   # kernel-site programs (entry, exit, memory), translated
    table: str                     # the .const map table symbol instrumented modules declare


def load_probe(path: Path) -> Probe:
    """Load, verify and translate one .bpf.o; EgpuError (file:section:insn: reason) when it cannot run."""
    try:
        obj = load_object(path)
        verified = [verify(prog.code, obj.maps, file=str(path), section=prog.section) for prog in obj.programs]
        specs = tuple(probe_specs(obj, verified))
    except EgpuError as e:
        raise e.where(file=str(path))
    if not obj.programs:
        raise EgpuError("no programs in the object", file=str(path))
    return Probe(Path(path), obj, specs, table_symbol(object_tag(obj)))


def load_probes(paths: tuple[Path, ...] | list[Path]) -> list[Probe]:
    return [load_probe(p) for p in paths]
