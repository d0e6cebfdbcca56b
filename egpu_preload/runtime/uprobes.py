"""Host uprobes: ``SEC("uprobe/PATH:SYMBOL")``, ``SEC("uretprobe/PATH:SYMBOL")`` (libbpf's spelling) and
bpftime's bare ``SEC("uprobe")`` / ``SEC("uretprobe")`` with the target from ``egpu-run --uprobe
PROG=PATH:SYMBOL``. They run in the job's threads, in C (shim/uprobe.c: how calls are caught and which are
not), with r1 = ``struct pt_regs`` (bpf/ptregs.py). A function no GOT slot or dlsym reaches (linked into
the executable) is hooked inline (inline_hooks.py).

Maps. A probe object's uprobes and launch probes are its host side (native.host_side): one copy of
the maps in C (runtime/native.py), the keys they change in maps GPU programs use copied to the device as
launch probes' are (launches.py, "Maps": by the drainer at start-up, by ``Pushes`` for probes attached
live). ``bpf_ktime_get_ns()`` reads the launch probes' clock (CLOCK_MONOTONIC moved onto %globaltimer
where GPU programs share a map: measured at start-up, or at the first live attach of such an object).

Limits: uprobes run only in C, so an object whose host side the C engine refuses (native.refusal: a
map type it does not keep, a kfunc) has its uprobes reported not attached; ``bpf_printk``,
``bpf_ringbuf_output``, ``bpf_perf_event_output`` and ``bpf_ringbuf_reserve``/``submit``/``discard`` run
in C for objects with uprobes (launches.Drainer takes the lines and records, a record up to 256 bytes,
four reserved at once). The runtime starts on the first CUDA call, so
calls made before it are not seen.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from egpu_preload.bpf.program import BpfObject, Program
from egpu_preload.bpf.sections import HOST_KINDS, host_target_refusal
from egpu_preload.errors import EgpuError
from egpu_preload.maps import MapsState
from egpu_preload.runtime import inline_hooks, mapsync, native
from egpu_preload.runtime.launches import PERIOD_S
from egpu_preload.translate.devmaps import DeviceMaps, apply_region

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
    if why := host_target_refusal(where):
        raise EgpuError(f"--uprobe {name}={why}")
    return name, where


def parse_options(texts: Sequence[str]) -> dict[str, str]:
    """Every ``--uprobe PROG=PATH:SYMBOL`` as {PROG: PATH:SYMBOL}; EgpuError for a PROG given twice (the last
    one was taken without a word: a program attaches at one function)."""
    targets: dict[str, str] = {}
    for name, where in map(parse_option, texts):
        if name in targets:
            raise EgpuError(f"--uprobe {name}=...: given twice ({targets[name]}, {where}): a program attaches at "
                            "one function")
        targets[name] = where
    return targets


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
        self.waiting: list[str] = []   # targets no loaded object is yet: a misspelt one would say nothing else
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
                    elif result == 1:
                        self.waiting.append(f"{probe.path}: prog {p.name} ({p.section}): no loaded object is {path} "
                                            f"yet: {where} is hooked once one is loaded")

    def report(self) -> dict[str, Any]:
        """Each program's target and state (the dump's ``uprobes``), with the GOT slots patched, or
        ``inline`` where the function itself was (every call is caught). A state is read now: one pending at
        the attach may have been hooked since its library was loaded."""
        return {"attached": [{"prog": a.program.name, "target": a.where, "state": RESULTS.get(self._state(a), a.result),
                              "sites": int(self.lib.egpu_uprobe_sites(a.where.rpartition(":")[2].encode())),
                              "inline": a.inline}
                             for a in self.attached], "refused": self.refused}

    def pause(self, probe: Any, paused: bool) -> None:
        """Stop running the programs of ``probe`` alone (no thread runs one after), or run them again; their
        functions stay hooked, so this cannot fail (egpu_uprobe_pause)."""
        handles = [a.handle for a in self._of(probe) if a.result >= 0]
        if handles:
            self.lib.egpu_uprobe_pause(self.ffi.new("struct egpu_lvm_prog *[]", handles), len(handles), int(paused))

    def detach_probe(self, probe: Any) -> None:
        """Unhook the programs of ``probe`` alone (detached or swapped out live); no thread runs one after."""
        mine = self._of(probe)
        self._unhook(mine)
        self.attached = [a for a in self.attached if a not in mine]

    def _state(self, a: Attached) -> int:
        """Its attach's result, or for one left pending what became of it since (egpu_uprobe_state)."""
        if a.result != 1:
            return a.result
        path, _, symbol = a.where.rpartition(":")
        return int(self.lib.egpu_uprobe_state(path.encode(), symbol.encode()))

    def _of(self, probe: Any) -> list[Attached]:
        return [a for a in self.attached if any(a.program is p for p in probe.obj.programs)]

    def detach(self) -> dict[str, Any]:
        """Unhook every program (no thread runs one after this); the report as it was before."""
        report = self.report()
        self._unhook(self.attached)
        self.attached = []
        return report

    def _unhook(self, attached: list[Attached]) -> None:
        handles = [a.handle for a in attached if a.result >= 0]
        if handles:
            self.lib.egpu_uprobe_detach(self.ffi.new("struct egpu_lvm_prog *[]", handles), len(handles))


