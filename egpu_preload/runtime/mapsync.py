"""Element writes from the host into maps that live in device memory (translate/devmaps.py's layout),
for launch probes that share maps with GPU probes (runtime/launches.py).

A launch probe runs on the host against a host copy of its maps; each key it wrote (or deleted) in a
shared map is then written into the device region here, key by key, following the slot protocol the
GPU's helpers use (helpers_ptx.py): a hash key goes into the slot it owns on its probe sequence (or the
first EMPTY one, written key and value first, state FULL last), a delete turns a FULL slot into a
tombstone; a per-CPU hash's key takes the host's value in SM 0's row (the host is SM 0). The host has no
atomics on device memory, so a key (array index) must have one writer at a time: the host's write of a
key replaces whatever a GPU probe wrote to the same key meanwhile, and the live-entry count of a hash is
a plain read-modify-write. ``mem`` is anything with ``read(addr, n)`` and ``write(addr, data)``; writes
must reach the device in the order they are made.
"""

from __future__ import annotations

import struct
from typing import Protocol

from egpu_preload.maps import MapStorage
from egpu_preload.translate.devmaps import (DELETED, EMPTY, FULL, HEADER, LRU_WINDOW, NCPU_OFF, MapLayout, layout,
                                            slot_hash, value_at)


class Memory(Protocol):
    def read(self, addr: int, n: int) -> bytes: ...
    def write(self, addr: int, data: bytes) -> None: ...


def push_key(mem: Memory, base: int, storage: MapStorage, key: bytes, now_ns: int) -> None:
    """Make the device region at ``base`` agree with the host ``storage`` on ``key`` (present with the
    host's value, or absent). ``now_ns`` stamps LRU slots (the %globaltimer clock)."""
    lay = layout(storage.mapdef)
    if lay.kind in ("array", "percpu_array"):
        value = storage.lookup(key)
        if value is not None:  # percpu: the host runs as SM 0, so row 0
            mem.write(base + HEADER + struct.unpack("<I", key)[0] * lay.stride, bytes(value))
    elif lay.kind == "hash":
        value = storage.entries.get(key)  # HashStorage; a lookup would refresh an LRU's order
        if isinstance(value, dict):   # a per-CPU hash's values by SM: the host's is SM 0's
            value = value.get(0, bytes(storage.mapdef.value_size))
        if value is None:
            _hash_delete(mem, base, lay, key)
        else:
            _hash_put(mem, base, lay, storage.mapdef.max_entries, key, bytes(value), now_ns)


def _slot(mem: Memory, base: int, lay: MapLayout, idx: int) -> tuple[int, int, bytes]:
    """(slot address, state, key bytes) of bucket idx."""
    addr = base + HEADER + idx * lay.stride
    raw = mem.read(addr, lay.key_off + lay.key_size)
    return addr, struct.unpack_from("<I", raw)[0], raw[lay.key_off:]


def _find(mem: Memory, base: int, lay: MapLayout, key: bytes) -> tuple[int, int] | None:
    """The slot ``key`` owns (address, state), else the first EMPTY slot on its sequence (state EMPTY);
    None when the sequence has neither."""
    idx = slot_hash(key) & (lay.entries - 1)
    for _ in range(lay.entries):
        addr, state, k = _slot(mem, base, lay, idx)
        if state == EMPTY or k == key:
            return addr, state
        idx = (idx + 1) & (lay.entries - 1)
    return None


def _add_count(mem: Memory, base: int, delta: int) -> int:
    count = struct.unpack("<I", mem.read(base, 4))[0]
    mem.write(base, struct.pack("<I", (count + delta) & 0xFFFFFFFF))
    return count


def _evict(mem: Memory, base: int, lay: MapLayout, key: bytes) -> None:
    """LRU: the least recently used FULL slot of the LRU_WINDOW buckets from the key's home becomes a
    tombstone (what the GPU's insert does when the map is full)."""
    home = slot_hash(key) & (lay.entries - 1)
    oldest: tuple[int, int] | None = None
    for j in range(min(LRU_WINDOW, lay.entries)):
        addr = base + HEADER + ((home + j) & (lay.entries - 1)) * lay.stride
        state, _, used = struct.unpack("<IIQ", mem.read(addr, 16))
        if state == FULL and (oldest is None or used < oldest[1]):
            oldest = (addr, used)
    if oldest is not None:
        mem.write(oldest[0], struct.pack("<I", DELETED))
        _add_count(mem, base, -1)


def _hash_put(mem: Memory, base: int, lay: MapLayout, max_entries: int, key: bytes, value: bytes,
              now_ns: int) -> None:
    found = _find(mem, base, lay, key)
    if found is None:
        return
    addr, state = found
    if state != FULL:  # a new entry: take credit first, as the GPU does
        if struct.unpack("<I", mem.read(base, 4))[0] >= max_entries:
            if not lay.lru:
                return  # full: the host copy holds the key, the device cannot (-E2BIG on the GPU)
            _evict(mem, base, lay, key)
        _add_count(mem, base, 1)
    if state == EMPTY:
        mem.write(addr + lay.key_off, key)
    if lay.lru:
        mem.write(addr + 8, struct.pack("<Q", now_ns))
    if lay.percpu:   # the host is SM 0: its row; a revived key's other SMs' values zeroed, as the GPU's insert
        bucket = (addr - base - HEADER) // lay.stride
        if state == DELETED:
            ncpu = struct.unpack("<I", mem.read(base + NCPU_OFF, 4))[0]
            for cpu in range(ncpu):
                mem.write(base + value_at(lay, bucket, cpu), bytes(lay.value_size))
        mem.write(base + value_at(lay, bucket, 0), value)
    else:
        mem.write(addr + lay.val_off, value)
    if state != FULL:
        mem.write(addr, struct.pack("<I", FULL))  # published last: readers see the key and value first


def _hash_delete(mem: Memory, base: int, lay: MapLayout, key: bytes) -> None:
    found = _find(mem, base, lay, key)
    if found is not None and found[1] == FULL:
        mem.write(found[0], struct.pack("<I", DELETED))
        _add_count(mem, base, -1)
