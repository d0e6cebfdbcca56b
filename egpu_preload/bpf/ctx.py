"""``struct egpu_ctx``: what a probe sees in r1. The layout is ABI: egpu.bpf.h, the verifier, the VM and
the PTX rewriter (which fills it in) all read these offsets from here.
"""

from __future__ import annotations

from dataclasses import dataclass

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
