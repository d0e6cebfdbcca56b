"""The maps of several processes (the ranks of a torchrun job) as one Snapshot: what egpu-run prints as
the "all ranks" section and JSON labels rank "all".

Maps are matched by name. Numbers are summed key by key (scalars, keyed maps; structs and arrays field
by field, ``values._add``: kernel ids and pointers are kept, not added), histograms bucket by bucket
(same scale and step: the same probe), records and trace lines concatenated in the order the
snapshots come, drop counts summed. Per-SM values are left out: SM ids of different processes (and
GPUs) are not the same SMs. Kernel name tables are merged: a kernel id is the hash of the mangled name,
the same in every process.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from ..errors import EgpuError
from .json import plain
from .values import (Data, Entry, Histogram, KeyedScalars, MapValue, Records, Scalar, Snapshot, Trace, _add,
                     _is_int, _order, histogram)


def sum_snapshots(snaps: Sequence[Snapshot]) -> Snapshot:
    """One Snapshot holding the sum of ``snaps``' maps (module docstring); maps in first-seen order."""
    merged: dict[str, MapValue] = {}
    for snap in snaps:
        for m in snap.maps:
            merged[m.name] = _merge(merged[m.name], m) if m.name in merged else _strip(m)
    names: dict[int, str] = {}
    for snap in snaps:
        names.update(snap.kernel_names)
    return Snapshot(tuple(_ordered(m) for m in merged.values()),
                    Trace(tuple(line for s in snaps for line in s.trace.lines)), names)


def _strip(m: MapValue) -> MapValue:
    """A map without its per-SM values."""
    if isinstance(m, Scalar):
        return Scalar(m.name, m.value)
    if isinstance(m, KeyedScalars):
        return KeyedScalars(m.name, tuple(Entry(e.key, e.value) for e in m.entries))
    return m


def _merge(a: MapValue, b: MapValue) -> MapValue:
    if type(a) is not type(b):
        raise EgpuError(f"map {a.name}: a {type(a).__name__} in one process, a {type(b).__name__} in another")
    if isinstance(a, Scalar):
        return Scalar(a.name, _add(a.value, b.value))
    if isinstance(a, KeyedScalars):
        entries = {_key(e.key): e for e in a.entries}
        for e in b.entries:
            k = _key(e.key)
            entries[k] = Entry(e.key, _add(entries[k].value, e.value)) if k in entries else Entry(e.key, e.value)
        return KeyedScalars(a.name, tuple(entries.values()))
    if isinstance(a, Histogram):
        if (a.scale, a.step) != (b.scale, b.step) and a.counts and b.counts:
            raise EgpuError(f"map {a.name}: histograms of different scales cannot be summed")
        slots = a.slots()
        for k, n in b.slots().items():
            slots[k] = slots.get(k, 0) + n
        scale, step = (a.scale, a.step) if a.counts else (b.scale, b.step)
        return histogram(a.name, scale, step, slots)
    if isinstance(a, Records):
        return Records(a.name, a.records + b.records, a.dropped + b.dropped)
    raise EgpuError(f"map {a.name}: cannot sum a {type(a).__name__}")


def _key(k: Data) -> str:
    """A hashable spelling of a decoded key (structs and arrays are dicts and lists)."""
    return json.dumps(plain(k), sort_keys=True)


def _ordered(m: MapValue) -> MapValue:
    """Entries in values.py's print order: by value when all are integers, else by key."""
    if not isinstance(m, KeyedScalars):
        return m
    if all(_is_int(e.value) for e in m.entries):
        return KeyedScalars(m.name, tuple(sorted(m.entries, key=lambda e: (e.value, _order(e.key)))))
    return KeyedScalars(m.name, tuple(sorted(m.entries, key=lambda e: _order(e.key))))
