"""eBPF -> PTX on a GPU (make gpu-test): the reference VM is the oracle.

The whole ISA table, every test probe and batches of random verified programs (ALU and branches; stack
stores, loads, atomics and a local call) give the same r0,
memory and maps on the GPU as on the VM; a million threads updating one hash map, one array map, per-SM
counters and one ring buffer lose no update (ring: delivered + dropped == attempted), inserting and
deleting their own keys leave an empty map, and an evicting LRU hash neither hangs nor overflows.
"""

from __future__ import annotations

import re
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from egpu_preload.bpf import program as prog
from egpu_preload.bpf.asm import assemble
from egpu_preload.bpf.ctx import BY_NAME as CTX, FLAG_STORE, KIND_MEM, SIZE as CTX_SIZE, kernel_id
from egpu_preload.bpf.elf import load_object
from egpu_preload.maps import MapsState
from egpu_preload.translate import execute_batch_on_gpu, execute_on_gpu, run_probe_on_gpu
from egpu_preload.vm import ThreadSim, Vm, run_with_mem
from isa_cases import CASES
from translate_support import (GPU_TEST_PROBES, RING_CAPACITY, assert_random_u32, memory_program, probe_object,
                               straight_line_program, verified_programs)

pytestmark = pytest.mark.gpu

MILLION = 1 << 20


def test_isa_table_matches_vm_and_expectations():
    codes = [assemble(c.asm) for c in CASES]
    got = execute_batch_on_gpu([(code, c.mem) for code, c in zip(codes, CASES)])
    bad = []
    for c, code, (r0, mem) in zip(CASES, codes, got):
        vm_r0, vm_mem = run_with_mem(code, c.mem)
        if r0 != c.r0 or r0 != vm_r0:
            bad.append(f"{c.name}: r0 gpu {r0:#x} vm {vm_r0:#x} expected {c.r0:#x}")
        if c.mem is not None and (mem != vm_mem or (c.mem_after is not None and mem != c.mem_after)):
            bad.append(f"{c.name}: mem gpu {mem.hex()} vm {vm_mem.hex()}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("asm, mem, r0", [
    ("r0 = r2\nexit", b"abc", 3),
    ("r0 = r1\nexit", None, 0),
    ("r0 = r2\nexit", b"", 0),
])
def test_execute_on_gpu_contract(asm, mem, r0):
    assert execute_on_gpu(assemble(asm), mem) == r0


# ---- every test probe ---------------------------------------------------------------------------

# What in a probe's output is a time or where the thread ran (the VM's clock and SM are made up): byte
# ranges of each ring/perf record zeroed, maps whose values are zeroed (keys kept), and numbers in
# trace lines replaced. Everything else, and every other probe, is compared byte for byte.
VARYING: dict[str, dict] = {
    "gpu_helpers": {"records": [(96, 120)]},   # struct where: ts, sm, warp (%warpid: a slot on the SM)
    "libbpf_style": {"values": {"last_seen"}, "trace": True},   # block -> ts; "block 0 at <ts>"
    "ringbuf": {"records": [(16, 28)]},        # struct event: ts, sm
}


def _masked(record: bytes, ranges: list[tuple[int, int]]) -> bytes:
    out = bytearray(record)
    for lo, hi in ranges:
        out[lo:hi] = bytes(len(out[lo:hi]))
    return bytes(out)


def _ctx() -> bytes:
    buf = bytearray(CTX_SIZE)
    for name, value in (("kernel_id", kernel_id("_Z6vecAddPfS_S_i")), ("launch_id", 3), ("addr", 0x7F0000001000),
                        ("site", 5), ("size", 4), ("flags", FLAG_STORE), ("kind", KIND_MEM), ("nargs", 3)):
        f = CTX[name]
        buf[f.offset:f.offset + f.size] = value.to_bytes(f.size, "little")
    for k in range(CTX["args"].count):
        struct.pack_into("<Q", buf, CTX["args"].offset + 8 * k, 0x1000 * (k + 1))
    for name, dims in (("grid", (2, 1, 1)), ("block", (128, 1, 1))):
        struct.pack_into("<3I", buf, CTX[name].offset, *dims)
    return bytes(buf)


