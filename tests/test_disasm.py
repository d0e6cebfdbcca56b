"""The disassembler against llvm-objdump-19 itself: every ISA row, thousands of random instructions, and
every clang-compiled probe, compared line by line.

Normalized, and only this (disasm.py says why egpu prints these differently): llvm's ``<f+0x48>`` jump
annotations are dropped, and egpu's ``call local``/``call kfunc`` lose their qualifier (llvm prints every
call as ``call N``). llvm is run with ``--mattr=+alu32``, the only mode in which it decodes 32-bit fetch
atomics correctly.
"""

from __future__ import annotations

import random
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from elftools.elf.constants import SH_FLAGS
from elftools.elf.elffile import ELFFile

from egpu_preload.bpf import isa
from egpu_preload.bpf.decode import Insn, decode, encode
from egpu_preload.bpf.disasm import disasm, disasm_insn, listing

LLVM = shutil.which("llvm-objdump-19") and shutil.which("clang-19")
needs_llvm = pytest.mark.skipif(not LLVM, reason="needs clang-19 and llvm-objdump-19")
PROBES = Path(__file__).parent / "probes"


def _s(rnd: random.Random, bits: int) -> int:
    return rnd.randrange(-(1 << (bits - 1)), 1 << (bits - 1))


def random_insn(spec: isa.OpSpec, rnd: random.Random, *, map_refs: bool = True) -> Insn:
    """A valid instruction of one ISA row with random operands (map_refs: lddw may use src 5/6)."""
    reg = lambda: rnd.randrange(isa.NUM_REGS)  # noqa: E731
    kind, dst, src, off, imm = spec.kind, reg(), 0, 0, 0
    if kind in ("alu", "mov", "jmp"):
        src, imm = (0, _s(rnd, 32)) if spec.use_imm else (reg(), 0)
        off = _s(rnd, 16) if kind == "jmp" else spec.offset
    elif kind == "movsx":
        src, off = reg(), spec.offset
    elif kind == "end":
        imm = rnd.choice((16, 32, 64))
    elif kind == "lddw":
        src = rnd.choice((isa.LDDW_IMM64, isa.LDDW_MAP_IDX, isa.LDDW_MAP_IDX_VALUE) if map_refs else (0,))
        # map_value's offset lives in the high half; map[N] has none
        high = rnd.randrange(1 << 32) if src == isa.LDDW_MAP_IDX_VALUE else 0
        imm = rnd.randrange(1 << 64) if src == isa.LDDW_IMM64 else rnd.randrange(1 << 32) | high << 32
    elif kind == "load":
        src, off = reg(), _s(rnd, 16)
    elif kind == "store":
        src, imm = (0, _s(rnd, 32)) if spec.use_imm else (reg(), 0)
        off = _s(rnd, 16)
    elif kind == "atomic":
        src, off = reg(), _s(rnd, 16)
        code = rnd.choice(list(isa.ATOMIC_OPS))
        imm = code | (isa.ATOMIC_FETCH if code >= 0xE0 else rnd.choice((0, isa.ATOMIC_FETCH)))
    elif kind == "ja":
        dst = 0
        off, imm = (0, _s(rnd, 32)) if spec.name == "ja32" else (_s(rnd, 16), 0)
    elif kind == "call":
        dst, src, imm = 0, rnd.choice((isa.CALL_HELPER, isa.CALL_LOCAL, isa.CALL_BTF)), _s(rnd, 32)
    elif kind in ("neg", "exit"):
        dst = 0 if kind == "exit" else dst
    return Insn(0, spec, dst, src, off, imm)


def row_examples() -> list[Insn]:
    """One instruction per ISA row, operands fixed by a seed so failures reproduce."""
    rnd = random.Random(9669)
    return [random_insn(spec, rnd, map_refs=False) for spec in isa.OPS]


def llvm_disasm(code: bytes) -> list[str]:
    """llvm-objdump-19's text for raw bytes: clang assembles them as .byte into an object first."""
    with tempfile.TemporaryDirectory() as d:
        src, obj = Path(d, "x.s"), Path(d, "x.o")
        lines = [".text", ".globl f", "f:"]
        lines += [".byte " + ",".join(map(str, code[i:i + 8])) for i in range(0, len(code), 8)]
        src.write_text("\n".join(lines) + "\n")
        subprocess.run(["clang-19", "-target", "bpf", "-c", str(src), "-o", str(obj)], check=True)
        return _objdump_lines(obj)[".text"]


