"""eBPF ELF object (clang -target bpf) -> BpfObject: programs, maps, global data, relocations, license.

Follows libbpf's reading of an object (bpf_object__elf_collect, bpf_object__init_maps,
bpf_object__relocate) so probes written for libbpf load unchanged:

- every function symbol in an executable section other than .text is a program; a section may hold
  several; its name gives the attach point (sections.py);
- maps come from the legacy ``maps`` section (struct bpf_map_def), then from BTF-defined ``.maps``, then
  one single-entry ARRAY per global-data section (.data, .rodata*, .bss), in that order: the map index
  that relocated ``lddw`` instructions carry;
- global-data maps are named as libbpf names them: the object's name up to its first dot, cut so the
  whole fits 15 characters, followed by the section name (``globals.bss``, ``g.rodata.str1.1``);
- calls into .text (or into another function of the same section) append the callee after the
  program, transitively, each subprogram once, and the call's imm is fixed to reach it.
- relocations inside data sections (``__u64 *p = &vals[2];``) are left undone, as libbpf leaves them: the
  slot keeps the number clang wrote, and the section's map lists them (MapDef.pointers), so the verifier's
  refusal of a load through one names the section, offset and symbols;
- CO-RE relocations (.BTF.ext) keep the constants clang computed: the object's BTF is the only one
  there is, so a type the object defines is its own target; an access through a ___flavor is refused.

The pyelftools layer is used only after the file's header and section table have been checked against
its size; anything malformed becomes an ElfError naming the file and the reason.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path

from elftools.common.exceptions import ELFError as _PyElfError
from elftools.construct.core import ConstructError as _ConstructError
from elftools.elf.elffile import ELFFile

from ..errors import BtfError, EgpuError, ElfError
from ..outpaths import read_input
from . import btf as btfmod
from . import isa
from .program import (BPFTIME_MAP_TYPES, MAP_ARRAY, MAP_BLOOM_FILTER, MAP_HASH, MAP_LRU_HASH, MAP_LRU_PERCPU_HASH,
                      MAP_PERCPU_ARRAY, MAP_PERCPU_HASH, MAP_PERF_EVENT_ARRAY, MAP_PERTHREAD_ARRAY, MAP_QUEUE,
                      MAP_RINGBUF, MAP_STACK, MAP_TYPE_NAMES, PERCPU_HASHES,
                      Attach, BpfObject, DataPointer, MapDef, Program)
from .linux_names import MAP_FLAGS, map_flag, map_flag_names, map_type_name
from .sections import parse_section

EM_BPF = 247
R_BPF_64_64, R_BPF_64_32 = 1, 10  # lddw of a map or data symbol; pc-relative call (llvm BPF ELF ABI)
R_BPF_64_ABS32 = 3                # a 32-bit address in data (R_BPF_64_ABS64, 2, an 8-byte one)
SHT_PROGBITS, SHT_SYMTAB, SHT_NOBITS, SHT_REL, SHT_RELA = 1, 2, 8, 9, 4
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR = 1, 2, 4
_OP_LDDW, _OP_CALL = 0x18, 0x85
_SLOT = struct.Struct("<BBhi")
_MAP_DEF = struct.Struct("<IIIII")      # legacy struct bpf_map_def: type, key_size, value_size, max_entries,
_MAP_DEF_MIN = 16                       # map_flags (libbpf accepts definitions without map_flags)
_BPF_OBJ_NAME_LEN = 16                  # linux/bpf.h: map names hold 15 characters and a NUL
_PAGE = 4096
# The kernel's map_alloc_check limits (array_map_alloc_check, htab_map_alloc_check): a value fits one kmalloc
# (KMALLOC_MAX_SIZE, x86-64), an array's elements (each rounded up to 8 bytes) stay under U32_MAX - PAGE_SIZE,
# a hash key fits the stack (MAX_BPF_STACK).
_KMALLOC_MAX = 1 << 22
_ARRAY_MAX = (1 << 32) - 1 - _PAGE
_STACK = 512
_PCPU_UNIT = 32768   # PCPU_MIN_UNIT_SIZE: a per-CPU value (rounded up to 8) is at most this (E2BIG)
_MAP_PROG_ARRAY = 3                     # linux/bpf.h: bpf_tail_call's map
# The map_flags Linux's map_alloc_check takes per type (htab_map_alloc_check, array_map_alloc_check,
# fd_array_map_alloc_check, ringbuf_map_alloc); a flag outside them fails the map there, so here too. Of
# these, RDONLY_PROG and WRONLY_PROG bind programs (the verifier enforces them: MapDef.prog_writes); the rest
# choose how the kernel allocates (NO_PREALLOC, NO_COMMON_LRU, NUMA_NODE, ZERO_SEED, MMAPABLE, INNER_MAP,
# PRESERVE_ELEMS) or what user space may do (RDONLY, WRONLY), and mean nothing for maps that live in GPU
# memory: accepted and ignored. bpftime checks no flags; its per-thread array takes an array's.
_ACCESS = map_flag("RDONLY", "WRONLY", "RDONLY_PROG", "WRONLY_PROG")
_MAP_FLAGS = {
    MAP_HASH: _ACCESS | map_flag("NO_PREALLOC", "NUMA_NODE", "ZERO_SEED"),
    MAP_LRU_HASH: _ACCESS | map_flag("NO_COMMON_LRU", "NUMA_NODE", "ZERO_SEED"),   # NO_PREALLOC: -ENOTSUPP
    MAP_PERCPU_HASH: _ACCESS | map_flag("NO_PREALLOC", "NUMA_NODE", "ZERO_SEED"),
    MAP_LRU_PERCPU_HASH: _ACCESS | map_flag("NO_COMMON_LRU", "NUMA_NODE", "ZERO_SEED"),
    MAP_ARRAY: _ACCESS | map_flag("NUMA_NODE", "MMAPABLE", "INNER_MAP"),
    MAP_PERTHREAD_ARRAY: _ACCESS | map_flag("NUMA_NODE", "MMAPABLE", "INNER_MAP"),
    MAP_PERCPU_ARRAY: _ACCESS,                                                     # no NUMA node per CPU
    MAP_PERF_EVENT_ARRAY: map_flag("RDONLY", "WRONLY", "NUMA_NODE", "PRESERVE_ELEMS"),
    MAP_RINGBUF: map_flag("NUMA_NODE"),
    MAP_QUEUE: _ACCESS | map_flag("NUMA_NODE"),                                    # queue_stack_map_alloc_check
    MAP_STACK: _ACCESS | map_flag("NUMA_NODE"),
    MAP_BLOOM_FILTER: _ACCESS | map_flag("NUMA_NODE", "ZERO_SEED"),
}
# Pairs Linux refuses together (bpf_map_flags_access_ok, bpf_get_file_flag, htab_map_alloc_check).
_EXCLUSIVE = (("RDONLY_PROG", "WRONLY_PROG"), ("RDONLY", "WRONLY"), ("NUMA_NODE", "NO_COMMON_LRU"))
_SUPPORTED = (", ".join(n for t, n in MAP_TYPE_NAMES.items() if t != MAP_PERTHREAD_ARRAY) + "; bpftime's "
              + ", ".join(map(str, sorted({*BPFTIME_MAP_TYPES, MAP_PERTHREAD_ARRAY}))))
# BTF-defined map attributes given with __uint(...) (libbpf parse_btf_map_def); numa_node and pinning
# mean nothing on a GPU and are accepted and ignored; map_extra only on bloom filters (its hash count).
_UINT_ATTRS = {"type", "max_entries", "map_flags", "key_size", "value_size", "numa_node", "pinning",
               "map_extra"}
_MAP_EXTRA_TYPES = (MAP_BLOOM_FILTER, 33)   # linux/bpf.h: BLOOM_FILTER (hash count), ARENA (address)


@dataclass(frozen=True)
class _Sym:
    name: str
    value: int
    size: int
    type: str      # STT_*
    shndx: int     # -1 undefined, -2 absolute/common/other special index


@dataclass
class _Section:
    index: int
    name: str
    type: int
    flags: int
    offset: int
    size: int
    info: int
    link: int
    data: bytes = b""


@dataclass
class _Func:
    """A function's code in its section: [start, end) in instruction slots."""

    name: str
    section: int
    start: int
    end: int


