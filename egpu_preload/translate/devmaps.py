"""Maps in device memory: the layout the generated PTX and the host agree on, and the host side that
allocates regions, fills them from a MapsState and reads them back into one.

A probe module finds its maps through ``.visible .const .align 8 .u64 __egpu_maps_<tag>[N+1]``: entry i
is the device address of map i's region, entry N that of the trace_printk ring. The table is in the
constant space so that every lane's load is one broadcast from the constant cache; the runtime fills it
after cuModuleLoad with cuModuleGetGlobal + cuMemcpyHtoD. Several modules may share the same regions.

Every region starts with a 64-byte header, then its data (all offsets below are from the region start):

- ARRAY (and global data .bss/.data/.rodata): ``max_entries`` slots of ``round8(value_size)`` bytes at 64.
- PERCPU_ARRAY: header u32 ncpu at 0 (the number of SM ids, %nsmid); then ncpu arrays laid out as ARRAY,
  array c for the SM whose %smid is c, each starting on its own 128-byte line (``cpu_stride``): the L2
  serializes atomics per line, so SMs that bump their own counter must not share one.
  A PERTHREAD_ARRAY (bpftime's per-thread array) has this layout with one array per GPU thread instead,
  array t for the thread whose global index is t (the u32 at 0 counts them: maps.PerthreadArrayStorage).
  A striped ARRAY (MapDef.stripe, striping.py) has this layout too, with ``spread`` rows per SM (the
  header's u32 counts rows: ncpu * spread); a warp adds to row %smid * spread + %warpid % spread, since
  one line takes an SM's atomics one at a time. Its host copy stays one array, row 0 of the initial
  image, and reading the region sums the rows lane by lane (``stripe`` bytes a lane).
- HASH / LRU_HASH: header u32 count at 0 (live entries, enforces max_entries); ``nbuckets`` (a power of
  two, 2x max_entries, 4x for LRU) slots of: u32 state at 0, u64 last-use time at 8 (LRU only), key at
  ``key_off`` (zero padded to 8), value at ``val_off``. States: EMPTY -> BUSY (claimed by one inserter
  with atom.cas) -> FULL (published with st.release) <-> DELETED. A slot never returns to EMPTY once it
  held a key, and a key owns the first slot it ever claimed on its probe sequence, so lookups never wait
  and two inserters of one key always meet on the same slot: lock-free, no lock held across a divergent
  spin (an inserter meeting BUSY waits for a thread that is only writing its key). Deleting a key keeps
  its slot as a tombstone that only that key can revive. Limitation: a HASH that sees more than
  nbuckets distinct keys over its life fills up (-E2BIG) even if they were deleted. LRU_HASH approximates
  LRU: when full, an insert evicts the least recently used of 8 slots from the key's home bucket.
- PERCPU_HASH / LRU_PERCPU_HASH: one key table as HASH / LRU_HASH's, whose slots hold no value (``val_off``
  is the slot's end), u32 ncpu at NCPU_OFF in the header (the number of SM ids, %nsmid); then, from
  ``rows_off`` (the slots' end, on a line), a row of ``nbuckets`` values (``round8(value_size)`` each) per
  SM, row c for the SM whose %smid is c, each on lines of its own (``cpu_stride``): bucket i's value for
  SM c at rows_off + c * cpu_stride + i * round8(value_size). A key is inserted, found, deleted and
  evicted as in a HASH, by one protocol for all SMs, so a delete removes it from every SM at once (one
  CAS, as Linux's), while each SM's lookups and updates touch its own row (its own lines: SMs that bump
  their own counter do not queue on one). An insert writes its SM's value, after zeroing the key's value
  in every row when it revives the key's tombstone (a slot never used holds zeros already), before it
  publishes the slot: a new key's other SMs read zeros, as Linux's (pcpu_init_value). A table of keys per
  SM instead would hold each key up to ncpu times (132 on an H100) and make a delete ncpu deletes; rows
  by bucket cost ncpu * nbuckets values (a 10,240-entry HASH of u64s on 132 SMs: 34.6 MB).
- RINGBUF / PERF_EVENT_ARRAY: header u64 head at 0 (next record position), u64 reserved at 8 (bytes
  granted), u64 consumed at 16 (written by the host reader), u64 dropped at 24. Data of ``capacity``
  bytes at 64, followed by ``capacity`` bytes of slack so that a record is always contiguous. A record
  at position p lives at 64 + p % capacity: u32 length at 0, u32 flags at 4 (BUSY, then READY or
  DISCARD published with st.release.sys; bits 8.. hold the SM id for perf records), data at 8, padded
  to 8. Producers never block: they take credit with atom.add on ``reserved`` and give it back and count
  a drop when ``reserved - consumed`` would exceed capacity, so a record is written only where the
  reader has made room. The host clears the headers of records it consumed before moving ``consumed``.
  After the slack, a 128-byte line per SM (u32 ncpu at 32 in the header counts them): u64 ``full`` at 0,
  the smallest record size refused on that SM (all ones: none), u64 drops at 8, and u64 ``committed`` at
  COMMITTED: the bytes (headers and padding included) of the records its producers published, added after
  the flag with a release (a ringbuf_reserve record's submit or discard finds its ring from the map's index
  that the reserve wrote above BUSY, where the program has more than one RINGBUF map). Every record is
  reserved before it is committed, so lines summed to ``head``, read before ``head`` is, prove every record
  below ``head`` complete: the reader copies them once and walks none of them (runtime/ring_drain.py). A
  record that crosses the end of the data writes, before it is committed, a mark at the data's first 8
  bytes (unused in that lap: the record's own bytes go on in the slack): u32 the bytes it has past the
  end, u32 flags REC_WRAP, which the reader needs to find the next record, at that offset, without
  walking. A producer whose
  record is at least ``full`` counts its drop there and takes no credit: a full ring costs a warp a load
  and an add on its SM's line instead of three atomics on the header line every producer shares. The
  ring fills for good only while no reader moves ``consumed`` (runtime/ring_drain.py does, and resets
  the lines once it has made room), and a
  refusal caused by credit another producer gives back makes the SM's later records of that size drop
  too: at most the credit in flight is left unused. The dropped count is the header's plus the lines'.
  A ring made to wait (MapLayout.wait, egpu-run --on-full wait): a producer takes credit and spins on
  ``consumed`` (ld.acquire.sys, the host moves it) until its record fits, so nothing is dropped but a
  record larger than the ring (counted on the SM's line, no credit taken). A warp's group takes at most
  ``capacity // size`` records at once and drops the rest, counted: only a ring smaller than a warp's
  records loses any. Such a ring needs a reader that moves ``consumed`` while kernels run
  (runtime/ring_drain.py). One that has not moved it for WAIT_STALL_NS (stuck behind the driver, or
  behind a probe that reserves a second record while it holds one unsubmitted: the reader stops at the
  first) no longer holds the kernel: each waiter then gives its credit back and counts its records on
  its SM's line as dropped. Credit given back can leave other waiters' bounds past what the ring will
  ever hold (their credit counted it), so they too drop theirs when the stall outlasts their wait; a
  producer's head position stays within the credit of the last producer to pass (the records it writes
  were made room for). The trace_printk ring always drops.
- trace_printk ring: a ring of TRACE_BYTES whose records hold u64 a1, a2, a3 then the format bytes. Its
  per-SM lines also count, at LOOPS_CUT (u64), the runs on that SM that a loop budget ended (bpf/verifier's
  LOOP_BUDGET: loops of directly-run programs), read back with its drops into MapsState.loops_cut. Its
  header also holds what the GPU's process helpers return, written by the process that allocates the
  regions, the application (bpf/helpers.py): at TGID (u32) its tgid, which bpf_get_current_pid_tgid returns
  as tgid << 32 | tgid (stored once, which leaves room for the rest); at UID_GID (u64) gid << 32 | uid, its
  real ids, as bpf_get_current_uid_gid returns them; and at COMM (TASK_COMM_LEN bytes) the name
  bpf_get_current_comm copies there: the application's main thread's when the regions were laid out.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, replace

from ..bpf import program as prog
from ..bpf.helpers import TASK_COMM_LEN, main_comm, uid_gid
from ..errors import EgpuError
from ..maps import PERF_BUFFER_BYTES, MapsState, MapStorage, PerthreadArrayStorage, TraceRecord

HEADER = 64
LINE = 128          # bytes of an L2 cache line
# A producer made to wait gives up (its record dropped, counted) once the reader has not moved
# ``consumed`` for this long: a reader stuck for good would otherwise stop the kernel, and the job, for ever.
# EGPU_WAIT_STALL_MS sets it (the GPU test of a stall, which should not take 10 s).
WAIT_STALL_NS = int(os.environ.get("EGPU_WAIT_STALL_MS", "10000")) * 1_000_000
RING_NCPU = 32      # a ring header's u32: how many per-SM lines follow the ring's slack
SPREAD, SPREAD_BYTES = 8, 8192   # a striped ARRAY's rows per SM, and the most bytes they may take an SM
EMPTY, BUSY, FULL, DELETED = 0, 1, 2, 3
REC_BUSY, REC_READY, REC_DISCARD, REC_WRAP = 1, 2, 4, 8
COMMITTED = 24      # in each per-SM line of a ring: the bytes of records committed there (counted ones)
TRACE_BYTES = 1 << 20
PRINTK_ARGS = struct.Struct("<QQQ")   # a trace_printk record's start: a1, a2, a3; the format after
TGID = 36           # in the trace ring's header, past RING_NCPU
LOOPS_CUT = 16      # in each per-SM line of the trace ring, past full and drops
UID_GID = 40        # in the trace ring's header
COMM = 48           # in the trace ring's header, TASK_COMM_LEN bytes to its end
LRU_WINDOW = 8
NCPU_OFF = 4        # a per-CPU hash's u32 ncpu, beside its live-entry count
HASH_SEED = 0xCBF29CE484222325
HASH_MUL = 0xFF51AFD7ED558CCD
M64 = (1 << 64) - 1


def round8(n: int) -> int:
    return (n + 7) // 8 * 8


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@dataclass(frozen=True)
class MapLayout:
    """Where a map's bytes are; see the module docstring."""

    kind: str          # array | percpu_array | hash | ringbuf | host (a map only host programs use: a bare header)
    stride: int = 0    # array slot / hash slot bytes
    entries: int = 0   # array entries / hash buckets (a power of two)
    key_size: int = 0
    value_size: int = 0
    key_off: int = 0   # in a hash slot
    val_off: int = 0   # in a hash slot
    lru: bool = False
    capacity: int = 0  # ring data bytes
    value_off: int = HEADER  # array slot 0 / ring data
    stripe: int = 0    # percpu_array holding a striped ARRAY: the width of the lanes summed when read
    spread: int = 1    # rows per SM (a power of two; only a striped ARRAY has more than one)
    threads: int = 0   # percpu_array holding a PERTHREAD_ARRAY: its arrays, one per thread (not per SM)
    wait: bool = False  # ringbuf: a producer that finds no room waits for the reader (MapDef.wait)
    percpu: bool = False  # hash: a value per SM in rows after the slots (PERCPU_HASH, LRU_PERCPU_HASH)

    @property
    def lines_off(self) -> int:
        """Where a ring's per-SM lines start: after its data and slack."""
        return HEADER + 2 * self.capacity

    @property
    def cpu_stride(self) -> int:
        """Bytes from one SM's array (percpu_array) or row of values (a per-CPU hash) to the next: whole cache
        lines."""
        return _lines(self.entries * (round8(self.value_size) if self.percpu else self.stride))

    @property
    def rows_off(self) -> int:
        """Where a per-CPU hash's rows of values start: after its slots, on a line."""
        return _lines(HEADER + self.entries * self.stride)

    @property
    def ncpu_off(self) -> int:
        """Where the u32 counting a region's rows is: a per-CPU hash's beside its count."""
        return NCPU_OFF if self.kind == "hash" else 0

    def rows(self, ncpu: int) -> int:
        """How many arrays a percpu_array region holds on a device of ``ncpu`` SMs (stripes aside)."""
        return self.threads or ncpu

    def region_size(self, ncpu: int = 1) -> int:
        if self.kind == "ringbuf":
            return self.lines_off + ncpu * LINE
        if self.kind == "percpu_array":
            return HEADER + self.rows(ncpu) * self.spread * self.cpu_stride
        if self.percpu:
            return self.rows_off + ncpu * self.cpu_stride
        return HEADER + self.entries * self.stride


