"""One JSON document per interval (a line of NDJSON) for a Snapshot:

    {"time": 1718000000.5, "pid": 4242, "rank": 0,
     "maps": {"counts": {"kind": "scalar", "value": 42},
              "per_kernel": {"kind": "map", "entries": [{"key": 1311768467463790320, "value": 7}]},
              "hist": {"kind": "hist", "scale": "log2", "buckets": [{"lo": 4, "hi": 8, "count": 12}]},
              "events": {"kind": "records", "records": [{"value": {...}}], "dropped": 0}},
     "trace": ["wide 16"],
     "kernels": {"1311768467463790320": "_Z6vecAddPfS_S_i"}}

The sum over the ranks of a job (output/combine.py) has rank "all" and pid null, and "left_out": [why] when a
map could not be summed. An image its process replaced by its Nth exec has "before_exec": N.

Values are machine-friendly: ints stay ints (kernel ids too: "kernels" maps the ones that appear to their
mangled names), structs are objects by field name, arrays lists. PERCPU_ARRAY, PERCPU_HASH and
LRU_PERCPU_HASH values are the sums over SMs, with "per_sm" (SM id -> value) beside them.

``read`` and ``fill`` take such a document back: its maps become a MapsState's contents (``egpu run-on-gpu
--maps FILE``), so a user dumps, edits and loads them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping

from ..bpf import program as prog
from ..bpf.program import BpfObject, MapDef
from ..errors import EgpuError
from ..maps import PERCPU_STORAGES, MapsState, PerthreadArrayStorage
from .values import Data, Histogram, KernelId, KeyedScalars, MapValue, Records, Scalar, Snapshot, encode


def document(snap: Snapshot, *, time: float, pid: int | None, rank: int | str | None = None,
             left_out: list[str] | None = None, before_exec: int | None = None) -> dict:
    """The interval's document as a dict (what ``render`` serializes); ``left_out``: why maps are not in a sum;
    ``before_exec``: N when the maps are those of an image the process replaced by its Nth exec."""
    seen: set[int] = set()
    maps = {v.name: _map(v, seen) for v in snap.maps}
    return {"time": time, "pid": pid, "rank": rank, "maps": maps, "trace": list(snap.trace.lines),
            **({"trace_dropped": snap.trace.dropped} if snap.trace.dropped else {}),
            "kernels": {str(k): snap.kernel_names[k] for k in sorted(seen) if k in snap.kernel_names},
            **({"left_out": left_out} if left_out else {}),
            **({"before_exec": before_exec} if before_exec is not None else {})}


def render(snap: Snapshot, *, time: float, pid: int | None, rank: int | str | None = None,
           left_out: list[str] | None = None, before_exec: int | None = None) -> str:
    """One line of JSON, newline-terminated."""
    return json.dumps(document(snap, time=time, pid=pid, rank=rank, left_out=left_out, before_exec=before_exec),
                      separators=(",", ":")) + "\n"


def _map(v: MapValue, seen: set[int]) -> dict:
    if isinstance(v, Scalar):
        return _with_per_sm({"kind": "scalar", "value": _data(v.value, seen)}, v.per_sm, seen)
    if isinstance(v, KeyedScalars):
        return {"kind": "map", "entries": [_with_per_sm({"key": _data(e.key, seen), "value": _data(e.value, seen)},
                                                        e.per_sm, seen) for e in v.entries]}
    if isinstance(v, Histogram):
        return {"kind": "hist", "scale": v.scale, "step": v.step,
                "buckets": [{"lo": lo, "hi": hi, "count": n} for lo, hi, n in v.buckets()]}
    if isinstance(v, Records):
        records = [{"value": _data(r.value, seen)} | ({} if r.cpu is None else {"sm": r.cpu}) for r in v.records]
        return {"kind": "records", "records": records, "dropped": v.dropped}
    raise TypeError(f"not a map value: {v!r}")


def _with_per_sm(out: dict, per_sm: Mapping[int, Data] | None, seen: set[int]) -> dict:
    if per_sm is not None:
        out["per_sm"] = {str(sm): _data(v, seen) for sm, v in sorted(per_sm.items())}
    return out


def plain(v: Data, kernel: Callable[[KernelId], object] = int) -> object:
    """Decoded data as plain JSON types; ``kernel`` spells each kernel id (its number by default)."""
    if isinstance(v, KernelId):
        return kernel(v)
    if isinstance(v, dict):
        return {k: plain(x, kernel) for k, x in v.items()}
    if isinstance(v, list):
        return [plain(x, kernel) for x in v]
    if isinstance(v, bool):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)  # JSON has no NaN or infinities
    if isinstance(v, int):
        return int(v)
    return str(v)


def _data(v: Data, seen: set[int]) -> object:
    """Plain data, noting which kernel ids appear (for the document's "kernels" table)."""
    def kernel(k: KernelId) -> int:
        seen.add(int(k))
        return int(k)
    return plain(v, kernel)


def read(text: str) -> dict:
    """The one document of ``text``: a JSON object (a line of NDJSON, or pretty-printed, as jq writes it);
    EgpuError when it is not JSON, not an object with a "maps" object, or several documents (a job of
    several processes prints one each)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        lines = [line for line in text.splitlines() if line.strip()]
        if e.msg != "Extra data" or len(lines) < 2:
            raise EgpuError(f"not JSON: {e.msg} (line {e.lineno} column {e.colno})") from None
        raise EgpuError(f"{len(lines)} lines of JSON (a document per process?): keep the one to load") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("maps"), dict):
        raise EgpuError('not a maps document: no "maps" object (egpu maps --json prints one)')
    return doc


def fill(state: MapsState, obj: BpfObject, doc: dict) -> None:
    """The maps of a document (``read``'s) into ``state``, of ``obj``'s maps: a scalar into its one slot, a
    map's entries by key, a histogram's buckets back into their slots; keys and values encoded by the map's
    BTF types (values.encode). A per-SM (or per-thread) array or hash takes each "per_sm" value, else the value
    into SM 0. Maps the document leaves out, and slots it does not name, stay as they were. EgpuError naming the
    map and what does not fit."""
    storages = {s.mapdef.name: s for s in state.storages if not s.mapdef.readonly}   # .rodata: neither shown nor set
    for name, value in doc["maps"].items():
        storage = storages.get(name)
        if storage is None:
            raise EgpuError(f"map {name}: the object has no map of that name ({', '.join(storages)})")
        m = storage.mapdef
        try:
            for key, v, per_sm in _entries(m, value):
                raw_key = encode(obj, m.key_type_id, key, m.key_size)
                where = f"key {json.dumps(key)}"
                if per_sm and isinstance(storage, PERCPU_STORAGES):
                    values = {_sm(sm, where): x for sm, x in per_sm.items()}
                else:
                    values = {0: v}
                for sm, x in values.items():
                    try:
                        raw = encode(obj, m.value_type_id, x, m.value_size)
                    except EgpuError as e:
                        raise EgpuError(f"{where}: {e.reason}") from None
                    if storage.update(raw_key, raw, cpu=sm) < 0:
                        threads = (f" of each of its {PerthreadArrayStorage.THREADS} threads"
                                   if isinstance(storage, PerthreadArrayStorage) else "")
                        raise EgpuError(f"{where}: no room for it (the map holds {m.max_entries} entries{threads})")
        except EgpuError as e:
            raise EgpuError(f"map {name}: {e.reason}") from None


def _entries(m: MapDef, value: object) -> Iterator[tuple[object, object, dict | None]]:
    """(key, value, per_sm or None) of one map's part of a document."""
    kind = value.get("kind") if isinstance(value, dict) else None
    if kind == "scalar":
        if m.max_entries != 1 or m.type not in (prog.MAP_ARRAY, prog.MAP_PERCPU_ARRAY, prog.MAP_PERTHREAD_ARRAY):
            raise EgpuError("a scalar, but the map is not an array of one entry")
        yield 0, value.get("value"), _per_sm(value)
    elif kind == "map" and isinstance(value.get("entries"), list):
        for e in value["entries"]:
            if not isinstance(e, dict) or "key" not in e or "value" not in e:
                raise EgpuError(f"entry {json.dumps(e)}: not an object with a key and a value")
            yield e["key"], e["value"], _per_sm(e)
    elif kind == "hist" and isinstance(value.get("buckets"), list):
        buckets, scale, step = value["buckets"], value.get("scale"), value.get("step", 1)
        if not all(isinstance(b, dict) and all(isinstance(b.get(f), int) for f in ("lo", "hi", "count"))
                   for b in buckets):
            raise EgpuError('buckets: each needs "lo", "hi" and "count", integers')
        if scale not in ("log2", "linear") or not isinstance(step, int) or step < 1:
            raise EgpuError('a histogram needs "scale" log2 or linear and a "step" of 1 or more')
        h = Histogram(m.name, scale, step, buckets[0]["lo"] if buckets else 0,
                      tuple(b["hi"] for b in buckets), tuple(b["count"] for b in buckets))
        for slot, count in h.slots().items():
            yield slot, count, None
    elif kind == "records":
        raise EgpuError("records: a ring buffer, perf buffer or queue starts empty (only scalars, maps and "
                        "histograms are filled)")
    else:
        raise EgpuError('not a map as egpu prints one ({"kind": "scalar", "value": ...}, {"kind": "map", '
                        '"entries": [...]} or {"kind": "hist", "buckets": [...]})')


def _per_sm(value: dict) -> dict | None:
    per_sm = value.get("per_sm")
    if per_sm is not None and not isinstance(per_sm, dict):
        raise EgpuError(f"per_sm: {json.dumps(per_sm)} is not an object of SM -> value")
    return per_sm


def _sm(text: str, where: str) -> int:
    """A per_sm key: the SM's (or thread's) number."""
    if not text.isdigit():
        raise EgpuError(f"{where}: per_sm key {text!r} is no SM number")
    return int(text)
