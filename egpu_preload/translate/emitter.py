"""The statements of one PTX ``.func`` under construction: registers, temporaries, frames, memory operands.

The handlers that translate instructions live in codegen.py (one per ``isa.OpSpec.kind``) and helpers in
helpers_ptx.py; both build on this module. Registers r0-r10 live in PTX ``.b64`` registers (``%r0``..``%r10``); local calls are
inlined, each inlined frame getting its own r6-r10 (``%d<depth>r6``..) and its own 512-byte slice of one
per-thread ``.local`` stack array, which exists only when the program touches r10. r1-r5 and r0 are
shared between frames, as the eBPF calling convention passes and clobbers them.

Memory operations use what ``values.analyze`` proves about their base: stack slots become
``ld/st.local`` at a static offset, accesses through a base known to be 8-byte aligned are emitted
directly, and anything else checks alignment at run time and falls back to byte accesses (a GPU faults
on a misaligned access, the VM does not).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..bpf import isa
from ..bpf.decode import Insn
from ..bpf.disasm import disasm_insn
from ..bpf.program import MapDef
from ..errors import TranslateError
from . import values
from .values import Ptr, State

M64 = (1 << 64) - 1
MAX_FRAMES = 8             # Linux MAX_CALL_FRAMES
MAX_LINES = 200_000        # refuse programs whose inlined calls explode
FRAME = isa.STACK_SIZE


@dataclass(frozen=True)
class Target:
    """What generated code may refer to besides its own registers."""

    tag: str                       # unique per probe object; prefixes every module-level name
    maps: tuple[MapDef, ...] = ()
    table: str | None = None       # the .const map table symbol; None: the program may use no maps
    exec_mode: bool = False        # execute_on_gpu: stack zeroed, r1 is global memory, as in the VM


def lit(v: int, bits: int = 64) -> str:
    """A PTX integer literal for the low ``bits`` of v (decimal when small, hex otherwise)."""
    v &= (1 << bits) - 1
    return str(v) if v < 1 << 31 else f"0x{v:X}"


def slit(v: int, bits: int = 64) -> str:
    """A literal for a signed-type operand (.s32/.s64): the low ``bits`` of v as a signed decimal."""
    v &= (1 << bits) - 1
    return str(v - (1 << bits) if v >> (bits - 1) else v)


def sext32(v: int) -> int:
    return v & M64


@dataclass(frozen=True)
class Addr:
    """Where a memory operand lives: ``[base+off]`` in ``space``; ``aligned`` None = unknown."""

    space: str   # ".local" or "" (generic)
    base: str    # symbol or register
    off: int
    aligned: bool | None

    def at(self, i: int = 0) -> str:
        return f"[{self.base}+{self.off + i}]"


class FuncGen:
    """Builds one ``.func`` from a program: its statements, temporaries and stack."""

    def __init__(self, insns: list[Insn], target: Target, handlers: dict) -> None:
        if not insns:
            raise TranslateError("empty program")
        self.target = target
        self.handlers = handlers  # isa kind -> handler(gen, insn, state)
        self.by_pc = {i.pc: i for i in insns}
        self.total = insns[-1].pc + insns[-1].slots
        entries = {0}
        for i in insns:
            if i.kind == "call" and i.src == isa.CALL_LOCAL:
                if i.call_target() not in self.by_pc:
                    raise TranslateError(f"local call into the middle of an instruction or out of the program "
                                         f"(target {i.call_target()})", insn=i.pc)
                entries.add(i.call_target())
            if i.kind == "call" and i.src == isa.CALL_BTF:
                raise TranslateError("kfunc calls are not supported", insn=i.pc)
        order = sorted(entries)
        self.frame_end = {e: (order[k + 1] if k + 1 < len(order) else self.total) for k, e in enumerate(order)}
        self.uses_stack = any(i.dst == isa.FRAME_POINTER or
                              (i.src == isa.FRAME_POINTER and not i.use_imm and i.kind not in ("lddw", "call"))
                              for i in insns)
        self.lines: list[str] = []
        self.pending: list[tuple[str, int, str]] = []  # helpers' early returns: (label, r0, join label)
        self.counts = {"t": 0, "w": 0, "p": 0, "L": 0, "i": 0}
        self.max_depth = 0
        # Emission context of the frame being emitted.
        self.depth = 0
        self.inst = 0
        self.chain: list[int] = []
        self.ret_label = "$Lexit"

    # ---- statements and temporaries -------------------------------------------------------
    def emit(self, s: str) -> None:
        self.lines.append("\t" + s)
        if len(self.lines) > MAX_LINES:
            raise TranslateError("program too large after inlining its calls")

    def place(self, label: str) -> None:
        self.lines.append(label + ":")

    def _new(self, kind: str) -> int:
        n = self.counts[kind]
        self.counts[kind] = n + 1
        return n

    def t64(self) -> str:
        return f"%t{self._new('t')}"

    def t32(self) -> str:
        return f"%w{self._new('w')}"

    def pred(self) -> str:
        return f"%p{self._new('p')}"

    def label(self) -> str:
        return f"$La{self._new('L')}"

    def reg(self, n: int) -> str:
        return f"%r{n}" if n <= 5 or self.depth == 0 else f"%d{self.depth}r{n}"

    def lo32(self, reg: str) -> str:
        w = self.t32()
        self.emit(f"cvt.u32.u64 {w}, {reg};")
        return w

    def src64(self, insn: Insn, signed: bool = False) -> str:
        if insn.use_imm:
            return slit(insn.imm) if signed else lit(sext32(insn.imm))
        return self.reg(insn.src)

    def src32(self, insn: Insn, signed: bool = False) -> str:
        if insn.use_imm:
            return slit(insn.imm, 32) if signed else lit(insn.imm, 32)
        return self.lo32(self.reg(insn.src))

    def fail(self, insn: Insn, reason: str) -> TranslateError:
        return TranslateError(f"{reason} ({disasm_insn(insn)})", insn=insn.pc)

    # ---- maps ---------------------------------------------------------------------------------
    def map_def(self, insn: Insn, index: int) -> MapDef:
        if self.target.table is None:
            raise self.fail(insn, "maps are not available here (execute_on_gpu runs programs without maps)")
        if not 0 <= index < len(self.target.maps):
            raise self.fail(insn, f"map index {index} out of range ({len(self.target.maps)} maps)")
        return self.target.maps[index]

    def map_base(self, index: int) -> str:
        """The device address of map ``index``'s region, from the module's map table."""
        t = self.t64()
        self.emit(f"ld.const.u64 {t}, [{self.target.table}+{8 * index}];")
        return t

    # ---- memory ---------------------------------------------------------------------------------
    def address(self, base_reg: int, st: State, off: int, size: int) -> Addr:
        f = st.reg(base_reg)
        reg = self.reg(base_reg)
        if isinstance(f, Ptr) and f.region.startswith("fp"):
            d = int(f.region[2:])
            k = FRAME * (d + 1) + f.off + off
            if FRAME * d <= k and k + size <= FRAME * (d + 1):
                return Addr(".local", "__stack", k, k % size == 0)
        if isinstance(f, Ptr):
            return Addr("", reg, off, (f.off + off) % size == 0)
        return Addr("", reg, off, None)

    def is_global(self, base_reg: int, st: State) -> bool:
        """Whether the base is known to point into global memory (maps; the memory of execute_on_gpu)."""
        f = st.reg(base_reg)
        return isinstance(f, Ptr) and (f.region.startswith(("map", "ring")) or
                                       (f.region == "arg" and self.target.exec_mode))

    def _checked(self, a: Addr, size: int, fast, slow) -> None:
        """Run ``fast(addr)`` when the generic address a is size-aligned, else ``slow(addr)``."""
        p = self.t64()
        self.emit(f"add.u64 {p}, {a.base}, {a.off};")
        m = self.t64()
        self.emit(f"and.b64 {m}, {p}, {size - 1};")
        pm = self.pred()
        self.emit(f"setp.ne.b64 {pm}, {m}, 0;")
        lslow, ldone = self.label(), self.label()
        self.emit(f"@{pm} bra {lslow};")
        fast(Addr("", p, 0, True))
        self.emit(f"bra {ldone};")
        self.place(lslow)
        slow(Addr("", p, 0, False))
        self.place(ldone)

    def load(self, dst: str, a: Addr, size: int, signed: bool = False) -> None:
        """dst = *(u|s size*)a, zero- or sign-extended to 64 bits."""
        ty = f"{'s' if signed else 'u'}{8 * size}"

        def fast(x: Addr) -> None:
            self.emit(f"ld{x.space}.{ty} {dst}, {x.at()};")

        def slow(x: Addr) -> None:
            acc = self.t64()
            self.emit(f"ld{x.space}.u8 {acc}, {x.at()};")
            for i in range(1, size):
                b = self.t64()
                self.emit(f"ld{x.space}.u8 {b}, {x.at(i)};")
                self.emit(f"shl.b64 {b}, {b}, {8 * i};")
                self.emit(f"or.b64 {acc}, {acc}, {b};")
            self.emit(f"cvt.s64.{ty} {dst}, {acc};" if signed else f"mov.b64 {dst}, {acc};")

        self._dispatch(a, size, fast, slow)

    def store(self, val: str | int, a: Addr, size: int) -> None:
        """*(u size*)a = val (a register name, or an int literal)."""

        def fast(x: Addr) -> None:
            v = lit(val, 8 * size) if isinstance(val, int) else val
            self.emit(f"st{x.space}.u{8 * size} {x.at()}, {v};")

        def slow(x: Addr) -> None:
            for i in range(size):
                if isinstance(val, int):
                    self.emit(f"st{x.space}.u8 {x.at(i)}, {(val >> 8 * i) & 0xFF};")
                else:
                    b = self.t64()
                    self.emit(f"shr.u64 {b}, {val}, {8 * i};")
                    self.emit(f"st{x.space}.u8 {x.at(i)}, {b};")

        self._dispatch(a, size, fast, slow)

    def _dispatch(self, a: Addr, size: int, fast, slow) -> None:
        if size == 1 or a.aligned:
            fast(a)
        elif a.aligned is False:
            slow(a)
        else:
            self._checked(a, size, fast, slow)

    # ---- frames -----------------------------------------------------------------------------
    def emit_frame(self, entry: int, start: State) -> None:
        """Emit the subprogram at ``entry`` as the current frame (self.depth, self.inst)."""
        end = self.frame_end[entry]
        states = values.analyze(self.by_pc, entry, end, start, self.depth)
        targets = set()
        for pc, insn in self.by_pc.items():
            if entry <= pc < end and insn.kind in ("jmp", "ja"):
                t = insn.jump_target()
                if not entry <= t < end:
                    raise self.fail(insn, f"jump to {t} leaves its function [{entry}, {end})")
                if t not in self.by_pc:
                    raise self.fail(insn, f"jump to {t}, the middle of an lddw")
                targets.add(t)
        last = None
        for pc in range(entry, end):
            insn = self.by_pc.get(pc)
            if insn is None:
                continue
            if pc in targets:
                self.place(self.jump_label(pc))
            last = insn
            if pc not in states:
                continue  # unreachable: nothing to emit
            self.lines.append(f"\t// {pc}: {disasm_insn(insn)}")
            self.handlers[insn.kind](self, insn, states[pc])
        if last is not None and last.pc in states and values.successors(last, end) == [end]:
            raise self.fail(last, "execution falls off the end of the function")
        if last is not None and last.kind == "jmp" and last.pc in states:
            raise self.fail(last, "execution falls off the end of the function")

    def jump_label(self, pc: int) -> str:
        return f"$L{self.inst}_{pc}"

    def inline_call(self, insn: Insn, st: State) -> None:
        callee = insn.call_target()
        if callee in self.chain and not self.target.exec_mode:
            raise self.fail(insn, "recursive call")
        if self.depth + 1 >= MAX_FRAMES:
            if not self.target.exec_mode:
                raise self.fail(insn, f"call depth exceeds {MAX_FRAMES} frames")
            # The VM runs bounded recursion and refuses this call; execute_on_gpu stops with r0 = 0.
            self.emit("mov.b64 %r0, 0;")
            self.emit("bra $Lexit;")
            return
        saved = (self.depth, self.inst, self.ret_label)
        self.depth += 1
        self.max_depth = max(self.max_depth, self.depth)
        self.inst = self._new("i") + 1
        self.ret_label = f"$Lret{self.inst}"
        self.chain.append(callee)
        if self.uses_stack:
            self.emit(f"add.u64 {self.reg(10)}, %stack, {FRAME * (self.depth + 1)};")
            self.zero_frame()
        start = values.entry_state(self.depth, {n: st.reg(n) for n in range(1, 6)})
        self.emit_frame(callee, start)
        self.place(self.ret_label)
        self.chain.pop()
        self.depth, self.inst, self.ret_label = saved

    def zero_frame(self) -> None:
        """execute_on_gpu only: the VM gives every frame a fresh zeroed stack; so does this."""
        if not (self.target.exec_mode and self.uses_stack):
            return
        p, e, done = self.t64(), self.t64(), self.pred()
        self.emit(f"mov.u64 {p}, __stack;")
        self.emit(f"add.u64 {e}, {p}, {FRAME * (self.depth + 1)};")
        self.emit(f"add.u64 {p}, {p}, {FRAME * self.depth};")
        loop = self.label()
        self.place(loop)
        self.emit(f"st.local.u64 [{p}], 0;")
        self.emit(f"add.u64 {p}, {p}, 8;")
        self.emit(f"setp.lt.u64 {done}, {p}, {e};")
        self.emit(f"@{done} bra {loop};")

    # ---- the function ---------------------------------------------------------------------
    def body(self) -> None:
        """Emit the whole program: the main function at pc 0 and, inlined, everything it calls."""
        self.chain = [0]
        self.zero_frame()
        start = values.entry_state(0, {1: Ptr("arg", 0)})
        self.emit_frame(0, start)
        self.place("$Lexit")

    def declarations(self) -> list[str]:
        decls = ["\t.reg .b64 %r<11>;"]
        decls += [f"\t.reg .b64 %d{d}r<11>;" for d in range(1, self.max_depth + 1)]
        for kind, ty in (("t", ".b64"), ("w", ".b32"), ("p", ".pred")):
            if self.counts[kind]:
                decls.append(f"\t.reg {ty} %{kind}<{self.counts[kind]}>;")
        if self.uses_stack:
            decls.append("\t.reg .b64 %stack;")
            decls.append(f"\t.local .align 8 .b8 __stack[{FRAME * (self.max_depth + 1)}];")
        return decls

    def prologue(self, params: list[str]) -> list[str]:
        out = [f"\tld.param.b64 %r{n + 1}, [{p}];" for n, p in enumerate(params)]
        # eBPF leaves other registers undefined; zero them so every run is deterministic (free after ptxas).
        out += [f"\tmov.b64 %r{n}, 0;" for n in range(0, 10) if not 1 <= n <= len(params)]
        if self.uses_stack:
            out.append("\tcvta.local.u64 %stack, __stack;")
            out.append(f"\tadd.u64 %r10, %stack, {FRAME};")
        return out
