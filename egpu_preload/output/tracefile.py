"""The trace file of egpu-run --trace FILE: every record of every ring and perf buffer, in one Apache
Parquet file, or one Arrow IPC file when FILE ends in .arrow or .feather (pyarrow, the optional extra
``egpu[trace]``), which pandas, polars, DuckDB, Spark or pyarrow read without egpu.

Columnar because a memory trace is billions of rows of a few integer fields: per-column encoding and
compression make them small, and every data tool reads both forms. Parquet is the smaller and the more
widely read; Arrow IPC is written 2-3x faster (no encoding, its buffers compressed with zstd on every
core: 1 M access records in 0.08 s against 0.19 s on the CI machine, bench/bench_trace_writer.py), for
traces whose drain would otherwise wait for the writer; warp memory records, whose bytes are one column, only
1.2-1.3x (1 M in 0.21-0.29 s against 0.26-0.36 s: zstd over that column, on one core, is most of either).
Perfetto's protobuf suits records with a ``ts`` only; ``egpu trace --perfetto`` converts to it, ``egpu trace
--parquet`` from Arrow IPC to Parquet.

Columns, one row per record, in the order each ring committed them:
- ``map`` (string, dictionary encoded): the ring or perf map's name; ``trace_printk`` for that ring
- ``seq`` (uint64): the record's index within its map (0, 1, 2, ...: a gap would be a lost record)
- ``cpu`` (uint32): the SM that wrote it, perf's CPU on the GPU (perf_event_output and trace_printk
  records; 0 for ringbuf)
- one column per member of the map's record struct (its BTF layout: integers, enums, pointers, floats;
  char arrays as strings; short integer arrays a column per element, ``name[i]``; nested structs
  flattened as ``outer.inner``; bitfields extracted), null in
  rows of other maps; a member named as one of these columns, or that two record types give
  different types, is prefixed with its map's name (``events.cpu``)
- ``data`` (binary): the bytes of a record with no struct layout (none known, or of another size), and of
  every record of a ring only egpu_warp_mem_record writes (runtime/probes.warp_rings): warp memory
  records, whose size follows from their lanes, named ``struct egpu_warp_mem`` in the metadata below
- ``text`` (string): a trace_printk line, formatted

The schema's metadata ``egpu.record_types`` (JSON) names each map's record struct, where readers that
expand a record type (a warp-level memory record into per-lane rows: ``EXPANDERS``) find it. Each map's
count of records the probes dropped (``egpu.dropped``, JSON) is written last: in a Parquet file's
metadata; in an Arrow IPC file, as the custom metadata of its last record batch (which has no rows),
since an IPC file's own metadata is fixed when it is opened.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..bpf import btf as btfmod
from ..descriptors import Held, high
from ..errors import EgpuError
from ..maps import format_trace
from . import warp_records
from .text import CONTROL_ESCAPES
from .values import CTX_STRUCT

TRACE_PRINTK = "trace_printk"
FIXED = ("map", "seq", "cpu", "data", "text")   # the columns every trace file has
RECORD_TYPES, DROPPED = "egpu.record_types", "egpu.dropped"   # keys of the file's metadata (JSON)
UNCLOSED = "egpu.unclosed"   # a key of a Parquet file converted from a trace never closed: its drops unknown
MAX_ELEMS = 16                # integer arrays up to this long become a column per element, name[i]
FLUSH_ROWS = 1 << 16          # records buffered per map before they become a row group
# Arrow IPC: a map's records written once the oldest has waited this long (flush_due), however few, so a job
# killed mid-trace loses about this much time of records, not up to FLUSH_ROWS a map. A drain at full rate
# fills FLUSH_ROWS in milliseconds and never meets it; below FLUSH_ROWS a second it writes a batch a map a
# second, each compressed alone: 1 M access records arriving at 100 K/s wrote the same 17 batches, 2.16 MB, at
# 20 K/s 49 batches, 2.25 MB (+4%), at 5 K/s 192 batches, 2.55 MB (+18%, 0.23 s of writing over 200 s).
FLUSH_S = 1.0
CHUNK_ROWS = 1 << 12          # struct rows split into columns a cache-sized piece at a time
BINARY_BYTES = (1 << 31) - 1  # the bytes a binary array's 32-bit offsets reach
NEEDS_PYARROW = "needs pyarrow (pip install 'egpu[trace]')"
ARROW_SUFFIXES = (".arrow", ".feather")   # FILE written as Arrow IPC; any other name, Parquet
ARROW_MAGIC = b"ARROW1"
PARQUET_MAGIC = b"PAR1"   # a Parquet file's first and last four bytes
# Dictionaries only for names and text, level-1 zstd, no column statistics: a record column's values are
# mostly distinct, and the other settings wrote 2.5x slower (129 against 318 MB/s of access records on the
# CI machine) into a larger file.
PARQUET = {"compression": "zstd", "compression_level": 1, "use_dictionary": ["map", "text"],
           "write_statistics": False}

# record type name ("struct NAME") -> a function from that type's rows (a pyarrow Table) to the rows it
# stands for; egpu trace applies it before filtering (warp-level records expand to one row per lane).
EXPANDERS: dict[str, Callable[[Any], Any]] = {warp_records.RECORD_TYPE: warp_records.expand_table}


def arrow_name(path: Path) -> bool:
    """Whether egpu-run --trace writes ``path`` as Arrow IPC (its suffix one of ARROW_SUFFIXES, in any case: T.ARROW
    was written as Parquet, which a reader the name sent to Arrow IPC could not open)."""
    return path.suffix.lower() in ARROW_SUFFIXES


@dataclass(frozen=True)
class Column:
    """One column of a record struct: ``size`` bytes at ``offset`` of the record."""

    name: str
    offset: int
    size: int
    kind: str                # u | i | f (numbers), str (char array), bytes (anything else)
    bits: tuple[int, int] | None = None   # a bitfield: (shift within the u``size`` word, width)


@dataclass(frozen=True)
class RecordLayout:
    type_name: str           # "struct NAME"
    size: int
    columns: tuple[Column, ...]


def whole_records(type_name: str) -> RecordLayout:
    """The layout of records kept whole in ``data`` whose type a reader may still expand (``EXPANDERS``):
    warp memory records, whose size follows from their mask and form."""
    return RecordLayout(type_name, 0, ())


def record_layout(btf: btfmod.Btf, type_id: int) -> RecordLayout:
    """The columns of a struct type, flattened."""
    t = btf.resolve(type_id)
    cols: list[Column] = []
    _flatten(btf, type_id, "", 0, cols, 0)
    return RecordLayout(f"struct {t.name}", t.size, tuple(cols))


def _flatten(btf: btfmod.Btf, type_id: int, prefix: str, base: int, out: list[Column], depth: int) -> None:
    for m in btf.members(type_id):
        name, off = prefix + m.name, base + m.offset
        t = btf.resolve(m.type)
        if t.kind in (btfmod.KIND_STRUCT, btfmod.KIND_UNION) and depth < 8:
            _flatten(btf, m.type, name + ".", off, out, depth + 1)
        elif m.bitfield_size:
            word = btf.size(m.type)
            start = off - off % word
            out.append(Column(name, start, word, "i" if t.int_encoding & btfmod.INT_SIGNED else "u",
                              (m.bit_offset - start * 8, m.bitfield_size)))
        elif t.kind == btfmod.KIND_INT and t.size in (1, 2, 4, 8):
            out.append(Column(name, off, t.size, "i" if t.int_encoding & btfmod.INT_SIGNED else "u"))
        elif t.kind in (btfmod.KIND_ENUM, btfmod.KIND_ENUM64) and t.size in (1, 2, 4, 8):
            out.append(Column(name, off, t.size, "i" if t.kind_flag else "u"))
        elif t.kind == btfmod.KIND_PTR:
            out.append(Column(name, off, 8, "u"))
        elif t.kind == btfmod.KIND_FLOAT and t.size in (4, 8):
            out.append(Column(name, off, t.size, "f"))
        elif t.kind == btfmod.KIND_ARRAY and btfmod._is_char(btf.resolve(t.ref)):
            out.append(Column(name, off, btf.size(m.type), "str"))
        elif t.kind == btfmod.KIND_ARRAY and _int_like(btf.resolve(t.ref)) and t.nelems <= MAX_ELEMS:
            elem = btf.resolve(t.ref)
            kind = "i" if elem.kind == btfmod.KIND_INT and elem.int_encoding & btfmod.INT_SIGNED else "u"
            out += [Column(f"{name}[{i}]", off + i * elem.size, elem.size, kind) for i in range(t.nelems)]
        elif btf.size(m.type):
            out.append(Column(name, off, btf.size(m.type), "bytes"))


def _int_like(t: btfmod.Type) -> bool:
    return t.kind in (btfmod.KIND_INT, btfmod.KIND_ENUM, btfmod.KIND_ENUM64) and t.size in (1, 2, 4, 8)


def record_struct(btf: btfmod.Btf | None) -> int | None:
    """The BTF type of a probe's ring records, which BTF does not tie to the map: its one named struct
    with a ``ts`` member, else its one named struct (struct egpu_ctx aside); None when unclear."""
    if btf is None:
        return None
    structs = [t for t in btf.types[1:] if t.kind == btfmod.KIND_STRUCT and t.name and t.name != CTX_STRUCT]
    timed = [t for t in structs if any(m.name == "ts" for m in t.members)]
    for group in (timed, structs):
        if len(group) == 1:
            return group[0].id
    return None


def arrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401  (the submodule the writer and reader use)
    except ImportError:
        raise EgpuError(f"the trace file {NEEDS_PYARROW}") from None
    return pyarrow


def _arrow_type(pa: Any, c: Column) -> Any:
    if c.kind == "str":
        return pa.string()
    if c.kind == "bytes":
        return pa.binary()
    if c.kind == "f":
        return pa.float32() if c.size == 4 else pa.float64()
    return getattr(pa, f"{'int' if c.kind == 'i' else 'uint'}{8 * c.size}")()


class TraceWriter:
    """Rows into the Parquet file as records arrive: ``add(map index, records)``; ``close()`` at the end.

    ``maps``: each drained ring's name and record layout (None: raw ``data``), in the drain's order."""

    def __init__(self, path: Path, maps: Sequence[tuple[str, RecordLayout | None]]) -> None:
        self.pa = pa = arrow()
        self.maps = list(maps)
        self.path = path
        types: dict[str, Any] = {}
        clash: set[str] = set(FIXED)
        for _, lay in self.maps:
            for c in lay.columns if lay else ():
                t = _arrow_type(pa, c)
                if types.setdefault(c.name, t) != t:
                    clash.add(c.name)
        self.names = [{c.name: f"{name}.{c.name}" if c.name in clash else c.name for c in lay.columns}
                      if lay else {} for name, lay in self.maps]
        fields = [pa.field("map", pa.dictionary(pa.int32(), pa.string())), pa.field("seq", pa.uint64()),
                  pa.field("cpu", pa.uint32())]
        seen: set[str] = set()
        for (_, lay), names in zip(self.maps, self.names):
            for c in lay.columns if lay else ():
                if names[c.name] not in seen:
                    seen.add(names[c.name])
                    fields.append(pa.field(names[c.name], _arrow_type(pa, c)))
        fields += [pa.field("data", pa.binary()), pa.field("text", pa.string())]
        self.record_types = {name: lay.type_name for name, lay in self.maps if lay}
        self.map_names = pa.array([name for name, _ in self.maps])   # every batch's one dictionary (IPC: must be)
        self.schema = pa.schema(fields)
        self.seq = [0] * len(self.maps)
        self.pending: list[list[Any]] = [[] for _ in self.maps]
        self.rows = [0] * len(self.maps)   # records pending, per map
        self.since = [0.0] * len(self.maps)   # when each map's oldest pending record came (time.monotonic)
        self.written = 0   # rows in the file
        schema = self.schema.with_metadata({RECORD_TYPES: json.dumps(self.record_types)})
        self.arrow = arrow_name(path)
        try:
            self.file = _File(high(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)), path)
        except OSError as e:
            raise EgpuError(f"--trace: cannot write: {e.strerror or e}", file=str(path)) from None
        self.sink, self.writer = self._open(pa.PythonFile(self.file, mode="w"), schema)
        self._warm_up(schema)

    def _open(self, sink: Any, schema: Any) -> tuple[Any, Any]:
        pa = self.pa
        if self.arrow:
            # zstd (Arrow's level 1) is most of an IPC write: 80% of the writer's CPU time for 1 M warp records on the
            # CI machine, their bytes one buffer a batch, which one core compresses (Arrow compresses a batch's buffers
            # in parallel, not one buffer in pieces). lz4 wrote them 1.75x faster into a file 1.73x larger (per-lane
            # records: 1.5x faster, 3.2x larger); zstd's negative levels were no faster there (2026-12-07).
            return sink, pa.ipc.new_file(sink, schema, options=pa.ipc.IpcWriteOptions(compression="zstd",
                                                                                      use_threads=True))
        return sink, pa.parquet.ParquetWriter(sink, schema, **PARQUET)

    def _warm_up(self, schema: Any) -> None:
        """One row written and closed in memory the way the file's are. pyarrow's C++ sets up some of its
        state at its first use and registers that state's teardown then, with the C exit handlers that
        run last registered first; done here, before the runtime arms its exit hook again, that teardown
        comes after the hook, whose last batches still need it (writing Arrow IPC, the H200's vecadd
        segfaulted in write_table at exit, 2026-12-04d)."""
        _, writer = self._open(self.pa.BufferOutputStream(), schema)
        writer.write_table(self.pa.table(self._blank_rows(1), schema=self.schema))
        writer.close()

    def _blank_rows(self, n: int) -> list[Any]:
        """Columns of ``n`` rows of the first map with every other field null."""
        pa = self.pa
        return [pa.DictionaryArray.from_arrays(pa.array([0] * n, pa.int32()), self.map_names)] + \
            [pa.nulls(n, f.type) for f in self.schema][1:]

    def add(self, index: int, taken: Sequence[Any]) -> None:
        """Map ``index``'s new records: (cpu, bytes) tuples, or records taken at once (runtime/ring_drain.py:
        a Block of one size, ``cpus`` and ``rows``; a Packed of mixed sizes, ``cpus``, ``data``, ``offsets``;
        both with ``len`` and ``records()``)."""
        if not self.rows[index]:
            self.since[index] = time.monotonic()
        self.pending[index].extend(taken)
        self.rows[index] += sum(1 if isinstance(x, tuple) else len(x) for x in taken)
        if self.rows[index] >= FLUSH_ROWS:
            self._flush(index)

    def flush_due(self) -> None:
        """Arrow IPC: write each map's records whose oldest has waited FLUSH_S, what a killed job's file keeps
        (a Parquet file it never closed keeps nothing: its rows are found through the footer close writes)."""
        if self.arrow:
            now = time.monotonic()
            for i, n in enumerate(self.rows):
                if n and now - self.since[i] >= FLUSH_S:
                    self._flush(i)

    def _flush(self, index: int) -> None:
        import numpy as np   # a dependency of pyarrow
        items, n, (name, lay) = self.pending[index], self.rows[index], self.maps[index]
        lay = lay if lay and lay.columns else None   # a layout of no columns: records kept whole in ``data``
        if not items:
            return
        self.pending[index], self.rows[index] = [], 0
        cpus, data, offsets = _packed(np, items) if name != TRACE_PRINTK else (None, None, None)
        if data is not None and lay is None:   # no object per record: their bytes as they came
            table = self._table(index, cpus, None, blob=(data, offsets))
        elif data is not None and (offsets[1:] - offsets[:-1] == lay.size).all():
            table = self._table(index, cpus, data.reshape(n, lay.size))
        else:   # trace_printk's, or records of another size than the struct's among them
            records = [r for x in items for r in (x.records() if not isinstance(x, tuple) else (x,))]
            fits = [lay is not None and len(d) == lay.size for _, d in records]
            rows = [d for (_, d), ok in zip(records, fits) if ok]
            raw = np.frombuffer(b"".join(rows), np.uint8).reshape(len(rows), lay.size) if rows else None
            table = self._table(index, np.fromiter((c for c, _ in records), np.uint32, n), raw, records,
                                None if all(fits) else fits)
        self.writer.write_table(table)
        self.written += n

    def _table(self, index: int, cpus: Any, raw: Any, records: list[tuple[int, bytes]] | None = None,
               fits: list[bool] | None = None, blob: tuple[Any, Any] | None = None) -> Any:
        """Rows of map ``index``: ``raw`` holds the struct rows (those ``fits`` marks, where only some are;
        ``records`` every record, where some are not struct rows or the map has no struct; ``blob`` the
        records of a map with no struct, their bytes back to back and where each starts, numpy arrays)."""
        import numpy as np
        pa, (name, lay), n = self.pa, self.maps[index], len(cpus)
        cols: dict[str, Any] = {
            "map": pa.DictionaryArray.from_arrays(pa.array(np.full(n, index, np.int32)), self.map_names),
            "seq": pa.array(np.arange(self.seq[index], self.seq[index] + n, dtype=np.uint64)),
            "cpu": pa.array(cpus),
        }
        self.seq[index] += n
        if lay is not None and raw is not None:
            words = _words(raw, [c for c in lay.columns if c.kind in ("u", "i", "f")])
            for c in lay.columns:
                cols[self.names[index][c.name]] = self._column(raw, words.get(c.name), c, fits)
        if name == TRACE_PRINTK and records is not None:
            cols["text"] = pa.array([format_trace(d[24:], _args(d)) for _, d in records])
        elif records is not None and (raw is None or fits is not None):
            cols["data"] = pa.array([None if fits and fits[i] else d for i, (_, d) in enumerate(records)],
                                    pa.binary())
        elif blob is not None:
            cols["data"] = _binary(pa, *blob)
        return pa.table([cols.get(f.name, pa.nulls(n, f.type)) for f in self.schema], schema=self.schema)

    def _column(self, raw: Any, word: Any, c: Column, fits: list[bool] | None) -> Any:
        """Column ``c`` of the struct rows ``raw`` (``word``: its values as unsigned words, for a number);
        ``fits``: which records they are, where some are not."""
        import numpy as np
        pa = self.pa
        part = raw[:, c.offset:c.offset + c.size]
        if word is not None:
            values = word.view(f"<{c.kind}{c.size}")
            if c.bits is not None:
                shift, width = c.bits
                values = (word >> np.uint64(shift)) & np.uint64((1 << width) - 1)
                if c.kind == "i":
                    values = values.astype(np.int64)
                    values = np.where(values >= 1 << (width - 1), values - (1 << width), values)
                values = values.astype(f"<{c.kind}{c.size}")
        elif c.kind == "str":
            values = [bytes(r).split(b"\0", 1)[0].decode(errors="replace") for r in part]
        else:
            values = [bytes(r) for r in part]
        if fits is not None:   # records of another size: null here, their bytes in ``data``
            it = iter(values)
            values = [_item(next(it)) if ok else None for ok in fits]
        return pa.array(values, _arrow_type(pa, c))

    def close(self, dropped: Mapping[str, int]) -> None:
        """Every record written, each map's dropped count in the file's metadata (its footer is last)."""
        for i in range(len(self.maps)):
            self._flush(i)
        counts = {DROPPED: json.dumps(dict(dropped))}
        if self.arrow:
            self.writer.write_batch(self.pa.RecordBatch.from_arrays(self._blank_rows(0), schema=self.schema),
                                    custom_metadata=counts)
        else:
            self.writer.add_key_value_metadata(counts)
        self.writer.close()
        self.sink.close()
        self.file.held.close()

    def let_go(self) -> None:
        """In a child forked from the writing process: the file's descriptor made /dev/null's, so the child holds
        nothing of the parent's file and writes nothing into it (pyarrow closes a Parquet writer it frees, footer
        and all: that write finds /dev/null where the file was, and fails)."""
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, self.file.held.fd, inheritable=False)
        finally:
            os.close(null)
        self.file.path = None


class _File:
    """The trace file as pyarrow writes it (through pa.PythonFile), at the offset it has reached, on a descriptor of
    egpu's (descriptors): a job that closes its descriptors (a daemon) closed this one too, then got its number for
    a file of its own (pa.OSFile's 7, in a Python job its 8th open), and the trace's footer went into the program's
    file while the trace stayed empty, reported as "0 records, none dropped". Each write now goes to egpu's file
    only: the descriptor it lost is opened again by the path, where that is still the file egpu made (its st_dev,
    st_ino), and the trace goes on whole; else the write fails, saying why. A stat a write: pyarrow writes pages."""

    closed = False

    def __init__(self, fd: int, path: Path) -> None:
        self.held = Held(fd)
        self.path: Path | None = path   # None: never opened again (a forked child's, let go of)
        self.at = 0

    def write(self, data: Any) -> None:
        if not self.held.ours():
            self._reopen()
        view = memoryview(data)
        while view:
            n = os.pwrite(self.held.fd, view, self.at)
            self.at += n
            view = view[n:]

    def _reopen(self) -> None:
        lost, self.held = self.held, Held(-1)   # the old number is not egpu's to close
        try:
            again = Held(high(os.open(self.path, os.O_WRONLY | os.O_CLOEXEC))) if self.path else Held(-1)
        except OSError:
            again = Held(-1)
        if again.file is None or again.file != lost.file:
            again.close()
            raise OSError(f"the job closed egpu's descriptor of it (fd {lost.fd}), as a daemon closes every "
                          "descriptor, and the file is no longer at its path: the records from then on are lost")
        self.held = again

    def flush(self) -> None:
        pass

    def close(self) -> None:   # the descriptor is closed by TraceWriter.close, where it is still egpu's
        self.closed = True


def _joined(np: Any, arrays: Sequence[Any]) -> Any:
    """The arrays one after the other: the one itself where there is one (no copy)."""
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def _packed(np: Any, items: Sequence[Any]) -> tuple[Any, Any, Any]:
    """(SM ids, bytes back to back, where each record starts and the last ends) of records as the reader
    hands them on: Blocks and Packed as they are, single records (a few between runs) joined."""
    cpus, data, lengths, single = [], [], [], []

    def singles() -> None:
        if single:
            cpus.append(np.array([c for c, _ in single], np.uint32))
            data.append(np.frombuffer(b"".join(d for _, d in single), np.uint8))
            lengths.append(np.array([len(d) for _, d in single], np.int64))
            single.clear()

    for x in items:
        if isinstance(x, tuple):
            single.append(x)
            continue
        singles()
        cpus.append(x.cpus)
        if hasattr(x, "rows"):
            data.append(np.ascontiguousarray(x.rows).reshape(-1))
            lengths.append(np.full(len(x), x.rows.shape[1], np.int64))
        else:
            data.append(x.data)
            lengths.append(np.diff(x.offsets))
    singles()
    offsets = np.zeros(sum(len(x) for x in lengths) + 1, np.int64)
    np.cumsum(_joined(np, lengths), out=offsets[1:])
    return _joined(np, cpus).astype(np.uint32, copy=False), _joined(np, data), offsets


def _binary(pa: Any, data: Any, offsets: Any) -> Any:
    """Records as a binary column, their bytes as they are (``data``, uint8) and ``offsets`` made 32-bit: no
    cast, no compute kernel, whose registry pyarrow would set up (and register the teardown of) at its first
    use in the job's exit, after the exit hook (mem_trace_warp's job segfaulted there on the H200,
    2026-12-04e). In chunks of under BINARY_BYTES, the most a binary array's 32-bit offsets reach."""
    import numpy as np
    n, bounds = len(offsets) - 1, [0]
    while bounds[-1] < n:
        at = bounds[-1]
        bounds.append(min(n, max(at + 1, int(np.searchsorted(offsets, offsets[at] + BINARY_BYTES, "right")) - 1)))
    chunks = []
    for a, b in zip(bounds, bounds[1:]):
        part = (offsets[a:b + 1] - offsets[a]).astype(np.int32)
        values = data[offsets[a]:offsets[b]]
        chunks.append(pa.Array.from_buffers(pa.binary(), b - a, [None, pa.py_buffer(part), pa.py_buffer(values)]))
    return pa.chunked_array(chunks, pa.binary())


