"""CUDA fatbins: the containers nvcc embeds in host binaries, read from bytes.

Layout (checked against nvcc/fatbinary 13.0 output; public descriptions: n-eiling/cuda-fatbin-decompression,
jiegec/fatbinary), all little endian:

    wrapper  {u32 magic 0x466243B1, u32 version (1, or 2 for -rdc linked code), u64 data -> fatbin,
              u64 extra (version 2: list of prelinked fatbins)}
    fatbin   {u32 magic 0xBA55ED50, u16 version 1, u16 header_size 16, u64 size of the entries}
    entry    {u16 kind (1 PTX, 2 ELF, 8 LTO IR), u16 0x0101, u32 header_size, u64 payload_size (padded),
              u32 compressed_size, u32 options_offset, u16 minor, u16 major, u32 arch,
              u32 name_offset, u32 name_size, u64 flags, u64 0, u64 uncompressed_size} = 64 bytes,
             then (header_size - 64) bytes of extras: at options_offset {u32 offset, u32 size} of the
             ptxas options text (e.g. "--compile-only" in -rdc objects), then the payload.

Flags 0x2000 mark LZ4 block compression, 0x8000 Zstd; compressed_size bytes of the padded payload are
the stream and uncompressed_size the text it decodes to (PTX keeps its trailing NUL). 0x100000 marks
arch-specific code (sm_90a, compute_100a: that one arch only), 0x200000 family-specific code (sm_100f:
the archs of its major version from it on), as nvcc 13.0 writes them; arch is the number alone.
"""

from __future__ import annotations

import enum
import os
import re
import struct
from dataclasses import dataclass

from egpu_preload.errors import FatbinError, elf_refusals

WRAPPER_MAGIC = 0x466243B1
FATBIN_MAGIC = 0xBA55ED50
WRAPPER = struct.Struct("<IIQQ")
HEADER = struct.Struct("<IHHQ")
ENTRY = struct.Struct("<HHIQIIHHIIIQQQ")
OPTIONS = struct.Struct("<II")
ELF_MAGIC = b"\x7fELF"
EM_CUDA = struct.pack("<H", 190)   # e_machine of a cubin
AR_MAGIC = b"!<arch>\n"   # a static library (ar(5))
AR_HEADER = 60

FLAG_64BIT = 0x1
FLAG_DEBUG = 0x2
FLAG_LZ4 = 0x2000
FLAG_ZSTD = 0x8000
FLAG_ARCH_SPECIFIC = 0x100000
FLAG_FAMILY = 0x200000

# Sections nvcc puts fatbins in: .nv_fatbin for loadable code, __nv_relfatbin for -rdc objects that
# nvlink (or the driver's linker) still has to link.
FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")
# LZ4 expands at most ~255x; a larger claim is a corrupt header, refused before allocating for it.
LZ4_MAX_RATIO = 256


class Kind(enum.IntEnum):
    """An entry's contents: PTX text, an ELF cubin, or NVVM IR for link-time optimization (nvcc's
    code=lto_XX). Other kinds are kept unread (as KIND_0xNN): a fatbin with one still has its PTX."""
    PTX = 1
    ELF = 2
    LTO = 8

    @classmethod
    def _missing_(cls, value: object) -> "Kind | None":
        if not isinstance(value, int):
            return None
        other = int.__new__(cls, value)
        other._name_, other._value_ = f"KIND_{value:#x}", value
        return other


