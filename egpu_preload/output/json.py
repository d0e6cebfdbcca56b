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
mangled names), structs are objects by field name, arrays lists. PERCPU_ARRAY values are the sums over
SMs, with "per_sm" (SM id -> value) beside them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping

from .values import Data, Histogram, KernelId, KeyedScalars, MapValue, Records, Scalar, Snapshot


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