def _digest(state: MapsState, varying: dict) -> list:
    """Map contents and trace lines with what ``varying`` names zeroed (VARYING)."""
    out: list = []
    ranges = varying.get("records", [])
    for s in state.storages:
        kind = s.mapdef.type
        if kind == prog.MAP_PERCPU_ARRAY:  # the VM runs on SM 0, the GPU thread wherever it lands
            out.append(sorted(v for cpu in s.cpus() for _, v in s.items(cpu) if any(v)))
        elif kind in prog.PERCPU_HASHES:   # so too: each key's values other than zeros, whichever SM has them
            out.append(sorted((k, sorted(bytes(v) for v in values.values() if any(v)))
                              for k, values in s.entries.items()))
        elif kind in (prog.MAP_RINGBUF, prog.MAP_PERF_EVENT_ARRAY):
            records = [r if kind == prog.MAP_RINGBUF else r[1] for r in s.records]
            out.append(([_masked(r, ranges) for r in records], s.drops))
        elif s.mapdef.name in varying.get("values", ()):
            out.append([(k, bytes(len(v))) for k, v in sorted(s.items())])
        else:
            out.append(sorted(s.items()))
    lines = [t.text() for t in state.trace]
    out.append([re.sub(r"\d+", "N", t) for t in lines] if varying.get("trace") else lines)
    return out


def test_every_probe_matches_vm(probe_obj, probe_names):
    bad = []
    for name in probe_names:
        obj = load_object(probe_obj(name))
        for p in obj.programs:
            vm_state = MapsState(obj.maps)
            vm_r0 = Vm(p.code, obj.maps, vm_state).run(_ctx(), ThreadSim(globaltimer=1000, tick=10))
            r0s, gpu_state = run_probe_on_gpu(obj, p, 1, _ctx())
            varying = VARYING.get(name, {})
            if r0s[0] != vm_r0 or _digest(gpu_state, varying) != _digest(vm_state, varying):
                bad.append(f"{name}:{p.section}: r0 gpu {r0s[0]} vm {vm_r0}\n  gpu {_digest(gpu_state, varying)}\n"
                           f"  vm  {_digest(vm_state, varying)}")
    assert not bad, "\n".join(bad)


def test_prandom_draws_of_a_million_threads_look_random():
    """bpf_get_prandom_u32 from every thread of a launch, each thread's second draw: the lanes of a warp read one
    clock, the warps of an SM and the SMs run at once, yet the draws are u32s, nearly all distinct, their bits
    balanced (the first 2,048 threads', neighbours, and 2,048 spread over the launch checked)."""
    obj, p = probe_object("call get_prandom_u32\nexit", [])
    r0s, _ = run_probe_on_gpu(obj, p, 1 << 20, calls=2)
    assert_random_u32(r0s[:2048] + r0s[2048::511][:2048])


# ---- random verified programs -------------------------------------------------------------------

@pytest.mark.parametrize("make", [straight_line_program, memory_program], ids=["alu", "stack-atomics-calls"])
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(0, (1 << 32) - 1))
def test_random_verified_programs_match_vm(make, seed):
    codes = verified_programs(seed, 250, make)
    got = execute_batch_on_gpu([(code, None) for code in codes])
    bad = [code.hex() for code, (r0, _) in zip(codes, got) if r0 != run_with_mem(code, None)[0]]
    assert not bad, f"{len(bad)} programs differ, e.g. {bad[:3]}"


# ---- a million threads --------------------------------------------------------------------------

def _million(name: str) -> MapsState:
    """Run GPU_TEST_PROBES[name] in a million threads; the maps after."""
    obj, p = probe_object(*GPU_TEST_PROBES[name], path="million.bpf.o")
    return run_probe_on_gpu(obj, p, MILLION)[1]