def _words(raw: Any, numbers: Sequence[Column]) -> dict[str, Any]:
    """Each number column of the struct rows ``raw`` as contiguous unsigned words, all of them taken
    CHUNK_ROWS rows at a time: a row is read from memory once, not once per column (a column at a time,
    byte by byte, was the writer's slowest step: 264 MB/s of access records by itself on the CI machine)."""
    import numpy as np
    views = {c.name: raw[:, c.offset:c.offset + c.size].view(f"<u{c.size}")[:, 0] for c in numbers}
    out = {name: np.empty(len(v), v.dtype) for name, v in views.items()}
    for start in range(0, len(raw), CHUNK_ROWS):
        end = start + CHUNK_ROWS
        for name, v in views.items():
            out[name][start:end] = v[start:end]
    return out


def _item(v: Any) -> Any:
    return v.item() if hasattr(v, "item") else v


def _args(data: bytes) -> tuple[int, int, int]:
    return tuple(int.from_bytes(data[8 * k:8 * k + 8], "little") for k in range(3))  # type: ignore[return-value]


def prepare(path: Path) -> Path:
    """Before the job starts (egpu-run --trace FILE): pyarrow is there, FILE can be written, and an old
    FILE is gone (the job's first process claims it: runtime/streaming.py); FILE made absolute."""
    arrow()
    path = path.absolute()
    if path.is_dir():
        raise EgpuError("--trace: is a directory", file=str(path))
    # FILE is removed and made anew: run as root, --trace /dev/null put a regular file in /dev/null's place
    if path.exists() and not path.is_file():
        raise EgpuError("--trace: not a regular file (a device, a pipe): the trace is a file egpu-run makes anew",
                        file=str(path))
    if path.is_symlink():   # the file it points to is replaced, not the link
        path = path.resolve()
    if not path.parent.is_dir():
        raise EgpuError("--trace: no such directory", file=str(path.parent))
    try:
        path.unlink(missing_ok=True)
        path.touch()
        path.unlink()
    except OSError as e:
        raise EgpuError(f"--trace: cannot write ({e.strerror})", file=str(path)) from None
    return path


