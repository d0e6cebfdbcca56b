"""Map output: real probes run on the reference VM fill the maps, then text and JSON are compared with
golden files (tests/golden/output/; EGPU_UPDATE_GOLDEN=1 rewrites them). Beside them, table-driven
cases pin each rule: histogram rows as bpftrace prints them, value spelling, sorting, PERCPU sums,
kernel names, records and drops.
"""

from __future__ import annotations

import json
import struct
import os
from pathlib import Path

import pytest

from egpu_preload.bpf import ctx as ctxmod
from egpu_preload.bpf import program as prog
from egpu_preload.bpf.compile import compile_probe
from egpu_preload.bpf.elf import load_object
from egpu_preload.bpf.program import BpfObject, MapDef
from egpu_preload.errors import EgpuError
from egpu_preload.maps import MapsState, TraceRecord
from egpu_preload.output import json as json_out
from egpu_preload.output import combine, perfetto, text, values
from egpu_preload.output.values import Address, Histogram, KernelId, Symbol
from egpu_preload.vm import ThreadSim, Vm

GOLDEN = Path(__file__).parent / "golden" / "output"
OWN_PROBES = Path(__file__).parent / "output_probes"
UPDATE = bool(os.environ.get("EGPU_UPDATE_GOLDEN"))

KERNELS = ["_Z6vecAddPfS_S_i", "_ZN2ns6kernelEPf", "_Z5scaleIfLi1EEvPT_S0_i"]
NAMES = {ctxmod.kernel_id(k): k for k in KERNELS}
IDS = list(NAMES)
EVENT_TYPES = {"shapes": {"events": "struct event"}}


def make_ctx(**fields: int | list[int]) -> bytes:
    """struct egpu_ctx bytes with the given fields (arrays as lists), the rest zero."""
    buf = bytearray(ctxmod.SIZE)
    for name, v in fields.items():
        f = ctxmod.BY_NAME[name]
        for i, x in enumerate(v if isinstance(v, list) else [v]):
            buf[f.offset + i * f.size:f.offset + (i + 1) * f.size] = x.to_bytes(f.size, "little")
    return bytes(buf)


def workload(n: int = 24):
    """Deterministic launches and accesses over three kernels, three SMs and four sites."""
    for i in range(n):
        ctx = make_ctx(kernel_id=IDS[i % 3], launch_id=i // 3, addr=0x7F0000001000 + 0x1000 * (i % 5) + 4 * i,
                       site=i % 4, size=(4, 8, 16, 1)[i % 4],
                       flags=ctxmod.FLAG_STORE if i % 3 == 1 else ctxmod.FLAG_LOAD,
                       kind=ctxmod.KIND_MEM, nargs=2, grid=[1 << (i % 5), 1, 1], block=[32 * (1 + i % 4), 1, 1],
                       stream=0x5000 + i % 2)
        yield ctx, ThreadSim(block_idx=(i % 4, 0, 0), smid=i % 3, globaltimer=1_000_000 + 1000 * i, tick=10)


def run_probe(obj: BpfObject) -> MapsState:
    state = MapsState(obj.maps)
    vms = [Vm(p.code, obj.maps, state) for p in obj.programs]
    for ctx, thread in workload():
        for vm in vms:
            vm.run(ctx, thread)
    return state


@pytest.fixture(scope="module")
def own_probe(tmp_path_factory):
    out = tmp_path_factory.mktemp("output_probes")
    return lambda name: compile_probe(OWN_PROBES / f"{name}.bpf.c", out / f"{name}.bpf.o")


