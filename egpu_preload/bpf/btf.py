"""BTF (the kernel's BPF Type Format, Documentation/bpf/btf.rst): bytes of a .BTF section -> types.

Knows nothing of ELF (as libbpf's btf_parse_hdr / btf_parse_type_sec): the ELF loader hands in the
section's bytes and, for DATASEC fix-ups, the sizes and symbol offsets it read from the ELF.
Every id and string offset is checked once at parse time, so lookups afterwards cannot fail on a
malformed section; type loops are caught when sizes are resolved.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass
from typing import Iterator, Mapping

from ..errors import BtfError

MAGIC = 0xEB9F
_HEADER = struct.Struct("<HBBIIIII")  # magic, version, flags, hdr_len, type_off, type_len, str_off, str_len
_TYPE = struct.Struct("<III")          # name_off, info, size_or_type
_U32 = struct.Struct("<I")
_S32 = struct.Struct("<i")
_U32_PAIR = struct.Struct("<II")
_TRIPLE = struct.Struct("<III")
_MAX_DEPTH = 64  # longest modifier/typedef/array chain we follow before calling it a loop

(KIND_INT, KIND_PTR, KIND_ARRAY, KIND_STRUCT, KIND_UNION, KIND_ENUM, KIND_FWD, KIND_TYPEDEF, KIND_VOLATILE,
 KIND_CONST, KIND_RESTRICT, KIND_FUNC, KIND_FUNC_PROTO, KIND_VAR, KIND_DATASEC, KIND_FLOAT, KIND_DECL_TAG,
 KIND_TYPE_TAG, KIND_ENUM64) = range(1, 20)
KIND_NAMES = {KIND_INT: "int", KIND_PTR: "ptr", KIND_ARRAY: "array", KIND_STRUCT: "struct",
              KIND_UNION: "union", KIND_ENUM: "enum", KIND_FWD: "fwd", KIND_TYPEDEF: "typedef",
              KIND_VOLATILE: "volatile", KIND_CONST: "const", KIND_RESTRICT: "restrict", KIND_FUNC: "func",
              KIND_FUNC_PROTO: "func_proto", KIND_VAR: "var", KIND_DATASEC: "datasec", KIND_FLOAT: "float",
              KIND_DECL_TAG: "decl_tag", KIND_TYPE_TAG: "type_tag", KIND_ENUM64: "enum64"}
# Kinds whose size_or_type field is a size; for the others it is a type id.
_SIZED = {KIND_INT, KIND_STRUCT, KIND_UNION, KIND_ENUM, KIND_DATASEC, KIND_FLOAT, KIND_ENUM64}
# Kinds that only qualify or rename the type they reference.
_TRANSPARENT = {KIND_TYPEDEF, KIND_VOLATILE, KIND_CONST, KIND_RESTRICT, KIND_TYPE_TAG}
# BTF_INT_* encoding bits.
INT_SIGNED, INT_CHAR, INT_BOOL = 1, 2, 4


# enum bpf_core_relo_kind (linux/bpf.h), by value.
CORE_KINDS = ("field_byte_offset", "field_byte_size", "field_exists", "field_signed", "field_lshift_u64",
              "field_rshift_u64", "type_id_local", "type_id_target", "type_exists", "type_size", "enumval_exists",
              "enumval_value", "type_matches")
# .BTF.ext (libbpf btf_ext__new): {u16 magic, u8 version, u8 flags, u32 hdr_len, then offset and length of
# func info, line info and CO-RE relocations, counted from the end of the header; headers of 24 bytes
# predate CO-RE}. Each subsection: u32 record size, then per code section {u32 section name, u32 count} and
# count records; a CO-RE relocation's: {u32 insn_off (bytes into the section), u32 type id, u32 access string,
# u32 kind}.
_EXT_HEADER = struct.Struct("<HBBIIIIIII")
_EXT_HEADER_V1 = 24
EXT_LINE_INFO, EXT_CORE_RELO = 1, 2   # subsections, by their place in the header (0: func info)
_EXT_INFOS = ("func info", "line info", "CO-RE relocations")
_CORE_RECORD = struct.Struct("<IIII")


@dataclass(frozen=True)
class CoreRelo:
    """A CO-RE relocation: the instruction whose constant libbpf would compute against the target's BTF."""

    section: str   # the code section holding the instruction
    insn: int      # the instruction's index in that section
    type_id: int   # the local type the access starts from
    kind: int      # an index into CORE_KINDS


