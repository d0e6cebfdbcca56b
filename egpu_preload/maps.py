"""Host-side map contents and output channels, with the kernel's semantics.

The reference VM runs probes against these containers, and the runtime fills the same containers from
GPU memory to print maps, so nothing here knows about the VM. Values are mutable ``bytearray``s: a
lookup hands out the value itself, as the kernel hands out a pointer into the map.

Return codes follow linux/kernel/bpf (arraymap.c, hashtab.c, ringbuf.c, queue_stack_maps.c, bloom_filter.c): 0 or
a negative errno.
"""

from __future__ import annotations

import re
import struct
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from .bpf import program as prog
from .bpf.helpers import BPF_ANY, BPF_EXIST, BPF_NOEXIST, PRINTK_CONVERSION
from .bpf.linux_names import map_type_name
from .errors import EgpuError

ENOENT, E2BIG, EAGAIN, EEXIST, EINVAL, ENOSPC = 2, 7, 11, 17, 22, 28
# Both ring buffers account each record as an 8-byte header plus the data rounded up to 8
# (BPF_RINGBUF_HDR_SZ and the record alignment of kernel/bpf/ringbuf.c).
RECORD_HEADER = 8
PERF_BUFFER_BYTES = 1 << 20  # per perf map: what egpu's GPU side allocates for perf records


def record_bytes(size: int) -> int:
    """Space one ring-buffer record of ``size`` data bytes takes."""
    return RECORD_HEADER + (size + 7) // 8 * 8


class MapStorage:
    """One map's contents. Keys and values are bytes of exactly key_size / value_size."""

    def __init__(self, mapdef: prog.MapDef) -> None:
        self.mapdef = mapdef

    def _check(self, what: str, data: bytes, size: int) -> None:
        if len(data) != size:
            raise EgpuError(f"map {self.mapdef.name}: {what} is {len(data)} bytes, expected {size}")

    def lookup(self, key: bytes, cpu: int = 0) -> bytearray | None:
        raise EgpuError(f"map {self.mapdef.name}: {prog.MAP_TYPE_NAMES[self.mapdef.type]} has no lookup")

    def update(self, key: bytes, value: bytes, flags: int = BPF_ANY, cpu: int = 0) -> int:
        raise EgpuError(f"map {self.mapdef.name}: {prog.MAP_TYPE_NAMES[self.mapdef.type]} has no update")

    def delete(self, key: bytes) -> int:
        raise EgpuError(f"map {self.mapdef.name}: {prog.MAP_TYPE_NAMES[self.mapdef.type]} has no delete")

    def items(self, cpu: int = 0) -> Iterator[tuple[bytes, bytes]]:
        return iter(())


class ArrayStorage(MapStorage):
    """ARRAY and global data: every index exists, zero-filled (or ``MapDef.initial``); no delete."""

    def __init__(self, mapdef: prog.MapDef) -> None:
        super().__init__(mapdef)
        self.values = [bytearray(mapdef.value_size) for _ in range(mapdef.max_entries)]
        if mapdef.initial is not None and self.values:
            self.values[0][:len(mapdef.initial)] = mapdef.initial[:mapdef.value_size]

    def _slots(self, cpu: int) -> list[bytearray]:
        return self.values

    def _index(self, key: bytes) -> int:
        self._check("key", key, 4)
        return struct.unpack("<I", key)[0]

    def lookup(self, key: bytes, cpu: int = 0) -> bytearray | None:
        i = self._index(key)
        return self._slots(cpu)[i] if i < self.mapdef.max_entries else None

    def update(self, key: bytes, value: bytes, flags: int = BPF_ANY, cpu: int = 0) -> int:
        # arraymap.c array_map_update_elem: flags checked, then the index, then NOEXIST (all exist).
        self._check("value", value, self.mapdef.value_size)
        if flags > BPF_EXIST:
            return -EINVAL
        i = self._index(key)
        if i >= self.mapdef.max_entries:
            return -E2BIG
        if flags == BPF_NOEXIST:
            return -EEXIST
        self._slots(cpu)[i][:] = value
        return 0

    def delete(self, key: bytes) -> int:
        return -EINVAL  # array elements cannot be deleted

    def items(self, cpu: int = 0) -> Iterator[tuple[bytes, bytes]]:
        for i, v in enumerate(self._slots(cpu)):
            yield struct.pack("<I", i), bytes(v)


