"""The ELF loader on every probe of tests/probes (exact programs, maps, relocations, linked calls), on
objects built to fail, and on corrupted bytes (hypothesis): only ElfError-family refusals, never a crash."""

from __future__ import annotations

import struct
import subprocess
import time
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from egpu_preload.bpf import ctx as C
from egpu_preload.bpf import isa
from egpu_preload.bpf.compile import compile_probe
from egpu_preload.bpf.decode import decode
from egpu_preload.bpf.elf import load_bytes, load_object
from egpu_preload.bpf.program import (MAP_ARRAY, MAP_HASH, MAP_LRU_HASH, MAP_LRU_PERCPU_HASH, MAP_PERCPU_ARRAY,
                                      MAP_PERCPU_HASH, MAP_PERF_EVENT_ARRAY, MAP_RINGBUF, Attach)
from egpu_preload.bpf.verifier import verify
from egpu_preload.errors import BtfError, DecodeError, EgpuError, ElfError
from egpu_preload.output import text, values
from egpu_preload.vm import Vm

T, W, B = "thread", "warp", "block"

# probe -> programs as (name, section, attach)
PROGRAMS = {
    "count": [("count_entries", "kprobe/*", Attach("entry", "*", T))],
    "hash_count": [("count_per_kernel", "kprobe/*", Attach("entry", "*", T))],
    "histogram": [("launch_threads", "egpu/launch/*", Attach("launch", "*", "launch"))],
    "ringbuf": [("block_enter", "kprobe.block/*", Attach("entry", "*", B)),
                ("block_exit", "kretprobe.block/*", Attach("exit", "*", B))],
    "globals": [("weigh_accesses", "egpu/mem/*", Attach("mem", "*", T))],
    "subprog": [("loads", "egpu/load/*", Attach("load", "*", T)),
                ("stores", "egpu/store/*", Attach("store", "*", T))],
    "loop": [("hash_slots", "kprobe/*", Attach("entry", "*", T))],
    "libbpf_style": [("cuda__vector_add", "kprobe/_Z9vectorAddPKfS0_Pf", Attach("entry", "_Z9vectorAddPKfS0_Pf", T))],
    "memtrace": [("trace_mem", "egpu/mem/*", Attach("mem", "*", T)),
                 ("warp_stores", "egpu/store.warp/*", Attach("store", "*", W))],
    "launch": [("on_launch", "egpu/launch/*", Attach("launch", "*", "launch"))],
    "gpu_helpers": [("where_am_i", "kprobe.warp/*", Attach("entry", "*", W))],
    "self_wait": [("twice", "kprobe.block/*", Attach("entry", "*", B))],
    "record_atomics": [("record_atomics", "kprobe/*", Attach("entry", "*", T))],
    "process": [("who", "kprobe/*", Attach("entry", "*", T))],
    "percpu_hash": [("count_calls", "kprobe/*", Attach("entry", "*", T))],
    "callback": [("loop_sum", "kprobe/*", Attach("entry", "*", T))],
    "map_by_path": [("by_path", "kprobe/*", Attach("entry", "*", T))],
}

# probe -> maps as (name, type, key_size, value_size, max_entries, flags, readonly)
MAPS = {
    "count": [("counts", MAP_ARRAY, 4, 8, 1, 0, False)],
    "hash_count": [("per_kernel", MAP_HASH, 8, 8, 1024, 0, False)],
    "histogram": [("hist", MAP_ARRAY, 4, 8, 64, 0, False)],
    "ringbuf": [("events", MAP_RINGBUF, 0, 0, 256 * 1024, 0, False)],
    "globals": [("globals.data", MAP_ARRAY, 4, 8, 1, 0, False), ("globals.rodata", MAP_ARRAY, 4, 12, 1, 0, True),
                ("globals.bss", MAP_ARRAY, 4, 16, 1, 0, False), ("g.rodata.str1.1", MAP_ARRAY, 4, 9, 1, 0, True)],
    "subprog": [("classes", MAP_ARRAY, 4, 8, 4, 0, False)],
    "loop": [("slots", MAP_ARRAY, 4, 8, 16, 0, False)],
    "libbpf_style": [("legacy_counts", MAP_ARRAY, 4, 8, 2, 0, False), ("last_seen", MAP_LRU_HASH, 8, 8, 128, 0, False),
                     ("libbpf_s.rodata", MAP_ARRAY, 4, 16, 1, 0, True)],
    "memtrace": [("bytes", MAP_ARRAY, 4, 8, 2, 0, False), ("pages", MAP_LRU_HASH, 8, 8, 4096, 0, False)],
    "launch": [("launches", MAP_HASH, 8, 48, 512, 0, False)],
    "gpu_helpers": [("events", MAP_PERF_EVENT_ARRAY, 4, 4, 0, 0, False),
                    ("per_sm", MAP_PERCPU_ARRAY, 4, 8, 1, 0, False)],
    "self_wait": [("events", MAP_RINGBUF, 0, 0, 4096, 0, False)],
    "record_atomics": [("tallies", MAP_RINGBUF, 0, 0, 4096, 0, False)],
    "process": [("seen", MAP_ARRAY, 4, 40, 1, 0, False)],
    "percpu_hash": [("calls", MAP_PERCPU_HASH, 8, 8, 64, 0, False), ("sites", MAP_LRU_PERCPU_HASH, 4, 16, 8, 0, False),
                    ("percpu_h.bss", MAP_ARRAY, 4, 24, 1, 0, False)],
    "callback": [("results", MAP_ARRAY, 4, 8, 6, 0, False)],
    "map_by_path": [("calls", MAP_ARRAY, 4, 8, 4, 0, False), ("sites", MAP_HASH, 4, 8, 16, 0, False)],
}