class ImageKind(enum.Enum):
    """What a module-load call was handed (cuModuleLoadData & co. take any of these)."""
    WRAPPER = "wrapper"
    FATBIN = "fatbin"
    ELF = "elf"
    PTX = "ptx"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Entry:
    kind: Kind
    arch: int                # sm number: 90 for sm_90 / compute_90
    version: tuple[int, int]  # (major, minor): the PTX ISA version for PTX entries
    flags: int
    payload: bytes           # as stored: compressed when compression != "none"
    uncompressed_size: int
    options: str             # ptxas options recorded with the entry ("" if none)
    offset: int              # of the entry header within the fatbin

    @property
    def compression(self) -> str:
        if self.flags & FLAG_ZSTD:
            return "zstd"
        if self.flags & FLAG_LZ4:
            return "lz4"
        return "none"

    @property
    def suffix(self) -> str:
        """"a" for arch-specific code, "f" for family-specific code, "" for code later archs run."""
        return "a" if self.flags & FLAG_ARCH_SPECIFIC else "f" if self.flags & FLAG_FAMILY else ""

    def runs_on(self, sm: int) -> bool:
        """Whether a device of compute capability ``sm`` runs (SASS) or JITs (PTX) this entry."""
        if self.suffix == "a":
            return sm == self.arch
        if self.suffix == "f":
            return sm // 10 == self.arch // 10 and sm >= self.arch
        return sm >= self.arch

    @property
    def size(self) -> int:
        """Size of the contents once decompressed."""
        return self.uncompressed_size if self.compression != "none" else len(self.payload)

    def data(self) -> bytes:
        """The contents, decompressed."""
        try:
            if self.compression == "zstd":
                import io
                import zstandard
                # Read in chunks so a corrupt size (header or frame) never decides an allocation.
                reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(self.payload))
                chunks, total = [], 0
                while total <= self.uncompressed_size:
                    chunk = reader.read(1 << 20)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    total += len(chunk)
                out = b"".join(chunks)
            elif self.compression == "lz4":
                import lz4.block
                out = lz4.block.decompress(self.payload, uncompressed_size=self.uncompressed_size)
            else:
                return self.payload
        except Exception as e:  # the codecs raise their own error types (zstd.ZstdError, lz4's LZ4BlockError)
            raise FatbinError(f"entry at {self.offset}: {self.compression} payload does not decode ({e})")
        if len(out) != self.uncompressed_size:
            raise FatbinError(f"entry at {self.offset}: decoded {len(out)} bytes, header says "
                              f"{self.uncompressed_size}")
        return out

    def ptx(self) -> str:
        """PTX text without the padding NULs."""
        if self.kind != Kind.PTX:
            raise FatbinError(f"entry at {self.offset} is {self.kind.name}, not PTX")
        try:
            return self.data().rstrip(b"\0").decode()
        except UnicodeDecodeError as e:
            raise FatbinError(f"entry at {self.offset}: PTX is not text ({e})")


@dataclass(frozen=True)
class Fatbin:
    offset: int      # where it starts in the bytes it was read from
    size: int        # header + entries
    entries: tuple[Entry, ...]
    section: str = ""  # ELF section it came from, "" if none


def _need(data: bytes, offset: int, size: int, what: str) -> None:
    if offset < 0 or offset + size > len(data):
        raise FatbinError(f"{what} at {offset} runs past the end ({len(data)} bytes)")


def fatbin_extent(head: bytes) -> int:
    """Total size of the fatbin whose first 16 bytes are `head` (for reading one out of memory)."""
    _need(head, 0, HEADER.size, "fatbin header")
    magic, _, header_size, size = HEADER.unpack_from(head)
    if magic != FATBIN_MAGIC:
        raise FatbinError(f"bad fatbin magic {magic:#x}")
    return header_size + size


def parse_fatbin(data: bytes, offset: int = 0, section: str = "") -> Fatbin:
    """Read the fatbin that starts at `offset`."""
    _need(data, offset, HEADER.size, "fatbin header")
    magic, version, header_size, size = HEADER.unpack_from(data, offset)
    if magic != FATBIN_MAGIC:
        raise FatbinError(f"bad fatbin magic {magic:#x} at {offset}")
    if version != 1 or header_size != HEADER.size:
        raise FatbinError(f"fatbin at {offset}: unknown version {version} / header size {header_size}")
    end = offset + header_size + size
    _need(data, offset, header_size + size, "fatbin")
    entries = []
    pos = offset + header_size
    while pos < end:
        entry, pos = _parse_entry(data, pos, end)
        entries.append(entry)
    return Fatbin(offset, header_size + size, tuple(entries), section)