@dataclass
class _Loader:
    path: str
    raw: bytes
    sections: list[_Section] = field(default_factory=list)
    syms: list[_Sym] = field(default_factory=list)
    btf: btfmod.Btf | None = None
    maps: list[MapDef] = field(default_factory=list)
    map_at: dict[tuple[int, int], int] = field(default_factory=dict)   # (section, offset) -> map index
    data_map: dict[int, int] = field(default_factory=dict)             # data section -> map index
    code: dict[int, bytearray] = field(default_factory=dict)           # exec section -> relocated code
    calls: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)  # relocated call or
    # function address (lddw) -> its target
    funcs: dict[tuple[int, int], _Func] = field(default_factory=dict)  # (section, start slot) -> function
    attach: dict[int, Attach] = field(default_factory=dict)             # program section -> what it attaches to

    # ---- ELF structure ----

    def read_elf(self) -> None:
        data = self.raw
        if len(data) < 4 or data[:4] != b"\x7fELF":
            raise ElfError("not an ELF file")
        if len(data) < 64:
            raise ElfError(f"truncated file: {len(data)} bytes is less than an ELF header")
        if data[4] != 2 or data[5] != 1:
            raise ElfError("not a 64-bit little-endian ELF (eBPF objects are ELF64 LSB)")
        e_type, e_machine = struct.unpack_from("<HH", data, 16)
        if e_machine != EM_BPF:
            raise ElfError(f"not an eBPF object: e_machine is {e_machine}, expected EM_BPF ({EM_BPF})")
        if e_type != 1:
            raise ElfError(f"not a relocatable object (e_type {e_type}); pass clang -c output")
        shoff, = struct.unpack_from("<Q", data, 40)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 58)
        if shentsize != 64 or shnum == 0:
            raise ElfError(f"bad section header table ({shnum} entries of {shentsize} bytes)")
        if shoff + shnum * 64 > len(data):
            raise ElfError("truncated file: the section header table extends past the end")
        if shstrndx >= shnum:
            raise ElfError(f"section name table index {shstrndx} out of range")
        headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * 64) for i in range(shnum)]
        for i, (_, typ, flags, _, off, size, link, info, _, _) in enumerate(headers):
            if typ != SHT_NOBITS and typ != 0 and off + size > len(data):
                raise ElfError(f"truncated file: section {i} extends past the end")
            self.sections.append(_Section(i, "", typ, flags, off, size, info, link,
                                          b"" if typ in (0, SHT_NOBITS) else data[off:off + size]))
        names = self.sections[shstrndx].data
        for s, h in zip(self.sections, headers):
            s.name = _cstr(names, h[0], "section name")
        self.read_symbols()

    def read_symbols(self) -> None:
        symtabs = [s for s in self.sections if s.type == SHT_SYMTAB]
        if not symtabs:   # what llvm-strip or strip without -g leaves: the programs and maps have no names
            raise ElfError("no symbol table: stripped? (llvm-strip -g strips only debug info and keeps it)")
        if len(symtabs) != 1:
            raise ElfError(f"expected one symbol table, found {len(symtabs)}")
        tab = symtabs[0]
        if tab.link >= len(self.sections) or tab.size % 24:
            raise ElfError("malformed symbol table")
        # pyelftools decodes the entries; the checks above make its reads stay inside the file.
        elf = ELFFile(io.BytesIO(self.raw))
        sec = elf.get_section(tab.index)
        strtab = self.sections[tab.link].data
        for index, sym in enumerate(sec.iter_symbols()):
            name = _cstr(strtab, sym["st_name"], "symbol name")
            shndx = sym["st_shndx"]
            if isinstance(shndx, str):
                shndx = -1 if shndx == "SHN_UNDEF" else -2
            elif shndx >= len(self.sections):
                raise ElfError(f"symbol {index} ({name or 'unnamed'}) refers to missing section {shndx} (the "
                               f"object has {len(self.sections)})")
            self.syms.append(_Sym(name, sym["st_value"], sym["st_size"], sym["st_info"]["type"], shndx))

    def section_named(self, name: str) -> _Section | None:
        return next((s for s in self.sections if s.name == name), None)

    def symbols_in(self, index: int, kind: str) -> list[_Sym]:
        return sorted((s for s in self.syms if s.shndx == index and s.type == kind), key=lambda s: s.value)

    def variable_at(self, index: int, offset: int) -> str:
        """The variable of section ``index`` holding byte ``offset``, as "name" or "name+k"; "" if none."""
        var = next((o for o in self.symbols_in(index, "STT_OBJECT") if o.value <= offset < o.value + max(o.size, 1)),
                   None)
        return "" if var is None else var.name + (f"+{offset - var.value}" if offset > var.value else "")

    # ---- BTF, license ----

    def read_btf(self) -> None:
        sec = self.section_named(".BTF")
        if sec is None:
            return
        try:
            self.btf = btfmod.Btf.parse(sec.data)
        except BtfError as e:
            raise e.where(section=".BTF")

    def license(self) -> str:
        sec = self.section_named("license")
        return sec.data.split(b"\0", 1)[0].decode("utf-8", "replace") if sec else ""

    def check_core_relos(self) -> None:
        """libbpf computes the constant of each CO-RE relocation against the target's BTF; egpu's only BTF
        is the object's, so it keeps clang's constants, right for the types the object defines. A ___flavor
        stands for another type, whose layout it may not share: refused rather than read at its offsets."""
        btf, ext = self.section_named(".BTF"), self.section_named(".BTF.ext")
        if self.btf is None or ext is None:
            return
        try:
            for r in btfmod.core_relos(btf.data, ext.data):
                t = next((t for t in (self.btf.type(r.type_id), self.btf.resolve(r.type_id)) if "___" in t.name),
                         None)
                if t is None:
                    continue
                kind = btfmod.CORE_KINDS[r.kind] if r.kind < len(btfmod.CORE_KINDS) else f"kind {r.kind}"
                base = t.name.rsplit("___", 1)[0]
                raise ElfError(f"CO-RE relocation ({kind}) through {t.kind_name} {t.name}, a flavor of {base}: egpu "
                               f"relocates no CO-RE access, so the flavor's own layout would be used; use "
                               f"{t.kind_name} {base} itself", section=r.section, insn=r.insn)
        except BtfError as e:
            raise e.where(section=".BTF.ext")

    # ---- maps ----

    def add_map(self, m: MapDef, key: tuple[int, int] | None = None) -> None:
        if key is not None:
            self.map_at[key] = len(self.maps)
        self.maps.append(_checked_map(m))

    def read_legacy_maps(self) -> None:
        sec = self.section_named("maps")
        if sec is None:
            return
        syms = self.symbols_in(sec.index, "STT_OBJECT") or \
            [s for s in self.symbols_in(sec.index, "STT_NOTYPE") if s.name]
        for s in syms:
            size = s.size or (sec.size // len(syms))
            if size < _MAP_DEF_MIN or s.value + size > sec.size:
                raise ElfError(f"map {s.name}: definition of {size} bytes at {s.value} does not fit "
                               f"struct bpf_map_def", section="maps")
            raw = sec.data[s.value:s.value + size]
            typ, key_size, value_size, max_entries, flags = _MAP_DEF.unpack((raw + bytes(20))[:20])
            if any(raw[20:]):
                raise ElfError(f"map {s.name}: unknown non-zero fields after map_flags in bpf_map_def",
                               section="maps")
            self.add_map(MapDef(s.name, typ, key_size, value_size, max_entries, flags), (sec.index, s.value))

    def read_btf_maps(self) -> None:
        sec = self.section_named(".maps")
        if sec is None:
            return
        if self.btf is None or self.btf.find(".maps", btfmod.KIND_DATASEC) is None:
            raise ElfError("BTF-defined maps need .BTF describing them (compile with -g)", section=".maps")
        syms = {s.name: s for s in self.symbols_in(sec.index, "STT_OBJECT")}
        self.fix_datasec(sec, syms)
        datasec = self.btf.find(".maps", btfmod.KIND_DATASEC)
        for vs in sorted(datasec.secinfos, key=lambda v: v.offset):
            var = self.btf.type(vs.type)
            if var.name not in syms:
                raise ElfError(f"map {var.name}: missing symbol", section=".maps")
            m = _btf_map_def(self.btf, var)
            self.add_map(m, (sec.index, syms[var.name].value))

    def fix_datasec(self, sec: _Section, syms: dict[str, _Sym]) -> None:
        if self.btf is not None:
            try:
                self.btf.with_datasec(sec.name, sec.size, {n: s.value for n, s in syms.items()})
            except BtfError as e:
                raise e.where(section=".BTF")

    def read_global_data(self) -> None:
        stem = Path(self.path).name.split(".", 1)[0]
        for sec in self.sections:
            if not _is_data_section(sec) or sec.size == 0:
                continue
            self.fix_datasec(sec, {s.name: s for s in self.symbols_in(sec.index, "STT_OBJECT")})
            datasec = self.btf.find(sec.name, btfmod.KIND_DATASEC) if self.btf else None
            # libbpf internal_map_name: the suffix keeps at least 7 characters' room, the prefix the rest.
            pfx = max(0, min(_BPF_OBJ_NAME_LEN - max(7, len(sec.name)) - 1, len(stem)))
            name = (stem[:pfx] + sec.name)[:_BPF_OBJ_NAME_LEN - 1]
            self.data_map[sec.index] = len(self.maps)
            self.maps.append(MapDef(name, MAP_ARRAY, 4, sec.size, 1, value_type_id=datasec.id if datasec else None,
                                    initial=None if sec.type == SHT_NOBITS else sec.data,
                                    readonly=not sec.flags & SHF_WRITE))

    # ---- code and relocations ----

    def read_code(self) -> None:
        for sec in self.sections:
            if sec.type != SHT_PROGBITS or not sec.flags & SHF_EXECINSTR:
                continue
            if sec.size % 8:
                raise ElfError(f"code size {sec.size} is not a multiple of 8", section=sec.name)
            self.code[sec.index] = bytearray(sec.data)
            funcs = self.symbols_in(sec.index, "STT_FUNC")
            for i, f in enumerate(funcs):
                end = f.value + f.size if f.size else (funcs[i + 1].value if i + 1 < len(funcs) else sec.size)
                if f.value % 8 or end % 8 or end > sec.size or end <= f.value:
                    raise ElfError(f"function {f.name} at {f.value}+{f.size} is not whole instructions inside "
                                   f"its section", section=sec.name)
                self.funcs.setdefault((sec.index, f.value // 8), _Func(f.name, sec.index, f.value // 8, end // 8))
            # before relocating: an object made for a kind egpu cannot attach (USDT's) is refused for that, not
            # for an extern its library declares (usdt.bpf.h's __kconfig LINUX_HAS_BPF_COOKIE)
            if funcs and sec.name != ".text":
                self.attach[sec.index] = parse_section(sec.name)

    def relocate(self) -> None:
        for rel in self.sections:
            if rel.type in (SHT_REL, SHT_RELA) and rel.info in self.data_map:
                self.note_data_pointers(rel, self.sections[rel.info])
            if rel.type not in (SHT_REL, SHT_RELA) or rel.info not in self.code:
                continue
            target = self.sections[rel.info]
            if rel.type == SHT_RELA or rel.size % 16:
                raise ElfError(f"bad relocation section {rel.name} (expected REL entries of 16 bytes)",
                               section=target.name)
            for off, info in struct.iter_unpack("<QQ", rel.data):
                self.relocate_one(target, off, info >> 32, info & 0xFFFFFFFF)

    def note_data_pointers(self, rel: _Section, sec: _Section) -> None:
        """Relocations inside a data section: addresses stored in global data. libbpf ignores them (its
        bpf_object__collect_relos takes those of programs only), so they stay the numbers clang wrote; the
        section's map keeps them (MapDef.pointers) so that the verifier's refusal of a load through one says
        why. Entries that make no sense are passed over, as libbpf passes over the whole section."""
        found = []
        entry = 24 if rel.type == SHT_RELA else 16
        for i in range(0, rel.size - rel.size % entry, entry):
            off, info = struct.unpack_from("<QQ", rel.data, i)
            width = 4 if info & 0xFFFFFFFF == R_BPF_64_ABS32 else 8
            if not 0 < info >> 32 < len(self.syms) or off + width > len(sec.data):
                continue
            sym = self.syms[info >> 32]
            addend = (struct.unpack_from("<q", rel.data, i + 16)[0] if rel.type == SHT_RELA
                      else int.from_bytes(sec.data[off:off + width], "little"))
            at = sym.value + addend   # a static variable's address is its section's symbol plus an addend
            target = self.variable_at(sym.shndx, at) or f"{sym.name or '?'}{f'+{addend}' if addend else ''}"
            found.append(DataPointer(sec.name, off, self.variable_at(sec.index, off).split("+")[0], target))
        index = self.data_map[sec.index]
        self.maps[index] = replace(self.maps[index], pointers=self.maps[index].pointers + tuple(found))

    def relocate_one(self, sec: _Section, off: int, sym_index: int, rtype: int) -> None:
        code = self.code[sec.index]
        pc = off // 8
        if off % 8 or off + 8 > len(code):
            raise ElfError(f"bad relocation: offset {off} is not an instruction of the section", section=sec.name)
        if not 0 < sym_index < len(self.syms):
            raise ElfError(f"bad relocation at insn {pc}: symbol index {sym_index} out of range",
                           section=sec.name)
        sym = self.syms[sym_index]
        opcode, regs, insn_off, imm = _SLOT.unpack_from(code, off)
        if sym.shndx < 0:
            raise ElfError(f"missing symbol {sym.name or '?'} (referenced by insn {pc}): externs, kfuncs and "
                           f"ksyms are not supported", section=sec.name)
        if rtype == R_BPF_64_64:
            if opcode != _OP_LDDW or off + 16 > len(code):
                raise ElfError(f"bad relocation at insn {pc}: R_BPF_64_64 on a non-lddw instruction",
                               section=sec.name)
            self.relocate_lddw(sec, code, off, sym, imm & 0xFFFFFFFF)
        elif rtype == R_BPF_64_32:
            if opcode != _OP_CALL or regs >> 4 != isa.CALL_LOCAL:
                raise ElfError(f"bad relocation at insn {pc}: R_BPF_64_32 on a non-call instruction",
                               section=sec.name)
            if sym.shndx not in self.code:
                raise ElfError(f"bad relocation at insn {pc}: call to {sym.name or '?'}, which is not code",
                               section=sec.name)
            # libbpf: the callee is at sym_off / 8 + imm + 1, for section and function symbols alike.
            self.calls[sec.index, pc] = (sym.shndx, sym.value // 8 + imm + 1)
        else:
            raise ElfError(f"bad relocation at insn {pc}: unsupported type {rtype}", section=sec.name)

    def relocate_lddw(self, sec: _Section, code: bytearray, off: int, sym: _Sym, addend: int) -> None:
        pc = off // 8
        dst = code[off + 1] & 0x0F
        if (sym.shndx, sym.value + addend) in self.map_at:
            src, value = isa.LDDW_MAP_IDX, self.map_at[sym.shndx, sym.value + addend]
        elif sym.shndx in self.data_map:
            where = sym.value + addend
            if where > self.sections[sym.shndx].size:
                raise ElfError(f"bad relocation at insn {pc}: {sym.name} + {addend} is outside "
                               f"{self.sections[sym.shndx].name}", section=sec.name)
            src, value = isa.LDDW_MAP_IDX_VALUE, self.data_map[sym.shndx] | where << 32
        elif sym.shndx in self.code:
            # A function's address (lddw r, func): a callback, as bpf_loop takes. libbpf's RELO_SUBPROG_ADDR:
            # BPF_PSEUDO_FUNC, its imm made relative to the next slot when the program is linked (link).
            where = sym.value + addend
            if where % 8 or (sym.shndx, where // 8) not in self.funcs:
                raise ElfError(f"insn {pc} takes the address of {sym.name or self.sections[sym.shndx].name}"
                               f"+{addend}, which is no function's start", section=sec.name)
            self.calls[sec.index, pc] = (sym.shndx, where // 8)
            src, value = isa.LDDW_CODE_ADDR, 0
        else:
            target = self.sections[sym.shndx].name
            raise ElfError(f"bad relocation at insn {pc}: {sym.name or target} in section {target} is neither "
                           f"a map nor global data", section=sec.name)
        # Only the pseudo source and the immediates change, as in libbpf: the decoder refuses a non-zero offset
        # or second-slot opcode, register or offset, as Linux does ("invalid bpf_ld_imm64 insn").
        code[off + 1] = src << 4 | dst
        struct.pack_into("<i", code, off + 4, _s32(value & 0xFFFFFFFF))
        struct.pack_into("<i", code, off + 12, _s32(value >> 32))

    # ---- programs ----

    def programs(self) -> list[Program]:
        progs = []
        text = self.section_named(".text")
        for (index, _), func in sorted(self.funcs.items()):
            sec = self.sections[index]
            if text is not None and index == text.index:
                continue
            code, layout = self.link(func)
            progs.append(Program(func.name, sec.name, self.attach[index], code, layout))
        return progs

    def link(self, main: _Func) -> tuple[bytes, tuple[tuple[str, int, int], ...]]:
        """The function's code with every function it calls appended once and each call's imm fixed, and
        where each piece came from (Program.layout)."""
        placed = {(main.section, main.start): 0}
        order = [main]
        out = bytearray()
        for func in order:  # grows while we walk it
            base = len(out) // 8
            code = bytearray(self.code[func.section][func.start * 8:func.end * 8])
            pc = 0
            while pc < func.end - func.start:
                opcode, regs, _, imm = _SLOT.unpack_from(code, pc * 8)
                # a local call, or a function's address (a callback): both relative to the next slot
                if regs >> 4 == (isa.CALL_LOCAL if opcode == _OP_CALL else isa.LDDW_CODE_ADDR) and \
                        opcode in (_OP_CALL, _OP_LDDW):
                    here = func.start + pc
                    target = self.calls.get((func.section, here), (func.section, here + 1 + imm))
                    callee = self.funcs.get(target)
                    if callee is None:
                        what = "call" if opcode == _OP_CALL else "function address"
                        raise ElfError(f"{what} at insn {here} of {func.name} does not enter a function "
                                       f"(target {self.sections[target[0]].name}+{target[1]})",
                                       section=self.sections[func.section].name)
                    if target not in placed:
                        placed[target] = sum(f.end - f.start for f in order)
                        order.append(callee)
                    code[pc * 8 + 4:pc * 8 + 8] = struct.pack("<i", placed[target] - (base + pc + 1))
                pc += 2 if opcode == _OP_LDDW else 1
            out += code
        return bytes(out), tuple((self.sections[f.section].name, f.start, f.end - f.start) for f in order)

    def load(self) -> BpfObject:
        self.read_elf()
        self.read_btf()
        self.check_core_relos()
        self.read_legacy_maps()
        self.read_btf_maps()
        self.read_global_data()
        self.read_code()
        self.relocate()
        return BpfObject(self.path, self.programs(), self.maps, self.license(), self.btf)


def _is_data_section(sec: _Section) -> bool:
    """.data/.rodata/.bss and their clang variants (.rodata.str1.1, .data.rel.ro, .bss.x)."""
    return bool(sec.flags & SHF_ALLOC) and not sec.flags & SHF_EXECINSTR and \
        sec.type in (SHT_PROGBITS, SHT_NOBITS) and \
        any(sec.name == p or sec.name.startswith(p + ".") for p in (".data", ".rodata", ".bss"))


def _btf_map_def(btf: btfmod.Btf, var: btfmod.Type) -> MapDef:
    """A libbpf BTF-defined map: a struct of pointers, ``__uint(x, N)`` = ``int (*x)[N]`` and
    ``__type(x, T)`` = ``T *x`` (bpf_helpers.h)."""
    attrs: dict[str, int] = {}
    types: dict[str, int] = {}
    inner = False
    try:
        for m in btf.members(var.ref):
            if m.name == "values":   # libbpf's __array(values, ...): the inner maps or programs, an array
                inner = True         # of pointers; the map type says why egpu refuses it
                continue
            ptr = btf.resolve(m.type)
            if ptr.kind != btfmod.KIND_PTR:
                raise ElfError(f"map {var.name}: field {m.name} is not a __uint or __type", section=".maps")
            if m.name in _UINT_ATTRS:
                arr = btf.resolve(ptr.ref)
                if arr.kind != btfmod.KIND_ARRAY:
                    raise ElfError(f"map {var.name}: {m.name} is not set with __uint()", section=".maps")
                attrs[m.name] = arr.nelems
            elif m.name in ("key", "value"):
                types[m.name] = ptr.ref
                size = btf.size(ptr.ref)
                if attrs.get(f"{m.name}_size", size) != size:
                    raise ElfError(f"map {var.name}: {m.name}_size {attrs[m.name + '_size']} disagrees with "
                                   f"the {m.name} type's {size} bytes", section=".maps")
                attrs[f"{m.name}_size"] = size
            else:
                raise ElfError(f"map {var.name}: unsupported field {m.name or '(anonymous)'}", section=".maps")
    except BtfError as e:
        raise ElfError(f"map {var.name}: {e.reason}", section=".maps") from None
    if "type" not in attrs:
        raise ElfError(f"map {var.name}: no type", section=".maps")
    typ = attrs["type"]
    if inner and typ in MAP_TYPE_NAMES:   # libbpf: "should be map-in-map or prog-array"
        raise ElfError(f"map {var.name}: __array(values, ...) is for maps of maps and program arrays, "
                       f"not {MAP_TYPE_NAMES[typ]}", section=".maps")
    if attrs.get("map_extra") and typ not in _MAP_EXTRA_TYPES:   # Linux's map_create refuses it: EINVAL
        raise ElfError(f"map {var.name}: map_extra {attrs['map_extra']}: Linux takes it only on bloom filters and "
                       f"arenas", section=".maps")
    key_size, value_size = attrs.get("key_size", 0), attrs.get("value_size", 0)
    if typ == MAP_PERF_EVENT_ARRAY:  # libbpf fills in the int-sized key and value (fd slots)
        key_size, value_size = key_size or 4, value_size or 4
    return MapDef(var.name, typ, key_size, value_size, attrs.get("max_entries", 0), attrs.get("map_flags", 0),
                  key_type_id=types.get("key"), value_type_id=types.get("value"), map_extra=attrs.get("map_extra", 0))


def _checked_map(m: MapDef) -> MapDef:
    """The limits the kernel's map_alloc_check enforces, so a bad definition fails at load, not on the GPU.
    bpftime's GPU map types become the egpu type with their semantics (program.BPFTIME_MAP_TYPES)."""
    if m.type in BPFTIME_MAP_TYPES:
        m = replace(m, type=BPFTIME_MAP_TYPES[m.type])
        if m.type == MAP_PERF_EVENT_ARRAY:  # bpftime sizes its per-thread rings by record; ours are per map
            m = replace(m, key_size=4, value_size=4, max_entries=0)
    if m.type not in MAP_TYPE_NAMES:
        instead = ": tail calls are not supported, call a static __noinline function instead" \
            if m.type == _MAP_PROG_ARRAY else ""
        raise ElfError(f"map {m.name}: unsupported map type {m.type} ({map_type_name(m.type)}{instead}; "
                       f"supported: {_SUPPORTED})")
    kind = MAP_TYPE_NAMES[m.type]
    _check_flags(m, kind)
    if m.type == MAP_RINGBUF:
        if m.key_size or m.value_size:
            raise ElfError(f"map {m.name}: a ringbuf has no key or value")
        if m.max_entries < _PAGE or m.max_entries & (m.max_entries - 1):
            raise ElfError(f"map {m.name}: ringbuf size {m.max_entries} is not a power of 2 of at least {_PAGE}")
        return m
    if m.type == MAP_PERF_EVENT_ARRAY:
        if m.key_size != 4 or m.value_size != 4:
            raise ElfError(f"map {m.name}: perf_event_array key and value are 4 bytes")
        return m  # max_entries 0: one slot per SM, fixed when the map is created on the GPU
    if m.type in (MAP_QUEUE, MAP_STACK, MAP_BLOOM_FILTER):   # queue_stack_map_alloc_check, bloom_map_alloc
        if m.key_size or not m.value_size or not m.max_entries:
            raise ElfError(f"map {m.name}: a {kind} has no key, and needs value_size and max_entries "
                           f"(got {m.key_size}, {m.value_size}, {m.max_entries})")
        if m.map_extra & ~0xF:
            raise ElfError(f"map {m.name}: map_extra {m.map_extra}: a bloom filter's hash count is at most 15")
        if m.value_size > _KMALLOC_MAX:
            raise ElfError(f"map {m.name}: a value of {m.value_size:,} bytes (Linux's limit is {_KMALLOC_MAX:,})")
        return m
    if m.key_size == 0 or m.value_size == 0 or m.max_entries == 0:
        raise ElfError(f"map {m.name}: {kind} needs key_size, value_size and max_entries "
                       f"(got {m.key_size}, {m.value_size}, {m.max_entries})")
    if m.value_size > _KMALLOC_MAX:
        raise ElfError(f"map {m.name}: a value of {m.value_size:,} bytes (Linux's limit is {_KMALLOC_MAX:,})")
    if m.type in (MAP_PERCPU_ARRAY, *PERCPU_HASHES) and -(-m.value_size // 8) * 8 > _PCPU_UNIT:
        raise ElfError(f"map {m.name}: a per-CPU value of {m.value_size:,} bytes (Linux's limit is {_PCPU_UNIT:,})")
    if m.type in (MAP_ARRAY, MAP_PERCPU_ARRAY, MAP_PERTHREAD_ARRAY):
        if m.key_size != 4:
            raise ElfError(f"map {m.name}: {kind} keys are 4 bytes, not {m.key_size}")
        size = m.max_entries * (-(-m.value_size // 8) * 8)
        if size >= _ARRAY_MAX:   # the VM and the launch VM would build it whole before anything refused it
            raise ElfError(f"map {m.name}: {m.max_entries:,} entries of {m.value_size} bytes make {size:,} bytes: "
                           f"Linux refuses an array of 4 GiB or more")
    elif m.key_size > _STACK:
        raise ElfError(f"map {m.name}: a key of {m.key_size} bytes (at most {_STACK}, as a program's stack holds "
                       f"its keys)")
    return m


def _check_flags(m: MapDef, kind: str) -> None:
    """The map_flags Linux refuses with EINVAL at BPF_MAP_CREATE, refused at load (_MAP_FLAGS)."""
    if unknown := m.flags & ~((1 << len(MAP_FLAGS)) - 1):
        raise ElfError(f"map {m.name}: map_flags {m.flags:#x}: {unknown:#x} is no flag linux/bpf.h defines")
    if wrong := m.flags & ~_MAP_FLAGS[m.type]:
        raise ElfError(f"map {m.name}: map_flags {map_flag_names(wrong)}: Linux refuses it on {kind} maps "
                       f"(which take {map_flag_names(_MAP_FLAGS[m.type])})")
    for pair in _EXCLUSIVE:
        if m.flags & map_flag(*pair) == map_flag(*pair):
            raise ElfError(f"map {m.name}: map_flags {map_flag_names(map_flag(*pair))}: Linux refuses the two together")


def _cstr(table: bytes, off: int, what: str) -> str:
    if off >= len(table) and off:
        raise ElfError(f"{what} offset {off} outside its string table")
    end = table.find(b"\0", off)
    return table[off:end if end >= 0 else len(table)].decode("utf-8", "replace")


def _s32(v: int) -> int:
    return v - (1 << 32) if v & 0x80000000 else v


def load_bytes(data: bytes, path: str) -> BpfObject:
    """Load an eBPF object from its bytes; ``path`` names it in messages and global-data map names."""
    try:
        return _Loader(path, bytes(data)).load()
    except EgpuError as e:
        raise e.where(file=path)
    except (_PyElfError, _ConstructError) as e:  # pyelftools' own refusal of a malformed file
        raise ElfError(f"malformed ELF: {e}", file=path) from None


def load_object(path: str | Path) -> BpfObject:
    """Load ``X.bpf.o``."""
    return load_bytes(read_input(Path(path), ElfError), str(path))
