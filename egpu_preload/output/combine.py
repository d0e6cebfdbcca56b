"""The maps of several processes (the ranks of a torchrun job) as one Snapshot: what egpu-run prints as
the "all ranks" section and JSON labels rank "all".

Maps are matched by name. Numbers are summed key by key (scalars, keyed maps; structs and arrays field
by field, ``values._add``: kernel ids and pointers are kept, not added), histograms bucket by bucket
(same scale and step: the same probe), records and trace lines concatenated in the order the
snapshots come, drop counts summed. Per-SM values are left out: SM ids of different processes (and
GPUs) are not the same SMs. Kernel name tables are merged: a kernel id is the hash of the mangled name,
the same in every process.

A map that cannot be summed (a scalar in one process and a keyed map in another, histograms of different
scales, values of different types: ranks that attached different probes whose maps share a name) is left
out of the sum, with the reason, and the other maps are summed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from ..errors import EgpuError
from .json import plain
from .values import (Data, Entry, Histogram, KeyedScalars, MapValue, Records, Scalar, Snapshot, Trace, _add,
                     _is_int, _order, histogram)


def sum_snapshots(snaps: Sequence[Snapshot]) -> tuple[Snapshot, list[str]]:
    """One Snapshot holding the sum of ``snaps``' maps (module docstring), maps in first-seen order, and why
    each map left out of it could not be summed."""
    merged: dict[str, MapValue] = {}
    left_out: dict[str, str] = {}
    for snap in snaps:
        for m in snap.maps:
            if m.name in left_out:
                continue
            try:
                merged[m.name] = _merge(merged[m.name], m) if m.name in merged else _strip(m)
            except EgpuError as e:   # one such map used to cost the sum, and egpu-run every rank's maps with it
                left_out[m.name] = str(e)
                del merged[m.name]
    names: dict[int, str] = {}
    for snap in snaps:
        names.update(snap.kernel_names)
    return Snapshot(tuple(_ordered(m) for m in merged.values()),
                    Trace(tuple(line for s in snaps for line in s.trace.lines), sum(s.trace.dropped for s in snaps)),
                    names), list(left_out.values())


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
        _same_form(a.name, [a.value, b.value])
        return Scalar(a.name, _add(a.value, b.value))
    if isinstance(a, KeyedScalars):
        _same_form(a.name, [e.value for e in a.entries + b.entries])
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


def _same_form(name: str, values: list[Data]) -> None:
    """EgpuError unless ``values`` are alike but for their numbers: _add keeps the first of two values it
    cannot add (an int and a struct) and zips arrays of different lengths, and such a sum read as one."""
    forms = {json.dumps(_form(v)) for v in values}
    if len(forms) > 1:
        raise EgpuError(f"map {name}: values of different types in different processes ({', '.join(sorted(forms))})")


def _form(v: Data) -> object:
    """A decoded value's fields and array lengths: its shape, what _add walks (an enum member, its name or its
    number, is one field either way)."""
    if isinstance(v, dict):
        return {k: _form(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_form(x) for x in v]
    return "scalar"


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