def _parse_entry(data: bytes, pos: int, end: int) -> tuple[Entry, int]:
    """The entry at `pos` and where the next one starts."""
    if pos + ENTRY.size > end:
        raise FatbinError(f"entry header at {pos} runs past the fatbin's end {end}")
    (kind, _, header_size, payload_size, compressed_size, options_offset, minor, major, arch,
     _, _, flags, _, uncompressed_size) = ENTRY.unpack_from(data, pos)
    if header_size < ENTRY.size or pos + header_size + payload_size > end:
        raise FatbinError(f"entry at {pos}: header {header_size} + payload {payload_size} bytes "
                          f"overrun the fatbin's end {end}")
    payload = data[pos + header_size:pos + header_size + payload_size]
    if flags & (FLAG_LZ4 | FLAG_ZSTD):
        if compressed_size > payload_size:
            raise FatbinError(f"entry at {pos}: compressed size {compressed_size} exceeds its payload "
                              f"of {payload_size}")
        if flags & FLAG_LZ4 and uncompressed_size > LZ4_MAX_RATIO * compressed_size + 64:
            raise FatbinError(f"entry at {pos}: {compressed_size} LZ4 bytes cannot decode to "
                              f"{uncompressed_size}")
        payload = payload[:compressed_size]
    options = ""
    if options_offset:
        if options_offset + OPTIONS.size > header_size:
            raise FatbinError(f"entry at {pos}: options offset {options_offset} outside its header")
        text_offset, text_size = OPTIONS.unpack_from(data, pos + options_offset)
        if text_size:
            if text_offset + text_size > header_size:
                raise FatbinError(f"entry at {pos}: ptxas options outside its header")
            raw = data[pos + text_offset:pos + text_offset + text_size].rstrip(b"\0")
            # nvcc 13.0's sm_100+ cubins keep binary data there (flag 0x1000000), not ptxas options.
            if all(32 <= b < 127 for b in raw):
                options = raw.decode("ascii").strip()
    entry = Entry(Kind(kind), arch, (major, minor), flags, payload, uncompressed_size, options, pos)
    return entry, pos + header_size + payload_size


def parse_wrapper(data: bytes, offset: int = 0) -> tuple[int, int, int]:
    """(version, address of the fatbin, extra address) of the wrapper at `offset`."""
    _need(data, offset, WRAPPER.size, "fatbin wrapper")
    magic, version, fatbin, extra = WRAPPER.unpack_from(data, offset)
    if magic != WRAPPER_MAGIC:
        raise FatbinError(f"bad fatbin wrapper magic {magic:#x} at {offset}")
    if version not in (1, 2):
        raise FatbinError(f"fatbin wrapper at {offset}: unknown version {version}")
    return version, fatbin, extra


def image_kind(head: bytes) -> ImageKind:
    """Classify a module image from its first bytes."""
    if len(head) >= 4:
        magic = struct.unpack_from("<I", head)[0]
        if magic == WRAPPER_MAGIC:
            return ImageKind.WRAPPER
        if magic == FATBIN_MAGIC:
            return ImageKind.FATBIN
        if head[:4] == ELF_MAGIC:
            return ImageKind.ELF
    text = head.lstrip(b" \t\r\n")
    if text.startswith((b"//", b".version", b".target", b"/*")):
        return ImageKind.PTX
    return ImageKind.UNKNOWN


def is_cubin(data: bytes) -> bool:
    """An ELF file of device code (e_machine EM_CUDA), not a host binary that embeds it."""
    return data[:4] == ELF_MAGIC and data[18:20] == EM_CUDA