class PercpuArrayStorage(ArrayStorage):
    """PERCPU_ARRAY: one array per SM (the "cpu" is the SM id), created zero-filled on first use."""

    def __init__(self, mapdef: prog.MapDef) -> None:
        MapStorage.__init__(self, mapdef)  # no shared array: every slot is per SM
        self.per_cpu: dict[int, list[bytearray]] = {}

    def _slots(self, cpu: int) -> list[bytearray]:
        if cpu not in self.per_cpu:
            self.per_cpu[cpu] = [bytearray(self.mapdef.value_size) for _ in range(self.mapdef.max_entries)]
        return self.per_cpu[cpu]

    def cpus(self) -> list[int]:
        return sorted(self.per_cpu)


class PerthreadArrayStorage(PercpuArrayStorage):
    """bpftime's PERGPUTD_ARRAY: one array per GPU thread, the "cpu" being the thread's global index
    (x + y * width + z * width * height over the grid, as bpftime's getGlobalThreadId). Like bpftime's
    default map, it holds THREADS threads; a thread past them finds no value (lookup NULL, update
    -E2BIG), where bpftime writes past its buffer."""

    THREADS = 1024  # bpftime_shm.hpp: gpu_thread_count's default

    def lookup(self, key: bytes, cpu: int = 0) -> bytearray | None:
        return super().lookup(key, cpu) if cpu < self.THREADS else None

    def update(self, key: bytes, value: bytes, flags: int = BPF_ANY, cpu: int = 0) -> int:
        if cpu >= self.THREADS:
            return -EINVAL if flags > BPF_EXIST else -E2BIG
        return super().update(key, value, flags, cpu)


class HashStorage(MapStorage):
    """HASH: at most max_entries keys; update flags as hashtab.c checks them."""

    def __init__(self, mapdef: prog.MapDef) -> None:
        super().__init__(mapdef)
        self.entries: OrderedDict[bytes, bytearray] = OrderedDict()

    def lookup(self, key: bytes, cpu: int = 0) -> bytearray | None:
        self._check("key", key, self.mapdef.key_size)
        return self.entries.get(bytes(key))

    def update(self, key: bytes, value: bytes, flags: int = BPF_ANY, cpu: int = 0) -> int:
        self._check("key", key, self.mapdef.key_size)
        self._check("value", value, self.mapdef.value_size)
        if flags > BPF_EXIST:
            return -EINVAL
        key = bytes(key)
        old = self.entries.get(key)
        if old is not None and flags == BPF_NOEXIST:
            return -EEXIST
        if old is None and flags == BPF_EXIST:
            return -ENOENT
        if old is not None:
            self._store(key, value, cpu)
            self._touch(key)
            return 0
        if len(self.entries) >= self.mapdef.max_entries and not self._evict():
            return -E2BIG
        self.entries[key] = self._new(value, cpu)
        return 0

    def _new(self, value: bytes, cpu: int) -> bytearray:
        """A new key's value(s), as an update by ``cpu`` makes them."""
        return bytearray(value)

    def _store(self, key: bytes, value: bytes, cpu: int) -> None:
        """An update's write to a key that is there."""
        self.entries[key][:] = value

    def _touch(self, key: bytes) -> None:
        """Hook for LRU ordering."""

    def _evict(self) -> bool:
        """Make room for one key; a plain hash map never evicts."""
        return False

    def delete(self, key: bytes) -> int:
        self._check("key", key, self.mapdef.key_size)
        return 0 if self.entries.pop(bytes(key), None) is not None else -ENOENT

    def items(self, cpu: int = 0) -> Iterator[tuple[bytes, bytes]]:
        for k, v in self.entries.items():
            yield k, bytes(v)


