"""Warp memory records: one record per warp instruction in place of one per lane, and back.

A memory trace that writes a record per lane (examples/access_trace.bpf.c, ``struct mem_event``: 72
bytes, 80 in the ring) spends most of its bytes on what the lanes of a warp share. The helper
``egpu_warp_mem_record`` (bpf/helpers.py; PTX in translate/helpers_ptx.py, the VM in vm/calls.py)
writes one ``struct egpu_warp_mem`` (egpu.bpf.h) per group of lanes that make one access together, by
the group's lowest lane: what they share, the lanes' mask, and their addresses in one of three forms:

- ``AFFINE``: lane i's address is base + stride * (i - leader), no tail (a[threadIdx.x]: 72 bytes for 32
  lanes). stride is the second-lowest lane's distance from the leader over their lane distance, divided
  as ``div.s64`` does (toward zero); the record is affine when that predicts every lane's address
  (modulo 2**64). A lone lane is affine with stride 0.
- ``OFFSETS``: a tail of s32 address - base per active lane, in lane order, padded to 8 bytes.
- ``ADDRS``: a tail of u64 addresses per active lane, when some offset does not fit in s32.

``expand`` turns a warp record into the per-lane records the per-thread trace has, ``struct mem_event``
(``LaneAccess``), each lane's thread index from the warp's index in its block and the lane number
(CUDA numbers a block's warps by linear thread index: x fastest, 32 a warp). Every lane gets the
leader's ``ts``: one instruction, one time; a per-thread probe reads the clock in each lane, so on the
GPU the two traces may differ there by the lanes' skew, and nowhere else. ``warp_record`` is the form
rule the PTX follows and the VM's helper runs; ``compress``, the reference encoder of a whole per-lane
trace: any per-lane trace compresses to records that expand back to it. ``expand_table`` does what
``expand`` does for a whole trace file's rows at once (egpu trace; egpu-run --trace keeps the records whole).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Dim3 = tuple[int, int, int]

FORM_AFFINE, FORM_OFFSETS, FORM_ADDRS = 0, 1, 2
WARP = 32
MASK64 = (1 << 64) - 1
# struct egpu_warp_mem: ts, base, kernel_id, launch_id, stride, site, mask, block[3], block_dim[2] (x, y),
# warp, sm, size, flags, form
HEADER = struct.Struct("<QQQQqII3I2HHHHBB")
# Byte offsets of struct egpu_warp_mem's fields (the PTX writer stores them one by one).
OFFSET = {"ts": 0, "base": 8, "kernel_id": 16, "launch_id": 24, "stride": 32, "site": 40, "mask": 44, "block": 48,
          "block_dim": 60, "warp": 64, "sm": 66, "size": 68, "flags": 70, "form": 71}
# struct mem_event of examples/access_trace.bpf.c: ts, addr, kernel_id, launch_id, site, size, flags, sm,
# block[3], thread[3]
LANE = struct.Struct("<QQQQIIII3I3I")


class WarpRecordError(ValueError):
    """A record that is not a warp memory record (what the reader prints in one line)."""


@dataclass(frozen=True)
class Instruction:
    """What the lanes of one warp instruction share (the header of a record, but the addresses)."""

    ts: int
    kernel_id: int
    launch_id: int
    site: int
    size: int
    flags: int
    sm: int
    block: Dim3
    block_dim: tuple[int, int]   # blockDim.x, .y (z is not needed to number a block's threads)
    warp: int                    # the warp's index in its block: linear thread index // 32


@dataclass(frozen=True)
class WarpRecord:
    ins: Instruction
    mask: int             # bit i: lane i made the access
    form: int             # FORM_*
    base: int             # the lowest lane's address
    stride: int           # FORM_AFFINE's, else 0
    tail: tuple[int, ...] = ()   # FORM_OFFSETS: s32 offsets, FORM_ADDRS: addresses, one per active lane


@dataclass(frozen=True)
class LaneAccess:
    """One lane's access, as the per-thread trace records it (struct mem_event)."""

    ts: int
    addr: int
    kernel_id: int
    launch_id: int
    site: int
    size: int
    flags: int
    sm: int
    block: Dim3
    thread: Dim3

    def pack(self) -> bytes:
        return LANE.pack(self.ts, self.addr, self.kernel_id, self.launch_id, self.site, self.size, self.flags,
                         self.sm, *self.block, *self.thread)

    @classmethod
    def unpack(cls, raw: bytes) -> "LaneAccess":
        if len(raw) != LANE.size:
            raise WarpRecordError(f"lane record of {len(raw)} bytes, expected {LANE.size}")
        f = LANE.unpack(raw)
        return cls(*f[:8], f[8:11], f[11:14])


