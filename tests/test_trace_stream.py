"""Lossless streaming traces (issue 19): the ring reader that drains rings while kernels run, the PTX of
``--on-full wait``, the trace file and ``egpu trace``."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import decimal
import json
import os
import re
import struct
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from egpu_preload.bpf import program as prog
from egpu_preload.descriptors import Held, identity
from egpu_preload.runtime.driver import DriverError
from egpu_preload.runtime.ring_drain import Block, RingDrain, RingReader
from egpu_preload.runtime.spool import Spool
from egpu_preload.translate import devmaps, probe_function
from egpu_preload.translate.module import probe_runner_ptx
from host_memory import OUT, HostCopies
from stub_job import ROOT
from translate_support import GPU_TEST_PROBES, probe_object

pytestmark = pytest.mark.usefixtures("ring_walk_in_c")


# ---- --on-full wait: the PTX ------------------------------------------------------------------------

def _waiting(maps: list[prog.MapDef]) -> list[prog.MapDef]:
    return [dataclasses.replace(m, wait=True) for m in maps]


@pytest.mark.parametrize("name", ["ring", "ring_mixed", "ring_big"])
def test_a_waiting_ring_spins_on_consumed_and_gives_credit_back_only_when_its_reader_stalls(name, tmp_path):
    """Group and one-by-one reserves of a ring made to wait assemble for sm_90; they read ``consumed``
    with acquire at system scope in a loop, and give credit back (a negative add on reserved) only on the
    path past the stall check: once %globaltimer says ``consumed`` has not moved for WAIT_STALL_NS. They
    mark no size refused (the dropping ring's code does)."""
    asm, maps = GPU_TEST_PROBES[name]
    obj, p = probe_object(asm, _waiting(maps), f"{name}.bpf.o")
    func = probe_function(p, obj, ctx_params=True).func
    assert "ld.acquire.sys.u64" in func and "nanosleep.u32" in func and "red.min.u64" not in func
    lines = [ln.strip() for ln in func.splitlines()]
    stall = [i for i, ln in enumerate(lines)
             if ln.startswith("setp.gt.u64") and f"{devmaps.WAIT_STALL_NS:#X}"[2:] in ln]
    gives = [i for i, ln in enumerate(lines) if ln.startswith("neg.s64")]
    assert stall and len(gives) == len(stall), func   # one give-back for each wait, after it
    for at, back in zip(stall, gives):
        label = lines[at + 1].split("bra ")[1].rstrip(";")   # the branch the stall check takes
        assert lines.index(f"{label}:") < back and "%globaltimer" in "".join(lines[at - 8:at]), func
    plain_obj, plain = probe_object(asm, maps, f"{name}.bpf.o")
    dropping = probe_function(plain, plain_obj, ctx_params=True).func
    assert "ld.acquire.sys.u64" not in dropping and "neg.s64" in dropping
    src = tmp_path / "m.ptx"
    src.write_text(probe_runner_ptx(probe_function(p, obj, ctx_params=True)))
    done = subprocess.run(["ptxas", "-arch=sm_90", str(src), "-o", str(tmp_path / "m.cubin")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]


# A record from each of two rings: one submitted, one discarded. Their releases find the ring by the map's index
# that the reserve wrote above BUSY.
TWO_RINGS = """r1 = map[0] ll
r2 = 8
r3 = 0
call ringbuf_reserve
if r0 == 0 goto second
r1 = r0
r2 = 0
call ringbuf_submit
second:
r1 = map[1] ll
r2 = 16
r3 = 0
call ringbuf_reserve
if r0 == 0 goto out
r1 = r0
r2 = 0
call ringbuf_discard
out:
r0 = 0
exit
"""


@pytest.mark.parametrize("name", ["ring", "ring_mixed", "two_rings", "access_trace", "mem_trace_warp"])
def test_every_record_published_is_counted_on_its_sms_line_after_its_flag(name, tmp_path):
    """ringbuf_output's records (one by one and in groups), ringbuf_reserve's submitted or discarded (from one ring,
    and from two), and the warp records each add their bytes to the SM's line of their ring at COMMITTED, with a
    release, after the flag: the reader takes every record below head unwalked once the lines sum to it (devmaps.py).
    A reserve from a program of two rings tags its BUSY flags with the ring's index, which its release selects
    the ring's line by. Each assembles for sm_90."""
    if name in GPU_TEST_PROBES:
        obj, p = probe_object(*GPU_TEST_PROBES[name], f"{name}.bpf.o")
    elif name == "two_rings":
        obj, p = probe_object(TWO_RINGS, [prog.MapDef(f"r{k}", prog.MAP_RINGBUF, 0, 0, 1 << 12) for k in range(2)])
    else:
        obj, p = _example(name, tmp_path)
    probe = probe_function(p, obj, ctx_params=True)
    lines = [ln.strip() for ln in probe.func.splitlines()]
    flags = [i for i, ln in enumerate(lines) if "st.release.sys.u32 [" in ln and "+4]" in ln]
    counts = [i for i, ln in enumerate(lines) if re.fullmatch(rf"(@%p\d+ )?red\.release\.sys\.add\.u64 "
                                                            rf"\[%\w+\+{devmaps.COMMITTED}\], %\w+;", ln)]
    assert flags and len(counts) == len(flags), probe.func
    for flag, count, after in zip(flags, counts, flags[1:] + [len(lines)]):
        assert flag < count < after, probe.func
    if name == "two_rings":
        busy = [ln for ln in lines if re.fullmatch(r"st\.u32 \[%\w+\+4\], \d+;", ln)]
        assert [int(ln.split(", ")[1].rstrip(";")) for ln in busy] == [devmaps.REC_BUSY, devmaps.REC_BUSY | 1 << 8]
        assert sum(1 for ln in lines if ln.startswith("shr.u32") and ln.endswith(", 8;")) == 2
    src = tmp_path / "m.ptx"
    src.write_text(probe_runner_ptx(probe))
    done = subprocess.run(["ptxas", "-arch=sm_90", str(src), "-o", str(tmp_path / "m.cubin")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]


# ---- the reader against a stand-in ring written by producer threads ---------------------------------

class HostMemory:
    """The reader's Memory over the bytearray ``mem``: offsets in it stand for device addresses, the driver's
    copies of the reader's pass in C are memcpy over it (tests/host_memory.py), and a bytearray of its own
    stands for pinned memory."""

    mem: bytearray
    device: HostCopies | None = None
    lazy = False   # HostCopies' lazy copies: each lands only when waited for

    def read(self, addr: int, n: int) -> bytes:
        return bytes(self.mem[addr:addr + n])

    def copies(self):
        if self.device is None:
            self.device = HostCopies(self.mem, lazy=self.lazy)
        return self.device.copies()

    def write(self, addr: int, data: bytes | memoryview) -> None:
        self.mem[addr:addr + len(data)] = data

    def pinned(self, size: int) -> memoryview:
        return memoryview(bytearray(size))

    def unpin(self, buf: memoryview) -> None:
        pass

    def entered(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


class HostRing(HostMemory):
    """A ring region in host memory with devmaps.py's protocol, written by producer threads the way the
    generated PTX does (a lock stands in for each atomic) and read through the reader's Memory calls. The
    header's words and a record's flags are loaded and stored whole, as the GPU's atomics and st.release do:
    struct.pack_into stores byte by byte, and the reader's pass in C reads them meanwhile, without the GIL."""

    def __init__(self, capacity: int, ncpu: int, wait: bool, mem: bytearray | None = None, base: int = 0) -> None:
        """A ring of its own, or the one at ``base`` of ``mem`` (an image DeviceMaps wrote there)."""
        self.lay = devmaps.MapLayout("ringbuf", capacity=capacity, wait=wait)
        self.mem = bytearray(devmaps.ring_image(self.lay, ncpu)) if mem is None else mem
        self.base = base
        self._words, self._flags = memoryview(self.mem).cast("Q"), memoryview(self.mem).cast("I")
        self.atomic = threading.Lock()
        self.refused = 0   # the producers' own count of records they dropped
        self.reopened = 0  # records delivered from an SM that had been refused as large a record before

    def _u64(self, off: int) -> int:
        return self._words[(self.base + off) >> 3]

    def _add(self, off: int, v: int) -> int:
        with self.atomic:
            old = self._u64(off)
            self._words[(self.base + off) >> 3] = old + v
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
                    self._words[(self.base + line) >> 3] = min(total, self._u64(line))
                self.refused += 1
                return False
        pos = self._add(0, total)
        o = self.base + devmaps.HEADER + pos % cap
        struct.pack_into("<II", self.mem, o, len(data), devmaps.REC_BUSY)
        self.mem[o + 8:o + 8 + len(data)] = data
        self._flags[(o + 4) >> 2] = devmaps.REC_READY | sm << 8
        return True


PRODUCERS, PER_PRODUCER = 4, 6000


def flat(taken: list) -> list[tuple[int, bytes]]:
    """What a reader took, records taken at once (Blocks, Packed) made single records."""
    return [r for x in taken for r in (x.records() if not isinstance(x, tuple) else [x])]


def interleaved(producer: Callable[[int], None], n: int) -> None:
    """``producer(p)`` for p < n on threads of their own, switching finely, as warps on SMs do; joined."""
    threads = [threading.Thread(target=producer, args=(p,)) for p in range(n)]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(switch)


def _run_producers(ring: HostRing, spool_dir: Path | None = None, files: int = 1
                   ) -> tuple[list[tuple[int, bytes]], RingReader, list[int]]:
    """PRODUCERS threads, each PER_PRODUCER records (producer, its sequence number, padding that varies
    the size) as fast as they can, while a RingDrain takes them; what it delivered, in order. Given
    ``spool_dir``, the drain appends to a spool of ``files`` files there (of no name) and a thread reads it
    back as the writer does, while the producers run."""
    got: list[tuple[int, bytes]] = []
    reader = RingReader(ring, 0, ring.lay)
    spool = Spool(spool_dir / "t.parquet", files) if spool_dir else None
    drain = RingDrain([reader], lambda i, taken: got.extend(flat(taken)), idle_s=0.0001, spool=spool).start()
    kept = [0] * PRODUCERS
    done = threading.Event()

    def read_once() -> None:
        while spool.pending():
            for _, taken in spool.taken():
                reader.taken += len(flat(taken))
                got.extend(flat(taken))

    def read_back() -> None:
        while not done.is_set():
            read_once()
            time.sleep(0.0005)

    def producer(p: int) -> None:
        refused = 1 << 30   # the smallest record of this producer refused so far
        for k in range(PER_PRODUCER):
            data = struct.pack("<II", p, k) + bytes(8 * (k % 3))
            if ring.produce(data, sm=p):
                kept[p] += 1
                ring.reopened += len(data) >= refused
            else:
                refused = min(refused, len(data))

    writer = threading.Thread(target=read_back)
    if spool:
        writer.start()
    interleaved(producer, PRODUCERS)
    drain.stop()
    if spool:
        done.set()
        writer.join()
        read_once()   # the chunks of the last passes
        assert not list(spool_dir.iterdir()) and spool.read_at == list(spool.c.end)[:files]
        assert min(spool.read_at) > 0 and spool.next == spool.c.chunks
        spool.close()
    return got, reader, kept


def _by_producer(got: list[tuple[int, bytes]]) -> dict[int, list[int]]:
    seqs: dict[int, list[int]] = {}
    for sm, data in got:
        p, k = struct.unpack_from("<II", data)
        assert sm == p and len(data) == 8 + 8 * (k % 3)
        seqs.setdefault(p, []).append(k)
    return seqs


@pytest.mark.parametrize("via", ["sink", "spool", "spool4"])
def test_wait_loses_nothing_and_keeps_each_producers_order(via, tmp_path):
    """A 1 KiB ring (about 50 records) under four producers: every record arrives once, each producer's
    in the order it wrote them, none dropped, and the ring ends empty with consumed at head; handed to a sink
    pass by pass, or spooled by bursts of passes in C and read back meanwhile, into one file or four (the
    chunks dealt to them in turn, written by four threads at once, read back in the order taken)."""
    ring = HostRing(1024, PRODUCERS, wait=True)
    got, reader, kept = _run_producers(ring, tmp_path if via != "sink" else None, 4 if via == "spool4" else 1)
    assert _by_producer(got) == {p: list(range(PER_PRODUCER)) for p in range(PRODUCERS)}
    assert reader.dropped == 0 and reader.taken == len(got) == PRODUCERS * PER_PRODUCER
    assert reader.empty() and ring._u64(16) == ring._u64(0) == ring._u64(8)


@pytest.mark.parametrize("via", ["sink", "spool", "spool4"])
def test_drop_counts_every_record_it_does_not_deliver(via, tmp_path):
    """The same producers on a dropping ring: what arrives is each producer's records without
    duplicates and in order, and delivered + dropped is exactly what was written (the reader's count
    from the ring equals the producers' own); the reader reopens SMs that were refused, so records keep
    arriving from an SM after it was refused."""
    ring = HostRing(1024, PRODUCERS, wait=False)
    got, reader, kept = _run_producers(ring, tmp_path if via != "sink" else None, 4 if via == "spool4" else 1)
    seqs = _by_producer(got)
    for p in range(PRODUCERS):
        mine = seqs.get(p, [])
        assert mine == sorted(set(mine)) and len(mine) == kept[p]
    assert reader.dropped == ring.refused == PRODUCERS * PER_PRODUCER - len(got) > 0
    assert ring.reopened > 0   # the reader reset the SMs' full marks once it had made room


def test_a_failed_reader_still_reopens_a_dropping_ring_and_counts_its_drops():
    """After the reader fails, a dropping ring is passed over too: its refused SMs may ask again (records
    keep being accepted from an SM after it was refused) and the drops are still counted exactly."""
    ring = HostRing(1024, PRODUCERS, wait=False)
    reader = RingReader(ring, 0, ring.lay)

    def failing_take():
        raise RuntimeError("copy failed")

    reader.take = failing_take
    drain = RingDrain([reader], lambda i, taken: None, idle_s=0.0001).start()
    refused = [1 << 30] * PRODUCERS
    for k in range(PER_PRODUCER):
        for p in range(PRODUCERS):
            data = struct.pack("<II", p, k) + bytes(8 * (k % 3))
            if ring.produce(data, sm=p):
                ring.reopened += len(data) >= refused[p]
            else:
                refused[p] = min(refused[p], len(data))
        if k % 64 == 0:
            time.sleep(0.001)   # room for the drain's passes
    with pytest.raises(RuntimeError, match="copy failed"):
        drain.stop()
    reader.skip()
    assert ring.refused > 0 and ring.reopened > 0 and reader.dropped == ring.refused
    assert reader.skipped > 0 and reader.consumed == ring._u64(0)


def test_a_record_is_taken_only_once_a_pass_saw_it_complete():
    """A copy engine may copy a flag before the bytes it guards: a record seen READY is taken only by
    the next pass, and one still BUSY stops the pass (nothing after it is taken out of order). The reader counts
    what that costs: of the bytes its passes copied, the records' bytes taken (once each), and those copied past a
    record not yet complete (copied again by the passes after)."""
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
    # first: copied to be seen, then to be taken (16 + 16); then the BUSY record and second stop two walks at
    # once (32 + 32, all past it), then the two seen (32) and taken (32), the discarded one's bytes with them
    assert (reader.copied, reader.took, reader.unwalked) == (160, 48, 64)


def test_a_pass_across_the_rings_end_counts_its_second_copy_as_copied_not_as_past_a_record():
    """A pass whose records cross the data area's end copies them from where they start on, into the slack, then
    the data area's start over what the slack held past the record that crosses: those bytes are copied twice in
    that pass, and no later pass copies them again, so they are not the bytes past a record not yet complete
    (the pace line's count, which would otherwise read a full ring's wraps as producers still writing)."""
    ring = HostRing(4096, 1, wait=False)
    reader = RingReader(ring, 0, ring.lay)
    for _ in range(30):
        ring.produce(bytes(96), 0)                   # 104 bytes each: 3,120 of the ring's 4,096
    reader.take(), reader.take()
    assert (reader.copied, reader.took, reader.unwalked) == (2 * 3120, 3120, 0)
    for _ in range(30):
        ring.produce(bytes(96), 0)                   # 9 records before the end, the 10th across it to 1,040
    reader.take(), reader.take()
    # each pass: 3,120 from the first record on, then 3,120 - 1,040 from the data area's start
    assert (reader.copied, reader.took, reader.unwalked) == (2 * 3120 + 2 * (3120 + 2080), 2 * 3120, 0)
    assert reader.empty()


class StagedRing(HostRing):
    """A HostRing that keeps what the reader asks of it: the pinned buffers it made and freed, the sizes read()
    copied, and the pass's copies (HostCopies.log)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.pins: list[bytearray] = []
        self.unpinned: list[bytearray] = []
        self.reads: list[int] = []
        self.device = HostCopies(self.mem, room=1 << 16)

    def pinned(self, size: int) -> memoryview:
        self.pins.append(bytearray(size))
        return memoryview(self.pins[-1])

    def unpin(self, buf: memoryview) -> None:
        self.unpinned.append(buf.obj)

    def read(self, addr: int, n: int) -> bytes:
        self.reads.append(n)
        return super().read(addr, n)

    def copied(self, n: int) -> int:
        """How many copies out of ``n`` bytes the passes made."""
        return [size for call, _, size, _ in self.device.log() if call == OUT].count(n)

    def fail_records(self, result: int, after: int = 0) -> None:
        """The copies out of the records (not of the header or the SMs' lines) fail with CUresult ``result``,
        every one after the first ``after``."""
        self.device.fail(devmaps.HEADER, self.lay.lines_off, result, after)


def test_what_a_pass_hands_out_outlives_the_pinned_memory_later_passes_copy_into():
    """The writer holds a pass's records while later passes copy into the same pinned memory: Blocks and
    single records kept over 40 passes, looked at only after, are what was written. That memory is made
    once (the records' and the zeros', and the header's with the SMs' lines) and freed by stop(); every
    copy lands in it (read() copies the SM count, once) and the zeros that clear the records come from it
    too. The headers went through pageable memory before: 3.0-3.8 ms a pass on the H200 (2026-12-05b)."""
    from egpu_preload.runtime.ring_drain import RUN
    ring = StagedRing(4096, 3, wait=False)
    reader = RingReader(ring, 0, ring.lay)
    written, kept = [], []
    for p in range(40):
        for i in range(RUN + 2):   # a Block, then records one by one: another size ends the run
            data = struct.pack("<II", p, i) + bytes(8 * (i >= RUN))
            assert ring.produce(data, sm=i % 3)
            written.append((i % 3, data))
        kept.append(reader.take())
    RingDrain([reader], lambda i, taken: kept.append(taken)).stop()
    assert flat([x for taken in kept for x in taken]) == written
    assert {type(x) for taken in kept for x in taken} == {Block, tuple}
    assert len(ring.pins) == len(ring.unpinned) == 2 and set(map(id, ring.unpinned)) == set(map(id, ring.pins))
    assert ring.reads.count(4) == 1 and set(ring.reads) <= {4, 8}   # 8: empty()'s head at stop
    head, staging = (ring.device.host(pin) for pin in ring.pins)   # the first made: a pass's header and lines
    log = ring.device.log()
    assert all(head[0] <= host < head[1] or staging[0] <= host < staging[1] for call, _, _, host in log if call == OUT)
    heads = [n for call, _, n, host in log if call == OUT and head[0] <= host < head[1]]
    assert heads == [devmaps.HEADER + 8, 3 * devmaps.LINE] * (len(heads) // 2) and len(heads) > 80
    zeros = [host for call, _, n, host in log if call != OUT and n > 8]   # the records' second half: zeros
    assert zeros and all(host == (staging[0] + staging[1]) // 2 for host in zeros)


@pytest.mark.parametrize("mode, off", [("take", 64), ("skip", 64), ("skip", -8)],
                         ids=["take-past-capacity", "skip-past-capacity", "skip-before-consumed"])
def test_a_pass_leaves_the_ring_as_it_is_where_head_is_out_of_the_readers_credit(mode, off):
    """head - consumed <= capacity (devmaps.py); a header whose head lies more than capacity past consumed
    (``off`` past it), or before it, was read while being written (the stand-in's producers store it byte by
    byte) or written over. Found by review: the pass in C copied the whole of [consumed, head) into staging of
    capacity bytes, over the zeros and on into the heap (a segfault in the full-speed tests, 2 runs in 6), and
    skip() moved consumed to such a head, back where it lay before. Now the ring is left as it is, nothing
    copied past capacity, and a later pass with a head in range takes what is there. (A take with head before
    consumed is left out: before the fix it copied 2**64 - 8 bytes, a crash.)"""
    ring = StagedRing(256, 1, wait=False)
    reader = RingReader(ring, 0, ring.lay)
    for i in range(3):
        assert ring.produce(struct.pack("<Q", i), 0)
    reader.take()
    assert len(flat(reader.take())) == 3 and reader.consumed == 48
    for i in range(3, 5):
        assert ring.produce(struct.pack("<Q", i), 0)
    head = ring._u64(0)
    struct.pack_into("<Q", ring.mem, 0, reader.consumed + (ring.lay.capacity + off if off > 0 else off))
    before = bytes(ring.mem)
    for _ in range(2):
        assert (reader.take() if mode == "take" else reader.skip()) in ([], None)
    assert bytes(ring.mem) == before and reader.consumed == 48 and reader.skipped == 0
    assert all(n <= ring.lay.capacity for call, _, n, _ in ring.device.log() if call == OUT)
    struct.pack_into("<Q", ring.mem, 0, head)
    reader.take()
    assert flat(reader.take()) == [(0, struct.pack("<Q", i)) for i in range(3, 5)] and reader.empty()


def test_a_record_that_runs_past_head_fails_the_reader_and_writes_nothing():
    """A record whose header claims more bytes than head gives it (200 in a 16-byte reservation: the job wrote
    over the ring) cannot be what its producer wrote. Found by review: the pass took it, zeroed the ring past
    the bytes it had copied (past the zeros' capacity bytes for a longer length) and moved consumed past head,
    and the record went on cut to the copy. Now the pass fails with nothing written, and the drain passes
    the ring over unread from then on, so that producers go on."""
    from egpu_preload.errors import EgpuError
    ring = StagedRing(256, 1, wait=False)
    reader = RingReader(ring, 0, ring.lay)
    assert ring.produce(b"first...", 0)
    pos = ring._add(0, 16)
    ring._add(8, 16)
    struct.pack_into("<II", ring.mem, devmaps.HEADER + pos, 200, devmaps.REC_READY)
    before = bytes(ring.mem)
    with pytest.raises(EgpuError, match="runs past its head"):
        reader.take()
        reader.take()
    assert bytes(ring.mem) == before and reader.consumed == 0 and reader.taken == 0
    drain = RingDrain([reader], lambda i, taken: None, idle_s=0.0001).start()
    deadline = time.monotonic() + 10
    while reader.consumed != 32 and time.monotonic() < deadline:
        time.sleep(0.001)
    with pytest.raises(EgpuError, match="runs past its head"):
        drain.stop()
    assert reader.consumed == ring._u64(16) == ring._u64(0) == 32 and reader.skipped == 32


class _Calls:
    """A Driver that logs what ContextMemory asks of it."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []

    def _note(self, what: str) -> None:
        self.log.append((threading.current_thread().name, what))

    def stream(self) -> int:
        return 7

    @contextlib.contextmanager
    def current(self, context: int):
        self._note(f"push {context}")
        yield
        self._note("pop")

    @contextlib.contextmanager
    def capture_relaxed(self):
        self._note("relax")
        yield
        self._note("restore")

    def dtoh_on(self, stream: int, ptr: int, size: int) -> bytes:
        self._note(f"copy {ptr}")
        return bytes(size)


def test_context_memory_entered_sets_the_context_up_once_for_its_block():
    """Inside entered() (nested or not) copies go straight to the driver; outside it, and on other threads
    meanwhile, each copy pushes the context and relaxes capture mode around itself."""
    from egpu_preload.runtime.driver import ContextMemory
    drv = _Calls()
    mem = ContextMemory(drv, 5)
    around = ["push 5", "relax", "copy 2", "restore", "pop"]
    with mem.entered():
        mem.read(1, 8)
        with mem.entered():
            mem.read(1, 8)
        mem.read(1, 8)
        other = threading.Thread(target=mem.read, args=(2, 8), name="other")
        other.start()
        other.join()
    mem.read(2, 8)
    main = threading.current_thread().name
    assert drv.log == [(main, w) for w in ("push 5", "relax", "copy 1", "copy 1", "copy 1")] + \
        [("other", w) for w in around] + [(main, "restore"), (main, "pop")] + [(main, w) for w in around]


def test_the_readers_thread_enters_the_memorys_context_once_for_all_its_passes():
    """The reader's thread holds the copies' context (ContextMemory.entered: current, capture relaxed) from
    its first pass to its last, so that no copy pays a push and a pop of its own; the passes stop() makes
    on the caller's thread enter it per copy, as any other thread does."""
    ring = HostRing(4096, 1, wait=True)
    entries, inside = [], threading.local()

    @contextlib.contextmanager
    def hold():
        entries.append(threading.current_thread().name)
        inside.on = True
        yield
        inside.on = False

    passes = []

    def sink(i, taken):
        passes.append(getattr(inside, "on", False))

    drain = RingDrain([RingReader(ring, 0, ring.lay)], sink, idle_s=0.0001, hold=hold).start()
    for p in range(50):
        assert ring.produce(struct.pack("<Q", p), 0)
        time.sleep(0.0005)
    drain.stop()
    assert entries == ["egpu-ring-drain"] and len(passes) > 2 and all(passes[:-1])


@pytest.mark.parametrize("wait", [True, False], ids=["wait", "drop"])
def test_a_waiting_rings_drops_are_read_once_at_stop(wait):
    """A waiting ring's producers count on their SM's line only records larger than the ring: its passes
    copy the header alone, and stop() reads the lines once, so the count it leaves is exact. A dropping
    ring reads them every pass (the marks it resets live there)."""
    ring = StagedRing(4096, 3, wait=wait)
    reader = RingReader(ring, 0, ring.lay)
    drain = RingDrain([reader], lambda i, taken: None)
    for p in range(5):
        assert ring.produce(struct.pack("<I", p), sm=p % 3)
        drain.drain_once()
    struct.pack_into("<Q", ring.mem, ring.lay.lines_off + 2 * devmaps.LINE + 8, 7)   # SM 2: 7 records too large
    drain.drain_once()
    header, lines = devmaps.HEADER + 8, 3 * devmaps.LINE
    assert (ring.copied(lines) > 0) != wait and (reader.dropped == 7) != wait
    drain.stop()
    assert reader.dropped == 7 and reader.taken == 5
    assert ring.copied(lines) == (1 if wait else ring.copied(header))


def test_a_waiting_rings_drops_are_counted_when_its_last_passes_fail():
    """The lines are read at stop() even when a last pass's copy fails (found by review: the count then
    left out every per-SM drop), and the copy's failure is what stop() raises."""
    ring = StagedRing(4096, 3, wait=True)
    reader = RingReader(ring, 0, ring.lay)
    struct.pack_into("<Q", ring.mem, ring.lay.lines_off + 2 * devmaps.LINE + 8, 7)
    assert ring.produce(b"abcd", sm=0)
    ring.fail_records(700)
    with pytest.raises(DriverError, match="^cuMemcpyDtoHAsync_v2 failed: CUresult 700$"):
        RingDrain([reader], lambda i, taken: None).stop()
    assert reader.dropped == 7


def test_a_reader_whose_copy_fails_frees_its_pinned_memory_and_stop_reports_the_copy():
    """The copy fails while the job runs: the ring is passed over unread from then on, and stop() frees
    the pinned memory and raises the copy's failure, not that of freeing after it."""
    ring = StagedRing(4096, 1, wait=False)
    reader = RingReader(ring, 0, ring.lay)
    ring.fail_records(700, after=1)

    def unpin(buf: memoryview) -> None:
        ring.unpinned.append(buf.obj)
        raise RuntimeError("free failed")

    ring.unpin = unpin
    assert ring.produce(b"first...", 0)
    drain = RingDrain([reader], lambda i, taken: None, idle_s=0.0001).start()
    deadline = time.monotonic() + 10
    while drain.error is None and time.monotonic() < deadline:
        time.sleep(0.001)
    assert ring.produce(b"second..", 0)
    while reader.consumed != ring._u64(0) and time.monotonic() < deadline:
        time.sleep(0.001)
    with pytest.raises(DriverError, match="cuMemcpyDtoHAsync_v2 failed: CUresult 700"):
        drain.stop()
    assert len(ring.pins) == len(ring.unpinned) == 2 and set(map(id, ring.unpinned)) == set(map(id, ring.pins))
    assert reader.skipped == 32 and reader.taken == 0


def test_a_ring_the_driver_has_no_pinned_memory_for_is_read_through_pageable_memory():
    """cuMemHostAlloc refused (a ring of gigabytes): the reader takes every record all the same, through
    memory of its own, and frees nothing it did not get from the driver."""
    from egpu_preload.errors import EgpuError
    ring = StagedRing(4096, 1, wait=False)

    def refused(size: int) -> memoryview:
        raise EgpuError("cuMemHostAlloc failed: CUDA_ERROR_OUT_OF_MEMORY")

    ring.pinned = refused
    reader = RingReader(ring, 0, ring.lay)
    assert ring.produce(b"first...", 0) and ring.produce(b"second..", 0)
    drain = RingDrain([reader], lambda i, taken: None, idle_s=0.0001).start()
    drain.stop()
    assert reader.taken == 2 and reader.empty() and ring.unpinned == []


def test_stop_frees_every_readers_pinned_memory_when_one_free_fails():
    rings = [StagedRing(4096, 1, wait=False) for _ in range(3)]

    def unpin(buf: memoryview) -> None:
        raise RuntimeError("free failed")

    rings[0].unpin = unpin
    readers = [RingReader(r, 0, r.lay) for r in rings]
    for r in rings:
        assert r.produce(b"record..", 0)
    drain = RingDrain(readers, lambda i, taken: None, idle_s=0.0001).start()
    with pytest.raises(RuntimeError, match="free failed"):
        drain.stop()
    assert all(r.taken == 1 for r in readers)
    assert [len(r.unpinned) for r in rings[1:]] == [2, 2]


# ---- the trace file ----------------------------------------------------------------------------------

pa = pytest.importorskip("pyarrow")   # the optional extra egpu[trace]
import pyarrow.parquet as pq  # noqa: E402
import pyarrow.compute  # noqa: E402,F401  (pa.compute: a test run alone found it missing)

from typer.testing import CliRunner  # noqa: E402

from egpu_preload.bpf.compile import compile_probe  # noqa: E402
from egpu_preload.bpf.elf import load_object  # noqa: E402
from egpu_preload.output import tracefile  # noqa: E402
from launcher import egpu  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
MEM_EVENT = struct.Struct("<QQQQIIII3I3I")   # examples/access_trace.bpf.c's struct mem_event


def _example(name: str, tmp_path: Path) -> tuple[prog.BpfObject, prog.Program]:
    """examples/NAME.bpf.c compiled into ``tmp_path`` and loaded; its first program."""
    obj = load_object(compile_probe(EXAMPLES / f"{name}.bpf.c", tmp_path / f"{name}.bpf.o"))
    return obj, obj.programs[0]


@pytest.fixture(scope="module")
def access_trace(tmp_path_factory):
    return _example("access_trace", tmp_path_factory.mktemp("probe"))[0]


def _event(i: int) -> bytes:
    """The record of thread i (blocks of 256) loading 4 bytes at 0x7f0000000000 + 4 i."""
    return MEM_EVENT.pack(1_000_000 + 10 * i, 0x7F0000000000 + 4 * i, 77, 3, i % 5, 4, 1, i % 132,
                          i // 256, 0, 0, i % 256, 0, 0)


def _write_trace(obj, path: Path, n: int) -> None:
    lay = tracefile.record_layout(obj.btf, tracefile.record_struct(obj.btf))
    w = tracefile.TraceWriter(path, [("events", lay), ("raw", None), (tracefile.TRACE_PRINTK, None)])
    for start in range(0, n, 1000):
        w.add(0, [(0, _event(i)) for i in range(start, min(n, start + 1000))])
    w.add(0, [(5, b"short")])            # a record of another size than the struct: kept whole in data
    w.add(1, [(0, b"\x01\x02\x03")])
    fmt = b"x=%d\0"
    w.add(2, [(9, struct.pack("<QQQ", 42, 0, 0) + fmt)])
    w.close({"events": 7, "raw": 0})


def test_the_trace_file_reads_back_with_pyarrow_alone(access_trace, tmp_path):
    """pyarrow, not egpu, reads the file: a row per record, the struct's members as typed columns (arrays
    a column per element), each map's records in order with seq 0, 1, ..., the dropped counts and the
    record types in the metadata."""
    path = tmp_path / "t.parquet"
    _write_trace(access_trace, path, 3000)
    t = pq.read_table(path)
    assert t.num_rows == 3000 + 3
    assert t.schema.field("addr").type == pa.uint64() and t.schema.field("site").type == pa.uint32()
    events = t.filter(pa.compute.equal(t.column("map").cast(pa.string()), "events")).to_pydict()
    assert events["seq"] == list(range(3001))
    assert events["addr"][:3000] == [0x7F0000000000 + 4 * i for i in range(3000)]
    assert events["thread[0]"][:3000] == [i % 256 for i in range(3000)]
    assert events["block[0]"][:3000] == [i // 256 for i in range(3000)]
    assert events["addr"][3000] is None and events["data"][3000] == b"short" and events["cpu"][3000] == 5
    assert events["sm"][:3] == [0, 1, 2]   # the struct's own sm member
    rows = t.to_pylist()
    assert [r["data"] for r in rows if r["map"] == "raw"] == [b"\x01\x02\x03"]
    assert [r["text"] for r in rows if r["map"] == "trace_printk"] == ["x=42"]
    meta = pq.read_metadata(path).metadata
    assert json.loads(meta[b"egpu.dropped"]) == {"events": 7, "raw": 0}
    assert json.loads(t.schema.metadata[b"egpu.record_types"]) == {"events": "struct mem_event"}
    assert path.stat().st_size < 3000 * MEM_EVENT.size // 2   # columnar and compressed


def test_an_arrow_trace_file_reads_back_with_pyarrow_alone(access_trace, tmp_path, monkeypatch):
    """FILE ending in .arrow: an Arrow IPC file with the same rows, types and record types, each map's
    dropped count in its last batch's custom metadata; egpu trace reads it (by its bytes, not its name)
    and converts it to the Parquet form; one never closed reads as far as its batches go."""
    import pyarrow.ipc as ipc
    path = tmp_path / "t.arrow"
    _write_trace(access_trace, path, 3000)
    with pa.memory_map(str(path)) as source:
        reader = ipc.open_file(source)
        t = reader.read_all()
        batch, meta = reader.get_batch_with_custom_metadata(reader.num_record_batches - 1)
    assert t.num_rows == 3000 + 3 and batch.num_rows == 0
    assert json.loads(meta[b"egpu.dropped"]) == {"events": 7, "raw": 0}
    assert json.loads(t.schema.metadata[b"egpu.record_types"]) == {"events": "struct mem_event"}
    assert t.schema.field("addr").type == pa.uint64()
    events = t.filter(pa.compute.equal(t.column("map").cast(pa.string()), "events")).to_pydict()
    assert events["seq"] == list(range(3001)) and events["addr"][:3000] == [0x7F0000000000 + 4 * i for i in range(3000)]
    assert path.stat().st_size < 3000 * MEM_EVENT.size // 2   # compressed
    renamed = tmp_path / "t.bin"
    renamed.write_bytes(path.read_bytes())
    trace = tracefile.read(renamed)
    assert trace.dropped == {"events": 7, "raw": 0} and trace.rows.num_rows == 3003
    res = CliRunner().invoke(egpu, ["trace", str(path), "--parquet", str(tmp_path / "t.parquet")])
    assert res.exit_code == 0, res.output
    converted = pq.read_table(tmp_path / "t.parquet")
    assert converted.to_pylist() == t.to_pylist()
    assert json.loads(pq.read_metadata(tmp_path / "t.parquet").metadata[b"egpu.dropped"]) == {"events": 7, "raw": 0}
    # a job that died before closing its file: the batches written are read, and egpu trace says so
    monkeypatch.setattr(tracefile, "FLUSH_ROWS", 500)   # a batch every 500 records
    _write_trace(access_trace, path, 3000)
    cut = tmp_path / "cut.arrow"
    cut.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
    trace = tracefile.read(cut)
    assert not trace.complete and trace.dropped == {} and 0 < trace.rows.num_rows < 3003
    assert trace.rows.column("seq").to_pylist() == list(range(trace.rows.num_rows))
    unclosed = "its job never closed the trace (died?)"
    res = CliRunner().invoke(egpu, ["trace", str(cut), "--limit", "1"])
    assert res.exit_code == 0 and unclosed in res.stderr and res.stdout.startswith("events #0 ")
    # converted, it stays a trace whose drops are unknown: it read as one closed that lost nothing
    res = CliRunner().invoke(egpu, ["trace", str(cut), "--parquet", str(tmp_path / "cut.parquet")])
    assert res.exit_code == 0, res.output
    trace = tracefile.read(tmp_path / "cut.parquet")
    assert not trace.complete and trace.dropped == {} and 0 < trace.rows.num_rows < 3003
    res = CliRunner().invoke(egpu, ["trace", str(tmp_path / "cut.parquet"), "--limit", "1"])
    assert res.exit_code == 0 and unclosed in res.stderr and res.stdout.startswith("events #0 ")




@pytest.mark.parametrize("name", ["t.ARROW", "t.Feather"])
def test_an_arrow_suffix_in_capitals_is_written_as_arrow_ipc(access_trace, tmp_path, name):
    """The suffix chose the format case by case: T.ARROW was a Parquet file, which pyarrow.ipc and polars'
    read_ipc, sent there by its name, refused."""
    import pyarrow.ipc as ipc
    _write_trace(access_trace, tmp_path / name, 3)
    assert ipc.open_file(str(tmp_path / name)).read_all().num_rows == 3 + 3

@pytest.mark.parametrize("out, why", [("nodir/t.parquet", "No such file or directory"), (".", "Is a directory")])
def test_a_conversion_that_cannot_be_written_says_why_in_one_line(access_trace, tmp_path, out, why):
    """--parquet OUT where OUT cannot be made: the line was pyarrow's message, OUT named twice and its errno in
    brackets ("Failed to open local file '...'. Detail: [errno 2] ..."), unlike --perfetto's."""
    _write_trace(access_trace, tmp_path / "t.arrow", 3)
    target = tmp_path / out
    res = CliRunner().invoke(egpu, ["trace", str(tmp_path / "t.arrow"), "--parquet", str(target)])
    assert (res.exit_code, res.stderr) == (1, f"egpu: {target}: cannot write: {why}\n"), res.output

def test_blocks_of_a_map_with_no_struct_keep_their_bytes(tmp_path):
    """Records of one size from a map whose probe has no record struct go into ``data`` as they were,
    taken as one array (no Python object per record), with their SMs."""
    import numpy as np
    rows = np.arange(5 * 24, dtype=np.uint8).reshape(5, 24)
    w = tracefile.TraceWriter(tmp_path / "raw.parquet", [("raw", None)])
    w.add(0, [Block(np.array([3, 4, 5], np.uint32), rows[:3]), Block(np.array([6, 7], np.uint32), rows[3:])])
    w.close({"raw": 0})
    t = pq.read_table(tmp_path / "raw.parquet").to_pydict()
    assert t["data"] == [bytes(r) for r in rows] and t["cpu"] == [3, 4, 5, 6, 7] and t["seq"] == list(range(5))


def test_egpu_trace_prints_filters_and_converts(access_trace, tmp_path):
    path = tmp_path / "t.parquet"
    _write_trace(access_trace, path, 600)
    run = CliRunner().invoke
    res = run(egpu, ["trace", str(path), "--where", "map=events", "--where", "thread[0]=7", "--limit", "2"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("events #7 cpu=0 ts=1000070 addr=0x7f000000001c")
    assert lines[1].startswith("events #263 ")
    assert "@events: 7 records dropped" in res.stderr
    res = run(egpu, ["trace", str(path), "--json", "--where", "map=raw"])
    assert [json.loads(x) for x in res.stdout.splitlines()] == [{"map": "raw", "seq": 0, "cpu": 0, "data": "010203"}]
    out = tmp_path / "t.json"
    res = run(egpu, ["trace", str(path), "--perfetto", str(out), "--where", "site=2"])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert len([e for e in doc["traceEvents"] if e["ph"] == "i"]) == 120
    for bad, why in ((["--where", "nosuch=1"], "expected FIELD=VALUE"),
                     (["--where", "site=abc"], "'abc' is not a value of site (uint32)"),
                     (["--where", "addr=-1"], "'-1' is not a value of addr (uint64)"),
                     (["--where", "map=evnets"], "no map of that name in the trace (its maps: events, raw, "
                                                  "trace_printk)")):
        res = run(egpu, ["trace", str(path), *bad])
        assert res.exit_code == 1 and why in res.stderr and "Traceback" not in res.output
    res = run(egpu, ["trace", str(tmp_path / "none.parquet")])
    assert res.exit_code == 1 and "none.parquet" in res.stderr
    for both in (["--json", "--perfetto", str(out)], ["--perfetto", str(out), "--parquet", str(tmp_path / "o.parquet")],
                 ["--json", "--parquet", str(tmp_path / "o.parquet")]):   # the second was silently ignored
        res = run(egpu, ["trace", str(path), *both])
        assert res.exit_code == 2 and res.stdout == "" and len(res.stderr.splitlines()) == 1, (both, res.output)
        assert "exclude each other" in res.stderr
    assert not (tmp_path / "o.parquet").exists()


def test_perfetto_keeps_64_bit_fields_exact(tmp_path):
    """The viewers read the Chrome JSON's numbers as doubles: a u64 field of 2**64 - 255 showed as
    18446744073709552000. Beyond 2**53 a field goes as decimal text; up to it, as a number."""
    cols = (tracefile.Column("ts", 0, 8, "u"), tracefile.Column("big", 8, 8, "u"), tracefile.Column("neg", 16, 8, "i"))
    w = tracefile.TraceWriter(tmp_path / "t.arrow", [("r", tracefile.RecordLayout("struct r", 24, cols))])
    w.add(0, [(0, struct.pack("<QQq", 5, (1 << 64) - 255, -(1 << 60))), (0, struct.pack("<QQq", 6, 1 << 53, -7))])
    w.close({"r": 0})
    res = CliRunner().invoke(egpu, ["trace", str(tmp_path / "t.arrow"), "--perfetto", str(tmp_path / "t.json")])
    assert res.exit_code == 0, res.output
    args = [e["args"] for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"] if e["ph"] == "i"]
    assert [(a["big"], a["neg"]) for a in args] == [(str((1 << 64) - 255), str(-(1 << 60))), (1 << 53, -7)]


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_a_trace_of_no_records_says_so(access_trace, tmp_path, suffix):
    """A job whose probes wrote nothing leaves a file of no records: egpu trace printed nothing and exited
    0, as a --where that matched nothing does. It says so, with the maps the file was for."""
    path = tmp_path / f"t{suffix}"
    w = tracefile.TraceWriter(path, [("events", tracefile.record_layout(access_trace.btf,
                                      tracefile.record_struct(access_trace.btf))), ("raw", None)])
    w.close({"events": 0, "raw": 0})
    res = CliRunner().invoke(egpu, ["trace", str(path)])
    assert (res.exit_code, res.stdout) == (0, "")
    assert res.stderr == f"egpu: {path} holds no records (a trace of @events, @raw)\n"
    res = CliRunner().invoke(egpu, ["trace", str(path), "--where", "nosuch=1"])   # a refusal is its one line
    assert res.exit_code == 1 and res.stderr.startswith(f"egpu: {path}: --where nosuch=1: ")
    assert len(res.stderr.splitlines()) == 1, res.stderr


@pytest.mark.parametrize("text, raw", [(pa.string(), pa.binary()), (pa.large_string(), pa.large_binary())])
def test_where_compares_text_and_bytes_of_either_offset_width(tmp_path, text, raw):
    """A trace another tool rewrote with 64-bit offsets (large_string, large_binary) was filtered as if its
    map names and bytes were numbers: "'b' is not a value of map (large_string)"."""
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"map": pa.array(["a", "b"], text), "seq": pa.array([0, 0], pa.uint64()),
                             "data": pa.array([b"\1", b"\2"], raw)}), path)
    for where in ("map=b", "data=02"):
        res = CliRunner().invoke(egpu, ["trace", str(path), "--where", where])
        assert (res.exit_code, res.stdout) == (0, "b #0 data=02\n"), res.output


def test_text_output_keeps_a_record_on_its_line(tmp_path):
    """A printk's text or a string column holding a newline spread one record over several lines, and an ESC
    reached the terminal: text output escapes control characters, but for the newline that ends a printk's text
    (its line ends there, as in trace_pipe; a printk of several probes is their prefix's); --json keeps the text as
    it is (JSON escapes it)."""
    path = tmp_path / "t.parquet"
    text = "two\nlines\tand \x1b[31mred\x85\n"
    pq.write_table(pa.table({"map": ["trace_printk", "events", "p:trace_printk"],
                             "seq": pa.array([0, 0, 0], pa.uint64()), "comm": [None, "a\rb", None],
                             "text": [text, "end\n", "a\n\n"]}), path)
    res = CliRunner().invoke(egpu, ["trace", str(path)])
    assert (res.exit_code, res.stdout) == (0, "trace_printk #0 text=two\\nlines\\tand \\x1b[31mred\\x85\n"
                                              "events #0 comm=a\\rb text=end\\n\n"
                                              "p:trace_printk #0 text=a\\n\n"), res.output
    res = CliRunner().invoke(egpu, ["trace", str(path), "--json"])
    assert [json.loads(line).get("text") for line in res.stdout.splitlines()] == [text, "end\n", "a\n\n"]


@pytest.mark.parametrize("content, why", [(b"", "empty: the job that had it ended (killed?)"),
                                          (b"\x00" * 100, "neither an Arrow IPC file nor a Parquet file"),
                                          (b"PAR1 not really", "a Parquet file never closed (its job killed?)"),
                                          (b"ARROW1 cut", "")])
def test_a_file_that_is_no_trace_says_so_by_name(content, why, tmp_path):
    """Empty, random or cut bytes under either suffix: one line naming the file and what a trace file is,
    not pyarrow's message about a format the user did not ask for. What a killed job leaves (the file it
    claimed, empty; a Parquet file without the footer its close writes) was called neither Arrow nor Parquet."""
    from egpu_preload.errors import EgpuError
    for suffix in (".arrow", ".parquet"):
        path = tmp_path / f"t{suffix}"
        path.write_bytes(content)
        with pytest.raises(EgpuError, match="not a trace file") as e:
            tracefile.read(path)
        assert str(path) in str(e.value) and why in str(e.value)


def test_a_damaged_page_header_is_one_line_of_printable_text(tmp_path):
    """A byte of a Parquet page header flipped: pyarrow's message spans two lines and quotes the byte it
    read ("don't know what type: \\x0f", which switches a terminal's character set); egpu trace printed
    both lines and the byte."""
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"map": ["x"] * 10, "seq": list(range(10))}), path)
    data = bytearray(path.read_bytes())
    data[4] = 0xFF   # the first page header's first byte, just after the magic
    path.write_bytes(data)
    res = CliRunner().invoke(egpu, ["trace", str(path)])
    assert res.exit_code == 1 and res.stdout == "", res.output
    [line] = res.stderr.splitlines()
    assert line.startswith(f"egpu: {path}: not a trace file: ") and line.isprintable(), line


FOREIGN = {"timestamp": pa.array([datetime.datetime(2025, 1, 1)] * 2), "duration": pa.array([1, 2], pa.duration("ns")),
           "decimal": pa.array([decimal.Decimal("1.5")] * 2), "struct": pa.array([{"b": b"\1"}, {"b": b"\2"}])}


def _damaged(kind: str) -> tuple[Any, dict]:
    """(a table, its schema metadata) as a damaged trace file holds them: bytes that are no UTF-8 in a map
    name, a map or seq missing, a column twice, nulls in a column declared without them, metadata that
    is not JSON (nested past Python's recursion limit too) or not egpu's, a column of a type egpu-run
    never writes."""
    names = pa.array(["events", "raw"])
    maps = pa.DictionaryArray.from_arrays(pa.array([0, 1], pa.int32()), names)
    seq, addr = pa.array([0, 1], pa.uint64()), pa.array([5, None], pa.uint64())
    cols, fields = [maps, seq, addr], [pa.field("map", maps.type), pa.field("seq", pa.uint64()),
                                       pa.field("addr", pa.uint64())]
    meta = {tracefile.RECORD_TYPES: json.dumps({"events": "struct ev"})}
    if kind == "utf8":
        bad = pa.Array.from_buffers(pa.string(), 2, [None, pa.py_buffer(struct.pack("<3i", 0, 6, 9)),
                                                     pa.py_buffer(b"events\xff\xfe\x80")])
        cols[0] = pa.DictionaryArray.from_arrays(pa.array([0, 1], pa.int32()), bad)
    elif kind == "null map":
        cols[0] = pa.DictionaryArray.from_arrays(pa.array([0, None], pa.int32()), names)
    elif kind == "twice":
        cols[2], fields[2] = seq, pa.field("seq", pa.uint64())
    elif kind == "not null":
        fields[2] = pa.field("addr", pa.uint64(), nullable=False)
    elif kind == "json":
        meta[tracefile.RECORD_TYPES] = '{"events": '
    elif kind == "not egpu's":
        meta[tracefile.RECORD_TYPES] = '["events"]'
    elif kind == "deep json":
        meta[tracefile.RECORD_TYPES] = "[" * 100_000 + "]" * 100_000
    elif kind in FOREIGN:   # a column egpu-run never writes, which --json (or any output) could not print
        cols[2], fields[2] = FOREIGN[kind], pa.field("addr", FOREIGN[kind].type)
    return pa.Table.from_arrays(cols, schema=pa.schema(fields)), meta


DAMAGES = ("utf8", "null map", "twice", "not null", "json", "not egpu's", "deep json", *FOREIGN)


@pytest.mark.parametrize("kind, suffix", [(k, s) for k in DAMAGES for s in (".arrow", ".parquet")
                                          if (k, s) != ("not null", ".parquet")])
def test_a_damaged_trace_file_says_so_by_name(kind, suffix, tmp_path):
    """A file of the right format whose contents no egpu-run wrote (found by mutating trace files: each
    printed a traceback once, some only halfway through the records): egpu trace names the file and the
    damage, whichever way it prints or converts (Parquet's writer makes no file with nulls in a column
    declared without them)."""
    table, meta = _damaged(kind)
    path = tmp_path / f"t{suffix}"
    if suffix == ".arrow":
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema.with_metadata(meta)) as w:
            w.write_table(table.replace_schema_metadata(meta))
    else:
        pq.write_table(table.replace_schema_metadata(meta), path)
    for more in ([], ["--json"], ["--parquet", str(tmp_path / "o.parquet")], ["--perfetto", str(tmp_path / "o.json")]):
        res = CliRunner().invoke(egpu, ["trace", str(path), *more])
        assert res.exit_code == 1 and "Traceback" not in res.output, (more, res.output)
        assert res.stderr.startswith(f"egpu: {path}: not a trace file"), (more, res.stderr)


def test_a_trace_file_that_is_no_regular_file_is_refused_and_left_alone(tmp_path):
    """FILE is removed and made anew: run as root, egpu-run --trace /dev/null removed /dev/null and put a
    regular file there (a FIFO stands in for the device here); behind a symlink, the link was replaced."""
    from egpu_preload.errors import EgpuError
    fifo = tmp_path / "t.arrow"
    os.mkfifo(fifo)
    with pytest.raises(EgpuError, match="--trace: not a regular file"):
        tracefile.prepare(fifo)
    assert fifo.is_fifo()
    target = tmp_path / "data" / "t.arrow"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "latest.arrow"
    link.symlink_to(target)
    assert tracefile.prepare(link) == target and link.is_symlink() and not target.exists()


# ---- egpu-run --trace against the stand-in driver ------------------------------------------------------

@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_egpu_run_trace_writes_the_file_and_says_what_it_holds(stub_job, probe_obj, tmp_path, suffix):
    """The job's rings drained into FILE, closed at exit with each ring's dropped count (the stand-in's
    kernels run no probe, so it holds none); an old FILE is replaced, not appended to; the job's maps
    are printed as without --trace."""
    from stub_job import egpu_run
    out = tmp_path / f"t{suffix}"
    out.write_text("old")
    r = egpu_run(["--trace", str(out), "-p", str(probe_obj("ringbuf")), str(stub_job.app), "module", "2", "64", "0"],
                 stub_job.env(tmp_path / "log"))
    assert r.returncode == 0, r.stderr
    assert f"egpu-run: 0 records in {out}, none dropped" in r.stderr.splitlines()
    assert "no maps" not in r.stderr and "every map is empty" not in r.stderr   # the rings went to FILE
    trace = tracefile.read(out)
    assert trace.complete and trace.rows.num_rows == 0
    assert trace.rows.column_names == list(tracefile.FIXED)   # its struct is not in its BTF
    assert trace.dropped == {"events": 0, "trace_printk": 0}


@pytest.mark.parametrize("suffix, left, read", [(".parquet", "its records are lost", "a Parquet file never closed"),
                                                (".arrow", "`egpu trace` reads", "empty: ")])
def test_a_trace_file_its_killed_job_never_closed_is_named(stub_job, probe_obj, tmp_path, suffix, left, read):
    """A job SIGTERMed before its exit dump leaves FILE unclosed: egpu-run said nothing of it (only that the
    maps were lost), and egpu trace read it as a file of neither format. Both say what it is."""
    from stub_job import egpu_run
    out = tmp_path / f"t{suffix}"
    r = egpu_run(["--trace", str(out), "-p", str(probe_obj("ringbuf")), str(stub_job.app), "module", "2", "64",
                  "kill"], stub_job.env(tmp_path / "log"))
    assert r.returncode == 128 + 15, r.stderr
    assert f"egpu-run: {out} was never closed (its process ended before its exit dump): {left}" in r.stderr, r.stderr
    res = CliRunner().invoke(egpu, ["trace", str(out)])
    assert res.exit_code == 1 and res.stderr.startswith(f"egpu: {out}: not a trace file: {read}"), res.output


def test_the_trace_file_closes_at_exit_where_the_maps_context_was_destroyed(stub_job, probe_obj, tmp_path):
    """An application that destroys its context before it exits: entering it at exit fails, and the trace was
    finished only inside it, so FILE stayed unclosed (a Parquet file's records lost); and a reader whose last
    pass fails there left it unclosed too. It closes all the same, once, and both failures are said."""
    from stub_job import egpu_run
    out = tmp_path / "t.parquet"
    r = egpu_run(["--trace", str(out), "-p", str(probe_obj("ringbuf")), str(stub_job.app), "module", "2", "64",
                  "destroy"], stub_job.env(tmp_path / "log"))
    assert r.returncode == 0, r.stderr
    failed = "cuCtxPushCurrent_v2 failed: CUDA_ERROR_STUB"
    assert f"egpu-run: 0 records in {out}; the ring reader failed: {failed}; 0 bytes of records after it passed " \
           "over unread" in r.stderr.splitlines(), r.stderr
    assert "never closed" not in r.stderr and f"maps unreadable at exit: {failed}" in r.stderr, r.stderr
    assert tracefile.read(out).complete


# A launch program's records, one per launch, to a ring buffer (a struct with a ts) and to a perf buffer; with
# SHARED a GPU program writes the ring too (the stand-in's kernels run none of it, but its device maps exist).
HOST_RECORDS = """#include "egpu.bpf.h"
struct launch_rec { __u64 ts; __u64 launch_id; __u32 grid; __u32 block; };
struct { __uint(type, BPF_MAP_TYPE_RINGBUF); __uint(max_entries, 1 << 16); } events SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY); __uint(key_size, 4); __uint(value_size, 4); } perf SEC(".maps");
static __noinline void fill(struct launch_rec *r, const struct egpu_ctx *ctx) {   /* puts the struct in BTF */
    *r = (struct launch_rec){ bpf_ktime_get_ns(), ctx->launch_id, ctx->grid[0], ctx->block[0] };
}
SEC("egpu/launch/*") int on_launch(struct egpu_ctx *ctx) {
    struct launch_rec r;
    fill(&r, ctx);
    bpf_ringbuf_output(&events, &r, sizeof(r), 0);
    bpf_perf_event_output(ctx, &perf, BPF_F_CURRENT_CPU, &r, sizeof(r));
    return 0;
}
"""
SHARED = """SEC("kprobe.block/*") int on_block(struct egpu_ctx *ctx) {
    struct launch_rec r = { bpf_ktime_get_ns(), ctx->launch_id, 0, 0 };
    bpf_ringbuf_output(&events, &r, sizeof(r), 0);
    return 0;
}
"""


@pytest.mark.parametrize("shared, vm", [(False, "c"), (True, "c"), (False, "python")],
                         ids=["host-only", "shared-ring", "python-vm"])
def test_host_run_probes_records_go_to_the_trace_file(stub_job, tmp_path, shared, vm):
    """Records a launch program outputs (in C or on the Python VM) go to FILE with the ring's layout, the host
    as CPU 0, counted in the trace line, as GPU records do: they went to the exit dump (hex ``@ring:`` lines,
    or merged into a shared ring's), and FILE was never made where the job had no device maps. egpu trace
    reads them and the Perfetto conversion places each by its ts."""
    from stub_job import egpu_run
    src = tmp_path / "host_records.bpf.c"
    src.write_text(HOST_RECORDS + (SHARED if shared else "") + 'char LICENSE[] SEC("license") = "GPL";\n')
    obj = compile_probe(src, tmp_path / "host_records.bpf.o")
    out = tmp_path / "t.parquet"
    r = egpu_run(["--trace", str(out), "--launch-vm", vm, "-p", str(obj), str(stub_job.app), "module", "2", "64",
                  "0"], stub_job.env(tmp_path / "log"))
    assert r.returncode == 0, r.stderr
    assert f"egpu-run: 4 records in {out}, none dropped" in r.stderr.splitlines(), r.stderr
    assert "@events" not in r.stdout and "@perf" not in r.stdout, r.stdout
    trace = tracefile.read(out)
    rows = trace.rows.to_pylist()
    events = [x for x in rows if x["map"] == "events"]
    assert [(x["seq"], x["cpu"], x["grid"], x["block"]) for x in events] == [(0, 0, 2, 32), (1, 0, 2, 32)]
    assert [x["launch_id"] for x in events] == [x["launch_id"] for x in rows if x["map"] == "perf"]
    assert all(x["ts"] > 0 and x["data"] is None for x in rows)
    assert trace.dropped == {"events": 0, "perf": 0, "trace_printk": 0}
    res = CliRunner().invoke(egpu, ["trace", str(out), "--where", "map=perf"])
    assert res.exit_code == 0 and res.stdout.startswith("perf #0 cpu=0 ts="), res.output
    res = CliRunner().invoke(egpu, ["trace", str(out), "--perfetto", str(tmp_path / "t.json")])
    assert res.exit_code == 0, res.output
    assert len([e for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"] if e["ph"] == "i"]) == 4


# A job that closes every descriptor above stderr after CUDA started, as a daemon does, then opens its own files
# (taking the lowest numbers free), launches again and writes to each file.
DAEMON = """import os, sys
sys.path.insert(0, sys.argv[1])
import app_vec
app_vec.launch("module", 2, 32)
os.closerange(3, 1024)
mine = [os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_APPEND) for _ in range(20)]
app_vec.launch("module", 3, 64)
for fd in mine:
    os.write(fd, b"mine\\n")
"""


def test_a_job_that_closes_every_descriptor_keeps_its_files_its_own_and_the_trace_whole(stub_job, tmp_path):
    """The job's files opened after its close of every descriptor took the numbers of egpu's trace file and spool:
    the trace's footer went into the program's file, and FILE stayed an empty Parquet file said to hold "0 records,
    none dropped". The program's files now hold only its lines, and FILE every launch's record, before the close
    and after it."""
    from stub_job import MORE, egpu_run
    src = tmp_path / "host_records.bpf.c"
    src.write_text(HOST_RECORDS + SHARED + 'char LICENSE[] SEC("license") = "GPL";\n')   # device maps: a spool
    obj = compile_probe(src, tmp_path / "host_records.bpf.o")
    out, mine = tmp_path / "t.parquet", tmp_path / "mine.txt"
    r = egpu_run(["--trace", str(out), "-p", str(obj), sys.executable, "-c", DAEMON, str(MORE), str(mine)],
                 stub_job.env(tmp_path / "log"))
    assert (r.returncode, r.stderr) == (0, f"egpu-run: 10 records in {out}, none dropped\n"), r.stderr
    assert mine.read_bytes() == b"mine\n" * 20
    events = [x for x in tracefile.read(out).rows.to_pylist() if x["map"] == "events"]
    assert [(x["seq"], x["grid"]) for x in events] == [(0, 1), (1, 1), (2, 2), (3, 2), (4, 2)]


# A launch program that prints a line a launch (and outputs nothing to a ring: the trace begins at start all the same).
HOST_PRINTK = """#include "egpu.bpf.h"
SEC("egpu/launch/*") int on_launch(struct egpu_ctx *ctx) {
    bpf_printk("launch %llu grid %u", ctx->launch_id, ctx->grid[0]);
    return 0;
}
char LICENSE[] SEC("license") = "GPL";
"""


@pytest.mark.parametrize("vm", ["c", "python"])
def test_host_programs_printk_lines_go_to_the_trace_file(stub_job, tmp_path, vm):
    """A host program's bpf_printk lines (in C or on the Python VM) go to FILE as the device's do, trace_printk rows
    with their text, the host as CPU 0: they were printed at exit however the job was traced. Without --trace
    they are printed as before."""
    from stub_job import egpu_run
    src = tmp_path / "host_printk.bpf.c"
    src.write_text(HOST_PRINTK)
    obj = compile_probe(src, tmp_path / "host_printk.bpf.o")
    out = tmp_path / "t.parquet"
    job = ["--launch-vm", vm, "-p", str(obj), str(stub_job.app), "module", "2", "64", "0"]
    r = egpu_run(["--trace", str(out), *job], stub_job.env(tmp_path / "log"))
    assert r.returncode == 0, r.stderr
    assert f"egpu-run: 2 records in {out}, none dropped" in r.stderr.splitlines(), r.stderr
    assert "launch 1 grid 2" not in r.stdout, r.stdout
    rows = tracefile.read(out).rows.to_pylist()
    assert [(x["map"], x["seq"], x["cpu"], x["text"]) for x in rows] == [
        ("trace_printk", 0, 0, "launch 1 grid 2"), ("trace_printk", 1, 0, "launch 2 grid 2")]
    r = egpu_run(job, stub_job.env(tmp_path / "log"))
    assert r.returncode == 0, r.stderr
    assert "launch 1 grid 2" in r.stdout and "launch 2 grid 2" in r.stdout, r.stdout


# A launch program that outputs more records a launch than its ring (4 KiB: 102 of 40 bytes) holds.
LOOPING = """#include "egpu.bpf.h"
struct rec { __u64 launch_id; __u64 n; };
struct { __uint(type, BPF_MAP_TYPE_RINGBUF); __uint(max_entries, 4096); } small SEC(".maps");
static __noinline void fill(struct rec *r, const struct egpu_ctx *ctx, __u64 n) {   /* puts the struct in BTF */
    *r = (struct rec){ ctx->launch_id, n };
}
SEC("egpu/launch/*") int on_launch(struct egpu_ctx *ctx) {
    struct rec r;
    for (__u64 i = 0; i < 300; i++) {
        fill(&r, ctx, i);
        bpf_ringbuf_output(&small, &r, sizeof(r), 0);
    }
    return 0;
}
char LICENSE[] SEC("license") = "GPL";
"""


@pytest.mark.parametrize("vm", ["c", "python"])
def test_host_records_past_their_rings_size_wait_for_the_trace_under_on_full_wait(stub_job, tmp_path, vm):
    """The drainer hands host programs' records on after each pass: a ring that one launch (or the launches
    of one pass) outgrew dropped the rest, --on-full wait or not, so a trace said "none lost" only of small
    rings. Under wait a full ring hands its records on first, as the device's waits for the reader."""
    from stub_job import egpu_run
    src = tmp_path / "looping.bpf.c"
    src.write_text(LOOPING)
    obj = compile_probe(src, tmp_path / "looping.bpf.o")
    out = tmp_path / "t.arrow"
    r = egpu_run(["--trace", str(out), "--launch-vm", vm, "-p", str(obj), str(stub_job.app), "module", "2", "32",
                  "0"], stub_job.env(tmp_path / "log"))
    assert r.returncode == 0, r.stderr
    assert f"egpu-run: 600 records in {out}, none dropped" in r.stderr.splitlines(), r.stderr
    rows = tracefile.read(out).rows.to_pylist()
    assert [(x["seq"], x["launch_id"], x["n"]) for x in rows] == [(k, 1 + k // 300, k % 300) for k in range(600)]
    r = egpu_run(["--trace", str(out), "--on-full", "drop", "--launch-vm", vm, "-p", str(obj), str(stub_job.app),
                  "module", "2", "32", "0"], stub_job.env(tmp_path / "log"))
    assert re.search(rf"^egpu-run: \d+ records in {out}, \d+ dropped by the probes \(ring full\)$", r.stderr, re.M), \
        r.stderr


@pytest.mark.parametrize("how", ["c-program", "failed"])
def test_each_image_of_a_process_that_execs_closes_a_trace_file_of_its_own(stub_job, tmp_path, how):
    """exec runs no exit handler: the replaced image left FILE unclosed (a Parquet file without its footer, its
    records lost) and the image after it, under the same pid, took FILE.PID. Each image now finishes its file
    before the exec, its host programs' last records in it, and egpu-run counts every file: the image an exec
    made writes FILE.PID.execN, as does one that goes on after an exec that failed (its closed file stays)."""
    from stub_job import MORE, egpu_run
    from test_egpu_run import EXEC_AFTER_CUDA
    src = tmp_path / "host_records.bpf.c"
    src.write_text(HOST_RECORDS + 'char LICENSE[] SEC("license") = "GPL";\n')
    obj = compile_probe(src, tmp_path / "host_records.bpf.o")
    out = tmp_path / "t.parquet"
    cmd = ([str(stub_job.app), "module", "3", "32", "exec"] if how == "c-program" else
           [sys.executable, "-c", EXEC_AFTER_CUDA, str(MORE), how])
    r = egpu_run(["--trace", str(out), "-p", str(obj), *cmd], stub_job.env(tmp_path / "log"))
    assert r.returncode == 0, r.stderr
    pid = re.search(r"^pid (\d+) before exec 1:", r.stdout, re.M).group(1)
    # launches of each image (two records each): 3, then 1 after the exec; failed: 3, none, 2 between them
    launches = {"c-program": [3, 1], "failed": [3, 0, 2, 1]}[how]
    files = [out] + [tmp_path / f"t.{pid}.exec{n}.parquet" for n in range(1, len(launches))]
    lines = [line for line in r.stderr.splitlines() if " in " in line or "closed" in line]
    assert lines == [f"egpu-run: {2 * k} records in {f}, none dropped"
                     for k, f in zip(launches, files)], r.stderr
    for k, f in zip(launches, files):
        trace = tracefile.read(f)
        assert trace.complete and trace.rows.num_rows == 2 * k, f
    assert sorted(tmp_path.glob("t.*")) == sorted(files)


# A process forked after the trace began: the child lists what it holds of the trace's folder, then exits as Python
# does (its finalizers run); the parent says how much its trace file grew meanwhile (its writer, Parquet, writes
# nothing before 65,536 rows or its close).
FORK_UNDER_TRACE = """import os, sys
sys.path.insert(0, sys.argv[1])
import app_vec
app_vec.launch("module", 2, 32)   # the device maps made: the reader spools beside the trace file
trace = sys.argv[2]
size = os.path.getsize(trace)
pid = os.fork()
if pid == 0:
    fds = [f"/proc/self/fd/{fd}" for fd in os.listdir("/proc/self/fd")]
    held = [os.readlink(f) for f in fds if os.path.lexists(f)]   # listdir's own closed by now
    print("child holds", [h for h in held if h.startswith(os.path.dirname(trace))], flush=True)
    sys.exit(0)
os.waitpid(pid, 0)
print("trace file grew by", os.path.getsize(trace) - size, flush=True)
"""


def test_a_child_forked_under_trace_lets_go_of_its_parents_spool_and_trace_file(stub_job, probe_obj, tmp_path):
    """A child forked after the trace began (after CUDA: it runs no reader nor writer) held its parent's unlinked
    spool, whose disk space stayed in use until the child exited too, and FILE, into which its exit wrote (pyarrow
    closes a Parquet writer it frees: a footer in the middle of the parent's file). It holds neither now, and the
    parent's trace closes whole."""
    from stub_job import MORE, egpu_run
    out = tmp_path / "t.parquet"
    r = egpu_run(["--trace", str(out), "-p", str(probe_obj("ringbuf")), sys.executable, "-c", FORK_UNDER_TRACE,
                  str(MORE), str(out)], stub_job.env(tmp_path / "log"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[:2] == ["child holds []", "trace file grew by 0"], r.stdout
    assert f"egpu-run: 0 records in {out}, none dropped" in r.stderr.splitlines(), r.stderr
    assert tracefile.read(out).complete


@pytest.mark.parametrize("on_full", ["wait", "drop"])
def test_code_loads_wait_for_the_context_while_rings_wait(stub_job, probe_obj, tmp_path, on_full):
    """A kernel in a full waiting ring waits for the reader; a load of code made meanwhile held the driver up
    and the reader's copies with it (cupy on the H200). Once the reader runs, the app's cuModuleGetFunction
    (where lazy loading loads the kernel) comes right after a cuCtxSynchronize under wait, not under drop."""
    from stub_job import egpu_run
    log = tmp_path / "log"
    r = egpu_run(["--trace", str(tmp_path / "t.arrow"), "--on-full", on_full, "-p", str(probe_obj("ringbuf")),
                  str(stub_job.app), "module", "2", "64", "0"], stub_job.env(log))
    assert r.returncode == 0, r.stderr
    # the app's calls: the reader's copies, on its own stream, come in between from its thread
    calls = [line.split(" ", 1)[1] for line in log.read_text().splitlines() if "stream=ours" not in line]
    lookup = next(i for i, c in enumerate(calls) if c.startswith("cuModuleGetFunction"))
    assert calls.index("cuStreamCreate flags=1 ctx=app") < lookup   # the reader's stream: it runs by then
    assert (calls[lookup - 1] == "cuCtxSynchronize ctx=app") == (on_full == "wait"), calls[:lookup + 1]


def test_the_wait_drains_the_maps_context_not_the_callers(stub_job, probe_obj, tmp_path):
    """The kernels that wait for the reader run where the maps are: with no context current in the app,
    the maps went to the device's primary context, and that is the one the wait before a handle's first
    launch synchronizes (pushed for it), not the caller's (none here)."""
    from stub_job import egpu_run
    log = tmp_path / "log"
    r = egpu_run(["--trace", str(tmp_path / "t.arrow"), "--on-full", "wait", "-p", str(probe_obj("ringbuf")),
                  str(stub_job.app), "library", "2", "64", "0"], stub_job.env(log, EGPU_STUB_NO_CONTEXT="1"))
    assert r.returncode == 0 and "result=0" in r.stdout, r.stderr
    # the app's calls: the reader's copies, on its own stream, come in between from its thread
    calls = [line.split(" ", 1)[1] for line in log.read_text().splitlines() if "stream=ours" not in line]
    first = next(i for i, c in enumerate(calls) if c.startswith("cuLaunchKernel"))
    assert calls[first - 1] == "cuCtxSynchronize ctx=primary", calls[:first + 1]


def test_code_loaded_while_a_stream_captures_does_not_wait_even_when_rings_wait(stub_job, probe_obj, tmp_path):
    """A synchronize while a stream captures in global mode is refused and ends the capture: the app that
    loads and launches its kernel into a capture (cudart's lazy loading) gets no wait from egpu, rings or
    not, and its graph is made."""
    from stub_job import egpu_run
    log = tmp_path / "log"
    r = egpu_run(["--trace", str(tmp_path / "t.arrow"), "--on-full", "wait", "-p", str(probe_obj("ringbuf")),
                  str(stub_job.app), "capture", "2", "64", "0"], stub_job.env(log))
    assert r.returncode == 0 and "result=0" in r.stdout, r.stderr
    calls = [line.split(" ", 1)[1] for line in log.read_text().splitlines()]
    begin = next(i for i, c in enumerate(calls) if c.startswith("cuStreamBeginCapture"))
    end = next(i for i, c in enumerate(calls) if c.startswith("cuStreamEndCapture"))
    assert not [c for c in calls[begin:end] if c.startswith("cuCtxSynchronize")], calls[begin:end]
    assert any(c.startswith("cuLaunchKernel") for c in calls[begin:end])


# The reader through runtime/driver.py in a process of its own (loaded into pytest's, the stand-in would be
# the libcuda.so.1 of every later test there): three records in a ring the stand-in's memory holds.
THROUGH_THE_DRIVER = """
import struct, sys
import cffi
from egpu_preload.runtime import ring_drain
from egpu_preload.runtime.driver import ContextMemory, Driver
from egpu_preload.runtime.ring_drain import RingDrain, RingReader
from egpu_preload.translate import devmaps
from conftest import shim_api_of

ffi = cffi.FFI()
ffi.cdef("void *dlopen(const char *, int); void *dlsym(void *, const char *);")
libc = ffi.dlopen(None)
cuda = libc.dlopen(sys.argv[1].encode(), 2)   # RTLD_NOW
c_walk = shim_api_of(sys.argv[2])   # the walk's C, as inside a job
ring_drain._shim = lambda: c_walk


class Shim:   # egpu_shim_real: the driver's own symbols; egpu_copy_out: the shim's C, as inside a job
    egpu_copy_out = c_walk[1].egpu_copy_out

    def egpu_shim_real(self, symbol):
        return libc.dlsym(cuda, symbol)


driver = Driver(ffi, Shim())
mem = ContextMemory(driver, driver.maps_context())
lay = devmaps.MapLayout("ringbuf", capacity=4096)
addr = mem.alloc(lay.region_size(2))
mem.write(addr, devmaps.ring_image(lay, 2))
mem.write(addr + devmaps.HEADER, b"".join(struct.pack("<II", 8, devmaps.REC_READY | 1 << 8) + b"record%02d" % i
                                          for i in range(3)))
mem.write(addr, struct.pack("<QQ", 48, 48))
got = []
reader = RingReader(mem, addr, lay)
RingDrain([reader], lambda i, taken: got.extend(taken)).stop()
print(got)
print(*(0 < reader.in_driver[p] <= reader.phases[p] for p in ("header", "copy")))
"""


def test_the_reader_copies_into_pinned_memory_through_the_driver(stub_job, tmp_path):
    """runtime/driver.py's pinned memory and copies into it against the stand-in driver: the headers and the
    records come through two buffers cuMemHostAlloc made (the header's at the first pass, the records' at
    the first with records), a copy per pass on the runtime's stream in the maps' context, and stop() frees
    them; the time inside the driver's calls is counted, within its phase's."""
    log = tmp_path / "log"
    r = subprocess.run([sys.executable, "-c", THROUGH_THE_DRIVER, str(stub_job.driver_dir / "libcuda.so.1"),
                        str(stub_job.shim)], env=stub_job.env(log, PYTHONPATH=f"{ROOT}:{ROOT / 'tests'}"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    # the records, then the time inside the driver's calls: some, within its phase's
    assert r.stdout == "[(1, b'record00'), (1, b'record01'), (1, b'record02')]\nTrue True\n"
    calls = [line.split(" ", 1)[1] for line in log.read_text().splitlines()]
    staged = [c for c in calls if c.startswith(("cuMemHostAlloc", "cuMemFreeHost", "cuMemcpyDtoHAsync_v2 size=48"))]
    copy = "cuMemcpyDtoHAsync_v2 size=48 stream=ours ctx=app"
    assert staged == ["cuMemHostAlloc"] * 2 + [copy] * 2 + ["cuMemFreeHost"] * 2
    headers = {c for c in calls if c.startswith("cuMemcpyDtoH") and f" size={devmaps.HEADER + 8} " in c}
    assert headers == {f"cuMemcpyDtoHAsync_v2 size={devmaps.HEADER + 8} stream=ours ctx=app"}


def test_on_full_wait_without_a_reader_is_refused(stub_job, probe_obj, tmp_path):
    """Nobody would make room in a waiting ring: the job never starts."""
    from stub_job import egpu_run
    r = egpu_run(["--on-full", "wait", "-p", str(probe_obj("ringbuf")), str(stub_job.app), "module", "1", "32", "0"],
                 stub_job.env(tmp_path / "log"))
    assert r.returncode == 125 and r.stdout == ""
    assert r.stderr == "egpu-run: --on-full wait needs --trace FILE: only its reader makes room while kernels run\n"


def test_the_reader_expands_a_record_type_through_its_hook(access_trace, tmp_path):
    """A record type's expander (a warp-level record into per-lane rows) sees only that type's rows and
    its rows replace them; other maps' rows stay as they are."""
    path = tmp_path / "t.parquet"
    _write_trace(access_trace, path, 10)
    seen = []

    def twice(rows):
        seen.append(rows.num_rows)
        return pa.concat_tables([rows, rows])

    trace = tracefile.read(path, {"struct mem_event": twice})
    maps = trace.rows.column("map").cast(pa.string()).to_pylist()
    assert seen == [11] and maps.count("events") == 22 and maps.count("raw") == 1



class Arena(HostMemory):
    """Device memory for DeviceMaps and the reader alike: one bytearray, addresses are its offsets."""

    def __init__(self, size: int) -> None:
        self.mem, self.top = bytearray(size), 0

    def alloc(self, n: int) -> int:
        self.top, at = self.top + devmaps.round8(n), self.top
        assert self.top <= len(self.mem)
        return at

    def free(self, ptr: int) -> None:
        pass

    htod, dtoh = HostMemory.write, HostMemory.read


def test_streaming_drains_a_jobs_rings_into_the_trace_file(access_trace, tmp_path):
    """What the runtime does under --trace, on device maps in host memory: the probe's ring (made to
    wait, 4 KiB) written by four producers while the reader runs, every record in the file in each
    producer's order, none dropped, and the counts the dump reports."""
    from egpu_preload.maps import MapsState
    from egpu_preload.runtime.probes import Probe
    from egpu_preload.runtime.streaming import Streaming
    maps = [dataclasses.replace(m, max_entries=4096, wait=True) if m.type == prog.MAP_RINGBUF else m
            for m in access_trace.maps]
    obj = dataclasses.replace(access_trace, maps=maps)
    arena = Arena(8 << 20)
    device = devmaps.DeviceMaps(arena, MapsState(obj.maps), 4)
    index = next(i for i, m in enumerate(maps) if m.name == "events")
    ring = HostRing(4096, 4, True, arena.mem, device.addrs[index])
    out = tmp_path / "t.parquet"
    streaming = Streaming(out, [Probe(Path("access_trace.bpf.o"), obj, (), "t")], [device], arena)

    def producer(p: int) -> None:
        for i in range(p, 4000, 4):
            ring.produce(_event(i), sm=p)

    threads = [threading.Thread(target=producer, args=(p,)) for p in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report = streaming.finish()
    pace = report.pop("drain")
    assert report == {"path": str(out), "records": 4000, "dropped": 0, "error": None, "stall_s": 10.0}
    # every record copied out at least once (twice where a pass saw it before the next took it) and taken once,
    # and the phases of a reader that ran: time spent copying and scanning (memcpy here: less than the report's
    # ms), the writer's too
    assert pace["taken_bytes"] == 4000 * 80 and pace["passes"] > 0
    assert pace["copied_bytes"] >= pace["taken_bytes"] + pace["unwalked_bytes"]
    assert all(sum(r.phases[p] for r in streaming.readers) > 0 for p in ("copy", "scan")) and pace["write_s"] > 0
    from egpu_preload.runtime import streaming as streaming_mod
    first, second = streaming_mod.notes([{"trace": report | {"drain": pace}}])
    assert first.endswith("4,000 records in " + str(out) + ", none dropped")
    assert f"drained in {pace['passes']:,} passes" in second and "copy " in second and "writer " in second
    t = pq.read_table(out).to_pydict()
    assert t["map"] == ["events"] * 4000 and t["seq"] == list(range(4000))
    for p in range(4):
        assert [a for a, c in zip(t["addr"], t["cpu"]) if c == p] == [0x7F0000000000 + 4 * i for i in range(p, 4000, 4)]



def _one_waiting_ring(access_trace, out: Path, lazy: bool = False):
    """access_trace's ring made to wait (4 KiB, one SM) in host memory, and the Streaming that drains it (``lazy``:
    through HostCopies' lazy copies, a burst's pass copying in pieces)."""
    from egpu_preload.maps import MapsState
    from egpu_preload.runtime.probes import Probe
    from egpu_preload.runtime.streaming import Streaming
    maps = [dataclasses.replace(m, max_entries=4096, wait=True) if m.type == prog.MAP_RINGBUF else m
            for m in access_trace.maps]
    obj = dataclasses.replace(access_trace, maps=maps)
    arena = Arena(8 << 20)
    arena.lazy = lazy
    device = devmaps.DeviceMaps(arena, MapsState(obj.maps), 1)
    ring = HostRing(4096, 1, True, arena.mem, device.addrs[next(i for i, m in enumerate(maps) if m.name == "events")])
    arena.copies()   # the stand-in driver made before the reader's thread, which a test may tell to fail
    ring.probe, ring.index = Probe(Path("a.bpf.o"), obj, (), "t"), device.addrs.index(ring.base)
    return ring, Streaming(out, [ring.probe], [device], arena)


def _nice(tid: int) -> int:
    """The nice value of this process's thread ``tid`` (proc(5): /proc/PID/task/TID/stat, field 19)."""
    stat = Path(f"/proc/self/task/{tid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[16])


def test_the_writer_runs_at_the_lowest_priority_and_no_other_thread_does(access_trace, tmp_path):
    """The writer's encoding lags the reader and catches up at exit: its thread (and so the pyarrow threads it
    starts) gives the CPUs to the reader's passes, the spool's writes and the job's threads. The job's own threads
    keep their priority, the reader's too."""
    ring, streaming = _one_waiting_ring(access_trace, tmp_path / "t.arrow")
    for i in range(100):
        ring.produce(_event(i), sm=0)
    threads = {t.name: t.native_id for t in threading.enumerate()}
    writer = threads["egpu-trace-writer"]
    deadline = time.monotonic() + 10
    while _nice(writer) != 19 and time.monotonic() < deadline:   # the thread lowers its own on its start
        time.sleep(0.01)
    try:
        assert _nice(writer) == 19
        assert _nice(threading.get_native_id()) == _nice(threads["egpu-ring-drain"]) == os.getpriority(
            os.PRIO_PROCESS, 0) != 19
    finally:
        assert streaming.finish()["records"] == 100


def test_a_trace_that_cannot_be_written_still_drains_the_rings(access_trace, tmp_path, capsys):
    """A writer that fails (a full disk) must not stop the reader, or a waiting ring would stop the job:
    every record is still taken, and the counts say how many did not reach the file; the writer says why at once,
    naming the file."""
    import os
    ring, streaming = _one_waiting_ring(access_trace, tmp_path / "t.parquet")

    def full(index, records):
        raise OSError(28, "No space left on device")

    streaming.writer.add = full
    for i in range(1000):   # 80 KB through a 4 KiB ring: only a reader that keeps taking lets this end
        ring.produce(_event(i), sm=0)
    report = streaming.finish()
    assert report["records"] == 0 and report["dropped"] == 0
    assert report["error"] == ("cannot write the trace: [Errno 28] No space left on device "
                               "(1,000 records taken and not written)")
    assert capsys.readouterr().err.splitlines() == [
        f"egpu[{os.getpid()}]: {tmp_path / 't.parquet'}: cannot write the trace: [Errno 28] No space left on device"]


def test_an_arrow_trace_writes_what_it_holds_once_it_is_a_moment_old(access_trace, tmp_path, monkeypatch):
    """A job killed mid-trace keeps, in an Arrow IPC file, the batches written: records were written only once
    FLUSH_ROWS of a ring had built up, so a killed job lost up to that many a ring, for as long as it ran.
    Records held FLUSH_S are written whether more come or not."""
    monkeypatch.setattr(tracefile, "FLUSH_S", 0.2, raising=False)
    out = tmp_path / "t.arrow"
    ring, streaming = _one_waiting_ring(access_trace, out)
    for i in range(10):
        ring.produce(_event(i), sm=0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and streaming.writer.written < 10:
        time.sleep(0.05)
    assert streaming.writer.written == 10
    trace = tracefile.read(out)   # as a killed job leaves it: never closed
    assert not trace.complete and trace.rows.column("addr").to_pylist() == [0x7F0000000000 + 4 * i for i in range(10)]
    assert streaming.finish()["records"] == 10


def test_the_reader_never_waits_for_a_writer_that_lags(access_trace, tmp_path):
    """The reader spools what it takes (an unlinked file beside the trace file) rather than waiting for the
    writer: 5,000 records through a 4 KiB ring made to wait are all taken while the writer is held up (as by a
    job's threads that keep the GIL), and reach the file once it goes on."""
    ring, streaming = _one_waiting_ring(access_trace, tmp_path / "t.parquet")
    held, add = threading.Event(), streaming.writer.add

    def lagging(index, taken):
        held.wait(60)
        add(index, taken)

    streaming.writer.add = lagging
    done = threading.Event()

    def producer() -> None:
        for i in range(5000):   # some 400 passes' records, far past the writer's queue of QUEUED batches
            ring.produce(_event(i), sm=0)
        done.set()

    threading.Thread(target=producer, daemon=True).start()
    finished = done.wait(30)
    held.set()
    assert finished, "the producers waited on a reader that waited on the writer"
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]   # the spool has no name
    report = streaming.finish()
    assert report["records"] == 5000 and report["error"] is None
    assert tracefile.read(tmp_path / "t.parquet").rows.column("seq").to_pylist() == list(range(5000))


def test_a_writer_behind_a_reader_that_never_pauses_still_writes_what_is_a_moment_old(access_trace, tmp_path,
                                                                                       monkeypatch):
    """A writer that reads the spool back slower than the reader appends to it (each batch 5 ms, a chunk a
    millisecond) still goes back to its queue and its flushes between reads: an Arrow IPC file holds the records
    FLUSH_S old while the job runs. Reading back until the spool was caught up, it wrote none for as long as the
    job kept the reader ahead."""
    monkeypatch.setattr(tracefile, "FLUSH_S", 0.2, raising=False)
    out = tmp_path / "t.arrow"
    ring, streaming = _one_waiting_ring(access_trace, out)
    add = streaming.writer.add

    def slow(index, taken):
        time.sleep(0.005)
        add(index, taken)

    streaming.writer.add = slow
    done = threading.Event()

    def producer() -> None:
        i = 0
        while not done.is_set():
            ring.produce(_event(i), sm=0)
            i += 1
            time.sleep(0.001)

    threading.Thread(target=producer, daemon=True).start()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and not streaming.writer.written:
        time.sleep(0.05)
    written = streaming.writer.written
    done.set()
    report = streaming.finish()
    assert written, "nothing written while the reader stayed ahead of the writer"
    assert report["error"] is None and report["records"] == tracefile.read(out).rows.num_rows


def test_a_drain_stopped_as_its_first_burst_begins_stops_at_once(shim_api, tmp_path, monkeypatch):
    """stop() sets the C burst's flag: one made only as the first burst began (from a Python flag stop() may
    have set just before) lost that stop, and the burst ran its BURST_S out. Here the first burst's flag is made
    only once stop() has begun (on the drain's thread, were it made there)."""
    from egpu_preload.runtime import ring_drain
    ffi, lib = shim_api
    monkeypatch.setattr(ring_drain, "BURST_S", 5.0)
    drain: RingDrain | None = None
    making = threading.Event()

    class LateFlag:
        def __getattr__(self, name):
            return getattr(ffi, name)

        def new(self, ctype, *init):
            if ctype == "int *" and threading.current_thread().name == "egpu-ring-drain":
                making.set()
                drain._stop.wait()
                time.sleep(0.05)   # stop() has set the flag it knew of
            return ffi.new(ctype, *init)

    monkeypatch.setattr(ring_drain, "_shim", lambda: (LateFlag(), lib))
    ring = HostRing(1024, 1, wait=True)
    ring.copies()   # the stand-in driver built before the drain's thread needs it
    drain = RingDrain([RingReader(ring, 0, ring.lay)], lambda i, taken: None, spool=Spool(tmp_path / "t.parquet"))
    drain.start()
    making.wait(0.5)
    t = time.monotonic()
    drain.stop()
    assert time.monotonic() - t < 1, "the first burst ran on past stop()"
    drain.spool.close()


def _chunk(index: int, *data: bytes) -> bytes:
    """A spool's chunk (shim/egpu_drain.h egpu_spool) of ring ``index``: records of ``data`` from SM 3, as a ring
    holds them."""
    body = b"".join(struct.pack("<II", len(d), devmaps.REC_READY | 3 << 8) + d.ljust(devmaps.round8(len(d)), b"\0")
                    for d in data)
    return struct.pack("<IIQ", index, 0, len(body)) + body


def test_a_spool_gives_back_to_the_disk_what_was_read_back(tmp_path, monkeypatch):
    """The spool's bytes the writer has read back are given back to the disk (a hole punched, GIVE_BACK at a
    time), while what comes after still reads back whole: a trace's spool holds about what the writer lags by,
    where it held every record's raw bytes until the job's exit."""
    import os
    from egpu_preload.runtime import spool as spool_mod
    monkeypatch.setattr(spool_mod, "GIVE_BACK", 64 << 10)
    spool = Spool(tmp_path / "t.parquet", files=2)
    got = []
    for lap in range(2):
        chunks = [_chunk(0, bytes([lap, k]) * 8000) for k in range(64)]   # 1 MB, dealt to the two files in turn
        for f in range(2):
            os.write(spool.held[f].fd, b"".join(chunks[f::2]))
            spool.c.end[f] += sum(map(len, chunks[f::2]))
        while spool.pending():
            got += [r for _, taken in spool.taken() for r in flat(taken)]
    list(spool.taken())
    assert got == [(3, bytes([lap, k]) * 8000) for lap in range(2) for k in range(64)]
    for f in range(2):
        assert spool.given_back[f] == spool.c.end[f] // (64 << 10) * (64 << 10) > 0
        assert os.fstat(spool.held[f].fd).st_blocks * 512 <= 2 * (64 << 10) < spool.c.end[f]
    spool.close()


def test_a_spool_is_read_back_a_bounded_piece_at_a_time(tmp_path, monkeypatch):
    """Spool.taken hands on READ bytes of whole chunks at most a call (a chunk larger than READ alone, whole), in
    the order taken (dealt to the two files in turn), and nothing of bytes past a file's ``end`` (a chunk still
    being written), nor of a chunk after one not yet whole."""
    import os
    from egpu_preload.runtime import spool as spool_mod
    monkeypatch.setattr(spool_mod, "READ", 64)
    spool = Spool(tmp_path / "t.parquet", files=2)
    chunks = [_chunk(0, b"a" * 8), _chunk(1, b"b" * 100), _chunk(0, b"c" * 8, b"d" * 5), _chunk(1, b"e"),
              _chunk(0, b"f")]
    for f in range(2):
        os.write(spool.held[f].fd, b"".join(chunks[f::2]))
    spool.c.end[0] = sum(map(len, chunks[0:5:2]))
    spool.c.end[1] = len(chunks[1])   # chunk 3 not yet whole: chunk 4, whole, waits behind it
    calls = []
    while spool.pending():
        calls.append([(i, flat(taken)) for i, taken in spool.taken()])
    assert calls == [[(0, [(3, b"a" * 8)])], [(1, [(3, b"b" * 100)])], [(0, [(3, b"c" * 8), (3, b"d" * 5)])]]
    assert spool.read_at == [len(chunks[0]) + len(chunks[2]), spool.c.end[1]] and list(spool.taken()) == []
    spool.c.end[1] += len(chunks[3])
    assert [(i, flat(taken)) for i, taken in spool.taken()] == [(1, [(3, b"e")]), (0, [(3, b"f")])]
    assert spool.read_at == list(spool.c.end)[:2] and not spool.pending()
    spool.close()


def test_a_forked_child_closes_its_parents_spool_and_the_parent_reads_it_back_whole(access_trace, tmp_path):
    """A child forked while the trace runs closes the spool's descriptor it was forked with (the space is the
    parent's to give back) and holds nothing of the trace's folder; the parent's spool reads back whole after the
    child has gone, every record in the file."""
    import os
    ring, streaming = _one_waiting_ring(access_trace, tmp_path / "t.parquet")
    spool = streaming.spool
    for i in range(100):
        ring.produce(_event(i), sm=0)
    pid = os.fork()
    if pid == 0:
        fds = [f"/proc/self/fd/{fd}" for fd in os.listdir("/proc/self/fd")]
        held = [os.readlink(f) for f in fds if os.path.lexists(f)]
        os._exit(0 if (streaming.spool, {h.fd for h in spool.held}, set(spool.c.fd[0:spool.files]), streaming.writer)
                 == (None, {-1}, {-1}, None)
                 and not [h for h in held if h.startswith(str(tmp_path))] else 1)
    assert os.waitpid(pid, 0)[1] == 0, "the child held the parent's spool or trace file"
    assert streaming.spool is spool and all(h.ours() for h in spool.held)
    for i in range(100, 1000):
        ring.produce(_event(i), sm=0)
    report = streaming.finish()
    assert (report["records"], report["error"]) == (1000, None)
    assert tracefile.read(tmp_path / "t.parquet").rows.num_rows == 1000


def _numbered(ring: int, n: int) -> tuple[list[tuple[int, bytes]], Any, Any]:
    """``n`` records of ring ``ring`` (its index, their number, 0-32 bytes of padding; from SM 1) as records,
    and as the ring holds them with where each starts (for HostCopies.produce)."""
    import numpy as np
    records = [(1, struct.pack("<II", ring, k) + bytes(8 * (k % 5))) for k in range(n)]
    held = b"".join(struct.pack("<II", len(d), devmaps.REC_READY | 1 << 8) + d for _, d in records)
    starts = np.cumsum([0] + [8 + len(d) for _, d in records], dtype=np.int64)
    return records, starts, np.frombuffer(held, np.uint8)


def _producing(ring: HostRing, starts: Any, data: Any) -> threading.Thread:
    """A thread that writes the records of ``data`` into ``ring`` at full speed (HostCopies.produce: in C, the GIL
    let go, waiting for room as the GPU's producers do), started."""
    ring.copies()
    thread = threading.Thread(target=ring.device.produce, args=(ring.base, starts, data, ring.lay.capacity))
    thread.start()
    return thread


def _drained(rings: list[HostRing], streams: list[tuple[Any, Any, Any]], spool: Any) -> RingDrain:
    """Each stream's records (_numbered's) written into its ring at full speed and drained into ``spool`` until
    every producer is done; the drain, stopped."""
    producers = [_producing(ring, starts, data) for ring, (_, starts, data) in zip(rings, streams)]
    drain = RingDrain([RingReader(ring, 0, ring.lay) for ring in rings], lambda i, taken: None, idle_s=0.0001,
                      spool=spool).start()
    for t in producers:
        t.join()
    drain.stop()
    return drain


def _chunks(spooled: bytes) -> list[tuple[int, bytes]]:
    """(ring index, records' bytes) of each whole chunk of ``spooled`` (shim/egpu_drain.h egpu_spool)."""
    from egpu_preload.runtime.spool import HEAD
    out, at = [], 0
    while at < len(spooled):
        index, zero, n = HEAD.unpack_from(spooled, at)
        assert zero == 0 and at + HEAD.size + n <= len(spooled)
        out.append((index, spooled[at + HEAD.size:at + HEAD.size + n]))
        at += HEAD.size + n
    return out


def _records_of(chunks: list[tuple[int, bytes]], rings: int) -> list[list[tuple[int, bytes]]]:
    """Each ring's records in the chunks, in the order the chunks hold them."""
    from egpu_preload.runtime.ring_drain import records_in
    out: list[list[tuple[int, bytes]]] = [[] for _ in range(rings)]
    for index, body in chunks:
        out[index] += flat(records_in(memoryview(body)))
    return out


def _piped() -> tuple[Any, int]:
    """A spool (its struct egpu_spool alone, as RingDrain uses it) into a pipe of 4 KiB, which a writer fills
    before a reader takes anything; the pipe's read end."""
    import fcntl
    import os
    from egpu_preload.runtime import ring_drain
    spool = types.SimpleNamespace(c=ring_drain._shim()[0].new("struct egpu_spool *"), files=1,
                                  lost=lambda: None)
    out, spool.c.fd[0] = os.pipe()
    spool.c.files = 1
    fcntl.fcntl(spool.c.fd[0], fcntl.F_SETPIPE_SZ, 4096)
    _known(spool)
    return spool, out


def _known(spool: Any) -> None:
    """Each of a bare struct egpu_spool's files made known by its st_dev, st_ino, as Spool makes them: the C writes
    to a file only while its descriptor holds it."""
    for f in range(spool.c.files):
        spool.c.dev[f], spool.c.ino[f] = identity(spool.c.fd[f])


@pytest.mark.parametrize("files, burst_s", [(1, 1.0), (4, 1.0), (4, 0.003)])
def test_a_slow_spool_gets_every_record_once_and_in_order_while_the_passes_go_on(files, burst_s, monkeypatch):
    """Three rings made to wait, each filled at full speed, drained into a spool of ``files`` files that take their
    bytes slowly (each a pipe of 4 KiB, read 4 KiB at a time at its own pace): a ring's passes copy into one stage
    while the others' chunks are written, and a pass that copied into a stage still being written would change a
    chunk mid-write. Short bursts start each on a chunk number no multiple of four (each file's count of the
    spool's chunks is taken up anew at a burst's start). Chunk g, the (g // files)-th of file g % files, put back
    in that order, gives every ring's records once and in order, in whole chunks that each file's ``end`` counts;
    the passes' wait for the writes and the writes' own time are counted apart."""
    import fcntl
    import os
    from egpu_preload.runtime import ring_drain
    monkeypatch.setattr(ring_drain, "BURST_S", burst_s)
    rings = [HostRing(4096, 2, wait=True) for _ in range(3)]
    streams = [_numbered(r, 8000) for r in range(3)]
    spool = types.SimpleNamespace(c=ring_drain._shim()[0].new("struct egpu_spool *"), files=files,
                                  lost=lambda: None)
    spool.c.files = files
    outs, spooled = [], [bytearray() for _ in range(files)]
    for f in range(files):
        out, spool.c.fd[f] = os.pipe()
        fcntl.fcntl(spool.c.fd[f], fcntl.F_SETPIPE_SZ, 4096)
        outs.append(out)
    _known(spool)

    def slowly(f: int) -> None:
        while chunk := os.read(outs[f], 4096):
            spooled[f].extend(chunk)
            time.sleep(0.001 / files * (f + 1))

    reading = [threading.Thread(target=slowly, args=(f,)) for f in range(files)]
    for t in reading:
        t.start()
    try:
        drain = _drained(rings, streams, spool)
    finally:
        for f in range(files):
            os.close(spool.c.fd[f])
        for t in reading:
            t.join()
        for out in outs:
            os.close(out)
    per_file = [_chunks(bytes(s)) for s in spooled]
    assert [len(s) for s in spooled] == list(spool.c.end)[:files]
    assert sum(map(len, per_file)) == spool.c.chunks > 3 * 8000 * 32 // 4096
    ordered = [per_file[g % files][g // files] for g in range(spool.c.chunks)]
    assert _records_of(ordered, 3) == [records for records, _, _ in streams]
    assert drain.spool_write_s > 0 and drain.phases["hand_off"] > 0


def test_a_burst_walks_each_piece_of_its_copy_only_once_it_has_landed(tmp_path):
    """Copies that land only when waited for (HostCopies lazy: the stage keeps what it held until the stream, or an
    event recorded after the copy, is waited for): a burst's passes copy what they walk in pieces, an event after
    each, walk a piece once it has landed, and wait for every copy before the spool touches the stage. A walk that
    ran ahead of its copy would read the stage's last pass: records lost, repeated or out of order. Two rings of 4 MiB
    filled at full speed, for several laps each, into a spool of two files, their producers moving head before they
    write (as the GPU's take their positions first), so that the walks meet records not complete yet below head."""
    import os
    rings = [HostRing(4 << 20, 2, wait=True) for _ in range(2)]
    for ring in rings:
        ring.lazy = True
    streams = [_numbered(r, 500_000) for r in range(2)]
    spool = Spool(tmp_path / "t.arrow", files=2)
    for ring in rings:
        ring.copies()
        ring.device.state.head_first = 1
    try:
        _drained(rings, streams, spool)
        per_file = [_chunks(os.pread(fd, spool.c.end[f], 0)) for f, fd in enumerate(h.fd for h in spool.held)]
    finally:
        spool.close()
    ordered = [per_file[g % 2][g // 2] for g in range(spool.c.chunks)]
    assert _records_of(ordered, 2) == [records for records, _, _ in streams]
    assert max(len(body) for _, body in ordered) > 1 << 20, "no pass took more than one piece (PIECE_MIN) of records"


@pytest.mark.parametrize("wait", [True, False], ids=["wait", "drop"])
@pytest.mark.parametrize("head_first", [0, 1], ids=["written_first", "head_first"])
@pytest.mark.parametrize("counts", [1, 0], ids=["counted", "uncounted"])
def test_a_burst_takes_counted_records_once_unwalked_and_in_order(tmp_path, counts, head_first, wait):
    """Producers that count the bytes they commit on an SM's line (devmaps.py COMMITTED) and mark the data's start
    where a record crosses a lap's end (REC_WRAP), as the GPU's do: a burst's pass that reads lines summing to head
    copies [consumed, head) once and walks none of it, finding the records after the wrap where the mark says. Two
    rings of 64 KiB, many laps of mixed sizes (so that records cross the end), copies that land only when waited
    for: every record once and in order; the passes that took records whole copied them once. Producers that count
    nothing leave every pass walking. With head moved before the records are written (as the GPU's producers take
    their positions first), passes meet counts short of head: they read again, or walk. A dropping ring's passes
    read its lines (its SMs' marks) every pass either way (these producers wait for room whatever the ring)."""
    import os
    rings = [HostRing(1 << 16, 2, wait=wait) for _ in range(2)]
    streams = [_numbered(r, 100_000) for r in range(2)]
    spool = Spool(tmp_path / "t.arrow", files=2)
    for ring in rings:
        ring.lazy = True
        ring.copies()
        ring.device.state.head_first, ring.device.state.counts = head_first, counts
    try:
        drain = _drained(rings, streams, spool)
        per_file = [_chunks(os.pread(fd, spool.c.end[f], 0)) for f, fd in enumerate(h.fd for h in spool.held)]
    finally:
        spool.close()
    ordered = [per_file[g % 2][g // 2] for g in range(spool.c.chunks)]
    assert _records_of(ordered, 2) == [records for records, _, _ in streams]
    for reader, (_, starts, _) in zip(drain.readers, streams):
        assert reader.took == starts[-1] and reader.copied >= reader.took + reader.unwalked
        if counts:
            assert reader.whole > reader.took // 4, "passes that found every record counted still walked"
            assert reader.copied - reader.whole >= 2 * (reader.took - reader.whole), "a walked record copied once"
        else:
            assert reader.whole == 0


@pytest.mark.parametrize("wait", [True, False], ids=["wait", "drop"])
def test_a_raw_pass_takes_counted_records_whole_and_reads_short_counts_again_for_a_waiting_ring_alone(wait):
    """One raw pass (a burst's) over a ring whose record is not counted yet: a waiting ring's pass reads the lines and
    the header again until the counts stop growing (here: at the second read); a dropping ring's reads them once (its
    producers do not stop for the reader, whose every wait is records dropped). Either then walks. Once the SM's line
    counts the record, the pass takes it whole, reading the header once."""
    from egpu_preload.runtime import ring_drain
    ffi, lib = ring_drain._shim()
    ring = StagedRing(4096, 2, wait=wait)
    reader = RingReader(ring, 0, ring.lay)
    assert reader.take() == []   # the SMs' count learned; nothing there
    assert ring.produce(b"record01", sm=1)

    def raw_pass() -> tuple[int, Any]:
        p = reader._ready(ffi, lines=not wait)
        p.raw, p.mode = 1, lib.EGPU_PASS_TAKE
        before = ring.copied(devmaps.HEADER + 8)
        if p.stage == ffi.NULL:
            reader._stage(ffi, p)
        assert reader._call(lib, p) == 0
        return ring.copied(devmaps.HEADER + 8) - before, p

    reads, p = raw_pass()
    assert (reads, p.whole, p.consumed) == (2 if wait else 1, 0, 0)   # walked: seen, not taken
    struct.pack_into("<Q", ring.mem, ring.lay.lines_off + devmaps.LINE + devmaps.COMMITTED, 16)
    reads, p = raw_pass()
    record = struct.pack("<II", 8, devmaps.REC_READY | 1 << 8) + b"record01"
    assert (reads, p.whole, p.consumed, bytes(ffi.buffer(p.stage, 16))) == (1, 16, 16, record)
    assert ring.mem[devmaps.HEADER:devmaps.HEADER + 16] == bytes(16)   # cleared before consumed moved


def test_a_spool_write_that_fails_mid_burst_ends_it_and_counts_every_byte_taken_and_not_written():
    """The spool's disk filling up mid-burst: two rings' first halves spooled into a pipe, then the pipe left
    full while their second halves come, until the passes wait for the writer (a chunk being written, those taken
    after it handed), then the spool's fd made /dev/full's (ENOSPC after the write under way). The burst ends with
    the failure; every byte the passes took is either in a chunk written whole before it or counted lost (the
    chunk that failed and those handed after it), each ring's records written a prefix of its own; the rings are
    passed over from then on, so that their producers finish."""
    import os
    from egpu_preload.errors import EgpuError
    rings = [HostRing(4096, 2, wait=True) for _ in range(2)]
    streams = [_numbered(r, 8000) for r in range(2)]
    readers = [RingReader(ring, 0, ring.lay) for ring in rings]
    spool, out = _piped()
    spooled, go = bytearray(), threading.Event()
    go.set()

    def whenever_let() -> None:
        while go.wait() and (chunk := os.read(out, 1 << 16)):
            spooled.extend(chunk)

    reading = threading.Thread(target=whenever_let)
    reading.start()
    drain = RingDrain(readers, lambda i, taken: None, idle_s=0.0001, spool=spool).start()
    try:
        for ring, (_, starts, data) in zip(rings, streams):
            _producing(ring, starts[:4001], data[:starts[4000]]).join()
        deadline = time.monotonic() + 10
        while (not all(r.empty() for r in readers) or len(spooled) < spool.c.end[0]) and time.monotonic() < deadline:
            time.sleep(0.001)
        go.clear()
        second = [_producing(ring, starts[4000:], data)   # the ring's positions go on from the first half's
                  for ring, (_, starts, data) in zip(rings, streams)]
        consumed = None
        while consumed != (consumed := [ring._u64(16) for ring in rings]):   # until the passes wait
            time.sleep(0.1)
        full = os.open("/dev/full", os.O_WRONLY)
        os.dup2(full, spool.c.fd[0])
        os.close(full)
        _known(spool)
        go.set()
        for t in second:
            t.join()
        with pytest.raises(EgpuError, match=r"No space left on device \(([\d,]+) bytes of records taken and lost\)"
                           ) as failed:
            drain.stop()
    finally:
        go.set()
        os.close(spool.c.fd[0])
        reading.join()
        os.close(out)
    assert len(spooled) == spool.c.end[0]
    lost = int(re.search(r"\(([\d,]+) bytes", str(failed.value)).group(1).replace(",", ""))
    written = _chunks(bytes(spooled))
    taken = sum(r.consumed - r.skipped for r in readers)
    assert lost > 0 and lost == taken - sum(len(body) for _, body in written)
    for got, (records, _, _) in zip(_records_of(written, 2), streams):
        assert 4000 <= len(got) < 8000 and got == records[:len(got)]


def test_a_spool_file_that_fails_loses_what_its_reader_cannot_reach_in_order():
    """Chunks dealt to two files in turn, the second of which cannot be written (/dev/full): chunk 1 fails, so the
    spool's reader, reading in the order taken, stops after chunk 0, which is written however soon chunk 1 failed
    (a chunk before the first one lost was dropped too, in about one run of seven), and every byte taken after it is
    counted lost, those of chunks the first file's thread wrote after the failure too."""
    import os
    from egpu_preload.errors import EgpuError
    from egpu_preload.runtime import ring_drain
    ring = HostRing(4096, 2, wait=True)
    records, starts, data = _numbered(0, 8000)
    reader = RingReader(ring, 0, ring.lay)
    spool = types.SimpleNamespace(c=ring_drain._shim()[0].new("struct egpu_spool *"), files=2,
                                  lost=lambda: None)
    out, spool.c.fd[0] = os.pipe()
    spool.c.fd[1], spool.c.files = os.open("/dev/full", os.O_WRONLY), 2
    _known(spool)
    spooled = bytearray()
    reading = threading.Thread(target=lambda: [spooled.extend(c) for c in iter(lambda: os.read(out, 1 << 16), b"")])
    reading.start()
    drain = RingDrain([reader], lambda i, taken: None, idle_s=0.0001, spool=spool).start()
    try:
        _producing(ring, starts, data).join()
        with pytest.raises(EgpuError, match=r"No space left on device \(([\d,]+) bytes of records taken and lost\)"
                           ) as failed:
            drain.stop()
    finally:
        for fd in spool.c.fd[0:2]:
            os.close(fd)
        reading.join()
        os.close(out)
    lost = int(re.search(r"\(([\d,]+) bytes", str(failed.value)).group(1).replace(",", ""))
    written = _chunks(bytes(spooled))   # chunks 0, 2, 4, ... of file 0, as far as its thread got
    assert lost == reader.consumed - reader.skipped - len(written[0][1]) > 0
    got = _records_of(written[:1], 1)[0]
    assert 0 < len(got) < 8000 and got == records[:len(got)]


@pytest.mark.parametrize("full", [False, True])
def test_a_spool_that_cannot_be_read_back_is_reported_and_the_writers_queue_still_emptied(access_trace, tmp_path,
                                                                                           full, capsys):
    """The spool's read failing (EIO) ends the writing, not the writer's thread, before or after the file could
    not be written (``full``): host records keep coming past the writer's queue and finish() returns, saying why
    the file lacks the records, as the writer said at once, naming the file."""
    import os
    ring, streaming = _one_waiting_ring(access_trace, tmp_path / "t.parquet")
    if full:
        def no_room(index, records):
            raise OSError(28, "No space left on device")
        streaming.writer.add = no_room
    spool = streaming.spool   # reads fail with EBADF; the C appends to the old files
    spool.held = [Held(os.open("/dev/null", os.O_WRONLY)) for _ in spool.held]
    for i in range(200):
        ring.produce(_event(i), sm=0)
    for i in range(3 * 32):   # three times the writer's queue of host batches
        streaming.host(ring.probe, ring.index, [_event(i)], 0)
    done: list = []
    finishing = threading.Thread(target=lambda: done.append(streaming.finish()), daemon=True)
    finishing.start()
    finishing.join(30)
    assert done, "finish() waited for good on a writer's thread that had died"
    why = "cannot write the trace: [Errno 28]" if full else "cannot read the trace's spool back: [Errno 9] Bad file"
    assert done[0]["error"].startswith(why)
    said = capsys.readouterr().err.splitlines()
    assert said and all(line.startswith(f"egpu[{os.getpid()}]: {tmp_path / 't.parquet'}: {why}") for line in said), said


def test_a_spool_that_fails_to_read_back_once_finish_has_begun_still_lets_finish_return(access_trace, tmp_path,
                                                                                        monkeypatch):
    """The spool's read failing (EBADF) after the writer took finish()'s end of its queue, reading back what the
    last passes spooled: the writer then waited for that end again, for good, and finish() with it (a job's exit
    hung). finish() returns, saying why the file lacks the records."""
    import os
    from egpu_preload.runtime import spool as spool_mod
    monkeypatch.setattr(spool_mod, "READ", 64)   # a chunk a read: most of the spool is read back after the end
    ring, streaming = _one_waiting_ring(access_trace, tmp_path / "t.parquet")
    adding, held, add = threading.Event(), threading.Event(), streaming.writer.add

    def held_up(index, taken):
        adding.set()
        held.wait(30)
        add(index, taken)

    streaming.writer.add = held_up
    for i in range(200):
        ring.produce(_event(i), sm=0)
    assert adding.wait(10)
    done: list = []
    finishing = threading.Thread(target=lambda: done.append(streaming.finish()), daemon=True)
    finishing.start()
    deadline = time.monotonic() + 10
    while streaming._batches.empty() and time.monotonic() < deadline:   # until finish() has queued the end
        time.sleep(0.01)
    spool = streaming.spool
    spooled, spool.held = spool.held, [Held(os.open("/dev/null", os.O_WRONLY)) for _ in spool.held]   # reads: EBADF
    held.set()
    finishing.join(10)
    for held in spooled:
        held.close()
    assert done, "finish() waited for good on a writer that waited for the end of its queue it had taken"
    assert done[0]["error"].startswith("cannot read the trace's spool back: [Errno 9] Bad file")


def test_a_spool_that_cannot_be_written_fails_the_reader_and_lets_producers_go_on(access_trace, tmp_path):
    """The spool's disk full (/dev/full stands in): the reader fails, saying so and what it took and lost, the
    ring is passed over from then on, so the producers made to wait finish, and the file is closed."""
    import os
    ring, streaming = _one_waiting_ring(access_trace, tmp_path / "t.parquet")
    full = os.open("/dev/full", os.O_WRONLY)
    for f in range(streaming.spool.files):   # chunks dealt to files in turn, every one full
        streaming.spool.c.fd[f] = full
        streaming.spool.c.dev[f], streaming.spool.c.ino[f] = identity(full)
    try:
        for i in range(1000):
            ring.produce(_event(i), sm=0)
        report = streaming.finish()
    finally:
        os.close(full)
    assert re.match(r"the ring reader failed: cannot write the trace's spool beside the trace file: No space left on "
                    r"device \([1-9][\d,]* bytes of records taken and lost\); [\d,]+ bytes of records after it passed "
                    r"over unread$", report["error"]), report["error"]
    assert tracefile.read(tmp_path / "t.parquet").complete


def test_a_spool_the_job_closed_is_said_so_and_its_number_left_alone(access_trace, tmp_path):
    """A job that closes every descriptor (a daemon) closed the spool's files too, and a file it opened then could
    take one's number: the reader fails naming the cause, not the EBADF it surfaced as, and the spool's close leaves
    the job's file on that number open."""
    import os
    ring, streaming = _one_waiting_ring(access_trace, tmp_path / "t.parquet")
    spool = streaming.spool
    numbers = [held.fd for held in spool.held]
    for fd in numbers:
        os.close(fd)
    mine = [os.open(tmp_path / "mine", os.O_WRONLY | os.O_CREAT) for _ in numbers]
    try:
        for fd, number in zip(mine, numbers):
            os.dup2(fd, number)
        for i in range(1000):
            ring.produce(_event(i), sm=0)
        report = streaming.finish()
        assert all(os.fstat(number).st_ino == os.fstat(mine[0]).st_ino for number in numbers)
    finally:
        for fd in mine + numbers:
            os.close(fd)
    assert re.match(r"the ring reader failed: cannot write the trace's spool beside the trace file: the job closed "
                    r"egpu's descriptor of its file 0 \(fd \d+\), as a daemon closes every one \(", report["error"]), \
        report["error"]
    assert (tmp_path / "mine").stat().st_size == 0 and tracefile.read(tmp_path / "t.parquet").complete


@pytest.mark.parametrize("lazy", [False, True])
def test_a_reader_that_fails_lets_waiting_producers_go_on(access_trace, tmp_path, lazy):
    """A reader that dies (here: its copies of the records fail after the fifth) must not stop the job either:
    the ring made to wait is passed over unread from then on, so the producers finish, and the report says the
    reader failed and how many bytes of records it passed over (no "none dropped"). ``lazy``: the copies land only
    when waited for, the passes copying in pieces, the one that fails among them."""
    from egpu_preload.runtime import streaming as streaming_mod
    ring, streaming = _one_waiting_ring(access_trace, tmp_path / "t.parquet", lazy)
    streaming.readers[0].mem.device.fail(ring.base + devmaps.HEADER, ring.base + ring.lay.lines_off, 719, after=5)
    done = threading.Event()

    def producer() -> None:
        for i in range(1000):   # 80 KB through a 4 KiB ring: only a reader that keeps consuming lets this end
            ring.produce(_event(i), sm=0)
        done.set()

    threading.Thread(target=producer, daemon=True).start()
    assert done.wait(30), "producers made to wait stopped for good after the reader failed"
    report = streaming.finish()
    assert report["error"].startswith("the ring reader failed: cuMemcpyDtoHAsync_v2 failed: CUresult 719; ")
    skipped = int(report["error"].split("; ")[1].split(" bytes")[0].replace(",", ""))
    assert skipped > 0 and skipped % 80 == 0 and report["records"] + skipped // 80 <= 1000
    line = streaming_mod.notes([{"trace": report}])[0]
    assert "none dropped" not in line and "the ring reader failed" in line
    trace = tracefile.read(tmp_path / "t.parquet")   # what it took before, closed all the same
    assert trace.complete and trace.rows.num_rows == report["records"] > 0


def test_the_trace_line_says_why_records_were_dropped():
    """A dropping ring drops when full; a waiting ring only records larger than it (or a warp's beyond
    what it holds at once) and those whose reader took nothing for the stall time (helpers_ptx.py
    _wait_for_room): the line names the causes of its kind."""
    from egpu_preload.runtime import streaming as streaming_mod
    base = {"records": 10, "path": "t.arrow", "dropped": 3, "error": None}
    assert streaming_mod.notes([{"trace": base}]) == [
        "egpu-run: 10 records in t.arrow, 3 dropped by the probes (ring full)"]
    assert streaming_mod.notes([{"trace": base | {"stall_s": 10.0}}]) == [
        "egpu-run: 10 records in t.arrow, 3 dropped by the probes (larger than the ring, or waiting on a reader "
        "that took nothing for 10 s)"]


def test_runs_of_one_size_come_as_blocks_and_stop_where_the_pass_saw_complete(tmp_path):
    """Records of one size in a row are taken as numpy Blocks: a record of another size ends one, and
    so does the end of what the previous pass saw complete (later records wait for the next pass);
    flattened, the blocks and single records are the ring's records in order."""
    from egpu_preload.runtime.ring_drain import RUN
    ring = HostRing(1 << 16, 3, wait=False)
    reader = RingReader(ring, 0, ring.lay)
    written = []

    def produce(i: int, size: int) -> None:
        data = struct.pack("<I", i) + bytes(size - 4)
        assert ring.produce(data, sm=i % 3)
        written.append((i % 3, data))

    for i in range(RUN + 8):
        produce(i, 16)
    produce(RUN + 8, 24)
    for i in range(RUN + 9, 2 * RUN + 17):
        produce(i, 16)
    assert reader.take() == []
    for i in range(2 * RUN + 17, 3 * RUN + 17):   # after the pass that saw the others
        produce(i, 16)
    first = reader.take()
    assert [type(x) for x in first] == [Block, tuple, Block]
    assert (len(first[0]), first[1], len(first[2])) == (RUN + 8, written[RUN + 8], RUN + 8)
    second = reader.take()
    assert [type(x) for x in second] == [Block] and len(second[0]) == RUN
    assert flat(first + second) == written and reader.empty() and reader.taken == len(written)


def test_mixed_sizes_come_as_one_packed_with_runs_of_one_size_as_blocks():
    """Records of mixed sizes (warp records: 72 to 328 bytes) are taken at once: a stretch of them as one
    Packed (their bytes back to back), a run of RUN or more of one size within it as a Block, discarded
    records left out, and across the ring's wrap; flattened, the ring's records in order."""
    from egpu_preload.runtime.ring_drain import RUN, Packed
    ring = HostRing(1 << 14, 3, wait=False)
    reader = RingReader(ring, 0, ring.lay)
    written, taken = [], []
    for lap in range(3):   # 3 x about 10 KB through a 16 KiB ring: the second pass wraps
        for i in range(2 * RUN + 40):
            size = 72 if RUN <= i < 2 * RUN else (72, 104, 200, 328)[i * 7 % 4]
            data = struct.pack("<II", lap, i) + bytes(size - 8)
            if i % 9 == 4 and not RUN <= i < 2 * RUN:   # reserved, then discarded: consumed, not handed on
                pos = ring._add(0, 8 + size)
                ring._add(8, 8 + size)
                at = devmaps.HEADER + pos % ring.lay.capacity
                struct.pack_into("<II", ring.mem, at, size, devmaps.REC_DISCARD)
                continue
            assert ring.produce(data, sm=i % 3)
            written.append((i % 3, data))
        taken += reader.take() + reader.take()
    assert flat(taken) == written and reader.empty() and reader.taken == len(written)
    assert {type(x) for x in taken} >= {Packed, Block}
    packed = next(x for x in taken if isinstance(x, Packed))
    assert packed.data.tobytes() == b"".join(d for _, d in packed.records())


@pytest.mark.parametrize("wait", [True, False], ids=["wait", "drop"])
@pytest.mark.parametrize("suffix", [".arrow", ".parquet"])
def test_producers_at_full_speed_reach_the_file_whole_and_in_order(access_trace, tmp_path, wait, suffix):
    """Two rings of one probe, one of access records (a struct: typed columns) and one kept whole (warp
    records, mixed sizes), each written by four producer threads as fast as they go while Streaming drains
    them: the file read back by pyarrow holds every record delivered once, each producer's in the order it
    wrote them, their bytes as written; waiting, all of them; dropping, exactly those not counted dropped. A
    dropping ring is first given more than it holds before the drain starts (a reader fast enough for the
    producers' pace, as the C burst is on a quiet machine, would otherwise leave the drops untested)."""
    from egpu_preload.maps import MapsState
    from egpu_preload.output import warp_records
    from egpu_preload.runtime.probes import Probe
    from egpu_preload.runtime.streaming import Streaming
    ringbuf = next(m for m in access_trace.maps if m.type == prog.MAP_RINGBUF)
    maps = [dataclasses.replace(ringbuf, max_entries=1 << 14, wait=wait),
            dataclasses.replace(ringbuf, name="warp", max_entries=1 << 14, wait=wait)]
    obj = dataclasses.replace(access_trace, maps=maps)
    arena = Arena(8 << 20)
    device = devmaps.DeviceMaps(arena, MapsState(obj.maps), 4)
    rings = [HostRing(1 << 14, 4, wait, arena.mem, device.addrs[i]) for i in range(2)]
    per, early = 3000, 0 if wait else 60   # 240 records of 80 bytes at least a ring: past its 16 KiB
    kept: list[list[list[bytes]]] = [[[] for _ in range(4)] for _ in rings]

    def produce(p: int, ks: range) -> None:
        for k in ks:
            i = p * per + k
            for r, data in enumerate((_event(i), struct.pack("<Q", i) + bytes((64, 96, 192, 320)[k * 5 % 4]))):
                if rings[r].produce(data, sm=p):
                    kept[r][p].append(data)

    for p in range(4):
        produce(p, range(early))
    assert wait or all(r.refused for r in rings)
    streaming = Streaming(tmp_path / f"t{suffix}", [Probe(Path("a.bpf.o"), obj, (), "t", frozenset({1}))],
                          [device], arena)
    interleaved(lambda p: produce(p, range(early, per)), 4)
    report = streaming.finish()
    delivered = [sum(map(len, k)) for k in kept]
    assert report["error"] is None and report["records"] == sum(delivered)
    assert report["dropped"] == sum(r.refused for r in rings) == 2 * 4 * per - sum(delivered)
    assert (report["dropped"] == 0) == wait
    path = tmp_path / f"t{suffix}"
    table = pq.read_table(path) if suffix == ".parquet" else pa.ipc.open_file(pa.OSFile(str(path))).read_all()
    assert json.loads(table.schema.metadata[b"egpu.record_types"])["warp"] == warp_records.RECORD_TYPE
    t = table.to_pydict()
    for r, name in enumerate(("events", "warp")):
        rows = [i for i, m in enumerate(t["map"]) if m == name]
        assert [t["seq"][i] for i in rows] == list(range(delivered[r]))
        for p in range(4):
            if r == 0:
                got = [MEM_EVENT.pack(*(t[c][i] for c in ("ts", "addr", "kernel_id", "launch_id", "site", "size",
                                                            "flags", "sm", "block[0]", "block[1]", "block[2]",
                                                            "thread[0]", "thread[1]", "thread[2]")))
                       for i in rows if t["cpu"][i] == p]
            else:
                got = [t["data"][i] for i in rows if t["cpu"][i] == p]
            assert got == kept[r][p]


def test_host_records_wait_beside_a_full_writer_queue_not_in_it():
    """The launch drainer's thread hands host records on and must go on taking launch records, which a full
    shim ring drops: while the writer's queue is full they are held, in order, and reach it once there is room
    or at the latest when the file is finished (a blocking put stalled the drainer behind a slow writer)."""
    from egpu_preload.runtime import streaming
    s = object.__new__(streaming.Streaming)
    probe = object()
    s.slots, s._probe, s.host_dropped, s.host_taken = {(0, 3): 1}, {id(probe): 0}, [0, 0], 0
    s._host_held, s._batches = streaming.deque(), streaming.queue.Queue(1)
    s._batches.put((0, []))   # the writer's queue, full
    s.host(probe, 3, [b"a", b"b"], 0)
    s.host(probe, 3, [b"c"], 2)
    assert s.host_dropped == [0, 2] and len(s._host_held) == 2
    assert s._batches.get_nowait() == (0, [])
    s.host(probe, 3, [], 2)
    assert s._batches.get_nowait() == (1, [(0, b"a"), (0, b"b")]) and len(s._host_held) == 1
    taken = []
    reader = threading.Thread(target=lambda: [taken.append(s._batches.get()) for _ in range(2)])
    s._batches.put((0, []))
    reader.start()
    s._hand_host(wait=True)
    reader.join(5)
    assert taken == [(0, []), (1, [(0, b"c")])] and not s._host_held


def test_host_records_a_failed_writer_left_out_are_counted_as_taken(access_trace, tmp_path):
    """The error's count of records taken and not written holds those host programs handed on (the launch
    drainer's), not only the ring readers': a job tracing only host probes was told 0 were lost."""
    from egpu_preload.runtime.probes import Probe
    from egpu_preload.runtime.streaming import Streaming
    probe = Probe(Path("a.bpf.o"), access_trace, (), "t")
    streaming = Streaming(tmp_path / "t.parquet", [probe])

    def full(index, records):
        raise OSError(28, "No space left on device")

    streaming.writer.add = full
    index = next(i for i, m in enumerate(access_trace.maps) if m.name == "events")
    streaming.host(probe, index, [_event(0), _event(1)], 0)
    streaming.host(probe, index, [_event(2)], 0)
    report = streaming.finish()
    assert report["error"] == ("cannot write the trace: [Errno 28] No space left on device (3 records taken and not "
                               "written)")


def test_a_trace_file_whose_process_still_runs_is_not_called_ended(tmp_path):
    """A process of the job still running when its main process ended (daemonized) writes its trace file on and
    closes it at its own exit: egpu-run said it had ended before its exit dump, and what `egpu trace` reads."""
    import os
    from egpu_preload.runtime import streaming
    out = tmp_path / "t.arrow"
    mine = out.with_name(f"t.{os.getpid()}.arrow")
    out.touch()
    mine.touch()
    child = subprocess.Popen(["true"])
    child.wait()
    gone = child.pid   # a process that ended (reaped)
    running = "is still open: its process was still running when the job's main process ended (it closes it at exit)"
    assert streaming.unclosed(out, [], {os.getpid()}) == [f"egpu-run: {out} {running}", f"egpu-run: {mine} {running}"]
    either = streaming.unclosed(out, [], {os.getpid(), gone})[0]
    assert either.startswith(f"egpu-run: {out} was never closed (its process ended before its exit dump, or still "
                             "runs and closes it at exit): `egpu trace` reads")
    assert streaming.unclosed(out, [], {gone})[0].startswith(f"egpu-run: {out} was never closed (its process ended "
                                                              "before its exit dump): `egpu trace` reads")


def test_the_trace_file_of_an_image_an_exec_made_is_named_while_unclosed(tmp_path):
    """A process whose first image closed FILE before its exec (its exec dump names it) and whose next image still
    writes FILE.PID.exec1: that file is named as open, its process as running (an exec dump is no exit dump)."""
    import os
    from egpu_preload.runtime import streaming
    out = tmp_path / "t.arrow"
    later = tmp_path / f"t.{os.getpid()}.exec1.arrow"
    out.touch()
    later.touch()
    replaced = {"pid": os.getpid(), "exec": 1, "trace": {"path": str(out)}}
    assert streaming.unclosed(out, [replaced], {os.getpid()}) == [
        f"egpu-run: {later} is still open: its process was still running when the job's main process ended (it "
        "closes it at exit)"]