def _scan(data: bytes, start: int, end: int, section: str) -> list[Fatbin]:
    """Every fatbin in data[start:end]; fatbins are 8-byte aligned and separated by padding."""
    found = []
    needle = struct.pack("<I", FATBIN_MAGIC)
    pos = data.find(needle, start, end)
    while pos >= 0:
        fatbin = None
        if pos % 8 == start % 8:
            try:
                fatbin = parse_fatbin(data, pos, section)
            except FatbinError:
                if section:  # inside a fatbin section every magic must be real
                    raise
        if fatbin is not None:
            found.append(fatbin)
            pos = data.find(needle, pos + fatbin.size, end)
        else:
            pos = data.find(needle, pos + 4, end)
    return found


def find_fatbins(binary: bytes) -> list[Fatbin]:
    """All fatbins in a host executable, shared library or object, or in a bare fatbin file.

    ELF files are read section by section (.nv_fatbin, __nv_relfatbin); anything else (and ELF files
    without those sections, e.g. stripped of section headers) is scanned for the fatbin magic.
    """
    if binary[:4] == ELF_MAGIC:
        sections = _elf_fatbin_sections(binary)
        if sections:
            return [f for name, start, end in sections for f in _scan(binary, start, end, name)]
    return _scan(binary, 0, len(binary), "")


def find_in_file(data: bytes) -> list[tuple[str, list[Fatbin]]]:
    """The fatbins of a file ``egpu inspect`` is given, by static-archive member (``[("", fatbins)]`` for
    anything but an archive; members without device code are left out). FatbinError when the bytes are
    none of an ELF file, a static archive (.a) or a bare fatbin."""
    if data.startswith(AR_MAGIC):
        found = []
        for name, member in archive_members(data):
            try:
                found += [(name, find_fatbins(member))] if member[:4] == ELF_MAGIC else []
            except FatbinError as e:   # its offsets count from the member's start: say which one
                raise FatbinError(f"member {name}: {e.reason}") from None
        return [(name, fatbins) for name, fatbins in found if fatbins]
    if image_kind(data[:4]) == ImageKind.FATBIN:
        parse_fatbin(data)   # a bare fatbin that does not read says why, not that there is none
    elif is_cubin(data):
        raise FatbinError("a cubin (device code itself, not a host binary that embeds it): it holds no fatbin")
    if data[:4] == ELF_MAGIC or image_kind(data[:4]) == ImageKind.FATBIN:
        return [("", find_fatbins(data))]
    if re.search(rb"^\s*\.version\s", data, re.M):   # the directive egpu rewrite looks for
        raise FatbinError("PTX text, not a binary: it holds no fatbin (egpu rewrite instruments its kernels)")
    what = "an empty file" if not data else "a thin archive (its members live elsewhere)" \
        if data.startswith(b"!<thin>\n") else f"{len(data)} bytes of something else"
    raise FatbinError(f"not an ELF file, static archive or fatbin: {what}")


def archive_members(data: bytes) -> list[tuple[str, bytes]]:
    """(name, bytes) of each member of a System V/GNU ``ar`` archive (BSD ``#1/N`` names too), the
    symbol and long-name tables left out. Each member is a 60-byte header {name[16], mtime[12], uid[6],
    gid[6], mode[8], size[10], "`\\n"} and its data, padded to an even offset."""
    members, long_names, pos = [], b"", len(AR_MAGIC)
    while pos < len(data):
        header = data[pos:pos + AR_HEADER]
        if len(header) < AR_HEADER or header[58:60] != b"`\n":
            raise FatbinError(f"archive member header at {pos} is malformed")
        name, size_text = header[:16].decode("latin-1").rstrip(), header[48:58].strip()
        if not size_text.isdigit():
            raise FatbinError(f"archive member at {pos}: bad size {size_text!r}")
        start, size = pos + AR_HEADER, int(size_text)
        _need(data, start, size, "archive member")
        body = data[start:start + size]
        pos = start + size + (size & 1)
        if name.startswith("#1/") and name[3:].isdigit():     # BSD: the name opens the data
            n = int(name[3:])
            name, body = body[:n].rstrip(b"\0").decode("latin-1"), body[n:]
        elif name == "//":                                     # GNU long-name table
            long_names = body
            continue
        elif name in ("/", "/SYM64/", "__.SYMDEF", "__.SYMDEF SORTED"):  # symbol tables
            continue
        elif name.startswith("/") and name[1:].isdigit():     # GNU: offset into the long-name table
            off = int(name[1:])
            end = long_names.find(b"/\n", off)
            name = long_names[off:end if end >= 0 else len(long_names)].decode("latin-1")
        members.append((name.removesuffix("/"), body))
    return members