class LruHashStorage(HashStorage):
    """LRU_HASH: a full map evicts the least recently used key (lookups and updates count as use).

    The kernel's LRU is approximate (per-CPU lists); this is the exact order it approximates.
    """

    def lookup(self, key: bytes, cpu: int = 0) -> bytearray | None:
        value = super().lookup(key, cpu)
        if value is not None:
            self._touch(bytes(key))
        return value

    def _touch(self, key: bytes) -> None:
        self.entries.move_to_end(key)

    def _evict(self) -> bool:
        if self.entries:
            self.entries.popitem(last=False)
        return self.mapdef.max_entries > 0


class PercpuHashStorage(HashStorage):
    """PERCPU_HASH (hashtab.c's per-CPU form): a HASH whose keys each hold a value per SM (the "cpu" is the SM
    id; host programs are CPU 0). As a program's calls in Linux: a lookup gives the calling SM's value, an update
    writes only it (a new key's other SMs' values are zero), a delete removes the key from every SM. ``entries``
    holds each key's values by SM; an SM that never wrote one reads zeros (``value``)."""

    def __init__(self, mapdef: prog.MapDef) -> None:
        super().__init__(mapdef)
        self.entries: OrderedDict[bytes, dict[int, bytearray]] = OrderedDict()  # type: ignore[assignment]

    def value(self, key: bytes, cpu: int) -> bytearray:
        """SM ``cpu``'s value of a key that is there, zeros until it writes one."""
        return self.entries[key].setdefault(cpu, bytearray(self.mapdef.value_size))

    def lookup(self, key: bytes, cpu: int = 0) -> bytearray | None:
        self._check("key", key, self.mapdef.key_size)
        key = bytes(key)
        if key not in self.entries:
            return None
        self._touch(key)
        return self.value(key, cpu)

    def _new(self, value: bytes, cpu: int) -> dict[int, bytearray]:  # type: ignore[override]
        return {cpu: bytearray(value)}

    def _store(self, key: bytes, value: bytes, cpu: int) -> None:
        self.value(key, cpu)[:] = value

    def items(self, cpu: int = 0) -> Iterator[tuple[bytes, bytes]]:
        for k, values in self.entries.items():
            yield k, bytes(values.get(cpu, bytes(self.mapdef.value_size)))

    def cpus(self) -> list[int]:
        """The SMs that hold a value of some key."""
        return sorted({cpu for values in self.entries.values() for cpu in values})


class LruPercpuHashStorage(PercpuHashStorage, LruHashStorage):
    """LRU_PERCPU_HASH: a PERCPU_HASH that evicts as LRU_HASH does (a key's use, on any SM, is its use)."""


# The per-CPU maps: a value per SM for each key (and per thread for bpftime's per-thread array).
PERCPU_STORAGES = (PercpuArrayStorage, PercpuHashStorage)


class QueueStorage(MapStorage):
    """QUEUE of at most max_entries values, no key (queue_stack_maps.c): pop and peek take the oldest. ``items``
    yields them oldest first, with empty keys."""

    def __init__(self, mapdef: prog.MapDef) -> None:
        super().__init__(mapdef)
        self.values: deque[bytes] = deque()

    def push(self, value: bytes, flags: int) -> int:
        """BPF_EXIST makes room in a full map by dropping the oldest value; BPF_NOEXIST or more is -EINVAL."""
        self._check("value", value, self.mapdef.value_size)
        if flags & BPF_NOEXIST or flags > BPF_EXIST:
            return -EINVAL
        if len(self.values) >= self.mapdef.max_entries:
            if not flags & BPF_EXIST:
                return -E2BIG
            self.values.popleft()
        self.values.append(bytes(value))
        return 0

    def _next(self, pop: bool) -> bytes | None:
        if not self.values:
            return None
        return self.values.popleft() if pop else self.values[0]

    def take(self, pop: bool) -> tuple[int, bytes]:
        """(0, the next value) or (-ENOENT, zeros) when empty: pop removes it, peek leaves it."""
        value = self._next(pop)
        return (-ENOENT, bytes(self.mapdef.value_size)) if value is None else (0, value)

    def items(self, cpu: int = 0) -> Iterator[tuple[bytes, bytes]]:
        for v in self.values:
            yield b"", v


