"""Warp memory records (output/warp_records.py, helper egpu_warp_mem_record): the codec round-trips any
per-lane trace, picks the form the GPU picks, refuses bytes that are no record in one line; the layout
is egpu.bpf.h's; the helper's PTX assembles; and on the reference VM, examples/mem_trace_warp.bpf.c run
over a small grid expands to exactly the trace examples/access_trace.bpf.c writes.
"""

from __future__ import annotations

import random
import subprocess
from contextlib import nullcontext
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egpu_preload.bpf import ctx as ctxmod
from egpu_preload.bpf.compile import compile_probe
from egpu_preload.bpf.elf import load_object
from egpu_preload.maps import MapsState
from egpu_preload.output import warp_records as wr
from egpu_preload.output.warp_records import FORM_ADDRS, FORM_AFFINE, FORM_OFFSETS, LaneAccess
from egpu_preload.translate import probe_object_ptx
from egpu_preload.translate.rewrite import instrument, probe_specs
from egpu_preload.vm import ThreadSim, Vm
from test_vm import make_ctx

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
E2E = Path(__file__).resolve().parent / "e2e"
BLOCK = (16, 3, 2)      # 96 threads, three warps, all three axes used by the lanes' thread indices
LOAD, STORE, ATOMIC = ctxmod.FLAG_LOAD, ctxmod.FLAG_STORE, ctxmod.FLAG_ATOMIC
M64 = (1 << 64) - 1


def _thread(linear: int) -> tuple[int, int, int]:
    bx, by, _ = BLOCK
    return linear % bx, linear // bx % by, linear // (bx * by)


def _lanes(ts: int, warp: int, site: int, size: int, flags: int, addrs: dict[int, int]) -> list[LaneAccess]:
    """One warp instruction's per-lane records, in lane order (block (1, 2, 0), SM 5, kernel 7, launch 9)."""
    return [LaneAccess(ts, a & M64, 7, 9, site, size, flags, 5, (1, 2, 0), _thread(32 * warp + lane))
            for lane, a in sorted(addrs.items())]


# ---- the codec -------------------------------------------------------------------------------------

masks = st.integers(1, (1 << 32) - 1)


@st.composite
def instructions(draw) -> list[LaneAccess]:
    lanes = wr.lanes_of(draw(masks))
    shape = draw(st.sampled_from(["affine", "near", "far"]))
    base = draw(st.integers(0, M64))
    if shape == "affine":
        stride = draw(st.integers(-(1 << 63), (1 << 63) - 1) | st.sampled_from([0, 1, 4, 8, 16, -4]))
        addrs = {i: base + stride * i for i in lanes}
    elif shape == "near":
        addrs = {i: base + draw(st.integers(-(1 << 31), (1 << 31) - 1)) for i in lanes}
    else:
        addrs = {i: draw(st.integers(0, M64)) for i in lanes}
    return _lanes(draw(st.integers(0, 1 << 40)), draw(st.integers(0, 2)), draw(st.integers(0, 1 << 20)),
                  draw(st.integers(1, 16)), draw(st.integers(1, 7)), addrs)


@settings(max_examples=300, deadline=None)
@given(st.lists(instructions(), min_size=1, max_size=8))
def test_compress_then_expand_is_the_per_lane_trace(instrs: list[list[LaneAccess]]) -> None:
    trace = [r for ins in instrs for r in ins]
    records = wr.compress(trace, BLOCK)
    assert len(records) <= len(instrs)
    assert [lane for rec in records for lane in wr.expand(rec)] == trace
    for rec in records:   # and through the bytes the GPU writes
        raw = wr.encode(rec)
        assert len(raw) % 8 == 0 and wr.decode(raw) == rec and wr.expand(raw) == wr.expand(rec)


@settings(max_examples=100, deadline=None)
@given(st.lists(instructions(), min_size=1, max_size=6), st.randoms(use_true_random=False))
def test_any_order_of_lanes_round_trips(instrs: list[list[LaneAccess]], rnd: random.Random) -> None:
    trace = [r for ins in instrs for r in ins]
    rnd.shuffle(trace)
    assert [lane for rec in wr.compress(trace, BLOCK) for lane in wr.expand(rec)] == trace


def _one(addrs: dict[int, int]) -> wr.WarpRecord:
    rec, = wr.compress(_lanes(100, 1, 3, 4, LOAD, addrs), BLOCK)
    return rec


