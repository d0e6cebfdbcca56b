"""Launch probes (``SEC("egpu/launch/GLOB")``): run on the host, on the VM (compiled, vm/compile.py), once per launch of
every kernel the application launches through the driver, instrumented or not (SASS-only libraries
included), without adding anything to the application's streams.

How a launch reaches a probe. The shim writes one record per launch into its lock-free ring
(egpu_shim_records / egpu_shim_drain: launch id, CLOCK_MONOTONIC time just before the real launch,
the handle launched, grid, block, stream). A runtime thread drains the ring every ``PERIOD_S`` and runs
the launch probes whose glob matches the kernel, in launch order, with ``struct egpu_ctx``: kind
KIND_LAUNCH, kernel_id of the kernel's mangled name (from the handle -> name table the runtime keeps
from module lookups; 0 when the handle was never looked up through a hook), launch_id (the same id
the shim appends to instrumented kernels), grid, block, stream.

Time. ``bpf_ktime_get_ns()`` in a launch probe is the launch's enqueue time (the record's time, not the
moment the probe happens to run), on the %globaltimer clock: the record's CLOCK_MONOTONIC converted with
CLOCK_REALTIME - CLOCK_MONOTONIC measured once at start, plus %globaltimer - CLOCK_REALTIME measured by
a one-thread kernel when the device maps are made (driver.ContextMemory.globaltimer_offset; the driver
keeps %globaltimer in ns since the Unix epoch, but not exactly: 1.19 ms ahead on an H200). Only for
probe objects whose launch programs share a map with GPU programs, where the two clocks meet: the
measuring kernel is visible to profilers (torch.profiler listed it), so others keep CLOCK_REALTIME.

Maps. Each probe object's maps have one host copy for its launch probes (a MapsState), and the device
copy its GPU probes use (translate/devmaps.py). Which copy is authoritative depends on who uses a map:
- used by launch probes only: the host copy; the GPU never sees it. It goes into the exit dump and
  the live views (``dump_states``).
- used by GPU probes only: the device copy, as without launch probes.
- shared: every key (array index, global variable) a launch probe writes is copied into the device
  copy right after the probe ran (mapsync.py), with copies on a stream of the runtime's own, so no
  application stream waits. That is a few ms after the launch was enqueued: a GPU probe of the same
  launch sees the write only if the kernel starts later than that (it was queued behind other work);
  kernels that start earlier do not. Launch probes read the host copy, so they do not see what GPU
  probes wrote. A key has one writer side at a time (the host's copy of a key replaces the device's).
  Ring and perf buffers written by both sides: the dump lists the device's records, then the host's.
Under egpu-run --trace the host's ring and perf records and bpf_printk lines go to the trace file instead, as each
pass takes them (``Drainer.sink``: streaming.Streaming.host), beside the device's, with the same columns.
Writes made before the first instrumented module allocated the device copy are copied then.

Where probes run. A probe object whose launch side runtime/native.py accepts runs in C
(shim/launchvm.c): the drain takes its records from the ring and runs it there, a few hundred ns a
record, and Python never sees them; C logs the keys it changes in shared maps, and ``push`` copies
those as it copies the Python VM's. The others run on the Python VM (compiled), tens of us a record.
Launches of kernels no probe matches are dropped in C either way. Which handle runs what is decided
the first time it is launched (the drain stops there and asks), and forgotten when a module unloads,
since the driver hands the same handles out again.

Unified-memory probes (``SEC("egpu/uvm/GLOB")``) are host programs of the same object: they share its
host copy of the maps and run on the Python VM (an object with any runs there whole), from CUPTI's
thread, when runtime/uvm.py hands a buffer's records to ``Drainer.deliver_uvm``; ``struct
egpu_uvm_ctx`` is their context and bpf_ktime_get_ns() the record's start (CLOCK_REALTIME).

Host-API probes (egpu/memcpy, memset, alloc, free, sync) are part of the same host side: one set of
host maps per probe object with its launch programs, in C (native.py refuses an object they cannot run
in when it is loaded). They run in the application's thread, in the hook, after the driver call
(shim/hostapi.c); ``LaunchProbes`` routes them to the hooked APIs their globs match (native.ApiRoutes)
and takes them off before their programs are freed (``Drainer.stop``). Their ktime is this module's
clock: CLOCK_MONOTONIC plus ``offset``.

Limits: launches replayed from CUDA graphs (cuGraphLaunch) are not seen; a full ring drops records
(counted in the shim's stats as ``dropped``; egpu-run says how many at exit). The ring holds 16 Ki
records, so a loop of back-to-back launches outruns probes on the Python VM. Programs in C queue their
bpf_printk lines and ring and perf buffer records in a buffer of 16 Ki records of C's, which this thread
empties each pass: a program that outruns it loses what it makes, counted as what it was (``_take_lost``):
lines in a line at exit, records as drops of their map, where the map's own drops and the device's count too.
Under --on-full wait a run waits for room instead (egpu_lvm_trace_wait, set by this thread as it starts and
ends), until this thread has taken nothing for devmaps.WAIT_STALL_NS; it never waits on this thread, in a
thread holding the GIL (this one needs it), during a change of programs, or once this thread has ended.
"""

