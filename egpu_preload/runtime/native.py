"""Host programs in C (shim/launchvm.c): which probe objects' host sides run there, their maps and
programs, the routes of host-API programs to the driver APIs the shim hooks (shim/hostapi.c), and the
maps read back into the host containers the dumps print.

A probe object's host side (``host_side``: its launch, egpu/uvm, host-API and uprobe programs, on one host copy
of its maps) runs in C when every map they use is an ARRAY, PERCPU_ARRAY, a hash map (HASH, LRU_HASH,
PERCPU_HASH, LRU_PERCPU_HASH), QUEUE, STACK, BLOOM_FILTER or global data, and they call only the helpers in
``NATIVE_HELPERS`` (bpf_loop included: C calls its callback as the VM does): then no record of its kernels
reaches Python. In an object with uprobes or host-API programs, which run only in C, trace_printk,
bpf_ringbuf_output, bpf_perf_event_output and bpf_ringbuf_reserve/submit/discard run there too, on ring and perf
buffers the runtime keeps (C queues each record, launches.Drainer puts it in the map; a record over 256 bytes is
refused: -E2BIG from an output call, NULL from a reserve, as is a fifth reserve held at once). Maps GPU programs
share are tracked in C (the keys a run changed are logged, launches.py pushes them to the device copy).
Otherwise (ring and perf buffers, trace_printk, egpu/uvm programs) its launch programs run on the Python VM, and
``refusal`` says why.

Uprobes and host-API programs run in the application's thread, inside the hook, so they run in C or not
at all: uprobes of an object C cannot take are not attached (runtime/uprobes.py), and an object with
host-API programs C cannot take is refused when it is loaded (``api_refusal``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase
from typing import Any

from egpu_preload.bpf import isa
from egpu_preload.bpf import program as prog
from egpu_preload.bpf.decode import decode
from egpu_preload.bpf.disasm import disasm_insn
from egpu_preload.bpf.helpers import BPF_ANY, BY_NAME, HELPERS
from egpu_preload.bpf.sections import API_KINDS, HOST_KINDS, HOST_SIDE
from egpu_preload.maps import STORAGE_BY_TYPE, BloomStorage, MapStorage, QueueStorage
from egpu_preload.runtime import mapsync

MAP_TYPES = frozenset((prog.MAP_ARRAY, prog.MAP_PERCPU_ARRAY)) | prog.HASHES | prog.HOST_ONLY_MAPS
OUTPUT_MAPS = frozenset((prog.MAP_RINGBUF, prog.MAP_PERF_EVENT_ARRAY))   # kept by the runtime, fed from C
# with uprobes: what C hands to the runtime (launches.Drainer) rather than keeps
QUEUED_HELPERS = frozenset(BY_NAME[n].id for n in ("trace_printk", "ringbuf_output", "perf_event_output",
                                                    "ringbuf_reserve", "ringbuf_submit", "ringbuf_discard"))
PRINTK = frozenset((BY_NAME["trace_printk"].id,))
# launchvm.c's helper() and bpf_loop(): every helper but those that send records or text to the host
NATIVE_HELPERS = frozenset(HELPERS) - QUEUED_HELPERS - {BY_NAME["egpu_warp_mem_record"].id}
MAX_ENTRIES, MAX_VALUE = 1 << 24, 1 << 20  # launchvm.c's limits on a map's shape
FAULTS = {1: "bad memory access", 2: "write to read-only memory", 3: "unaligned atomic access",
          4: "not a map", 5: "invalid instruction", 6: "call depth exceeds 8 frames",
          7: "instruction budget exhausted (unbounded loop?)", 8: "out of memory"}


def maps_used(code: bytes) -> set[int]:
    """Indices of the maps a program refers to (lddw with a map-index source)."""
    return {i.imm & 0xFFFFFFFF for i in decode(code) if i.kind == "lddw"
            and i.src in (isa.LDDW_MAP_IDX, isa.LDDW_MAP_IDX_VALUE)}


def host_side(obj: prog.BpfObject) -> tuple[list[prog.Program], set[int], set[int]]:
    """An object's host programs (sections.HOST_SIDE: launch, uvm, host-API and uprobes, which all run on
    one host copy of its maps), the maps they use, and which of those GPU programs use too."""
    host = [p for p in obj.programs if p.attach.kind in HOST_SIDE]
    by_host = set().union(*(maps_used(p.code) for p in host)) if host else set()
    others = [p for p in obj.programs if p.attach.kind not in HOST_SIDE]
    by_gpu = set().union(*(maps_used(p.code) for p in others)) if others else set()
    return host, by_host, by_host & by_gpu


def refusal(programs: Sequence[prog.Program], maps: Sequence[prog.MapDef], used: Iterable[int]) -> str | None:
    """Why an object's host programs (``host_side``) using maps ``used`` cannot run in C; None when they can.
    egpu/uvm programs never do (CUPTI's thread runs them on the Python VM). trace_printk and ring or perf
    buffer output run in C for an object with uprobes or host-API programs, which run only in C
    (launches.Drainer takes their records)."""
    uvm = [p.name for p in programs if p.attach.kind == "uvm"]
    if uvm:
        return f"{uvm[0]} is an egpu/uvm program"
    queued = any(p.attach.kind in HOST_KINDS or p.attach.kind in API_KINDS for p in programs)
    allowed = NATIVE_HELPERS | QUEUED_HELPERS if queued else NATIVE_HELPERS
    for i in sorted(used):
        m = maps[i]
        if queued and m.type in OUTPUT_MAPS:
            continue
        if m.type not in MAP_TYPES:
            return f"map {m.name} is a {prog.MAP_TYPE_NAMES.get(m.type, m.type)}"
        least_key = 0 if m.type in prog.HOST_ONLY_MAPS else 1   # a queue, stack or bloom filter has no key
        if m.max_entries > MAX_ENTRIES or not 0 < m.value_size <= MAX_VALUE or not least_key <= m.key_size <= MAX_VALUE:
            return f"map {m.name} is larger than the C engine takes ({MAX_ENTRIES} entries of {MAX_VALUE} bytes)"
    for p in programs:
        for insn in decode(p.code):
            if insn.kind == "call" and insn.src == isa.CALL_BTF:
                return f"{p.name} calls a kfunc"
            if insn.kind == "call" and insn.src == isa.CALL_HELPER and insn.imm not in allowed:
                helper = HELPERS.get(insn.imm)
                return f"{p.name} calls {helper.name if helper else insn.imm}"
    return None


def api_refusal(obj: prog.BpfObject) -> str | None:
    """Why the object cannot be loaded: its host-API programs run only in C, in the hooks, and ``refusal``
    says C cannot take its host side; None when it can or it has none."""
    host, used, _ = host_side(obj)
    if not any(p.attach.kind in API_KINDS for p in host):
        return None
    why = refusal(host, obj.maps, used)
    return None if why is None else (f"host-API programs run only in C, in the hooks, which cannot take this "
                                     f"object: {why}")


def queues(programs: Sequence[prog.Program]) -> bool:
    """Whether any of ``programs`` hands C something only the runtime's drainer takes: a bpf_printk line
    or a ring or perf buffer record (QUEUED_HELPERS)."""
    return calls(programs, QUEUED_HELPERS)


def calls(programs: Sequence[prog.Program], helpers: frozenset[int]) -> bool:
    """Whether any of ``programs`` calls one of ``helpers`` (their ids)."""
    return any(i.kind == "call" and i.src == isa.CALL_HELPER and i.imm in helpers
               for p in programs for i in decode(p.code))


class Side:
    """One probe object's host programs and their maps, in C; those in ``shared`` tracked."""

    def __init__(self, ffi: Any, lib: Any, maps: Sequence[prog.MapDef], used: Iterable[int],
                 programs: Sequence[prog.Program], shared: Iterable[int] = ()) -> None:
        self.ffi, self.lib = ffi, lib
        self.mapdefs = maps
        self.maps: dict[int, Any] = {}
        for i in sorted(used):
            m = maps[i]
            if m.type in OUTPUT_MAPS:   # the runtime's (launches.Drainer): C only names them
                continue
            initial = m.initial or b""
            made = lib.egpu_lvm_map_new(m.type, m.key_size, m.value_size, m.max_entries, int(m.readonly),
                                        initial, len(initial), m.map_extra)
            if made == ffi.NULL:
                raise MemoryError(f"map {m.name}: no memory for {m.max_entries} entries")
            self.maps[i] = ffi.gc(made, lib.egpu_lvm_map_free)
        self.tracked = [i for i in sorted(shared) if i in self.maps]   # a shared ring is the runtime's
        for i in self.tracked:
            lib.egpu_lvm_map_track(self.maps[i])
        table = ffi.new("struct egpu_lvm_map *[]", [self.maps.get(i, ffi.NULL) for i in range(len(maps))] or 1)
        self.programs: list[tuple[prog.Program, Any]] = []
        for p in programs:
            made = lib.egpu_lvm_prog_new(p.code, len(p.code) // 8, table, len(maps))
            if made == ffi.NULL:
                raise MemoryError(f"{p.name}: no memory for the program")
            self.programs.append((p, ffi.gc(made, lib.egpu_lvm_prog_free)))

    def storages(self) -> dict[int, MapStorage]:
        """The maps' contents now, as the host containers the VM would have filled."""
        out = {i: self._storage(i, self._fetch(i, self.lib.egpu_lvm_map_read)) for i in self.maps}
        for i, storage in out.items():
            if isinstance(storage, BloomStorage):   # its bits are no rows
                self.lib.egpu_lvm_map_bits(self.maps[i], self.ffi.from_buffer(storage.bits), len(storage.bits), 0)
        return out

    def changed(self, i: int) -> bool:
        """Whether tracked map ``i`` has changed keys not yet taken."""
        return self.lib.egpu_lvm_map_changes(self.maps[i], self.ffi.NULL, self.ffi.NULL, self.ffi.NULL, 0) > 0

    def changes(self, i: int) -> tuple[MapStorage, list[bytes]]:
        """Take tracked map ``i``'s changed keys: a host container with their values now (the keys
        still there) and the keys, for mapsync.push_key."""
        rows = self._fetch(i, self.lib.egpu_lvm_map_changes, present=True)
        return self._storage(i, rows), [key for key, _ in rows]

    def push(self, mem: mapsync.Memory, addrs: Sequence[int], now_ns: int) -> None:
        """Copy the keys the programs changed in tracked maps since the last push into their device
        regions (``addrs``, by map index); ``now_ns`` stamps LRU slots (mapsync.push_key). A map with no
        change is passed over: changes() builds a host container of the map's size (an ARRAY's every entry)."""
        for i in self.tracked:
            if not self.changed(i):
                continue
            storage, keys = self.changes(i)
            for key in keys:
                mapsync.push_key(mem, addrs[i], storage, key, now_ns)

    def load(self, i: int, storage: MapStorage) -> None:
        """Put ``storage``'s entries into map ``i`` (none logged as changed); a bloom filter's bits."""
        if isinstance(storage, BloomStorage):
            self.lib.egpu_lvm_map_bits(self.maps[i], self.ffi.from_buffer(storage.bits), len(storage.bits), 1)
            return
        rows = list(storage.items())
        keys = self.ffi.new("unsigned char[]", b"".join(bytes(k) for k, _ in rows) or b"\0")
        values = self.ffi.new("unsigned char[]", b"".join(bytes(v) for _, v in rows) or b"\0")
        if self.lib.egpu_lvm_map_load(self.maps[i], keys, values, len(rows)) < len(rows):
            raise MemoryError(f"map {self.mapdefs[i].name}: {len(rows)} entries do not fit")

    def _fetch(self, i: int, call: Any, present: bool = False) -> list[tuple[bytes, bytes | None]]:
        """Map ``i``'s (key, value) rows from ``call(map, keys, values[, present], max)``, asked first with
        max 0 for the count (egpu_lvm_map_read, egpu_lvm_map_changes); None for a key that is gone."""
        m, null = self.mapdefs[i], self.ffi.NULL
        flags = [null] if present else []
        n = call(self.maps[i], null, null, *flags, 0)
        keys = self.ffi.new("unsigned char[]", n * m.key_size or 1)
        values = self.ffi.new("unsigned char[]", n * m.value_size or 1)
        flags = [self.ffi.new("unsigned char[]", n or 1)] if present else []
        n = min(n, call(self.maps[i], keys, values, *flags, n))
        kb, vb = self.ffi.buffer(keys), self.ffi.buffer(values)
        return [(kb[k * m.key_size:(k + 1) * m.key_size],
                 vb[k * m.value_size:(k + 1) * m.value_size] if not flags or flags[0][k] else None) for k in range(n)]

    def _storage(self, i: int, rows: list[tuple[bytes, bytes | None]]) -> MapStorage:
        """A host container of map ``i``'s kind holding ``rows`` (those with a value), in their order."""
        storage = STORAGE_BY_TYPE[self.mapdefs[i].type](self.mapdefs[i])
        for key, value in rows:
            if isinstance(storage, QueueStorage):   # a queue's or stack's values, oldest first
                storage.push(value, BPF_ANY)
            elif value is not None:
                storage.update(key, value, BPF_ANY)
        return storage

    def runs(self) -> int:
        return sum(self._stats(h).runs for _, h in self.programs)

    def faults(self, path: object) -> list[str]:
        """One line for each program that faulted: how often, the first fault and where."""
        lines = []
        for p, handle in self.programs:
            s = self._stats(handle)
            if s.faults:
                insn = {i.pc: i for i in decode(p.code)}.get(s.fault_pc)
                where = f" ({disasm_insn(insn)})" if insn is not None else ""
                when = f"launch {s.fault_launch}" if p.attach.kind == "launch" else f"{p.section}"
                lines.append(f"{path}: {when}: {p.name}: {FAULTS.get(s.fault, s.fault)} at pc "
                             f"{s.fault_pc}{where}" + (f"; {s.faults} runs faulted" if s.faults > 1 else ""))
        return lines

    def _stats(self, handle: Any) -> Any:
        s = self.ffi.new("struct egpu_lvm_stats *")
        self.lib.egpu_lvm_prog_stats(handle, s)
        return s


class Router:
    """What each launched handle runs in C (egpu_lvm_route), and the drain through it."""

    def __init__(self, ffi: Any, lib: Any) -> None:
        self.ffi, self.lib = ffi, lib
        self.handle = ffi.gc(lib.egpu_lvm_router_new(), lib.egpu_lvm_router_free)
        if self.handle == ffi.NULL:
            raise MemoryError("no memory for the launch router")
        self.python: dict[int, bool] = {}  # routed handles: do their records go on to Python?

    def route(self, function: int, kernel_id: int, programs: Sequence[Any], python: bool) -> None:
        progs = self.ffi.new("struct egpu_lvm_prog *[]", list(programs) or 1)
        if self.lib.egpu_lvm_route(self.handle, self.ffi.cast("void *", function), kernel_id, progs,
                                   len(programs), int(python)):
            raise MemoryError("no memory for a launch route")
        self.python[function] = python

    def clear(self) -> None:
        """Forget every route."""
        self.lib.egpu_lvm_router_clear(self.handle)
        self.python.clear()

    def run(self, record: Any, offset: int) -> None:
        self.lib.egpu_lvm_run(self.handle, record, offset)

    def drain(self, out: Any, max_records: int, offset: int) -> tuple[int, int]:
        """(records in ``out``, records taken from the shim's ring)."""
        taken = self.ffi.new("unsigned long long *")
        n = self.lib.egpu_lvm_drain(self.handle, out, max_records, offset, taken)
        return n, taken[0]


def host_apis(ffi: Any, lib: Any) -> list[tuple[str, str, str]]:
    """The shim's hooked driver APIs by number (egpu_host_apis): (symbol, API name, section or "")."""
    n = lib.egpu_host_apis(ffi.NULL, ffi.NULL, ffi.NULL, 0)
    cols = [ffi.new("const char *[]", n) for _ in range(3)]
    lib.egpu_host_apis(*cols, n)
    return [tuple(ffi.string(c[i]).decode() for c in cols) for i in range(n)]  # type: ignore[misc]


def api_matches(p: prog.Program, symbol: str, api: str, section: str) -> bool:
    """Whether host-API program ``p`` runs on calls of ``symbol``: its section's, and its GLOB matches the
    API's name or the symbol (``cuMemcpyHtoDAsync*`` takes cuMemcpyHtoDAsync_v2 and _v2_ptsz)."""
    return p.attach.kind == section and (fnmatchcase(api, p.attach.glob) or fnmatchcase(symbol, p.attach.glob))


class ApiRoutes:
    """Which host-API programs, of every side, the calls of each hooked API run (egpu_lvm_route_api)."""

    def __init__(self, ffi: Any, lib: Any, sides: Sequence[Side]) -> None:
        self.ffi, self.lib = ffi, lib
        self.attached: dict[str, list[str]] = {}  # section of a program -> the symbols it runs on
        self.routed: list[int] = []
        self.reroute(sides)

    def reroute(self, sides: Sequence[Side]) -> None:
        """Route every hooked API to the host-API programs of ``sides`` that match it, in place: an API
        whose programs stay never runs none meanwhile; one left with none runs none."""
        programs = [(p, h) for side in sides for p, h in side.programs if p.attach.kind in API_KINDS]
        attached: dict[str, list[str]] = {p.section: [] for p, _ in programs}
        routed = []
        for i, (symbol, api, section) in enumerate(host_apis(self.ffi, self.lib) if programs or self.routed else []):
            chosen = [(p, h) for p, h in programs if api_matches(p, symbol, api, section)]
            if not chosen:
                if i in self.routed:
                    self.lib.egpu_lvm_route_api(i, self.ffi.NULL, 0)
                continue
            table = self.ffi.new("struct egpu_lvm_prog *[]", [h for _, h in chosen])
            if self.lib.egpu_lvm_route_api(i, table, len(chosen)):
                raise MemoryError(f"no memory for the route of {symbol}")
            routed.append(i)
            for p, _ in chosen:
                attached[p.section].append(symbol)
        self.attached, self.routed = attached, routed

    def unmatched(self) -> list[str]:
        """One line for each host-API program no hooked API matched."""
        return [f"{section}: no driver API the shim hooks matches: the program never runs"
                for section, symbols in self.attached.items() if not symbols]

    def clear(self) -> None:
        """Calls run no program any more (before the programs are freed)."""
        for i in self.routed:
            self.lib.egpu_lvm_route_api(i, self.ffi.NULL, 0)
        self.routed = []
