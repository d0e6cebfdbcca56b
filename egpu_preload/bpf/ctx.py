"""``struct egpu_ctx``: what a probe sees in r1. The layout is ABI: egpu.bpf.h, the verifier, the VM and
the PTX rewriter (which fills it in) all read these offsets from here.

Host sections that are not about a kernel get a context of their own (``Layout``; ``layout_of_section``
says which a section gets): ``egpu/uvm/GLOB`` probes get ``struct egpu_uvm_ctx`` (UVM_CTX, filled by
runtime/uvm.context_bytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

# Attach kinds, stored in ctx.kind.
KIND_ENTRY, KIND_EXIT, KIND_MEM, KIND_LAUNCH = 0, 1, 2, 3
# ctx.flags bits for memory sites.
FLAG_LOAD, FLAG_STORE, FLAG_ATOMIC = 1, 2, 4
MAX_ARGS = 8


@dataclass(frozen=True)
class Field:
    name: str
    offset: int
    size: int      # bytes of one element
    count: int = 1


FIELDS: tuple[Field, ...] = (
    Field("kernel_id", 0, 8),   # FNV-1a 64 of the mangled kernel name (kernel_id() below)
    Field("launch_id", 8, 8),   # counts launches of instrumented kernels, process-wide
    Field("addr", 16, 8),       # memory sites: the effective (generic) address
    Field("site", 24, 4),       # index of the instrumented instruction within the kernel
    Field("size", 28, 4),       # memory sites: bytes accessed
    Field("flags", 32, 4),      # FLAG_*
    Field("kind", 36, 4),       # KIND_*
    Field("args", 40, 8, MAX_ARGS),  # the kernel's first parameters, each zero-extended to 64 bits
    Field("nargs", 104, 4),
    Field("grid", 108, 4, 3),   # launch probes: gridDim
    Field("block", 120, 4, 3),  # launch probes: blockDim
    Field("pad", 132, 4),
    Field("stream", 136, 8),    # launch probes: the CUstream handle
)
SIZE = 144
WORDS = SIZE // 8

# What r1 holds where a probe's context is not in memory (its words passed in registers, or none read).
# Not NULL: the verifier proves ctx never NULL, so a probe's `if (!ctx)` branch is not translated; and
# farther from 0 than any offset it allows.
NO_ADDRESS = 1 << 40
BY_NAME: dict[str, Field] = {f.name: f for f in FIELDS}
ALL_FIELDS: frozenset[str] = frozenset(BY_NAME)


class Layout(NamedTuple):
    """A context struct: its C name, its fields, its size in bytes."""
    name: str
    fields: tuple[Field, ...]
    size: int


EGPU_CTX = Layout("egpu_ctx", FIELDS, SIZE)
# struct egpu_uvm_ctx: one unified-memory event (runtime/uvm.py says what each holds per counter kind).
UVM_CTX = Layout("egpu_uvm_ctx", (
    Field("addr", 0, 8),        # the first page's virtual address (faults: the faulting page)
    Field("bytes", 8, 8),       # migrations, thrashing, remote maps: bytes; faults: 0
    Field("value", 16, 8),      # CUPTI's value: bytes, GPU fault groups, or a CPU fault's PC
    Field("start_ns", 24, 8),   # CLOCK_REALTIME ns
    Field("end_ns", 32, 8),     # == start_ns where CUPTI gives no end
    Field("kind", 40, 4),       # EGPU_UVM_* (CUPTI's counter kind)
    Field("flags", 44, 4),      # GPU faults: access type; migrations: cause
    Field("src", 48, 4),
    Field("dst", 52, 4),
    Field("stream", 56, 4),
    Field("pad", 60, 4),
), 64)
# Section prefix -> the context its programs get; every other section: struct egpu_ctx.
SECTION_LAYOUTS: dict[str, Layout] = {"egpu/uvm": UVM_CTX}


def layout_of_section(section: str | None) -> Layout:
    """The context a program of ``section`` receives in r1."""
    for prefix, layout in SECTION_LAYOUTS.items():
        if section is not None and section.startswith(prefix + "/"):
            return layout
    return EGPU_CTX


def fields_at(offsets: frozenset[int]) -> frozenset[str]:
    """The fields that hold any of these byte offsets (what a program reads, from its ctx_reads)."""
    return frozenset(f.name for f in FIELDS
                     if any(o in offsets for o in range(f.offset, f.offset + f.size * f.count)))


def words_at(offsets: frozenset[int]) -> tuple[int, ...]:
    """The 8-byte words of the context holding any of these byte offsets, in order."""
    return tuple(sorted({o // 8 for o in offsets}))


def kernel_id(name: str) -> int:
    """FNV-1a 64 of a kernel's mangled name: stable across processes, so maps keyed by it can be joined."""
    h = 0xCBF29CE484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h