@dataclass(frozen=True)
class Member:
    """A struct/union member. ``bit_offset`` from the start of the aggregate; bitfields have a size."""

    name: str
    type: int
    bit_offset: int
    bitfield_size: int = 0

    @property
    def offset(self) -> int:
        return self.bit_offset // 8


@dataclass(frozen=True)
class EnumValue:
    name: str
    value: int


@dataclass(frozen=True)
class Param:
    name: str
    type: int


@dataclass(frozen=True)
class VarSecinfo:
    """One variable of a DATASEC: its VAR type id, offset and size in the section."""

    type: int
    offset: int
    size: int


@dataclass(frozen=True)
class Type:
    """One BTF type. ``size`` is set for sized kinds, ``ref`` for kinds that reference another type
    (for ARRAY: the element; FUNC_PROTO: the return type); the kind's extra data fills the rest."""

    id: int
    kind: int
    name: str
    kind_flag: bool = False
    size: int = 0
    ref: int = 0
    int_encoding: int = 0
    int_bit_offset: int = 0
    int_bits: int = 0
    index_type: int = 0
    nelems: int = 0
    members: tuple[Member, ...] = ()
    enum_values: tuple[EnumValue, ...] = ()
    params: tuple[Param, ...] = ()
    linkage: int = 0
    secinfos: tuple[VarSecinfo, ...] = ()
    component_idx: int = -1

    @property
    def kind_name(self) -> str:
        return KIND_NAMES.get(self.kind, "")   # "" for void (type 0)


VOID = Type(0, 0, "void")