# ---- reading: egpu trace FILE -------------------------------------------------------------------------

@dataclass
class Trace:
    rows: Any                      # a pyarrow Table, expanded
    record_types: dict[str, str]   # map -> "struct NAME"
    dropped: dict[str, int]        # map -> records the probes dropped
    complete: bool = True          # False: an Arrow IPC file never closed, read as far as its batches go,
                                   # or a Parquet file converted from one


def read(path: Path, expanders: Mapping[str, Callable[[Any], Any]] = EXPANDERS) -> Trace:
    """The file's rows, each map's rows put through the expander of its record type (if any)."""
    pa = arrow()
    if not path.exists():
        raise EgpuError("no such file", file=str(path))
    if path.is_dir():
        raise EgpuError("is a directory", file=str(path))
    if stat.S_ISFIFO(path.stat().st_mode):   # <(cat t.arrow) read "not a trace file: ... not seekable"; a FIFO hung
        raise EgpuError("is a pipe, not a file: a trace file is read from its end (give the file itself)",
                        file=str(path))
    try:
        table, meta, complete = _load(path, pa)
        table.validate(full=True)   # a damaged file fails here, not halfway through printing it
        if len(set(table.column_names)) != table.num_columns:
            raise ValueError("a column name appears twice")
        for f, column in zip(table.schema, table.columns):
            if not f.nullable and column.null_count:
                raise ValueError(f"column {f.name}: nulls in a column declared without them")
            if not _printable(pa, f.type):   # --json and the filters would meet it halfway through
                raise ValueError(f"column {f.name} is {f.type}, which egpu-run never writes (integers, floats, "
                                 "text, bytes)")
        types = _labels((table.schema.metadata or {}).get(RECORD_TYPES.encode(), b"{}"), str)
        dropped = _labels(meta.get(DROPPED.encode(), b"{}"), int)
    except (OSError, ValueError, pa.ArrowException) as e:   # pyarrow's, and a damaged file's metadata
        raise EgpuError(f"not a trace file: {e}", file=str(path)) from None
    if "map" not in table.column_names or "seq" not in table.column_names:
        raise EgpuError("not a trace file: no map and seq columns", file=str(path))
    if table.column("map").null_count or table.column("seq").null_count:
        raise EgpuError("not a trace file: records without a map or a seq", file=str(path))
    wanted = {m for m, t in types.items() if t in expanders}
    if wanted:
        import pyarrow.compute as pc
        names = table.column("map").cast(pa.string())
        parts = [table.filter(pc.invert(pc.is_in(names, pa.array(sorted(wanted)))))]
        for m in sorted(wanted):
            try:
                rows = expanders[types[m]](table.filter(pc.equal(names, m)))
            except ValueError as e:   # a record the expander cannot read (warp_records.WarpRecordError)
                raise EgpuError(f"map {m}: not {types[m]} records: {e}", file=str(path)) from None
            parts.append(_apart(rows, parts[0].schema, m))
        table = pa.concat_tables(parts, promote_options="permissive")
        last = [c for c in ("data", "text") if c in table.column_names]   # where a file's columns have them
        table = table.select([c for c in table.column_names if c not in last] + last)
    return Trace(table, types, dropped, complete)