@pytest.mark.parametrize("addrs, form, stride, size", [
    ({i: 0x1000 + 4 * i for i in range(32)}, FORM_AFFINE, 4, 72),                     # a[threadIdx.x]
    ({i: 0x1000 + 4 * i for i in (3, 4, 9, 31)}, FORM_AFFINE, 4, 72),                 # partial, affine in the lane
    ({i: 0x1000 + 24 * i for i in (1, 7, 13)}, FORM_AFFINE, 24, 72),                  # second lane 6 apart
    ({i: 0x2000 - 8 * i for i in range(8)}, FORM_AFFINE, -8, 72),                      # descending
    ({i: 0x40 for i in range(32)}, FORM_AFFINE, 0, 72),                                # one address (atomics)
    ({5: 0xFFFF_FFFF_FFFF_FFF8, 6: 0, 7: 8}, FORM_AFFINE, 8, 72),                      # wraps around 2**64
    ({9: 0x1234}, FORM_AFFINE, 0, 72),                                                 # a lone lane
    ({i: 0x1000 + 4 * (i * 7 % 32) for i in range(32)}, FORM_OFFSETS, 0, 72 + 128),   # a gather
    ({0: 0x1000, 1: 0x1004, 2: 0x1010}, FORM_OFFSETS, 0, 72 + 16),                    # 3 offsets, padded to 8
    ({0: 0, 1: 1 << 31}, FORM_AFFINE, 1 << 31, 72),
    ({0: 0, 1: 4, 2: 1 << 40}, FORM_ADDRS, 0, 72 + 24),                               # beyond s32
    ({0: 0x1000, 1: 0x1000 - (1 << 31)}, FORM_AFFINE, -(1 << 31), 72),
])
def test_form_and_size(addrs: dict[int, int], form: int, stride: int, size: int) -> None:
    rec = _one(addrs)
    assert (rec.form, rec.stride, len(wr.encode(rec))) == (form, stride, size)
    assert [r.addr for r in wr.expand(rec)] == [a & M64 for _, a in sorted(addrs.items())]


def test_odd_stride_over_a_gap_is_not_affine() -> None:
    """Lanes 0 and 2 three bytes apart: div.s64 gives stride 1, which misses lane 2, so offsets."""
    rec = _one({0: 0x1000, 2: 0x1003, 3: 0x1004})
    assert (rec.form, rec.tail) == (FORM_OFFSETS, (0, 3, 4))


def test_lanes_of_one_warp_instruction_share_a_record_and_a_repeated_lane_starts_the_next() -> None:
    trace = _lanes(1, 0, 3, 4, LOAD, {0: 0x10, 1: 0x14}) + _lanes(1, 0, 3, 4, LOAD, {0: 0x18})
    assert [r.mask for r in wr.compress(trace, BLOCK)] == [0b11, 0b1]


@pytest.mark.parametrize("raw, reason", [
    (b"\0" * 40, "40 bytes, shorter than its 72-byte header"),
    (wr.HEADER.pack(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 4, 1, 0), "no lane in its mask"),
    (wr.HEADER.pack(0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 4, 1, 3), "unknown form 3"),
    (wr.HEADER.pack(0, 0, 0, 0, 0, 0, 0b111, 0, 0, 0, 1, 1, 0, 0, 4, 1, FORM_OFFSETS), "72 bytes, its mask and form "
     "say 88"),
    (wr.HEADER.pack(0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 4, 1, FORM_AFFINE) + bytes(8), "80 bytes"),
])
def test_bad_bytes_are_refused_in_one_line(raw: bytes, reason: str) -> None:
    with pytest.raises(wr.WarpRecordError, match=reason):
        wr.expand(raw)


def test_a_thread_outside_the_block_is_refused() -> None:
    with pytest.raises(wr.WarpRecordError, match=r"thread \(16, 0, 0\) is outside blocks of \(16, 3, 2\)"):
        wr.compress([LaneAccess(0, 0, 0, 0, 0, 4, LOAD, 0, (0, 0, 0), (16, 0, 0))], BLOCK)


# ---- the layout, the PTX -----------------------------------------------------------------------------

LAYOUT = """#include "egpu.bpf.h"
struct { __uint(type, BPF_MAP_TYPE_RINGBUF); __uint(max_entries, 4096); } ring SEC(".maps");
__noinline int touch(struct egpu_warp_mem *w) { return w ? 1 : 0; }
SEC("egpu/mem/*") int p(struct egpu_ctx *ctx) { egpu_warp_mem_record(&ring, ctx); return touch(0); }
char LICENSE[] SEC("license") = "GPL";
"""