# probe -> per program, its map references in code order: a map name, or (data map name, offset).
REFS = {
    "count": [["counts"]],
    "hash_count": [["per_kernel"] * 3],
    "histogram": [["hist"]],
    "ringbuf": [["events"], ["events"]],
    "globals": [[("globals.rodata", 0), ("globals.bss", 0), ("globals.data", 0), ("globals.bss", 8),
                 ("g.rodata.str1.1", 0), ("globals.rodata", 4)]],
    "subprog": [["classes"], ["classes"]],
    "loop": [["slots"]],
    "libbpf_style": [["legacy_counts", "last_seen", ("libbpf_s.rodata", 0)]],
    "memtrace": [["bytes", "pages", "pages"], ["bytes"]],
    "launch": [["launches"] * 3],
    "gpu_helpers": [["events", "per_sm"]],
    "self_wait": [["events", "events"]],
    "record_atomics": [["tallies"]],
    "process": [["seen"]],
    "percpu_hash": [["calls"] * 5 + ["sites"] * 3 + [("percpu_h.bss", 0)]],
    "callback": [["results"] * 6],
    "map_by_path": [["calls", "calls", "sites", "sites"]],
}

# probe -> per program, (instruction count after linking, pcs that local calls enter)
CALLS = {"subprog": [(25, [3, 17]), (30, [8, 22, 22])], "map_by_path": [(43, [24, 24, 24])]}

# probe -> per program, helper ids called in code order
HELPER_CALLS = {
    "ringbuf": [[131, 5, 8, 133, 132], [5, 8, 130]],
    "gpu_helpers": [[503, 505, 504, 508, 502, 509, 510, 511, 507, 25, 506, 1]],
    "process": [[1, 14, 15, 16, 16]],
    "percpu_hash": [[5, 1, 2, 1, 2, 3, 2, 2, 1, 125, 160, 42]],
    "callback": [[181, 1, 1, 1, 1, 1, 1, 181, 181, 181]],
}


def test_every_probe_is_in_the_tables(probe_names):
    assert len(probe_names) >= 8
    assert set(probe_names) == set(PROGRAMS) == set(MAPS) == set(REFS)