def _printable(pa: Any, t: Any) -> bool:
    """A column type of egpu-run's (integers, floats, text, bytes, map names in a dictionary), or one another
    writer may turn it into; what every output prints and a filter compares."""
    t = t.value_type if pa.types.is_dictionary(t) else t
    return any(is_(t) for is_ in (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean, pa.types.is_null,
                                  pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
                                  pa.types.is_large_binary, pa.types.is_fixed_size_binary))


def _labels(text: bytes, kind: type) -> dict[str, Any]:
    """A metadata entry the writer made: a JSON object of map names to ``kind``; ValueError if not."""
    try:
        d = json.loads(text)
    except RecursionError:   # nested past Python's limit: no writer of egpu's made it
        raise ValueError(f"its metadata is not egpu's: {text[:80]!r}") from None
    if not isinstance(d, dict) or not all(isinstance(k, str) and type(v) is kind for k, v in d.items()):
        raise ValueError(f"its metadata is not egpu's: {text[:80]!r}")
    return d


def _apart(rows: Any, schema: Any, name: str) -> Any:
    """Map ``name``'s expanded rows with each column another map's struct gives another type prefixed with
    the map's name, as the writer prefixes clashing struct members (``events.cpu``)."""
    clash = {f.name for f in rows.schema if f.name in schema.names and schema.field(f.name).type != f.type}
    return rows.rename_columns([f"{name}.{c}" if c in clash else c for c in rows.column_names])


