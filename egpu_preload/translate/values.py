"""What the translator knows about registers and stack slots before each instruction of one frame.

A small forward dataflow over one subprogram (one inlined frame): constants, map references, and
pointers with a known region and offset. The code generator uses these facts to choose static local
addressing for the stack, to skip alignment checks where the base is known to be 8-byte aligned, to
fold constant-key array lookups into an address and to aggregate constant atomic adds across a warp.
Anything not understood becomes ``None`` (unknown), which is always safe: the generator then emits the
generic form.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..bpf import isa
from ..bpf.decode import Insn
from ..bpf.helpers import HELPERS

M64 = (1 << 64) - 1


@dataclass(frozen=True)
class Const:
    value: int  # unsigned 64-bit


@dataclass(frozen=True)
class MapRef:
    index: int  # lddw src=LDDW_MAP_IDX: the map itself, as helpers take it


@dataclass(frozen=True)
class Ptr:
    """A pointer ``off`` bytes into a region whose base is 8-byte aligned.

    Regions: ``fp<d>`` the 512-byte stack frame at call depth d (off counts from its top, so it is
    negative), ``map<i>`` a value of map i, ``ring<i>`` a record reserved in ring buffer i, ``arg`` what r1
    held on entry (the context, or the memory of execute_on_gpu).
    """

    region: str
    off: int


Value = Const | MapRef | Ptr | None


@dataclass(frozen=True)
class State:
    regs: tuple[Value, ...]                    # r0..r10
    stack: frozenset[tuple[int, int, int]]     # (offset from this frame's top, size, value) known constants

    def reg(self, n: int) -> Value:
        return self.regs[n]

    def set(self, n: int, v: Value) -> "State":
        regs = list(self.regs)
        regs[n] = v
        return replace(self, regs=tuple(regs))

    def stack_value(self, off: int, size: int) -> int | None:
        for o, s, v in self.stack:
            if o == off and s == size:
                return v
        return None


def entry_state(depth: int, args: dict[int, Value]) -> State:
    regs: list[Value] = [None] * isa.NUM_REGS
    for n, v in args.items():
        regs[n] = v
    regs[isa.FRAME_POINTER] = Ptr(f"fp{depth}", 0)
    return State(tuple(regs), frozenset())


def join(a: State, b: State) -> State:
    regs = tuple(x if x == y else None for x, y in zip(a.regs, b.regs))
    return State(regs, a.stack & b.stack)


def _sext32(v: int) -> int:
    return v & M64 if v >= 0 else (v + (1 << 64)) & M64


def _src_value(st: State, insn: Insn) -> Value:
    return Const(_sext32(insn.imm)) if insn.use_imm else st.reg(insn.src)


def _store_fact(st: State, depth: int, base: Value, off: int, size: int, value: Value) -> State:
    """Forget what a write of ``size`` bytes at base+off may overwrite; remember a constant written."""
    if isinstance(base, Ptr) and base.region != f"fp{depth}":
        return st  # another frame, a map value, the context: not tracked here
    if not isinstance(base, Ptr):
        return replace(st, stack=frozenset())  # may point anywhere, the stack included
    lo = base.off + off
    kept = {f for f in st.stack if f[0] + f[1] <= lo or f[0] >= lo + size}
    if isinstance(value, Const):
        kept.add((lo, size, value.value & ((1 << (8 * size)) - 1)))
    return replace(st, stack=frozenset(kept))


def transfer(st: State, insn: Insn, depth: int) -> State:
    """The state after ``insn`` (on every outgoing edge; branches do not refine)."""
    kind, d = insn.kind, insn.dst
    if kind == "mov":
        v = _src_value(st, insn)
        if insn.width == 32:
            v = Const(v.value & 0xFFFFFFFF) if isinstance(v, Const) else None
        return st.set(d, v)
    if kind == "alu":
        a, b = st.reg(d), _src_value(st, insn)
        if insn.width == 64 and insn.op in ("add", "sub") and isinstance(b, Const):
            delta = b.value - (1 << 64) if b.value >> 63 else b.value
            delta = delta if insn.op == "add" else -delta
            if isinstance(a, Const):
                return st.set(d, Const((a.value + delta) & M64))
            if isinstance(a, Ptr):
                return st.set(d, Ptr(a.region, a.off + delta))
        return st.set(d, None)
    if kind in ("neg", "end", "movsx"):
        return st.set(d, None)
    if kind == "lddw":
        if insn.src == isa.LDDW_IMM64:
            return st.set(d, Const(insn.imm))
        if insn.src == isa.LDDW_MAP_IDX:
            return st.set(d, MapRef(insn.imm & 0xFFFFFFFF))
        if insn.src == isa.LDDW_MAP_IDX_VALUE:
            return st.set(d, Ptr(f"map{insn.imm & 0xFFFFFFFF}", insn.imm >> 32))
        return st.set(d, None)
    if kind == "load":
        base = st.reg(insn.src)
        v: Value = None
        if isinstance(base, Ptr) and base.region == f"fp{depth}":
            known = st.stack_value(base.off + insn.off, insn.size)
            if known is not None:
                bits = 8 * insn.size
                if insn.spec.signed and known >> (bits - 1):
                    known = (known - (1 << bits)) & M64
                v = Const(known)
        return st.set(d, v)
    if kind == "store":
        return _store_fact(st, depth, st.reg(d), insn.off, insn.size, _src_value(st, insn))
    if kind == "atomic":
        st = _store_fact(st, depth, st.reg(d), insn.off, insn.size, None)
        if insn.atomic_op == "cmpxchg":
            return st.set(0, None)
        return st.set(insn.src, None) if insn.fetch else st
    if kind == "call":
        r0: Value = None
        helper = HELPERS.get(insn.imm) if insn.src == isa.CALL_HELPER else None
        m = st.reg(1)
        if helper and isinstance(m, MapRef):
            if helper.name == "map_lookup_elem":
                r0 = Ptr(f"map{m.index}", 0)
            elif helper.name == "ringbuf_reserve":
                r0 = Ptr(f"ring{m.index}", 0)
        regs = (r0, None, None, None, None, None) + st.regs[6:]
        return State(regs, frozenset())
    return st  # jmp, ja, exit


def successors(insn: Insn, next_pc: int) -> list[int]:
    if insn.kind == "exit":
        return []
    if insn.kind == "ja":
        return [insn.jump_target()]
    if insn.kind == "jmp":
        return [next_pc, insn.jump_target()]
    if insn.kind == "call" and insn.src == isa.CALL_HELPER and HELPERS.get(insn.imm) \
            and HELPERS[insn.imm].name == "exit":
        return []
    return [next_pc]


def analyze(insns: dict[int, Insn], entry: int, end: int, start: State, depth: int) -> dict[int, State]:
    """The state before each reachable instruction of the frame [entry, end)."""
    states: dict[int, State] = {entry: start}
    work = [entry]
    while work:
        pc = work.pop()
        insn = insns[pc]
        after = transfer(states[pc], insn, depth)
        for s in successors(insn, pc + insn.slots):
            if not entry <= s < end or s not in insns:
                continue  # the code generator reports the bad edge with its instruction
            old = states.get(s)
            new = after if old is None else join(old, after)
            if new != old:
                states[s] = new
                work.append(s)
    return states
