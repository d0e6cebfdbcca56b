"""Precision: which registers and stack slots held a value some check read as a number, traced back along the
path to where that value came from (the kernel's mark_chain_precision and backtrack_insn).

A scalar only a store, a record or another scalar of that kind ever reads (a count of matches, a sum) may take
any value without changing what the program may do, so pruning need not compare it: a state that matches an
explored one but in such scalars is covered by it (state.covers). A scalar becomes precise where a check reads
its bounds or value (checks.py: pointer arithmetic, a branch its bounds decide, a helper's size or constant, an
atomic add's operand, a key the translator folds); the mark then goes back through the instructions that made
it, to every remembered state on the way, until the values it came from were set from constants or memory.

A register is a key frame * FRAME + r; a stack slot (8 bytes, state.Frame) frame * FRAME + SLOT + k.
"""

from __future__ import annotations

from typing import NamedTuple

from .. import isa
from .cfg import Cfg

FRAME = 128
SLOT = 64
_REGS = range(11)
_SLOTS = range(isa.STACK_SIZE // 8)


def reg_key(frame: int, r: int) -> int:
    return frame * FRAME + r


def slot_key(frame: int, k: int) -> int:
    return frame * FRAME + SLOT + k


def everything(depth: int) -> set[int]:
    """Every register and slot of ``depth`` frames: what a state compared exactly stands for."""
    return {f * FRAME + i for f in range(depth) for i in (*_REGS, *(SLOT + k for k in _SLOTS))}


class Step(NamedTuple):
    """One instruction a path ran: its pc, the frames before it ran, the stack slot a fixed-offset load, store or
    atomic touched there, as (frame, slot, bytes), and, for a conditional jump, the registers and spills linked to
    its operands (the same id), which its outcome narrows too."""

    pc: int
    depth: int
    stack: tuple[int, int, int] | None
    linked: frozenset[int] = frozenset()


def back(cfg: Cfg, step: Step, nxt: tuple[int, int], need: set[int]) -> set[int]:
    """What had to be precise before ``step`` ran for ``need`` to be after it, ``nxt`` (pc, frames) being the
    instruction the path ran next."""
    insn = cfg.at[step.pc]
    f = step.depth - 1
    if nxt[1] == step.depth + 1:   # a call: the callee's r1-r5 were the caller's (bpf_loop: r1 bounds the index,
        callee = step.depth        # r2 is the caller's r3)
        out = {k for k in need if k // FRAME != callee}
        pairs = ((1, 1), (2, 3)) if insn.src != isa.CALL_LOCAL else ((r, r) for r in range(1, 6))
        out.update(reg_key(f, src) for r, src in pairs if reg_key(callee, r) in need)
        return out
    out = set(need)
    if nxt[1] == step.depth - 1:   # an exit: the caller's r0 is the callee's (never needed after a callback's)
        if reg_key(f - 1, 0) in out:
            out.discard(reg_key(f - 1, 0))
            out.add(reg_key(f, 0))
        return out
    kind = insn.kind
    dst, src = reg_key(f, insn.dst), reg_key(f, insn.src)
    if kind in ("mov", "movsx"):
        if dst in need:
            out.discard(dst)
            if not insn.use_imm:
                out.add(src)
    elif kind == "alu":
        if dst in need and not insn.use_imm:
            out.add(src)
    elif kind == "lddw":
        out.discard(dst)
    elif kind == "load":
        if dst in need:
            out.discard(dst)
            if step.stack is not None:   # a fill: the slot held it
                out.add(slot_key(step.stack[0], step.stack[1]))
    elif kind == "store":
        slot = slot_key(step.stack[0], step.stack[1]) if step.stack is not None else -1
        if slot in need:
            if step.stack[2] == 8:   # a whole slot replaced; a part leaves the rest of what it held
                out.discard(slot)
            if not insn.use_imm:
                out.add(src)
    elif kind == "atomic":
        fetched = reg_key(f, 0) if insn.atomic_op == "cmpxchg" else src if insn.fetch else -1
        slot = slot_key(step.stack[0], step.stack[1]) if step.stack is not None else -1
        if fetched in need:
            out.discard(fetched)
            if slot >= 0:
                out.add(slot)
        if slot in need:
            out.add(src)
            if insn.atomic_op == "cmpxchg":
                out.add(reg_key(f, 0))
    elif kind == "jmp":   # the outcome bounds each operand by the other, and every value linked to them
        operands = {dst} if insn.use_imm else {dst, src}
        if not need.isdisjoint(operands | step.linked):
            out.update(operands | step.linked)
    elif kind == "call":   # a helper: r0 its result, r1-r5 clobbered
        out.difference_update(reg_key(f, r) for r in range(6))
    return out