class Btf:
    """Parsed BTF: ``types[id]`` (id 0 is void), sizes, members and names (output/values.py reads values by them)."""

    def __init__(self, types: list[Type]) -> None:
        self.types = types
        self._by_name: dict[str, list[Type]] = {}
        for t in types[1:]:
            if t.name:
                self._by_name.setdefault(t.name, []).append(t)

    @classmethod
    def parse(cls, data: bytes) -> "Btf":
        return cls(_parse(bytes(data)))

    def __len__(self) -> int:
        return len(self.types)

    def type(self, type_id: int) -> Type:
        if not 0 <= type_id < len(self.types):
            raise BtfError(f"type id {type_id} out of range (BTF has {len(self.types) - 1} types)")
        return self.types[type_id]

    def find(self, name: str, kind: int | None = None) -> Type | None:
        """The first type called ``name`` (of ``kind`` when given)."""
        for t in self._by_name.get(name, ()):
            if kind is None or t.kind == kind:
                return t
        return None

    def resolve(self, type_id: int) -> Type:
        """The type behind typedefs, const/volatile/restrict and type tags."""
        t = self.type(type_id)
        for _ in range(_MAX_DEPTH):
            if t.kind not in _TRANSPARENT:
                return t
            t = self.type(t.ref)
        raise BtfError(f"type {type_id}: typedef/modifier chain loops")

    def size(self, type_id: int) -> int:
        """Bytes of a value of the type (libbpf's btf__resolve_size)."""
        return self._size(type_id, 0)

    def _size(self, type_id: int, depth: int) -> int:
        if depth > _MAX_DEPTH:
            raise BtfError(f"type {type_id}: type chain loops")
        t = self.type(type_id)
        if t.kind in _SIZED:
            return t.size
        if t.kind == KIND_PTR:
            return 8
        if t.kind == KIND_ARRAY:
            return t.nelems * self._size(t.ref, depth + 1)
        if t.kind in _TRANSPARENT or t.kind == KIND_VAR:
            return self._size(t.ref, depth + 1)
        raise BtfError(f"type {type_id} ({self.type_name(type_id)}) has no size")

    def members(self, type_id: int) -> tuple[Member, ...]:
        """Members of the struct or union behind ``type_id``."""
        t = self.resolve(type_id)
        if t.kind not in (KIND_STRUCT, KIND_UNION):
            raise BtfError(f"type {type_id} is a {t.kind_name or 'void'}, not a struct or union")
        return t.members

    def type_name(self, type_id: int, depth: int = 0) -> str:
        """C-like spelling for messages: ``struct event``, ``__u64``, ``char[16]``, ``u32 *``."""
        t = self.type(type_id)
        if depth > _MAX_DEPTH:
            return "?"
        if t.kind in (KIND_STRUCT, KIND_UNION, KIND_ENUM, KIND_ENUM64, KIND_FWD):
            tag = {KIND_UNION: "union", KIND_ENUM: "enum", KIND_ENUM64: "enum"}.get(t.kind, "struct")
            return f"{tag} {t.name}" if t.name else f"{tag} (anon)"
        if t.kind == KIND_PTR:
            return self.type_name(t.ref, depth + 1) + " *"
        if t.kind == KIND_ARRAY:
            return f"{self.type_name(t.ref, depth + 1)}[{t.nelems}]"
        if t.name or t.id == 0:
            return t.name or "void"
        return self.type_name(t.ref, depth + 1)

    def with_datasec(self, name: str, size: int, offsets: Mapping[str, int]) -> None:
        """Set a DATASEC's size and its variables' offsets, as libbpf's btf_fixup_datasec does from the
        ELF section size and symbol values (clang may leave them 0 for .bss/.data/.rodata)."""
        sec = self.find(name, KIND_DATASEC)
        if sec is None:
            return
        infos = []
        for vs in sec.secinfos:
            var = self.type(vs.type)
            off = offsets.get(var.name, vs.offset)
            if off < 0 or off + vs.size > size:
                raise BtfError(f"DATASEC {name}: variable {var.name} at {off}+{vs.size} is outside the "
                               f"section's {size} bytes")
            infos.append(VarSecinfo(vs.type, off, vs.size))
        self.types[sec.id] = dataclasses.replace(sec, size=size, secinfos=tuple(infos))


def _is_char(t: Type) -> bool:
    """clang marks ``char`` signed, not BTF_INT_CHAR: go by the name too."""
    return t.kind == KIND_INT and t.size == 1 and (bool(t.int_encoding & INT_CHAR) or t.name == "char")


def signed(value: int, bits: int) -> int:
    """``value``, read unsigned from ``bits`` bits, as two's complement (a signed enum's values, an int's)."""
    return value - (1 << bits) if value >> (bits - 1) else value