from __future__ import annotations

import functools
import struct
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from egpu_preload.bpf import ctx as C
from egpu_preload.bpf import program as prog
from egpu_preload.bpf.sections import API_KINDS, HOST_KINDS
from egpu_preload.errors import EgpuError
from egpu_preload.maps import MapsState, MapStorage, TraceRecord
from egpu_preload.runtime import dump, mapsync, native, uvm
from egpu_preload.runtime.launch_counts import LaunchCounts
from egpu_preload.runtime.probes import RING_TYPES, Probe
from egpu_preload.translate import devmaps
from egpu_preload.translate.demangle import matches
from egpu_preload.vm import ThreadSim, Vm

PERIOD_S = 0.002
BATCH = 4096
TRACE_BATCH = 1024


@dataclass(frozen=True)
class Launch:
    """One launch record (egpu_shim.h struct egpu_launch_record), the handle's name resolved."""
    launch_id: int
    time_ns: int           # CLOCK_MONOTONIC
    function: int
    stream: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    name: str | None


def clock_offset() -> int:
    """CLOCK_REALTIME - CLOCK_MONOTONIC in ns, from the tightest of a few bracketing reads."""
    best = None
    for _ in range(5):
        r1 = time.clock_gettime_ns(time.CLOCK_REALTIME)
        m = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        r2 = time.clock_gettime_ns(time.CLOCK_REALTIME)
        if best is None or r2 - r1 < best[0]:
            best = (r2 - r1, (r1 + r2) // 2 - m)
    return best[1]


def _context_struct() -> struct.Struct:
    """The fields of ``struct egpu_ctx`` a launch sets, in order, the others zero padding."""
    fields = [C.BY_NAME[n] for n in ("kernel_id", "launch_id", "kind", "grid", "block", "stream")]
    fmt, at = "<", 0
    for f in fields:
        fmt += f"{f.offset - at}x" * (f.offset > at) + f"{f.count}{'Q' if f.size == 8 else 'I'}"
        at = f.offset + f.size * f.count
    return struct.Struct(fmt + f"{C.SIZE - at}x" * (C.SIZE > at))


_CONTEXT = _context_struct()


def context_bytes(launch: Launch, kernel_id: int) -> bytes:
    """``struct egpu_ctx`` of a launch probe (egpu_preload/bpf/ctx.py)."""
    return _CONTEXT.pack(kernel_id, launch.launch_id, C.KIND_LAUNCH, *launch.grid, *launch.block, launch.stream)


class Touched:
    """A storage the VM uses in place of a shared map's, noting which keys a run changed: updated or
    deleted keys, and looked-up values the program then wrote through its pointer."""

    def __init__(self, inner: MapStorage) -> None:
        self.inner = inner
        self.mapdef = inner.mapdef
        self.written: set[bytes] = set()
        self.read: dict[bytes, bytes] = {}

    def lookup(self, key: bytes, cpu: int = 0) -> bytearray | None:
        value = self.inner.lookup(key, cpu)
        if value is not None:
            self.read.setdefault(bytes(key), bytes(value))
        return value

    def update(self, key: bytes, value: bytes, flags: int = 0, cpu: int = 0) -> int:
        r = self.inner.update(key, value, flags, cpu)
        if r == 0:
            self.written.add(bytes(key))
        return r

    def delete(self, key: bytes) -> int:
        r = self.inner.delete(key)
        if r == 0:
            self.written.add(bytes(key))
        return r

    def take(self) -> set[bytes]:
        """The keys changed since the last take."""
        changed = self.written | {k for k, v in self.read.items() if (self.inner.lookup(k) or v) != v}
        self.written, self.read = set(), {}
        return changed

    def __getattr__(self, name: str) -> Any:  # ring buffers: reserve, output, ...
        return getattr(self.inner, name)


@dataclass
class ProbeMaps:
    """One probe object's launch programs and the host copy of its maps: on the Python VM
    (``programs``), or in C (``native``; then ``programs`` is empty and ``refusal`` None)."""
    probe: Probe
    state: MapsState                      # what the VM runs against (shared maps wrapped in Touched)
    programs: list[tuple[prog.Program, Vm]]
    launch_only: set[int]
    shared: set[int]
    pending: dict[int, set[bytes]] = field(default_factory=dict)  # map -> keys not yet on the device
    native: native.Side | None = None
    lines_lost: int = 0                   # bpf_printk lines its programs in C lost (Drainer._take_lost)
    refusal: str | None = None            # why it is not in C (no engine given: None)

    def has_pending(self) -> bool:
        """Whether shared maps have keys to copy to the device."""
        return bool(self.pending) or (self.native is not None
                                      and any(self.native.changed(i) for i in self.native.tracked))

    def host_state(self) -> MapsState:
        """A copy of the host copy with plain storages, for the dump and the live views (taken under the
        drain's lock: Drainer.host_states): the maps host programs use, the others as they began."""
        st = MapsState(self.state.maps)
        in_c = self.native.storages() if self.native is not None else {}
        for i in self.launch_only | self.shared:
            if i in in_c:
                st.storages[i] = in_c[i]
            else:   # copied: the drain thread goes on changing the Python VM's maps and the records C queued
                s = self.state.storages[i]
                dump.restore_storage(st.storages[i], dump.storage_contents(s.inner if isinstance(s, Touched) else s))
        st.trace = list(self.state.trace)
        return st


def probe_maps(probe: Probe, engine: tuple[Any, Any] | None = None) -> ProbeMaps | None:
    """The host side of a probe object (its launch, uvm, host-API and uprobe programs, native.host_side),
    None when it has none; in C when ``engine`` (the shim's ffi and lib) is given and runtime/native.py takes it."""
    launch, by_launch, shared = native.host_side(probe.obj)
    if not launch:
        return None
    state = MapsState(probe.obj.maps)
    if engine is not None:
        refusal = native.refusal(launch, probe.obj.maps, by_launch)
        if refusal is None:
            side = native.Side(*engine, probe.obj.maps, by_launch, launch, shared)
            return ProbeMaps(probe, state, [], by_launch - shared, shared, native=side)
    else:
        refusal = None
    for i in shared:
        if probe.obj.maps[i].type not in RING_TYPES:
            state.storages[i] = Touched(state.storages[i])  # type: ignore[call-overload]
    # on the Python VM: launch and egpu/uvm programs (uprobes and host-API programs run only in C)
    return ProbeMaps(probe, state, [(p, Vm(p.code, probe.obj.maps, state, compiled=True)) for p in launch
                                    if p.attach.kind in ("launch", "uvm")],
                     by_launch - shared, shared, refusal=refusal)


@dataclass(frozen=True)
class Chosen:
    """What launches of one kernel run: Python VM programs, C programs, and the kernel id."""
    python: list[tuple[ProbeMaps, Vm]]
    native: list[Any]
    kernel_id: int


class LaunchProbes:
    """Every probe object's launch programs; ``run(launch)`` runs those on the Python VM matching the
    kernel, ``route`` tells the C side what a handle runs there, ``push`` copies what they wrote in
    shared maps to the device. ``engine``: the shim's (ffi, lib), for the drain (which drops the records
    of kernels no probe matches) and probes in C unless ``in_c`` is False (egpu-run --launch-vm
    python); None: every probe on the Python VM, no drain."""

    def __init__(self, probes: Sequence[Probe], only: str | None = None,
                 engine: tuple[Any, Any] | None = None, in_c: bool = True) -> None:
        self.probes = list(probes)  # the probes at start, the sides' owners (live.py may replace them later)
        # uprobes and host-API programs run in C whatever in_c says (they run nowhere else)
        self.sides = [probe_maps(p, engine if in_c or _c_only(p) else None) for p in probes]
        self.router = native.Router(*engine) if engine is not None else None
        self.apis = native.ApiRoutes(*engine, [s.native for s in self.sides if s and s.native]) \
            if engine is not None else None
        self.only = only  # egpu-run --kernel: launch probes see only those kernels too
        self._offset = 0
        self.offset = clock_offset()   # MONOTONIC -> REALTIME; the runtime adds REALTIME -> %globaltimer
        self._chosen: dict[str | None, Chosen] = {}
        self._uvm: dict[str, list[tuple[ProbeMaps, Vm]]] = {}  # counter kind name -> the programs it runs
        self.retired: set[int] = set()   # sides of probes detached or swapped out live: they run no more
        self.python_runs = 0
        self.errors: list[str] = []

    def __bool__(self) -> bool:
        return any(self.sides)

    @property
    def has_uvm(self) -> bool:
        """Whether any probe object has egpu/uvm programs."""
        return any(p.attach.kind == "uvm" for side in self.sides if side for p, _ in side.programs)

    @property
    def offset(self) -> int:
        """ns added to CLOCK_MONOTONIC for probes' ktime (launch records' times, host-API calls)."""
        return self._offset

    @offset.setter
    def offset(self, value: int) -> None:
        self._offset = value
        if self.router is not None:
            self.router.lib.egpu_lvm_api_clock(value)

    @property
    def runs(self) -> int:
        """Probe runs so far, on either side."""
        return self.python_runs + sum(s.native.runs() for s in self.sides if s and s.native)

    def _running(self) -> list[ProbeMaps]:
        """The sides whose programs run: every probe's but those retired."""
        return [s for i, s in enumerate(self.sides) if s and i not in self.retired]

    def _programs(self, name: str | None) -> Chosen:
        """The programs kernel ``name`` runs, and its kernel id."""
        chosen = self._chosen.get(name)
        if chosen is None:  # an unknown handle has no name: only a catch-all glob takes it
            def takes(glob: str) -> bool:
                return matches(glob, name) if name is not None else glob == "*"

            def runs(p: prog.Program) -> bool:
                return p.attach.kind == "launch" and takes(p.attach.glob) and (self.only is None or takes(self.only))
            chosen = self._chosen[name] = Chosen(
                [(side, vm) for side in self._running() for p, vm in side.programs if runs(p)],
                [h for side in self._running() if side.native for p, h in side.native.programs if runs(p)],
                C.kernel_id(name) if name else 0)
        return chosen

    def retire(self, probe: Probe) -> bool:
        """Stop the host programs of ``probe`` (one egpu-run started with, detached or swapped out live): no
        launch record, call or unified-memory record runs them from here on; their side stays, its maps as
        they were left (the final maps read them). Whether it had any. Under the drain's lock (Drainer.retire)."""
        i = self._index(probe)
        if i is None or not self.sides[i] or i in self.retired:
            return False
        self.retired.add(i)
        self._reroute()
        return True

    def restore(self, probe: Probe) -> None:
        """Run the host programs of ``probe``, retired by a change that then failed, again."""
        i = self._index(probe)
        if i in self.retired:
            self.retired.discard(i)
            self._reroute()

    def has_side(self, probe: Probe) -> bool:
        """Whether ``probe`` is one egpu-run started with that has host programs (read without the drain's
        lock: the probes and their sides are fixed at start)."""
        i = self._index(probe)
        return i is not None and bool(self.sides[i])

    def _index(self, probe: Probe) -> int | None:
        return next((i for i, p in enumerate(self.probes) if p is probe), None)

    def _reroute(self) -> None:
        """Routes made again for the sides running now: launch routes as records come, host-API ones at once."""
        self._chosen.clear()
        self._uvm.clear()
        if self.router is not None:
            self.router.clear()
        if self.apis is not None:
            self.apis.reroute([s.native for s in self._running() if s.native])

    def route(self, function: int, name: str | None) -> bool:
        """Tell the C side what launches of handle ``function`` (kernel ``name``) run; whether they
        go on to the Python VM too."""
        assert self.router is not None
        chosen = self._programs(name)
        self.router.route(function, chosen.kernel_id, chosen.native, bool(chosen.python))
        return bool(chosen.python)

    def faults(self) -> list[str]:
        """The errors of runs so far: the Python VM's, then each C program's first fault."""
        return self.errors + [line for s in self.sides if s and s.native for line in s.native.faults(s.probe.path)]

    def run(self, launch: Launch) -> None:
        chosen = self._programs(launch.name)
        programs, kernel_id = chosen.python, chosen.kernel_id
        if not programs:
            return
        ctx = context_bytes(launch, kernel_id)
        now = launch.time_ns + self.offset
        for side, vm in programs:
            self._run(side, vm, ctx, ThreadSim(block_dim=launch.block, grid_dim=launch.grid, globaltimer=now),
                      f"launch {launch.launch_id}")

    def run_uvm(self, record: uvm.UvmRecord) -> None:
        """The egpu/uvm programs whose glob matches the record's kind (uvm.COUNTERS), on the Python VM."""
        programs = self._uvm.get(record.name)
        if programs is None:
            programs = self._uvm[record.name] = [(side, vm) for side in self._running()
                                                 for p, vm in side.programs
                                                 if p.attach.kind == "uvm" and matches(p.attach.glob, record.name)]
        ctx = uvm.context_bytes(record)
        for side, vm in programs:
            self._run(side, vm, ctx, ThreadSim(globaltimer=record.start_ns), f"uvm {record.name} {record.address:#x}")

    def _run(self, side: ProbeMaps, vm: Vm, ctx: bytes, thread: ThreadSim, what: str) -> None:
        """One program run; the keys it changed in shared maps noted for ``push``."""
        try:
            vm.run(ctx, thread)
        except EgpuError as e:  # one bad run must not stop the others
            if len(self.errors) < 10:
                self.errors.append(f"{side.probe.path}: {what}: {e}")
        self.python_runs += 1
        for i in side.shared:
            s = side.state.storages[i]
            if isinstance(s, Touched):
                side.pending.setdefault(i, set()).update(s.take())

    def push(self, mem: mapsync.Memory, bases: Sequence[Sequence[int]]) -> None:
        """Copy the pending keys of shared maps into the device regions (``bases[probe][map]``)."""
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC) + self.offset
        for side, addrs in zip(self.sides, bases):
            if not side:
                continue
            for i, keys in side.pending.items():
                storage = side.state.storages[i].inner  # type: ignore[union-attr]
                for key in keys:
                    mapsync.push_key(mem, addrs[i], storage, key, now)
            side.pending = {}
            if side.native is not None:
                side.native.push(mem, addrs, now)


