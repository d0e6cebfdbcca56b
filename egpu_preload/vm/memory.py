"""The VM's address space: named regions at far-apart bases, every access bounds-checked.

Region k lives at ``k << REGION_SHIFT``, so a pointer that strays past its region's end lands in a gap,
never in a neighbour, and is reported rather than silently read.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import VmError

REGION_SHIFT = 36  # regions are at most 4 GiB, so 64 GiB spacing leaves a wide gap after each
MASK64 = (1 << 64) - 1
NEAR = 1 << 16  # how far outside a region a fault is still reported relative to it


@dataclass
class Region:
    name: str
    base: int
    data: bytearray
    writable: bool


class Memory:
    """Regions by base; buffers shared with maps keep one address for the whole run."""

    def __init__(self) -> None:
        self.regions: dict[int, Region] = {}
        self._next = 1
        self._by_buffer: dict[int, int] = {}  # id(bytearray) -> base, for map values handed out again

    def add(self, name: str, data: bytearray, writable: bool) -> int:
        key = self._next
        self._next += 1
        self.regions[key] = Region(name, key << REGION_SHIFT, data, writable)
        return key << REGION_SHIFT

    def remove(self, base: int) -> None:
        region = self.regions.pop(base >> REGION_SHIFT)
        self._by_buffer.pop(id(region.data), None)

    def address_of(self, map_name: str, data: bytearray, writable: bool) -> int:
        """The address of a value of map ``map_name`` (a buffer the map owns), mapping it on first use."""
        base = self._by_buffer.get(id(data))
        if base is None:
            base = self._by_buffer[id(data)] = self.add(f"map {map_name} value", data, writable)
        return base

    def region_at(self, addr: int) -> Region | None:
        return self.regions.get(addr >> REGION_SHIFT)

    def _find(self, addr: int, size: int, write: bool) -> tuple[bytearray, int]:
        region = self.regions.get(addr >> REGION_SHIFT)
        if region is None:
            raise VmError(f"{self._what(addr, size, write)}: {self._describe_gap(addr)}")
        off = addr - region.base
        if off + size > len(region.data):
            raise VmError(f"{self._what(addr, size, write)}: outside {region.name} (offset {off}, "
                          f"size {len(region.data)})")
        if write and not region.writable:
            raise VmError(f"{self._what(addr, size, write)}: {region.name} is read-only")
        return region.data, off

    @staticmethod
    def _what(addr: int, size: int, write: bool) -> str:
        return f"{'write' if write else 'read'} of {size} bytes at 0x{addr:x}"

    def _describe_gap(self, addr: int) -> str:
        above = self.regions.get((addr >> REGION_SHIFT) + 1)
        if above is not None and above.base - addr <= NEAR:
            return f"{above.base - addr} bytes below {above.name}"
        return "null pointer" if addr < NEAR else "not a valid address"

    def load(self, addr: int, size: int) -> int:
        data, off = self._find(addr, size, False)
        return int.from_bytes(data[off:off + size], "little")

    def store(self, addr: int, size: int, value: int) -> None:
        data, off = self._find(addr, size, True)
        data[off:off + size] = (value & ((1 << 8 * size) - 1)).to_bytes(size, "little")

    def read(self, addr: int, size: int) -> bytes:
        if size == 0:
            return b""
        data, off = self._find(addr, size, False)
        return bytes(data[off:off + size])

    def write(self, addr: int, value: bytes) -> None:
        if value:
            data, off = self._find(addr, len(value), True)
            data[off:off + len(value)] = value
