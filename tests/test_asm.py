"""The assembler inverts the disassembler on every ISA row and on random valid instructions, and adds
labels, comments, helper names and map references; bad input names its line."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egpu_preload.bpf import isa
from egpu_preload.bpf.asm import assemble
from egpu_preload.bpf.decode import decode, encode
from egpu_preload.bpf.disasm import disasm, disasm_insn
from egpu_preload.errors import AsmError
from test_disasm import random_insn, row_examples


def _slot(op: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", op, src << 4 | dst, off, imm)


def test_every_row_round_trips() -> None:
    examples = row_examples()
    assert [i.spec for i in examples] == list(isa.OPS)
    for insn in examples:
        text = disasm_insn(insn)
        assert disasm(assemble(text)) == [text], insn.spec
        assert assemble(text) == encode(insn), text


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(isa.OPS), st.randoms(use_true_random=False))
def test_random_instructions_round_trip(spec: isa.OpSpec, rnd: random.Random) -> None:
    insn = random_insn(spec, rnd)
    text = disasm_insn(insn)
    assert assemble(text) == encode(insn)
    assert disasm(assemble(text)) == [text]


def test_program_round_trips() -> None:
    rnd = random.Random(7)
    code = b"".join(encode(random_insn(rnd.choice(isa.OPS), rnd)) for _ in range(500))
    assert assemble("\n".join(disasm(code))) == code


@pytest.mark.parametrize("text, code", [
    # labels: forward, backward, on their own line or before an instruction; gotol and local calls
    ("goto out\nr0 = 1\nout: exit", _slot(0x05, off=1) + _slot(0xb7, imm=1) + _slot(0x95)),
    ("top:\nr0 += 1\nif r0 < 10 goto top\nexit",
     _slot(0x07, imm=1) + _slot(0xa5, off=-2, imm=10) + _slot(0x95)),
    ("gotol end\nr1 = 1 ll\nend:\nexit", _slot(0x06, imm=2) + _slot(0x18, 1, imm=1) + _slot(0) + _slot(0x95)),
    ("call local f\nexit\nf: r0 = 2\nexit",
     _slot(0x85, src=1, imm=1) + _slot(0x95) + _slot(0xb7, imm=2) + _slot(0x95)),
    # comments, blank lines, whitespace, decimal numbers, helper names
    ("  ; nothing\n\nr1 = -8   # eight\nexit // done", _slot(0xb7, 1, imm=-8) + _slot(0x95)),
    ("call map_lookup_elem\ncall 0x1f6", _slot(0x85, imm=1) + _slot(0x85, imm=502)),
    # map references as the loader leaves them
    ("r1 = map[3] ll", _slot(0x18, 1, 5, imm=3) + _slot(0)),
    ("r2 = map_value[1] + 16 ll", _slot(0x18, 2, 6, imm=1) + _slot(0, imm=16)),
    ("r2 = map_value[1] ll", _slot(0x18, 2, 6, imm=1) + _slot(0)),
    # a function's address (a callback), relative to the next slot like a call's: the imm's high half stays 0
    ("r2 = func cb ll\nexit\ncb: exit", _slot(0x18, 2, 4, imm=2) + _slot(0) + _slot(0x95) + _slot(0x95)),
    ("cb: exit\nr2 = func cb ll", _slot(0x95) + _slot(0x18, 2, 4, imm=-2) + _slot(0)),
    # unsigned spellings of 32-bit immediates; r registers in 32-bit memory ops (llvm without +alu32)
    ("w1 = 0xffffffff", _slot(0xb4, 1, imm=-1)),
    ("*(u32 *)(r10 - 8) = r1", _slot(0x63, 10, 1, off=-8)),
    ("r1 = *(u16 *)(r2 + 2)", _slot(0x69, 1, 2, off=2)),
    ("lock *(u32 *)(r1 + 0) += r2", _slot(0xc3, 1, 2)),
    # a pasted llvm-objdump listing line
    ("      7:\tif r0 == 0x0 goto +0x2 <f+0x50>", _slot(0x15, off=2)),
    ("r1 = 0xffffffffffffffff ll", _slot(0x18, 1, imm=-1) + _slot(0, imm=-1)),
])
def test_assemble(text: str, code: bytes) -> None:
    assert assemble(text) == code


@pytest.mark.parametrize("text, message", [
    ("r0 = 1\nr11 = 2", "line 2: no register r11"),
    ("frobnicate r1", "line 1: not an instruction"),
    ("w1 += r2", "line 1: register r2 does not match the 32-bit operation"),
    ("r1 = 0x80000000", "line 1: immediate 0x80000000 out of range"),
    ("goto nowhere", "line 1: undefined label nowhere"),
    ("a:\na:\nexit", "line 2: label a defined twice"),
    ("goto +40000", "line 1: jump offset 40000 does not fit 16 bits"),
    ("r1 = *(u8 *)(r2 + 40000)", "line 1: offset 40000 out of range"),
    ("r1 = *(s64 *)(r2 + 0)", "line 1: there is no sign-extending 64-bit load"),
    ("w1 = (s32)w2", "line 1: 32-bit movsx takes s8 or s16"),
    ("r1 = le16 r2", "line 1: a byte swap reads and writes the same register"),
    ("r1 = -r2", "line 1: neg reads and writes the same register"),
    ("r3 = xchg_64(r1 + 0, r2)", "line 1: xchg writes its result to r2, not r3"),
    ("r1 = cmpxchg_64(r1 + 0, r1, r2)", "line 1: cmpxchg compares with r0"),
    ("call nosuch", "line 1: unknown helper nosuch"),
    ("r1 = 09", "line 1: bad number 09"),
    ("*(u64 *)(r1 + 0) = w2", "line 1: register w2 does not match the 64-bit operation"),
])
def test_errors_name_the_line(text: str, message: str) -> None:
    with pytest.raises(AsmError) as e:
        assemble(text)
    assert str(e.value).startswith(message)


def test_output_decodes() -> None:
    """What the assembler emits is what the decoder reads back, slot for slot."""
    code = assemble("r1 = map[0] ll\nr0 = *(u64 *)(r1 + 8)\nexit")
    assert [i.pc for i in decode(code)] == [0, 2, 3]
