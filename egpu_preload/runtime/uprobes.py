"""Host uprobes: ``SEC("uprobe/PATH:SYMBOL")``, ``SEC("uretprobe/PATH:SYMBOL")`` (libbpf's spelling) and
bpftime's bare ``SEC("uprobe")`` / ``SEC("uretprobe")`` with the target from ``egpu-run --uprobe
PROG=PATH:SYMBOL``. They run in the job's threads, in C (shim/uprobe.c: how calls are caught and which are
not), with r1 = ``struct pt_regs`` (bpf/ptregs.py). A function no GOT slot or dlsym reaches (linked into
the executable) is hooked inline (inline_hooks.py).

Maps. A probe object's uprobes and launch probes are its host side (native.host_side): one copy of
the maps in C (runtime/native.py), the keys they change in maps GPU programs use copied to the device as
launch probes' are (launches.py, "Maps"). ``bpf_ktime_get_ns()`` reads the launch probes' clock
(CLOCK_MONOTONIC moved onto %globaltimer where GPU programs share a map).

Limits: uprobes run only in C, so an object whose host side the C engine refuses (native.refusal: a
map type it does not keep, a kfunc) has its uprobes reported not attached; ``bpf_printk``,
``bpf_ringbuf_output``, ``bpf_perf_event_output`` and ``bpf_ringbuf_reserve``/``submit``/``discard`` run
in C for objects with uprobes (launches.Drainer takes the lines and records, a record up to 256 bytes,
four reserved at once). The runtime starts on the first CUDA call, so
calls made before it are not seen.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from egpu_preload.bpf.program import BpfObject, Program
from egpu_preload.bpf.sections import HOST_KINDS
from egpu_preload.errors import EgpuError
from egpu_preload.runtime import dump, inline_hooks, native

RESULTS = {0: "attached", 1: "pending: its object is not loaded yet", -1: "no such function in it",
           -2: "too many hooked functions or patched call sites", -3: "it cannot be hooked inline",
           -4: "a thread stayed inside the 5 bytes the inline hook's jump covers (100 tries)",
           -5: "the other threads could not be held while the inline hook's jump was stored (SIGRTMAX-5 is the "
               "application's, or a thread did not answer in 10 tries): nothing written"}


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
    bare = {p.name: p.section for obj in objects for p in host_programs(obj) if not p.attach.glob}
    missing = sorted(set(bare) - set(given))
    if missing:
        name = missing[0]
        raise EgpuError(f"prog {name} ({bare[name]}): no target: give egpu-run --uprobe {name}=PATH:SYMBOL")
    unknown = sorted(set(given) - set(bare))
    if unknown:
        raise EgpuError(f"--uprobe {unknown[0]}=...: no bare uprobe or uretprobe program is named {unknown[0]}")


@dataclass
class Attached:
    program: Program
    where: str
    handle: Any       # the C program (kept alive by its native.Side)
    result: int
    inline: bool = False   # hooked inline (inline_hooks.py), not through GOT slots and dlsym


class Uprobes:
    """The host programs of every probe object, hooked in the shim; ``detach`` unhooks them."""

    def __init__(self, ffi: Any, lib: Any, sides: Iterable[tuple[Any, Any, str | None]],
                 given: Mapping[str, str]) -> None:
        """``sides``: (runtime Probe, its host side in C (native.Side) or None, why not in C)."""
        self.ffi, self.lib = ffi, lib
        self.attached: list[Attached] = []
        self.refused: list[str] = []
        for probe, in_c, refusal in sides:
            hosts = host_programs(probe.obj)
            if hosts and in_c is None:
                self.refused += [f"{probe.path}: prog {p.name} ({p.section}): not attached: uprobes run in C "
                                 f"only, and {refusal or '--launch-vm python'}" for p in hosts]
                continue
            by_target: dict[str, list[tuple[Program, Any]]] = {}
            for p, handle in in_c.programs if in_c is not None else ():
                where = target(p, given) if p.attach.kind in HOST_KINDS else None
                if where is not None:
                    by_target.setdefault(where, []).append((p, handle))
            for where, progs in by_target.items():  # a function's programs start together
                path, _, symbol = where.rpartition(":")
                handles = ffi.new("struct egpu_lvm_prog *[]", [h for _, h in progs])
                rets = ffi.new("int[]", [int(p.attach.kind == "uretprobe") for p, _ in progs])
                result = lib.egpu_uprobe_attach(path.encode(), symbol.encode(), handles, rets, len(progs))
                why, inline = None, result == -1
                if inline:   # no GOT slot or dlsym reaches it: linked into its object (the executable)
                    result, why = inline_hooks.attach(ffi, lib, path, symbol, handles, rets, len(progs))
                for p, handle in progs:
                    self.attached.append(Attached(p, where, handle, result, inline and result >= 0))
                    if result < 0:
                        self.refused.append(f"{probe.path}: prog {p.name} ({p.section}): not attached at {where}: "
                                            f"{why or RESULTS.get(result, result)}")

    def report(self) -> dict[str, Any]:
        """Each program's target and state (the dump's ``uprobes``), with the GOT slots patched, or
        ``inline`` where the function itself was (every call is caught)."""
        return {"attached": [{"prog": a.program.name, "target": a.where, "state": RESULTS.get(a.result, a.result),
                              "sites": int(self.lib.egpu_uprobe_sites(a.where.rpartition(":")[2].encode())),
                              "inline": a.inline}
                             for a in self.attached], "refused": self.refused}

    def detach(self) -> dict[str, Any]:
        """Unhook every program (no thread runs one after this); the report as it was before."""
        report = self.report()
        handles = [a.handle for a in self.attached if a.result >= 0]
        if handles:
            self.lib.egpu_uprobe_detach(self.ffi.new("struct egpu_lvm_prog *[]", handles), len(handles))
        self.attached = []
        return report


def attach(runtime: Any) -> Uprobes | None:
    """Hook the host programs of the runtime's probes (their C side is the launch drainer's), or None when
    there are none. What could not be attached is said on stderr."""
    drainer = runtime.drainer
    if drainer is None:
        return None
    runtime.lib.egpu_uprobe_clock(drainer.probes.offset)
    up = Uprobes(runtime.ffi, runtime.lib, [(s.probe, s.native, s.refusal) for s in drainer.probes.sides if s],
                 runtime.cfg.uprobes)
    for line in up.refused:
        print(f"egpu: {line}", file=sys.stderr)
    return up


def live_refusal(probe: Any) -> str | None:
    """Why ``egpu attach`` cannot hook the host programs of ``probe`` (a runtime Probe) yet; None when it can
    (or it has none). Live, their maps stay on the host: none may be one GPU programs use too."""
    hosts = host_programs(probe.obj)
    if not hosts:
        return None
    bare = [p.name for p in hosts if not p.attach.glob]
    if bare:
        return f"prog {bare[0]} is a bare uprobe: egpu attach takes SEC(\"uprobe/PATH:SYMBOL\") ones only"
    _, used, shared = native.host_side(probe.obj)
    if shared:
        names = ", ".join(sorted(probe.obj.maps[i].name for i in shared))
        return f"its uprobes share maps with GPU programs ({names}): only egpu-run runs those"
    why = native.refusal(hosts, probe.obj.maps, used)
    if why is None and native.queues(hosts):
        return "its uprobes print or send records (bpf_printk, ring or perf buffers): only egpu-run takes those"
    return f"uprobes run in C only, and {why}" if why else None


class LiveUprobes:
    """Host programs of probes attached to a running job (live.py), by probe name: each with its maps in
    C (a native.Side of its own) and its hooks."""

    def __init__(self, rt: Any) -> None:
        self.rt = rt  # the runtime: its shim's ffi and lib
        self.attached: dict[str, tuple[Any, Uprobes]] = {}

    def attach(self, name: str, probe: Any) -> dict[str, Any] | None:
        """Hook ``probe``'s host programs (live_refusal said it may); their report, None without any."""
        hosts = host_programs(probe.obj)
        if not hosts:
            return None
        _, used, _ = native.host_side(probe.obj)
        side = native.Side(self.rt.ffi, self.rt.lib, probe.obj.maps, used, hosts)
        up = Uprobes(self.rt.ffi, self.rt.lib, [(probe, side, None)], {})
        self.attached[name] = (side, up)
        return up.report()

    def detach(self, name: str) -> dict[int, Any]:
        """Unhook probe ``name``'s host programs; their maps as they were left (index -> MapStorage)."""
        side, up = self.attached.pop(name, (None, None))
        if side is None:
            return {}
        up.detach()
        return side.storages()

    def detach_all(self) -> dict[str, dict[int, Any]]:
        return {name: self.detach(name) for name in list(self.attached)}

    def maps(self, name: str) -> dict[int, Any]:
        side = self.attached.get(name, (None, None))[0]
        return side.storages() if side is not None else {}

    @staticmethod
    def overlay(probes: list[dict], host: dict[str, dict[int, Any]]) -> list[dict]:
        """Live documents (live.py's _read) with each probe's host maps in place of its device copies."""
        for doc in probes:
            for i, storage in host.get(doc.get("name", ""), {}).items():
                doc["maps"][i] = dump.storage_contents(storage)
        return probes