def test_million_threads_hash_map_loses_no_update():
    state = _million("hash")
    counts = {struct.unpack("<Q", k)[0]: struct.unpack("<Q", v)[0] for k, v in state[0].items()}
    assert counts == {k: MILLION // 1024 for k in range(1024)}


def test_million_threads_array_counter_loses_no_update():
    state = _million("array")
    assert struct.unpack("<QQQ", state[0].values[0]) == (MILLION, MILLION, MILLION)


def test_million_threads_per_sm_counters_lose_no_update():
    """Each SM counts in its own row (its own cache line): the rows sum to every thread, spread over SMs."""
    storage = _million("percpu")[0]
    rows = [struct.unpack("<QQQ", storage.lookup(struct.pack("<I", 0), cpu)) for cpu in storage.cpus()]
    assert tuple(map(sum, zip(*rows))) == (MILLION, MILLION, MILLION)
    assert sum(1 for r in rows if any(r)) > 1


def test_million_threads_insert_and_delete_their_keys():
    """Every thread inserts its own key and deletes it: all succeed, and the map ends empty."""
    obj, p = probe_object(*GPU_TEST_PROBES["insert_delete"], path="million.bpf.o")
    r0s, state = run_probe_on_gpu(obj, p, MILLION)
    assert r0s == [1] * MILLION
    assert list(state[0].items()) == []


def test_million_threads_on_an_evicting_lru_hash():
    """4096 keys into 1024 LRU entries: it keeps evicting, yet the run ends (no thread waits for
    another), holds at most max_entries, and no key counts more than its 256 threads."""
    state = _million("lru")
    counts = [struct.unpack("<Q", v)[0] for _, v in state[0].items()]
    assert 0 < len(counts) <= 1024
    assert all(1 <= c <= MILLION // 4096 for c in counts)


def test_million_threads_per_sm_hash_counts_lose_no_update():
    """HASH_COUNT on a PERCPU_HASH: each SM adds to its own value of a key (its own row), the first inserting
    the key for all: summed over SMs, every key counts its 1024 threads, and more than one SM holds values."""
    storage = _million("percpu_hash")[0]
    sums = {struct.unpack("<Q", k)[0]: sum(struct.unpack("<Q", v)[0] for v in values.values())
            for k, values in storage.entries.items()}
    assert sums == {k: MILLION // 1024 for k in range(1024)}
    assert len(storage.cpus()) > 1


def test_million_threads_on_an_evicting_lru_percpu_hash():
    """LRU_COUNT on an LRU_PERCPU_HASH: it evicts all along (a revived key's rows zeroed), yet the run ends,
    holds at most max_entries, and no key's values sum past its 256 threads."""
    storage = _million("lru_percpu")[0]
    sums = [sum(struct.unpack("<Q", v)[0] for v in values.values()) for values in storage.entries.values()]
    assert 0 < len(sums) <= 1024
    assert all(1 <= c <= MILLION // 4096 for c in sums)


def test_million_threads_ring_buffer_delivers_or_counts():
    ring = _million("ring")[0]
    ids = [struct.unpack("<Q", r)[0] for r in ring.records]
    assert len(ids) + ring.drops == MILLION
    assert len(set(ids)) == len(ids) and all(i < MILLION for i in ids)
    # Credit given back by a refused producer can refuse another meanwhile: drops, never overwrites.
    # The ring holds RING_CAPACITY // 16 records of 8 bytes (8-byte header each), taken by warps.
    assert RING_CAPACITY // 32 <= len(ids) <= RING_CAPACITY // 16


def test_a_warp_whose_records_outsize_the_ring_still_gets_those_that_fit():
    """32 records of 136 bytes (128 and a header) do not fit a 4 KiB ring at once: the ring keeps the 30
    that do (the ring is not drained during the launch, so no later warp finds room) and drops the rest."""
    ring = _million("ring_big")[0]
    ids = [struct.unpack_from("<Q", r)[0] for r in ring.records]
    print(f"ring_big: {len(ids)} records kept, {ring.drops} dropped")
    assert len(ids) + ring.drops == MILLION
    assert len(ids) == 4096 // 136 == 30 and len(set(ids)) == len(ids)
    assert all(r == r[:8] * 16 for r in ring.records)


def test_million_threads_of_mixed_record_sizes_reserve_one_by_one():
    """Lanes asking for 8 and 16 bytes cannot reserve as one group: each record still arrives whole,
    once, with its own size, or is counted as dropped."""
    ring = _million("ring_mixed")[0]
    ids = [struct.unpack_from("<Q", r)[0] for r in ring.records]
    assert len(ids) + ring.drops == MILLION
    assert len(set(ids)) == len(ids) and all(i < MILLION for i in ids)
    assert all(len(r) == 8 + 8 * (i & 1) and r[8:] in (b"", r[:8]) for i, r in zip(ids, ring.records))
    assert RING_CAPACITY // 48 <= len(ids) <= RING_CAPACITY // 16