def _load(path: Path, pa: Any) -> tuple[Any, Mapping[bytes, bytes], bool]:
    """(every row, the metadata that holds the dropped counts, whether the file was closed) of a Parquet or
    Arrow IPC trace file, told apart by the file's first bytes, not its name. An IPC file its job never
    closed has no footer: its batches are read as the stream they are, up to the first one cut short."""
    with open(path, "rb") as f:
        head = f.read(len(ARROW_MAGIC))
        size = f.seek(0, 2)
        f.seek(-min(4, size), 2)
        tail = f.read(4) if size >= 2 * len(PARQUET_MAGIC) else b""   # not the head again
    if not head:   # what egpu-run --trace leaves of a job killed before its first rows
        raise pa.ArrowInvalid("empty: the job that had it ended (killed?) before it wrote a record")
    if head[:4] == PARQUET_MAGIC and tail != PARQUET_MAGIC:   # rows are found through the footer close writes
        raise pa.ArrowInvalid("a Parquet file never closed (its job killed?): its records cannot be read; "
                              "a trace in Arrow IPC (--trace FILE.arrow) keeps what a killed job wrote")
    if head != ARROW_MAGIC and (head[:4] != PARQUET_MAGIC or tail != PARQUET_MAGIC):
        raise pa.ArrowInvalid("neither an Arrow IPC file nor a Parquet file (egpu-run --trace writes one)")
    if head != ARROW_MAGIC:
        meta = pa.parquet.read_metadata(str(path)).metadata or {}
        return pa.parquet.read_table(str(path)), meta, UNCLOSED.encode() not in meta
    try:
        with pa.OSFile(str(path)) as source:
            reader = pa.ipc.open_file(source)
            table = reader.read_all()
            last = reader.num_record_batches - 1
            meta = reader.get_batch_with_custom_metadata(last)[1] if last >= 0 else None
        return table, dict(meta or {}), True
    except pa.ArrowInvalid:
        pass
    with pa.OSFile(str(path)) as source:
        source.seek(8)   # the magic, padded: the stream starts after it
        reader = pa.ipc.open_stream(source)
        batches = []
        try:
            for batch in reader:
                batches.append(batch)
        except (pa.ArrowInvalid, OSError):   # the batch being written when the job died
            pass
        return pa.Table.from_batches(batches, reader.schema), {}, False


