"""Lossless streaming traces (issue 19): the ring reader that drains rings while kernels run, the PTX of
``--on-full wait``, the trace file and ``egpu trace``."""

from __future__ import annotations

import dataclasses
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from egpu_preload.bpf import program as prog
from egpu_preload.runtime.ring_drain import RingDrain, RingReader
from egpu_preload.translate import devmaps, probe_function
from egpu_preload.translate.module import probe_runner_ptx
from translate_support import GPU_TEST_PROBES, probe_object


# ---- --on-full wait: the PTX ------------------------------------------------------------------------

def _waiting(maps: list[prog.MapDef]) -> list[prog.MapDef]:
    return [dataclasses.replace(m, wait=True) for m in maps]


@pytest.mark.parametrize("name", ["ring", "ring_mixed", "ring_big"])
def test_a_waiting_ring_spins_on_consumed_and_never_gives_credit_back(name, tmp_path):
    """Group and one-by-one reserves of a ring made to wait assemble for sm_90; they read ``consumed``
    with acquire at system scope in a loop, and no credit is given back (no negative add on reserved),
    unlike the dropping ring's code."""
    asm, maps = GPU_TEST_PROBES[name]
    obj, p = probe_object(asm, _waiting(maps), f"{name}.bpf.o")
    func = probe_function(p, obj, ctx_params=True).func
    assert "ld.acquire.sys.u64" in func and "nanosleep.u32" in func
    assert "neg.s64" not in func and "red.min.u64" not in func
    plain_obj, plain = probe_object(asm, maps, f"{name}.bpf.o")
    dropping = probe_function(plain, plain_obj, ctx_params=True).func
    assert "ld.acquire.sys.u64" not in dropping and "neg.s64" in dropping
    src = tmp_path / "m.ptx"
    src.write_text(probe_runner_ptx(probe_function(p, obj, ctx_params=True)))
    done = subprocess.run(["ptxas", "-arch=sm_90", str(src), "-o", str(tmp_path / "m.cubin")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]


# ---- the reader against a stand-in ring written by producer threads ---------------------------------

class HostRing:
    """A ring region in host memory with devmaps.py's protocol, written by producer threads the way the
    generated PTX does (a lock stands in for each atomic) and read through the reader's Memory calls."""

    def __init__(self, capacity: int, ncpu: int, wait: bool) -> None:
        self.lay = devmaps.MapLayout("ringbuf", capacity=capacity, wait=wait)
        self.mem = bytearray(devmaps.ring_image(self.lay, ncpu))
        self.atomic = threading.Lock()
        self.refused = 0   # the producers' own count of records they dropped
        self.reopened = 0  # records delivered from an SM that had been refused as large a record before

    # Memory (the reader's side; offsets from 0 stand for device addresses)
    def read(self, addr: int, n: int) -> bytes:
        return bytes(self.mem[addr:addr + n])

    def write(self, addr: int, data: bytes) -> None:
        self.mem[addr:addr + len(data)] = data

    def _u64(self, off: int) -> int:
        return struct.unpack_from("<Q", self.mem, off)[0]

    def _add(self, off: int, v: int) -> int:
        with self.atomic:
            old = self._u64(off)
            struct.pack_into("<Q", self.mem, off, old + v)
            return old

    def produce(self, data: bytes, sm: int) -> bool:
        """One record from SM ``sm``: reserve (waiting or dropping as the ring is made), write, publish."""
        total, cap, line = 8 + devmaps.round8(len(data)), self.lay.capacity, self.lay.lines_off + sm * devmaps.LINE
        if self.lay.wait:
            end = self._add(8, total) + total
            while end - self._u64(16) > cap:
                time.sleep(0)
        else:
            if total >= self._u64(line):           # this SM was refused as much before
                self._add(line + 8, 1)
                self.refused += 1
                return False
            r = self._add(8, total)
            if r + total - self._u64(16) > cap:    # no room: credit back, a counted drop, the SM's mark
                self._add(8, -total)
                self._add(line + 8, 1)
                with self.atomic:
                    struct.pack_into("<Q", self.mem, line, min(total, self._u64(line)))
                self.refused += 1
                return False
        pos = self._add(0, total)
        o = devmaps.HEADER + pos % cap
        struct.pack_into("<II", self.mem, o, len(data), devmaps.REC_BUSY)
        self.mem[o + 8:o + 8 + len(data)] = data
        struct.pack_into("<I", self.mem, o + 4, devmaps.REC_READY | sm << 8)
        return True


PRODUCERS, PER_PRODUCER = 4, 6000


def _run_producers(ring: HostRing) -> tuple[list[tuple[int, bytes]], RingReader, list[int]]:
    """PRODUCERS threads, each PER_PRODUCER records (producer, its sequence number, padding that varies
    the size) as fast as they can, while a RingDrain takes them; what it delivered, in order."""
    got: list[tuple[int, bytes]] = []
    reader = RingReader(ring, 0, ring.lay)
    drain = RingDrain([reader], lambda i, recs: got.extend(recs), idle_s=0.0001).start()
    kept = [0] * PRODUCERS

    def producer(p: int) -> None:
        refused = 1 << 30   # the smallest record of this producer refused so far
        for k in range(PER_PRODUCER):
            data = struct.pack("<II", p, k) + bytes(8 * (k % 3))
            if ring.produce(data, sm=p):
                kept[p] += 1
                ring.reopened += len(data) >= refused
            else:
                refused = min(refused, len(data))

    threads = [threading.Thread(target=producer, args=(p,)) for p in range(PRODUCERS)]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)   # threads interleave finely, as warps on SMs do
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(switch)
    drain.stop()
    return got, reader, kept


