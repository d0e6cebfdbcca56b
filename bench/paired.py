"""Paired measurements of host-bound work: what a goal may claim from them.

Processes of one host-bound program differ by 10-20% (CPU frequency, which core, cache state), more
than the costs measured. So such work runs in rounds, each a plain process and the measured one,
interleaved and pinned to the same CPUs, and the result is the median of the per-round ratios (or
differences) with their spread, min..max. A goal is met only when the whole spread is inside it,
missed when the whole spread is outside, and otherwise undecided; fewer than MIN_PAIRS rounds decide
nothing.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

MIN_PAIRS = 10


def _pairs(base: Sequence[float | None], other: Sequence[float | None], op: Callable[[float, float], float]
           ) -> dict[str, Any]:
    """Rounds where both ran (a None is a process that did not): op(other, base) per round, the
    median, min and max."""
    values = [op(o, b) for b, o in zip(base, other) if b is not None and o is not None]
    if not values:
        return {"pairs": 0, "values": []}
    return {"pairs": len(values), "median": statistics.median(values), "min": min(values), "max": max(values),
            "values": values}


def ratios(base: Sequence[float | None], other: Sequence[float | None]) -> dict[str, Any]:
    """Per round other / base."""
    return _pairs(base, other, lambda o, b: o / b)


def differences(base: Sequence[float | None], other: Sequence[float | None]) -> dict[str, Any]:
    """Per round other - base."""
    return _pairs(base, other, lambda o, b: o - b)


def verdict(spread: dict[str, Any], target: float) -> str:
    """"met" when every value (min..max) is at or under ``target``, "missed" when every one is over it,
    "undecided" when the spread crosses it; "too few pairs (n)" when ``spread`` is of paired rounds
    ("pairs" not None) and has fewer than MIN_PAIRS."""
    if spread.get("pairs") is not None and spread["pairs"] < MIN_PAIRS:
        return f"too few pairs ({spread['pairs']})"
    if spread["max"] <= target:
        return "met"
    return "missed" if spread["min"] > target else "undecided"