@pytest.mark.parametrize("mcpu", ["v3", "v4"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_probe(probe_obj, name, mcpu):
    obj = load_object(probe_obj(name, mcpu))
    assert obj.license in ("GPL", "Dual BSD/GPL")
    assert [(p.name, p.section, p.attach) for p in obj.programs] == PROGRAMS[name]
    assert [(m.name, m.type, m.key_size, m.value_size, m.max_entries, m.flags, m.readonly)
            for m in obj.maps] == MAPS[name]
    names = [m.name for m in obj.maps]
    for prog, want in zip(obj.programs, REFS[name], strict=True):
        insns = decode(prog.code)
        refs = []
        for i in insns:
            if i.kind == "lddw" and i.src == isa.LDDW_MAP_IDX:
                refs.append(names[i.imm])
            elif i.kind == "lddw" and i.src == isa.LDDW_MAP_IDX_VALUE:
                refs.append((names[i.imm & 0xFFFFFFFF], i.imm >> 32))
            elif i.kind == "lddw":
                assert i.src in (isa.LDDW_IMM64, isa.LDDW_CODE_ADDR)  # nothing left unrelocated; or a callback
        assert refs == want
        local = [i.call_target() for i in insns if i.kind == "call" and i.src == isa.CALL_LOCAL]
        local += [i.callback for i in insns if i.callback is not None]
        starts = {i.pc for i in insns}
        assert all(t in starts for t in local)
    for prog, (length, targets) in zip(obj.programs, CALLS.get(name, [(None, [])] * len(obj.programs))):
        insns = decode(prog.code)
        assert [i.call_target() for i in insns if i.kind == "call" and i.src == isa.CALL_LOCAL] == targets
        if length is not None:
            assert len(prog.code) // 8 == length
    for prog, want in zip(obj.programs, HELPER_CALLS.get(name, [])):
        assert [i.imm for i in decode(prog.code) if i.kind == "call" and i.src == isa.CALL_HELPER] == want


def test_map_btf_types(probe_obj):
    obj = load_object(probe_obj("launch"))
    m = obj.maps[0]
    assert obj.btf.type_name(m.key_type_id) == "__u64"
    assert obj.btf.type_name(m.value_type_id) == "struct launch_stats"


def test_global_data(probe_obj):
    obj = load_object(probe_obj("globals"))
    data, rodata, bss, strs = obj.maps
    assert data.initial == struct.pack("<Q", 3) and bss.initial is None
    assert rodata.initial == struct.pack("<I", 4) + b"egpu\0\0\0\0" and strs.initial == b"wide %u\n\0"
    # clang leaves the DATASEC sizes and offsets 0; the loader fixes them from the ELF as libbpf does.
    shown = values._Reader(obj.btf, {})   # as egpu-run prints them
    assert text.value(shown.data(bss.value_type_id, struct.pack("<QQ", 5, 7)), {}) == "{ hits: 5, weighted_bytes: 7 }"
    assert text.value(shown.data(rodata.value_type_id, rodata.initial), {}) == '{ min_size: 4, tag: "egpu" }'
    assert strs.value_type_id is None  # string literals have no BTF


def _compile(tmp_path: Path, source: str, name: str = "t") -> Path:
    src = tmp_path / f"{name}.bpf.c"
    src.write_text('#include "egpu.bpf.h"\n' + source)
    return compile_probe(src)


def test_calls_between_functions_of_one_section(tmp_path):
    """Global functions in one section are each a program, and calls between them link like .text calls."""
    obj = load_object(_compile(tmp_path, """
__noinline int global_sub(int x) { return x * 3; }
SEC("kprobe/*") __noinline int inner(struct egpu_ctx *c) { return c->site + global_sub(c->size); }
SEC("kprobe/*") int outer(struct egpu_ctx *c) { return inner(c) + 1; }
"""))
    got = {p.name: (len(p.code) // 8, [i.call_target() for i in decode(p.code) if i.kind == "call"])
           for p in obj.programs}
    assert got == {"inner": (8, [5]), "outer": (11, [3, 8])}


def test_callbacks_are_linked_after_their_taker(tmp_path):
    """bpf_loop's callbacks, static functions in .text whose address an lddw takes (R_BPF_64_64 on the section
    symbol plus the function's offset, as clang emits it), are appended to the program once each, however many
    lddws take them, and each lddw becomes BPF_PSEUDO_FUNC naming its function's first instruction, relative to
    the next slot (libbpf's RELO_SUBPROG_ADDR)."""
    obj = load_object(_compile(tmp_path, """
static long first(__u64 i, void *c) { return 1; }
static long cb(__u64 i, void *c) { *(__u64 *)c += i; return 0; }
SEC("kprobe/*") int p(void *c)
{
	__u64 s = 0;
	bpf_loop(4, cb, &s, 0);
	bpf_loop(2, cb, &s, 0);
	bpf_loop(1, first, 0, 0);
	return s;
}
"""))
    (p,) = obj.programs
    main, cb, first = p.layout
    assert (cb[0], cb[2], first[0], first[2]) == (".text", 5, ".text", 2) and {cb[1], first[1]} in ({0, 2}, {0, 5})
    taken = [i.callback for i in decode(p.code) if i.kind == "lddw"]
    assert taken == [main[2], main[2], main[2] + cb[2]]


@pytest.mark.parametrize("mcpu", ["v1", "v3"])
def test_globals_of_several_data_sections_read_their_own_bytes(tmp_path, mcpu):
    """Static and global variables in .data.*, .rodata.* and .bss.* sections of their own: a static one is
    reached through its section's symbol plus an addend in the lddw (a global one through its own symbol),
    so each relocation must land on the variable's bytes in the right section's map (a probe sweep's case)."""
    src = tmp_path / "several.bpf.c"
    src.write_text('#include "egpu.bpf.h"\n' + """
static __u64 pad1 SEC(".data.one") = 1;
static __u64 s1 SEC(".data.one") = 3;
__u64 g1 SEC(".data.one") = 5;
static __u32 pad2 SEC(".data.two") = 9;
static __u32 s2 SEC(".data.two") = 7;
static const volatile __u64 r1[2] SEC(".rodata.x") = { 11, 13 };
static __u64 b1[2] SEC(".bss.y");
#define RD(x) (*(volatile typeof(x) *)&(x))
SEC("kprobe/*") long several(struct egpu_ctx *c)
{
	RD(b1[1]) += 2;
	return RD(s1) + RD(g1) * 100 + RD(s2) * 10000 + r1[1] * 1000000 + RD(b1[1]) * 100000000 + RD(pad1) * 0 + RD(pad2) * 0;
}
""")
    obj = load_object(compile_probe(src, mcpu=mcpu))
    assert [m.initial for m in obj.maps] == [struct.pack("<QQQ", 1, 3, 5), struct.pack("<II", 9, 7),
                                             struct.pack("<QQ", 11, 13), None]
    assert Vm(obj.programs[0].code, obj.maps).run(bytes(C.SIZE)) == 3 + 500 + 70000 + 13000000 + 200000000


POINTERS = """
__u64 vals[4] = {1, 2, 3, 4};
static __u64 svals[2] = {5, 6};
__u64 *ptr = &vals[2];
__u64 *sptr = &svals[1];
__u64 plain = 7;
"""


@pytest.mark.parametrize("body, note", [
    # a load through a pointer global data holds: refused, saying why and where
    ("return *ptr;", "; pointers stored in global data are not relocated (as in libbpf): .data+32 (ptr) holds "
                     "&vals+16 as a plain number"),
    ("return *sptr + 1;", "; pointers stored in global data are not relocated (as in libbpf): .data+56 (sptr) "
                          "holds &svals+8 as a plain number"),
    # a number from elsewhere dereferenced, the pointers in the same section never read: no word about them
    ("return plain + *(__u64 *)c->addr;", ""),
])
def test_pointers_in_global_data_are_named_when_a_load_through_one_is_refused(tmp_path, body, note):
    """libbpf ignores relocations inside data sections, so a pointer stored there (``__u64 *p = &v[2];``)
    is the number clang wrote; the loader keeps where each is, and the verifier's refusal of a memory
    access through a number names those the program read (a static one by its variable, not its section)."""
    from egpu_preload.bpf.program import DataPointer
    from egpu_preload.bpf.verifier import verify
    from egpu_preload.errors import VerifierError
    path = _compile(tmp_path, POINTERS + f'SEC("kprobe/*") long deref(struct egpu_ctx *c) {{ {body} }}\n')
    obj = load_object(path)
    (data,) = [m for m in obj.maps if m.name.endswith(".data")]
    assert data.pointers == (DataPointer(".data", 32, "ptr", "vals+16"), DataPointer(".data", 56, "sptr", "svals+8"))
    with pytest.raises(VerifierError) as refused:
        verify(obj.programs[0].code, obj.maps, file=str(path), section=obj.programs[0].section)
    assert str(refused.value).startswith(f"{path}:kprobe/*:")
    assert refused.value.reason.endswith("invalid mem access 'scalar' (r1)" + note)


def _x86_object(tmp_path: Path) -> Path:
    src = tmp_path / "x86.c"
    src.write_text("int f(int x) { return x + 1; }\n")
    subprocess.run(["gcc", "-c", str(src), "-o", str(tmp_path / "x86.o")], check=True)
    return tmp_path / "x86.o"


def _patch_reloc(obj: Path, field: str, value) -> bytes:
    """Rewrite the first relocation of the first program section: field 'offset' adds, 'type' sets."""
    raw = bytearray(obj.read_bytes())
    with open(obj, "rb") as f:
        elf = ELFFile(f)
        rel = next(s for s in elf.iter_sections() if s.name.startswith(".rel") and not s.name.startswith(".rel."))
        at = rel["sh_offset"]
    off, info = struct.unpack_from("<QQ", raw, at)
    if field == "offset":
        off += value
    else:
        info = (info & ~0xFFFFFFFF) | value
    struct.pack_into("<QQ", raw, at, off, info)
    return bytes(raw)


def _patch_btf_ext(obj: Path, at: int, value: int) -> bytes:
    """Set the u32 at byte ``at`` of .BTF.ext (28: the length of its CO-RE relocations)."""
    raw = bytearray(obj.read_bytes())
    with open(obj, "rb") as f:
        struct.pack_into("<I", raw, ELFFile(f).get_section_by_name(".BTF.ext")["sh_offset"] + at, value)
    return bytes(raw)


MAP_SRC = """
struct {{ {fields} }} m SEC(".maps");
SEC("kprobe/*") int p(struct egpu_ctx *c) {{ __u32 k = 0; return bpf_map_lookup_elem(&m, &k) != 0; }}
"""
BAD_SOURCES = [
    ("unknown section", 'SEC("egpu/xdp") int p(void *c) { return 0; }', "egpu/xdp: unknown section"),
    # libbpf's usdt.bpf.h declares __kconfig externs: the section is what egpu cannot take, and is named first
    ("usdt", 'extern _Bool LINUX_HAS_BPF_COOKIE __attribute__((section(".kconfig")));\n'
             'SEC("usdt") int p(void *c) { return LINUX_HAS_BPF_COOKIE; }', "usdt: USDT probes are not supported"),
    ("missing symbol", 'extern __u64 nowhere;\nSEC("kprobe/*") int p(void *c) { return nowhere; }',
     "missing symbol nowhere"),
    ("unsupported map type", MAP_SRC.format(fields="__uint(type, 7); __uint(max_entries, 1); "
                                            "__type(key, __u32); __type(value, __u64);"),
     "unsupported map type 7 (BPF_MAP_TYPE_STACK_TRACE; supported: hash, array, perf_event_array, percpu_hash, "
     "percpu_array, lru_hash, lru_percpu_hash, ringbuf, queue, stack, bloom_filter; bpftime's 1501, 1502, 1503, "
     "1504, 1512, 1513, 1527)"),
    ("array key", MAP_SRC.format(fields="__uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 1); "
                                 "__type(key, __u64); __type(value, __u64);"), "array keys are 4 bytes, not 8"),
    ("no max_entries", MAP_SRC.format(fields="__uint(type, BPF_MAP_TYPE_HASH); "
                                      "__type(key, __u32); __type(value, __u64);"), "needs key_size"),
    ("ringbuf size", MAP_SRC.format(fields="__uint(type, BPF_MAP_TYPE_RINGBUF); __uint(max_entries, 5000);"),
     "ringbuf size 5000 is not a power of 2"),
    ("unknown field", MAP_SRC.format(fields="__uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 1); "
                                     "__uint(colour, 1); __type(key, __u32); __type(value, __u64);"),
     "unsupported field colour"),
    ("size mismatch", MAP_SRC.format(fields="__uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 1); "
                                     "__uint(key_size, 8); __type(key, __u32); __type(value, __u64);"),
     "key_size 8 disagrees with the key type's 4 bytes"),
    # Found by a probe sweep: verified, then the VM built the 32 GiB array whole (Linux refuses >= 4 GiB).
    ("huge array", MAP_SRC.format(fields="__uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 0xFFFFFFFF); "
                                  "__type(key, __u32); __type(value, __u64);"),
     "map m: 4,294,967,295 entries of 8 bytes make 34,359,738,360 bytes: Linux refuses an array of 4 GiB or more"),
    ("huge value", MAP_SRC.format(fields="__uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 1); "
                                  "__type(key, __u32); __type(value, char[(1 << 22) + 1]);"),
     "map m: a value of 4,194,305 bytes (Linux's limit is 4,194,304)"),
    ("huge key", MAP_SRC.format(fields="__uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 1); "
                                "__type(key, char[513]); __type(value, __u64);"),
     "map m: a key of 513 bytes (at most 512, as a program's stack holds its keys)"),
    # map_flags: Linux's map_alloc_check refuses a flag the type does not take, and bits it does not define
    ("flag on array", MAP_SRC.format(fields="__uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 1); "
                                     "__uint(map_flags, BPF_F_NO_PREALLOC); __type(key, __u32); __type(value, __u64);"),
     "map m: map_flags BPF_F_NO_PREALLOC: Linux refuses it on array maps (which take BPF_F_NUMA_NODE | "),
    ("flag on hash", MAP_SRC.format(fields="__uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 1); "
                                    "__uint(map_flags, BPF_F_MMAPABLE); __type(key, __u32); __type(value, __u64);"),
     "map m: map_flags BPF_F_MMAPABLE: Linux refuses it on hash maps"),
    ("lru not preallocated", MAP_SRC.format(fields="__uint(type, BPF_MAP_TYPE_LRU_HASH); __uint(max_entries, 1); "
                                            "__uint(map_flags, BPF_F_NO_PREALLOC); __type(key, __u32); "
                                            "__type(value, __u64);"),
     "map m: map_flags BPF_F_NO_PREALLOC: Linux refuses it on lru_hash maps"),
    ("flag on ringbuf", MAP_SRC.format(fields="__uint(type, BPF_MAP_TYPE_RINGBUF); __uint(max_entries, 4096); "
                                       "__uint(map_flags, BPF_F_RDONLY_PROG);"),
     "map m: map_flags BPF_F_RDONLY_PROG: Linux refuses it on ringbuf maps (which take BPF_F_NUMA_NODE)"),
    ("unknown flag", MAP_SRC.format(fields="__uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 1); "
                                    "__uint(map_flags, (1u << 30) | 1); __type(key, __u32); __type(value, __u64);"),
     "map m: map_flags 0x40000001: 0x40000000 is no flag linux/bpf.h defines"),
    ("read-only and write-only", MAP_SRC.format(fields="__uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 1); "
                                                "__uint(map_flags, BPF_F_RDONLY_PROG | BPF_F_WRONLY_PROG); "
                                                "__type(key, __u32); __type(value, __u64);"),
     "map m: map_flags BPF_F_RDONLY_PROG | BPF_F_WRONLY_PROG: Linux refuses the two together"),
    ("legacy map flag", 'struct egpu_map_def SEC("maps") m = { .type = BPF_MAP_TYPE_PERCPU_ARRAY, .key_size = 4, '
                        '.value_size = 8, .max_entries = 1, .map_flags = BPF_F_NUMA_NODE };\n'
                        'SEC("kprobe/*") int p(void *c) { __u32 k = 0; return bpf_map_lookup_elem(&m, &k) != 0; }',
     "map m: map_flags BPF_F_NUMA_NODE: Linux refuses it on percpu_array maps"),
    # map_extra is a bloom filter's hash count and an arena's address (Linux's map_create: EINVAL on others)
    ("map_extra", MAP_SRC.format(fields="__uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 1); "
                                 "__uint(map_extra, 5); __type(key, __u32); __type(value, __u64);"),
     "map m: map_extra 5: Linux takes it only on bloom filters and arenas"),
    # queue_stack_map_alloc_check, bloom_map_alloc: no key, at most 15 hash functions, no NO_PREALLOC
    ("queue key", MAP_SRC.format(fields="__uint(type, BPF_MAP_TYPE_QUEUE); __uint(max_entries, 4); "
                                 "__type(key, __u32); __type(value, __u64);"),
     "map m: a queue has no key, and needs value_size and max_entries (got 4, 8, 4)"),
    ("stack entries", MAP_SRC.format(fields="__uint(type, BPF_MAP_TYPE_STACK); __type(value, __u64);"),
     "map m: a stack has no key, and needs value_size and max_entries (got 0, 8, 0)"),
    ("bloom hashes", MAP_SRC.format(fields="__uint(type, BPF_MAP_TYPE_BLOOM_FILTER); __uint(max_entries, 4); "
                                    "__uint(map_extra, 16); __type(value, __u64);"),
     "map m: map_extra 16: a bloom filter's hash count is at most 15"),
    ("bloom flags", MAP_SRC.format(fields="__uint(type, BPF_MAP_TYPE_BLOOM_FILTER); __uint(max_entries, 4); "
                                   "__uint(map_flags, BPF_F_NO_PREALLOC); __type(value, __u64);"),
     "map m: map_flags BPF_F_NO_PREALLOC: Linux refuses it on bloom_filter maps"),
    ("tail calls", MAP_SRC.format(fields="__uint(type, BPF_MAP_TYPE_PROG_ARRAY); __uint(max_entries, 1); "
                                    "__type(key, __u32); __type(value, __u32);"),
     "map m: unsupported map type 3 (BPF_MAP_TYPE_PROG_ARRAY: tail calls are not supported, call a static "
     "__noinline function instead; supported: hash,"),
    ("map of maps", 'struct inner { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 1); __type(key, __u32); '
                    '__type(value, __u64); } in SEC(".maps");\n' + MAP_SRC.format(
                        fields="__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS); __uint(max_entries, 1); __type(key, __u32); "
                               "__array(values, struct inner);"),
     "map m: unsupported map type 12 (BPF_MAP_TYPE_ARRAY_OF_MAPS;"),   # not "field values is not a __uint"
    ("values of a hash", MAP_SRC.format(fields="__uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 1); "
                                        "__type(key, __u32); __array(values, struct { int x; });"),
     "map m: __array(values, ...) is for maps of maps and program arrays, not hash"),
    # CO-RE: a ___flavor's offsets are the flavor's, which egpu would keep (it relocates nothing): ->size at 0
    ("CO-RE flavor", 'struct egpu_ctx___mine { __u32 size; } __attribute__((preserve_access_index));\n'
                     'SEC("kprobe/*") int p(struct egpu_ctx *c) { return ((struct egpu_ctx___mine *)c)->size; }',
     "kprobe/*:0: CO-RE relocation (field_byte_offset) through struct egpu_ctx___mine, a flavor of "
     "egpu_ctx: egpu relocates no CO-RE access"),
    ("CO-RE field exists", 'struct egpu_ctx___new { __u64 newfield; } __attribute__((preserve_access_index));\n'
                           'SEC("kprobe/*") int p(struct egpu_ctx *c) '
                           '{ return __builtin_preserve_field_info(((struct egpu_ctx___new *)c)->newfield, 2); }',
     "CO-RE relocation (field_exists) through struct egpu_ctx___new"),
    ("legacy map type", 'struct egpu_map_def SEC("maps") m = { .type = 99, .key_size = 4, .value_size = 4, '
                        '.max_entries = 1 };\n'
                        'SEC("kprobe/*") int p(void *c) { __u32 k = 0; return bpf_map_lookup_elem(&m, &k) != 0; }',
     "map m: unsupported map type 99"),
]


@pytest.mark.parametrize("case,source,reason", BAD_SOURCES, ids=[b[0] for b in BAD_SOURCES])
def test_refused_objects(tmp_path, case, source, reason):
    obj = _compile(tmp_path, source)
    with pytest.raises(ElfError) as e:
        load_object(obj)
    assert reason in str(e.value)
    assert str(e.value).startswith(f"{obj}:")


def test_map_flags_linux_takes(tmp_path):
    """The flags libbpf users put on their maps load: those that choose how the kernel allocates or what user
    space may do mean nothing for maps in GPU memory; RDONLY_PROG and WRONLY_PROG are kept for the verifier."""
    obj = load_object(_compile(tmp_path, """
#define MAP(name, t, f) struct { __uint(type, t); __uint(max_entries, 4); __type(key, __u32); __type(value, __u64); \\
	__uint(map_flags, f); } name SEC(".maps")
MAP(h, BPF_MAP_TYPE_HASH, BPF_F_NO_PREALLOC | BPF_F_ZERO_SEED | BPF_F_NUMA_NODE | BPF_F_RDONLY);
MAP(l, BPF_MAP_TYPE_LRU_HASH, BPF_F_NO_COMMON_LRU | BPF_F_WRONLY);
MAP(a, BPF_MAP_TYPE_ARRAY, BPF_F_MMAPABLE | BPF_F_RDONLY_PROG | BPF_F_INNER_MAP);
MAP(pc, BPF_MAP_TYPE_PERCPU_ARRAY, BPF_F_WRONLY_PROG);
struct { __uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY); __uint(map_flags, BPF_F_PRESERVE_ELEMS); } pe SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_RINGBUF); __uint(max_entries, 4096); __uint(map_flags, BPF_F_NUMA_NODE); }
	rb SEC(".maps");
SEC("kprobe/*") int p(void *c) { return 0; }
"""))
    assert {m.name: m.flags for m in obj.maps} == {"h": 0x45 | 8, "l": 0x12, "a": 0x1480, "pc": 0x100, "pe": 0x800,
                                                   "rb": 0x4}


def test_btf_maps_need_btf(tmp_path):
    src = tmp_path / "nog.bpf.c"
    src.write_text('#include "egpu.bpf.h"\n' + MAP_SRC.format(
        fields="__uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 1); __type(key, __u32); __type(value, __u64);"))
    out = tmp_path / "nog.o"
    from egpu_preload.bpf.compile import clang_args, find_clang
    subprocess.run([find_clang(), *[a for a in clang_args(src, out) if a != "-g"]], check=True)
    with pytest.raises(ElfError, match="BTF-defined maps need .BTF"):
        load_object(out)


BAD_BYTES = [
    ("empty", lambda o, t: b"", "not an ELF file"),
    ("text", lambda o, t: b"hello world\n" * 10, "not an ELF file"),
    ("header only", lambda o, t: o.read_bytes()[:40], "truncated file"),
    ("truncated", lambda o, t: o.read_bytes()[:len(o.read_bytes()) // 2], "truncated file"),
    ("x86 object", lambda o, t: _x86_object(t).read_bytes(), "not an eBPF object: e_machine is 62"),
    # llvm-strip without -g: "expected one symbol table, found 0" said nothing of how it came to be
    ("stripped", lambda o, t: _symtab_gone(o), "no symbol table: stripped? (llvm-strip -g strips only debug info"),
    ("big endian", lambda o, t: o.read_bytes()[:5] + b"\x02" + o.read_bytes()[6:], "64-bit little-endian"),
    ("reloc not on lddw", lambda o, t: _patch_reloc(o, "offset", 8), "R_BPF_64_64 on a non-lddw"),
    ("reloc type", lambda o, t: _patch_reloc(o, "type", 3), "unsupported type 3"),
    ("reloc outside", lambda o, t: _patch_reloc(o, "offset", 1 << 20), "is not an instruction of the section"),
]


def _symtab_gone(obj: Path) -> bytes:
    """``obj`` with its symbol table's section made SHT_NULL, as a strip leaves no symbol table."""
    raw = bytearray(obj.read_bytes())
    with open(obj, "rb") as f:
        elf = ELFFile(f)
        index = next(i for i, sec in enumerate(elf.iter_sections()) if sec["sh_type"] == "SHT_SYMTAB")
        struct.pack_into("<I", raw, elf["e_shoff"] + index * elf["e_shentsize"] + 4, 0)   # sh_type
    return bytes(raw)


def test_a_symbol_in_a_missing_section_is_named(probe_obj):
    """The refusal named the symbol's value ("symbol at 0"), which tells no symbol from another."""
    obj = probe_obj("count")
    raw = bytearray(obj.read_bytes())
    with open(obj, "rb") as f:
        elf = ELFFile(f)
        symtab = elf.get_section_by_name(".symtab")
        index = next(i for i, s in enumerate(symtab.iter_symbols()) if s.name == "count_entries")
        struct.pack_into("<H", raw, symtab["sh_offset"] + index * 24 + 6, 200)   # st_shndx
        sections = elf.num_sections()
    with pytest.raises(ElfError) as e:
        load_bytes(bytes(raw), "probe.bpf.o")
    assert str(e.value) == (f"probe.bpf.o: symbol {index} (count_entries) refers to missing section 200 "
                            f"(the object has {sections})")


@pytest.mark.parametrize("case,make,reason", BAD_BYTES, ids=[b[0] for b in BAD_BYTES])
def test_refused_bytes(probe_obj, tmp_path, case, make, reason):
    with pytest.raises(ElfError) as e:
        load_bytes(make(probe_obj("count"), tmp_path), "probe.bpf.o")
    assert str(e.value).startswith("probe.bpf.o:") and reason in str(e.value)


@pytest.mark.parametrize("at, value, reason", [
    (2, 0x20, "insn: reserved offset field of lddw is 32, not zero"),
    (8, 0x01, "second slot are not zero (opcode 0x01, registers 0x00, offset 0)"),
    (9, 0x23, "second slot are not zero (opcode 0x00, registers 0x23, offset 0)"),
    (10, 0x05, "second slot are not zero (opcode 0x00, registers 0x00, offset 5)"),
])
def test_relocating_an_lddw_keeps_its_reserved_fields(probe_obj, at, value, reason):
    """Relocating a map's lddw rewrites its source and immediates only, as libbpf does, so the decoder still
    refuses the reserved fields Linux refuses ("invalid bpf_ld_imm64 insn"): they were zeroed, and accepted."""
    raw = bytearray(probe_obj("count").read_bytes())
    with open(probe_obj("count"), "rb") as f:
        elf = ELFFile(f)
        rel = next(s for s in elf.iter_sections() if s.name.startswith(".rel") and not s.name.startswith(".rel."))
        off = struct.unpack_from("<Q", raw, rel["sh_offset"])[0]
        lddw = elf.get_section(rel["sh_info"])["sh_offset"] + off
    raw[lddw + at] = value
    prog = load_bytes(bytes(raw), "probe.bpf.o").programs[0]
    with pytest.raises(DecodeError) as e:
        verify(prog.code, [], file="probe.bpf.o", section=prog.section)
    assert str(e.value).startswith(f"probe.bpf.o:kprobe/*:{off // 8}: invalid bpf_ld_imm64 insn")
    assert reason in str(e.value)


@pytest.mark.parametrize("at, value, reason", [
    (0, 0xBEEF, "bad magic 0xbeef"), (28, 1 << 20, "CO-RE relocations outside the"),
])
def test_refused_btf_ext(probe_obj, at, value, reason):
    """.BTF.ext is read for its CO-RE relocations, which a ___flavor would need relocated."""
    with pytest.raises(BtfError) as e:
        load_bytes(_patch_btf_ext(probe_obj("count"), at, value), "probe.bpf.o")
    assert str(e.value).startswith("probe.bpf.o:.BTF.ext: ") and reason in str(e.value)


def test_unreadable_file(tmp_path):
    with pytest.raises(ElfError, match="cannot read"):
        load_object(tmp_path / "absent.bpf.o")


FUZZED = ["subprog", "globals", "libbpf_style", "gpu_helpers"]


def _section_ranges(raw: bytes) -> list[tuple[int, int]]:
    """File ranges of the sections the loader reads (symbols, relocations, code, maps, BTF), not DWARF."""
    import io
    elf = ELFFile(io.BytesIO(raw))
    return [(s["sh_offset"], s["sh_offset"] + s["sh_size"] - 1) for s in elf.iter_sections()
            if s["sh_size"] and s["sh_type"] != "SHT_NOBITS" and ".debug" not in s.name]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_fuzz_corrupt_objects(probe_obj, data):
    """Flipped bytes (in the ELF header, the section table, or a section the loader reads) and truncation:
    load_bytes either loads or raises an EgpuError, quickly."""
    raw = bytearray(probe_obj(data.draw(st.sampled_from(FUZZED))).read_bytes())
    shoff = struct.unpack_from("<Q", raw, 40)[0]
    regions = [(0, 63), (shoff, len(raw) - 1)] + _section_ranges(bytes(raw))
    for _ in range(data.draw(st.integers(1, 4))):
        lo, hi = data.draw(st.sampled_from(regions))
        raw[data.draw(st.integers(lo, hi))] = data.draw(st.integers(0, 255))
    if data.draw(st.integers(0, 9)) == 0:
        raw = raw[:data.draw(st.integers(0, len(raw)))]
    start = time.monotonic()
    try:
        load_bytes(bytes(raw), "fuzz.bpf.o")
    except EgpuError as e:
        assert str(e).startswith("fuzz.bpf.o")
    assert time.monotonic() - start < 5
