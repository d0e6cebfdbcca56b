"""uvm_lru: how often would an LRU or an LFU cache of N address ranges have held what unified memory
migrated to the GPU? The paper's cooperative-caching question, asked of a real trace.

    egpu-run --perfetto trace.json ./uvm_oversub 128 8
    python3 examples/uvm_lru.py trace.json --range 2M --sizes 4,8,16,24,32 [--plot hit_rate.png]

The trace is the "unified memory htod" tracks of an egpu-run --perfetto file (CUPTI's host-to-device
migrations, each with its address and bytes), in time order. Each migration is an access to every
range of ``--range`` bytes it covers; consecutive accesses to the same range are one (the driver moves
a range in pieces, one record each). The caches hold ranges: LRU evicts the least recently used; LFU
the least frequently used since it came in, the least recently used among equals. A hit is an access
to a range the cache holds.

Prints, per size, the accesses, LRU and LFU hits and hit rates; with --plot (matplotlib), the hit rates
against the size.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path

HTOD_TRACK = "unified memory htod"
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


class TraceError(Exception):
    pass


def size(text: str) -> int:
    """'2M' -> 2097152; a plain number is bytes."""
    unit = text[-1:].upper() if text[-1:].isalpha() else ""
    digits = text[:-1] if unit else text
    if unit not in UNITS or not digits.isdigit() or int(digits) == 0:
        raise ValueError(f"not a size: {text!r} (e.g. 65536, 64K, 2M)")
    return int(digits) * UNITS[unit]


def migrations(doc: dict) -> list[tuple[int, int]]:
    """(address, bytes) of every host-to-device migration in a Chrome JSON trace, in time order."""
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        raise TraceError("no traceEvents: not an egpu-run --perfetto trace")
    tracks = {(e["pid"], e["tid"]) for e in events
              if e.get("ph") == "M" and e.get("name") == "thread_name" and e["args"]["name"] == HTOD_TRACK}
    timed = sorted((e["ts"], int(e["args"]["address"], 16), e["args"]["value"]) for e in events
                   if e.get("ph") in ("X", "i") and (e.get("pid"), e.get("tid")) in tracks)
    return [(address, nbytes) for _, address, nbytes in timed]


def accesses(moves: Iterable[tuple[int, int]], range_bytes: int) -> list[int]:
    """The ranges (their index: address // range_bytes) the migrations touch, consecutive repeats as one."""
    out: list[int] = []
    for address, nbytes in moves:
        first, last = address // range_bytes, (address + max(nbytes, 1) - 1) // range_bytes
        for r in range(first, last + 1):
            if not out or out[-1] != r:
                out.append(r)
    return out


def lru_hits(trace: Sequence[int], capacity: int) -> int:
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for key in trace:
        if key in cache:
            hits += 1
            cache.move_to_end(key)
            continue
        if len(cache) >= capacity:
            cache.popitem(last=False)
        cache[key] = None
    return hits


def lfu_hits(trace: Sequence[int], capacity: int) -> int:
    """LFU with counts kept while a key is held; ties go to the least recently used. O(1) per access:
    one insertion-ordered bucket per count."""
    count: dict[int, int] = {}
    buckets: dict[int, OrderedDict[int, None]] = {}
    low = 0  # the smallest count held
    hits = 0
    for key in trace:
        if key in count:
            hits += 1
            n = count[key]
            del buckets[n][key]
            if not buckets[n]:
                del buckets[n]
                low = n + 1 if low == n else low
            count[key] = n + 1
            buckets.setdefault(n + 1, OrderedDict())[key] = None
            continue
        if len(count) >= capacity:
            victim, _ = buckets[low].popitem(last=False)
            if not buckets[low]:
                del buckets[low]
            del count[victim]
        count[key] = 1
        buckets.setdefault(1, OrderedDict())[key] = None
        low = 1
    return hits


def table(trace: Sequence[int], sizes: Sequence[int]) -> list[tuple[int, int, int, int]]:
    """(size, accesses, LRU hits, LFU hits) per cache size."""
    return [(n, len(trace), lru_hits(trace, n), lfu_hits(trace, n)) for n in sizes]


def render(rows: Sequence[tuple[int, int, int, int]], range_bytes: int, distinct: int) -> str:
    lines = [f"{len(rows) and rows[0][1]} accesses to {distinct} ranges of {range_bytes} bytes",
             f"{'ranges':>8} {'LRU hits':>9} {'LRU rate':>9} {'LFU hits':>9} {'LFU rate':>9}"]
    for n, total, lru, lfu in rows:
        lru_rate, lfu_rate = (lru / total, lfu / total) if total else (0.0, 0.0)
        lines.append(f"{n:>8} {lru:>9} {lru_rate:>9.3f} {lfu:>9} {lfu_rate:>9.3f}")
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[tuple[int, int, int, int]], range_bytes: int, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sizes = [n for n, *_ in rows]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for label, col in (("LRU", 2), ("LFU", 3)):
        ax.plot(sizes, [r[col] / r[1] if r[1] else 0 for r in rows], marker="o", label=label)
    ax.set_xlabel(f"cache size (ranges of {range_bytes >> 20} MiB)" if range_bytes >= 1 << 20
                  else f"cache size (ranges of {range_bytes} B)")
    ax.set_ylabel("hit rate")
    ax.set_ylim(0, 1)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="uvm_lru.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path, help="an egpu-run --perfetto file")
    ap.add_argument("--range", dest="range_bytes", default="2M", help="bytes per cached range (default 2M)")
    ap.add_argument("--sizes", default="4,8,16,32", help="cache sizes in ranges, comma-separated")
    ap.add_argument("--plot", type=Path, help="write the hit rates against the size here (PNG)")
    args = ap.parse_args(argv)
    try:
        range_bytes = size(args.range_bytes)
        sizes = [int(s) for s in args.sizes.split(",")]
        if any(s <= 0 for s in sizes):
            raise ValueError("--sizes: every size must be a positive number of ranges")
        doc = json.loads(args.trace.read_text())
        trace = accesses(migrations(doc), range_bytes)
    except (OSError, ValueError, TraceError, KeyError, TypeError) as e:
        why = e.strerror if isinstance(e, OSError) else str(e)
        print(f"uvm_lru.py: {args.trace}: {why}", file=sys.stderr)
        return 1
    rows = table(trace, sizes)
    sys.stdout.write(render(rows, range_bytes, len(set(trace))))
    if args.plot is not None:
        try:
            plot(rows, range_bytes, args.plot)
        except ImportError:
            print(f"uvm_lru.py: {args.plot}: --plot needs matplotlib", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
