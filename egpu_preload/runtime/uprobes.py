"""Host uprobes: ``SEC("uprobe/PATH:SYMBOL")``, ``SEC("uretprobe/PATH:SYMBOL")`` (libbpf's spelling) and
bpftime's bare ``SEC("uprobe")`` / ``SEC("uretprobe")`` with the target from ``egpu-run --uprobe
PROG=PATH:SYMBOL``. They run in the job's threads, in C (shim/uprobe.c: how calls are caught and which are
not), with r1 = ``struct pt_regs`` (bpf/ptregs.py).

Maps. A probe object's uprobes and launch probes are its host side (launches.launch_side): one copy of
the maps in C (runtime/native.py), the keys they change in maps GPU programs use copied to the device as
launch probes' are (launches.py, "Maps"). ``bpf_ktime_get_ns()`` reads the launch probes' clock
(CLOCK_MONOTONIC moved onto %globaltimer where GPU programs share a map).

Limits: uprobes run only in C, so an object whose host side the C engine refuses (ring buffers,
trace_printk: native.refusal) has its uprobes reported not attached; the runtime starts on the first
CUDA call, so calls made before it are not seen.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from egpu_preload.bpf.program import BpfObject, Program
from egpu_preload.bpf.sections import HOST_KINDS
from egpu_preload.errors import EgpuError

RESULTS = {0: "attached", 1: "pending: its object is not loaded yet", -1: "no such function in it",
           -2: "too many hooked functions or patched call sites"}


def host_programs(obj: BpfObject) -> list[Program]:
    return [p for p in obj.programs if p.attach.kind in HOST_KINDS]


def target(prog: Program, given: Mapping[str, str]) -> str | None:
    """PATH:SYMBOL of a host program: its section's, else egpu-run --uprobe's for its name."""
    return prog.attach.glob or given.get(prog.name)


def parse_option(text: str) -> tuple[str, str]:
    """``PROG=PATH:SYMBOL`` (egpu-run --uprobe) -> (PROG, PATH:SYMBOL); EgpuError otherwise."""
    name, eq, where = text.partition("=")
    path, colon, symbol = where.rpartition(":")
    if not (name and eq and path and colon and symbol):
        raise EgpuError(f"--uprobe {text!r}: expected PROG=PATH:SYMBOL")
    return name, where


def check_targets(objects: Sequence[BpfObject], given: Mapping[str, str]) -> None:
    """Every bare host program has a target and every --uprobe names one; EgpuError otherwise."""
    bare = {p.name for obj in objects for p in host_programs(obj) if not p.attach.glob}
    for name in sorted(bare - set(given)):
        raise EgpuError(f"prog {name} (uprobe): no target: give egpu-run --uprobe {name}=PATH:SYMBOL")
    for name in sorted(set(given) - bare):
        raise EgpuError(f"--uprobe {name}=...: no bare uprobe or uretprobe program is named {name}")


@dataclass
class Attached:
    program: Program
    where: str
    handle: Any       # the C program (kept alive by its native.Side)
    result: int


class Uprobes:
    """The host programs of every probe object, hooked in the shim; ``detach`` unhooks them."""

    def __init__(self, lib: Any, sides: Iterable[Any], given: Mapping[str, str]) -> None:
        self.lib = lib
        self.attached: list[Attached] = []
        self.refused: list[str] = []
        for side in sides:
            if side is None:
                continue
            hosts = [p for p in side.probe.obj.programs if p.attach.kind in HOST_KINDS]
            if hosts and side.native is None:
                self.refused += [f"{side.probe.path}: prog {p.name} ({p.section}): not attached: uprobes run in C "
                                 f"only, and {side.refusal or '--launch-vm python'}" for p in hosts]
                continue
            for p, handle in side.native.programs if side.native is not None else ():
                where = target(p, given) if p.attach.kind in HOST_KINDS else None
                if where is None:
                    continue
                path, _, symbol = where.rpartition(":")
                result = lib.egpu_uprobe_attach(path.encode(), symbol.encode(), int(p.attach.kind == "uretprobe"),
                                                handle)
                self.attached.append(Attached(p, where, handle, result))
                if result < 0:
                    self.refused.append(f"{side.probe.path}: prog {p.name} ({p.section}): not attached at {where}: "
                                        f"{RESULTS.get(result, result)}")

    def report(self) -> dict[str, Any]:
        """Each program's target and state (the dump's ``uprobes``), with the call sites patched."""
        return {"attached": [{"prog": a.program.name, "target": a.where, "state": RESULTS.get(a.result, a.result),
                              "sites": int(self.lib.egpu_uprobe_sites(a.where.rpartition(":")[2].encode()))}
                             for a in self.attached], "refused": self.refused}

    def detach(self) -> dict[str, Any]:
        """Unhook every program (no thread runs one after this); the report as it was before."""
        report = self.report()
        for a in self.attached:
            if a.result >= 0:
                self.lib.egpu_uprobe_detach(a.handle)
        self.attached = []
        return report


def attach(runtime: Any) -> Uprobes | None:
    """Hook the host programs of the runtime's probes (their C side is the launch drainer's), or None when
    there are none. What could not be attached is said on stderr."""
    drainer = runtime.drainer
    if drainer is None:
        return None
    runtime.lib.egpu_uprobe_clock(drainer.probes.offset)
    up = Uprobes(runtime.lib, drainer.probes.sides, runtime.cfg.uprobes)
    for line in up.refused:
        print(f"egpu: {line}", file=sys.stderr)
    return up