class Drainer:
    """The runtime thread: turns launch records on, drains the shim's ring every PERIOD_S, runs the
    launch probes, pushes shared-map writes. ``device()`` gives (memory, bases) once device maps exist."""

    def __init__(self, ffi: Any, lib: Any, probes: LaunchProbes, name_of: Callable[[int], str | None],
                 device: Callable[[], tuple[mapsync.Memory, list[list[int]]] | None], stall_ns: int = 0) -> None:
        self.ffi, self.lib = ffi, lib
        self.stall_ns = stall_ns   # > 0 (--on-full wait): host programs wait for room in C's buffer, this long
        self.probes = probes
        self.name_of = name_of
        self.device = device
        assert probes.router is not None, "a drainer runs probes built with the shim's engine"
        self.router = probes.router
        self.python_records = 0  # records the Python VM ran probes on
        self.uvm_records = 0     # unified-memory records delivered
        # programs in C -> their probe's host side, for the bpf_printk records C keeps (egpu_lvm_trace_take)
        self._owners = {int(ffi.cast("uintptr_t", h)): side for side in probes.sides if side and side.native
                        for _, h in side.native.programs}
        self._trace = ffi.new("struct egpu_lvm_trace[]", TRACE_BATCH)
        # what programs in C lost to C's full trace buffer (egpu_lvm_prog_lost): bpf_printk lines, and records by
        # (probe path, map name), which count in their map's drops too
        self._in_c = [side for side in probes.sides if side and side.native]
        self._lost = ffi.new("unsigned long long[]", 1 + max((len(s.state.maps) for s in self._in_c), default=0))
        self.records_dropped: dict[tuple[str, str], int] = {}
        # egpu-run --trace (streaming.Streaming.host): where host programs' ring and perf records and bpf_printk
        # lines go (trace_to)
        self.sink: Callable[[Probe, int, list[Any], int], None] | None = None
        self._prints = any(native.calls(native.host_side(side.probe.obj)[0], native.PRINTK) for side in probes.sides
                           if side)
        self._outputs = [(side, [i for i in sorted(side.launch_only | side.shared)
                                 if side.state.maps[i].type in RING_TYPES]) for side in probes.sides if side]
        self._buf = ffi.new("struct egpu_launch_record[]", BATCH)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="egpu-launches", daemon=True)

    def start(self) -> "Drainer":
        self.lib.egpu_shim_records(1)
        self._thread.start()
        return self

    def _loop(self) -> None:
        self.lib.egpu_lvm_trace_wait(self.stall_ns)   # this thread takes: runs wait for it, never on it
        try:
            while not self._stop.wait(PERIOD_S):
                try:
                    self.drain()
                except Exception as e:  # the thread goes on; the application never sees it
                    print(f"egpu: launch probes: {type(e).__name__}: {e}", file=sys.stderr)
        finally:
            self.lib.egpu_lvm_trace_wait(0)   # no take after this: a full buffer drops again

    def drain(self) -> int:
        """Run the probes on every record in the ring; how many there were."""
        total, router, probes = 0, self.router, self.probes
        with self._lock:
            while True:
                n, taken = router.drain(self._buf, BATCH, probes.offset)
                total += taken
                for k in range(n):
                    r = self._buf[k]
                    fn = int(self.ffi.cast("uintptr_t", r.function))
                    name = self.name_of(fn)
                    if fn not in router.python:  # its first launch: the drain stopped here
                        python = probes.route(fn, name)
                        router.run(self._buf + k, probes.offset)
                        if not python:
                            continue
                    probes.run(Launch(r.launch_id, r.time_ns, fn, int(self.ffi.cast("uintptr_t", r.stream)),
                                      tuple(r.grid), tuple(r.block), name))
                    self.python_records += 1
                if not taken:
                    break
            self._take_trace()
            self._hand_on()
            self._push()
        return total

    def _push(self) -> None:
        if any(s and s.has_pending() for s in self.probes.sides):
            dev = self.device()
            if dev is not None:
                self.probes.push(*dev)

    def _take_trace(self) -> None:
        """The bpf_printk lines programs in C made, onto their probe's host trace, and the records they
        output, into their ring or perf buffer, in order; then what they lost (``_take_lost``)."""
        while True:
            n = self.lib.egpu_lvm_trace_take(self._trace, TRACE_BATCH)
            for k in range(n):
                t = self._trace[k]
                side = self._owners.get(int(self.ffi.cast("uintptr_t", t.prog)))
                if side is None:
                    continue
                data = bytes(self.ffi.buffer(t.fmt, t.size))
                if t.map < 0:
                    side.state.trace.append(TraceRecord(data, (int(t.args[0]), int(t.args[1]), int(t.args[2]))))
                    continue
                storage = side.state.storages[t.map]   # never Touched: a side in C tracks its maps itself
                if side.state.maps[t.map].type == prog.MAP_PERF_EVENT_ARRAY:
                    storage.output(0, data)   # the host is CPU 0, as in the VM's launch runs
                else:
                    storage.output(data)
            if n < TRACE_BATCH:
                break
        self._take_lost()

    def _take_lost(self) -> None:
        """What programs in C lost to C's full trace buffer, by kind: bpf_printk lines counted here, ring and perf
        buffer records as drops of their map, as the map counts those it found full, and the device its own (one
        count a map: ``merge``), so the dump, --json, --trace and the live views show them."""
        lost = self._lost
        for side in self._in_c:
            for _, handle in side.native.programs:   # type: ignore[union-attr]
                self.lib.egpu_lvm_prog_lost(handle, lost)
                side.lines_lost += lost[0]
                for i, m in enumerate(side.state.maps):
                    if lost[1 + i]:
                        side.state.storages[i].drops += lost[1 + i]   # type: ignore[union-attr]
                        key = (str(side.probe.path), m.name)
                        self.records_dropped[key] = self.records_dropped.get(key, 0) + lost[1 + i]

    @property
    def lines_dropped(self) -> int:
        """The bpf_printk lines host programs in C lost to C's full trace buffer."""
        return sum(side.lines_lost for side in self._in_c)

    @property
    def outputs(self) -> bool:
        """Whether any host program may output to a ring or perf buffer, or print a bpf_printk line."""
        return self._prints or any(rings for _, rings in self._outputs)

    def trace_to(self, sink: Callable[[Probe, int, list[Any], int], None] | None, wait: bool) -> None:
        """Under --trace, host programs' ring and perf records and bpf_printk lines go to ``sink`` after each pass
        (None: they stay in their maps again, the lines in their host trace, which the exit prints); ``wait``
        (--on-full wait): records also whenever one finds its map full, as a waiting GPU producer has the reader
        make room, since a pass's records (a loop's, many launches') may outgrow the map (they were dropped and
        counted: a trace with holes in it)."""
        self.sink = sink
        for side, rings in self._outputs:
            for i in rings:
                spill = functools.partial(self._spill, side, i) if sink is not None and wait else None
                side.state.storages[i].spill = spill  # type: ignore[attr-defined]

    def _hand_on(self) -> None:
        """Under --trace, every record host programs output since the last pass taken out of its map (room
        made, as the ring reader makes it on the device) and handed to ``sink``, with the map's drops so far;
        and their bpf_printk lines, as the device's trace_printk ring's records (after its maps, the host as CPU 0),
        with the lines lost so far."""
        if self.sink is None:
            return
        for side, rings in self._outputs:
            for i in rings:
                self._spill(side, i)
        for side in self.probes.sides:
            if side and (side.state.trace or side.lines_lost):
                lines = [(0, devmaps.PRINTK_ARGS.pack(*t.args) + t.fmt) for t in side.state.trace]
                side.state.trace.clear()
                self.sink(side.probe, len(side.state.maps), lines, side.lines_lost)

    def _spill(self, side: ProbeMaps, i: int) -> None:
        """Map ``i`` of ``side``'s records taken out of it and handed to ``sink``, with the map's drops so far."""
        storage = side.state.storages[i]
        self.sink(side.probe, i, storage.consume(), storage.drops)  # type: ignore[attr-defined,misc]

    def deliver_uvm(self, records: list[uvm.UvmRecord]) -> None:
        """Run the egpu/uvm programs on ``records`` (runtime/uvm.py's sink), in order. It runs on CUPTI's
        buffer thread, which must make no CUDA calls: the drain thread copies what they wrote in shared
        maps to the device on its next round."""
        with self._lock:
            for r in records:
                self.probes.run_uvm(r)
            self.uvm_records += len(records)

    def stop(self) -> None:
        """Host-API calls run no program any more, records off, the thread joined, and what was left in the
        ring run."""
        if self.probes.apis is not None:
            self.probes.apis.clear()
        self.lib.egpu_shim_records(0)
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.drain()
        for line in self.probes.faults():
            print(f"egpu: launch probe failed: {line}", file=sys.stderr)
        for line in self._dropped_lines():
            print(f"egpu: {line}", file=sys.stderr)

    def _dropped_lines(self) -> list[str]:
        """What host programs in C lost to C's full trace buffer (the drain thread ran behind them), each kind
        apart: bpf_printk lines, and each ring or perf buffer's records (in its dropped count too)."""
        why = "the C buffer was full"
        lines = [f"{self.lines_dropped} bpf_printk lines of host probes dropped ({why})"] if self.lines_dropped else []
        return lines + [f"{path}: {n} records of host probes for @{name} dropped ({why}; counted in its dropped)"
                        for (path, name), n in self.records_dropped.items()]

    def report(self) -> dict[str, Any]:
        """Where each probe object's launch programs ran (the dump's ``launch_probes``)."""
        sides = [s for s in self.probes.sides if s]
        out: dict[str, Any] = {"in_c": [str(s.probe.path) for s in sides if s.native],
                               "python_vm": {str(s.probe.path): s.refusal or "--launch-vm python"
                                             for s in sides if not s.native},
                               "python_records": self.python_records}
        if self.probes.has_uvm:
            out["uvm_records"] = self.uvm_records
        if self.probes.apis is not None and self.probes.apis.attached:
            out["host_apis"] = self.probes.apis.attached  # section -> the hooked symbols it runs on
        return out

    def retire(self, probe: Probe, uprobes: Any = None) -> None:
        """LaunchProbes.retire under the drain's lock (a record being run finishes first), ``probe``'s
        programs in ``uprobes`` (the runtime's uprobes.Uprobes) paused, then what they wrote in shared maps
        pushed: its regions exact, and pushed no more (nothing of it runs). A probe attached live has nothing
        here, and does not wait for the lock, which a pass holds while it runs records (on the H200 detaches
        and swaps of live probes in a PyTorch job waited 130-510 ms for it)."""
        if not self.probes.has_side(probe):
            return
        with self._lock:
            if self.probes.retire(probe):
                if uprobes is not None:
                    uprobes.pause(probe, True)
                self._push()

    def restore(self, probe: Probe, uprobes: Any = None) -> None:
        """Undo ``retire`` (the change that retired ``probe`` failed): its programs run again."""
        if not self.probes.has_side(probe):
            return
        with self._lock:
            self.probes.restore(probe)
            if uprobes is not None:
                uprobes.pause(probe, False)

    def host_states(self) -> dict[int, tuple[ProbeMaps, MapsState]]:
        """id(probe) -> (its host side, a copy of the side's maps now), for every start-up probe that has
        one. Copied under the drain's lock, so no run and no take of C's records changes them while they
        are copied: the live views read them while the job runs."""
        with self._lock:
            return {id(s.probe): (s, s.host_state()) for s in self.probes.sides if s}

    def api_names(self) -> list[list[Any]]:
        """[api id, symbol] of every hooked API a host-API program runs on (dump's names of ids)."""
        apis = self.probes.apis
        symbols = sorted({s for found in apis.attached.values() for s in found}) if apis is not None else []
        return [[C.api_id(s), s] for s in symbols]

    def forget(self) -> None:
        """Decide again what every handle runs (a module was unloaded: its handles may come back
        as other kernels')."""
        with self._lock:
            self.router.clear()