def ext_records(btf_data: bytes, ext: bytes, which: int, record: struct.Struct) -> Iterator[tuple[str, tuple]]:
    """(code section, unpacked ``record``) of each record of .BTF.ext's info subsection ``which`` (EXT_*), the
    section names read from the .BTF section ``btf_data``; none where the header predates the subsection.
    BtfError for a subsection outside the section, records smaller than ``record`` or cut short."""
    _, strings = _split(bytes(btf_data))
    names = _Reader(b"", strings)
    if len(ext) < _EXT_HEADER_V1:
        raise BtfError(f"header truncated ({len(ext)} bytes)")
    magic, _, _, hdr_len, *spans = _EXT_HEADER.unpack_from(ext.ljust(_EXT_HEADER.size, b"\0"))
    if magic != MAGIC:
        raise BtfError(f"bad magic 0x{magic:04x}")
    if hdr_len < 8 + 8 * (which + 1):   # 8 bytes, then an (offset, length) per subsection
        return
    what, (off, length) = _EXT_INFOS[which], spans[2 * which:2 * which + 2]
    pos, end = hdr_len + off, hdr_len + off + length
    if end > len(ext) or (length and length < 4):
        raise BtfError(f"{what} outside the {len(ext)}-byte section")
    if not length:
        return
    rec_size, = _U32.unpack_from(ext, pos)
    if rec_size < record.size:   # as libbpf's btf_ext_setup_info
        raise BtfError(f"{what}: record size {rec_size} is less than {record.size}")
    pos += 4
    while pos < end:
        if pos + 8 > end:
            raise BtfError(f"{what} truncated")
        name_off, count = _U32_PAIR.unpack_from(ext, pos)
        section, pos = names.string(name_off), pos + 8
        if pos + count * rec_size > end:
            raise BtfError(f"{what} of {section} truncated")
        for i in range(count):
            yield section, record.unpack_from(ext, pos + i * rec_size)
        pos += count * rec_size