def _by_producer(got: list[tuple[int, bytes]]) -> dict[int, list[int]]:
    seqs: dict[int, list[int]] = {}
    for sm, data in got:
        p, k = struct.unpack_from("<II", data)
        assert sm == p and len(data) == 8 + 8 * (k % 3)
        seqs.setdefault(p, []).append(k)
    return seqs


def test_wait_loses_nothing_and_keeps_each_producers_order():
    """A 1 KiB ring (about 50 records) under four producers: every record arrives once, each producer's
    in the order it wrote them, none dropped, and the ring ends empty with consumed at head."""
    ring = HostRing(1024, PRODUCERS, wait=True)
    got, reader, kept = _run_producers(ring)
    assert _by_producer(got) == {p: list(range(PER_PRODUCER)) for p in range(PRODUCERS)}
    assert reader.dropped == 0 and reader.taken == len(got) == PRODUCERS * PER_PRODUCER
    assert reader.empty() and ring._u64(16) == ring._u64(0) == ring._u64(8)


def test_drop_counts_every_record_it_does_not_deliver():
    """The same producers on a dropping ring: what arrives is each producer's records without
    duplicates and in order, and delivered + dropped is exactly what was written (the reader's count
    from the ring equals the producers' own); the reader reopens SMs that were refused, so records keep
    arriving from an SM after it was refused."""
    ring = HostRing(1024, PRODUCERS, wait=False)
    got, reader, kept = _run_producers(ring)
    seqs = _by_producer(got)
    for p in range(PRODUCERS):
        mine = seqs.get(p, [])
        assert mine == sorted(set(mine)) and len(mine) == kept[p]
    assert reader.dropped == ring.refused == PRODUCERS * PER_PRODUCER - len(got) > 0
    assert ring.reopened > 0   # the reader reset the SMs' full marks once it had made room


def test_a_record_is_taken_only_once_a_pass_saw_it_complete():
    """A copy engine may copy a flag before the bytes it guards: a record seen READY is taken only by
    the next pass, and one still BUSY stops the pass (nothing after it is taken out of order)."""
    ring = HostRing(4096, 1, wait=False)
    ring.produce(b"first...", 0)
    reader = RingReader(ring, 0, ring.lay)
    assert reader.take() == []                       # seen, not yet taken
    assert reader.take() == [(0, b"first...")]
    pos = ring._add(0, 16)                          # reserved, not yet published
    struct.pack_into("<II", ring.mem, devmaps.HEADER + pos, 8, devmaps.REC_BUSY)
    ring._add(8, 16)
    ring.produce(b"second..", 0)
    assert reader.take() == [] and reader.take() == []
    struct.pack_into("<I", ring.mem, devmaps.HEADER + pos + 4, devmaps.REC_DISCARD)
    reader.take()
    assert reader.take() == [(0, b"second..")] and reader.empty()
    assert not any(ring.mem[devmaps.HEADER:devmaps.HEADER + 48])   # consumed bytes cleared