def attach(runtime: Any) -> Drainer | None:
    """The drain thread for an instrumenter.Runtime whose probes have launch programs (started), else
    None. Names come from the runtime's handle table, device maps from its maps once allocated."""
    probes = LaunchProbes(runtime.probes, runtime.cfg.kernel, (runtime.ffi, runtime.lib), runtime.cfg.launch_vm == "c")
    if not probes:
        return None
    for line in probes.apis.unmatched() if probes.apis is not None else ():
        print(f"egpu: {line}", file=sys.stderr)

    def name_of(handle: int) -> str | None:
        found = runtime.functions.get(handle)
        return found[1] if found else None

    def device() -> tuple[mapsync.Memory, list[list[int]]] | None:
        """The regions of each side's own probe: a detach or swap changes runtime.maps, not the sides."""
        maps, memory = runtime.startup_maps, runtime.memory
        if not maps or memory is None:
            return None
        return memory, [m.addrs for m in maps]

    stall_ns = devmaps.WAIT_STALL_NS if runtime.cfg.on_full == "wait" else 0
    return Drainer(runtime.ffi, runtime.lib, probes, name_of, device, stall_ns).start()


def _c_only(probe: Probe) -> bool:
    """Whether ``probe`` has host programs that run only in C, in the hooks: uprobes or host-API programs."""
    return any(p.attach.kind in API_KINDS or p.attach.kind in HOST_KINDS for p in probe.obj.programs)