def to_parquet(trace: Trace, path: Path) -> None:
    """``trace``'s rows as a Parquet trace file, with its record types and dropped counts (egpu trace hands
    them over unexpanded, so a reader expands them once); of a trace never closed, whose counts are unknown, none
    but UNCLOSED, so that it reads as one never closed (as {}, it read as a whole trace that lost nothing)."""
    pa = arrow()
    schema = trace.rows.schema.with_metadata({RECORD_TYPES: json.dumps(trace.record_types)})
    with open(path, "wb") as f, pa.parquet.ParquetWriter(f, schema, **PARQUET) as w:   # OSError: the OS's reason
        w.write_table(trace.rows.cast(schema))
        w.add_key_value_metadata({DROPPED: json.dumps(trace.dropped)} if trace.complete else {UNCLOSED: "true"})


def where(table: Any, conditions: Sequence[str], source: str) -> Any:
    """Rows where every ``field=value`` holds (a number in any base Python reads, else text)."""
    import pyarrow.compute as pc
    pa = arrow()
    for cond in conditions:
        name, eq, text = cond.partition("=")
        if not eq or name not in table.column_names:
            known = ", ".join(table.column_names)
            raise EgpuError(f"--where {cond}: expected FIELD=VALUE with FIELD one of {known}", file=source)
        column = table.column(name)
        if pa.types.is_dictionary(column.type):
            names = {v for chunk in column.chunks for v in chunk.dictionary.to_pylist()}
            if names and text not in names:   # a map the trace has none of, as a typo reads: not a silent nothing
                raise EgpuError(f"--where {cond}: no {name} of that name in the trace (its maps: "
                                f"{', '.join(sorted(names))})", file=source)
            column = column.cast(pa.string())
        try:
            value = _value(text, column.type, pa)
            table = table.filter(pc.fill_null(pc.equal(column, pa.scalar(value, column.type)), False))
        except (ValueError, OverflowError, pa.ArrowException):
            raise EgpuError(f"--where {cond}: {text!r} is not a value of {name} ({column.type})",
                            file=source) from None
    return table


