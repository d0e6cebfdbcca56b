"""BTF from bytes: every kind, sizes, members, DATASEC fix-ups, formatting, and malformed input."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egpu_preload.bpf import btf as B
from egpu_preload.bpf.elf import load_object
from egpu_preload.errors import BtfError
from egpu_preload.output import text, values


class Builder:
    """Writes BTF the way clang lays it out (btf.rst), one type at a time; ids count from 1."""

    def __init__(self) -> None:
        self.strings = bytearray(b"\0")
        self.types = bytearray()
        self.count = 0

    def s(self, name: str) -> int:
        if not name:
            return 0
        off = len(self.strings)
        self.strings += name.encode() + b"\0"
        return off

    def add(self, kind: int, name: str = "", vlen: int = 0, size_or_type: int = 0, extra: bytes = b"",
            kflag: bool = False) -> int:
        info = kind << 24 | vlen | (kflag << 31)
        self.types += struct.pack("<III", self.s(name), info, size_or_type) + extra
        self.count += 1
        return self.count

    def int_(self, name: str, size: int, bits: int | None = None, enc: int = 0) -> int:
        return self.add(B.KIND_INT, name, 0, size, struct.pack("<I", enc << 24 | (bits or size * 8)))

    def members(self, *ms: tuple[str, int, int]) -> bytes:
        return b"".join(struct.pack("<III", self.s(n), t, off) for n, t, off in ms)

    def bytes(self, magic: int = B.MAGIC, version: int = 1) -> bytes:
        hdr = struct.pack("<HBBIIIII", magic, version, 0, 24, 0, len(self.types), len(self.types),
                          len(self.strings))
        return hdr + bytes(self.types) + bytes(self.strings)


def every_kind() -> tuple[B.Btf, dict[str, int]]:
    b = Builder()
    ids: dict[str, int] = {}
    ids["u32"] = b.int_("unsigned int", 4)
    ids["s8"] = b.int_("signed char", 1, enc=B.INT_SIGNED)
    ids["char"] = b.int_("char", 1, enc=B.INT_SIGNED)
    ids["bool"] = b.int_("_Bool", 1, enc=B.INT_BOOL)
    ids["u64"] = b.int_("unsigned long long", 8)
    ids["ptr"] = b.add(B.KIND_PTR, "", 0, ids["u32"])
    ids["comm"] = b.add(B.KIND_ARRAY, "", 0, 0, struct.pack("<III", ids["char"], ids["u32"], 8))
    ids["arr"] = b.add(B.KIND_ARRAY, "", 0, 0, struct.pack("<III", ids["u32"], ids["u32"], 3))
    ids["enum"] = b.add(B.KIND_ENUM, "color", 2, 4, struct.pack("<II", b.s("RED"), 0) +
                        struct.pack("<Ii", b.s("BLUE"), -1), kflag=True)
    ids["enum64"] = b.add(B.KIND_ENUM64, "big", 1, 8, struct.pack("<III", b.s("HUGE"), 0, 1))
    ids["fwd"] = b.add(B.KIND_FWD, "opaque")
    ids["typedef"] = b.add(B.KIND_TYPEDEF, "u32_t", 0, ids["u32"])
    ids["volatile"] = b.add(B.KIND_VOLATILE, "", 0, ids["typedef"])
    ids["const"] = b.add(B.KIND_CONST, "", 0, ids["volatile"])
    ids["restrict"] = b.add(B.KIND_RESTRICT, "", 0, ids["ptr"])
    ids["type_tag"] = b.add(B.KIND_TYPE_TAG, "user", 0, ids["u32"])
    ids["float"] = b.add(B.KIND_FLOAT, "double", 0, 8)
    ids["union"] = b.add(B.KIND_UNION, "u", 2, 8, b.members(("a", ids["u32"], 0), ("b", ids["u64"], 0)))
    # struct ev { u32 pid; char comm[8]; u32 lo:4, hi:12; color c; double d; u32 arr[3]; const u32 k; }
    ids["struct"] = b.add(B.KIND_STRUCT, "ev", 8, 48, b.members(
        ("pid", ids["u32"], 0), ("comm", ids["comm"], 32), ("lo", ids["u32"], 4 << 24 | 96),
        ("hi", ids["u32"], 12 << 24 | 100), ("c", ids["enum"], 128), ("d", ids["float"], 192),
        ("arr", ids["arr"], 256), ("k", ids["const"], 352)), kflag=True)
    ids["proto"] = b.add(B.KIND_FUNC_PROTO, "", 1, ids["u32"], struct.pack("<II", b.s("ctx"), ids["ptr"]))
    ids["func"] = b.add(B.KIND_FUNC, "prog", 1, ids["proto"])
    ids["var_a"] = b.add(B.KIND_VAR, "a", 0, ids["u32"], struct.pack("<I", 1))
    ids["var_b"] = b.add(B.KIND_VAR, "b", 0, ids["u64"], struct.pack("<I", 1))
    ids["datasec"] = b.add(B.KIND_DATASEC, ".bss", 2, 0, struct.pack("<III", ids["var_a"], 0, 4) +
                           struct.pack("<III", ids["var_b"], 0, 8))
    ids["decl_tag"] = b.add(B.KIND_DECL_TAG, "tag", 0, ids["struct"], struct.pack("<i", 2))
    return B.Btf.parse(b.bytes()), ids


def test_every_kind_parses():
    btf, ids = every_kind()
    assert len(btf) == max(ids.values()) + 1
    assert {btf.type(i).kind_name for i in ids.values()} == set(B.KIND_NAMES.values())
    assert btf.type(ids["enum"]).enum_values == (B.EnumValue("RED", 0), B.EnumValue("BLUE", -1))
    assert btf.type(ids["enum64"]).enum_values == (B.EnumValue("HUGE", 1 << 32),)
    assert btf.type(ids["proto"]).params == (B.Param("ctx", ids["ptr"]),)
    assert btf.type(ids["func"]).linkage == 1 and btf.type(ids["decl_tag"]).component_idx == 2
    assert btf.find("ev", B.KIND_STRUCT).id == ids["struct"] and btf.find("ev", B.KIND_UNION) is None


SIZES = [("u32", 4), ("ptr", 8), ("comm", 8), ("arr", 12), ("enum", 4), ("enum64", 8), ("typedef", 4),
         ("const", 4), ("restrict", 8), ("type_tag", 4), ("float", 8), ("union", 8), ("struct", 48),
         ("var_b", 8)]


@pytest.mark.parametrize("name,size", SIZES, ids=[s[0] for s in SIZES])
def test_sizes(name, size):
    btf, ids = every_kind()
    assert btf.size(ids[name]) == size


@pytest.mark.parametrize("name", ["fwd", "func", "proto", "datasec_unsized"])
def test_no_size(name):
    btf, ids = every_kind()
    if name == "datasec_unsized":  # a DATASEC has a size (0 until fixed up), so it does not raise
        assert btf.size(ids["datasec"]) == 0
        return
    with pytest.raises(BtfError, match="has no size"):
        btf.size(ids[name])


def test_members_and_resolve():
    btf, ids = every_kind()
    ms = btf.members(ids["struct"])
    assert [(m.name, m.offset, m.bitfield_size) for m in ms] == [
        ("pid", 0, 0), ("comm", 4, 0), ("lo", 12, 4), ("hi", 12, 12), ("c", 16, 0), ("d", 24, 0),
        ("arr", 32, 0), ("k", 44, 0)]
    assert btf.resolve(ids["const"]).id == ids["u32"]
    assert btf.type_name(ids["comm"]) == "char[8]" and btf.type_name(ids["struct"]) == "struct ev"
    assert btf.type_name(ids["restrict"]) == "unsigned int *" and btf.type_name(ids["const"]) == "u32_t"
    with pytest.raises(BtfError, match="not a struct or union"):
        btf.members(ids["u32"])


def _shown(btf, type_id: int, data: bytes) -> str:
    """A value as egpu-run prints it, read by its BTF type."""
    return text.value(values._Reader(btf, {}).data(type_id, data), {})


def test_format_struct():
    btf, ids = every_kind()
    data = (struct.pack("<I", 3) + b"x\0\0\0\0\0\0\0" + struct.pack("<I", 0x5 | 0x123 << 4)
            + struct.pack("<i", -1) + bytes(4) + struct.pack("<d", 1.5) + struct.pack("<3I", 1, 2, 3)
            + struct.pack("<I", 7))
    assert _shown(btf, ids["struct"], data) == \
        '{ pid: 3, comm: "x", lo: 5, hi: 291, c: BLUE, d: 1.5, arr: [1, 2, 3], k: 7 }'


FORMATS = [
    ("s8", b"\xff", "-1"), ("bool", b"\x01", "true"), ("u64", struct.pack("<Q", 2**64 - 1), str(2**64 - 1)),
    ("ptr", struct.pack("<Q", 0x1000), "0x1000"), ("enum", struct.pack("<i", 5), "5"),
    ("enum64", struct.pack("<Q", 1 << 32), "HUGE"), ("union", struct.pack("<Q", 1 << 32), "{ a: 0, b: 4294967296 }"),
    ("datasec", bytes(16), "{ a: 0, b: 0 }"), ("comm", b"abcdefgh", '"abcdefgh"'),
]


@pytest.mark.parametrize("name,data,text", FORMATS, ids=[f[0] for f in FORMATS])
def test_format(name, data, text):
    btf, ids = every_kind()
    if name == "datasec":
        btf.with_datasec(".bss", 16, {"a": 0, "b": 8})
    assert _shown(btf, ids[name], data) == text


def test_datasec_fixup():
    btf, ids = every_kind()
    btf.with_datasec(".bss", 16, {"a": 0, "b": 8})
    sec = btf.type(ids["datasec"])
    assert sec.size == 16 and [(v.offset, v.size) for v in sec.secinfos] == [(0, 4), (8, 8)]
    btf.with_datasec(".nothere", 4, {})  # sections without a DATASEC are left alone
    with pytest.raises(BtfError, match="outside the section"):
        btf.with_datasec(".bss", 8, {"a": 0, "b": 8})


def test_real_object(probe_obj):
    """clang's BTF for launch.bpf.c: the map value's struct, and a value printed with field names."""
    obj = load_object(probe_obj("launch"))
    value = obj.btf.members(obj.maps[0].value_type_id)
    assert [(m.name, m.offset) for m in value] == [("launches", 0), ("threads", 8), ("last_stream", 16),
                                                    ("last_grid", 24), ("last_block", 36)]
    data = struct.pack("<QQQ3I3I", 2, 512, 0x7F00, 4, 1, 1, 128, 1, 1)
    assert _shown(obj.btf, obj.maps[0].value_type_id, data) == \
        "{ launches: 2, threads: 512, last_stream: 32512, last_grid: [4, 1, 1], last_block: [128, 1, 1] }"


def _replace(data: bytes, off: int, fmt: str, *values) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, off, *values)
    return bytes(out)


def _bad_ref() -> bytes:
    b = Builder()
    b.add(B.KIND_PTR, "", 0, 7)
    return b.bytes()


def _loop() -> bytes:
    b = Builder()
    b.add(B.KIND_TYPEDEF, "a", 0, 2)
    b.add(B.KIND_TYPEDEF, "b", 0, 1)
    return b.bytes()


def _good() -> bytes:
    b = Builder()
    b.int_("int", 4)
    return b.bytes()


BAD = [
    ("short header", _good()[:10], "header truncated"),
    ("magic", _replace(_good(), 0, "<H", 0x9FEB), "bad BTF magic"),
    ("version", _replace(_good(), 2, "<B", 2), "unsupported BTF version 2"),
    ("hdr_len", _replace(_good(), 4, "<I", 1000), "bad BTF header length"),
    ("type_len", _replace(_good(), 12, "<I", 1000), "outside the"),
    ("truncated type", _replace(_good(), 12, "<I", 14), "truncated in int 1"),
    ("kind", _replace(_good(), 24 + 4, "<I", 31 << 24), "unknown BTF kind 31"),
    ("name", _replace(_good(), 24, "<I", 99), "string offset 99"),
    ("ref", _bad_ref(), "refers to missing type 7"),
    ("strings", _replace(_good(), 24 + 16, "<B", 65), "does not start with an empty string"),
]


@pytest.mark.parametrize("case,data,reason", BAD, ids=[b[0] for b in BAD])
def test_malformed(case, data, reason):
    with pytest.raises(BtfError, match=reason):
        B.Btf.parse(data)


def test_loop_is_an_error_not_a_hang():
    btf = B.Btf.parse(_loop())
    with pytest.raises(BtfError, match="loops"):
        btf.size(1)
    with pytest.raises(BtfError, match="loops"):
        btf.resolve(1)
    assert btf.type_name(1) == "a"


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_fuzz_only_btf_errors(probe_obj, data):
    """Flipped bytes and truncation of clang's BTF: a BtfError or a usable Btf, nothing else."""
    raw = bytearray(_btf_section(probe_obj("launch")))
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    raw = raw[:data.draw(st.integers(0, len(raw)))]
    try:
        btf = B.Btf.parse(bytes(raw))
    except BtfError:
        return
    for t in btf.types[1:]:
        for call in (btf.size, btf.type_name, lambda i: _shown(btf, i, bytes(256))):
            try:
                call(t.id)
            except BtfError:
                pass


def _btf_section(path) -> bytes:
    from elftools.elf.elffile import ELFFile
    with open(path, "rb") as f:
        return ELFFile(f).get_section_by_name(".BTF").data()


def test_a_map_whose_type_is_void_is_a_btf_error():
    """Found by test_elf's fuzzer: a corrupt .maps variable pointing at type 0 (void) must be refused
    as bad BTF, not crash on the kind's name."""
    with pytest.raises(BtfError, match="type 0 is a void, not a struct or union"):
        B.Btf([B.VOID]).members(0)
