"""The VM's programs as Python functions: one function per program, registers in locals, basic blocks
behind a pc dispatch, for launch probes, which run once per launch of the application.

The interpreter (machine.py) stays the definition: a compiled program computes what its closures
compute, op by op. Common instructions (64- and 32-bit add, sub, mul, and, or, xor, shifts, moves,
loads, stores, atomic adds that do not fetch, the unsigned conditions, helper calls, map references)
become Python statements, and an access at a constant offset from r10 that stays in the frame reads or
writes the frame's bytes directly (r10 never changes here); every other instruction syncs the
registers into the run, calls the interpreter's closure for it and reads them back. The budget is
charged per block, so a program that exhausts it is stopped at the start of a block, not at the exact
instruction.

Every program compiles. A local call runs the interpreter's closure (a fresh frame, r6-r9 saved) and
goes to its target; an exit from a subprogram runs the closure too (the caller's frame and r6-r9 back)
and goes to the return pc; ``stack`` follows the current frame. bpf_loop is such a call (its closure goes
to the callback, or on), and a callback's exit goes to the next round's callback or past the call. An
instruction the interpreter stops at (a write to r10, a jump or call outside the program, an unknown
helper or a kfunc) runs its closure, which raises as the interpreter does; a jump into an lddw or past
the end (falling off it included) finds no block and runs the interpreter's op for that slot, which does the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..bpf import alu, isa
from ..bpf.alu import MASKS
from ..bpf.helpers import LOOP
from ..errors import EgpuError, VmError
from . import calls
from .machine import MAP_HANDLE_BASE, WRITES_DST
from .memory import MASK64

if TYPE_CHECKING:
    from ..bpf.decode import Insn
    from .machine import Run, Vm

_INLINE_ALU = {"add": "+", "sub": "-", "mul": "*", "and": "&", "or": "|", "xor": "^"}
_INLINE_COND = {"jeq": "==", "jne": "!=", "jgt": ">", "jge": ">=", "jlt": "<", "jle": "<="}
_REGS = ", ".join(f"r{n}" for n in range(isa.NUM_REGS))
_SYNC, _RELOAD = f"regs[:] = ({_REGS})", f"{_REGS} = regs"
_FRAME = "    stack = mem.region_at(run.frame).data"   # the current frame's bytes, after a call or return


def compile_program(vm: "Vm") -> Callable[["Run"], int]:
    """A function running ``vm``'s program on a Run (r1, r2 and r10 set) and returning r0 as the
    interpreter would, or raising the fault it would."""
    names: dict[str, object] = {"MASK64": MASK64, "VmError": VmError, "EgpuError": EgpuError, "OPS": vm.ops,
                                "HANDLERS": calls.HANDLERS, "movsx": alu.movsx, "vm": vm}
    body = _blocks(vm, len(vm.state.storages), names)
    src = "\n".join([
        "def program(run):",
        "    regs, mem = run.regs, run.mem",
        _FRAME,
        "    load, store = mem.load, mem.store",
        f"    {_RELOAD}",
        f"    budget, pc, p = {vm.budget}, 0, 0",
        "    try:",
        "        while True:",
        *body,
        "    except EgpuError as e:",
        "        vm.locate(e, p)",
        "        raise",
    ])
    scope: dict[str, object] = dict(names)
    exec(compile(src, f"<egpu program {id(vm):x}>", "exec"), scope)
    return scope["program"]  # type: ignore[return-value]


def _in_frame(reg: int, off: int, size: int) -> int | None:
    """The offset into the stack frame of an access at r10 + off that stays inside it (r10 is the frame's
    top and never changes in a compiled program), else None: the access goes through memory, which
    reports the fault as the interpreter does."""
    at = isa.STACK_SIZE + off
    return at if reg == isa.FRAME_POINTER and 0 <= at and at + size <= isa.STACK_SIZE else None


def _blocks(vm: "Vm", nmaps: int, names: dict[str, object]) -> list[str]:
    """The dispatch: one ``if pc == LEADER`` per basic block, in program order (blocks start at jump
    targets and after jumps), each charging its instructions to the budget. A block falling through or
    jumping forward sets pc and the ifs below find it; a jump backward starts the loop over."""
    insns, end = vm.insns, len(vm.ops) - 1   # ops has one slot past the last: "fell off the end"
    starts = {i.pc for i in insns}
    leaders = {0}
    for k, i in enumerate(insns):
        if i.callback in starts:
            leaders.add(i.callback)   # a callback, entered by its bpf_loop's closure
        if _transfers(i):
            leaders.update(t for t in (_target(i),) if t in starts)
            if k + 1 < len(insns):
                leaders.add(insns[k + 1].pc)
    blocks: list[tuple[int, list[str], int]] = []
    for k, i in enumerate(insns):
        nxt = insns[k + 1].pc if k + 1 < len(insns) else end
        if i.pc in leaders:
            blocks.append((i.pc, [], 0))
        pc, lines, count = blocks[-1]
        blocks[-1] = (pc, lines + _insn(i, nxt, end, nmaps, names, vm.budgeted), count + 1)
        if (nxt in leaders or nxt == end) and not _transfers(i):
            blocks[-1][1].append(f"pc = {nxt}")
    out: list[str] = []
    for pc, lines, count in blocks:
        out += [" " * 12 + f"if pc == {pc}:", " " * 16 + f"budget -= {count}",
                " " * 16 + "if budget < 0:",
                " " * 20 + "raise VmError(f'instruction budget of {vm.budget} exhausted (unbounded loop?)')"]
        out += [" " * 16 + ln for ln in lines]
    # no block starts here: inside an lddw or past the end; the interpreter's op for the slot raises
    return out + [" " * 12 + "p = pc", " " * 12 + "OPS[pc](run)",
                  " " * 12 + "raise VmError(f'no instruction starts at {pc}')"]   # never: those ops raise


def _back(i: "Insn", budgeted: frozenset[int]) -> list[str]:
    """A budgeted backward jump's charge: the run ends, as the interpreter's op ends it, past the budget."""
    return ["if not run.back_edge():", "    return regs[0] & MASK64"] if i.pc in budgeted else []


def _transfers(i: "Insn") -> bool:
    """Whether the instruction ends its block with a jump of its own: jumps, exits, local calls and bpf_loop."""
    return i.kind in ("jmp", "ja", "exit") or (i.kind == "call" and i.src == isa.CALL_LOCAL) or i.helper == LOOP


def _target(i: "Insn") -> int:
    return i.call_target() if i.kind == "call" else i.jump_target() if i.kind in ("jmp", "ja") else -1


def _operand(i: "Insn") -> str:
    """src or imm at the instruction's width; registers hold u64, so only 32 bits need masking."""
    m = MASKS[i.width]
    if i.use_imm:
        return str(i.imm & m)
    return f"r{i.src}" if i.width == 64 else f"(r{i.src} & {m})"