def _value(text: str, arrow_type: Any, pa: Any) -> Any:
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return text
    if pa.types.is_floating(arrow_type):
        return float(text)
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return bytes.fromhex(text)
    return int(text, 0)


def rows(table: Any, limit: int | None) -> Iterator[dict]:
    """Plain dicts, one batch of the table at a time, nulls (other maps' columns) left out."""
    if limit is not None:
        table = table.slice(0, limit)
    for batch in table.to_batches():
        for r in batch.to_pylist():
            yield {k: v for k, v in r.items() if v is not None}


def text_line(row: Mapping[str, Any]) -> str:
    """``map #seq sm=N field=value ...`` (addresses and other large numbers in hex), one line: a newline in a
    printk's text or a string column split the record across lines; control characters are escaped, but for the
    newline that ends a printk's text, which ends its line (as trace_pipe shows bpf_printk's lines)."""
    printk = row["map"].rsplit(":", 1)[-1] == TRACE_PRINTK
    shown = {k: v.removesuffix("\n") if printk and k == "text" and isinstance(v, str) else v for k, v in row.items()}
    fields = " ".join(f"{k}={_show(v)}" for k, v in shown.items() if k not in ("map", "seq"))
    return f"{row['map']} #{row['seq']} {fields}".translate(CONTROL_ESCAPES)


def _show(v: Any) -> str:
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, int) and v >= 1 << 32:
        return hex(v)
    return str(v)


def json_line(row: Mapping[str, Any]) -> str:
    return json.dumps({k: v.hex() if isinstance(v, bytes) else v for k, v in row.items()})


def to_perfetto(trace_rows: Iterable[dict], path: Path, name: str) -> int:
    """Records with an integer ``ts`` as instants on one track per map (output/perfetto.py); how many."""
    from .perfetto import TS_FIELD, Trace as PerfettoTrace
    trace = PerfettoTrace(0, name)
    n = 0
    for r in trace_rows:
        ts = r.get(TS_FIELD)
        if isinstance(ts, int):
            args = {k: v.hex() if isinstance(v, bytes) else v for k, v in r.items() if k not in ("map", TS_FIELD)}
            trace.records.setdefault(r["map"], []).append((ts, args))
            n += 1
    trace.write(path)
    return n
