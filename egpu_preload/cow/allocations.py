"""The application's live allocations as an address-range index, and which of them a launch may touch.

The shim keeps the authoritative list (a hash table in C, updated after every successful allocation
and free; egpu_shim_allocations() copies it out). ``AllocationTable.sync`` folds such a copy into the
Python index: sorted start addresses searched with bisect, so ``find(ptr)`` is O(log n). VMM handles
(cuMemCreate) are not addresses (egpu_shim.h keeps them in their own key space), so they are kept
apart and never match a pointer; their mappings (cuMemMap) are the ranges.

``seq`` numbers allocations in creation order over the whole process, freed ones included, so the
same deterministic program gives the same numbers on a re-run: restore matches allocations by it.

``launch_uses`` is the conservative fallback of issue 7: with the kernel's PTX read/write sets it
looks up exactly the pointers the kernel dereferences; without them every 8-byte aligned word of the
arguments that points into an allocation marks that allocation read-write. Neither can see pointers
the kernel loads from memory; rwsets reports those (``KernelRW.exact`` is False) and ``anything`` says
so here, for the caller to treat as "may touch every allocation".
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Iterable

from egpu_preload.cow.rwsets import KernelRW, mode_union
from egpu_preload.translate import ptx


class AllocKind(IntEnum):
    """enum egpu_alloc_kind of egpu_shim.h."""

    DEVICE = 1
    PITCH = 2
    MANAGED = 3
    ASYNC = 4
    HOST = 5
    HOST_REGISTERED = 6
    VMM_HANDLE = 7
    VMM_MAPPING = 8


@dataclass(frozen=True)
class Allocation:
    seq: int            # creation order, process-wide
    address: int        # device pointer, host pointer, or (VMM_HANDLE) the handle
    size: int
    kind: AllocKind

    @property
    def end(self) -> int:
        return self.address + self.size

    def contains(self, ptr: int) -> bool:
        return self.address <= ptr < self.end


class AllocationTable:
    def __init__(self) -> None:
        self._starts: list[int] = []                 # sorted; parallel to _ranges
        self._ranges: list[Allocation] = []
        self._handles: dict[int, Allocation] = {}    # VMM handles, by handle
        self._next_seq = 0

    def __len__(self) -> int:
        return len(self._ranges) + len(self._handles)

    def __iter__(self):
        """Every live allocation, ranges by address then VMM handles."""
        yield from self._ranges
        yield from self._handles.values()

    def by_creation(self) -> list[Allocation]:
        return sorted(self, key=lambda a: a.seq)

    def insert(self, address: int, size: int, kind: int, seq: int | None = None) -> Allocation:
        """Add an allocation (seq: the next number unless the shim gave one). A range that overlaps
        live ones replaces them: the driver hands out a range only after its free, so an overlap means
        a free this table did not see."""
        kind = AllocKind(kind)
        if seq is None:
            seq = self._next_seq
        self._next_seq = max(self._next_seq, seq + 1)
        alloc = Allocation(seq, address, size, kind)
        if kind == AllocKind.VMM_HANDLE:
            self._handles[address] = alloc
            return alloc
        lo = bisect.bisect_left(self._starts, address)
        if lo and self._ranges[lo - 1].end > address:
            lo -= 1
        hi = bisect.bisect_left(self._starts, max(address + size, address + 1))
        del self._starts[lo:hi], self._ranges[lo:hi]
        self._starts.insert(lo, address)
        self._ranges.insert(lo, alloc)
        return alloc

    def remove(self, address: int, kind: int | None = None) -> Allocation | None:
        """Forget the allocation starting at ``address`` (a VMM handle when kind is VMM_HANDLE)."""
        if kind == AllocKind.VMM_HANDLE:
            return self._handles.pop(address, None)
        i = bisect.bisect_left(self._starts, address)
        if i < len(self._starts) and self._starts[i] == address:
            del self._starts[i]
            return self._ranges.pop(i)
        return None

    def find(self, ptr: int) -> Allocation | None:
        """The live range allocation containing ``ptr``, or None."""
        i = bisect.bisect_right(self._starts, ptr) - 1
        if i >= 0 and self._ranges[i].contains(ptr):
            return self._ranges[i]
        return None

    def overlapping(self, ptr: int, size: int) -> list[Allocation]:
        """Live range allocations that [ptr, ptr + size) touches (a memcpy's or memset's buffers)."""
        i = max(bisect.bisect_right(self._starts, ptr) - 1, 0)
        j = bisect.bisect_left(self._starts, ptr + max(size, 1))
        return [a for a in self._ranges[i:j] if a.end > ptr]

    def sync(self, live: Iterable[tuple[int, ...]]) -> tuple[list[Allocation], list[Allocation]]:
        """Make the table equal to the shim's list of (address, size, kind[, seq]) rows; returns
        (added, removed). Rows without seq are numbered in the order given."""
        rows = {(r[0], r[1], int(r[2])): (r[3] if len(r) > 3 else None) for r in live}
        removed = [a for a in list(self) if (a.address, a.size, int(a.kind)) not in rows]
        for a in removed:
            self.remove(a.address, a.kind)
        have = {(a.address, a.size, int(a.kind)) for a in self}
        added = [self.insert(*key, seq) for key, seq in rows.items() if key not in have]
        return added, removed


def read_shim(ffi: Any, lib: Any) -> list[tuple[int, int, int, int]]:
    """(address, size, kind, seq) of every allocation in the shim's table (egpu_shim_allocations)."""
    room = 256
    while True:
        buf = ffi.new("struct egpu_alloc[]", room)
        total = lib.egpu_shim_allocations(buf, room)
        if total <= room:
            return [(buf[i].address, buf[i].size, buf[i].kind, buf[i].seq) for i in range(total)]
        room = total + total // 4   # it grew meanwhile: ask again with room to spare


