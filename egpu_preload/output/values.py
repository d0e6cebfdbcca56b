"""Maps as neutral values (as bpftrace's output.h ``Value``): what every renderer (text, JSON, ...) reads.

``snapshot(state, obj)`` turns each map's bytes into plain Python data typed by BTF: ints, floats,
strings (char arrays), lists (arrays), dicts (structs, by field name, anonymous members merged), plus
three marked types the renderers treat specially:

- ``KernelId``: a kernel id (``ctx->kernel_id``): a struct field named ``kernel_id``, or a u64 map key
  equal to a kernel id in the name table. Text prints the kernel's demangled name; JSON keeps the int.
- ``Symbol``: text printed bare (enum names, bytes without a type in hex).
- ``Address``: a pointer, printed in hex.

Which map becomes which value:

- ``Scalar``: a single-slot ARRAY, PERCPU_ARRAY or PERTHREAD_ARRAY (bpftime's), and libbpf global data
  (``.bss``/``.data``, a DATASEC). ``.rodata`` is constant and not shown.
- ``Histogram``: an ARRAY, PERCPU_ARRAY or hash map (any of the four) with integer keys (log2: 0-63) and
  values whose name starts with ``hist`` (log2) or ``lhist`` (linear). egpu's convention (a probe computes
  the slot itself): log2 slot 0 counts values 0 and 1, slot k >= 1 counts [2**k, 2**(k+1)), i.e. slot =
  floor(log2(v)); linear slot k counts [k*step, (k+1)*step), where step is the number after ``lhist`` in the name
  (``lhist100_latency``: step 100), 1 when there is none. Buckets run from the first non-empty slot to
  the last, as bpftrace prints them; past MAX_BUCKETS, a run of empty slots is one empty bucket.
- ``KeyedScalars``: every other ARRAY, PERCPU_ARRAY and hash map (HASH, LRU_HASH, PERCPU_HASH,
  LRU_PERCPU_HASH); all-zero ARRAY slots are left out.
- ``Records``: RINGBUF and PERF_EVENT_ARRAY records, typed by the struct the caller names for that map
  (``event_types``: a ring buffer has no value type in BTF; without it, the probe's one named struct
  of the record's size), with the drop count.
- ``Records`` too: a QUEUE's or STACK's values in the order pops would take them (a queue's oldest first, a
  stack's newest first), typed by its value type, without taking them.
- ``Scalar``: a BLOOM_FILTER as its size and hash count (its bits are no entries to show).
- ``Trace``: bpf_trace_printk lines.

PERCPU_ARRAY, PERCPU_HASH and LRU_PERCPU_HASH values are summed over SMs (ints, field by field), as bpftrace
prints per-CPU maps; ``per_sm`` keeps each SM's value (a per-CPU hash's: of the SMs that hold one).
Taking a snapshot drains ring buffers, perf buffers and trace records, as reading them does.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Union

from ..bpf import btf as btfmod
from ..bpf import program as prog
from ..bpf.program import BpfObject, MapDef
from ..errors import EgpuError
from ..maps import (BloomStorage, MapsState, MapStorage, PercpuArrayStorage, PercpuHashStorage, PerfStorage,
                    QueueStorage, RingbufStorage, StackStorage)

KERNEL_ID_FIELD = "kernel_id"
_ARRAYS = (prog.MAP_ARRAY, prog.MAP_PERCPU_ARRAY, prog.MAP_PERTHREAD_ARRAY)   # every slot always there
CTX_STRUCT = "egpu_ctx"   # the probes' context: never a record type


class KernelId(int):
    """A kernel id (FNV-1a 64 of the mangled name, ``egpu_preload.bpf.ctx.kernel_id``)."""


class Symbol(str):
    """Text printed without quotes."""


class Address(int):
    """A pointer value."""


Data = Union[int, float, str, list, dict]


@dataclass(frozen=True)
class Scalar:
    name: str
    value: Data
    per_sm: dict[int, Data] | None = None


@dataclass(frozen=True)
class Entry:
    key: Data
    value: Data
    per_sm: dict[int, Data] | None = None


@dataclass(frozen=True)
class KeyedScalars:
    """Entries in print order: by value when values are integers (as bpftrace), else by key."""

    name: str
    entries: tuple[Entry, ...]


@dataclass(frozen=True)
class Histogram:
    """Consecutive buckets from the first to the last non-empty one, in bpftrace's form: bucket i is
    [lower_bound, labels[0]) for i = 0, else [labels[i-1], labels[i])."""

    name: str
    scale: str                 # "log2" | "linear"
    step: int                  # linear bucket width (1 for log2)
    lower_bound: int
    labels: tuple[int, ...]
    counts: tuple[int, ...]

    def buckets(self) -> list[tuple[int, int, int]]:
        """(lo, hi, count) per bucket, hi exclusive."""
        los = (self.lower_bound,) + self.labels[:-1]
        return list(zip(los, self.labels, self.counts))

    def slots(self) -> dict[int, int]:
        """Slot -> count of the non-empty buckets (the slots ``histogram`` was built from)."""
        return {(hi // self.step - 1 if self.scale == "linear" else hi.bit_length() - 2): n
                for _, hi, n in self.buckets() if n}


@dataclass(frozen=True)
class Record:
    value: Data
    cpu: int | None = None     # the SM a perf record came from; None for ring buffers


@dataclass(frozen=True)
class Records:
    name: str
    records: tuple[Record, ...]
    dropped: int


@dataclass(frozen=True)
class Trace:
    lines: tuple[str, ...]
    dropped: int = 0   # lines lost to a full trace_printk ring (devmaps.TRACE_BYTES on the device)


MapValue = Union[Scalar, KeyedScalars, Histogram, Records]


@dataclass(frozen=True)
class Snapshot:
    """Every shown map in object order, the trace lines, and the kernel name table (id -> mangled)."""

    maps: tuple[MapValue, ...]
    trace: Trace
    kernel_names: Mapping[int, str] = field(default_factory=dict)


def snapshot(state: MapsState, obj: BpfObject, kernel_names: Mapping[int, str] | None = None,
             event_types: Mapping[str, str] | None = None) -> Snapshot:
    """The neutral values of every map in ``state`` (whose maps are ``obj``'s).

    ``event_types`` names the BTF type of each ring-buffer or perf map's records, by map name:
    ``{"events": "struct event"}``; records of other such maps are shown as hex.
    """
    names = dict(kernel_names or {})
    reader = _Reader(_btf(obj), names)
    record_types = event_type_ids(obj, event_types or {})
    out: list[MapValue] = []
    for storage in state.storages:
        value = _map_value(storage, reader, record_types.get(storage.mapdef.name))
        if value is not None:
            out.append(value)
    lines = tuple(r.text() for r in state.trace)
    state.trace.clear()
    return Snapshot(tuple(out), Trace(lines, state.trace_dropped), names)


def event_type_ids(obj: BpfObject, event_types: Mapping[str, str]) -> dict[str, int]:
    """Map name -> BTF type id of its records; check this when the probe loads, before any snapshot."""
    btf = _btf(obj)
    ids = {}
    for map_name, type_name in event_types.items():
        m = next((m for m in obj.maps if m.name == map_name), None)
        if m is None or m.type not in (prog.MAP_RINGBUF, prog.MAP_PERF_EVENT_ARRAY):
            raise EgpuError(f"{obj.path}: no ring buffer or perf map named {map_name}")
        bare = type_name.removeprefix("struct ").removeprefix("union ").strip()
        t = btf.find(bare) if btf is not None else None
        if t is None or t.kind in (btfmod.KIND_FUNC, btfmod.KIND_VAR, btfmod.KIND_DATASEC, btfmod.KIND_FWD):
            # clang emits a type to BTF only when a global, a map or a function signature uses it.
            raise EgpuError(f"{obj.path}: map {map_name}: no type {type_name} in the probe's BTF (pass a "
                            f"pointer to it to a __noinline function so clang keeps it)")
        ids[map_name] = t.id
    return ids


def _btf(obj: BpfObject) -> btfmod.Btf | None:
    return obj.btf if isinstance(obj.btf, btfmod.Btf) else None


def _map_value(storage: MapStorage, reader: "_Reader", record_type: int | None) -> MapValue | None:
    m = storage.mapdef
    if m.readonly:
        return None
    if isinstance(storage, RingbufStorage):
        records = tuple(Record(reader.data(record_type or reader.record_type(len(r)), r)) for r in storage.consume())
        return Records(m.name, records, storage.drops)
    if isinstance(storage, PerfStorage):
        records = tuple(Record(reader.data(record_type or reader.record_type(len(r)), r), cpu)
                        for cpu, r in storage.consume())
        return Records(m.name, records, storage.drops)
    if isinstance(storage, QueueStorage):
        values = [v for _, v in storage.items()]
        order = reversed(values) if isinstance(storage, StackStorage) else values
        return Records(m.name, tuple(Record(reader.data(m.value_type_id, v)) for v in order), 0)
    if isinstance(storage, BloomStorage):
        return Scalar(m.name, Symbol(f"bloom filter of {m.bloom_bits} bits, {m.hashes} hash functions"))
    rows = _rows(storage, reader)
    if m.max_entries == 1 and m.type in _ARRAYS:
        _, value, per_sm = rows[0]
        return Scalar(m.name, value, per_sm)
    hist = _histogram(m, rows)
    if hist is not None:
        return hist
    if rows and all(_is_int(v) for _, v, _ in rows):
        rows.sort(key=lambda r: (r[1], _order(r[0])))
    else:
        rows.sort(key=lambda r: _order(r[0]))
    return KeyedScalars(m.name, tuple(Entry(k, v, per_sm) for k, v, per_sm in rows))


def _rows(storage: MapStorage, reader: "_Reader") -> list[tuple[Data, Data, dict[int, Data] | None]]:
    """(key, value, per-SM values) of every entry, decoded; all-zero slots of multi-slot arrays are left
    out before decoding (an array has every slot, most of them unused)."""
    m = storage.mapdef
    keep_zero = m.type not in _ARRAYS or m.max_entries == 1
    if isinstance(storage, PercpuArrayStorage):
        cpus = storage.cpus()
        rows = []
        for i in range(m.max_entries):
            raws = {cpu: bytes(storage.per_cpu[cpu][i]) for cpu in cpus}
            if keep_zero or any(any(r) for r in raws.values()):
                rows.append(_summed(reader, m, struct.pack("<I", i), raws))
        return rows
    if isinstance(storage, PercpuHashStorage):
        return [_summed(reader, m, k, {cpu: bytes(v) for cpu, v in sorted(values.items())})
                for k, values in storage.entries.items()]
    return [(reader.key(m, k), reader.data(m.value_type_id, v), None) for k, v in storage.items()
            if keep_zero or any(v)]


def _summed(reader: "_Reader", m: MapDef, key: bytes, raws: dict[int, bytes]) -> tuple[Data, Data, dict[int, Data]]:
    """(key, value summed over SMs, per-SM values) of a per-CPU map's entry, from each SM's bytes."""
    per_sm = {cpu: reader.data(m.value_type_id, r) for cpu, r in raws.items()}
    # Summed from the first SM that wrote the slot: _add keeps what it cannot add (a kernel id, a
    # string) from its first operand, which must not be an unwritten slot's zeros.
    written = [per_sm[cpu] for cpu, r in raws.items() if any(r)]
    total = written[0] if written else reader.data(m.value_type_id, bytes(m.value_size))
    for v in written[1:]:
        total = _add(total, v)
    return reader.key(m, key), total, per_sm


_HIST_NAME = re.compile(r"(lhist)(\d*)|hist")
# A probe computes its linear slots itself, unbounded (bpftrace's lhist has a max), so slots 0 and 10**9
# would fill a billion buckets: past this many from the first used slot to the last, a run of empty slots
# becomes one empty [lo, hi) bucket.
MAX_BUCKETS = 1024


def _histogram(m: MapDef, rows: list[tuple[Data, Data, dict | None]]) -> Histogram | None:
    match = _HIST_NAME.match(m.name)
    if match is None:
        return None
    linear = match.group(1) is not None
    # A log2 slot of a 64-bit value is at most 63: a larger key is a value, and filling the slots up to it
    # would never end.
    if not all(_is_int(k) and _is_int(v) and 0 <= k and (linear or k < 64) for k, v, _ in rows):
        return None
    counts: dict[int, int] = {}
    for k, v, _ in rows:
        counts[int(k)] = counts.get(int(k), 0) + int(v)
    return histogram(m.name, "linear" if linear else "log2", int(match.group(2) or 1) if linear else 1, counts)


def histogram(name: str, scale: str, step: int, counts: Mapping[int, int]) -> Histogram:
    """The Histogram of slot -> count (the module docstring's slots), empty slots between filled in; past
    MAX_BUCKETS, each run of empty slots is one empty bucket."""
    used = sorted(k for k, v in counts.items() if v)
    if not used:
        return Histogram(name, scale, step, 0, (), ())
    slots: Sequence[int] = range(used[0], used[-1] + 1)
    if len(slots) > MAX_BUCKETS:   # a gap's bucket ends where the next used slot begins: it is slot next - 1's
        slots = [s for a, b in zip(used, used[1:]) for s in ((a, b - 1) if b - a > 1 else (a,))] + used[-1:]
    if scale == "linear":
        lower, labels = used[0] * step, tuple((k + 1) * step for k in slots)
    else:
        lower, labels = (0 if used[0] == 0 else 1 << used[0]), tuple(1 << (k + 1) for k in slots)
    return Histogram(name, scale, step, lower, labels, tuple(counts.get(k, 0) for k in slots))


def _is_int(v: Data) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _add(a: Data, b: Data) -> Data:
    """Per-SM values summed: ints add, structs and arrays element by element, the rest keeps the first."""
    if _is_int(a) and _is_int(b):
        return a if isinstance(a, (KernelId, Address)) else a + b
    if isinstance(a, float) and isinstance(b, float):
        return a + b
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: _add(v, b[k]) if k in b else v for k, v in a.items()}
    if isinstance(a, list) and isinstance(b, list):
        return [_add(x, y) for x, y in zip(a, b)]
    return a


def _order(v: Data) -> tuple:
    """A sort key that orders any decoded key: numbers numerically, then text, then the rest."""
    if isinstance(v, (int, float)):
        return (0, v)
    if isinstance(v, str):
        return (1, v)
    if isinstance(v, dict):
        return (2, tuple(_order(x) for x in v.values()))
    if isinstance(v, list):
        return (2, tuple(_order(x) for x in v))
    return (3, repr(v))


class _Reader:
    """Bytes -> Data by BTF type id (or by size alone when a map has no BTF)."""

    def __init__(self, btf: btfmod.Btf | None, kernel_names: Mapping[int, str]) -> None:
        self.btf = btf
        self.kernel_names = kernel_names
        self._by_size: dict[int, int | None] | None = None

    def record_type(self, size: int) -> int | None:
        """The type of a ring-buffer record of ``size`` bytes with no type named for its map: the probe's
        one named struct or union of that size (struct egpu_ctx aside), else None (hex)."""
        if self.btf is None:
            return None
        if self._by_size is None:
            self._by_size = {}
            for t in self.btf.types[1:]:
                if t.kind in (btfmod.KIND_STRUCT, btfmod.KIND_UNION) and t.name and t.name != CTX_STRUCT:
                    self._by_size[t.size] = None if t.size in self._by_size else t.id
        return self._by_size.get(size)

    def key(self, m: MapDef, raw: bytes) -> Data:
        key = self.data(m.key_type_id, raw)
        # A u64 key equal to a known kernel id is one (hash_count.bpf.c: keyed by ctx->kernel_id).
        if m.key_size == 8 and _is_int(key) and key in self.kernel_names:
            return KernelId(key)
        return key

    def data(self, type_id: int | None, raw: bytes) -> Data:
        if type_id is None or self.btf is None or len(raw) < self.btf.size(type_id):
            return int.from_bytes(raw, "little") if len(raw) in (1, 2, 4, 8) else Symbol(raw.hex())
        return self._decode(type_id, raw, 0, 0)

    def _decode(self, type_id: int, raw: bytes, off: int, depth: int) -> Data:
        btf = self.btf
        t = btf.resolve(type_id)
        if depth > 64:
            return Symbol("...")
        if t.kind == btfmod.KIND_INT:
            return _int(t, int.from_bytes(raw[off:off + t.size], "little"))
        if t.kind == btfmod.KIND_PTR:
            return Address(int.from_bytes(raw[off:off + 8], "little"))
        if t.kind in (btfmod.KIND_ENUM, btfmod.KIND_ENUM64):
            return _enum(t, int.from_bytes(raw[off:off + t.size], "little"), t.size * 8)
        if t.kind == btfmod.KIND_FLOAT:
            fmt = {4: "<f", 8: "<d"}.get(t.size)
            return struct.unpack_from(fmt, raw, off)[0] if fmt else Symbol(raw[off:off + t.size].hex())
        if t.kind == btfmod.KIND_ARRAY:
            elem = btf.resolve(t.ref)
            if elem.kind == btfmod.KIND_INT and elem.size == 1 and (elem.name == "char"
                                                                  or elem.int_encoding & btfmod.INT_CHAR):
                return raw[off:off + t.nelems].split(b"\0", 1)[0].decode("utf-8", "backslashreplace")
            step = btf.size(t.ref)
            return [self._decode(t.ref, raw, off + i * step, depth + 1) for i in range(t.nelems)] if step else []
        if t.kind in (btfmod.KIND_STRUCT, btfmod.KIND_UNION):
            out: dict[str, Data] = {}
            for m in t.members:
                if m.bitfield_size:
                    word = int.from_bytes(raw[off:off + t.size], "little")
                    value: Data = self._bitfield(m, (word >> m.bit_offset) & ((1 << m.bitfield_size) - 1))
                else:
                    value = self._decode(m.type, raw, off + m.offset, depth + 1)
                if not m.name and isinstance(value, dict):
                    out.update(value)  # anonymous struct/union: its fields are the parent's, as in C
                    continue
                if m.name == KERNEL_ID_FIELD and _is_int(value):
                    value = KernelId(value)
                out[m.name] = value
            return out
        if t.kind == btfmod.KIND_DATASEC:
            return {btf.type(v.type).name: self._decode(v.type, raw, off + v.offset, depth + 1)
                    for v in t.secinfos}
        if t.kind == btfmod.KIND_VAR:
            return self._decode(t.ref, raw, off, depth + 1)
        return Symbol(raw[off:off + btf.size(type_id)].hex())

    def _bitfield(self, m: btfmod.Member, raw: int) -> Data:
        """A bitfield's bits as its member's type (C: an int bitfield is signed, ``int x : 4`` holds -8..7)."""
        t = self.btf.resolve(m.type)
        if t.kind == btfmod.KIND_INT:
            return _int(t, raw, m.bitfield_size)
        if t.kind in (btfmod.KIND_ENUM, btfmod.KIND_ENUM64):
            return _enum(t, raw, m.bitfield_size)
        return raw


def _int(t: btfmod.Type, raw: int, bits: int = 0) -> int | bool:
    """``raw`` as the integer type ``t``; ``bits``: a bitfield's width, its bits already taken out."""
    if not bits:
        bits = t.int_bits or t.size * 8
        if bits < t.size * 8:
            raw = (raw >> t.int_bit_offset) & ((1 << bits) - 1)
    if t.int_encoding & btfmod.INT_BOOL:
        return bool(raw)
    if t.int_encoding & btfmod.INT_SIGNED:
        raw = btfmod.signed(raw, bits)
    return raw


def _enum(t: btfmod.Type, raw: int, bits: int) -> Data:
    """An enum's ``bits`` low bits as its value's name, else its number (signed where BTF says so). BTF
    keeps a 32-bit enum's values signed whatever the enum's sign: match either reading."""
    signed = btfmod.signed(raw, bits)
    v = signed if t.kind_flag else raw
    names = [e.name for e in t.enum_values if e.value in (raw, signed)]
    return Symbol(names[0]) if names else v


def encode(obj: BpfObject, type_id: int | None, data: object, size: int) -> bytes:
    """Plain data (a value as output/json.py writes it) as the ``size`` bytes of BTF type ``type_id`` of
    ``obj``: what _Reader.data decodes, encoded back (maps filled from a JSON document). A struct's fields
    left out, and the bytes no field covers, are zero. EgpuError saying which part does not fit."""
    return _Writer(_btf(obj)).data(type_id, data, size)


class _Writer:
    """Plain data -> bytes by BTF type id, _Reader's inverse."""

    def __init__(self, btf: btfmod.Btf | None) -> None:
        self.btf = btf

    def data(self, type_id: int | None, v: object, size: int) -> bytes:
        buf = bytearray(size)
        if type_id is None or self.btf is None or size < self.btf.size(type_id):
            if size in (1, 2, 4, 8):   # _Reader's int of an untyped value
                buf[:] = _int_bytes(v, size * 8, False, "")
            else:                      # its hex
                buf[:] = _hex_bytes(v, size, "")
        else:
            self._encode(type_id, v, buf, 0, "")
        return bytes(buf)

    def _encode(self, type_id: int, v: object, buf: bytearray, off: int, where: str) -> None:
        t = self.btf.resolve(type_id)
        if t.kind == btfmod.KIND_INT:
            bits = t.int_bits or t.size * 8
            raw = int.from_bytes(_int_bytes(v, bits, bool(t.int_encoding & btfmod.INT_SIGNED), where), "little")
            buf[off:off + t.size] = (raw << t.int_bit_offset).to_bytes(t.size, "little")
        elif t.kind == btfmod.KIND_PTR:
            buf[off:off + 8] = _int_bytes(v, 64, False, where)
        elif t.kind in (btfmod.KIND_ENUM, btfmod.KIND_ENUM64):
            v = _enum_value(t, v)
            buf[off:off + t.size] = _int_bytes(v, t.size * 8, t.kind_flag or (isinstance(v, int) and v < 0), where)
        elif t.kind == btfmod.KIND_FLOAT and t.size in (4, 8):
            if isinstance(v, bool) or not isinstance(v, (int, float, str)):
                raise EgpuError(f"{where or 'value'}: {v!r} is not a number")
            try:   # plain() writes NaN and the infinities as strings
                struct.pack_into("<f" if t.size == 4 else "<d", buf, off, float(v))
            except (ValueError, OverflowError):
                raise EgpuError(f"{where or 'value'}: {v!r} is not a {t.size * 8}-bit float") from None
        elif t.kind == btfmod.KIND_ARRAY:
            self._array(t, v, buf, off, where)
        elif t.kind in (btfmod.KIND_STRUCT, btfmod.KIND_UNION, btfmod.KIND_DATASEC):
            self._fields(t, v, buf, off, where)
        elif t.kind == btfmod.KIND_VAR:
            self._encode(t.ref, v, buf, off, where)
        else:
            n = self.btf.size(type_id)
            buf[off:off + n] = _hex_bytes(v, n, where)

    def _array(self, t: btfmod.Type, v: object, buf: bytearray, off: int, where: str) -> None:
        elem = self.btf.resolve(t.ref)
        if elem.kind == btfmod.KIND_INT and elem.size == 1 and (elem.name == "char"
                                                              or elem.int_encoding & btfmod.INT_CHAR):
            # _Reader spells bytes that are not UTF-8 \xNN (backslashreplace): those are bytes again
            text = re.sub(rb"\\x([0-9a-f]{2})", lambda m: bytes.fromhex(m[1].decode()), v.encode()) \
                if isinstance(v, str) else None
            if text is None or len(text) > t.nelems:
                raise EgpuError(f"{where or 'value'}: {v!r} is not a string of at most {t.nelems} bytes")
            buf[off:off + len(text)] = text
            return
        if not isinstance(v, list) or len(v) != t.nelems:
            raise EgpuError(f"{where or 'value'}: {v!r} is not a list of {t.nelems}")
        step = self.btf.size(t.ref)
        for i, x in enumerate(v):
            self._encode(t.ref, x, buf, off + i * step, f"{where}[{i}]")

    def _fields(self, t: btfmod.Type, v: object, buf: bytearray, off: int, where: str) -> None:
        """A struct's or union's members by name (an anonymous member's as the parent's, as _Reader merges
        them), or a DATASEC's variables."""
        if not isinstance(v, dict):
            raise EgpuError(f"{where or 'value'}: {v!r} is not an object of fields")
        fields = self._members(t, off)
        for name, x in v.items():
            if name not in fields:
                raise EgpuError(f"{where or 'value'}: no field {name!r} (its fields: {', '.join(fields)})")
            type_id, at, member = fields[name]
            inner = f"{where}.{name}" if where else name
            if member is not None and member.bitfield_size:   # ``at``: the field's first bit
                t_int = self.btf.resolve(member.type)
                signed = t_int.kind == btfmod.KIND_INT and bool(t_int.int_encoding & btfmod.INT_SIGNED)
                if t_int.kind in (btfmod.KIND_ENUM, btfmod.KIND_ENUM64):
                    x = _enum_value(t_int, x)
                    signed = isinstance(x, int) and x < 0
                raw = int.from_bytes(_int_bytes(x, member.bitfield_size, signed, inner), "little")
                lo, hi = at // 8, (at + member.bitfield_size + 7) // 8
                word = int.from_bytes(buf[lo:hi], "little") | raw << (at % 8)
                buf[lo:hi] = word.to_bytes(hi - lo, "little")
            else:
                self._encode(type_id, x, buf, at, inner)

    def _members(self, t: btfmod.Type, off: int) -> dict[str, tuple[int, int, btfmod.Member | None]]:
        """Field name -> (type id, offset; a bitfield's: its first bit, counted from the buffer's start;
        the member)."""
        if t.kind == btfmod.KIND_DATASEC:
            return {self.btf.type(s.type).name: (s.type, off + s.offset, None) for s in t.secinfos}
        out: dict[str, tuple[int, int, btfmod.Member | None]] = {}
        for m in t.members:
            inner = self.btf.resolve(m.type)
            if not m.name and inner.kind in (btfmod.KIND_STRUCT, btfmod.KIND_UNION):
                out.update(self._members(inner, off + m.offset))
            else:
                out[m.name] = (m.type, off * 8 + m.bit_offset if m.bitfield_size else off + m.offset, m)
        return out


def _enum_value(t: btfmod.Type, v: object) -> object:
    """An enum's value by its name (as _enum shows it); anything else as it is."""
    return next((e.value for e in t.enum_values if e.name == v), v) if isinstance(v, str) else v


def _int_bytes(v: object, bits: int, signed: bool, where: str) -> bytes:
    """An integer (a bool as 0 or 1) in ``bits`` bits, two's complement when ``signed``, as bytes."""
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if not isinstance(v, int) or not lo <= v <= hi:
        raise EgpuError(f"{where or 'value'}: {v!r} is not an integer from {lo} to {hi}")
    return (int(v) & ((1 << bits) - 1)).to_bytes((bits + 7) // 8, "little")


def _hex_bytes(v: object, size: int, where: str) -> bytes:
    """``size`` bytes written in hex (as _Reader shows bytes it has no type for)."""
    try:
        raw = bytes.fromhex(v) if isinstance(v, str) else None
    except ValueError:
        raw = None
    if raw is None or len(raw) != size:
        raise EgpuError(f"{where or 'value'}: {v!r} is not {size} bytes in hex")
    return raw