def _golden(name: str, got: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
    assert got == path.read_text(), f"{name} differs (EGPU_UPDATE_GOLDEN=1 rewrites it)"


SHARED = ["count", "globals", "gpu_helpers", "hash_count", "histogram", "launch", "libbpf_style", "loop",
          "memtrace", "ringbuf", "subprog"]


@pytest.mark.parametrize("name", SHARED + ["shapes"])
def test_golden(name, probe_obj, own_probe):
    path = own_probe(name) if name == "shapes" else probe_obj(name)
    obj = load_object(path)
    snap = values.snapshot(run_probe(obj), obj, NAMES, EVENT_TYPES.get(name))
    _golden(f"{name}.txt", text.render(snap))
    doc = json_out.document(snap, time=1700000000.25, pid=4242, rank=0)
    _golden(f"{name}.json", json.dumps(doc, indent=1) + "\n")
    line = json_out.render(snap, time=1700000000.25, pid=4242, rank=0)
    assert line.endswith("\n") and "\n" not in line[:-1] and json.loads(line) == doc


def _refilled(doc: dict, obj: BpfObject) -> dict:
    """The document of maps filled from ``doc`` (json_out.fill, as egpu run-on-gpu --maps fills them), its
    records and trace aside: rings and queues start empty."""
    kept = {"maps": {n: m for n, m in doc["maps"].items() if m["kind"] != "records"}}
    state = MapsState(obj.maps)
    json_out.fill(state, obj, json_out.read(json.dumps(kept)))
    refilled = json_out.document(values.snapshot(state, obj, NAMES), time=0.0, pid=None)["maps"]
    return {n: m for n, m in refilled.items() if m["kind"] != "records"}


@pytest.mark.parametrize("name", SHARED + ["shapes"])
def test_a_document_fills_the_maps_it_was_printed_from(name, probe_obj, own_probe):
    """Dump, load: every scalar, map and histogram a document shows is what the maps filled from it show."""
    obj = load_object(own_probe(name) if name == "shapes" else probe_obj(name))
    doc = json_out.document(values.snapshot(run_probe(obj), obj, NAMES, EVENT_TYPES.get(name)), time=0.0, pid=None)
    assert _refilled(doc, obj) == {n: m for n, m in doc["maps"].items() if m["kind"] != "records"}


# --- histograms ---------------------------------------------------------------------------------------

def _hist(name: str, counts: dict[int, int]) -> Histogram | None:
    m = MapDef(name, prog.MAP_ARRAY, 4, 8, 64)
    state = MapsState([m])
    for k, v in counts.items():
        assert state[0].update(k.to_bytes(4, "little"), v.to_bytes(8, "little")) == 0
    snap = values.snapshot(state, BpfObject("t.bpf.o", maps=[m]))
    return snap.maps[0] if isinstance(snap.maps[0], Histogram) else None


@pytest.mark.parametrize("name, counts, rows", [
    # slot = floor(log2(v)); slot 0 holds 0 and 1; rows from the first to the last non-empty slot
    ("hist", {2: 12, 4: 3}, [("[4, 8)", 12, 52), ("[8, 16)", 0, 0), ("[16, 32)", 3, 13)]),
    ("hist", {0: 1, 1: 2}, [("[0, 2)", 1, 26), ("[2, 4)", 2, 52)]),
    ("hist_lat", {10: 5, 11: 1}, [("[1K, 2K)", 5, 52), ("[2K, 4K)", 1, 10)]),
    ("hist", {21: 7}, [("[2M, 4M)", 7, 52)]),
    # linear: step after "lhist", 1 without; width-1 buckets print as [k]
    ("lhist", {3: 2, 5: 4}, [("[3]", 2, 26), ("[4]", 0, 0), ("[5]", 4, 52)]),
    ("lhist10_ms", {0: 1, 2: 3}, [("[0, 10)", 1, 17), ("[10, 20)", 0, 0), ("[20, 30)", 3, 52)]),
    ("lhist1024", {1: 1}, [("[1K, 2K)", 1, 52)]),
    ("lhist1000", {3: 1}, [("[3000, 4000)", 1, 52)]),
])
def test_histogram_rows(name, counts, rows):
    h = _hist(name, counts)
    expected = "".join(f"{label:<16}{n:>8} |{'@' * bar:<52}|\n" for label, n, bar in rows)
    assert text.histogram(h) == expected


def test_sparse_linear_histogram_prints_an_empty_run_as_one_row():
    """A probe computes its lhist slots, unbounded (bpftrace's lhist has a max): slots 0 and 10**9 of a hash
    took a billion rows (10**7: 28 s and 2.7 GB); past MAX_BUCKETS each empty run is one [lo, hi) row."""
    m = MapDef("lhist", prog.MAP_HASH, 4, 8, 64)
    for far in (10**6, 10**9):
        state = MapsState([m])
        for k, v in {0: 1, 7: 1, far: 2}.items():
            assert state[0].update(k.to_bytes(4, "little"), v.to_bytes(8, "little")) == 0
        h = values.snapshot(state, BpfObject("t.bpf.o", maps=[m])).maps[0]
        rows = [("[0]", 1, 26), ("[1, 7)", 0, 0), ("[7]", 1, 26), (f"[8, {far})", 0, 0), (f"[{far}]", 2, 52)]
        assert text.histogram(h) == "".join(f"{label:<16}{n:>8} |{'@' * bar:<52}|\n" for label, n, bar in rows)
        assert h.slots() == {0: 1, 7: 1, far: 2}   # what combine sums across ranks
    span = {0: 1, values.MAX_BUCKETS - 1: 1}        # within the limit every bucket prints, as bpftrace's do
    assert len(values.histogram("lhist", "linear", 1, span).counts) == values.MAX_BUCKETS


def test_histogram_row_matches_bpftrace_columns():
    h = _hist("hist", {2: 12, 3: 6})
    assert text.histogram(h).splitlines()[1] == \
        "[8, 16)                6 |@@@@@@@@@@@@@@@@@@@@@@@@@@                          |"


@pytest.mark.parametrize("name, expect_hist", [
    ("hist", True), ("histogram", True), ("lhist", True), ("lhist7", True), ("counts", False), ("my_hist", False),
])
def test_histogram_by_name(name, expect_hist):
    assert (_hist(name, {1: 1}) is not None) == expect_hist


def test_empty_histogram_prints_nothing():
    m = MapDef("hist", prog.MAP_ARRAY, 4, 8, 8)
    snap = values.snapshot(MapsState([m]), BpfObject("t.bpf.o", maps=[m]))
    assert snap.maps[0].counts == () and text.render(snap) == ""


# --- values -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("v, expected", [
    (5, "5"), (-3, "-3"), (True, "true"), (1.5, "1.5"), ("bash", '"bash"'), (Symbol("DIR_LOAD"), "DIR_LOAD"),
    (Address(4096), "0x1000"), ([1, 2], "[1, 2]"), ({}, "{}"), ({"a": 1, "b": {"c": "x"}}, '{ a: 1, b: { c: "x" } }'),
    (KernelId(IDS[0]), "vecAdd"), (KernelId(IDS[1]), "ns::kernel"), (KernelId(IDS[2]), "scale"),
    (KernelId(7), "7"),
    # a string stays on its line and inside its quotes, and sends no control sequence to a terminal
    ("a\nb\tc\r", r'"a\nb\tc\r"'), ('say "hi"', r'"say \"hi\""'), ("\x1b[31m\x00\x7f\x9b", r'"\x1b[31m\x00\x7f\x9b"'),
    ({"s": "\n"}, r'{ s: "\n" }'),
])
def test_value_text(v, expected):
    assert text.value(v, NAMES) == expected