def _elf_fatbin_sections(binary: bytes) -> list[tuple[str, int, int]]:
    import io

    from elftools.elf.elffile import ELFFile
    try:
        elf = ELFFile(io.BytesIO(binary))
        out = []
        for sec in elf.iter_sections():
            if sec.name in FATBIN_SECTIONS and sec["sh_type"] != "SHT_NOBITS":
                start = sec["sh_offset"]
                out.append((sec.name, start, min(start + sec["sh_size"], len(binary))))
        return out
    except elf_refusals() as e:
        raise FatbinError(f"not a readable ELF file ({e})") from None


def best_ptx(fatbins: list[Fatbin], sm: int) -> Entry | None:
    """The PTX a device of compute capability `sm` (e.g. 90) should JIT: highest arch <= sm, of those it
    can run (compute_90a PTX only on sm_90: the driver refuses it elsewhere).

    Ties (the same arch in several fatbins) keep the first. None if no PTX fits.
    """
    best = None
    for fatbin in fatbins:
        for e in fatbin.entries:
            if e.kind == Kind.PTX and e.runs_on(sm) and (best is None or e.arch > best.arch):
                best = e
    return best


def entry_name(entry: Entry) -> str:
    """cuobjdump's name for the target: sm_XX for SASS, compute_XX for PTX (sm_90a, compute_100f), lto_XX
    for NVVM IR as nvcc's -gencode names it."""
    prefix = {Kind.PTX: "compute", Kind.ELF: "sm", Kind.LTO: "lto"}.get(entry.kind, entry.kind.name.lower())
    return f"{prefix}_{entry.arch}{entry.suffix}"


def listing(fatbins: list[Fatbin]) -> list[str]:
    """One line per fatbin and per entry, like cuobjdump -lelf -lptx with sizes and compression."""
    lines = [] if fatbins else ["no fatbins"]
    for i, fatbin in enumerate(fatbins, 1):
        where = f"{fatbin.section} " if fatbin.section else ""
        lines.append(f"fatbin #{i}: {where}offset {fatbin.offset:#x}, {fatbin.size} bytes, "
                     f"{len(fatbin.entries)} entries")
        for e in fatbin.entries:
            opts = f"  [{e.options}]" if e.options else ""
            lines.append(f"  {e.kind.name:<3}  {entry_name(e):<12} {e.size:>10} bytes  "
                         f"{e.compression:<4}  stored {len(e.payload)}{opts}")
    return lines


def write_ptx(fatbins: list[Fatbin], directory: os.PathLike[str] | str, stem: str) -> list[str]:
    """Write every PTX entry as DIR/STEM.N.compute_XX.ptx (N numbers the fatbin); returns the paths."""
    from pathlib import Path
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, fatbin in enumerate(fatbins, 1):
        for e in fatbin.entries:
            if e.kind == Kind.PTX:
                path = out / f"{stem}.{i}.{entry_name(e)}.ptx"
                path.write_text(e.ptx())
                paths.append(str(path))
    return paths


def elf_extent(header: bytes) -> int:
    """Size of an ELF64 image from its 64-byte header: through the end of its last header table
    (nvcc's cubins put the section headers last)."""
    _need(header, 0, 64, "ELF header")
    if header[:4] != ELF_MAGIC or header[4] != 2:
        raise FatbinError("not an ELF64 image")
    phoff, shoff = struct.unpack_from("<QQ", header, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", header, 0x36)
    return max(64, phoff + phentsize * phnum, shoff + shentsize * shnum)
