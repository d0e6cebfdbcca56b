"""Warps for the VM, which runs one thread at a time: what ``egpu_warp_mem_record`` needs to see lanes
make one access together.

On the GPU the lanes that reach the helper together (same site, size and flags) write one record, by
the lowest of them. The VM runs lanes one after another, so a caller says which runs are one warp
instruction: runs inside ``with vm.warps.instruction():`` join their warp's record (its ts the lowest
lane's), written to the ring when the block ends, groups in the order they began. A run outside such a
block is a warp instruction of its own lane alone: its record is written at once (the GPU's case of a
lane that reaches the site alone). A lane that joins a record it is already in (a probe calling the
helper twice) begins the next one, as output/warp_records.compress does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

from ..maps import RingbufStorage
from ..output import warp_records as wr


class Warps:
    def __init__(self) -> None:
        self._depth = 0
        # (ring, instruction but ts) -> lane -> (address, ts), in the order records began
        self._open: dict[tuple[int, wr.Instruction], dict[int, tuple[int, int]]] = {}
        self._pending: list[tuple[RingbufStorage, wr.Instruction, dict[int, tuple[int, int]]]] = []

    @contextmanager
    def instruction(self) -> Iterator[None]:
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if not self._depth:
                self._flush()

    def join(self, ring: RingbufStorage, ins: wr.Instruction, lane: int, addr: int) -> None:
        """Lane ``lane`` of ``ins`` accessed ``addr``; ins.ts is the time the lane read."""
        key = (id(ring), dataclasses.replace(ins, ts=0))
        lanes = self._open.get(key)
        if lanes is None or lane in lanes:
            lanes = self._open[key] = {}
            self._pending.append((ring, ins, lanes))
        lanes[lane] = (addr, ins.ts)
        if not self._depth:
            self._flush()

    def _flush(self) -> None:
        for ring, ins, lanes in self._pending:
            ts = lanes[min(lanes)][1]
            rec = wr.warp_record(dataclasses.replace(ins, ts=ts), {lane: a for lane, (a, _) in lanes.items()})
            ring.output(wr.encode(rec))   # no room: counted in ring.drops, as on the GPU
        self._open.clear()
        self._pending.clear()