def dump_states(drainer: Drainer | None, probes: Sequence[Probe], device: Sequence[MapsState] | None,
                live: Sequence[Mapping[int, MapStorage]] = (),
                counts: Mapping[int, LaunchCounts] | None = None) -> list[MapsState] | None:
    """Every probe's maps as the exit dump has them, and the live views too (live.py: egpu maps, the mirror,
    --interval, a detach's or swap's final maps): the device's read back (None: none were allocated) with
    each probe's host side merged in (``merge``) and the counts launches added for its evaluated programs
    (``counts``, by id(probe): launch_counts.py), then the host-only maps of uprobes attached live
    (``live``, by probe: uprobes.LiveUprobes); None when there is nothing to show. Host sides are found by
    their probe, so ``probes`` may be any of them; a probe attached live has none here (the drainer's
    sides are the start-up probes')."""
    hosts = drainer.host_states() if drainer is not None else {}
    counts = counts or {}   # a launch counted only once a SASS-served load made the device maps: device is set
    if device is None and not hosts:
        return None
    states = []
    for i, p in enumerate(probes):
        state = device[i] if device is not None else None
        if id(p) in hosts:
            state = merge(*hosts[id(p)], state)
        state = state or MapsState(p.obj.maps)
        if id(p) in counts:
            counts[id(p)].add_into(state)
        states.append(state)
    for state, host in zip(states, live):
        for i, storage in host.items():
            state.storages[i] = storage
    return states


def merge(side: ProbeMaps, host: MapsState, device: MapsState | None) -> MapsState:
    """A probe's maps from its device state (None: no module had its maps) and its host side's state
    ``host``: the host copies of maps only host programs use, the device's of shared ones (every key the
    host wrote was pushed there), and the ring records and trace lines of both, the device's first."""
    if device is None:
        return host
    for i in side.launch_only:
        device.storages[i] = host.storages[i]
    for i in side.shared:
        if device.maps[i].type in RING_TYPES:
            device.storages[i].records += host.storages[i].records  # type: ignore[attr-defined]
            device.storages[i].drops += host.storages[i].drops      # type: ignore[attr-defined]
    device.trace += host.trace
    return device
