"""The spread of a series of durations in ns: count, total, min, max and a log2 histogram (what
egpu-run --durations prints for kernels, copies and sets)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SLOTS = 64


def log2_slot(ns: int) -> int:
    """Slot k counts [2^k, 2^(k+1)) ns; 0 and 1 ns share slot 0."""
    return min(max(ns, 1).bit_length() - 1, SLOTS - 1)


@dataclass
class Spread:
    count: int = 0
    total: int = 0
    low: int = 0
    high: int = 0
    slots: dict[int, int] = field(default_factory=dict)

    def add(self, ns: int) -> None:
        self.low = ns if not self.count else min(self.low, ns)
        self.high = max(self.high, ns)
        self.count += 1
        self.total += ns
        s = log2_slot(ns)
        self.slots[s] = self.slots.get(s, 0) + 1

    def row(self) -> list[Any]:
        """[count, total, min, max, [[slot, count]...]], the dump's form."""
        return [self.count, self.total, self.low, self.high, sorted([s, c] for s, c in self.slots.items())]