def test_kernel_name_beyond_the_demangler_is_the_mangled_name():
    assert text.kernel_name(1, {1: "_ZplRK1AS1_"}) == "_ZplRK1AS1_"
    assert text.kernel_name(2, {2: "plain_c_kernel"}) == "plain_c_kernel"


def _state(m: MapDef, entries: dict[bytes, bytes]) -> MapsState:
    state = MapsState([m])
    for k, v in entries.items():
        assert state[0].update(k, v) == 0
    return state


def _u32(n: int) -> bytes:
    return n.to_bytes(4, "little")


def _u64(n: int) -> bytes:
    return n.to_bytes(8, "little")


@pytest.mark.parametrize("m, entries, expected", [
    # hash maps sort by value, ties by key (bpftrace's order)
    (MapDef("h", prog.MAP_HASH, 4, 8, 8), {_u32(1): _u64(9), _u32(2): _u64(3), _u32(0): _u64(3)},
     "@h[0]: 3\n@h[2]: 3\n@h[1]: 9\n"),
    # arrays leave all-zero slots out
    (MapDef("a", prog.MAP_ARRAY, 4, 8, 4), {_u32(2): _u64(1)}, "@a[2]: 1\n"),
    # a single-slot array is a scalar, printed even when zero
    (MapDef("one", prog.MAP_ARRAY, 4, 8, 1), {}, "@one: 0\n"),
    # u64 keys: kernel names only for ids in the table
    (MapDef("k", prog.MAP_HASH, 8, 8, 8), {_u64(IDS[0]): _u64(2), _u64(5): _u64(1)}, "@k[5]: 1\n@k[vecAdd]: 2\n"),
    # a value with no integer meaning (no BTF, 3 bytes) prints as hex, sorted by key
    (MapDef("raw", prog.MAP_HASH, 4, 3, 8), {_u32(2): b"\x01\x02\x03", _u32(1): b"\xff\x00\x00"},
     "@raw[1]: ff0000\n@raw[2]: 010203\n"),
    # empty hash: nothing
    (MapDef("e", prog.MAP_HASH, 4, 8, 8), {}, ""),
])
def test_keyed_text(m, entries, expected):
    snap = values.snapshot(_state(m, entries), BpfObject("t.bpf.o", maps=[m]), NAMES)
    assert text.render(snap) == expected