def lanes_of(mask: int) -> list[int]:
    return [i for i in range(WARP) if mask >> i & 1]


def _s64(v: int) -> int:
    v &= MASK64
    return v - (1 << 64) if v >> 63 else v


def _div_s64(a: int, b: int) -> int:
    """PTX div.s64: the quotient truncated toward zero."""
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def warp_record(ins: Instruction, addrs: Mapping[int, int]) -> WarpRecord:
    """The record of the lanes in ``addrs`` (lane -> address), in the form the GPU chooses."""
    lanes = sorted(addrs)
    if not lanes or lanes[0] < 0 or lanes[-1] >= WARP:
        raise WarpRecordError(f"lanes {lanes} are not 1 to {WARP} lanes of a warp")
    leader, base = lanes[0], addrs[lanes[0]] & MASK64
    stride = 0
    if len(lanes) > 1:
        second = lanes[1]
        stride = _div_s64(_s64(addrs[second] - base), second - leader)
    mask = sum(1 << i for i in lanes)
    if all((base + stride * (i - leader)) & MASK64 == addrs[i] & MASK64 for i in lanes):
        return WarpRecord(ins, mask, FORM_AFFINE, base, stride)
    offsets = tuple(_s64(addrs[i] - base) for i in lanes)
    if all(-(1 << 31) <= d < 1 << 31 for d in offsets):
        return WarpRecord(ins, mask, FORM_OFFSETS, base, 0, offsets)
    return WarpRecord(ins, mask, FORM_ADDRS, base, 0, tuple(addrs[i] & MASK64 for i in lanes))


def encode(rec: WarpRecord) -> bytes:
    """The record's bytes, as the GPU writes them."""
    i = rec.ins
    head = HEADER.pack(i.ts, rec.base, i.kernel_id, i.launch_id, rec.stride, i.site, rec.mask, *i.block,
                       *i.block_dim, i.warp, i.sm, i.size, i.flags, rec.form)
    if rec.form == FORM_OFFSETS:
        tail = struct.pack(f"<{len(rec.tail)}i", *rec.tail)
        return head + tail + bytes(-len(tail) % 8)
    if rec.form == FORM_ADDRS:
        return head + struct.pack(f"<{len(rec.tail)}Q", *rec.tail)
    return head


def decode(raw: bytes) -> WarpRecord:
    """A record from its bytes; WarpRecordError for bytes that cannot be one."""
    if len(raw) < HEADER.size:
        raise WarpRecordError(f"warp record of {len(raw)} bytes, shorter than its {HEADER.size}-byte header")
    f = HEADER.unpack_from(raw)
    ts, base, kernel_id, launch_id, stride, site, mask = f[:7]
    block, block_dim, (warp, sm, size, flags, form) = f[7:10], f[10:12], f[12:]
    n = bin(mask).count("1")
    if not n:
        raise WarpRecordError("warp record with no lane in its mask")
    widths = {FORM_AFFINE: 0, FORM_OFFSETS: 4, FORM_ADDRS: 8}
    if form not in widths:
        raise WarpRecordError(f"warp record of unknown form {form}")
    tail_bytes = widths[form] * n
    want = HEADER.size + tail_bytes + -tail_bytes % 8
    if len(raw) != want:
        raise WarpRecordError(f"warp record of {len(raw)} bytes, its mask and form say {want}")
    code = "Q" if form == FORM_ADDRS else "i"
    tail = struct.unpack_from(f"<{n}{code}", raw, HEADER.size) if form != FORM_AFFINE else ()
    ins = Instruction(ts, kernel_id, launch_id, site, size, flags, sm, block, block_dim, warp)
    return WarpRecord(ins, mask, form, base, stride, tail)


def thread_of(warp: int, lane: int, block_dim: tuple[int, int]) -> Dim3:
    """threadIdx of a lane: its linear index in the block, warp * 32 + lane, split x fastest."""
    linear, (bx, by) = warp * WARP + lane, block_dim
    return linear % bx, linear // bx % by, linear // (bx * by)


def expand(record: WarpRecord | bytes) -> list[LaneAccess]:
    """The per-lane records of a warp record (or its bytes), in lane order."""
    rec = decode(record) if isinstance(record, (bytes, bytearray, memoryview)) else record
    i, lanes = rec.ins, lanes_of(rec.mask)
    if rec.form == FORM_AFFINE:
        addrs = [(rec.base + rec.stride * (lane - lanes[0])) & MASK64 for lane in lanes]
    elif rec.form == FORM_OFFSETS:
        addrs = [(rec.base + d) & MASK64 for d in rec.tail]
    else:
        addrs = list(rec.tail)
    return [LaneAccess(i.ts, a, i.kernel_id, i.launch_id, i.site, i.size, i.flags, i.sm, i.block,
                       thread_of(i.warp, lane, i.block_dim)) for lane, a in zip(lanes, addrs)]


