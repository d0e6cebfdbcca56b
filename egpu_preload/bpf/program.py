"""The loaded object: programs and maps, as every stage after the ELF loader sees them.

After loading, a program's code is self-contained: static subprograms are appended after the main
function with their call offsets fixed, and every map reference is an ``lddw`` with
``src = LDDW_MAP_IDX`` (imm = index into ``BpfObject.maps``) or ``src = LDDW_MAP_IDX_VALUE`` (low imm =
map index, high imm = offset into the single value of a global-data map), as libbpf's "fd_array" form.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .linux_names import map_flag

# linux/bpf.h enum bpf_map_type, the ones egpu implements, and bpftime's per-thread array under its number
# (runtime/include/bpftime_shm.hpp, BPF_MAP_TYPE_PERGPUTD_ARRAY_MAP): one array per GPU thread.
MAP_HASH, MAP_ARRAY, MAP_PERF_EVENT_ARRAY, MAP_PERCPU_ARRAY, MAP_LRU_HASH, MAP_RINGBUF = 1, 2, 4, 6, 9, 27
MAP_PERCPU_HASH, MAP_LRU_PERCPU_HASH = 5, 10
MAP_QUEUE, MAP_STACK, MAP_BLOOM_FILTER = 22, 23, 30
MAP_PERTHREAD_ARRAY = 1502
MAP_TYPE_NAMES = {MAP_HASH: "hash", MAP_ARRAY: "array", MAP_PERF_EVENT_ARRAY: "perf_event_array",
                  MAP_PERCPU_HASH: "percpu_hash", MAP_PERCPU_ARRAY: "percpu_array", MAP_LRU_HASH: "lru_hash",
                  MAP_LRU_PERCPU_HASH: "lru_percpu_hash", MAP_RINGBUF: "ringbuf",
                  MAP_QUEUE: "queue", MAP_STACK: "stack", MAP_BLOOM_FILTER: "bloom_filter",
                  MAP_PERTHREAD_ARRAY: "perthread_array"}
# Maps only host programs (launch, host-API, uprobes) may use: push, pop and peek, no key (runtime/probes.py
# refuses a GPU program using one).
HOST_ONLY_MAPS = frozenset((MAP_QUEUE, MAP_STACK, MAP_BLOOM_FILTER))
# Hash maps, and those of them with a value per CPU (per SM on the GPU) for each key.
PERCPU_HASHES = frozenset((MAP_PERCPU_HASH, MAP_LRU_PERCPU_HASH))
HASHES = frozenset((MAP_HASH, MAP_LRU_HASH)) | PERCPU_HASHES
BLOOM_HASHES = 5   # linux/bpf.h: a bloom filter's hash functions when map_extra gives none
# bpftime's other GPU map types (bpftime_shm.hpp) -> the egpu type with their semantics. Its GPU arrays and
# hash are one copy every thread shares (egpu's maps live in device memory and reach the host the same
# way); its host-memory variants (1512, 1513: cudaHostRegister, for boards without CUDA IPC) differ only
# in where the bytes live; its GPU ring (1527) is what bpf_perf_event_output writes to.
BPFTIME_MAP_TYPES = {1501: MAP_HASH, 1503: MAP_ARRAY, 1504: MAP_ARRAY, 1512: MAP_PERTHREAD_ARRAY,
                     1513: MAP_ARRAY, 1527: MAP_PERF_EVENT_ARRAY}
# The map_flags that mean something on the GPU: what programs may do with the map's values (the verifier
# enforces them); elf.py says which flags each type takes.
BPF_F_RDONLY_PROG, BPF_F_WRONLY_PROG = map_flag("RDONLY_PROG"), map_flag("WRONLY_PROG")


@dataclass(frozen=True)
class DataPointer:
    """An address the compiler stored in global data (``__u64 *p = &vals[2];``): a relocation inside a data
    section, which libbpf ignores, and so does egpu: the slot holds the number the compiler wrote (the
    target's offset in its section), never a pointer a program may dereference."""

    section: str    # the data section holding it (.data, .rodata, .data.rel.ro, ...)
    offset: int     # its byte offset there
    holder: str     # the variable whose bytes hold it ("" when no symbol covers the offset)
    target: str     # what it is the address of: a symbol (or section), with the addend, "vals+16"


@dataclass(frozen=True)
class MapDef:
    name: str
    type: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int = 0
    key_type_id: int | None = None    # BTF type ids, for printing keys and values with field names
    value_type_id: int | None = None
    initial: bytes | None = None      # global data (.data/.rodata): the value's initial bytes
    readonly: bool = False            # .rodata: the program may not write it
    stripe: int = 0                   # an ARRAY the GPU only adds to, in a row per SM: the width (4 or 8)
                                      # of its adds; 0 for one copy (translate/striping.py)
    wait: bool = False                # a ring whose producers wait for the reader when it is full
                                      # (egpu-run --on-full wait) instead of dropping the record
    pointers: tuple[DataPointer, ...] = ()  # global data: the addresses it holds unrelocated (elf.py)
    map_extra: int = 0                # a bloom filter's hash function count (0: BLOOM_HASHES)

    @property
    def hashes(self) -> int:
        """A bloom filter's hash functions: map_extra's low 4 bits, 0 meaning BLOOM_HASHES (bloom_filter.c)."""
        return self.map_extra & 0xF or BLOOM_HASHES

    @property
    def bloom_bits(self) -> int:
        """A bloom filter's bits, as bloom_filter.c sizes them: entries * hashes * 7 / 5 (about 1 / ln 2) rounded
        up to a power of two, at least 64, at most 2^32."""
        bits = self.max_entries * self.hashes // 5 * 7
        return 1 << 32 if bits > 1 << 31 else max(64, 1 << max(bits - 1, 0).bit_length())

    @property
    def prog_writes(self) -> bool:
        """Programs may write its values: not .rodata, not BPF_F_RDONLY_PROG (Linux's bpf_map_flags_to_cap)."""
        return not self.readonly and not self.flags & BPF_F_RDONLY_PROG

    @property
    def prog_reads(self) -> bool:
        """Programs may read its values: not BPF_F_WRONLY_PROG (whose lookups Linux allows, the reads after not)."""
        return not self.flags & BPF_F_WRONLY_PROG


@dataclass(frozen=True)
class Attach:
    """What a section name asks for: ``kprobe.warp/vec*`` -> Attach("entry", "vec*", "warp")."""

    kind: str    # entry | exit | mem | load | store | launch | uprobe | uretprobe (host: runtime/uprobes.py)
    glob: str
    scope: str   # thread | warp | block (launch probes: "launch", host-API probes: "api", uprobes: "host")


@dataclass(frozen=True)
class Program:
    name: str          # the function's symbol
    section: str       # the ELF section name, e.g. "kprobe/_Z6vecAddPfS_S_i"
    attach: Attach
    code: bytes        # relocated, subprograms appended
    # where code came from, for source lines in messages: (ELF section, first insn there, insns) per
    # function in the order elf.py placed them (the program, then each subprogram it calls)
    layout: tuple[tuple[str, int, int], ...] = ()


@dataclass
class BpfObject:
    path: str
    programs: list[Program] = field(default_factory=list)
    maps: list[MapDef] = field(default_factory=list)
    license: str = ""
    btf: object | None = None  # egpu_preload.bpf.btf.Btf when the object has .BTF