def test_percpu_sums_over_sms_and_keeps_each_sm_in_json():
    m = MapDef("per_sm", prog.MAP_PERCPU_ARRAY, 4, 8, 2)
    state = MapsState([m])
    for cpu, slot, n in [(0, 1, 5), (3, 1, 7), (3, 0, 0)]:
        state[0].update(_u32(slot), _u64(n), cpu=cpu)
    snap = values.snapshot(state, BpfObject("t.bpf.o", maps=[m]))
    assert text.render(snap) == "@per_sm[1]: 12\n"
    doc = json_out.document(snap, time=0.0, pid=1)
    assert doc["maps"]["per_sm"] == {"kind": "map", "entries": [
        {"key": 1, "value": 12, "per_sm": {"0": 5, "3": 7}}]}


@pytest.mark.parametrize("mtype", [prog.MAP_PERCPU_HASH, prog.MAP_LRU_PERCPU_HASH])
def test_percpu_hash_sums_over_sms_keeps_each_sm_in_json_and_fills_back(mtype):
    """A per-CPU hash prints as PERCPU_ARRAY does (values summed over SMs, per_sm in JSON, a histogram of the
    sums under a hist name), and its document fills a fresh map back SM by SM (egpu run-on-gpu --maps)."""
    m, hist = MapDef("calls", mtype, 4, 8, 8), MapDef("hist_ns", mtype, 4, 8, 8)
    obj = BpfObject("t.bpf.o", maps=[m, hist])
    state = MapsState([m, hist])
    for cpu, key, n in [(0, 1, 5), (3, 1, 7), (3, 2, 1), (0, 4, 2), (5, 4, 1)]:
        state[0].update(_u32(key), _u64(n), cpu=cpu)
        state[1].update(_u32(key), _u64(n), cpu=cpu)
    snap = values.snapshot(state, obj)
    assert text.render(snap).startswith("@calls[2]: 1\n@calls[4]: 3\n@calls[1]: 12\n\n@hist_ns:\n")
    doc = json_out.document(snap, time=0.0, pid=1)
    assert doc["maps"]["calls"]["entries"][2] == {"key": 1, "value": 12, "per_sm": {"0": 5, "3": 7}}
    assert [b["count"] for b in doc["maps"]["hist_ns"]["buckets"]] == [12, 1, 0, 3]
    assert _refilled(doc, obj) == doc["maps"]


def test_records_drops_and_draining():
    m = MapDef("rb", prog.MAP_RINGBUF, 0, 0, 32)  # room for one 16-byte record (8 header + 16)
    state = MapsState([m])
    assert state[0].output(_u64(1) + _u64(2)) == 0
    assert state[0].output(_u64(3) + _u64(4)) != 0
    obj = BpfObject("t.bpf.o", maps=[m])
    first = text.render(values.snapshot(state, obj))
    assert first == f"@rb: {(_u64(1) + _u64(2)).hex()}\n@rb: dropped: 1\n"
    assert text.render(values.snapshot(state, obj)) == "@rb: dropped: 1\n"  # drained; drops are cumulative


def test_trace_lines_are_drained():
    state = MapsState([])
    state.trace.append(TraceRecord(b"x=%d\n\0", (-1 & 0xFFFFFFFF, 0, 0)))
    obj = BpfObject("t.bpf.o")
    assert text.render(values.snapshot(state, obj)) == "x=-1\n"
    assert text.render(values.snapshot(state, obj)) == ""