def compress(records: Iterable[LaneAccess], block_dim: Dim3) -> list[WarpRecord]:
    """Warp records that expand to ``records`` (of launches with blocks of ``block_dim``), in order.

    A run of records of one warp instruction (all fields alike but the address and the lane) with
    rising lanes becomes one record; a lane at or below the last one starts the next."""
    bx, by, bz = block_dim
    out: list[WarpRecord] = []
    key: Instruction | None = None
    addrs: dict[int, int] = {}
    for r in records:
        x, y, z = r.thread
        if not (x < bx and y < by and z < bz):
            raise WarpRecordError(f"thread {r.thread} is outside blocks of {block_dim}")
        warp, lane = divmod((z * by + y) * bx + x, WARP)
        ins = Instruction(r.ts, r.kernel_id, r.launch_id, r.site, r.size, r.flags, r.sm, r.block, (bx, by), warp)
        if ins != key or lane <= max(addrs):
            if key is not None:
                out.append(warp_record(key, addrs))
            key, addrs = ins, {}
        addrs[lane] = r.addr
    if key is not None:
        out.append(warp_record(key, addrs))
    return out


# ---- a trace file's warp records, expanded a table at a time (egpu trace) --------------------------------

RECORD_TYPE = "struct egpu_warp_mem"   # what the trace file names a ring of warp records (output/tracefile.py)
# struct mem_event's columns as a trace file holds access_trace.bpf.c's records, in order, with their widths
LANE_COLUMNS = (("ts", 8), ("addr", 8), ("kernel_id", 8), ("launch_id", 8), ("site", 4), ("size", 4),
                ("flags", 4), ("sm", 4), *((f"block[{i}]", 4) for i in range(3)),
                *((f"thread[{i}]", 4) for i in range(3)))
TAIL_BYTES = (0, 4, 8)   # per active lane, by form