def _members(obj_path: Path, name: str) -> list[tuple[str, int, int]]:
    btf = load_object(obj_path).btf
    t = btf.find(name)
    return [(m.name, m.offset, btf.size(m.type)) for m in btf.members(t.id)]


def test_struct_egpu_warp_mem_is_the_codecs(tmp_path: Path) -> None:
    src = tmp_path / "layout.bpf.c"
    src.write_text(LAYOUT)
    got = _members(compile_probe(src, tmp_path / "layout.bpf.o"), "egpu_warp_mem")
    assert [(n, off) for n, off, _ in got] == list(wr.OFFSET.items())
    assert sum(size for *_, size in got) == wr.HEADER.size
    assert [s for *_, s in got] == [8, 8, 8, 8, 8, 4, 4, 12, 4, 2, 2, 2, 1, 1]


def test_lane_records_are_access_traces_struct_mem_event(tmp_path: Path) -> None:
    got = _members(compile_probe(EXAMPLES / "access_trace.bpf.c", tmp_path / "at.bpf.o"), "mem_event")
    assert [n for n, *_ in got] == list(LaneAccess.__dataclass_fields__)
    assert got[-1][1] + got[-1][2] == wr.LANE.size


DIVERGENT = """#include "egpu.bpf.h"
struct { __uint(type, BPF_MAP_TYPE_RINGBUF); __uint(max_entries, 1 << 16); } loads SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_RINGBUF); __uint(max_entries, 1 << 16); } stores SEC(".maps");
SEC("egpu/mem/*") int p(struct egpu_ctx *ctx) {
	if (ctx->flags & EGPU_F_STORE)
		return egpu_warp_mem_record(&stores, ctx);
	if (ctx->addr & 8)
		egpu_warp_mem_record(&loads, ctx);
	return 0;
}
char LICENSE[] SEC("license") = "GPL";
"""