class StackStorage(QueueStorage):
    """STACK: as a QUEUE, but pop and peek take the newest value (a full one with BPF_EXIST still drops the
    oldest)."""

    def _next(self, pop: bool) -> bytes | None:
        if not self.values:
            return None
        return self.values.pop() if pop else self.values[-1]


class BloomStorage(MapStorage):
    """BLOOM_FILTER (bloom_filter.c): push sets a value's ``hashes`` bits, peek is 0 when all are set (the value may
    have been pushed), else -ENOENT (it never was). The bits (``bloom_bits``) are no entries: ``items`` has none.
    The hash is FNV-1a over the function's index then the value (bloom_hash), shim/launchvm.c's too."""

    def __init__(self, mapdef: prog.MapDef) -> None:
        super().__init__(mapdef)
        self.bits = bytearray(mapdef.bloom_bits // 8)

    def _positions(self, value: bytes) -> list[int]:
        self._check("value", value, self.mapdef.value_size)
        return [bloom_hash(i, value) & (self.mapdef.bloom_bits - 1) for i in range(self.mapdef.hashes)]

    def push(self, value: bytes, flags: int) -> int:
        if flags != BPF_ANY:
            return -EINVAL
        for b in self._positions(value):
            self.bits[b >> 3] |= 1 << (b & 7)
        return 0

    def test(self, value: bytes) -> int:
        return 0 if all(self.bits[b >> 3] >> (b & 7) & 1 for b in self._positions(value)) else -ENOENT


def bloom_hash(index: int, value: bytes) -> int:
    """Bloom hash function ``index`` of ``value``: FNV-1a 32 over the index (4 bytes, little-endian), then the
    value. Linux seeds jhash with a random number; egpu's is fixed, so both VMs set the same bits."""
    h = 2166136261
    for b in struct.pack("<I", index) + bytes(value):
        h = (h ^ b) * 16777619 & 0xFFFFFFFF
    return h


class RingbufStorage(MapStorage):
    """RINGBUF of max_entries bytes: committed records wait for the host; a full buffer drops, unless ``spill``
    (set by a reader that runs beside the program, egpu-run --trace --on-full wait) made room first."""

    def __init__(self, mapdef: prog.MapDef) -> None:
        super().__init__(mapdef)
        self.records: list[bytes] = []
        self.drops = 0
        self.used = 0  # bytes held by committed and reserved records
        self.reserved: dict[int, bytearray] = {}  # id(buffer) -> buffer, until submit or discard
        self.spill: Callable[[], None] | None = None   # takes the committed records out (consume) when full

    def reserve(self, size: int) -> bytearray | None:
        need = record_bytes(size)
        if self.used + need > self.mapdef.max_entries and self.spill is not None:
            self.spill()
        if self.used + need > self.mapdef.max_entries:
            self.drops += 1
            return None
        self.used += need
        buf = bytearray(size)
        self.reserved[id(buf)] = buf
        return buf

    def release(self, buf: bytearray, submit: bool) -> None:
        """Submit (the record becomes visible) or discard (its space is freed) a reservation."""
        del self.reserved[id(buf)]
        if submit:
            self.records.append(bytes(buf))
        else:
            self.used -= record_bytes(len(buf))

    def output(self, data: bytes) -> int:
        buf = self.reserve(len(data))
        if buf is None:
            return -EAGAIN  # ringbuf.c bpf_ringbuf_output
        buf[:] = data
        self.release(buf, submit=True)
        return 0

    def consume(self) -> list[bytes]:
        """The host takes every committed record, freeing their space."""
        out, self.records = self.records, []
        self.used -= sum(record_bytes(len(r)) for r in out)
        return out


class PerfStorage(MapStorage):
    """PERF_EVENT_ARRAY: records tagged with the SM that wrote them, PERF_BUFFER_BYTES per map; full, it drops
    as RingbufStorage does, unless ``spill`` made room first."""

    def __init__(self, mapdef: prog.MapDef, capacity: int = PERF_BUFFER_BYTES) -> None:
        super().__init__(mapdef)
        self.capacity = capacity
        self.records: list[tuple[int, bytes]] = []
        self.drops = 0
        self.used = 0
        self.spill: Callable[[], None] | None = None   # takes the records out (consume) when full

    def output(self, cpu: int, data: bytes) -> int:
        need = record_bytes(len(data))
        if self.used + need > self.capacity and self.spill is not None:
            self.spill()
        if self.used + need > self.capacity:
            self.drops += 1
            return -ENOSPC  # perf_output_begin failing, as bpf_perf_event_output returns it
        self.used += need
        self.records.append((cpu, bytes(data)))
        return 0

    def consume(self) -> list[tuple[int, bytes]]:
        out, self.records, self.used = self.records, [], 0
        return out


STORAGE_BY_TYPE: dict[int, type[MapStorage]] = {
    prog.MAP_ARRAY: ArrayStorage, prog.MAP_PERCPU_ARRAY: PercpuArrayStorage, prog.MAP_HASH: HashStorage,
    prog.MAP_LRU_HASH: LruHashStorage, prog.MAP_RINGBUF: RingbufStorage, prog.MAP_PERF_EVENT_ARRAY: PerfStorage,
    prog.MAP_PERTHREAD_ARRAY: PerthreadArrayStorage, prog.MAP_QUEUE: QueueStorage, prog.MAP_STACK: StackStorage,
    prog.MAP_BLOOM_FILTER: BloomStorage, prog.MAP_PERCPU_HASH: PercpuHashStorage,
    prog.MAP_LRU_PERCPU_HASH: LruPercpuHashStorage,
}


@dataclass(frozen=True)
class TraceRecord:
    """One bpf_trace_printk call: the format bytes and its three arguments, formatted on the host."""

    fmt: bytes
    args: tuple[int, int, int]
    cpu: int = 0

    def text(self) -> str:
        return format_trace(self.fmt, self.args)


@dataclass
class MapsState:
    """Every map of an object (``storages[i]`` for ``maps[i]``) plus the trace_printk records."""

    maps: Sequence[prog.MapDef]
    storages: list[MapStorage] = field(init=False)
    trace: list[TraceRecord] = field(default_factory=list)
    trace_dropped: int = 0   # the device trace_printk ring's dropped count (devmaps.apply_trace)
    loops_cut: int = 0       # runs LOOP_BUDGET ended (bpf/verifier): the VM counts them, the device's are read
                             # from the trace ring's per-SM lines (devmaps.apply_trace)

    def __post_init__(self) -> None:
        self.storages = []
        for m in self.maps:
            cls = STORAGE_BY_TYPE.get(m.type)
            if cls is None:
                raise EgpuError(f"map {m.name}: unsupported map type {m.type} ({map_type_name(m.type)})")
            self.storages.append(cls(m))

    def __getitem__(self, index: int) -> MapStorage:
        return self.storages[index]

    def by_name(self, name: str) -> MapStorage:
        for s in self.storages:
            if s.mapdef.name == name:
                return s
        raise EgpuError(f"no map named {name}")


def format_trace(fmt: bytes, args: Sequence[int]) -> str:
    """bpf_trace_printk's output for a format and its 64-bit arguments (text up to the first NUL)."""
    text = fmt.split(b"\0", 1)[0].decode("utf-8", "replace")
    remaining = list(args)

    def convert(m: re.Match[str]) -> str:
        flags, width, length, conv = m.groups()
        if conv == "%":
            return "%"
        if conv == "s":   # the verifier refuses it: never reached by a verified program
            return m.group()
        v = remaining.pop(0) if remaining else 0
        bits = {"hh": 8, "h": 16, "l": 64, "ll": 64, "z": 64}.get(length or "", 32)
        if conv[0] == "p":
            return f"0x{v & (1 << 64) - 1:x}"
        v &= (1 << bits) - 1
        if conv in "di" and v >> (bits - 1):
            v -= 1 << bits
        if conv == "c":
            return chr(v & 0xFF)
        return f"%{flags}{width}{'d' if conv in 'iu' else conv}" % v

    return PRINTK_CONVERSION.sub(convert, text)