def test_records_take_the_probes_struct_of_their_size(own_probe):
    """With no type named for a ring buffer, its records print as the probe's one struct of their size
    (what egpu-run's text and JSON do), not as hex."""
    obj = load_object(own_probe("shapes"))
    named = values.snapshot(run_probe(obj), obj, NAMES, EVENT_TYPES["shapes"])
    inferred = values.snapshot(run_probe(obj), obj, NAMES)
    records = [m for m in inferred.maps if isinstance(m, values.Records)]
    assert records and all(isinstance(r.value, dict) for m in records for r in m.records)
    assert text.render(inferred) == text.render(named)


@pytest.mark.parametrize("event_types, reason", [
    ({"nope": "struct event"}, "no ring buffer or perf map named nope"),
    ({"sites": "struct event"}, "no ring buffer or perf map named sites"),
    ({"events": "struct missing"}, "no type struct missing"),
    ({"events": "shapes"}, "no type shapes"),  # a function, not a type
])
def test_event_type_errors(event_types, reason, own_probe):
    obj = load_object(own_probe("shapes"))
    with pytest.raises(EgpuError, match=reason):
        values.event_type_ids(obj, event_types)


def test_printk_lines_the_trace_ring_dropped_are_said_after_the_lines():
    """bpf_printk lines lost to a full trace_printk ring are counted where the lines are printed, as a ring's
    dropped records are (text), and in the JSON document; none lost: nothing said."""
    snap = values.Snapshot((), values.Trace(("a 1", "b 2\n"), 5), NAMES)
    assert text.render(snap) == "a 1\nb 2\nbpf_printk: dropped: 5 (the trace_printk ring was full)\n"
    assert json.loads(json_out.render(snap, time=1.0, pid=3))["trace_dropped"] == 5
    whole = values.Snapshot((), values.Trace(("a 1",)), NAMES)
    assert text.render(whole) == "a 1\n"
    assert "trace_dropped" not in json.loads(json_out.render(whole, time=1.0, pid=3))


def test_json_kernels_lists_only_ids_seen_and_floats_stay_valid():
    snap = values.Snapshot((values.Scalar("x", {"kernel_id": KernelId(IDS[1]), "f": float("nan")}),),
                           values.Trace(()), NAMES)
    doc = json.loads(json_out.render(snap, time=2.0, pid=3, rank=None))
    assert doc["kernels"] == {str(IDS[1]): KERNELS[1]}
    assert doc["maps"]["x"]["value"] == {"kernel_id": IDS[1], "f": "nan"}


# --- Perfetto (Chrome JSON trace) ---------------------------------------------------------------------

def _trace(own_probe) -> perfetto.Trace:
    """Three launches on two streams plus the shapes probe's ring-buffer events."""
    obj = load_object(own_probe("shapes"))
    snap = values.snapshot(run_probe(obj), obj, NAMES, EVENT_TYPES["shapes"])
    trace = perfetto.Trace(pid=4242, process_name="train.py", kernel_names=NAMES)
    for i, (kernel, start, stream) in enumerate([(KERNELS[0], 999_000, 0), (KERNELS[1], 1_002_500, 0x5000),
                                                 (KERNELS[2], 1_010_000, 0)]):
        trace.add_launch(perfetto.Launch(kernel, start, 4_250, stream, i, grid=(4, 1, 1), block=(128, 1, 1)))
    for m in snap.maps:
        if isinstance(m, values.Records):
            trace.add_records(m)
    return trace


def test_perfetto_trace_events(own_probe, tmp_path):
    path = tmp_path / "trace.json"
    _trace(own_probe).write(path)
    doc = json.loads(path.read_text())
    assert doc["otherData"] == {"base_ns": 999_000} and doc["displayTimeUnit"] == "ns"
    events = doc["traceEvents"]
    threads = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert threads == {1: "stream 0x0", 2: "stream 0x5000", 3: "@events"}
    slices = [(e["name"], e["tid"], e["ts"], e["dur"], e["args"]["kernel"]) for e in events if e["ph"] == "X"]
    assert slices == [("vecAdd", 1, 0.0, 4.25, KERNELS[0]), ("ns::kernel", 2, 3.5, 4.25, KERNELS[1]),
                      ("scale", 1, 11.0, 4.25, KERNELS[2])]
    instants = [e for e in events if e["ph"] == "i"]
    assert len(instants) == 6 and {e["tid"] for e in instants} == {3}
    assert instants[0]["ts"] == 1.0 and instants[0]["args"] == {
        "kernel_id": "vecAdd", "ts": 1_000_000, "tag": "access", "sm": 0, "size": 4}