def core_relos(btf_data: bytes, ext: bytes) -> list[CoreRelo]:
    """The CO-RE relocations of a .BTF.ext section (none where its header predates them)."""
    return [CoreRelo(section, insn_off // 8, type_id, kind)
            for section, (insn_off, type_id, _, kind) in ext_records(btf_data, ext, EXT_CORE_RELO, _CORE_RECORD)]


class _Reader:
    """Bounds-checked reads from the type section; every overrun is a BtfError, never an IndexError."""

    def __init__(self, data: bytes, strings: bytes) -> None:
        self.data = data
        self.strings = strings
        self.pos = 0

    def unpack(self, fmt: struct.Struct, what: str) -> tuple:
        if self.pos + fmt.size > len(self.data):
            raise BtfError(f"type section truncated in {what} at byte {self.pos}")
        value = fmt.unpack_from(self.data, self.pos)
        self.pos += fmt.size
        return value

    def string(self, off: int) -> str:
        if off >= len(self.strings):
            raise BtfError(f"string offset {off} outside the {len(self.strings)}-byte string section")
        end = self.strings.find(b"\0", off)
        if end < 0:
            raise BtfError(f"string at {off} is not NUL-terminated")
        return self.strings[off:end].decode("utf-8", "replace")


def _parse(data: bytes) -> list[Type]:
    type_section, strings = _split(data)
    r = _Reader(type_section, strings)
    types = [VOID]
    while r.pos < len(r.data):
        types.append(_parse_type(r, len(types)))
    _check_refs(types)
    return types


def _split(data: bytes) -> tuple[bytes, bytes]:
    """The type and string sections of a .BTF section, its header checked."""
    if len(data) < _HEADER.size:
        raise BtfError(f"BTF header truncated ({len(data)} bytes)")
    magic, version, _flags, hdr_len, type_off, type_len, str_off, str_len = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise BtfError(f"bad BTF magic 0x{magic:04x} (big-endian BTF is not supported)")
    if version != 1:
        raise BtfError(f"unsupported BTF version {version}")
    if hdr_len < _HEADER.size or hdr_len > len(data):
        raise BtfError(f"bad BTF header length {hdr_len}")
    body = data[hdr_len:]
    if type_off % 4 or type_off + type_len > len(body) or str_off + str_len > len(body):
        raise BtfError(f"BTF type or string section outside the {len(body)}-byte body")
    strings = body[str_off:str_off + str_len]
    if strings and strings[0] != 0:
        raise BtfError("BTF string section does not start with an empty string")
    return body[type_off:type_off + type_len], strings


def _parse_type(r: _Reader, tid: int) -> Type:
    name_off, info, size_or_type = r.unpack(_TYPE, f"type {tid}")
    kind, vlen, kflag = (info >> 24) & 0x1F, info & 0xFFFF, bool(info >> 31)
    if kind not in KIND_NAMES:
        raise BtfError(f"type {tid}: unknown BTF kind {kind}")
    t = Type(tid, kind, r.string(name_off), kflag)
    t = dataclasses.replace(t, **({"size": size_or_type} if kind in _SIZED else {"ref": size_or_type}))
    if kind == KIND_INT:
        enc, = r.unpack(_U32, f"int {tid}")
        t = dataclasses.replace(t, int_encoding=(enc >> 24) & 0xF, int_bit_offset=(enc >> 16) & 0xFF,
                                int_bits=enc & 0xFF)
        if t.int_bits > 128 or t.size not in (1, 2, 4, 8, 16):
            raise BtfError(f"type {tid}: bad int of {t.size} bytes, {t.int_bits} bits")
    elif kind == KIND_ARRAY:
        elem, index, nelems = r.unpack(_TRIPLE, f"array {tid}")
        t = dataclasses.replace(t, ref=elem, index_type=index, nelems=nelems)
    elif kind in (KIND_STRUCT, KIND_UNION):
        members = []
        for _ in range(vlen):
            mname, mtype, moff = r.unpack(_TRIPLE, f"member of {tid}")
            # kind_flag: offset holds bitfield_size << 24 | bit_offset (btf.rst 2.2.4).
            bits, bit_off = (moff >> 24, moff & 0xFFFFFF) if kflag else (0, moff)
            members.append(Member(r.string(mname), mtype, bit_off, bits))
        t = dataclasses.replace(t, members=tuple(members))
    elif kind == KIND_ENUM:
        values = []
        for _ in range(vlen):
            vname, val = r.unpack(_U32_PAIR, f"enum {tid}")
            values.append(EnumValue(r.string(vname), signed(val, 32) if kflag else val))
        t = dataclasses.replace(t, enum_values=tuple(values))
    elif kind == KIND_ENUM64:
        values = []
        for _ in range(vlen):
            vname, lo, hi = r.unpack(_TRIPLE, f"enum64 {tid}")
            val = lo | hi << 32
            values.append(EnumValue(r.string(vname), signed(val, 64) if kflag else val))
        t = dataclasses.replace(t, enum_values=tuple(values))
    elif kind == KIND_FUNC:
        t = dataclasses.replace(t, linkage=vlen)
    elif kind == KIND_FUNC_PROTO:
        params = []
        for _ in range(vlen):
            pname, ptype = r.unpack(_U32_PAIR, f"parameter of {tid}")
            params.append(Param(r.string(pname), ptype))
        t = dataclasses.replace(t, params=tuple(params))
    elif kind == KIND_VAR:
        linkage, = r.unpack(_U32, f"var {tid}")
        t = dataclasses.replace(t, linkage=linkage)
    elif kind == KIND_DATASEC:
        infos = tuple(VarSecinfo(*r.unpack(_TRIPLE, f"datasec {tid}")) for _ in range(vlen))
        t = dataclasses.replace(t, secinfos=infos)
    elif kind == KIND_DECL_TAG:
        comp, = r.unpack(_S32, f"decl_tag {tid}")
        t = dataclasses.replace(t, component_idx=comp)
    return t



def _check_refs(types: list[Type]) -> None:
    """Every type id a type mentions must exist, so later lookups cannot fail on malformed input."""
    n = len(types)
    for t in types[1:]:
        refs = [t.ref, t.index_type] + [m.type for m in t.members] + [p.type for p in t.params] + \
               [v.type for v in t.secinfos]
        bad = [ref for ref in refs if not 0 <= ref < n]
        if bad:
            raise BtfError(f"type {t.id} ({t.kind_name} {t.name}) refers to missing type {bad[0]}")
        if t.kind == KIND_DATASEC and any(types[v.type].kind not in (KIND_VAR, KIND_FUNC) for v in t.secinfos):
            raise BtfError(f"DATASEC {t.name} lists a type that is not a variable")