def _insn(i: "Insn", nxt: int, end: int, nmaps: int, names: dict[str, object],
          budgeted: frozenset[int]) -> list[str]:
    """The statements of one instruction (registers r0..r10 are locals; p: the pc a fault reports;
    nxt: the next instruction's pc, or the end; end: the slot past the last; nmaps: the maps a map
    reference may name; budgeted: the Vm's budgeted backward jumps)."""
    d, s = f"r{i.dst}", f"r{i.src}"
    closure = [f"p = {i.pc}", _SYNC, f"OPS[{i.pc}](run)", _RELOAD]
    if i.kind in WRITES_DST and i.dst == isa.FRAME_POINTER:
        return closure   # raises "r10 is read-only"
    if i.kind in ("jmp", "ja") and not 0 <= i.jump_target() <= end:
        return closure   # raises "jump to N, outside the program"
    if i.kind in ("alu", "mov"):
        m, x = MASKS[i.width], _operand(i)
        dv = d if i.width == 64 else f"({d} & {m})"
        if i.kind == "mov":
            return [f"{d} = {x}"]
        if i.op in ("and", "or", "xor") and i.width == 64:
            return [f"{d} = {d} {_INLINE_ALU[i.op]} {x}"]
        if i.op in _INLINE_ALU:
            return [f"{d} = ({dv} {_INLINE_ALU[i.op]} {x}) & {m}"]
        if i.op == "lsh":
            return [f"{d} = ({dv} << ({x} & {i.width - 1})) & {m}"]
        if i.op == "rsh":
            return [f"{d} = {dv} >> ({x} & {i.width - 1})"]
        f = f"ALU_{i.op}"
        names[f] = alu.BINARY[i.op]
        return [f"{d} = {f}({dv}, {x}, {i.width})"]
    if i.kind == "lddw" and i.src == isa.LDDW_MAP_IDX and 0 <= i.imm < nmaps:
        return [f"{d} = {MAP_HANDLE_BASE + i.imm}"]   # what the interpreter's op_map computes
    if i.kind == "load":
        at = _in_frame(i.src, i.off, i.size)
        v = (f'int.from_bytes(stack[{at}:{at + i.size}], "little")' if at is not None
             else f"load(({s} + {i.off}) & MASK64, {i.size})")
        return [f"p = {i.pc}", f"{d} = movsx(64, {8 * i.size}, {v})" if i.spec.signed else f"{d} = {v}"]
    if i.kind == "store":
        v = str(i.imm & MASK64) if i.use_imm else s
        at = _in_frame(i.dst, i.off, i.size)
        if at is not None:
            return [f'stack[{at}:{at + i.size}] = ({v} & {(1 << 8 * i.size) - 1}).to_bytes({i.size}, "little")']
        return [f"p = {i.pc}", f"store(({d} + {i.off}) & MASK64, {i.size}, {v})"]
    if i.kind == "jmp":
        m, x = MASKS[i.width], _operand(i)
        dv = d if i.width == 64 else f"({d} & {m})"
        if i.op in _INLINE_COND:
            cond = f"{dv} {_INLINE_COND[i.op]} {x}"
        elif i.op == "jset":
            cond = f"{dv} & {x}"
        else:
            f = f"COND_{i.op}"
            names[f] = alu.CONDITIONS[i.op]
            cond = f"{f}({dv}, {x}, {i.width})"
        target = i.jump_target()
        if target > i.pc:   # forward: the ifs below find either
            return [f"pc = {target} if {cond} else {nxt}"]
        return [f"if {cond}:", *("    " + s for s in _back(i, budgeted)), f"    pc = {target}", "    continue",
                f"pc = {nxt}"]
    if i.kind == "ja":
        target = i.jump_target()
        return [*_back(i, budgeted), f"pc = {target}"] + (["continue"] if target <= i.pc else [])
    if i.kind == "exit":   # from a subprogram: the closure restores the caller's frame and r6-r9
        return ["if not run.frames:", "    return r0 & MASK64", _SYNC, f"pc = OPS[{i.pc}](run)", _RELOAD,
                _FRAME.strip(), "continue"]
    if i.kind == "atomic" and i.atomic_op == "add" and not i.fetch:   # the counters' add, as _atomic does it
        m = MASKS[i.width]
        return [f"p = {i.pc}", f"a = ({d} + {i.off}) & MASK64",
                f"if a % {i.size}:", f"    raise VmError(f'atomic access at 0x{{a:x}} is not {i.size}-byte aligned')",
                f"store(a, {i.size}, (load(a, {i.size}) + ({s} & {m})) & {m})"]
    if i.kind == "call" and i.src == isa.CALL_HELPER and i.imm in calls.HANDLERS:
        return [f"p = {i.pc}", _SYNC, f"if HANDLERS[{i.imm}](run):", "    return regs[0] & MASK64", _RELOAD]
    if (i.kind == "call" and i.src == isa.CALL_LOCAL and 0 <= i.call_target() < end) or i.helper == LOOP:
        # the closure pushes the frame (or raises past MAX_FRAMES) and returns the target; bpf_loop's the
        # callback's, or the next pc when it calls none
        return [f"p = {i.pc}", _SYNC, f"pc = OPS[{i.pc}](run)", _RELOAD, _FRAME.strip(), "continue"]
    # the rest (lddw, atomics, neg, end, movsx, calls the interpreter refuses): its closure
    return closure
