"""Differential tests of the ring reader's pass (shim/drain.c egpu_ring_pass, then ring_drain's hand-on) against
the record-by-record scan of 58a0154 (copied below as the oracle), and of the trace writer fed what the scan hands on
(Blocks, Packed, single records), read back with pyarrow: random staging buffers as the device ring holds
them, every record checked in order."""

from __future__ import annotations

import random
import struct
from typing import Any

import numpy
import pytest

from egpu_preload.runtime import ring_drain
from egpu_preload.runtime.ring_drain import RUN, Block, Packed, RingReader
from egpu_preload.translate.devmaps import HEADER, REC_BUSY, REC_DISCARD, REC_READY, MapLayout, ring_image
from test_trace_stream import HostMemory

pytestmark = pytest.mark.usefixtures("ring_walk_in_c")

# ---- the oracle: the scan of 58a0154, one record at a time (test code, not the product's) -------------


def _reference_scan(buf: memoryview, k: int, stop: int, limit: int, out: list, np: Any) -> tuple:
    words = buf.cast("I")
    took, single = None, 0
    while k < stop:
        length, flags = words[k >> 2], words[(k >> 2) + 1]
        if not flags & (REC_READY | REC_DISCARD):
            return k, took, True
        end = k + 8 + ((length + 7) & ~7)
        size, last = end - k, k + (RUN - 1) * (end - k)
        bound = min(stop, limit) if k < limit else stop
        if np is not None and not single and last < bound and words[last >> 2] == length \
                and words[(last >> 2) + 1] & 7 == REC_READY:
            n, cpus = _reference_run(np, buf, k, bound, length, size)
            if n >= RUN:
                if k < limit:
                    rows = np.frombuffer(buf, np.uint8, n * size, k).reshape(n, size)
                    out.append(Block(cpus[:n], rows[:, 8:8 + length].copy()))
                    took = k + n * size
                k += n * size
                continue
            single = RUN
        single = max(single - 1, 0)
        if k < limit:
            if flags & REC_READY:
                out.append((flags >> 8, buf[k + 8:k + 8 + length].tobytes()))
            took = end
        k = end
    return k, took, False