def _objdump_lines(obj: Path) -> dict[str, list[str]]:
    out = subprocess.run(["llvm-objdump-19", "-d", "--mattr=+alu32", "--no-show-raw-insn", str(obj)],
                         capture_output=True, text=True, check=True).stdout
    sections: dict[str, list[str]] = {}
    current: list[str] = []
    for line in out.splitlines():
        if m := re.match(r"Disassembly of section (.*):$", line):
            current = sections.setdefault(m[1], [])
        elif m := re.match(r"\s+(\d+):\t(.*)$", line):
            current.append(f"{m[1]}: {re.sub(r' <[^<>]*>$', '', m[2])}")
    return sections


def _ours(code: bytes) -> list[str]:
    return [f"{i.pc}: {re.sub(r'^call (local|kfunc) ', 'call ', disasm_insn(i))}" for i in decode(code)]


@needs_llvm
def test_every_row_matches_llvm() -> None:
    code = b"".join(encode(i) for i in row_examples())
    assert _ours(code) == llvm_disasm(code)


@needs_llvm
def test_random_instructions_match_llvm() -> None:
    rnd = random.Random(1)
    code = b"".join(encode(random_insn(rnd.choice(isa.OPS), rnd, map_refs=False)) for _ in range(3000))
    assert _ours(code) == llvm_disasm(code)


@needs_llvm
@pytest.mark.parametrize("mcpu", ["v3", "v4"])
def test_probes_match_llvm(probe_obj, mcpu: str) -> None:
    names = sorted(p.name.removesuffix(".bpf.c") for p in PROBES.glob("*.bpf.c"))
    assert names, "tests/probes has no probes"
    checked = 0
    for name in names:
        obj = probe_obj(name, mcpu)
        expected = _objdump_lines(obj)
        with obj.open("rb") as f:
            for sec in ELFFile(f).iter_sections():
                if sec["sh_flags"] & SH_FLAGS.SHF_EXECINSTR and sec.data_size:
                    assert _ours(sec.data()) == expected[sec.name], f"{obj.name}:{sec.name}"
                    checked += 1
    assert checked >= len(names)


@pytest.mark.parametrize("insn, text", [
    (Insn(0, isa.BY_OPCODE_OFFSET[(0x18, 0)], 1, isa.LDDW_MAP_IDX, 0, 3), "r1 = map[3] ll"),
    (Insn(0, isa.BY_OPCODE_OFFSET[(0x18, 0)], 2, isa.LDDW_MAP_IDX_VALUE, 0, 1 | 16 << 32),
     "r2 = map_value[1] + 0x10 ll"),
    (Insn(0, isa.BY_OPCODE_OFFSET[(0x18, 0)], 2, isa.LDDW_MAP_FD, 0, 1 << 40 | 7),
     "ld_pseudo r2, 0x1, 0x10000000007"),
    (Insn(4, isa.BY_OPCODE_OFFSET[(0x18, 0)], 2, isa.LDDW_CODE_ADDR, 0, 0xFFFFFFFD), "r2 = func -0x3 ll"),
    (Insn(0, isa.BY_OPCODE_OFFSET[(0x18, 0)], 2, isa.LDDW_CODE_ADDR, 0, 1 << 32), "ld_pseudo r2, 0x4, 0x100000000"),
    (Insn(0, isa.BY_OPCODE_OFFSET[(0x85, 0)], 0, isa.CALL_LOCAL, 0, -3), "call local -0x3"),
    (Insn(0, isa.BY_OPCODE_OFFSET[(0x85, 0)], 0, isa.CALL_BTF, 0, 7), "call kfunc 0x7"),
    (Insn(0, isa.BY_OPCODE[0x05], 0, 0, -2, 0), "goto -0x2"),
])
def test_egpu_only_forms(insn: Insn, text: str) -> None:
    assert disasm_insn(insn) == text


def test_listing_numbers_slots() -> None:
    code = encode(Insn(0, isa.BY_OPCODE_OFFSET[(0x18, 0)], 1, 0, 0, 5)) + encode(
        Insn(2, isa.BY_OPCODE_OFFSET[(0x95, 0)], 0, 0, 0, 0))
    assert listing(code) == "       0:\tr1 = 0x5 ll\n       2:\texit"
    assert disasm(code) == ["r1 = 0x5 ll", "exit"]


def test_egpu_disasm_command(probe_obj, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from launcher import egpu
    result = CliRunner().invoke(egpu, ["disasm", str(probe_obj("count"))])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "map[0] = counts (array, key 4, value 8, max_entries 1)"
    assert lines[2] == "kprobe/* <count_entries>:"
    assert "\tr1 = map[0] ll" in result.output and lines[-1].endswith("\texit")
    bad = tmp_path / "bad.bpf.o"
    bad.write_bytes(b"\x7fELF")
    result = CliRunner().invoke(egpu, ["disasm", str(bad)])
    assert result.exit_code == 1 and "bad.bpf.o" in result.output and "Traceback" not in result.output