def expand_table(table: Any) -> Any:
    """A trace file's rows of warp records (a pyarrow Table whose ``data`` holds each record's bytes) as
    the rows of the per-lane trace: one per active lane, in record then lane order, with struct
    mem_event's columns, ``seq`` numbering the lanes and ``map`` and ``cpu`` their record's. What expand()
    does record by record, with numpy over the whole table; WarpRecordError names the first record that
    cannot be one by its ``seq``."""
    import numpy as np
    import pyarrow as pa

    data, buf, offsets = _records(table)
    lanes, count = _checked_lanes(table, data, buf, offsets)
    starts = offsets[:-1]
    head = buf[starts[:, None] + np.arange(HEADER.size)].view(_header_dtype(np)).reshape(len(starts))
    rec, lane = np.nonzero(lanes)
    first = np.concatenate(([0], np.cumsum(count)[:-1]))[:len(starts)]   # each record's first lane's row

    def per_lane(name: str) -> Any:
        return np.ascontiguousarray(head[name])[rec]

    form, base = per_lane("form"), per_lane("base")
    leader = lane[first][rec] if len(rec) else lane
    addr = base + (per_lane("stride") * (lane - leader)).astype(np.uint64)   # wraps as the GPU's does
    for f, kind in ((FORM_OFFSETS, "<i4"), (FORM_ADDRS, "<u8")):
        pick = np.flatnonzero(form == f)
        at = starts[rec[pick]] + HEADER.size + (pick - first[rec[pick]]) * TAIL_BYTES[f]   # by the lane's rank
        value = buf[at[:, None] + np.arange(TAIL_BYTES[f])].view(kind).reshape(len(pick))
        addr[pick] = value if f == FORM_ADDRS else base[pick] + value.astype(np.int64).astype(np.uint64)
    dims = np.ascontiguousarray(head["block_dim"]).astype(np.int64)
    bx, by = dims[:, 0][rec], dims[:, 1][rec]
    linear = per_lane("warp").astype(np.int64) * WARP + lane
    block = np.ascontiguousarray(head["block"])
    values = {"ts": per_lane("ts"), "addr": addr, "kernel_id": per_lane("kernel_id"),
              "launch_id": per_lane("launch_id"), "site": per_lane("site"), "size": per_lane("size"),
              "flags": per_lane("flags"), "sm": per_lane("sm"), **{f"block[{i}]": block[:, i][rec] for i in range(3)},
              "thread[0]": linear % bx, "thread[1]": linear // bx % by, "thread[2]": linear // (bx * by)}
    index = pa.array(rec, pa.int64())
    cols = {"map": table.column("map").take(index), "seq": pa.array(np.arange(len(rec), dtype=np.uint64)),
            "cpu": table.column("cpu").take(index)}
    cols.update({name: pa.array(values[name].astype(f"<u{size}", copy=False)) for name, size in LANE_COLUMNS})
    return pa.table(cols)


def lane_count(table: Any) -> int:
    """The lanes the warp records of ``table`` (as expand_table takes it) stand for: the rows it expands to;
    WarpRecordError as expand_table's."""
    return int(_checked_lanes(table, *_records(table))[1].sum())


def _records(table: Any) -> tuple[Any, Any, Any]:
    """(``data`` as large_binary, its bytes, where each record starts and the last ends) of a table of warp
    records; WarpRecordError for a table without their bytes and SMs, or the first record too short to have a
    header."""
    import numpy as np
    import pyarrow as pa

    for name in ("data", "cpu"):   # a file another writer made may lack them
        if name not in table.column_names:
            raise WarpRecordError(f"no {name} column")
    data = table.column("data")
    if not (pa.types.is_binary(data.type) or pa.types.is_large_binary(data.type)):
        raise WarpRecordError(f"data is {data.type}, not the records' bytes")
    data = data.cast(pa.large_binary()).combine_chunks()   # over 2 GiB: 32-bit offsets overflow
    offsets = np.frombuffer(data.buffers()[1], np.int64)[data.offset:data.offset + len(data) + 1]
    buf = np.frombuffer(data.buffers()[2] or b"", np.uint8)
    short = np.flatnonzero((np.diff(offsets) < HEADER.size) | np.asarray(data.is_null(), bool))
    if len(short):
        _refuse(table, data, int(short[0]))
    return data, buf, offsets


def _checked_lanes(table: Any, data: Any, buf: Any, offsets: Any) -> tuple[Any, Any]:
    """(each record's lanes as (n, 32) bits, how many), every record's size, mask, form and block dimensions
    checked as decode() checks them: WarpRecordError for the first that fails. Only the header fields
    checked are gathered (a whole header per record is 9 times the memory)."""
    import numpy as np
    starts = offsets[:-1]

    def field(offset: int, size: int, kind: str) -> Any:
        return buf[starts[:, None] + np.arange(offset, offset + size)].view(kind).reshape(
            len(starts), size // np.dtype(kind).itemsize)

    mask, dims = field(OFFSET["mask"], 4, "<u4")[:, 0], field(OFFSET["block_dim"], 4, "<u2")
    form = field(OFFSET["form"], 1, "u1")[:, 0]
    lanes = np.unpackbits(mask.astype("<u4").view(np.uint8).reshape(len(starts), 4), axis=1, bitorder="little")
    count = lanes.sum(axis=1, dtype=np.int64)
    width = np.array(TAIL_BYTES + (0,), np.int64)[np.minimum(form, len(TAIL_BYTES))]
    tails = width * count
    bad = (count == 0) | (form >= len(TAIL_BYTES)) | (dims == 0).any(axis=1)
    bad |= np.diff(offsets) != HEADER.size + tails + -tails % 8
    if bad.any():
        _refuse(table, data, int(np.argmax(bad)))
    return lanes, count


def _header_dtype(np: Any) -> Any:
    """struct egpu_warp_mem's header (HEADER) as a numpy record."""
    return np.dtype([("ts", "<u8"), ("base", "<u8"), ("kernel_id", "<u8"), ("launch_id", "<u8"),
                     ("stride", "<i8"), ("site", "<u4"), ("mask", "<u4"), ("block", "<u4", 3),
                     ("block_dim", "<u2", 2), ("warp", "<u2"), ("sm", "<u2"), ("size", "<u2"), ("flags", "u1"),
                     ("form", "u1")])


def _refuse(table: Any, data: Any, row: int) -> None:
    """WarpRecordError for the table's ``row``: decode()'s reason, or the one decode() does not check."""
    seq = table.column("seq")[row].as_py()
    raw = data[row].as_py()
    if raw is None:
        raise WarpRecordError(f"record {seq}: no bytes")
    try:
        decode(raw)
    except WarpRecordError as e:   # a size, mask or form that cannot be
        raise WarpRecordError(f"record {seq}: {e}") from None
    raise WarpRecordError(f"record {seq}: a block dimension of 0")
