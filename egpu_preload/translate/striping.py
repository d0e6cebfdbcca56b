"""Counters striped over SMs: an ARRAY map (global variables included) that the object's GPU programs
only ever add to atomically gets copies of its values on the device, a few per SM (one per warp slot
modulo devmaps.SPREAD, fewer for large rows), laid out as a PERCPU_ARRAY (devmaps.py), and the host
sums the copies when it reads the map.

Why: a counter every thread of a kernel bumps is one L2 line that every SM's atomics queue on (on an
H200 a 16 Mi-thread vector add with one ARRAY counter at entry and exit ran 12.9x slower, the same
counter in a PERCPU_ARRAY 1.71x: docs/bench/why.md; a row per SM still queues an SM's 8 K warps on one
line, hence several rows an SM). bpftrace's count() uses per-CPU maps for the same reason; here the
probe keeps its plain ARRAY and nothing it can observe changes, because nothing on the GPU reads the
values: adds of one width w commute, so the sum of the copies, lane by lane modulo
2^(8w), is what one copy would hold.

A map is striped when all of this holds (the verifier's value_uses, every path of every program):
- it is an ARRAY (or .bss/.data) that is not read-only;
- the GPU programs touch its values only with atomic adds that do not fetch the old value, all of one
  width, and take the map for nothing but lookups (an update with BPF_NOEXIST changes no array slot);
- no launch probe, host-API probe (egpu/memcpy, ...) or host uprobe uses it (those run on the host copy, which
  mapsync.py copies to the device);
- one row of it is at most STRIPE_ROW_MAX bytes (a large array is a spread one, and rows cost memory).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..bpf.program import MAP_ARRAY, BpfObject, MapDef
from ..bpf.sections import HOST_SIDE
from ..bpf.verifier import VerifiedProgram, verify

STRIPE_ROW_MAX = 64 * 1024
_ADDS = {frozenset({"add4"}): 4, frozenset({"add8"}): 8}


def stripe_counters(obj: BpfObject, verified: Sequence[VerifiedProgram] | None = None) -> None:
    """Mark the object's maps that qualify (MapDef.stripe), in place; ``verified``: the verifier's
    result for each of ``obj.programs``, in order (verified here when not given)."""
    if verified is None:
        verified = [verify(p.code, obj.maps, file=obj.path, section=p.section) for p in obj.programs]
    gpu_uses: dict[int, set[str]] = {}
    host: set[int] = set()
    for prog, v in zip(obj.programs, verified, strict=True):
        if prog.attach.kind in HOST_SIDE:
            host |= set(v.value_uses) | {i for i in v.maps.values() if i is not None}
            if None in v.maps.values():
                host |= set(range(len(obj.maps)))
            continue
        for index, uses in v.value_uses.items():
            gpu_uses.setdefault(index, set()).update(uses)
    for index, m in enumerate(obj.maps):
        width = _ADDS.get(frozenset(gpu_uses.get(index, ())), 0) if index not in host else 0
        if width and not _stripable(m, width):
            width = 0
        if m.stripe != width:
            obj.maps[index] = replace(m, stripe=width)


def _stripable(m: MapDef, width: int) -> bool:
    row = m.max_entries * -(-m.value_size // 8) * 8
    return m.type == MAP_ARRAY and not m.readonly and m.value_size % width == 0 and row <= STRIPE_ROW_MAX