def test_perfetto_records_without_ts_are_left_out():
    trace = perfetto.Trace(pid=1)
    trace.add_records(values.Records("rb", (values.Record({"x": 1}), values.Record(Symbol("00ff")),
                                            values.Record({"ts": 5, "v": 2}, cpu=3)), 0))
    events = [e for e in trace.document()["traceEvents"] if e["ph"] == "i"]
    assert [(e["ts"], e["args"]) for e in events] == [(0.0, {"ts": 5, "v": 2, "sm": 3})]


def _trace_processor(path: Path):
    tp_mod = pytest.importorskip("perfetto.trace_processor")
    config = tp_mod.TraceProcessorConfig(bin_path=os.environ.get("EGPU_TRACE_PROCESSOR"))
    try:
        return tp_mod.TraceProcessor(trace=str(path), config=config)
    except Exception as e:  # noqa: BLE001 - no shell binary here (it downloads one) or it cannot start
        pytest.skip(f"Perfetto trace processor unavailable (set EGPU_TRACE_PROCESSOR): {e}")


def test_perfetto_trace_processor_loads_it(own_probe, tmp_path):
    path = tmp_path / "trace.json"
    _trace(own_probe).write(path)
    tp = _trace_processor(path)
    try:
        rows = [(r.name, r.ts, r.dur) for r in tp.query("select name, ts, dur from slice where dur > 0 order by ts")]
        assert rows == [("vecAdd", 0, 4250), ("ns::kernel", 3500, 4250), ("scale", 11000, 4250)]
        assert [r.n for r in tp.query("select count(*) as n from slice where dur = 0")] == [6]
    finally:
        tp.close()


# --- every BTF shape (tests/output_probes/types.bpf.c) ------------------------------------------------

def _types_state(obj: BpfObject) -> MapsState:
    """types.bpf.c's maps after the workload (its LRU map), filled byte by byte as the probe's BTF lays
    them out (clang's layout: the struct formats spell out its padding)."""
    state = run_probe(obj)
    s = {st.mapdef.name: st for st in state.storages}
    ints = "<bBhH2xiIqQ?7x"
    s["ints"].update(b"\xff", struct.pack(ints, -128, 255, -32768, 65535, -2**31, 2**32 - 1, -2**63, 2**64 - 1, True))
    s["ints"].update(b"\x01", struct.pack(ints, -1, 1, -1, 1, -1, 1, 2**53 + 1, 2**63, False))
    s["s16"].update(struct.pack("<h", -5), struct.pack("<h", -7))
    s["s64"].update(struct.pack("<q", -5), struct.pack("<q", -2**63))
    s["flags"].update(_u32(1), b"\x01")
    s["flags"].update(_u32(2), b"\x00")
    for i, raw in enumerate([b"abcdefgh", b"ab\0cd\0\0\0", b"\xff\xfeok\0\0\0\0", b'a"b\nc\0\0\0', b"\x1b[31m\0\0\0"]):
        s["strs"].update(_u32(i), raw)
    # sb:4 = -1, ub:3 = 5, eb:3 = P_B, bb:1 = true, 2 unnamed bits, wide:40 = 2**40 - 1 (bit offsets 0/4/7/10/13)
    s["bits"].update(_u32(1), _u64(0xF | 5 << 4 | 2 << 7 | 1 << 10 | (2**40 - 1) << 13))
    s["bits"].update(_u32(2), _u64(8 | 7 << 7))   # sb = -8, eb = 7: no name
    outer = "<I4sfHHiB3xQQdiiQI3I"
    s["nested"].update(_u32(5) + b"tag\0\0\0\0\0", struct.pack(outer, 7, b"abcd", -2.5, 3, 4, -9, 0xEE, 2**64 - 1,
                                                              0xDEADBEEF, 3.25, -1, -2, 0x8000000000000001, 9, 1, 2, 3))
    s["nested"].update(_u32(5) + b"abc\0\0\0\0\0", bytes(80))
    for k, v in [(1, 1.5), (2, float("inf")), (3, float("nan"))]:
        s["floats"].update(_u32(k), struct.pack("<f", v))
    for k, v in [(-2, 0x8000000000000001), (7, 5), (3, 1)]:
        s["enums"].update(struct.pack("<i", k), _u64(v))
    for sm in (0, 2, 5):
        s["per_sm"].update(_u32(0), struct.pack("<QQ4sIQ?3xi", IDS[0], sm + 1, b"sm", 2, 0x1000, True, -sm), cpu=sm)
    s["empty"].update(_u32(1), _u64(1))
    s["empty"].delete(_u32(1))
    return state