def attach(runtime: Any) -> Uprobes | None:
    """Hook the host programs of the runtime's probes (their C side is the launch drainer's), or None when
    there are none. What could not be attached, and what waits for its object to be loaded, is said on stderr."""
    drainer = runtime.drainer
    if drainer is None:
        return None
    runtime.lib.egpu_uprobe_clock(drainer.probes.offset)
    up = Uprobes(runtime.ffi, runtime.lib, [(s.probe, s.native, s.refusal) for s in drainer.probes.sides if s],
                 runtime.cfg.uprobes)
    for line in up.refused + up.waiting:
        print(f"egpu: {line}", file=sys.stderr)
    return up


def none_hooked(probe: Any, report: dict[str, Any] | None) -> str | None:
    """Why nothing of ``probe`` runs when its programs are all uprobes and none was hooked or waits for its
    library to load (each one's state); None when it has a GPU program or such a uprobe."""
    if report is None or len(host_programs(probe.obj)) < len(probe.obj.programs):
        return None
    if any(u["state"] in (RESULTS[0], RESULTS[1]) for u in report["attached"]):
        return None
    return "; ".join(f"prog {u['prog']} at {u['target']}: {u['state']}" for u in report["attached"]) \
        or "no uprobe was hooked"


def live_refusal(probe: Any) -> str | None:
    """Why ``egpu attach`` cannot hook the host programs of ``probe`` (a runtime Probe) yet; None when it can
    (or it has none). Live, nothing drains what C queues (bpf_printk lines, ring and perf buffer records):
    an object whose uprobes make any is refused, as are bare uprobes (no --uprobe names their target) and
    host sides C cannot run. Maps they share with GPU programs are pushed to the device (LiveUprobes)."""
    hosts = host_programs(probe.obj)
    if not hosts:
        return None
    bare = [p.name for p in hosts if not p.attach.glob]
    if bare:
        return f"prog {bare[0]} is a bare uprobe: egpu attach takes SEC(\"uprobe/PATH:SYMBOL\") ones only"
    _, used, _ = native.host_side(probe.obj)
    why = native.refusal(hosts, probe.obj.maps, used)
    if why is None and native.queues(hosts):
        return "its uprobes print or send records (bpf_printk, ring or perf buffers): only egpu-run takes those"
    return f"uprobes run in C only, and {why}" if why else None


class Pushes:
    """A thread that copies the keys live uprobes changed in maps they share with GPU programs into their
    probe's device regions every launches.PERIOD_S, as the launch drainer does for egpu-run's probes
    (launches.py, "Maps"), while any such probe is attached. Its own thread, not the drainer's: a job
    started with no host probe has no drainer, and the drainer's sides are the start-up probes'."""

    def __init__(self, memory: mapsync.Memory) -> None:
        self.memory = memory
        self.sides: dict[str, tuple[native.Side, list[int], int]] = {}  # name -> (side, regions, clock offset)
        self.lock = threading.Lock()   # held by every push: once ``stop`` returns, none writes that probe's regions
        self._thread: threading.Thread | None = None

    def start(self, name: str, side: native.Side, addrs: list[int], offset: int) -> None:
        """Push ``side``'s tracked maps into regions ``addrs`` (by map index); ``offset``: the clock's
        (CLOCK_MONOTONIC to %globaltimer), for LRU stamps."""
        with self.lock:
            self.sides[name] = (side, addrs, offset)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="egpu-uprobe-maps", daemon=True)
                self._thread.start()

    def stop(self, name: str) -> tuple[native.Side, list[int], int] | None:
        """Push what probe ``name``'s uprobes left (its regions exact after this; they have stopped), then no
        more; what ``start`` took for it (None: nothing was pushed)."""
        with self.lock:
            entry = self.sides.pop(name, None)
            if entry is not None:
                self._push(*entry)
            return entry

    def _loop(self) -> None:
        while True:
            time.sleep(PERIOD_S)
            with self.lock:
                if not self.sides:   # the next start makes a thread again
                    self._thread = None
                    return
                for entry in self.sides.values():
                    try:
                        self._push(*entry)
                    except Exception as e:  # the thread goes on; the application never sees it
                        print(f"egpu: uprobes' shared maps: {type(e).__name__}: {e}", file=sys.stderr)

    def _push(self, side: native.Side, addrs: list[int], offset: int) -> None:
        side.push(self.memory, addrs, time.clock_gettime_ns(time.CLOCK_MONOTONIC) + offset)


