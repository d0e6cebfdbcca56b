"""bpf/alu.py, the one RFC 9669 arithmetic (the VM runs it, the verifier folds constants with it),
against the ISA table's independent expectations: every case that only computes on registers is
evaluated with alu.py alone and must give the table's r0."""

from __future__ import annotations

import pytest

from egpu_preload.bpf import alu, isa
from egpu_preload.bpf.asm import assemble
from egpu_preload.bpf.decode import Insn, decode
from isa_cases import CASES, Case

_REGISTER_KINDS = frozenset(("alu", "mov", "neg", "movsx", "end", "jmp", "ja", "exit"))


def _registers_only(case: Case) -> list[Insn] | None:
    """The case's instructions when it touches no memory (and so no address), else None."""
    insns = decode(assemble(case.asm))
    if case.mem is not None:
        return None
    ok = all(i.kind in _REGISTER_KINDS or (i.kind == "lddw" and i.src == isa.LDDW_IMM64) for i in insns)
    return insns if ok else None


def _evaluate(insns: list[Insn]) -> int:
    """r0 of a registers-only program with r1 = r2 = 0 (vm.execute's contract without memory)."""
    regs, by_pc, pc = [0] * isa.NUM_REGS, {i.pc: i for i in insns}, 0
    for _ in range(100_000):
        i = by_pc[pc]
        w, d = i.width, i.dst
        operand = i.imm & alu.M64 if i.use_imm else regs[i.src]
        pc += i.slots
        if i.kind == "exit":
            return regs[0]
        if i.kind == "mov":
            regs[d] = operand & alu.MASKS[w]
        elif i.kind == "alu":
            regs[d] = alu.binary(i.op, w, regs[d], operand)
        elif i.kind == "neg":
            regs[d] = alu.neg(w, regs[d])
        elif i.kind == "movsx":
            regs[d] = alu.movsx(w, 8 * i.size, regs[i.src])
        elif i.kind == "end":
            regs[d] = alu.byteswap(i.op, i.imm, regs[d])
        elif i.kind == "lddw":
            regs[d] = i.imm
        elif i.kind == "ja" or alu.CONDITIONS[i.op](regs[d] & alu.MASKS[w], operand & alu.MASKS[w], w):
            pc = i.jump_target()
    raise AssertionError("no exit")


REGISTER_CASES = [(c, insns) for c in CASES if (insns := _registers_only(c)) is not None]


def test_most_of_the_table_is_registers_only():
    kinds = {(i.kind, i.op) for _, insns in REGISTER_CASES for i in insns}
    assert len(REGISTER_CASES) > 120
    assert {o for o in alu.BINARY} <= {op for k, op in kinds if k == "alu"}
    assert {o for o in alu.CONDITIONS} <= {op for k, op in kinds if k == "jmp"}


@pytest.mark.parametrize("case, insns", REGISTER_CASES, ids=[c.name for c, _ in REGISTER_CASES])
def test_alu_gives_the_table_result(case: Case, insns: list[Insn]) -> None:
    assert _evaluate(insns) == case.r0


@pytest.mark.parametrize("op, old, operand, new", [
    ("add", 5, 7, 12), ("or", 0b1010, 0b0110, 0b1110), ("and", 0b1010, 0b0110, 0b0010),
    ("xor", 0b1010, 0b0110, 0b1100), ("xchg", 5, 7, 7),
])
def test_atomic_new_values(op, old, operand, new):
    assert alu.ATOMIC[op](old, operand) == new