def _lines(n: int) -> int:
    """n bytes rounded up to whole cache lines."""
    return -(-n // LINE) * LINE


def _spread(row: int) -> int:
    """Rows per SM for a striped ARRAY of ``row``-byte rows: up to SPREAD, within SPREAD_BYTES an SM."""
    n = SPREAD
    while n > 1 and n * row > SPREAD_BYTES:
        n //= 2
    return n


def layout(m: prog.MapDef) -> MapLayout:
    if m.type == prog.MAP_ARRAY:
        if not m.stripe:
            return MapLayout("array", round8(m.value_size), m.max_entries, 4, m.value_size)
        lay = MapLayout("percpu_array", round8(m.value_size), m.max_entries, 4, m.value_size, stripe=m.stripe)
        return replace(lay, spread=_spread(lay.cpu_stride))
    if m.type == prog.MAP_PERCPU_ARRAY:
        return MapLayout("percpu_array", round8(m.value_size), m.max_entries, 4, m.value_size)
    if m.type == prog.MAP_PERTHREAD_ARRAY:
        return MapLayout("percpu_array", round8(m.value_size), m.max_entries, 4, m.value_size,
                         threads=PerthreadArrayStorage.THREADS)
    if m.type in prog.HASHES:
        lru, percpu = m.type in (prog.MAP_LRU_HASH, prog.MAP_LRU_PERCPU_HASH), m.type in prog.PERCPU_HASHES
        key_off = 16 if lru else 8
        val_off = key_off + round8(m.key_size)
        buckets = _pow2(max((4 if lru else 2) * m.max_entries, 2))
        return MapLayout("hash", val_off + (0 if percpu else round8(m.value_size)), buckets, m.key_size,
                         m.value_size, key_off, val_off, lru, percpu=percpu)
    if m.type == prog.MAP_RINGBUF:
        return MapLayout("ringbuf", capacity=m.max_entries, wait=m.wait)
    if m.type == prog.MAP_PERF_EVENT_ARRAY:
        return MapLayout("ringbuf", capacity=PERF_BUFFER_BYTES, wait=m.wait)
    if m.type in prog.HOST_ONLY_MAPS:   # no GPU program may use it (runtime/probes.py): its contents stay on the host
        return MapLayout("host")
    raise ValueError(f"map type {m.type}")  # the loader admits only the types above


def trace_layout() -> MapLayout:
    return MapLayout("ringbuf", capacity=TRACE_BYTES)


def value_at(lay: MapLayout, bucket: int, cpu: int) -> int:
    """Where SM ``cpu``'s value of the key in ``bucket`` is in a per-CPU hash's region."""
    return lay.rows_off + cpu * lay.cpu_stride + bucket * round8(lay.value_size)


def key_chunks(key: bytes) -> list[int]:
    padded = key + b"\0" * (-len(key) % 8)
    return [int.from_bytes(padded[i:i + 8], "little") for i in range(0, len(padded), 8)]


def slot_hash(key: bytes) -> int:
    """The bucket hash of a key; helpers_ptx.emit_hash computes the same on the device."""
    h = HASH_SEED
    for c in key_chunks(key):
        h = ((h ^ c) * HASH_MUL) & M64
        h ^= h >> 33
    return h


# ---- host images of regions ------------------------------------------------------------------

class NoRow(EgpuError):
    """A map's value for an SM (or thread) its region on this device has no row for."""


def _check_rows(m: prog.MapDef, lay: MapLayout, storage: MapStorage, ncpu: int) -> None:
    """NoRow where a per-CPU map holds a value other than zero for an SM past the ``ncpu`` a device's regions have
    rows for: its region would leave it out, and the map's sums with it (a document of another GPU's maps, egpu
    run-on-gpu --maps). Zeros are left out, as the device starts them. A striped array is not one: its rows are
    egpu's, its values one array's."""
    if lay.kind == "percpu_array" and not lay.stripe:
        rows, values = lay.rows(ncpu), ((cpu, v) for cpu in storage.cpus() for _, v in storage.items(cpu))
    elif lay.kind == "hash" and lay.percpu:
        rows, values = ncpu, ((cpu, v) for per in storage.entries.values() for cpu, v in per.items())
    else:
        return
    past = sorted(cpu for cpu, v in values if cpu >= rows and any(v))
    if past:
        what = "threads" if lay.threads else "SMs"
        raise NoRow(f"map {m.name}: a value for {what[:-1]} {past[0]}, but its region on this device has rows "
                    f"for {rows} {what} (0-{rows - 1})")


def region_image(m: prog.MapDef, state_storage: MapStorage, ncpu: int) -> bytes:
    """The initial bytes of a map's region, from its host storage (MapsState entry); NoRow for a per-CPU value
    other than zero on an SM the region has no row for."""
    lay = layout(m)
    if lay.kind == "ringbuf":
        return ring_image(lay, ncpu)
    _check_rows(m, lay, state_storage, ncpu)
    img = bytearray(lay.region_size(ncpu))
    if lay.kind == "array" or lay.stripe:   # a striped array's values start in row 0
        if lay.stripe:
            struct.pack_into("<I", img, 0, ncpu * lay.spread)
        for i, (_, v) in enumerate(state_storage.items()):
            img[HEADER + i * lay.stride:HEADER + i * lay.stride + len(v)] = v
    elif lay.kind == "percpu_array":
        struct.pack_into("<I", img, 0, lay.rows(ncpu))
        for cpu in state_storage.cpus():
            if cpu < lay.rows(ncpu):
                for i, (_, v) in enumerate(state_storage.items(cpu)):
                    o = HEADER + cpu * lay.cpu_stride + i * lay.stride
                    img[o:o + len(v)] = v
    elif lay.kind == "hash":
        n = 0
        for k, v in state_storage.items():
            idx = slot_hash(k) & (lay.entries - 1)
            while struct.unpack_from("<I", img, HEADER + idx * lay.stride)[0] != EMPTY:
                idx = (idx + 1) & (lay.entries - 1)
            o = HEADER + idx * lay.stride
            struct.pack_into("<I", img, o, FULL)
            img[o + lay.key_off:o + lay.key_off + len(k)] = k
            if lay.percpu:
                for cpu, value in state_storage.entries[k].items():
                    if cpu < ncpu:
                        o = value_at(lay, idx, cpu)
                        img[o:o + len(value)] = value
            else:
                img[o + lay.val_off:o + lay.val_off + len(v)] = v
            n += 1
        struct.pack_into("<I", img, 0, n)
        if lay.percpu:
            struct.pack_into("<I", img, NCPU_OFF, ncpu)
    return bytes(img)


def ring_image(lay: MapLayout, ncpu: int) -> bytes:
    """An empty ring: no record, no SM's ring full yet."""
    img = bytearray(lay.region_size(ncpu))
    struct.pack_into("<I", img, RING_NCPU, ncpu)
    for cpu in range(ncpu):
        struct.pack_into("<Q", img, lay.lines_off + cpu * LINE, M64)
    return bytes(img)


def trace_image(ncpu: int) -> bytes:
    """An empty trace ring, with this process's tgid, uid_gid and main thread's name in its header."""
    img = bytearray(ring_image(trace_layout(), ncpu))
    struct.pack_into("<I", img, TGID, os.getpid())
    struct.pack_into("<Q", img, UID_GID, uid_gid())
    img[COMM:COMM + TASK_COMM_LEN] = main_comm()
    return bytes(img)


def read_ring(img: bytes, lay: MapLayout) -> tuple[list[tuple[int, bytes]], int, int]:
    """Records (SM id, data) committed in a ring region image, the dropped count, and the position up
    to which records are complete (the reader stops at the first record still being written)."""
    head, _reserved, consumed, dropped = struct.unpack_from("<QQQQ", img, 0)
    ncpu = struct.unpack_from("<I", img, RING_NCPU)[0]
    dropped += sum(struct.unpack_from("<Q", img, lay.lines_off + cpu * LINE + 8)[0] for cpu in range(ncpu))
    out: list[tuple[int, bytes]] = []
    pos = consumed
    while pos < head:
        o = HEADER + pos % lay.capacity
        length, flags = struct.unpack_from("<II", img, o)
        if not flags & (REC_READY | REC_DISCARD):
            break
        if flags & REC_READY:
            out.append((flags >> 8, bytes(img[o + 8:o + 8 + length])))
        pos += 8 + round8(length)
    return out, dropped, pos


def apply_region(state: MapsState, index: int, img: bytes) -> None:
    """Replace the host contents of map ``index`` with what a device region image holds."""
    storage = state[index]
    m = storage.mapdef
    lay = layout(m)
    if lay.kind == "array":
        for i in range(m.max_entries):
            o = HEADER + i * lay.stride
            storage.values[i][:] = img[o:o + m.value_size]
    elif lay.stripe:
        _sum_rows(storage.values, img, lay)
    elif lay.kind == "percpu_array":
        ncpu = struct.unpack_from("<I", img, 0)[0]
        blank = bytes(m.value_size)
        for cpu in range(ncpu):
            row = HEADER + cpu * lay.cpu_stride
            vals = [img[row + i * lay.stride:][:m.value_size] for i in range(m.max_entries)]
            if any(v != blank for v in vals) or cpu in storage.per_cpu:
                slots = storage._slots(cpu)
                for i, v in enumerate(vals):
                    slots[i][:] = v
    elif lay.kind == "host":
        return
    elif lay.kind == "hash":
        storage.entries.clear()
        ncpu = struct.unpack_from("<I", img, NCPU_OFF)[0] if lay.percpu else 0
        blank = bytes(m.value_size)
        for b in range(lay.entries):
            o = HEADER + b * lay.stride
            if struct.unpack_from("<I", img, o)[0] != FULL:
                continue
            key = bytes(img[o + lay.key_off:o + lay.key_off + m.key_size])
            if lay.percpu:   # the SMs that hold a value other than zeros, as a PERCPU_ARRAY's rows
                values = ((cpu, img[value_at(lay, b, cpu):value_at(lay, b, cpu) + m.value_size]) for cpu in range(ncpu))
                storage.entries[key] = {cpu: bytearray(v) for cpu, v in values if v != blank}
            else:
                storage.entries[key] = bytearray(img[o + lay.val_off:o + lay.val_off + m.value_size])
    else:
        records, dropped, _ = read_ring(img, lay)
        if m.type == prog.MAP_RINGBUF:
            storage.records = [data for _, data in records]
        else:
            storage.records = records
        storage.drops = dropped
        storage.used = sum(8 + round8(len(r[1])) for r in records)


def _sum_rows(values: list[bytearray], img: bytes, lay: MapLayout) -> None:
    """A striped ARRAY's values: its rows summed lane by lane, modulo 2^(8 * lane width)."""
    nrows = struct.unpack_from("<I", img, 0)[0]
    lanes, pad = lay.value_size // lay.stripe, lay.stride - lay.value_size
    lane = "I" if lay.stripe == 4 else "Q"
    row = struct.Struct("<" + (f"{lanes}{lane}" + (f"{pad}x" if pad else "")) * lay.entries)
    rows = [row.unpack_from(img, HEADER + r * lay.cpu_stride) for r in range(nrows)]
    mask = (1 << 8 * lay.stripe) - 1
    sums = [sum(col) & mask for col in zip(*rows)]
    value = struct.Struct(f"<{lanes}{lane}")
    for i, v in enumerate(values):
        v[:] = value.pack(*sums[i * lanes:(i + 1) * lanes])


def apply_images(state: MapsState, images: list[bytes]) -> MapsState:
    """A DeviceMaps' region images, in its order (every map's, then the trace ring's), into ``state``."""
    for i, img in enumerate(images):
        if i < len(state.maps):
            apply_region(state, i, img)
        else:
            apply_trace(state, img)
    return state


def apply_trace(state: MapsState, img: bytes) -> None:
    """Append the trace_printk records of a trace ring image to ``state.trace``; its dropped count and the runs
    loop budgets cut (the ring's own counts, which only grow) into ``state.trace_dropped`` and
    ``state.loops_cut``."""
    lay = trace_layout()
    records, dropped, _ = read_ring(img, lay)
    state.trace_dropped = max(state.trace_dropped, dropped)
    ncpu = struct.unpack_from("<I", img, RING_NCPU)[0]
    cut = sum(struct.unpack_from("<Q", img, lay.lines_off + cpu * LINE + LOOPS_CUT)[0] for cpu in range(ncpu))
    state.loops_cut = max(state.loops_cut, cut)
    for cpu, data in records:
        state.trace.append(TraceRecord(data[PRINTK_ARGS.size:], PRINTK_ARGS.unpack_from(data), cpu))


def host_available() -> int | None:
    """MemAvailable of /proc/meminfo in bytes; None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def check_room(maps: list[prog.MapDef], ncpu: int, device_free: int | None, host_free: int | None) -> None:
    """Refuse maps the job cannot hold, naming the largest, before anything is made: their regions in
    device memory; on the host, the image each region is made from and an ARRAY's own copy (a bytearray
    an entry). An attach of a HASH of 2^28 entries (12.9 GB) grew the job past the host's memory, and the
    kernel's OOM killer ended it."""
    if not maps:
        return
    sizes = [(layout(m).region_size(ncpu), m) for m in maps]
    device = sum(n for n, _ in sizes) + trace_layout().region_size(ncpu)
    host = device + sum(m.max_entries * (m.value_size + 64) for m in maps if layout(m).kind == "array")
    size, big = max(sizes, key=lambda s: s[0])
    what = f"map {big.name} ({big.max_entries:,} entries) needs {_gb(size)} of device memory, the maps {_gb(device)}"
    if device_free is not None and device > device_free:
        raise EgpuError(f"{what}: the GPU has {_gb(device_free)} free")
    if host_free is not None and host > host_free // 2:
        raise EgpuError(f"{what}, and as much host memory to build them ({_gb(host)} in all): the host has "
                        f"{_gb(host_free)} available, and egpu takes at most half")