def _reference_run(np: Any, buf: memoryview, k: int, bound: int, length: int, size: int) -> tuple:
    words = np.frombuffer(buf, np.uint32)
    at = (k >> 2) + np.arange((bound - k + size - 1) // size) * (size >> 2)
    flags = words[at + 1]
    good = (words[at] == length) & ((flags & 7) == REC_READY)
    n = len(good) if good.all() else int(good.argmin())
    return n, flags >> 8


# ---- random staging buffers ---------------------------------------------------------------------------

LENGTHS = (0, 1, 4, 7, 8, 12, 16, 20, 24, 63, 64, 72, 104, 200, 328)   # a record's data, unpadded


def _round8(n: int) -> int:
    return n + 7 & ~7


def _records(rng: random.Random) -> list[tuple[int, int, int]]:
    """(flags, length, SM id) of records in ring order: runs of one size (shorter and longer than RUN) with
    discarded records inside and at their edges, between stretches of mixed sizes."""
    recs: list[tuple[int, int, int]] = []
    for _ in range(rng.choice((0, 1, 2, 3, 5))):
        length = rng.choice(LENGTHS)
        if rng.random() < 0.6:
            n = rng.choice((1, RUN - 1, RUN, RUN + 1, 2 * RUN, rng.randint(1, 4 * RUN)))
            run = [(REC_READY, length, rng.choice((0, 1, 131, 0xFFFFFF))) for _ in range(n)]
            for i in range(len(run)):
                edge = i in (0, n - 1)
                if rng.random() < (0.15 if edge else 0.02):
                    run[i] = (REC_DISCARD, length if rng.random() < 0.8 else rng.choice(LENGTHS), run[i][2])
            recs += run
        else:
            recs += [(REC_DISCARD if rng.random() < 0.1 else REC_READY, rng.choice(LENGTHS), rng.randrange(1 << 24))
                     for _ in range(rng.randint(1, 3 * RUN))]
    return recs


def _case(rng: random.Random) -> tuple[bytearray, int, int, int]:
    """(staging buffer, k, stop, limit): records from ``k`` on after garbage the walk must not read, ``stop``
    anywhere 8-aligned (a record may cross it, as one crosses the ring's wrap), ``limit`` a record boundary
    no later than the first record not yet complete (where an earlier pass's walk ended), or before ``k``."""
    k = 8 * rng.randint(0, 3)
    buf = bytearray(rng.randbytes(k))
    starts, recs = [], _records(rng)
    for flags, length, sm in recs:
        starts.append(len(buf))
        buf += struct.pack("<II", length, flags | sm << 8) + rng.randbytes(_round8(length))
    bounds = starts + [len(buf)]
    busy = len(starts)
    if recs and rng.random() < 0.6:   # reserved, not yet committed: BUSY, or its header still cleared
        busy = rng.randrange(len(starts))
        struct.pack_into("<II", buf, starts[busy], *((recs[busy][1], REC_BUSY) if rng.random() < 0.7 else (0, 0)))
    stop = len(buf) if rng.random() < 0.5 else 8 * rng.randint(k // 8, len(buf) // 8)
    r = rng.random()
    if r < 0.1:
        limit = 0
    elif r < 0.2:
        limit = k - 8 * rng.randint(1, 4)
    else:
        limit = rng.choice(bounds[:busy + 1])
    return buf, k, stop, limit


def _flat(taken: list) -> list[tuple[int, bytes]]:
    return [(int(c), bytes(d)) for x in taken for c, d in (x.records() if not isinstance(x, tuple) else [x])]


def _check_items(taken: list) -> None:
    """What the writer relies on: Blocks and Packed of numpy arrays of the documented types, none empty."""
    for x in taken:
        if isinstance(x, Block):
            assert x.cpus.dtype == numpy.uint32 and x.rows.dtype == numpy.uint8 and x.rows.ndim == 2
            assert len(x) == len(x.rows) >= RUN and x.rows.flags.c_contiguous
        elif isinstance(x, Packed):
            assert x.cpus.dtype == numpy.uint32 and x.data.dtype == numpy.uint8 and x.data.ndim == 1
            assert x.offsets.dtype == numpy.int64 and len(x.offsets) == len(x) + 1 >= 2
            assert x.offsets[0] == 0 and x.offsets[-1] == len(x.data) and (numpy.diff(x.offsets) >= 0).all()
        else:
            assert isinstance(x, tuple) and isinstance(x[0], int) and isinstance(x[1], bytes)


def _pass_over(buf: bytearray, k: int, stop: int, limit: int) -> tuple[list, tuple, bytes, bytes] | None:
    """The reader's pass (in C) over a ring whose unread bytes are ``buf[k:]``, its wrap at ``stop``: the data
    area's end falls there, the bytes after it lie both in the slack (where a record crossing the wrap runs on)
    and at the data area's start (where the records after it are); seen is ``limit``. (What it took, (seen,
    consumed) relative to k, the ring's data area and slack before and after the pass); None where the wrap
    would fall on ``k`` (a ring has room before its wrap)."""
    n, straight = len(buf) - k, stop - k
    if straight <= 0:
        return None
    cap = max(n, straight) + 8
    first, ring = cap - straight, _Ring(cap)
    ring.mem[HEADER + first:HEADER + first + n] = buf[k:]
    ring.mem[HEADER:HEADER + n - straight] = buf[k + straight:]
    consumed = 4 * cap + first
    struct.pack_into("<QQQ", ring.mem, 0, consumed + n, consumed + n, consumed)
    reader = RingReader(ring, 0, ring.lay, consumed=consumed, seen=consumed + limit - k)
    before = bytes(ring.mem[HEADER:HEADER + 2 * cap])
    got = reader.take()
    return got, (reader.seen - consumed, reader.consumed - consumed), before, bytes(ring.mem[HEADER:HEADER + 2 * cap])


def _compare(buf: bytearray, k: int, stop: int, limit: int, np: Any) -> None:
    """A pass against 58a0154's reader: the records it took, where it saw to and moved consumed, what it
    zeroed (the bytes of what it took before the wrap, from the data area's start those after it)."""
    done = _pass_over(buf, k, stop, limit)
    if done is None:
        return
    got, (seen, consumed), before, after = done
    want: list = []
    end, took, stopped = _reference_scan(memoryview(buf), k, stop, limit, want, np)
    took_b = None
    if not stopped and end < len(buf):   # on over the wrap
        end, took_b, _ = _reference_scan(memoryview(buf), end, len(buf), limit, want, np)
    assert seen == end - k
    assert consumed == (0 if took is None else (took_b if took_b is not None else took) - k)
    straight, cap = stop - k, len(before) // 2
    zeroed = bytearray(before)
    if took is not None:
        zeroed[cap - straight:cap - straight + took - k] = bytes(took - k)
    if took_b is not None:
        zeroed[:took_b - k - straight] = bytes(took_b - k - straight)
    assert after == bytes(zeroed)
    _check_items(got)
    records = _flat(got)
    assert records == _flat(want)


CASES = 5000


@pytest.mark.parametrize("with_numpy", [True, False], ids=["numpy", "no-numpy"])
def test_a_pass_takes_what_the_record_by_record_scan_took(with_numpy, monkeypatch):
    """Random ring contents, a wrap anywhere in them: the same records in order as 58a0154's scan, consumed
    and seen moved as far, the same bytes zeroed, with numpy and without it."""
    if not with_numpy:
        monkeypatch.setattr(ring_drain, "_numpy", lambda: None)
    rng = random.Random(19)
    for case in range(CASES if with_numpy else CASES // 5):
        buf, k, stop, limit = _case(rng)
        try:
            _compare(buf, k, stop, limit, numpy if with_numpy else None)
        except AssertionError as e:
            raise AssertionError(f"case {case}: k={k} stop={stop} limit={limit} len={len(buf)}") from e


def test_the_c_walk_reads_no_header_past_the_buffer(shim_api):
    """egpu_ring_walk told to walk past the buffer (a stop beyond it, a length that ends past it) stops at
    its end: the next header would lie outside; without arrays it counts what it would have written."""
    ffi, lib = shim_api
    buf = bytearray(struct.pack("<II", 8, REC_READY) + bytes(8) + struct.pack("<II", 1 << 20, REC_READY) + bytes(8))
    starts, runs, counts = ffi.new("long long[8]"), ffi.new("long long[8]"), ffi.new("unsigned long long[2]")
    end = lib.egpu_ring_walk(ffi.from_buffer(buf), 28, 0, 64, starts, counts, runs, counts + 1)
    assert (end, list(starts[0:counts[0]]), list(runs[0:counts[1]])) == (16 + 8 + (1 << 20), [0, 16], [0, 1])
    assert lib.egpu_ring_walk(ffi.from_buffer(buf), 20, 0, 64, starts, counts, runs, counts + 1) == 16
    # without room for offsets (the walk that only finds where complete records end): counted all the same
    end = lib.egpu_ring_walk(ffi.from_buffer(buf), 28, 0, 64, ffi.NULL, counts, ffi.NULL, counts + 1)
    assert end == 16 + 8 + (1 << 20)
    assert (counts[0], counts[1]) == (2, 2)


@pytest.mark.parametrize("size, room, ok", [(32, 16, True), (31, 16, False), (32, 15, False)])
def test_the_c_pack_refuses_a_record_past_the_buffer_or_the_room(shim_api, size, room, ok):
    """egpu_ring_pack copies a record only where its bytes lie inside the buffer and fit the room left;
    otherwise it says so (-1), and the reader raises rather than hand on bytes from beyond the copy."""
    ffi, lib = shim_api
    buf = bytearray(struct.pack("<II", 8, REC_READY | 7 << 8) + b"abcdefgh" + struct.pack("<II", 8, REC_READY | 9 << 8)
                    + b"ijklmnop")
    at, offsets, sms = ffi.new("long long[]", [0, 16]), ffi.new("long long[3]"), ffi.new("unsigned int[2]")
    data = bytearray(room)
    n = lib.egpu_ring_pack(ffi.from_buffer(buf), size, at, 2, ffi.from_buffer(data), room, offsets, sms)
    assert n == (2 if ok else -1)
    if ok:
        assert (bytes(data), list(offsets), list(sms)) == (b"abcdefghijklmnop", [0, 8, 16], [7, 9])


class _Ring(HostMemory):
    """A ring region in host memory, read through the reader's Memory calls."""

    def __init__(self, capacity: int) -> None:
        self.lay = MapLayout("ringbuf", capacity=capacity)
        self.mem = bytearray(ring_image(self.lay, 1))

    def u64(self, off: int) -> int:
        return struct.unpack_from("<Q", self.mem, off)[0]


def _passes(seed: int) -> list[tuple[list[tuple[int, bytes]], int]]:
    """Producers reserving records (runs of one size among mixed ones) and committing them out of order,
    READY or DISCARD, through a ring that wraps, between a reader's passes; every pass's (records, consumed).
    Checked against the ring: each committed record handed on once, in ring order, by a pass after one that
    followed its commit; what ``consumed`` passed was taken or discarded, and cleared."""
    rng = random.Random(seed)
    ring = _Ring(rng.choice((512, 2048, 8192)))
    cap, reader = ring.lay.capacity, RingReader(ring, 0, ring.lay)
    reserved: list[int] = []                          # positions reserved, not yet committed
    records: dict[int, tuple[int, bytes, int]] = {}   # position -> (SM id, data, passes before its commit)
    ready: list[int] = []                             # committed READY positions, in ring order
    log, delivered = [], 0

    def take() -> None:
        nonlocal delivered
        before, got = ring.u64(16), _flat(reader.take())
        log.append((got, reader.consumed))
        want = ready[delivered:delivered + len(got)]
        assert got == [records[p][:2] for p in want] and all(records[p][2] <= len(log) - 2 for p in want)
        delivered += len(got)
        assert reader.consumed == ring.u64(16) and not any(p in reserved for p in range(before, reader.consumed))
        assert all(p < reader.consumed for p in ready[:delivered])
        assert all(ring.u64(HEADER + p % cap) == 0 for p in records if before <= p < reader.consumed)

    def commit(p: int) -> None:
        o = HEADER + p % cap
        length, sm = struct.unpack_from("<I", ring.mem, o)[0], rng.randrange(1 << 24)
        data = rng.randbytes(length)
        ring.mem[o + 8:o + 8 + length] = data
        discard = rng.random() < 0.1
        struct.pack_into("<I", ring.mem, o + 4, REC_DISCARD if discard else REC_READY | sm << 8)
        reserved.remove(p)
        records[p] = (sm, data, len(log))
        if not discard:
            ready.append(p)
            ready.sort()

    for _ in range(rng.randint(20, 120)):
        r = rng.random()
        if r < 0.4:   # a run of one size, now and then another size in it
            length = rng.choice(LENGTHS)
            for _ in range(rng.choice((1, 3, RUN, RUN + 5, 2 * RUN))):
                head, total = ring.u64(0), 8 + _round8(length)
                if head + total - ring.u64(16) > cap:
                    break
                struct.pack_into("<Q", ring.mem, 0, head + total)
                struct.pack_into("<II", ring.mem, HEADER + head % cap, length, REC_BUSY)
                reserved.append(head)
                length = length if rng.random() < 0.9 else rng.choice(LENGTHS)
        elif r < 0.75:
            for p in rng.sample(reserved, rng.randint(0, len(reserved))):
                commit(p)
        else:
            take()
    for p in list(reserved):
        commit(p)
    while delivered < len(ready) or not reader.empty():
        assert len(log) < 1000
        take()
    return log


@pytest.mark.parametrize("with_numpy", [True, False], ids=["numpy", "no-numpy"])
def test_passes_over_a_ring_keep_the_readers_guarantees(with_numpy, monkeypatch):
    """Random producers and passes through a ring that wraps: every pass keeps the guarantees _passes checks."""
    if not with_numpy:
        monkeypatch.setattr(ring_drain, "_numpy", lambda: None)
    for seed in range(60 if with_numpy else 20):
        assert _passes(seed), seed


# ---- the writer ---------------------------------------------------------------------------------------

pa = pytest.importorskip("pyarrow")   # the optional extra egpu[trace]
import pyarrow.ipc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from egpu_preload.output import tracefile  # noqa: E402
from egpu_preload.output.tracefile import Column, RecordLayout  # noqa: E402

# a 32-byte struct: every kind of column, two bitfields sharing a word, a char array and raw bytes
LAYOUT = RecordLayout("struct ev", 32, (
    Column("a", 0, 8, "u"), Column("b", 8, 4, "u"), Column("c", 12, 2, "i"), Column("d", 14, 1, "u"),
    Column("e", 15, 1, "i"), Column("f", 16, 4, "f"), Column("g", 20, 4, "u", (0, 5)),
    Column("h", 20, 4, "i", (5, 7)), Column("s", 24, 4, "str"), Column("raw", 28, 4, "bytes")))


def _struct_row(rng: random.Random) -> bytes:
    row = bytearray(rng.randbytes(LAYOUT.size))
    struct.pack_into("<f", row, 16, rng.uniform(-1e6, 1e6))   # a float that reads back as itself
    return bytes(row)


def _columns(d: bytes) -> dict[str, Any]:
    """The struct's columns of record ``d`` as pyarrow reads them back."""
    a, b, c, dd, e, f, w = struct.unpack_from("<QIhBbfI", d)
    h = w >> 5 & 0x7F
    return {"a": a, "b": b, "c": c, "d": dd, "e": e, "f": f, "g": w & 0x1F, "h": h - 128 if h >= 64 else h,
            "s": d[24:28].split(b"\0", 1)[0].decode(errors="replace"), "raw": d[28:32]}


def _items(rng: random.Random, struct_map: bool) -> list:
    """Records as the reader hands them on: Blocks, Packed and single records, of the struct's size only
    (half the time, for a struct map) or of others too (zero bytes among them)."""
    def data(n: int) -> bytes:
        return _struct_row(rng) if struct_map and n == LAYOUT.size else rng.randbytes(n)

    sizes = (0, 1, 7, 8, 24, 32, 72, 328)
    if struct_map:
        sizes = (LAYOUT.size,) if rng.random() < 0.5 else (LAYOUT.size,) * 4 + (0, 1, 7, 24, 40)
    items: list = []
    for _ in range(rng.randint(1, 6)):
        r, n = rng.random(), rng.randint(1, 3 * RUN)
        cpus = numpy.array([rng.randrange(1 << 24) for _ in range(n)], numpy.uint32)
        if r < 0.4:
            size = rng.choice(sizes)
            rows = numpy.frombuffer(b"".join(data(size) for _ in range(n)), numpy.uint8).reshape(n, size)
            items.append(Block(cpus, rows.copy()))
        elif r < 0.7:
            recs = [data(rng.choice(sizes)) for _ in range(n)]
            offsets = numpy.zeros(n + 1, numpy.int64)
            numpy.cumsum([len(d) for d in recs], out=offsets[1:])
            items.append(Packed(cpus, numpy.frombuffer(b"".join(recs), numpy.uint8).copy(), offsets))
        else:
            items += [(int(c), data(rng.choice(sizes))) for c in cpus[:rng.randint(1, 5)]]
    return items


def _read(path) -> Any:
    if path.suffix == ".arrow":
        with pa.OSFile(str(path)) as source:
            return pa.ipc.open_file(source).read_all()
    return pq.read_table(path)


@pytest.mark.parametrize("suffix", [".arrow", ".parquet"])
def test_the_writer_writes_every_record_of_blocks_packed_and_singles_in_order(suffix, tmp_path, monkeypatch):
    """Random mixes of Blocks, Packed and single records into a struct map, a map with no struct and one
    of whole records, row groups of a few records and binary chunks of a few bytes: each map's rows read
    back are its records in order, every column right (struct columns where the size is the struct's, the
    bytes in ``data`` where not)."""
    rng = random.Random(20)
    for case in range(25 if suffix == ".arrow" else 60):   # Arrow IPC compresses every chunk: slower
        monkeypatch.setattr(tracefile, "FLUSH_ROWS", rng.choice((3, 50, 1 << 16)))
        monkeypatch.setattr(tracefile, "BINARY_BYTES", rng.choice((24, 333, 4096, (1 << 31) - 1)))
        maps = [("ev", LAYOUT), ("raw", None), ("warp", tracefile.whole_records("struct egpu_warp_mem"))]
        path = tmp_path / f"t{case}{suffix}"
        w = tracefile.TraceWriter(path, maps)
        written: list[list[tuple[int, bytes]]] = [[] for _ in maps]
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(maps))
            items = _items(rng, i == 0)
            written[i] += _flat(items)
            w.add(i, items)
        w.close({})
        rows = _read(path).to_pylist()
        for i, (name, _) in enumerate(maps):
            got = [r for r in rows if r["map"] == name]
            assert [(r["seq"], r["cpu"]) for r in got] == [(s, c) for s, (c, _) in enumerate(written[i])], case
            for r, (_, d) in zip(got, written[i]):
                fits = i == 0 and len(d) == LAYOUT.size
                want = _columns(d) if fits else dict.fromkeys(_columns(bytes(32)))
                assert {c: r[c] for c in want} == want, case
                assert r["data"] == (None if fits else d) and r["text"] is None, case
        assert len(rows) == sum(map(len, written))


def test_binary_chunks_stay_under_binary_bytes_and_keep_every_record(monkeypatch):
    """_binary's chunks: none empty, each under BINARY_BYTES unless one record is larger, together every
    record's bytes in order."""
    rng = random.Random(21)
    for _ in range(300):
        limit = rng.choice((1, 8, 24, 100, 1000))
        monkeypatch.setattr(tracefile, "BINARY_BYTES", limit)
        recs = [rng.randbytes(rng.choice((0, 0, 1, 7, 8, 24, 99, 328))) for _ in range(rng.randint(1, 80))]
        offsets = numpy.zeros(len(recs) + 1, numpy.int64)
        numpy.cumsum([len(d) for d in recs], out=offsets[1:])
        column = tracefile._binary(pa, numpy.frombuffer(b"".join(recs), numpy.uint8), offsets)
        assert column.to_pylist() == recs
        for chunk in column.chunks:
            size = sum(map(len, chunk.to_pylist()))
            assert len(chunk) and (size <= limit or len(chunk) == 1)
