""".BTF.ext line info: which source line an instruction came from, as bpftool and the kernel's verifier
log print it (``; return *v; @ probe.bpf.c:8``), so a refusal points at the user's source.

Layout (linux/btf.h, libbpf btf_ext__new), little endian:

    .BTF.ext   {u16 magic 0xeB9F, u8 version, u8 flags, u32 hdr_len, u32 func_info_off, u32 func_info_len,
                u32 line_info_off, u32 line_info_len, ...}; offsets count from the end of the header
    line info  u32 record size, then per section {u32 section name (a .BTF string), u32 count} and count
               records {u32 insn_off (bytes into the section), u32 file name, u32 line text, u32 line << 10 | col}

Strings are offsets into the .BTF string section. Only for messages: an object without line info, or
with line info this module cannot read, gives no lines and no error.
"""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import EgpuError
from .btf import EXT_LINE_INFO, ext_records

_BTF_HEADER = struct.Struct("<HBBIIIII")       # magic, version, flags, hdr_len, type_off, type_len, str_off, str_len
_RECORD = struct.Struct("<IIII")


@dataclass(frozen=True)
class SourceLine:
    file: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


class LineTable:
    """Line records by section, and each section's program start (in instructions), read from an object."""

    def __init__(self, records: dict[str, list[tuple[int, SourceLine]]],
                 funcs: dict[str, list[tuple[int, int]]],
                 layouts: dict[str, tuple[tuple[str, int, int], ...]] | None = None,
                 programs: dict[tuple[str, str], tuple[tuple[str, int, int], ...]] | None = None) -> None:
        self.records = records   # section -> [(insn index in the section, line)], sorted
        self.funcs = funcs       # section -> (start, length) of each function symbol in it, in instructions
        self.layouts = layouts or {}   # section of one program -> its Program.layout (subprograms appended)
        self.programs = programs or {}   # (section, program) -> its layout, for sections of several

    @classmethod
    def from_object(cls, data: bytes, path: str = "") -> "LineTable":
        """The table of an eBPF ELF object; empty when it has no readable line info."""
        try:
            records, funcs = _read(data)
        except Exception:  # noqa: BLE001 -- a message helper: malformed input means "no line info"
            return cls({}, {})
        try:
            from .elf import load_bytes
            programs = load_bytes(data, path).programs
        except EgpuError:   # an object the loader refuses: no subprogram can be placed
            programs = []
        sections = [p.section for p in programs]
        return cls(records, funcs, {p.section: p.layout for p in programs if sections.count(p.section) == 1},
                   {(p.section, p.name): p.layout for p in programs if sections.count(p.section) > 1})

    def shared(self, section: str) -> bool:
        """Whether ``section`` holds several programs, so that it alone does not say which was refused."""
        return any(s == section for s, _ in self.programs)

    def lookup(self, section: str, insn: int, program: str | None = None) -> SourceLine | None:
        """The line of instruction ``insn`` of the program in ``section`` (counted as the verifier counts,
        from the program's start; past it, in the subprograms elf.py appended), or of ``program`` there
        where the section holds several. None when unknown: no line info, or a section holding several
        programs and no program named."""
        base = 0
        for piece, start, count in self.layouts.get(section) or self.programs.get((section, program), ()):
            if 0 <= insn - base < count:
                return self._line(piece, start + insn - base)
            base += count
        funcs = self.funcs.get(section, [])
        if section in self.layouts or len(funcs) != 1 or not 0 <= insn < funcs[0][1]:
            return None
        return self._line(section, funcs[0][0] + insn)

    def _line(self, section: str, at: int) -> SourceLine | None:
        """The line of instruction ``at`` of ELF section ``section``."""
        best = None
        for off, line in self.records.get(section, ()):
            if off > at:
                break
            best = line
        return best

    def annotate(self, section: str, log: str, program: str | None = None) -> str:
        """A verifier log (lines ``N: insn``) with ``; source @ file:line`` before each instruction whose
        line differs from the one before, as the kernel's log does."""
        out, last = [], None
        for text in log.splitlines():
            head = text.split(":", 1)[0]
            line = self.lookup(section, int(head), program) if head.isdigit() else None
            if line is not None and line != last:
                out.append(f"; {line.text.strip()} @ {line}")
                last = line
            out.append(text)
        return "\n".join(out)


def _read(data: bytes) -> tuple[dict[str, list[tuple[int, SourceLine]]], dict[str, list[tuple[int, int]]]]:
    from elftools.elf.elffile import ELFFile
    elf = ELFFile(io.BytesIO(data))
    btf, ext = elf.get_section_by_name(".BTF"), elf.get_section_by_name(".BTF.ext")
    if btf is None or ext is None:
        return {}, {}
    strings = _strings(btf.data())
    records: dict[str, list[tuple[int, SourceLine]]] = {}
    for section, (insn_off, file_off, text_off, line_col) in ext_records(btf.data(), ext.data(), EXT_LINE_INFO,
                                                                         _RECORD):
        records.setdefault(section, []).append((insn_off // 8, SourceLine(strings(file_off), line_col >> 10,
                                                                          strings(text_off))))
    for rows in records.values():
        rows.sort(key=lambda r: r[0])
    funcs: dict[str, list[tuple[int, int]]] = {}
    symtab = elf.get_section_by_name(".symtab")
    for sym in symtab.iter_symbols() if symtab is not None else ():
        if sym["st_info"]["type"] == "STT_FUNC" and isinstance(sym["st_shndx"], int):
            funcs.setdefault(elf.get_section(sym["st_shndx"]).name, []).append(
                (sym["st_value"] // 8, sym["st_size"] // 8))
    return records, funcs


def _strings(btf: bytes) -> Callable[[int], str]:
    """Offset -> string over the .BTF string section."""
    _, _, _, hdr_len, _, _, str_off, str_len = _BTF_HEADER.unpack_from(btf)
    table = btf[hdr_len + str_off:hdr_len + str_off + str_len]

    def at(off: int) -> str:
        end = table.find(b"\0", off)
        return table[off:end if end >= 0 else len(table)].decode("utf-8", "replace")
    return at


def located(e: EgpuError, data: bytes, named: str) -> EgpuError:
    """``e`` from loading the object ``data`` that the user knows as ``named`` (not a compiled copy of it):
    named by the source line when ``named`` is the source and the object's line info has the line
    (``x.bpf.c:8``), else by ``named``, an object's refusal then ending with the line it has (``(source:
    x.bpf.c:8)``: the log below starts at the program's first line, which reads as the refusal's); its
    verifier log gains the source lines either way."""
    table = LineTable.from_object(data, named) if e.section and data else LineTable({}, {})
    line = table.lookup(e.section, e.insn, e.program) if e.section and e.insn is not None else None
    if line is not None and named.endswith(".c"):   # as the user named the source, a header's line by its own path
        same = os.path.realpath(line.file) == os.path.realpath(named)
        e.file = f"{named}:{line.line}" if same else str(line)
    else:
        e.file = named
        if line is not None:
            e.reason = f"{e.reason} (source: {line})"
    if e.detail and e.section:
        e.detail = table.annotate(e.section, e.detail, e.program)
    if e.section and e.program and table.shared(e.section):   # kprobe/* (second): which of the section's
        e.section = f"{e.section} ({e.program})"
    return e