@pytest.fixture(scope="module")
def types_obj(own_probe) -> BpfObject:
    return load_object(own_probe("types"))


def test_types_golden(types_obj):
    snap = values.snapshot(_types_state(types_obj), types_obj, NAMES)
    _golden("types.txt", text.render(snap))
    line = json_out.render(snap, time=1700000000.25, pid=4242, rank=0)
    doc = json.loads(line)
    _golden("types.json", json.dumps(doc, indent=1) + "\n")
    assert json.loads(json.dumps(doc)) == doc
    assert doc["maps"]["ints"]["entries"][0]["value"]["u64"] == 2**64 - 1   # exact, not a double
    total, left_out = combine.sum_snapshots([snap, values.snapshot(_types_state(types_obj), types_obj, NAMES)])
    assert left_out == []
    shown = {n: m for n, m in doc["maps"].items() if m["kind"] != "records"}
    assert _refilled(doc, types_obj) == shown   # every BTF shape encodes back as it decoded
    _golden("types_sum.txt", text.render(total))
    json.loads(json_out.render(total, time=0.0, pid=None, rank="all"))


def test_bitfields_read_as_their_members_type(types_obj):
    """A bitfield is its member's type cut to its width: a signed int sign-extends, a bool is true or
    false, an enum prints its name."""
    bits = next(m for m in values.snapshot(_types_state(types_obj), types_obj).maps if m.name == "bits")
    assert [e.value for e in bits.entries] == [
        {"sb": -1, "ub": 5, "eb": "P_B", "bb": True, "wide": 2**40 - 1},
        {"sb": -8, "ub": 0, "eb": 7, "bb": False, "wide": 0}]


def test_percpu_struct_sum_keeps_what_is_not_summed(types_obj):
    """The sum over SMs adds numbers field by field and keeps the rest (kernel ids, strings, enums,
    pointers, bools) as the SMs that wrote the slot have them, not as an unwritten slot's zeros."""
    snap = values.snapshot(_types_state(types_obj), types_obj, NAMES)
    per_sm = next(m for m in snap.maps if m.name == "per_sm")
    assert per_sm.value == {"kernel_id": IDS[0], "n": 1 + 3 + 6, "tag": "sm", "e": "P_B", "p": 0x1000, "seen": True,
                            "neg": -7}
    assert text.value(per_sm.value, NAMES).startswith("{ kernel_id: vecAdd, n: 10, ")


def test_log2_slots_past_64_bits_are_keys():
    """floor(log2) of a 64-bit value is at most 63: a hist map with a larger key holds values, not slots,
    and prints as a keyed map (as a histogram, slot 10000 drew 30 MB of rows, slot 2**20 never ended)."""
    m = MapDef("hist_raw", prog.MAP_HASH, 8, 8, 8)
    snap = values.snapshot(_state(m, {_u64(0): _u64(1), _u64(64): _u64(2)}), BpfObject("t.bpf.o", maps=[m]))
    assert text.render(snap) == "@hist_raw[0]: 1\n@hist_raw[64]: 2\n"
    assert _hist("hist", {63: 1}).buckets() == [(1 << 63, 1 << 64, 1)]


def test_perthread_array_leaves_zero_slots_out_as_arrays_do():
    """bpftime's per-thread array (1502, 1512) is an array of a slot per key: unwritten slots are left out,
    a single slot is a scalar."""
    m, one = MapDef("pt", prog.MAP_PERTHREAD_ARRAY, 4, 8, 4), MapDef("pt1", prog.MAP_PERTHREAD_ARRAY, 4, 8, 1)
    state = MapsState([m, one])
    for thread in (0, 7, 40):
        state[0].update(_u32(1), _u64(thread + 1), cpu=thread)
    assert text.render(values.snapshot(state, BpfObject("t.bpf.o", maps=[m, one]))) == "@pt[1]: 50\n\n@pt1: 0\n"
