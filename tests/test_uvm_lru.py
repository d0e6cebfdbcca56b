"""examples/uvm_lru.py: LRU and LFU hit counts on traces worked out by hand, the trace taken from an
egpu-run --perfetto file (the unified-memory htod track), and one clean line for a bad file."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest

from egpu_preload.output import perfetto

PATH = Path(__file__).resolve().parent.parent / "examples" / "uvm_lru.py"
spec = importlib.util.spec_from_file_location("uvm_lru", PATH)
uvm_lru = importlib.util.module_from_spec(spec)
spec.loader.exec_module(uvm_lru)


@pytest.mark.parametrize("trace, capacity, lru, lfu", [
    # 1 2 3 miss; 1 2 hit; 4 evicts 3 under both; 1 2 hit; 5 evicts 4
    ([1, 2, 3, 1, 2, 4, 1, 2, 5], 3, 4, 4),
    # a hot key then a scan: LRU lets the scan push 1 out, LFU keeps it (count 3 against 1s)
    ([1, 1, 1, 2, 3, 4, 1], 2, 2, 3),
    # LFU ties go to the least recently used: 2 and 3 both count 1, 2 is older
    ([2, 3, 4, 3, 2], 2, 1, 1),
    # a loop one larger than the cache: neither ever hits (counts restart at 1 on each entry, and the
    # least recently used of equal counts goes, as under LRU)
    ([1, 2, 3] * 4, 2, 0, 0),
    ([7] * 5, 1, 4, 4),
    ([], 4, 0, 0),
])
def test_hits_on_known_traces(trace, capacity, lru, lfu):
    assert (uvm_lru.lru_hits(trace, capacity), uvm_lru.lfu_hits(trace, capacity)) == (lru, lfu)


def _reference_lfu(trace, capacity):
    """LFU by search: the smallest (count, last use) is evicted."""
    held: dict[int, list[int]] = {}
    hits = 0
    for t, key in enumerate(trace):
        if key in held:
            hits += 1
            held[key][0] += 1
        elif len(held) >= capacity:
            del held[min(held, key=lambda k: tuple(held[k]))]
        held.setdefault(key, [1, t])[1] = t
    return hits


def test_lfu_agrees_with_a_search_on_random_traces():
    rng = random.Random(7)
    for _ in range(200):
        trace = [rng.randrange(8) for _ in range(rng.randrange(60))]
        cap = rng.randrange(1, 6)
        assert uvm_lru.lfu_hits(trace, cap) == _reference_lfu(trace, cap), (trace, cap)


def test_a_cache_as_large_as_the_ranges_misses_each_range_once():
    trace = [3, 1, 3, 2, 1, 3, 2]
    assert uvm_lru.lru_hits(trace, 3) == uvm_lru.lfu_hits(trace, 3) == len(trace) - 3


@pytest.mark.parametrize("moves, range_bytes, ranges", [
    ([(0, 4096), (4096, 4096), (2 << 20, 65536)], 2 << 20, [0, 1]),   # pieces of one range: one access
    ([(0x1F0000, 0x20000)], 2 << 20, [0, 1]),                           # one migration over a boundary
    ([(0, 64), (2 << 20, 64), (0, 64)], 2 << 20, [0, 1, 0]),            # a return is an access again
    ([(4096, 0)], 4096, [1]),
])
def test_migrations_become_range_accesses(moves, range_bytes, ranges):
    assert uvm_lru.accesses(moves, range_bytes) == ranges


@pytest.mark.parametrize("text, value", [("65536", 65536), ("64K", 65536), ("2M", 2 << 20), ("1g", 1 << 30)])
def test_sizes(text, value):
    assert uvm_lru.size(text) == value


def test_the_trace_comes_from_the_htod_track_in_time_order(tmp_path, capsys):
    t = perfetto.Trace(7, "app")
    mb = 1 << 20
    for start, addr in [(300, 0), (100, 4 * mb), (200, 4 * mb + 4096), (400, 2 * mb)]:
        t.add_slice(perfetto.Slice("unified memory htod", "htod", start, 10, "uvm",
                                   {"address": f"{addr:#x}", "value": 4096}))
    t.add_slice(perfetto.Slice("unified memory dtoh", "dtoh", 50, 10, "uvm", {"address": "0x0", "value": 4096}))
    path = tmp_path / "trace.json"
    t.write(path)
    assert uvm_lru.migrations(json.loads(path.read_text())) == [(4 * mb, 4096), (4 * mb + 4096, 4096), (0, 4096),
                                                                (2 * mb, 4096)]
    assert uvm_lru.main([str(path), "--range", "2M", "--sizes", "1,3"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "3 accesses to 3 ranges of 2097152 bytes",
        "  ranges  LRU hits  LRU rate  LFU hits  LFU rate",
        "       1         0     0.000         0     0.000",
        "       3         0     0.000         0     0.000"]


@pytest.mark.parametrize("content, args, why", [
    (None, [], "No such file or directory"),
    ("{", [], "Expecting property name"),
    ('{"a": 1}', [], "no traceEvents: not an egpu-run --perfetto trace"),
    ('{"traceEvents": []}', ["--range", "2Q"], "not a size: '2Q'"),
    ('{"traceEvents": []}', ["--sizes", "0"], "every size must be a positive number"),
])
def test_a_bad_input_is_one_line(tmp_path, capsys, content, args, why):
    path = tmp_path / "t.json"
    if content is not None:
        path.write_text(content)
    assert uvm_lru.main([str(path), *args]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"uvm_lru.py: {path}: ") and why in err
