"""What a probe sees in r1, one ``Layout`` per context struct, and ``layout_for`` says which a section's
attach kind gets: ``struct egpu_ctx`` (EGPU_CTX) for GPU and launch sections, ``struct egpu_host_ctx``
(HOST, filled by shim/hostapi.c) for the host-API sections (egpu/memcpy, memset, alloc, free, sync),
``struct egpu_uvm_ctx`` (UVM_CTX, filled by runtime/uvm.context_bytes) for egpu/uvm, and ``struct
pt_regs`` (bpf/ptregs.py) for host uprobes. The layouts are ABI: egpu.bpf.h, the verifier, the VM, the
PTX rewriter and the shim all read these offsets from here, and the verifier holds each program to its
section's layout, so a host probe cannot read a GPU field and the reverse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from .sections import API_KINDS, HOST_KINDS

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
    Field("nargs", 104, 4),     # 0 (args all 0) in launch probes and on the SASS back end
    Field("grid", 108, 4, 3),   # gridDim (kernel sites: %nctaid)
    Field("block", 120, 4, 3),  # blockDim (kernel sites: %ntid)
    Field("pad", 132, 4),
    Field("stream", 136, 8),    # the CUstream handle: launch probes, and kernel sites on the SASS back end
)
SIZE = 144
WORDS = SIZE // 8


class Element(NamedTuple):
    field: Field
    index: int    # which element of an array field (grid[1]: 1)
    offset: int   # its byte offset in the context; the 8-byte word holding it is offset // 8


# Every element of every field, in offset order: what each context word holds.
ELEMENTS: tuple[Element, ...] = tuple(Element(f, e, f.offset + f.size * e) for f in FIELDS for e in range(f.count))

# What r1 holds where a probe's context is not in memory (its words passed in registers, or none read).
# Not NULL: the verifier proves ctx never NULL, so a probe's `if (!ctx)` branch is not translated; and
# farther from 0 than any offset it allows.
NO_ADDRESS = 1 << 40
BY_NAME: dict[str, Field] = {f.name: f for f in FIELDS}
ALL_FIELDS: frozenset[str] = frozenset(BY_NAME)


# ---- struct egpu_host_ctx: one call of a driver API (shim/hostapi.c fills it after the call returns) ----
# kind of a copy (egpu/memcpy) and of a set (egpu/memset); the numbers of egpu_cow.h's egpu_op_kind
COPY_H2D, COPY_D2H, COPY_D2D, COPY_H2H, COPY_PEER, COPY_SET = 1, 2, 3, 4, 5, 6
# kind of an allocation or free: egpu_shim.h's egpu_alloc_kind
ALLOC_DEVICE, ALLOC_PITCH, ALLOC_MANAGED, ALLOC_POOL, ALLOC_HOST, ALLOC_HOST_REGISTERED = 1, 2, 3, 4, 5, 6
ALLOC_VMM_HANDLE, ALLOC_VMM_MAPPING = 7, 8
# kind of a synchronization
SYNC_STREAM, SYNC_EVENT, SYNC_CONTEXT = 1, 2, 3
# flags
HOST_F_ASYNC, HOST_F_PER_THREAD, HOST_F_STRIDED, HOST_F_GRAPH = 1, 2, 4, 8  # GRAPH: captured, or a graph node

# Its fields begin where struct egpu_ctx ends (the first SIZE bytes are reserved), so no offset is a field
# of both: the verifier tells a GPU field read in a host section (and the reverse) by its offset alone.
HOST_FIELDS: tuple[Field, ...] = (
    Field("api_id", SIZE + 0, 8),      # api_id(symbol): FNV-1a 64 of the driver symbol ("cuMemcpyHtoD_v2")
    Field("dst", SIZE + 8, 8),         # copy/set: destination; alloc/free: the address (also named addr)
    Field("addr", SIZE + 8, 8),
    Field("src", SIZE + 16, 8),        # copy: source; set: the value
    Field("bytes", SIZE + 24, 8),      # bytes copied, set or allocated (2D/3D: width x height x depth)
    Field("stream", SIZE + 32, 8),     # the CUstream (0: the legacy default stream; per-thread twins: 2)
    Field("handle", SIZE + 40, 8),     # sync: the event or stream waited for; pool alloc: the pool
    Field("blocked_ns", SIZE + 48, 8), # ns the calling thread spent in the driver call (sync: blocked)
    Field("kind", SIZE + 56, 4),       # COPY_* / ALLOC_* / SYNC_*
    Field("flags", SIZE + 60, 4),      # HOST_F_*
    Field("result", SIZE + 64, 4),     # the CUresult the driver returned (0: success)
    Field("pad", SIZE + 68, 4),
)
HOST_SIZE = SIZE + 72


class Layout(NamedTuple):
    """A context struct: its C name, its fields, its size in bytes."""
    name: str
    fields: tuple[Field, ...]
    size: int


EGPU_CTX = Layout("egpu_ctx", FIELDS, SIZE)
HOST = Layout("egpu_host_ctx", HOST_FIELDS, HOST_SIZE)
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


def layout_for(kind: str) -> Layout:
    """The context a program of attach ``kind`` (bpf/sections.py) receives in r1."""
    from .ptregs import PT_REGS  # ptregs builds its Layout from this module
    if kind in API_KINDS:
        return HOST
    if kind in HOST_KINDS:
        return PT_REGS
    return UVM_CTX if kind == "uvm" else EGPU_CTX


def api_id(symbol: str) -> int:
    """``struct egpu_host_ctx``'s api_id: FNV-1a 64 of the driver symbol, as kernel_id hashes a kernel name."""
    return kernel_id(symbol)


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
