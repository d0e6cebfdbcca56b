"""What the verifier checks before running anything (the kernel's check_subprogs and check_cfg):
jump and call targets, subprogram boundaries, map references, recursion; and which registers are
live at each instruction, so pruning compares only what the rest of the program can read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .. import isa
from ..decode import Insn
from ..helpers import HELPERS, LOOP
from ..program import MAP_ARRAY, MapDef

ARG_REGS = 0b111110      # r1-r5
CALLER_SAVED = 0b111111  # r0-r5


class Reject(Exception):
    """Raised inside the verifier; verify() turns it into a VerifierError with the instruction and log."""

    def __init__(self, reason: str, pc: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.pc = pc  # None: the instruction being checked


@dataclass(frozen=True)
class Cfg:
    insns: tuple[Insn, ...]
    at: dict[int, Insn]                    # pc -> instruction
    subprogs: tuple[int, ...]              # entry pcs, main (0) first
    subprog_of: dict[int, int]             # pc -> index into subprogs
    callees: tuple[Mapping[int, int], ...]  # per subprogram, the subprograms it calls or takes the address of
                                            # (a callback), each with the pc of the first instruction doing so
    prune: frozenset[int]                  # where explored states are remembered
    live: dict[int, int]                   # pc -> mask of registers read before written from there
    loop_calls: frozenset[int] = frozenset()   # pc of each bpf_loop call: where its callback's rounds meet


def _successors(insn: Insn) -> tuple[int, ...]:
    nxt = insn.pc + insn.slots
    if insn.kind == "exit":
        return ()
    if insn.kind == "ja":
        return (insn.jump_target(),)
    if insn.kind == "jmp":
        return (nxt, insn.jump_target())
    return (nxt,)


def _check_target(at: dict[int, Insn], insn: Insn, target: int, what: str) -> None:
    if target in at:
        return
    prev = at.get(target - 1)
    if prev is not None and prev.kind == "lddw":
        raise Reject(pc=insn.pc, reason=f"{what} into the middle of lddw at {prev.pc} ({what} target {target})")
    raise Reject(pc=insn.pc, reason=f"{what} out of range ({what} target {target})")


def _check_lddw(insn: Insn, maps: list[MapDef]) -> None:
    if insn.src == isa.LDDW_IMM64:
        return
    if insn.src == isa.LDDW_MAP_IDX:
        if insn.imm >= len(maps):
            raise Reject(pc=insn.pc, reason=f"map index {insn.imm} out of range ({len(maps)} maps)")
        return
    if insn.src == isa.LDDW_MAP_IDX_VALUE:
        idx, off = insn.imm & 0xFFFFFFFF, insn.imm >> 32
        if idx >= len(maps):
            raise Reject(pc=insn.pc, reason=f"map index {idx} out of range ({len(maps)} maps)")
        m = maps[idx]
        if m.type != MAP_ARRAY or m.max_entries != 1:
            raise Reject(pc=insn.pc, reason=f"direct value access needs a single-entry array map, not {m.name} "
                                  "(map_value lddw)")
        if off >= m.value_size:
            raise Reject(pc=insn.pc, reason=f"direct value offset {off} outside {m.name} (value_size={m.value_size})")
        return
    if insn.src == isa.LDDW_CODE_ADDR:
        if insn.imm >> 32:
            raise Reject(pc=insn.pc, reason=f"invalid bpf_ld_imm64 insn: a function's address has imm 0x{insn.imm:x}, "
                                            "its high half not zero (pseudo func)")
        return
    raise Reject(pc=insn.pc, reason=f"unsupported lddw pseudo source {insn.src}: the loader resolves map references "
                          "to map[N] / map_value[N] (lddw source)")


def build(insns: list[Insn], maps: list[MapDef]) -> Cfg:
    if not insns:
        raise Reject(pc=0, reason="empty program")
    at = {i.pc: i for i in insns}
    entries = {0}
    for insn in insns:
        if insn.kind in ("jmp", "ja"):
            _check_target(at, insn, insn.jump_target(), "jump")
        elif insn.kind == "call" and insn.src == isa.CALL_LOCAL:
            _check_target(at, insn, insn.call_target(), "call")
            entries.add(insn.call_target())
        elif insn.kind == "call" and insn.src == isa.CALL_BTF:
            raise Reject(pc=insn.pc, reason=f"kfunc calls are not supported (call kfunc {insn.imm})")
        elif insn.kind == "lddw":
            _check_lddw(insn, maps)
            if (callback := insn.callback) is not None:   # a function of its own (Linux's add_subprog)
                _check_target(at, insn, callback, "callback")
                _check_callback(at, insn)
                entries.add(callback)
    subprogs = tuple(sorted(entries))
    subprog_of: dict[int, int] = {}
    s = 0
    for insn in insns:
        while s + 1 < len(subprogs) and insn.pc >= subprogs[s + 1]:
            s += 1
        subprog_of[insn.pc] = s
    ends = [i for n, i in enumerate(insns) if n + 1 == len(insns) or insns[n + 1].pc in entries]
    for last in ends:
        if last.kind not in ("exit", "ja"):
            raise Reject(pc=last.pc, reason="last instruction of a function is not exit or goto (falls off the end)")
    callees: list[dict[int, int]] = [{} for _ in subprogs]   # callee -> the pc of the first call to it
    prune: set[int] = set(subprogs)
    for insn in insns:
        if insn.kind in ("jmp", "ja"):
            target = insn.jump_target()
            if subprog_of[target] != subprog_of[insn.pc]:
                raise Reject(pc=insn.pc, reason=f"jump out of the function to {target} (jump target)")
            prune.add(target)
            if insn.kind == "jmp":
                prune.add(insn.pc + 1)
        elif insn.kind == "call" and insn.src == isa.CALL_LOCAL:
            callees[subprog_of[insn.pc]].setdefault(subprog_of[insn.call_target()], insn.pc)
            prune.add(insn.pc + 1)
        elif insn.callback is not None:   # as Linux's check_cfg: a call
            callees[subprog_of[insn.pc]].setdefault(subprog_of[insn.callback], insn.pc)
    loop_calls = frozenset(i.pc for i in insns if i.helper == LOOP)
    prune |= loop_calls | {pc + 1 for pc in loop_calls}
    _check_recursion(subprogs, callees)
    return Cfg(tuple(insns), at, subprogs, subprog_of, tuple(callees), frozenset(prune), _liveness(insns, at),
               loop_calls)


def _check_callback(at: dict[int, Insn], insn: Insn) -> None:
    """A function's address names a function's start: not the main program, nor a pc the code before it
    runs into (Linux makes every such address a subprogram, whose neighbour then falls into it)."""
    target = insn.callback
    if target == 0:
        raise Reject(pc=insn.pc, reason="the callback at 0 is the main program, not a static function "
                                        "(callback target)")
    prev = at.get(target - 1) or at[target - 2]   # an lddw takes two slots
    if prev.kind not in ("exit", "ja"):
        raise Reject(pc=insn.pc, reason=f"the callback at {target} is no function's start: insn {prev.pc} before it "
                                        "runs into it (callback target)")


def _check_recursion(subprogs: tuple[int, ...], callees: list[dict[int, int]]) -> None:
    """Named at the call that closes a cycle, the line a user must change."""
    state = [0] * len(subprogs)  # 0 new, 1 on the current call chain, 2 done

    def visit(s: int) -> None:
        state[s] = 1
        for c, pc in sorted(callees[s].items()):
            if state[c] == 1:
                raise Reject(pc=pc, reason=f"recursive call to the function at {subprogs[c]} (call graph)")
            if state[c] == 0:
                visit(c)
        state[s] = 2

    visit(0)  # the call graph is a DAG of at most len(subprogs) levels; subprograms are few


def _use_def(insn: Insn) -> tuple[int, int]:
    """Registers an instruction reads and writes (r10 is never tracked: it is constant per frame)."""
    d, s = 1 << insn.dst, 1 << insn.src
    k = insn.kind
    if k == "alu":
        return d | (0 if insn.use_imm else s), d
    if k in ("mov", "movsx"):
        return 0 if insn.use_imm else s, d
    if k in ("neg", "end"):
        return d, d
    if k == "lddw":
        return 0, d
    if k == "load":
        return s, d
    if k == "store":
        return d | (0 if insn.use_imm else s), 0
    if k == "atomic":
        if insn.atomic_op == "cmpxchg":
            return d | s | 1, 1
        return d | s, s if insn.fetch else 0
    if k == "jmp":
        return d | (0 if insn.use_imm else s), 0
    if k == "call":
        if insn.src == isa.CALL_HELPER and insn.imm in HELPERS:
            return ARG_REGS & ((1 << (len(HELPERS[insn.imm].args) + 1)) - 1), CALLER_SAVED
        return ARG_REGS, CALLER_SAVED
    if k == "exit":
        return 1, 0
    return 0, 0  # ja


def _liveness(insns: list[Insn], at: dict[int, Insn]) -> dict[int, int]:
    """Backward data flow to a fixpoint: live_in = use | (live_out & ~def)."""
    ud = {i.pc: _use_def(i) for i in insns}
    succ = {i.pc: [t for t in _successors(i) if t in at] for i in insns}
    preds: dict[int, list[int]] = {i.pc: [] for i in insns}
    for pc, ts in succ.items():
        for t in ts:
            preds[t].append(pc)
    live = {i.pc: 0 for i in insns}
    work = [i.pc for i in insns]
    while work:
        pc = work.pop()
        out = 0
        for t in succ[pc]:
            out |= live[t]
        use, define = ud[pc]
        new = (use | (out & ~define)) & 0x3FF
        if new != live[pc]:
            live[pc] = new
            work.extend(preds[pc])
    return live


def run_time_loops(cfg: Cfg) -> dict[int, frozenset[int]]:
    """The loops a run-time budget may bound: loop header pc -> the backward jumps of the loop holding it,
    its strongly connected part of its function's flow graph. A jump backward is a jump to its own pc or
    before (fallthroughs and other jumps go forward), so every cycle takes one; a header is the target of
    one inside its part. Parts that make a bpf-to-bpf call are left out: a round through a call may reach
    the header again in another invocation of the function, where a budget on this loop's jumps alone
    would not bound the loop around the call."""
    succ = {i.pc: [t for t in _successors(i) if t in cfg.at and cfg.subprog_of[t] == cfg.subprog_of[i.pc]]
            for i in cfg.insns}
    part = _strong_parts(succ)
    backward: dict[int, list[int]] = {}
    for i in cfg.insns:
        if i.kind in ("jmp", "ja") and i.jump_target() <= i.pc and part[i.jump_target()] == part[i.pc]:
            backward.setdefault(part[i.pc], []).append(i.pc)
    calls = {part[i.pc] for i in cfg.insns if i.kind == "call" and i.src == isa.CALL_LOCAL}
    return {cfg.at[j].jump_target(): frozenset(jumps) for p, jumps in backward.items() if p not in calls
            for j in jumps}


def _strong_parts(succ: dict[int, list[int]]) -> dict[int, int]:
    """Tarjan's strongly connected components, without recursion: node -> the id of its component."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    part: dict[int, int] = {}
    stack: list[int] = []
    for root in succ:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, k = work.pop()
            if k == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
            if k < len(succ[node]):
                work.append((node, k + 1))
                nxt = succ[node][k]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt not in part:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                while True:
                    m = stack.pop()
                    part[m] = node
                    if m == node:
                        break
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return part
