"""Allocation table (against a linear-scan model), launch buffers from argument bytes (with corpus PTX
read/write sets and without), and the DAG of launches and copies: edges, cuts, writers since a cut."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ptx_corpus
from egpu_preload.cow.allocations import (AllocationTable, AllocKind, launch_uses, pack_args,
                                          param_offsets, read_shim)
from egpu_preload.cow.dag import Dag, Edge, included
from egpu_preload.cow.rwsets import analyse
from egpu_preload.errors import CowError
from egpu_preload.translate import ptx

MiB = 1 << 20


def _table(*ranges: tuple[int, int], kind: AllocKind = AllocKind.DEVICE) -> AllocationTable:
    t = AllocationTable()
    for address, size in ranges:
        t.insert(address, size, kind)
    return t


# ---- allocation table ----

@pytest.mark.parametrize("ptr,want", [
    (0x1000, 0), (0x1fff, 0), (0x2000, None), (0x2fff, None), (0x3000, 1), (0x3000 + MiB - 1, 1),
    (0x3000 + MiB, None), (0, None), (0xfff, None),
])
def test_find_returns_the_allocation_containing_a_pointer(ptr, want):
    t = _table((0x1000, 0x1000), (0x3000, MiB))
    got = t.find(ptr)
    assert (got.seq if got else None) == want


def test_vmm_handles_never_match_pointers_and_removal_keeps_key_spaces_apart():
    t = AllocationTable()
    t.insert(0x1000, 64, AllocKind.VMM_HANDLE)
    t.insert(0x1000, 64, AllocKind.VMM_MAPPING)
    assert t.find(0x1000).kind == AllocKind.VMM_MAPPING and len(t) == 2
    assert t.remove(0x1000, AllocKind.VMM_HANDLE).kind == AllocKind.VMM_HANDLE
    assert t.find(0x1000) is not None and len(t) == 1


def test_an_overlapping_insert_replaces_ranges_whose_free_was_missed():
    t = _table((0x1000, 0x100), (0x1100, 0x100), (0x1200, 0x100))
    new = t.insert(0x10f0, 0x20, AllocKind.ASYNC)
    assert [a.address for a in t] == [0x10f0, 0x1200]
    assert t.find(0x1000) is None and t.find(0x1100) == new


def test_sync_adds_and_removes_and_numbers_in_creation_order():
    t = AllocationTable()
    added, removed = t.sync([(0x1000, 16, 1), (0x2000, 32, 4)])
    assert [a.seq for a in added] == [0, 1] and removed == []
    added, removed = t.sync([(0x2000, 32, 4), (0x1000, 48, 1), (0x9000, 8, 7, 10)])
    assert [(a.address, a.seq) for a in removed] == [(0x1000, 0)]
    assert [(a.address, a.seq) for a in added] == [(0x1000, 2), (0x9000, 10)]
    assert [a.seq for a in t.by_creation()] == [1, 2, 10]
    assert t.insert(0x5000, 8, 1).seq == 11   # numbering continues after the shim's numbers


def test_overlapping_lists_every_allocation_a_range_touches():
    t = _table((0x1000, 0x100), (0x1100, 0x100), (0x1300, 0x100))
    assert [a.address for a in t.overlapping(0x10ff, 2)] == [0x1000, 0x1100]
    assert [a.address for a in t.overlapping(0x1200, 0x100)] == []
    assert [a.address for a in t.overlapping(0x1250, 0x200)] == [0x1300]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 63), st.integers(0, 4)), max_size=40),
       st.lists(st.integers(0, 64 * 16 + 32), max_size=20))
def test_table_matches_a_linear_model(steps, probes):
    t, model = AllocationTable(), []
    for insert, slot, length in steps:
        address, size = slot * 16, length * 16
        if insert:
            a = t.insert(address, size, AllocKind.DEVICE)
            model = [m for m in model if not (m.address < address + max(size, 1) and address < m.end)
                     and m.address != address]
            model.append(a)
        else:
            t.remove(address)
            model = [m for m in model if m.address != address]
    assert sorted(t, key=lambda a: a.address) == sorted(model, key=lambda a: a.address)
    for p in probes:
        assert t.find(p) == next((m for m in model if m.contains(p)), None)


def test_read_shim_copies_the_shims_table_and_retries_when_it_grew():
    cffi = pytest.importorskip("cffi")
    ffi = cffi.FFI()
    ffi.cdef("struct egpu_alloc { unsigned long long address; unsigned long long size; int kind;"
             " unsigned long long seq; };")
    rows = [(0x1000 * (i + 1), 64, 1, 7 + i) for i in range(300)]

    class Lib:
        calls = 0

        def egpu_shim_allocations(self, out, room):
            Lib.calls += 1
            for i, (a, s, k, q) in enumerate(rows[:room]):
                out[i].address, out[i].size, out[i].kind, out[i].seq = a, s, k, q
            return len(rows)

    assert read_shim(ffi, Lib()) == rows and Lib.calls == 2


# ---- launch buffers ----

@pytest.fixture(scope="module")
def corpus_sets():
    c = ptx_corpus.build()
    return {name: analyse(c[name]) for name in ("vector_add.sm_90", "fixture.cupy_0", "atomics.sm_90")}


A, B, C, D = 0x10000, 0x20000, 0x30000, 0x40000


@pytest.fixture
def table():
    return _table((A, 0x1000), (B, 0x1000), (C, 0x1000), (D, 0x1000))


def _kernel(sets, module, kernel):
    rw = sets[module][kernel]
    return rw.params, rw


def test_param_offsets_follow_each_parameters_alignment():
    params = ptx.parse(".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k(.param .u32 a, "
                       ".param .u64 b, .param .u8 c, .param .align 8 .b8 s[24], .param .f32 d)\n{\nret;\n}\n"
                       ).kernels()[0].params
    assert param_offsets(params) == [0, 8, 16, 24, 48]
    packed = pack_args([b"\1\0\0\0", (7).to_bytes(8, "little"), b"\2", bytes(range(24)), b"\3\3\3\3"], params)
    assert len(packed) == 52 and packed[8:16] == (7).to_bytes(8, "little") and packed[24:48] == bytes(range(24))


def test_vector_add_launch_with_ptx_sets_reads_a_b_and_writes_c(corpus_sets, table):
    params, rw = _kernel(corpus_sets, "vector_add.sm_90", "vector_add")
    args = struct.pack("<QQQi", A + 16, B, C + 0x800, 1024)
    uses = launch_uses(args, table, params, rw)
    assert {a.address: m for a, m in uses.modes.items()} == {A: "r", B: "r", C: "w"}
    assert not uses.anything


def test_cupy_struct_argument_pointer_found_at_its_offset(corpus_sets, table):
    params, rw = _kernel(corpus_sets, "fixture.cupy_0", "cupy_multiply__float32_float_float32")
    carray = lambda ptr: struct.pack("<QQQQ", ptr, 4096, 4, 4)   # data, size, shape, strides
    # a stride word that happens to equal D's address is not a pointer the kernel dereferences
    args = carray(A) + struct.pack("<f4x", 2.0) + struct.pack("<QQQQ", B, 4096, 4, D) + struct.pack("<QQQ", 1, 1, 1)
    assert param_offsets(params) == [0, 32, 40, 72]
    uses = launch_uses(args, table, params, rw)
    assert {a.address: m for a, m in uses.modes.items()} == {A: "r", B: "w"}


@pytest.mark.parametrize("with_params", [True, False])
def test_without_ptx_sets_every_pointed_allocation_is_read_write(corpus_sets, table, with_params):
    params, _ = _kernel(corpus_sets, "vector_add.sm_90", "vector_add")
    args = struct.pack("<QQQi", A, B + 8, 0x999, 7)
    uses = launch_uses(args, table, params if with_params else None)
    assert {a.address: m for a, m in uses.modes.items()} == {A: "rw", B: "rw"}
    assert not uses.anything


def test_inexact_sets_add_the_conservative_scan_and_say_anything(corpus_sets, table):
    params, rw = _kernel(corpus_sets, "atomics.sm_90", "histogram")
    rw = type(rw)(rw.name, rw.params, dict(rw.access), {}, ["address loaded from memory"])
    args = struct.pack("<QQiiQ", A, B, 16, 1024, C)
    uses = launch_uses(args, table, params, rw)
    assert {a.address: m for a, m in uses.modes.items()} == {A: "rw", B: "rw", C: "rw"}
    assert uses.anything


def test_a_parameter_buffer_shorter_than_the_signature_trusts_nothing(corpus_sets, table):
    params, rw = _kernel(corpus_sets, "vector_add.sm_90", "vector_add")
    uses = launch_uses(struct.pack("<QQ", A, B), table, params, rw)
    assert uses.anything and {a.address for a in uses.modes} == {A, B}


# ---- DAG ----

def _edges(dag: Dag, seq: int) -> set[tuple[int, str]]:
    return {(e.src, e.why) for e in dag.preds[seq]}


def test_buffer_dependencies_across_streams():
    d = Dag()
    d.add(1, "memcpy", writes={"x"})                 # 0  HtoD x
    d.add(2, "launch", reads={"x"}, writes={"y"})    # 1  RAW on x
    d.add(1, "launch", reads={"z"}, writes={"x"})    # 2  WAR on x (reader 1), WAW on x (0), stream 0
    d.add(3, "memset", writes={"y"})                 # 3  WAW on y (1)
    d.add(3, "launch", reads={"y", "x"})             # 4  RAW y (3), RAW x (2), stream 3
    d.add(2, "launch", writes={"x"}, after=[3])      # 5  WAR x (4), WAW x (2), stream 1, wait 3
    assert _edges(d, 0) == set()
    assert _edges(d, 1) == {(0, "raw")}
    assert _edges(d, 2) == {(0, "stream"), (1, "war"), (0, "waw")}
    assert _edges(d, 3) == {(1, "waw")}
    assert _edges(d, 4) == {(3, "stream"), (3, "raw"), (2, "raw")}
    assert _edges(d, 5) == {(1, "stream"), (3, "wait"), (4, "war"), (2, "waw")}


def test_an_everything_operation_orders_against_all_buffers():
    d = Dag()
    d.add(1, "launch", writes={"a"})                 # 0
    d.add(2, "launch", reads={"b"})                  # 1
    d.add(3, "launch", everything=True)              # 2
    d.add(4, "launch", reads={"c"})                  # 3  RAW on the everything op
    d.add(4, "launch", writes={"a"})                 # 4  WAW on 2, stream 3
    assert _edges(d, 2) == {(0, "raw"), (1, "war")}
    assert _edges(d, 3) == {(2, "raw")}
    assert _edges(d, 4) == {(3, "stream"), (2, "waw")}


def test_waiting_for_a_later_operation_is_refused():
    d = Dag()
    d.add(1, "launch")
    with pytest.raises(CowError, match="cannot wait for later operation 5"):
        d.add(1, "launch", after=[5])


@pytest.fixture
def two_streams() -> Dag:
    d = Dag()
    d.add(1, "launch", writes={"a"})                 # 0
    d.add(2, "launch", writes={"b"})                 # 1
    d.add(2, "launch", reads={"a"}, writes={"c"})    # 2  RAW on 0
    d.add(1, "launch", reads={"c"}, writes={"a"})    # 3  RAW on 2
    d.add(2, "memset", writes={"b"})                 # 4
    d.add(1, "launch", reads={"a"})                  # 5
    return d


@pytest.mark.parametrize("wanted,consistent,largest", [
    ({1: 5, 2: 4}, True, {1: 5, 2: 4}),
    ({1: 3, 2: 2}, True, {1: 3, 2: 2}),
    ({1: 3, 2: 1}, False, {1: 0, 2: 1}),     # 3 needs 2
    ({1: -1, 2: 4}, False, {1: -1, 2: 1}),   # 2 needs 0
    ({2: 2}, False, {2: 1}),
    ({}, True, {}),
])
def test_cuts(two_streams, wanted, consistent, largest):
    assert two_streams.is_consistent(wanted) == consistent
    cut = two_streams.consistent_cut(wanted)
    assert cut == largest and two_streams.is_consistent(cut)


def test_frontier_is_consistent_and_writers_since_a_cut_come_in_issue_order(two_streams):
    assert two_streams.frontier() == {1: 5, 2: 4}
    assert two_streams.is_consistent(two_streams.frontier())
    assert [op.seq for op in two_streams.writers_since({1: 0, 2: 1})] == [2, 3, 4]
    assert two_streams.writers_since(two_streams.frontier()) == []
    assert included({1: 3}, two_streams.ops[3]) and not included({1: 3}, two_streams.ops[4])


def test_forget_drops_operations_inside_a_cut_and_dependencies_still_work(two_streams):
    two_streams.forget({1: 3, 2: 2})
    assert sorted(two_streams.ops) == [4, 5]
    op = two_streams.add(2, "launch", reads={"a"}, writes={"b"})
    assert {(e.src, e.why) for e in two_streams.preds[op.seq]} == {(4, "stream"), (3, "raw"), (4, "waw")}
    assert two_streams.is_consistent({1: 5, 2: 4})
    assert Edge(3, op.seq, "raw") in two_streams.preds[op.seq]
