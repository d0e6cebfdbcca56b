"""The reference VM: its entry-point contract, clean refusals, helpers, map semantics, the probes of
tests/probes with exact results, and fuzzing (random bytecode only ever fails with EgpuError)."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from hypothesis import given, settings
from hypothesis import strategies as st

from egpu_preload.bpf import ctx as ctxmod
from egpu_preload.bpf import program as prog
from egpu_preload.bpf.asm import assemble
from egpu_preload.bpf.helpers import BPF_ANY, BPF_EXIST, BPF_NOEXIST, HELPERS, LOOP
from egpu_preload.errors import EgpuError, VmError
from egpu_preload.maps import (E2BIG, EAGAIN, EEXIST, EINVAL, ENOENT, ENOSPC, MapsState, PerfStorage, format_trace,
                               record_bytes)
from egpu_preload.vm import ThreadSim, Vm, execute, run_with_mem
from egpu_preload.vm.thread import grid_threads, launch_refusal
from egpu_preload.vm.calls import HANDLERS

M64 = (1 << 64) - 1


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v & M64)


def errno(v: int) -> int:
    return v & M64


# --- the entry point ---------------------------------------------------------------------------------

@pytest.mark.parametrize("asm, mem, r0", [
    ("r0 = r1\nexit", None, 0),                                    # r1 = 0 without mem
    ("r0 = r2\nexit", None, 0),
    ("r0 = r2\nexit", b"abc", 3),                                  # r2 = len(mem)
    ("r0 = *(u8 *)(r1 + 2)\nexit", b"abc", ord("c")),              # r1 points to the copy
    ("r0 = -1\nexit", None, M64),                                  # unsigned 64-bit result
    ("*(u64 *)(r10 - 512) = 1\nr0 = *(u64 *)(r10 - 512)\nexit", None, 1),  # the frame is 512 bytes
])
def test_execute_contract(asm: str, mem: bytes | None, r0: int) -> None:
    assert execute(assemble(asm), mem) == r0


def test_mem_is_a_copy() -> None:
    mem = bytearray(4)
    r0, after = run_with_mem(assemble("*(u32 *)(r1 + 0) = 7\nr0 = 0\nexit"), bytes(mem))
    assert after == u32(7) and mem == bytearray(4)


@pytest.mark.parametrize("asm, mem, message", [
    ("r0 = *(u64 *)(r1 + 0)\nexit", None, "0: read of 8 bytes at 0x0: null pointer (r0 = *(u64 *)(r1 + 0x0))"),
    ("r0 = *(u32 *)(r1 + 2)\nexit", b"abcd", "read of 4 bytes at"),
    ("r0 = 0\n*(u64 *)(r10 + 0) = r0\nexit", None, "1: write of 8 bytes"),
    ("r0 = *(u8 *)(r10 - 513)\nexit", None, "1 bytes below stack frame 0"),
    ("call 99\nexit", None, "0: unknown helper 99"),
    ("call kfunc 1\nexit", None, "kfunc calls are not supported"),
    ("l: goto l", None, "0: instruction budget of 1000 exhausted"),
    ("r0 = 0", None, "1: fell off the end of the program"),
    ("goto +1\nr0 = 1 ll\nexit", None, "2: jump into the middle of lddw"),
    ("goto +5\nexit", None, "0: jump to 6, outside the program"),
    ("r10 = 0\nexit", None, "0: r10 is read-only"),
    ("f: call local f\nexit", None, "call depth exceeds 8 frames"),
    ("r2 = 1\nlock *(u64 *)(r10 - 4) += r2\nexit", None, "not 8-byte aligned"),
    ("r1 = map[0] ll\nexit", None, "map[0] is not a map"),
    ("ld_pseudo r1, 1, 3\nexit", None, "lddw pseudo source 1 is resolved by the loader"),
    ("r1 = 0\ncall ringbuf_submit\nexit", None, "ringbuf_submit of 0x0, not a reserved record"),
])
def test_refusals(asm: str, mem: bytes | None, message: str) -> None:
    with pytest.raises(VmError) as e:
        execute(assemble(asm), mem, budget=1000)
    assert message in str(e.value)


def test_ctx_is_read_only() -> None:
    with pytest.raises(VmError, match="ctx is read-only"):
        Vm(assemble("*(u64 *)(r1 + 0) = 1\nexit")).run(bytes(ctxmod.SIZE))


def test_callee_frame_is_gone_after_return() -> None:
    code = assemble("call local f\nr0 = *(u64 *)(r0 + 0)\nexit\nf: r0 = r10\nr0 += -8\nexit")
    with pytest.raises(VmError, match="not a valid address"):
        execute(code)


def test_every_helper_has_a_handler() -> None:
    assert set(HANDLERS) == set(HELPERS) - {LOOP}   # bpf_loop calls code: machine.py runs it


# bpf_loop(r1 rounds, cb, &sum, r4 flags); r0 = the rounds made << 32 | the sum of the indices the callback saw,
# the callback stopping at index STOP (returning 1 there)
LOOP_SUM = """
    *(u64 *)(r10 - 8) = 0
    r1 = {rounds} ll
    r2 = func cb ll
    r3 = r10
    r3 += -8
    r4 = {flags}
    call loop
    r0 <<= 32
    r1 = *(u64 *)(r10 - 8)
    r0 |= r1
    exit
cb: r3 = *(u64 *)(r2 + 0)
    r3 += r1
    *(u64 *)(r2 + 0) = r3
    r0 = 0
    if r1 < {stop} goto +1
    r0 = 1
    exit