class DeviceMaps:
    """The regions of an object's maps plus its trace ring in device memory, and the map table's bytes.

    ``mem`` is anything with ``alloc(n) -> int``, ``free(ptr)``, ``htod(ptr, bytes)`` and
    ``dtoh(ptr, n) -> bytes`` (gpu.Gpu on a device). ``ncpu`` sizes PERCPU_ARRAY and per-CPU hash maps: %nsmid.
    """

    def __init__(self, mem, state: MapsState, ncpu: int) -> None:
        self.mem = mem
        self.state = state
        self.ncpu = ncpu
        self.layouts = [layout(m) for m in state.maps] + [trace_layout()]
        self.addrs: list[int] = []
        images = [region_image(m, state[i], ncpu) for i, m in enumerate(state.maps)]
        images.append(trace_image(ncpu))
        self.images = images
        try:
            for img in images:
                self.addrs.append(mem.alloc(len(img)))
                mem.htod(self.addrs[-1], img)
        except Exception:
            self.free()
            raise

    def reset(self) -> None:
        """Put every region back as it was allocated (benchmarks: each launch starts from empty rings)."""
        for addr, img in zip(self.addrs, self.images):
            self.mem.htod(addr, img)

    def table(self) -> bytes:
        """The contents of ``__egpu_maps_<tag>``: one u64 device address per map, then the trace ring."""
        return struct.pack(f"<{len(self.addrs)}Q", *self.addrs)

    def read_back(self) -> MapsState:
        """Copy every region out and replace the MapsState's contents with it; returns the state."""
        return apply_images(self.state, [self.mem.dtoh(addr, lay.region_size(self.ncpu))
                                         for addr, lay in zip(self.addrs, self.layouts)])

    def free(self) -> None:
        for addr in self.addrs:
            self.mem.free(addr)
        self.addrs = []