@dataclass
class Live:
    """A probe's uprobes hooked live (LiveUprobes): its host side in C, its hooks, and while it is paused
    what its map pushes took (Pushes.start's arguments)."""
    probe: Any
    side: native.Side
    uprobes: Uprobes
    pushing: tuple[native.Side, list[int], int] | None = None


class LiveUprobes:
    """Host programs of probes attached to a running job (live.py), by probe name: each with its maps in
    C (a native.Side of its own) and its hooks. Maps they share with GPU programs start from the device
    copy (a swap may have taken the region over with its contents) and are pushed there (Pushes); the
    device copy, which holds both sides' writes, is the one to read; the host copy of the others."""

    def __init__(self, rt: Any) -> None:
        self.rt = rt  # the runtime: its shim's ffi and lib, its maps' memory and clock
        self.attached: dict[str, Live] = {}
        self.paused: dict[str, Live] = {}   # taken off ``attached`` while a change that may fail is made
        self.pushes: Pushes | None = None

    def attach(self, name: str, probe: Any, maps: DeviceMaps) -> dict[str, Any] | None:
        """Hook ``probe``'s host programs (live_refusal said it may), ``maps`` its device maps; their report,
        None without any."""
        hosts = host_programs(probe.obj)
        if not hosts:
            return None
        _, used, shared = native.host_side(probe.obj)
        side = native.Side(self.rt.ffi, self.rt.lib, probe.obj.maps, used, hosts, shared)
        memory = self.rt.memory
        offset = self.rt.align_clocks(memory) if side.tracked else 0   # before the hooks: calls read the clock
        state = MapsState(probe.obj.maps)
        for i in side.tracked:   # before the hooks: no call may change a key the device's value then replaces
            apply_region(state, i, memory.read(maps.addrs[i], maps.layouts[i].region_size(maps.ncpu)))
            side.load(i, state.storages[i])
        up = Uprobes(self.rt.ffi, self.rt.lib, [(probe, side, None)], {})
        self.attached[name] = Live(probe, side, up)
        if side.tracked:   # what calls changed meanwhile is logged, and goes with the first push
            if self.pushes is None:
                self.pushes = Pushes(memory)
            self.pushes.start(name, side, maps.addrs, offset)
        return up.report()

    def pause(self, name: str) -> None:
        """Probe ``name``'s host programs run no more, still hooked, and what they left in shared maps is
        pushed (before a flip retires its regions): a detach or swap that fails runs them again (``resume``),
        maps and hooks as they were, and a call that entered meanwhile returns without them; one that goes
        through unhooks them (``retire``)."""
        live = self.attached.pop(name, None)
        if live is None:
            return
        live.uprobes.pause(live.probe, True)
        if self.pushes is not None:
            live.pushing = self.pushes.stop(name)
        self.paused[name] = live

    def resume(self, name: str) -> None:
        live = self.paused.pop(name, None)
        if live is None:
            return
        live.uprobes.pause(live.probe, False)
        if live.pushing is not None and self.pushes is not None:
            self.pushes.start(name, *live.pushing)
        self.attached[name] = live

    def retire(self, name: str) -> dict[int, Any]:
        """Unhook probe ``name``'s paused host programs; their host-only maps as they were left (index ->
        MapStorage)."""
        live = self.paused.pop(name, None)
        if live is None:
            return {}
        live.uprobes.detach()
        return self._host_only(live.side)

    def detach(self, name: str) -> dict[int, Any]:
        """Unhook probe ``name``'s running host programs and push what they left in shared maps; their
        host-only maps as they were left."""
        live = self.attached.pop(name, None)
        if live is None:
            return {}
        live.uprobes.detach()
        if self.pushes is not None:
            self.pushes.stop(name)
        return self._host_only(live.side)

    def detach_all(self) -> dict[str, dict[int, Any]]:
        return {**{name: self.retire(name) for name in list(self.paused)},
                **{name: self.detach(name) for name in list(self.attached)}}

    def maps(self, name: str) -> dict[int, Any]:
        """Probe ``name``'s host-only maps now (index -> MapStorage)."""
        live = self.attached.get(name) or self.paused.get(name)
        return self._host_only(live.side) if live is not None else {}

    @staticmethod
    def _host_only(side: native.Side) -> dict[int, Any]:
        return {i: s for i, s in side.storages().items() if i not in side.tracked}