"""


@pytest.mark.parametrize("compiled", [False, True], ids=["interpreted", "compiled"])
@pytest.mark.parametrize("rounds, flags, stop, made, total", [
    (10, 0, 100, 10, 45),                 # every round: indices 0..9
    (10, 0, 4, 5, 10),                    # the callback returns 1 at index 4: five rounds made
    (0, 0, 100, 0, 0),
    ((1 << 32) + 3, 0, 100, 3, 3),        # nr_loops is a u32
    (1 << 23, 0, 1, 2, 1),                # the most rounds Linux takes
    ((1 << 23) + 1, 0, 1, -E2BIG, 0),     # more: no call
    (10, 1, 100, -EINVAL, 0),             # flags other than 0: no call
])
def test_bpf_loop(rounds: int, flags: int, stop: int, made: int, total: int, compiled: bool) -> None:
    code = assemble(LOOP_SUM.format(rounds=rounds, flags=flags, stop=stop))
    assert Vm(code, compiled=compiled).run(b"") == (made << 32 | total) & M64


def test_bpf_loop_calls_only_a_function() -> None:
    with pytest.raises(VmError, match=r"bpf_loop's r2 is no function's address \(0x0\)"):
        execute(assemble("r1 = 1\nr2 = 0\nr3 = 0\nr4 = 0\ncall loop\nexit"))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(min_size=8, max_size=8), min_size=1, max_size=24), st.binary(max_size=64))
def test_random_bytecode_fails_cleanly(slots: list[bytes], mem: bytes) -> None:
    try:
        execute(b"".join(slots), mem, budget=10_000)
    except EgpuError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([b"\x07", b"\x0f", b"\x04", b"\xb7", b"\xbf", b"\x61", b"\x63", b"\x7b", b"\x79",
                                 b"\x15", b"\x05", b"\x85", b"\x95", b"\xdb", b"\xc3", b"\x18", b"\x3f", b"\x9f",
                                 b"\x87", b"\xd4", b"\x06"]).flatmap(
    lambda op: st.binary(min_size=7, max_size=7).map(lambda rest: op + rest)), min_size=1, max_size=24))
def test_plausible_bytecode_fails_cleanly(slots: list[bytes]) -> None:
    """Opcode bytes that decode, with random operands: reaches the executor far more often."""
    try:
        execute(b"".join(slots), bytes(16), budget=10_000)
    except EgpuError:
        pass


# --- maps, host side ---------------------------------------------------------------------------------

def _state(*maps: prog.MapDef) -> MapsState:
    return MapsState(list(maps))


HASH = prog.MapDef("h", prog.MAP_HASH, 4, 8, 2)
ARRAY = prog.MapDef("a", prog.MAP_ARRAY, 4, 8, 2)


@pytest.mark.parametrize("mapdef, ops", [
    # (operation, key, flags, expected result) in order on one fresh map
    (HASH, [("update", 1, BPF_EXIST, -ENOENT), ("update", 1, BPF_NOEXIST, 0), ("update", 1, BPF_NOEXIST, -EEXIST),
            ("update", 1, BPF_EXIST, 0), ("update", 2, BPF_ANY, 0), ("update", 3, BPF_ANY, -E2BIG),
            ("update", 3, BPF_NOEXIST, -E2BIG), ("update", 3, BPF_EXIST, -ENOENT), ("update", 2, BPF_ANY, 0),
            ("update", 1, 4, -EINVAL), ("delete", 3, 0, -ENOENT), ("delete", 1, 0, 0), ("delete", 1, 0, -ENOENT),
            ("update", 3, BPF_ANY, 0)]),
    (ARRAY, [("update", 0, BPF_ANY, 0), ("update", 1, BPF_EXIST, 0), ("update", 1, BPF_NOEXIST, -EEXIST),
             ("update", 2, BPF_ANY, -E2BIG), ("update", 0, 3, -EINVAL), ("delete", 0, 0, -EINVAL)]),
])
def test_update_flags(mapdef: prog.MapDef, ops: list[tuple[str, int, int, int]]) -> None:
    storage = _state(mapdef)[0]
    for n, (op, key, flags, expected) in enumerate(ops):
        got = storage.update(u32(key), u64(key), flags) if op == "update" else storage.delete(u32(key))
        assert got == expected, f"step {n}: {op}({key}, {flags})"


def test_array_lookup_and_initial() -> None:
    storage = _state(prog.MapDef("g.data", prog.MAP_ARRAY, 4, 8, 1, initial=u64(3)))[0]
    assert storage.lookup(u32(0)) == u64(3)
    assert storage.lookup(u32(1)) is None
    assert list(storage.items()) == [(u32(0), u64(3))]


def test_lru_evicts_least_recently_used() -> None:
    storage = _state(prog.MapDef("l", prog.MAP_LRU_HASH, 4, 8, 3))[0]
    for k in (1, 2, 3):
        assert storage.update(u32(k), u64(k)) == 0
    assert storage.lookup(u32(1)) is not None      # 1 is now the most recent: 2 is the oldest
    assert storage.update(u32(4), u64(4)) == 0     # evicts 2
    assert storage.update(u32(3), u64(30), BPF_EXIST) == 0  # touches 3: 1 is the oldest
    assert storage.update(u32(5), u64(5), BPF_NOEXIST) == 0  # evicts 1
    assert [k for k, _ in storage.items()] == [u32(4), u32(3), u32(5)]
    assert storage.update(u32(4), u64(4), BPF_NOEXIST) == -EEXIST


@pytest.mark.parametrize("mtype, order", [(prog.MAP_QUEUE, [2, 3, 4]), (prog.MAP_STACK, [4, 3, 2])])
def test_queue_and_stack_semantics(mtype: int, order: list[int]) -> None:
    """queue_stack_maps.c: full -E2BIG unless BPF_EXIST (then the oldest goes), NOEXIST -EINVAL, empty
    -ENOENT with zeros; a queue pops its oldest, a stack its newest."""
    storage = _state(prog.MapDef("q", mtype, 0, 8, 3))[0]
    assert storage.take(False) == (-ENOENT, u64(0))
    assert [storage.push(u64(v), BPF_ANY) for v in (1, 2, 3)] == [0, 0, 0]
    assert storage.push(u64(9), BPF_ANY) == -E2BIG
    assert storage.push(u64(9), BPF_NOEXIST) == -EINVAL
    assert storage.push(u64(4), BPF_EXIST) == 0            # drops 1, the oldest, for a stack too
    assert storage.take(False) == (0, u64(order[0]))      # peek leaves it
    assert [storage.take(True) for _ in range(4)] == [(0, u64(v)) for v in order] + [(-ENOENT, u64(0))]


def test_bloom_filter_never_forgets_and_takes_any_only() -> None:
    storage = _state(prog.MapDef("b", prog.MAP_BLOOM_FILTER, 0, 8, 100, map_extra=3))[0]
    assert storage.mapdef.hashes == 3 and storage.mapdef.bloom_bits == 512   # 100 * 3 / 5 * 7 = 420, rounded up
    assert storage.test(u64(1)) == -ENOENT
    assert all(storage.push(u64(v), BPF_ANY) == 0 for v in range(0, 200, 2))
    assert all(storage.test(u64(v)) == 0 for v in range(0, 200, 2))
    assert sum(storage.test(u64(v)) == 0 for v in range(1, 200, 2)) < 50   # a filter, not every value
    assert storage.push(u64(1), BPF_EXIST) == -EINVAL and list(storage.items()) == []


def test_percpu_array_has_a_slot_per_sm() -> None:
    storage = _state(prog.MapDef("p", prog.MAP_PERCPU_ARRAY, 4, 8, 1))[0]
    assert storage.update(u32(0), u64(5), cpu=3) == 0
    assert storage.lookup(u32(0), cpu=3) == u64(5) and storage.lookup(u32(0), cpu=0) == u64(0)
    assert storage.cpus() == [0, 3]


@pytest.mark.parametrize("mtype", [prog.MAP_PERCPU_HASH, prog.MAP_LRU_PERCPU_HASH])
def test_percpu_hash_has_a_value_per_sm_and_one_key(mtype: int) -> None:
    """hashtab.c's per-CPU form as a program sees it: an update writes the caller's SM's value (a new key's
    others are zero), NOEXIST and EXIST look at the key, whichever SM made it; a delete takes the key from
    every SM; the key counts once against max_entries."""
    storage = _state(prog.MapDef("p", mtype, 4, 8, 2))[0]
    assert storage.update(u32(1), u64(5), cpu=3) == 0
    assert storage.lookup(u32(1), cpu=3) == u64(5) and storage.lookup(u32(1), cpu=0) == u64(0)
    assert storage.update(u32(1), u64(7), BPF_NOEXIST, cpu=0) == -EEXIST
    assert storage.update(u32(1), u64(7), BPF_EXIST, cpu=0) == 0
    assert [storage.lookup(u32(1), cpu=c) for c in (0, 3)] == [u64(7), u64(5)]
    assert storage.update(u32(2), u64(1), BPF_EXIST, cpu=3) == -ENOENT
    assert storage.update(u32(2), u64(1), cpu=3) == 0
    if mtype == prog.MAP_PERCPU_HASH:
        assert storage.update(u32(3), u64(1), cpu=0) == -E2BIG   # full: each key counts once, not per SM
    assert storage.delete(u32(1)) == 0 and storage.lookup(u32(1), cpu=3) is None
    assert storage.update(u32(1), u64(9), cpu=0) == 0          # back: SM 3's old value is gone
    assert storage.lookup(u32(1), cpu=3) == u64(0)
    assert list(storage.items(0)) == [(u32(2), u64(0)), (u32(1), u64(9))]   # SM 0 reads zeros for SM 3's key


def test_lru_percpu_hash_evicts_the_key_least_recently_used_on_any_sm() -> None:
    storage = _state(prog.MapDef("l", prog.MAP_LRU_PERCPU_HASH, 4, 8, 2))[0]
    assert storage.update(u32(1), u64(1), cpu=0) == 0 and storage.update(u32(2), u64(2), cpu=1) == 0
    assert storage.lookup(u32(1), cpu=5) is not None       # a use on SM 5: 2 is the oldest
    assert storage.update(u32(3), u64(3), cpu=2) == 0      # evicts 2, from every SM
    assert [k for k, _ in storage.items()] == [u32(1), u32(3)] and storage.cpus() == [0, 2, 5]


def test_ringbuf_accounting_and_drops() -> None:
    rb = _state(prog.MapDef("rb", prog.MAP_RINGBUF, 0, 0, 64))[0]
    assert record_bytes(20) == 32
    assert rb.output(b"x" * 20) == 0                 # 32 bytes
    held = rb.reserve(20)                            # 64: full
    assert held is not None and rb.reserve(1) is None and rb.drops == 1
    assert rb.output(b"y") == -EAGAIN and rb.drops == 2
    rb.release(held, submit=False)                   # discard frees its space
    assert rb.output(b"z" * 24) == 0
    assert rb.consume() == [b"x" * 20, b"z" * 24] and rb.used == 0


def test_perf_buffer_drops_when_full() -> None:
    perf = PerfStorage(prog.MapDef("e", prog.MAP_PERF_EVENT_ARRAY, 4, 4, 0), capacity=32)
    assert perf.output(1, b"a" * 8) == 0 and perf.output(2, b"b" * 8) == 0
    assert perf.output(1, b"c") == -ENOSPC and perf.drops == 1
    assert perf.consume() == [(1, b"a" * 8), (2, b"b" * 8)]


@pytest.mark.parametrize("fmt, args, text", [
    (b"x=%d\n\0", (M64,), "x=-1\n"),
    (b"%u %lu\0", (M64, M64), f"{2**32 - 1} {M64}"),
    (b"%llx|%5d|%-3u|%c%%\0", (255, 42, 7, 65), "ff|   42|7  |A%"),
    (b"%hhd %hu\0", (0x1FF, 0x1FFFF), "-1 65535"),
    (b"%p\0", (0x1000,), "0x1000"),
    (b"%px|%pK|%pKx\0", (0x10, 0x20, 0x30), "0x10|0x20|0x30x"),   # Linux's raw and kptr forms print as %p
    (b"missing %d\0", (), "missing 0"),
    (b"stops\0here %d", (1,), "stops"),
])
def test_format_trace(fmt: bytes, args: tuple[int, ...], text: str) -> None:
    assert format_trace(fmt, args) == text


def test_unknown_map_type_is_refused() -> None:
    with pytest.raises(EgpuError, match="unsupported map type 99"):
        _state(prog.MapDef("x", 99, 4, 4, 1))


# --- helpers through the VM --------------------------------------------------------------------------

def _run(asm: str, *maps: prog.MapDef, thread: ThreadSim | None = None) -> tuple[int, MapsState]:
    vm = Vm(assemble(asm), list(maps))
    return vm.run(b"", thread), vm.state


KEY_1 = "*(u32 *)(r10 - 4) = 1\nr2 = r10\nr2 += -4\n"
VALUE_9 = "*(u64 *)(r10 - 16) = 9\nr3 = r10\nr3 += -16\n"


@pytest.mark.parametrize("asm, r0", [
    # update then lookup reads the value through the returned pointer
    ("r1 = map[0] ll\n" + KEY_1 + VALUE_9 + "r4 = 0\ncall map_update_elem\n"
     "r1 = map[0] ll\n" + KEY_1 + "call map_lookup_elem\nif r0 == 0 goto out\nr0 = *(u64 *)(r0 + 0)\nout: exit", 9),
    # a missing key gives NULL
    ("r1 = map[0] ll\n" + KEY_1 + "call map_lookup_elem\nexit", 0),
    # NOEXIST on a present key
    ("r1 = map[0] ll\n" + KEY_1 + VALUE_9 + "r4 = 0\ncall map_update_elem\n"
     "r1 = map[0] ll\n" + KEY_1 + VALUE_9 + "r4 = 1\ncall map_update_elem\nexit", errno(-EEXIST)),
    # delete of a missing key
    ("r1 = map[0] ll\n" + KEY_1 + "call map_delete_elem\nexit", errno(-ENOENT)),
    # writes through the lookup pointer are the map's value
    ("r1 = map[1] ll\n" + KEY_1 + "call map_lookup_elem\nr1 = 5\nlock *(u64 *)(r0 + 0) += r1\n"
     "r1 = map[1] ll\n" + KEY_1 + "call map_lookup_elem\nr0 = *(u64 *)(r0 + 0)\nexit", 5),
    # the value pointer is bounded by value_size
    ("r1 = map[1] ll\n" + KEY_1 + "call map_lookup_elem\nr0 = *(u64 *)(r0 + 8)\nexit", None),
])
def test_map_helpers(asm: str, r0: int | None) -> None:
    if r0 is None:
        with pytest.raises(VmError, match="outside map a value"):
            _run(asm, HASH, ARRAY)
    else:
        assert _run(asm, HASH, ARRAY)[0] == r0


def test_ringbuf_helpers() -> None:
    rb = prog.MapDef("rb", prog.MAP_RINGBUF, 0, 0, 48)
    asm = """
        r1 = map[0] ll
        r2 = 8
        r3 = 0
        call ringbuf_reserve
        if r0 == 0 goto out
        *(u64 *)(r0 + 0) = 7
        r1 = r0
        r2 = 0
        call ringbuf_submit
        r1 = map[0] ll
        r2 = 16
        r3 = 0
        call ringbuf_reserve
        if r0 == 0 goto out
        r1 = r0
        r2 = 0
        call ringbuf_discard
        *(u64 *)(r10 - 8) = 5
        r1 = map[0] ll
        r2 = r10
        r2 += -8
        r3 = 8
        r4 = 0
        call ringbuf_output
        r6 = r0
        r1 = map[0] ll
        r2 = 40
        r3 = 0
        call ringbuf_reserve
        r0 += r6
    out:
        exit
    """
    r0, state = _run(asm, rb)
    assert r0 == 0   # output fitted (0) and the 40-byte reserve after it did not (NULL)
    assert state[0].records == [u64(7), u64(5)] and state[0].drops == 1


def test_a_record_structs_padding_goes_out_as_the_stack_held_it() -> None:
    """A record struct (u32 then u64) whose padding was never written loads, as Linux's privileged programs do,
    and its fields come out where they were written: the padding's bytes are the stack's (the VM's frame starts
    zeroed; a GPU thread's holds what its local memory held)."""
    rb = prog.MapDef("rb", prog.MAP_RINGBUF, 0, 0, 64)
    r0, state = _run("*(u32 *)(r10 - 16) = 7\n*(u64 *)(r10 - 8) = 9\nr2 = r10\nr2 += -16\nr1 = map[0] ll\n"
                     "r3 = 16\nr4 = 0\ncall ringbuf_output\nexit", rb)
    assert r0 == 0 and [(r[:4], r[8:]) for r in state[0].records] == [(b"\7\0\0\0", u64(9))]


def test_a_value_stored_with_its_padding_unwritten_keeps_its_fields() -> None:
    """map_update_elem of a value (u32, then u64 at 8) whose padding was never written loads, as Linux's
    privileged programs do, and the lookup after reads each field as written."""
    arr = prog.MapDef("arr", prog.MAP_ARRAY, 4, 16, 2)
    r0, _ = _run("*(u32 *)(r10 - 20) = 1\n*(u32 *)(r10 - 16) = 7\n*(u64 *)(r10 - 8) = 9\nr1 = map[0] ll\n"
                 "r2 = r10\nr2 += -20\nr3 = r10\nr3 += -16\nr4 = 0\ncall map_update_elem\n"
                 "r1 = map[0] ll\nr2 = r10\nr2 += -20\ncall map_lookup_elem\nif r0 == 0 goto out\n"
                 "r1 = *(u32 *)(r0 + 0)\nr0 = *(u64 *)(r0 + 8)\nr0 *= 100\nr0 += r1\nout: exit", arr)
    assert r0 == 907


def test_unsubmitted_reservation_is_refused() -> None:
    rb = prog.MapDef("rb", prog.MAP_RINGBUF, 0, 0, 64)
    with pytest.raises(VmError, match="unsubmitted ringbuf"):
        _run("r1 = map[0] ll\nr2 = 8\nr3 = 0\ncall ringbuf_reserve\nr0 = 0\nexit", rb)


def test_reserved_record_is_bounded() -> None:
    rb = prog.MapDef("rb", prog.MAP_RINGBUF, 0, 0, 64)
    with pytest.raises(VmError, match="outside ringbuf rb record"):
        _run("r1 = map[0] ll\nr2 = 4\nr3 = 0\ncall ringbuf_reserve\n*(u64 *)(r0 + 0) = 1\nexit", rb)


def test_gpu_helpers_and_timer() -> None:
    asm = """
        r1 = r10
        r1 += -24
        r2 = r10
        r2 += -16
        r3 = r10
        r3 += -8
        call get_thread_idx
        r6 = *(u64 *)(r10 - 24)
        r6 *= 10
        r0 = *(u64 *)(r10 - 16)
        r6 += r0
        r6 *= 10
        r0 = *(u64 *)(r10 - 8)
        r6 += r0
        call get_globaltimer
        r7 = r0
        call ktime_get_ns
        r0 -= r7
        r6 *= 100
        r6 += r0
        call get_sm_id
        r6 *= 10
        r6 += r0
        call get_lane_id
        r6 *= 10
        r6 += r0
        call get_warp_id
        r6 *= 10
        r6 += r0
        r0 = r6
        exit
    """
    thread = ThreadSim(thread_idx=(1, 2, 3), smid=4, warp=6, lane=5, globaltimer=1000, tick=7)
    assert _run(asm, thread=thread)[0] == 1230_7_4_5_6
    assert thread.globaltimer == 1014


def test_a_grid_runs_every_thread_once() -> None:
    """grid_threads (egpu run-on-gpu --vm): block by block, x fastest in each, every global index once; each
    thread's own indices (what helpers 503-505 and 508 return); warp and lane from its linear index in its
    block, as egpu_warp_id computes them on the GPU."""
    threads = list(grid_threads((2, 3, 1), (40, 1, 2)))
    assert sorted(t.global_index for t in threads) == list(range(2 * 3 * 40 * 2))
    assert [t.thread_idx for t in threads[:3]] + [t.block_idx for t in threads[79:81]] == [
        (0, 0, 0), (1, 0, 0), (2, 0, 0), (0, 0, 0), (1, 0, 0)]
    t = threads[-1]
    assert (t.block_idx, t.thread_idx, t.block_dim, t.grid_dim, t.warp, t.lane) == (
        (1, 2, 0), (39, 0, 1), (40, 1, 2), (2, 3, 1), 2, 15)


@pytest.mark.parametrize("grid, block, reason", [
    ((1, 1, 1), (1024, 1, 1), None),
    ((2**31 - 1, 1, 1), (2, 1, 1), None),
    ((0, 1, 1), (1, 1, 1), "grid x is 0: CUDA takes 1 to 2147483647"),
    ((1, 65536, 1), (1, 1, 1), "grid y is 65536: CUDA takes 1 to 65535"),
    ((1, 1, 1), (1, 1, 65), "block z is 65: CUDA takes 1 to 64"),
    ((1, 1, 1), (32, 32, 2), "a block of 32x32x2 threads: CUDA takes at most 1024"),
    ((2**31 - 1, 1, 1), (4, 1, 1), "8589934588 threads: egpu's runner numbers at most 4294967295"),
])
def test_launch_refusal_is_cudas(grid, block, reason) -> None:
    assert launch_refusal(grid, block) == reason


def test_trace_printk_and_perf_output() -> None:
    perf = prog.MapDef("events", prog.MAP_PERF_EVENT_ARRAY, 4, 4, 0)
    asm = """
        *(u64 *)(r10 - 8) = 0x0a6425
        r6 = r1
        r1 = r10
        r1 += -8
        r2 = 4
        r3 = 42
        call trace_printk
        *(u64 *)(r10 - 16) = 77
        r1 = r6
        r2 = map[0] ll
        r3 = 0xffffffff ll
        r4 = r10
        r4 += -16
        r5 = 8
        call perf_event_output
        exit
    """
    r0, state = _run(asm, perf, thread=ThreadSim(smid=2))
    assert r0 == 0
    assert [t.text() for t in state.trace] == ["42\n"] and state.trace[0].cpu == 2
    assert state[0].records == [(2, u64(77))]


def test_exit_helper_ends_the_probe() -> None:
    r0, state = _run("r0 = 3\ncall 507\nr0 = 9\nexit")
    assert r0 == 0


# Loops without end in a directly-run program: the verifier budgets their backward jump (pc 11, a goto; pc 2,
# a conditional jump); each round of the first adds one to the array's value.
FOREVER = {"goto": """
        *(u32 *)(r10 - 4) = 0
        r2 = r10
        r2 += -4
        r1 = map[0] ll
        call 1
        if r0 == 0 goto out
        r6 = r0
        r7 = 1
        r0 = 5
    loop:
        lock *(u64 *)(r6 + 0) += r7
        goto loop
    out:
        exit""", "conditional": "r0 = 0\nloop:\nr0 += 1\nif r0 != 0 goto loop\nexit"}


@pytest.mark.parametrize("compiled", [False, True], ids=["interpreted", "compiled"])
@pytest.mark.parametrize("jump", FOREVER)
def test_a_budgeted_loop_ends_at_the_budget_as_exit_ends_the_probe(jump: str, compiled: bool) -> None:
    """LOOP_BUDGET rounds go back, the next ends the run with r0 = 0 (helper 507's end), and the cut is
    counted; a jump the verifier did not budget is not charged."""
    from egpu_preload.bpf.sections import DIRECTLY_RUN
    from egpu_preload.bpf.verifier import LOOP_BUDGET, verify
    code, state = assemble(FOREVER[jump]), _state(ARRAY)
    budgeted = verify(code, [ARRAY], section=DIRECTLY_RUN).budgeted
    assert budgeted == {11 if jump == "goto" else 2}
    assert Vm(code, [ARRAY], state, compiled=compiled, budgeted=budgeted).run(bytes(64)) == 0
    assert state.loops_cut == 1
    if jump == "goto":
        assert state[0].lookup(u32(0), 0) == u64(LOOP_BUDGET + 1)
    with pytest.raises(VmError, match="instruction budget"):
        Vm(code, [ARRAY], budget=1000, compiled=compiled).run(bytes(64))


def test_readonly_global_data() -> None:
    ro = prog.MapDef("x.rodata", prog.MAP_ARRAY, 4, 8, 1, initial=u64(11), readonly=True)
    assert _run("r1 = map_value[0] + 4 ll\nr0 = *(u32 *)(r1 - 4)\nexit", ro)[0] == 11
    with pytest.raises(VmError, match="read-only"):
        _run("r1 = map_value[0] ll\n*(u64 *)(r1 + 0) = 1\nexit", ro)


# --- the probes of tests/probes, loaded and run with exact results ----------------------------------

def make_ctx(layout: ctxmod.Layout = ctxmod.EGPU_CTX, **values: int | tuple[int, ...]) -> bytes:
    """struct egpu_ctx bytes (or another ``layout``'s: ctx.HOST, ctx.UVM_CTX) with the named fields set."""
    buf = bytearray(layout.size)
    by_name = {f.name: f for f in layout.fields}
    for name, value in values.items():
        f = by_name[name]
        items = value if isinstance(value, tuple) else (value,)
        for n, v in enumerate(items):
            buf[f.offset + n * f.size:f.offset + (n + 1) * f.size] = (v & ((1 << 8 * f.size) - 1)).to_bytes(
                f.size, "little")
    return bytes(buf)


class Probe:
    """A loaded object: one MapsState shared by its programs, as in a real session."""

    def __init__(self, probe_obj, name: str, mcpu: str) -> None:
        from egpu_preload.bpf.elf import load_object
        self.obj = load_object(probe_obj(name, mcpu))
        self.state = MapsState(self.obj.maps)
        self.vms = {p.name: Vm(p.code, self.obj.maps, self.state) for p in self.obj.programs}

    def run(self, program: str, thread: ThreadSim | None = None, **ctx: int | tuple[int, ...]) -> int:
        return self.vms[program].run(make_ctx(**ctx), thread)

    def values(self, map_name: str, cpu: int = 0) -> dict[int, int]:
        """A map's entries as ints (little-endian keys and u64 values)."""
        return {int.from_bytes(k, "little"): int.from_bytes(v, "little")
                for k, v in self.state.by_name(map_name).items(cpu)}


MCPUS = pytest.mark.parametrize("mcpu", ["v3", "v4"])


@MCPUS
def test_probe_count(probe_obj, mcpu: str) -> None:
    p = Probe(probe_obj, "count", mcpu)
    assert [p.run("count_entries") for _ in range(5)] == [0] * 5
    assert p.values("counts") == {0: 5}


@MCPUS
def test_probe_hash_count(probe_obj, mcpu: str) -> None:
    p = Probe(probe_obj, "hash_count", mcpu)
    for kid in (7, 7, 9, 7, 1 << 63):
        assert p.run("count_per_kernel", kernel_id=kid) == 0
    assert p.values("per_kernel") == {7: 3, 9: 1, 1 << 63: 1}


@MCPUS
def test_probe_percpu_hash_from_two_sms(probe_obj, mcpu: str) -> None:
    """tests/probes/percpu_hash.bpf.c on SMs 0 and 3: each SM counts in its own value, the text and --json
    output sum them (per_sm beside), the key each run wrote and deleted is gone, and the clocks hold."""
    from egpu_preload.output import json as jsonout, text, values
    p = Probe(probe_obj, "percpu_hash", mcpu)
    for sm in (0, 3, 3):
        assert p.run("count_calls", ThreadSim(smid=sm), kernel_id=7, site=2, launch_id=4) == 0
    calls = p.state.by_name("calls")
    assert list(calls.entries) == [u64(7)] and {c: bytes(v) for c, v in calls.entries[u64(7)].items()} == \
        {0: u64(1), 3: u64(2)}
    snap = values.snapshot(p.state, p.obj)
    out = text.render(snap)
    assert "@calls[7]: 3\n" in out and "@sites[3]: { launch: 8, times: 4 }\n" in out   # 2 on SM 0, 2 on SM 3
    assert "{ boot_not_before: 1, coarse_within_tick: 1, numa_node: 0 }" in out
    doc = jsonout.document(snap, time=0.0, pid=None)
    assert doc["maps"]["calls"]["entries"] == [{"key": 7, "value": 3, "per_sm": {"0": 1, "3": 2}}]


@MCPUS
def test_probe_histogram(probe_obj, mcpu: str) -> None:
    p = Probe(probe_obj, "histogram", mcpu)
    for grid, block in (((1, 1, 1), (1, 1, 1)), ((2, 1, 1), (1, 1, 1)), ((4, 2, 1), (32, 1, 1)),
                        ((4, 2, 1), (33, 1, 1)), ((65535, 65535, 65535), (1024, 1, 1))):
        p.run("launch_threads", grid=grid, block=block)
    threads = 65535 ** 3 * 1024
    expected = {0: 1, 1: 1, 8: 2, threads.bit_length() - 1: 1}
    assert {k: v for k, v in p.values("hist").items() if v} == expected


@MCPUS
def test_probe_launch(probe_obj, mcpu: str) -> None:
    p = Probe(probe_obj, "launch", mcpu)
    p.run("on_launch", kernel_id=5, grid=(2, 3, 4), block=(8, 1, 1), stream=0xABC)
    p.run("on_launch", kernel_id=5, grid=(1, 1, 1), block=(32, 2, 1), stream=0xDEF)
    (key, value), = p.state.by_name("launches").items()
    launches, threads, stream, *dims = struct.unpack("<QQQ6I", value[:48])
    assert (int.from_bytes(key, "little"), launches, threads, stream, dims) == (
        5, 2, 24 * 8 + 64, 0xDEF, [1, 1, 1, 32, 2, 1])


def _xorshift_slot(kernel_id: int, launch_id: int) -> int:
    h = kernel_id ^ launch_id
    for _ in range(10):
        h ^= (h << 13) & M64
        h ^= h >> 7
        h ^= (h << 17) & M64
    return h % 16


@MCPUS
def test_probe_loop(probe_obj, mcpu: str) -> None:
    p = Probe(probe_obj, "loop", mcpu)
    expected: dict[int, int] = {}
    for kid, lid in ((1, 0), (0xDEADBEEF, 3), (M64, 12345), (1, 0)):
        slot = _xorshift_slot(kid, lid)
        expected[slot] = expected.get(slot, 0) + 1
        assert p.run("hash_slots", kernel_id=kid, launch_id=lid) == slot
    assert {k: v for k, v in p.values("slots").items() if v} == expected


@MCPUS
def test_probe_memtrace(probe_obj, mcpu: str) -> None:
    p = Probe(probe_obj, "memtrace", mcpu)
    load, store, atomic = ctxmod.FLAG_LOAD, ctxmod.FLAG_STORE, ctxmod.FLAG_ATOMIC
    for addr, size, flags in ((0x1000, 4, load), (0x1ffc, 8, store), (0x2000, 16, load), (0x1008, 4, store)):
        assert p.run("trace_mem", addr=addr, size=size, flags=flags) == 0
    assert p.values("bytes") == {0: 20, 1: 12}
    assert p.values("pages") == {1: 3, 2: 1}
    assert p.run("warp_stores", flags=store | atomic) == 0 and p.values("bytes") == {0: 20, 1: 12}


@MCPUS
def test_probe_ringbuf(probe_obj, mcpu: str) -> None:
    p = Probe(probe_obj, "ringbuf", mcpu)
    p.run("block_enter", ThreadSim(smid=3, globaltimer=1000), kernel_id=1, launch_id=2, kind=ctxmod.KIND_ENTRY)
    p.run("block_enter", ThreadSim(smid=3, globaltimer=0), kernel_id=1, launch_id=2)  # ts == 0: discarded
    p.run("block_exit", ThreadSim(smid=4, globaltimer=2000), kernel_id=1, launch_id=2, kind=ctxmod.KIND_EXIT)
    rb = p.state.by_name("events")
    assert [struct.unpack("<QQQII", r) for r in rb.consume()] == [(1, 2, 1000, 3, ctxmod.KIND_ENTRY),
                                                                  (1, 2, 2000, 4, ctxmod.KIND_EXIT)]
    assert rb.used == 0 and rb.drops == 0


@MCPUS
def test_probe_record_atomics(probe_obj, mcpu: str) -> None:
    p = Probe(probe_obj, "record_atomics", mcpu)
    for size in (4, 0xFFFFFFFF):
        assert p.run("record_atomics", size=size) == 0
    # sum: 1 + size, then 2 more; bits: 0xf0 & 0x3c ^ 1; swapped: xchg'd 7, then cmpxchg'd to the low
    # half of sum before the 2 (+ 0, what xchg found)
    assert [struct.unpack("<QII", r) for r in p.state.by_name("tallies").consume()] == \
        [(size + 3, 0x31, (size + 1) & 0xFFFFFFFF) for size in (4, 0xFFFFFFFF)]


@MCPUS
def test_probe_subprog(probe_obj, mcpu: str) -> None:
    p = Probe(probe_obj, "subprog", mcpu)
    assert [p.run("loads", size=s) for s in (1, 4, 8, 16)] == [0, 1, 2, 3]
    assert [p.run("stores", size=s) for s in (2, 16)] == [2, 6]
    assert p.values("classes") == {0: 1, 1: 2, 2: 1, 3: 2}


@MCPUS
def test_probe_globals(probe_obj, mcpu: str) -> None:
    p = Probe(probe_obj, "globals", mcpu)
    results = [p.run("weigh_accesses", size=s, site=i) for i, s in enumerate((1, 4, 8, 16, 2, 4))]
    assert results == [0, ord("g"), ord("p"), ord("u"), 0, 0]  # tag = "egpu" then NULs
    bss = p.state.by_name(next(m.name for m in p.obj.maps if m.name.endswith(".bss")))
    assert struct.unpack("<QQ", bss.lookup(u32(0))) == (4, 3 * (4 + 8 + 16 + 4))
    assert [t.text() for t in p.state.trace] == ["wide 16\n"]


@MCPUS
def test_probe_gpu_helpers(probe_obj, mcpu: str) -> None:
    p = Probe(probe_obj, "gpu_helpers", mcpu)
    leader = ThreadSim(thread_idx=(32, 1, 0), block_idx=(5, 6, 7), block_dim=(64, 2, 1), grid_dim=(8, 8, 8),
                       smid=9, warp=3, lane=0, globaltimer=123)
    assert p.run("where_am_i", leader) == 0
    assert p.run("where_am_i", ThreadSim(smid=9, lane=1)) == 0  # bpf_exit(): no event, no count
    events = p.state.by_name("events").records
    assert events == [(9, struct.pack("<16Q", 5, 6, 7, 32, 1, 0, 64, 2, 1, 8, 8, 8, 123, 9, 3, 0))]
    assert p.values("per_sm", cpu=9) == {0: 1} and p.values("per_sm", cpu=0) == {0: 0}


@MCPUS
def test_probe_process(probe_obj, mcpu: str) -> None:
    """pid_tgid, uid_gid and comm as a kernel-site probe reads them (the GPU from the trace ring's header, where
    test_translate_gpu's every-probe run compares it with this): the process, its real ids and its main
    thread's name, cut to the buffer with a NUL, as Linux's strscpy_pad."""
    p = Probe(probe_obj, "process", mcpu)
    assert p.run("who") == 0
    name = Path("/proc/self/comm").read_bytes().rstrip(b"\n")[:15]
    value = p.state.by_name("seen").lookup(u32(0))
    assert value == struct.pack("<QQ", os.getpid() << 32 | os.getpid(), os.getgid() << 32 | os.getuid()) + \
        name.ljust(16, b"\0") + name[:3].ljust(4, b"\0") + bytes(4)


@MCPUS
def test_probe_libbpf_style(probe_obj, mcpu: str) -> None:
    p = Probe(probe_obj, "libbpf_style", mcpu)
    for x in (0, 1, 2, 3, 0):
        assert p.run("cuda__vector_add", ThreadSim(block_idx=(x, 0, 0), globaltimer=100 + x)) == 0
    assert p.values("legacy_counts") == {0: 3, 1: 2}
    assert p.values("last_seen") == {0: 100, 1: 101, 2: 102, 3: 103}
    assert [t.text() for t in p.state.trace] == ["block 0 at 100", "block 0 at 100"]


# --- differential: the VM on clang's BPF code against the same C compiled natively by gcc ------------
# Each function reads a = m[0], b = m[1]; inputs with undefined behaviour in C are filtered out.
ARITH_C = r"""
typedef unsigned long long u64; typedef long long s64; typedef unsigned u32; typedef int s32;
#define F(name, expr) u64 name(u64 *m) { u64 a = m[0], b = m[1]; return (expr); }
F(udiv64, a / b) F(umod64, a % b) F(sdiv64, (s64)a / (s64)b) F(smod64, (s64)a % (s64)b)
F(udiv32, (u32)a / (u32)b) F(umod32, (u32)a % (u32)b) F(sdiv32, (u64)(u32)((s32)a / (s32)b))
F(smod32, (u64)(u32)((s32)a % (s32)b)) F(mul32, (u32)a * (u32)b) F(mul64, a * b) F(sub32, (u32)a - (u32)b)
F(shl64, a << (b & 63)) F(lshr64, a >> (b & 63)) F(ashr64, (u64)((s64)a >> (b & 63)))
F(shl32, (u32)a << (b & 31)) F(lshr32, (u32)a >> (b & 31)) F(ashr32, (u64)(u32)((s32)a >> (b & 31)))
F(sext8, (u64)(s64)(signed char)a) F(sext16, (u64)(s64)(short)a) F(sext32, (u64)(s64)(s32)a)
F(sext8_32, (u64)(u32)(s32)(signed char)a) F(bswap16, __builtin_bswap16(a)) F(bswap32, __builtin_bswap32(a))
F(bswap64, __builtin_bswap64(a)) F(slt64, (s64)a < (s64)b) F(slt32, (s32)a < (s32)b) F(ult32, (u32)a < (u32)b)
F(ugt_imm, a > 0xffffffff80000000ULL) F(sgt_imm32, (s32)a > -5) F(ule_imm, a <= 0x7fffffffULL)
F(neg64, -a) F(neg32, (u32)-(s32)a) F(mix, ((a ^ (b << 7)) * 0x9e3779b97f4a7c15ULL) >> 17)
"""
ARITH_UB = {  # inputs (as u64) for which the C expression is undefined
    "udiv64": lambda a, b: b == 0, "umod64": lambda a, b: b == 0,
    "sdiv64": lambda a, b: b == 0 or (a == 1 << 63 and b == M64),
    "smod64": lambda a, b: b == 0 or (a == 1 << 63 and b == M64),
    "udiv32": lambda a, b: b & 0xFFFFFFFF == 0, "umod32": lambda a, b: b & 0xFFFFFFFF == 0,
    "sdiv32": lambda a, b: b & 0xFFFFFFFF == 0 or (a & 0xFFFFFFFF == 1 << 31 and b & 0xFFFFFFFF == 0xFFFFFFFF),
    "smod32": lambda a, b: b & 0xFFFFFFFF == 0 or (a & 0xFFFFFFFF == 1 << 31 and b & 0xFFFFFFFF == 0xFFFFFFFF),
}
ARITH_NAMES = [n for line in ARITH_C.splitlines() if not line.startswith("#") for n in re.findall(r"F\((\w+),", line)]


@pytest.fixture(scope="module")
def arith(tmp_path_factory):
    """(BPF code of each function, the native library) or a skip when a compiler is missing."""
    if not (shutil.which("clang-19") and shutil.which("gcc")):
        pytest.skip("needs clang-19 and gcc")
    d = tmp_path_factory.mktemp("arith")
    src = d / "arith.c"
    src.write_text(ARITH_C)
    subprocess.run(["clang-19", "-O2", "-target", "bpf", "-mcpu=v4", "-c", str(src), "-o", str(d / "a.o")], check=True)
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", str(src), "-o", str(d / "a.so")], check=True)
    with open(d / "a.o", "rb") as f:
        elf = ELFFile(f)
        text = elf.get_section_by_name(".text").data()
        symbols = {s.name: s for s in elf.get_section_by_name(".symtab").iter_symbols()}
        code = {n: text[symbols[n]["st_value"]:symbols[n]["st_value"] + symbols[n]["st_size"]] for n in ARITH_NAMES}
    lib = ctypes.CDLL(str(d / "a.so"))
    native = {}
    for n in ARITH_NAMES:
        fn = getattr(lib, n)
        fn.restype, fn.argtypes = ctypes.c_uint64, [ctypes.POINTER(ctypes.c_uint64)]
        native[n] = fn
    return code, native


EDGES = [0, 1, 2, 5, 31, 32, 63, 64, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
         1 << 32, 1 << 63, M64, M64 - 1, M64 - 4, 0x123456789ABCDEF0]


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.sampled_from(EDGES), st.integers(0, M64)), st.one_of(st.sampled_from(EDGES), st.integers(0, M64)))
def test_vm_agrees_with_native_c(arith, a: int, b: int) -> None:
    code, native = arith
    for name in ARITH_NAMES:
        if ARITH_UB.get(name, lambda a, b: False)(a, b):
            continue
        expected = native[name]((ctypes.c_uint64 * 2)(a, b))
        assert execute(code[name], u64(a) + u64(b)) == expected, f"{name}(0x{a:x}, 0x{b:x})"


def test_map_operation_the_type_lacks_names_the_pc() -> None:
    rb = prog.MapDef("rb", prog.MAP_RINGBUF, 0, 0, 64)
    with pytest.raises(EgpuError, match=r"^4: map rb: ringbuf has no lookup \(call 0x1\)"):
        _run("r1 = map[0] ll\nr2 = r10\nr2 += -8\ncall map_lookup_elem\nexit", rb)