@pytest.mark.parametrize("source", ["example", "divergent"])
def test_helper_ptx_assembles(ptxas: str, tmp_path: Path, source: str) -> None:
    """The example, and calls under divergent branches into two rings, through ptxas -arch=sm_90."""
    if source == "example":
        obj = compile_probe(EXAMPLES / "mem_trace_warp.bpf.c", tmp_path / "p.bpf.o")
    else:
        (tmp_path / "p.bpf.c").write_text(DIVERGENT)
        obj = compile_probe(tmp_path / "p.bpf.c", tmp_path / "p.bpf.o")
    text = probe_object_ptx(load_object(obj))
    assert "match.any.sync.b64" in text and "vote.sync.all.pred" in text
    (tmp_path / "p.ptx").write_text(text)
    done = subprocess.run([ptxas, "-arch=sm_90", str(tmp_path / "p.ptx"), "-o", str(tmp_path / "p.cubin")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_example_instruments_nvcc_ptx_that_assembles(ptxas: str, tmp_path: Path) -> None:
    """tests/e2e/gather.cu (every record form on the GPU) compiled by nvcc, instrumented with the example."""
    ptx = tmp_path / "gather.ptx"
    subprocess.run(["nvcc", "-O2", "-arch=sm_90", "--ptx", "-o", str(ptx), str(E2E / "gather.cu")], check=True)
    obj = load_object(compile_probe(EXAMPLES / "mem_trace_warp.bpf.c", tmp_path / "p.bpf.o"))
    res = instrument(ptx.read_text(), probe_specs(obj))
    assert [k.status for k in res.kernels] == ["instrumented"]
    (tmp_path / "out.ptx").write_text(res.text)
    done = subprocess.run([ptxas, "-arch=sm_90", str(tmp_path / "out.ptx"), "-o", str(tmp_path / "out.cubin")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# ---- the VM: the example against access_trace on a small grid -------------------------------------------

N = 150   # threads with work: the last warp of block 1 is partial (if (i < n), as vecadd)


def _grid_instructions():
    """(block, warp, site, size, flags, lane -> address) of a small kernel's warp instructions, two blocks
    of BLOCK: a[i] (affine), a gather b[i * 7 % N] (offsets), c[i] stored by odd lanes (affine, partial),
    a pointer chase across the address space (addresses), an atomic on one counter (stride 0)."""
    far = random.Random(5)
    ptrs = [far.getrandbits(64) & ~7 for _ in range(2 * 96)]
    for block in range(2):
        for warp in range(3):
            ids = [block * 96 + warp * 32 + lane for lane in range(32)]
            live = {lane: i for lane, i in enumerate(ids) if i < N}
            yield block, warp, 1, 4, LOAD, {lane: 0x7000_0000 + 4 * i for lane, i in live.items()}
            yield block, warp, 2, 8, LOAD, {lane: 0x7100_0000 + 8 * (i * 7 % N) for lane, i in live.items()}
            yield block, warp, 3, 16, STORE, {lane: 0x7200_0000 + 16 * i for lane, i in live.items() if lane % 2}
            yield block, warp, 4, 1, LOAD, {lane: ptrs[i] for lane, i in live.items()}
            yield block, warp, 5, 4, LOAD | STORE | ATOMIC, {lane: 0x7300_0000 for lane in live}


def _run_grid(obj_path: Path, ring: str, warps: bool) -> list[bytes]:
    obj = load_object(obj_path)
    state = MapsState(obj.maps)
    vm = Vm(obj.programs[0].code, obj.maps, state)
    for t, (block, warp, site, size, flags, addrs) in enumerate(_grid_instructions()):
        if not addrs:
            continue
        with vm.warps.instruction() if warps else nullcontext():
            for lane, addr in addrs.items():
                thread = ThreadSim(thread_idx=_thread(32 * warp + lane), block_idx=(block, 0, 0), block_dim=BLOCK,
                                   grid_dim=(2, 1, 1), smid=block + 3, globaltimer=1000 + 10 * t)
                ctx = make_ctx(addr=addr, size=size, flags=flags, site=site, kernel_id=11, launch_id=2)
                assert vm.run(ctx, thread) == 0
    storage = state.by_name(ring)
    assert storage.drops == 0
    return storage.consume()


def test_vm_warp_trace_expands_to_the_per_thread_trace(tmp_path: Path) -> None:
    per_lane = _run_grid(compile_probe(EXAMPLES / "access_trace.bpf.c", tmp_path / "at.bpf.o"), "events", False)
    warp = _run_grid(compile_probe(EXAMPLES / "mem_trace_warp.bpf.c", tmp_path / "w.bpf.o"), "warp_events", True)
    assert [r.pack() for rec in warp for r in wr.expand(rec)] == per_lane
    forms = [wr.decode(rec).form for rec in warp]
    assert {f: forms.count(f) for f in (FORM_AFFINE, FORM_OFFSETS, FORM_ADDRS)} == {
        FORM_AFFINE: 15, FORM_OFFSETS: 5, FORM_ADDRS: 5}   # 5 warps with work (block 1's last has none) x 5 sites
    assert len(per_lane) == 4 * N + 75   # sites 1, 2, 4, 5: every live lane; site 3: the 75 odd ones
    saved = sum(len(r) + 8 for r in per_lane) / sum(len(r) + 8 for r in warp)
    assert saved > 4   # ring bytes (8-byte record headers included), per-lane over per-warp


def test_vm_lanes_outside_a_warp_block_are_one_lane_warps(tmp_path: Path) -> None:
    warp = _run_grid(compile_probe(EXAMPLES / "mem_trace_warp.bpf.c", tmp_path / "w.bpf.o"), "warp_events", False)
    assert {bin(wr.decode(rec).mask).count("1") for rec in warp} == {1}


SMALL_RING = """#include "egpu.bpf.h"
struct { __uint(type, BPF_MAP_TYPE_RINGBUF); __uint(max_entries, 4096); } ring SEC(".maps");
SEC("egpu/mem/*") int p(struct egpu_ctx *ctx) { return egpu_warp_mem_record(&ring, ctx); }
char LICENSE[] SEC("license") = "GPL";
"""


def test_vm_a_full_ring_counts_the_drop_and_returns_0(tmp_path: Path) -> None:
    (tmp_path / "p.bpf.c").write_text(SMALL_RING)
    obj = load_object(compile_probe(tmp_path / "p.bpf.c", tmp_path / "p.bpf.o"))
    state = MapsState(obj.maps)
    vm = Vm(obj.programs[0].code, obj.maps, state)
    for lane in range(60):   # 80 ring bytes a record: 51 fit in 4096
        assert vm.run(make_ctx(addr=lane, size=1, flags=LOAD), ThreadSim(thread_idx=(lane % 32, 0, 0),
                                                                                block_dim=(32, 1, 1))) == 0
    ring = state.by_name("ring")
    assert (len(ring.consume()), ring.drops) == (51, 9)


def test_verifier_wants_a_ring(tmp_path: Path) -> None:
    from egpu_preload.bpf.verifier import verify
    from egpu_preload.errors import EgpuError
    (tmp_path / "p.bpf.c").write_text(SMALL_RING.replace("BPF_MAP_TYPE_RINGBUF); __uint(max_entries, 4096)",
                                                         "BPF_MAP_TYPE_ARRAY); __uint(max_entries, 1); "
                                                         "__type(key, __u32); __type(value, __u64)"))
    obj = load_object(compile_probe(tmp_path / "p.bpf.c", tmp_path / "p.bpf.o"))
    with pytest.raises(EgpuError, match="map ring of type array cannot be used with egpu_warp_mem_record"):
        verify(obj.programs[0].code, obj.maps)


def test_vm_a_warp_record_takes_its_lowest_lanes_time_whatever_order_lanes_run(tmp_path: Path) -> None:
    (tmp_path / "p.bpf.c").write_text(SMALL_RING)
    obj = load_object(compile_probe(tmp_path / "p.bpf.c", tmp_path / "p.bpf.o"))
    state = MapsState(obj.maps)
    vm = Vm(obj.programs[0].code, obj.maps, state)
    with vm.warps.instruction():
        for lane in (5, 2, 9):
            vm.run(make_ctx(addr=0x100 + 8 * lane, size=8, flags=LOAD), ThreadSim(thread_idx=(lane, 0, 0),
                                                                                  block_dim=(32, 1, 1),
                                                                                  globaltimer=100 + lane))
    rec, = [wr.decode(r) for r in state.by_name("ring").consume()]
    assert (rec.ins.ts, rec.mask, rec.base, rec.stride) == (102, 1 << 2 | 1 << 5 | 1 << 9, 0x110, 8)


# ---- in the trace file: written whole, expanded per lane by its reader --------------------------------

def _trace_rows(path: Path, records: list[bytes], layout) -> list[dict]:
    from egpu_preload.output import tracefile
    writer = tracefile.TraceWriter(path, [("events", layout)])
    writer.add(0, [(0, r) for r in records])
    writer.close({"events": 0})
    return tracefile.read(path).rows.drop_columns(["data", "text"]).to_pylist()


@pytest.mark.parametrize("suffix", [".arrow", ".parquet"])
def test_a_warp_trace_file_reads_back_as_the_per_thread_trace_file(tmp_path: Path, suffix: str) -> None:
    """The VM's warp records of the grid, as egpu-run --trace writes them (whole, the ring named a ring of
    struct egpu_warp_mem), read back by egpu trace's reader: row for row the file access_trace.bpf.c's
    per-lane records make, every column alike (seq numbering the lanes), on records of all three forms."""
    pytest.importorskip("pyarrow")
    from egpu_preload.output import tracefile
    at = compile_probe(EXAMPLES / "access_trace.bpf.c", tmp_path / "at.bpf.o")
    btf = load_object(at).btf
    per_lane = _trace_rows(tmp_path / f"lanes{suffix}", _run_grid(at, "events", False),
                           tracefile.record_layout(btf, tracefile.record_struct(btf)))
    warp = _run_grid(compile_probe(EXAMPLES / "mem_trace_warp.bpf.c", tmp_path / "w.bpf.o"), "warp_events", True)
    assert len({wr.decode(r).form for r in warp}) == 3
    assert _trace_rows(tmp_path / f"warp{suffix}", warp, tracefile.whole_records(wr.RECORD_TYPE)) == per_lane
    assert len(per_lane) == 4 * N + 75


def test_warp_records_read_by_pyarrow_alone_are_the_rings_bytes(tmp_path: Path) -> None:
    """Without egpu the file holds each record's bytes in ``data`` and names their struct in its metadata."""
    pa = pytest.importorskip("pyarrow")
    import json

    from egpu_preload.output import tracefile
    warp = _run_grid(compile_probe(EXAMPLES / "mem_trace_warp.bpf.c", tmp_path / "w.bpf.o"), "warp_events", True)
    writer = tracefile.TraceWriter(tmp_path / "w.arrow", [("warp_events", tracefile.whole_records(wr.RECORD_TYPE))])
    writer.add(0, [(0, r) for r in warp])
    writer.close({"warp_events": 0})
    with pa.OSFile(str(tmp_path / "w.arrow")) as f:
        table = pa.ipc.open_file(f).read_all()
    assert table.column("data").to_pylist() == warp
    assert json.loads(table.schema.metadata[b"egpu.record_types"]) == {"warp_events": "struct egpu_warp_mem"}


@pytest.mark.parametrize("bad, reason", [
    (b"\0" * 16, "record 1: warp record of 16 bytes, shorter than its 72-byte header"),
    (wr.HEADER.pack(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 1, 0, 0, 4, 1, 0), "record 1: warp record with no lane"),
    (wr.HEADER.pack(0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 4, 1, 0), "record 1: a block dimension of 0"),
])
def test_a_record_that_is_no_warp_record_is_named_with_the_file(tmp_path: Path, bad: bytes, reason: str) -> None:
    pytest.importorskip("pyarrow")
    from egpu_preload.errors import EgpuError
    from egpu_preload.output import tracefile
    good = wr.encode(wr.warp_record(wr.Instruction(1, 2, 3, 4, 4, 1, 0, (0, 0, 0), (32, 1), 0), {0: 64, 1: 68}))
    path = tmp_path / "w.arrow"
    writer = tracefile.TraceWriter(path, [("warp_events", tracefile.whole_records(wr.RECORD_TYPE))])
    writer.add(0, [(0, good), (0, bad)])
    writer.close({})
    with pytest.raises(EgpuError) as e:
        tracefile.read(path)
    assert str(path) in str(e.value) and reason in str(e.value)


@pytest.mark.parametrize("columns, reason", [
    ({"cpu": [0]}, "no data column"), ({"data": [1], "cpu": [0]}, "data is int64, not the records' bytes"),
    ({"data": [wr.encode(wr.warp_record(wr.Instruction(1, 2, 3, 4, 4, 1, 0, (0, 0, 0), (32, 1), 0), {0: 64}))]},
     "no cpu column")])
def test_warp_records_without_their_columns_are_named_with_the_file(tmp_path: Path, columns: dict,
                                                                    reason: str) -> None:
    """A file whose metadata names a map's records struct egpu_warp_mem, without the columns a warp record is
    read from (found by writing such files with pyarrow: KeyError and ArrowNotImplementedError tracebacks)."""
    pa = pytest.importorskip("pyarrow")
    import json
    import pyarrow.parquet as pq
    from egpu_preload.errors import EgpuError
    from egpu_preload.output import tracefile
    path = tmp_path / "w.parquet"
    pq.write_table(pa.table({"map": ["warp_events"], "seq": [0], **columns}).replace_schema_metadata(
        {tracefile.RECORD_TYPES: json.dumps({"warp_events": wr.RECORD_TYPE})}), path)
    with pytest.raises(EgpuError) as e:
        tracefile.read(path)
    assert str(e.value) == f"{path}: map warp_events: not {wr.RECORD_TYPE} records: {reason}"


BOTH = """#include "egpu.bpf.h"
struct { __uint(type, BPF_MAP_TYPE_RINGBUF); __uint(max_entries, 1 << 16); } warps SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_RINGBUF); __uint(max_entries, 1 << 16); } mixed SEC(".maps");
SEC("egpu/mem/*") int p(struct egpu_ctx *ctx) {
	__u64 a = ctx->addr;
	egpu_warp_mem_record(&warps, ctx);
	egpu_warp_mem_record(&mixed, ctx);
	bpf_ringbuf_output(&mixed, &a, sizeof(a), 0);
	return 0;
}
char LICENSE[] SEC("license") = "GPL";
"""


@pytest.mark.parametrize("source, rings", [("mem_trace_warp", {"warp_events"}), ("access_trace", set()),
                                           ("divergent", {"loads", "stores"}), ("both", {"warps"})])
def test_the_rings_egpu_run_trace_names_warp_rings(tmp_path: Path, source: str, rings: set[str]) -> None:
    """Only a ring no other helper writes holds nothing but warp records, and only it is expanded."""
    from egpu_preload.runtime.probes import load_probe
    from egpu_preload.runtime.streaming import WARP_LAYOUT, rings as drained
    src = EXAMPLES / f"{source}.bpf.c"
    if source in ("divergent", "both"):
        src = tmp_path / f"{source}.bpf.c"
        src.write_text(DIVERGENT if source == "divergent" else BOTH)
    probe = load_probe(compile_probe(src, tmp_path / f"{source}.bpf.o"))
    assert {name for name, _, layout in drained([probe]) if layout is WARP_LAYOUT} == rings


def test_warp_records_taken_as_blocks_read_back_as_written(tmp_path: Path) -> None:
    """Records of one size come from the drain as a Block (runtime/ring_drain.py) and go into the file's data
    column as they are, offsets made, no pyarrow compute kernel run in the job: read back they expand as
    expand() expands each."""
    pytest.importorskip("pyarrow")
    import numpy as np

    from egpu_preload.output import tracefile
    from egpu_preload.runtime.ring_drain import Block
    raw = [wr.encode(wr.warp_record(wr.Instruction(t, 7, 9, t % 3, 4, 1, 5, (t, 0, 0), (64, 1), t % 2),
                                    {lane: 4096 + 4 * lane + 256 * t for lane in range(32)})) for t in range(40)]
    path = tmp_path / "w.arrow"
    writer = tracefile.TraceWriter(path, [("warp_events", tracefile.whole_records(wr.RECORD_TYPE))])
    writer.add(0, [Block(np.zeros(40, np.uint32), np.frombuffer(b"".join(raw), np.uint8).reshape(40, 72))])
    writer.close({})
    rows = tracefile.read(path).rows.to_pylist()
    assert [(r["addr"], r["thread[0]"], r["ts"]) for r in rows] == \
        [(lane.addr, lane.thread[0], lane.ts) for r in raw for lane in wr.expand(r)]


def test_a_warp_ring_with_no_records_reads_back_empty(tmp_path: Path) -> None:
    """A process whose kernels made no access still writes its file: the ring's map is there, its rows none."""
    pytest.importorskip("pyarrow")
    from egpu_preload.output import tracefile
    path = tmp_path / "w.arrow"
    writer = tracefile.TraceWriter(path, [("warp_events", tracefile.whole_records(wr.RECORD_TYPE)),
                                          ("trace_printk", None)])
    writer.close({})
    assert tracefile.read(path).rows.num_rows == 0


def test_expanded_columns_another_struct_types_otherwise_are_prefixed(tmp_path: Path) -> None:
    """Lane columns named as another ring's struct members but typed otherwise (a signed ts) take their
    map's name, as the writer prefixes clashing members, instead of failing the read or changing type."""
    pytest.importorskip("pyarrow")
    import struct

    from egpu_preload.output import tracefile
    good = wr.encode(wr.warp_record(wr.Instruction(1, 2, 3, 4, 4, 1, 0, (0, 0, 0), (32, 1), 0), {0: 64, 1: 68}))
    signed = tracefile.RecordLayout("struct ev", 8, (tracefile.Column("ts", 0, 8, "i"),))
    path = tmp_path / "w.arrow"
    writer = tracefile.TraceWriter(path, [("warp", tracefile.whole_records(wr.RECORD_TYPE)), ("ev", signed)])
    writer.add(0, [(0, good)])
    writer.add(1, [(0, struct.pack("<q", -5))])
    writer.close({})
    rows = tracefile.read(path).rows
    assert rows.column("ts").to_pylist() == [-5, None, None] and rows.column("warp.ts").to_pylist() == [None, 1, 1]


def test_raw_records_past_a_binary_arrays_reach_are_written_in_chunks(tmp_path: Path, monkeypatch) -> None:
    """A flush of raw records whose bytes exceed what 32-bit offsets reach (rings of gigabytes, records of
    tens of KiB) is written as several binary chunks, every record whole and in order."""
    pytest.importorskip("pyarrow")
    import numpy as np

    from egpu_preload.output import tracefile
    from egpu_preload.runtime.ring_drain import Block
    monkeypatch.setattr(tracefile, "BINARY_BYTES", 100)   # 4 records of 24 bytes a chunk
    rows = np.arange(10 * 24, dtype=np.uint8).reshape(10, 24)
    path = tmp_path / "raw.arrow"
    writer = tracefile.TraceWriter(path, [("raw", None)])
    writer.add(0, [Block(np.zeros(10, np.uint32), rows)])
    writer.close({})
    assert tracefile.read(path).rows.column("data").to_pylist() == [r.tobytes() for r in rows]