def param_offsets(params: tuple[ptx.Param, ...]) -> list[int]:
    """Byte offset of each parameter in the launch's parameter buffer: each one aligned to its own
    alignment, in order (the layout CU_LAUNCH_PARAM_BUFFER_POINTER takes)."""
    out, off = [], 0
    for p in params:
        off = -(-off // p.align) * p.align
        out.append(off)
        off += p.size
    return out


def pack_args(values: list[bytes], params: tuple[ptx.Param, ...]) -> bytes:
    """The parameter buffer for a kernelParams launch, from each parameter's bytes (values[i] is what
    kernelParams[i] points to, params[i].size long)."""
    offsets = param_offsets(params)
    buf = bytearray(offsets[-1] + params[-1].size if params else 0)
    for off, p, v in zip(offsets, params, values):
        buf[off:off + p.size] = v[:p.size]
    return bytes(buf)


@dataclass
class LaunchUses:
    modes: dict[Allocation, str] = field(default_factory=dict)   # allocation -> r|w|rw
    globals: dict[str, str] = field(default_factory=dict)        # module .global symbol -> r|w|rw
    anything: bool = False      # the kernel may also touch allocations no argument points into


def launch_uses(args: bytes, table: AllocationTable, params: tuple[ptx.Param, ...] | None = None,
                rw: KernelRW | None = None) -> LaunchUses:
    """The allocations one launch reads and writes, from its parameter buffer ``args``.

    With ``params`` and an exact ``rw`` (rwsets for this kernel): the pointer at each (param, offset)
    the kernel dereferences, with the kernel's mode. Otherwise every 8-byte aligned word of the
    parameters (of the whole buffer when ``params`` is None) that points into an allocation makes it
    read-write; an inexact ``rw`` adds its precise modes and sets ``anything``."""
    out = LaunchUses()
    offsets = dict(zip((p.name for p in params), param_offsets(params))) if params else {}
    if rw is not None and params:
        out.globals = dict(rw.globals)
        out.anything = not rw.exact
        for (name, off), mode in rw.access.items():
            pos = offsets[name] + off
            if pos + 8 > len(args):
                out.anything = True   # a buffer shorter than the signature: trust nothing
                continue
            alloc = table.find(int.from_bytes(args[pos:pos + 8], "little"))
            if alloc is not None:
                out.modes[alloc] = mode_union(out.modes.get(alloc, ""), mode)
        if rw.exact and not out.anything:
            return out
    spans = [(offsets[p.name], p.size) for p in params] if params else [(0, len(args))]
    for start, size in spans:
        for pos in range(-(-start // 8) * 8, min(start + size, len(args)) - 7, 8):
            alloc = table.find(int.from_bytes(args[pos:pos + 8], "little"))
            if alloc is not None:
                out.modes[alloc] = "rw"
    return out
