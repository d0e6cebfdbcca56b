"""The statements of one PTX ``.func`` under construction: registers, temporaries, frames, memory operands.

The handlers that translate instructions live in codegen.py (one per ``isa.OpSpec.kind``) and helpers in
helpers_ptx.py; both build on this module. Registers r0-r10 live in PTX ``.b64`` registers
(``%r0``..``%r10``); local calls are inlined, each inlined frame getting its own r6-r10 (``%d<depth>r6``..)
and its own slice of one per-thread ``.local`` stack array. r1-r5 and r0 are shared between frames, as
the eBPF calling convention passes and clobbers them. bpf_loop is a PTX loop around its callback, inlined
so too (the verifier names the callback of each call: VerifiedProgram.callbacks).

What the verifier proved (bpf/verifier VerifiedProgram) decides the code: each frame is as large as its
function's stack depth (no ``.local`` at all when no function uses the stack); accesses through r10 are
``ld/st.local`` at a static offset, other stack accesses ``ld/st.local``, map values and ringbuf records
``ld/st.global``, and only the context and "mixed" bases stay generic; every access is aligned (the
verifier checks that). A budgeted backward jump (VerifiedProgram.budgeted: a directly-run program's loop
the verifier could not bound) counts down ``%loops``, LOOP_BUDGET at entry, and past it goes to ``$Lcut``,
which ends the probe as helper 507 does; programs without one have neither. Programs the verifier refuses
still run in execute_on_gpu (vm.execute's contract covers them): without facts, frames are 512 bytes and
zeroed as the VM's are, and accesses check alignment at run time and fall back to byte accesses (a GPU
faults on a misaligned access, the VM does not).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..bpf import isa
from ..bpf.ctx import NO_ADDRESS
from ..bpf.decode import Insn
from ..bpf.disasm import disasm_insn
from ..bpf.helpers import HELPERS, MAX_LOOPS
from ..bpf.program import MapDef
from ..bpf.verifier import LOOP_BUDGET, VerifiedProgram
from ..errors import TranslateError
from ..maps import E2BIG, EINVAL

M64 = (1 << 64) - 1
MAX_FRAMES = 8             # Linux MAX_CALL_FRAMES
MAX_LINES = 200_000        # refuse programs whose inlined calls explode
FRAME = isa.STACK_SIZE     # a frame of a program the verifier refused
# Where the verifier proves an access goes: the PTX state space to address it in.
SPACES = {"stack": ".local", "map_value": ".global", "ringbuf_mem": ".global", "ctx": "", "mixed": ""}


@dataclass(frozen=True)
class Target:
    """What generated code may refer to besides its own registers."""

    tag: str                       # unique per probe object; prefixes every module-level name
    maps: tuple[MapDef, ...] = ()
    table: str | None = None       # the .const map table symbol; None: the program may use no maps
    # The table's address arrives as a second parameter (TABLE_PARAM) instead: patch modules of the SASS
    # back end are loaded by the Compute Sanitizer, so nobody can fill a .const table in them.
    table_param: bool = False
    # The context in registers: the 8-byte words of struct egpu_ctx the program reads arrive as
    # parameters (ctx_word_param), r1 holds ctx.NO_ADDRESS and every ctx load reads a word register.
    # None: r1 is the context's generic address and ctx loads read memory.
    ctx_words: tuple[int, ...] | None = None


def ctx_word_param(word: int) -> str:
    return f"%cw{word}"


def ctx_word_reg(word: int) -> str:
    return f"%c{word}"


TABLE_PARAM, TABLE_REG = "%maps", "%maptab"
# Where a kernel's own code reads the launch dimensions of struct egpu_ctx (its .x, .y, .z elements).
DIM_REGISTERS = {"grid": "%nctaid", "block": "%ntid"}


def packed_word(reg: str, constant: str, parts: Sequence[tuple[Sequence[str], int]], narrow: str,
                wide: str) -> list[str]:
    """PTX leaving a context word in ``reg``: ``constant``, with each 32-bit part, which its code leaves in
    ``narrow``, shifted into its place (bits) through ``wide``."""
    out = [f"mov.b64 {reg}, {constant};"]
    for code, shift in parts:
        out += [*code, f"cvt.u64.u32 {wide}, {narrow};"]
        out += [f"shl.b64 {wide}, {wide}, {shift};"] if shift else []
        out.append(f"or.b64 {reg}, {reg}, {wide};")
    return out


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

    space: str   # ".local", ".global" or "" (generic)
    base: str    # symbol or register
    off: int
    aligned: bool | None

    def at(self, i: int = 0) -> str:
        return f"[{self.base}+{self.off + i}]"


def successors(insn: Insn, next_pc: int) -> list[int]:
    """Where control may go after insn (a helper ``exit`` ends the probe)."""
    if insn.kind == "exit":
        return []
    if insn.kind == "ja":
        return [insn.jump_target()]
    if insn.kind == "jmp":
        return [next_pc, insn.jump_target()]
    if insn.kind == "call" and insn.src == isa.CALL_HELPER and insn.imm in HELPERS \
            and HELPERS[insn.imm].name == "exit":
        return []
    return [next_pc]


def round8(n: int) -> int:
    return (n + 7) // 8 * 8


class FuncGen:
    """Builds one ``.func`` from a program: its statements, temporaries and stack."""

    def __init__(self, insns: list[Insn], target: Target, handlers: dict,
                 verified: VerifiedProgram | None) -> None:
        if not insns:
            raise TranslateError("empty program")
        self.target = target
        self.handlers = handlers  # isa kind -> handler(gen, insn)
        self.verified = verified
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
            if i.callback in self.by_pc:
                entries.add(i.callback)   # a callback: a function of its own
        order = sorted(entries)
        self.frame_end = {e: (order[k + 1] if k + 1 < len(order) else self.total) for k, e in enumerate(order)}
        if verified is not None:
            self.frame_size = {e: round8(d) for e, d in zip(verified.subprogs, verified.stack_depth)}
            self.uses_stack = any(self.frame_size.values())
        else:
            self.frame_size = dict.fromkeys(order, FRAME)
            self.uses_stack = any(i.dst == isa.FRAME_POINTER or
                                  (i.src == isa.FRAME_POINTER and not i.use_imm and i.kind not in ("lddw", "call"))
                                  for i in insns)
        self.lines: list[str] = []
        self.pending: list[tuple[str, int, str]] = []  # helpers' early returns: (label, r0, join label)
        self.counts = {"t": 0, "w": 0, "p": 0, "L": 0, "i": 0}
        self.max_depth = 0
        self.stack_bytes = 0
        # Emission context of the frame being emitted: its depth, instance, stack slice [base, top).
        self.depth = 0
        self.inst = 0
        self.base = self.top = 0
        self.ret_label = "$Lexit"
        self.reads_table = False   # a .const map table load was emitted: the prologue checks it is filled
        self.call_map: int | None = None   # the map a helper call is emitted for (helpers_ptx.emit_helper)
        self.unfilled: tuple[str, str] | None = None   # that check's registers, once body() is done

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

    # ---- the verifier's facts (none for a program it refused) ---------------------------------
    def const(self, pc: int) -> int | None:
        """The constant operand of the instruction at pc on every path (VerifiedProgram.consts)."""
        return self.verified.consts.get(pc) if self.verified is not None else None

    def map_index(self, insn: Insn, reg: int) -> int:
        """The map a helper call passes in r<reg>: the same on every path, or the one emit_helper emits it for."""
        if self.call_map is not None:
            return self.call_map
        index = self.verified.maps.get(insn.pc) if self.verified is not None else None
        if index is None:
            why = "different maps on different paths" if self.verified is not None else "an unverified program"
            raise self.fail(insn, f"r{reg} is not a map known at translation time ({why})")
        return index

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
        self.table_entry(t, index)
        return t

    def table_entry(self, dst: str, index: int) -> None:
        """dst = entry ``index`` of the map table (the .const symbol, or global memory at TABLE_PARAM)."""
        if self.target.table_param:
            self.emit(f"ld.global.u64 {dst}, [{TABLE_REG}+{8 * index}];")
        else:
            self.reads_table = True
            self.emit(f"ld.const.u64 {dst}, [{self.target.table}+{8 * index}];")

    # ---- memory ---------------------------------------------------------------------------------
    def address(self, insn: Insn, base_reg: int, size: int) -> Addr:
        """The operand of the load, store or atomic insn through r<base_reg> + insn.off."""
        reg, off = self.reg(base_reg), insn.off
        verified = self.verified is not None
        if base_reg == isa.FRAME_POINTER:  # r10 is the frame's top, read-only: a static local address
            k = self.top + off
            if self.base <= k and k + size <= self.top:
                return Addr(".local", "__stack", k, verified or k % size == 0)
        if not verified:
            return Addr("", reg, off, None)
        space = SPACES[self.verified.regions[insn.pc]]
        if space:  # the register holds a generic address; PTX addresses a state space by its window
            t = self.t64()
            self.emit(f"cvta.to{space}.u64 {t}, {reg};")
            reg = t
        return Addr(space, reg, off, True)

    def arg(self, insn: Insn, reg: int, size: int) -> Addr:
        """The operand *(size *)r<reg> of a helper call: a static local address when the verifier saw
        a slot of this frame passed, else generic; aligned where it proved so."""
        facts = self.verified
        off = facts.arg_stack.get((insn.pc, reg)) if facts is not None else None
        if off is not None:
            return Addr(".local", "__stack", self.top + off, (self.top + off) % size == 0)
        align = self.arg_align(insn, reg)
        return Addr("", self.reg(reg), 0, None if align is None else align >= size)

    def arg_align(self, insn: Insn, reg: int) -> int | None:
        """The alignment (1-8) proven for the helper call's pointer argument r<reg>; None when unknown."""
        return self.verified.arg_align.get((insn.pc, reg)) if self.verified is not None else None

    def misaligned(self, addr: str, size: int) -> str:
        """A predicate: the generic address in register addr is not size-aligned."""
        m, p = self.t64(), self.pred()
        self.emit(f"and.b64 {m}, {addr}, {size - 1};")
        self.emit(f"setp.ne.b64 {p}, {m}, 0;")
        return p

    def either(self, slow_if: str, fast: Callable[[], None], slow: Callable[[], None]) -> None:
        """fast() where the predicate slow_if is false, slow() where it is true."""
        lslow, ldone = self.label(), self.label()
        self.emit(f"@{slow_if} bra {lslow};")
        fast()
        self.emit(f"bra {ldone};")
        self.place(lslow)
        slow()
        self.place(ldone)

    def _checked(self, a: Addr, size: int, fast, slow) -> None:
        """Run ``fast(addr)`` when the generic address a is size-aligned, else ``slow(addr)``."""
        p = self.t64()
        self.emit(f"add.u64 {p}, {a.base}, {a.off};")
        self.either(self.misaligned(p, size), lambda: fast(Addr("", p, 0, True)), lambda: slow(Addr("", p, 0, False)))

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
    def _reachable(self, entry: int, end: int) -> set[int] | frozenset[int]:
        """The instructions to emit: those the verifier saw executed, else those control can reach."""
        if self.verified is not None:
            return self.verified.reached
        seen, work = {entry}, [entry]
        while work:
            insn = self.by_pc[work.pop()]
            for s in successors(insn, insn.pc + insn.slots):
                if entry <= s < end and s in self.by_pc and s not in seen:
                    seen.add(s)
                    work.append(s)
        return seen

    def emit_frame(self, entry: int) -> None:
        """Emit the subprogram at ``entry`` as the current frame (self.depth, self.inst)."""
        end = self.frame_end[entry]
        reached = self._reachable(entry, end)
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
            if pc not in reached:
                continue  # unreachable: nothing to emit
            self.lines.append(f"\t// {pc}: {disasm_insn(insn)}")
            self.handlers[insn.kind](self, insn)
        if last is not None and last.pc in reached and (successors(last, end) == [end] or last.kind == "jmp"):
            raise self.fail(last, "execution falls off the end of the function")

    def jump_label(self, pc: int) -> str:
        return f"$L{self.inst}_{pc}"

    def _enter(self, entry: int) -> None:
        """The stack slice of the function at ``entry``, right below its caller's, and its r10."""
        self.base = self.top
        self.top = self.base + self.frame_size[entry]
        self.stack_bytes = max(self.stack_bytes, self.top)
        fp = self.reg(isa.FRAME_POINTER)
        self.emit(f"add.u64 {fp}, %stack, {self.top};" if self.uses_stack else f"mov.b64 {fp}, 0;")
        self.zero_frame()

    def inline_call(self, insn: Insn) -> None:
        self.inline(insn.call_target())

    def inline(self, callee: int) -> None:
        """The function at ``callee`` emitted here as a new frame; its exit comes to the end of its code."""
        if self.depth + 1 >= MAX_FRAMES:
            # Only a program the verifier refused recurses (execute_on_gpu): the VM runs bounded
            # recursion and refuses this call; the GPU stops with r0 = 0.
            self.emit("mov.b64 %r0, 0;")
            self.emit("bra $Lexit;")
            return
        saved = (self.depth, self.inst, self.ret_label, self.base, self.top)
        self.depth += 1
        self.max_depth = max(self.max_depth, self.depth)
        self.inst = self._new("i") + 1
        self.ret_label = f"$Lret{self.inst}"
        self._enter(callee)
        self.emit_frame(callee)
        self.place(self.ret_label)
        self.depth, self.inst, self.ret_label, self.base, self.top = saved

    def loop_call(self, insn: Insn) -> None:
        """bpf_loop(nr_loops, callback, ctx, flags), as vm/machine.py runs it: -EINVAL for flags, -E2BIG past
        MAX_LOOPS rounds (nr_loops' low 32 bits), else r0 = the rounds the callback ran (r1 the index, r2 the
        ctx, r3-r5 zero) until it returned non-zero (1) or ran them all."""
        callback = self.verified.callbacks.get(insn.pc) if self.verified is not None else None
        if callback is None:
            raise self.fail(insn, "bpf_loop's callback is known from the verifier: an unverified program has none")
        rounds, index, ctx, p = self.t64(), self.t64(), self.t64(), self.pred()
        top, out, done = self.label(), self.label(), self.label()
        self.emit(f"mov.b64 %r0, {lit(-EINVAL)};")
        self.emit(f"setp.ne.u64 {p}, %r4, 0;")
        self.emit(f"@{p} bra {done};")
        self.emit(f"and.b64 {rounds}, %r1, {lit(0xFFFFFFFF)};")
        self.emit(f"mov.b64 %r0, {lit(-E2BIG)};")
        self.emit(f"setp.gt.u64 {p}, {rounds}, {MAX_LOOPS};")
        self.emit(f"@{p} bra {done};")
        self.emit(f"mov.b64 {ctx}, %r3;")
        self.emit(f"mov.b64 {index}, 0;")
        self.place(top)
        self.emit(f"setp.ge.u64 {p}, {index}, {rounds};")
        self.emit(f"@{p} bra {out};")
        self.emit(f"mov.b64 %r1, {index};")
        self.emit(f"mov.b64 %r2, {ctx};")
        for r in (3, 4, 5):
            self.emit(f"mov.b64 %r{r}, 0;")
        self.inline(callback)
        self.emit(f"add.u64 {index}, {index}, 1;")
        self.emit(f"setp.eq.u64 {p}, %r0, 0;")
        self.emit(f"@{p} bra {top};")
        self.place(out)
        self.emit(f"mov.b64 %r0, {index};")
        self.place(done)

    def zero_frame(self) -> None:
        """The VM gives every frame a fresh zeroed stack; for a program the verifier refused (so one
        that may read stack it never wrote) execute_on_gpu does too."""
        if self.verified is not None or not self.uses_stack:
            return
        p, e, done = self.t64(), self.t64(), self.pred()
        self.emit(f"mov.u64 {p}, __stack;")
        self.emit(f"add.u64 {e}, {p}, {self.top};")
        self.emit(f"add.u64 {p}, {p}, {self.base};")
        loop = self.label()
        self.place(loop)
        self.emit(f"st.local.u64 [{p}], 0;")
        self.emit(f"add.u64 {p}, {p}, 8;")
        self.emit(f"setp.lt.u64 {done}, {p}, {e};")
        self.emit(f"@{done} bra {loop};")

    # ---- budgeted loops ------------------------------------------------------------------------
    @property
    def budgeted(self) -> frozenset[int]:
        return self.verified.budgeted if self.verified is not None else frozenset()

    def charge(self, insn: Insn, taken: str | None = None) -> None:
        """Before a budgeted backward jump (where predicate ``taken`` holds, when it is conditional): one
        round off ``%loops``, or, with none left, to ``$Lcut`` instead."""
        if insn.pc not in self.budgeted:
            return
        out = self.pred()
        self.emit(f"setp.eq.and.u32 {out}, %loops, 0, {taken};" if taken else f"setp.eq.u32 {out}, %loops, 0;")
        self.emit(f"@{out} bra $Lcut;")
        self.emit(f"{f'@{taken} ' if taken else ''}sub.u32 %loops, %loops, 1;")

    # ---- the function ---------------------------------------------------------------------
    def body(self, cut: Callable[["FuncGen"], None]) -> None:
        """Emit the whole program: the main function at pc 0 and, inlined, everything it calls; then, where
        a loop is budgeted, ``$Lcut``: ``cut`` counts the run's end, and it ends as helper 507 ends it."""
        self._enter(0)
        self.emit_frame(0)
        if self.budgeted:   # main's last instruction is an exit or a goto: nothing falls in here
            self.place("$Lcut")
            cut(self)
            self.emit("mov.b64 %r0, 0;")
        self.place("$Lexit")
        if self.reads_table:
            self.unfilled = (self.t64(), self.pred())

    def ctx_load(self, insn: Insn) -> bool:
        """dst = the context bytes a load reads, from the word registers (Target.ctx_words); False when
        the context is in memory. Each ctx load reads one aligned field, inside one word."""
        words = self.target.ctx_words
        if words is None or self.verified is None or self.verified.regions.get(insn.pc) != "ctx":
            return False
        off = self.verified.ctx_at[insn.pc]   # probe_function checked it is known
        word, shift, bits = off // 8, 8 * (off % 8), 8 * insn.size
        src, d = ctx_word_reg(word), self.reg(insn.dst)
        if bits == 64:
            self.emit(f"mov.b64 {d}, {src};")
            return True
        if shift:
            t = self.t64()
            self.emit(f"shr.u64 {t}, {src}, {shift};")
            src = t
        if insn.spec.signed:
            self.emit(f"cvt.s64.s{bits} {d}, {src};")
        else:
            self.emit(f"and.b64 {d}, {src}, {lit((1 << bits) - 1)};")
        return True

    def declarations(self) -> list[str]:
        decls = ["\t.reg .b64 %r<11>;"] + (["\t.reg .b32 %loops;"] if self.budgeted else [])
        if self.target.table_param:
            decls.append(f"\t.reg .b64 {TABLE_REG};")
        decls += [f"\t.reg .b64 {ctx_word_reg(w)};" for w in self.target.ctx_words or ()]
        decls += [f"\t.reg .b64 %d{d}r<11>;" for d in range(1, self.max_depth + 1)]
        for kind, ty in (("t", ".b64"), ("w", ".b32"), ("p", ".pred")):
            if self.counts[kind]:
                decls.append(f"\t.reg {ty} %{kind}<{self.counts[kind]}>;")
        if self.uses_stack:
            decls.append("\t.reg .b64 %stack;")
            decls.append(f"\t.local .align 8 .b8 __stack[{self.stack_bytes}];")
        return decls

    def prologue(self, params: list[str]) -> list[str]:
        out = [f"\tld.param.b64 %r{n + 1}, [{p}];" for n, p in enumerate(params)]
        if self.target.table_param:
            out.append(f"\tld.param.b64 {TABLE_REG}, [{TABLE_PARAM}];")
        out += [f"\tld.param.b64 {ctx_word_reg(w)}, [{ctx_word_param(w)}];" for w in self.target.ctx_words or ()]
        if self.target.ctx_words is not None:
            out.append(f"\tmov.b64 %r1, {lit(NO_ADDRESS)};")
        # eBPF leaves other registers undefined; zero them so every run is deterministic (free after ptxas).
        out += [f"\tmov.b64 %r{n}, 0;" for n in range(0, 10)
                if not 1 <= n <= len(params) and not (n == 1 and self.target.ctx_words is not None)]
        if self.uses_stack:
            out.append("\tcvta.local.u64 %stack, __stack;")
        if self.budgeted:
            out.append(f"\tmov.b32 %loops, {LOOP_BUDGET};")
        return out + self.table_check()

    def table_check(self) -> list[str]:
        """Leave at once, r0 = 0, where the module's map table is unfilled: a module the runtime loaded in one
        context and the kernel runs in another (another device's, a second context on one device: the maps
        live in one, instrumenter.py) has a table of zeros, and map headers read at address 0 would fault
        the application's kernel. The last entry, the trace ring's, is never 0 once the table is filled
        (devmaps.DeviceMaps.table writes every entry at once)."""
        if self.unfilled is None:
            return []
        addr, unfilled = self.unfilled
        return [f"\tld.const.u64 {addr}, [{self.target.table}+{8 * len(self.target.maps)}];",
                f"\tsetp.eq.u64 {unfilled}, {addr}, 0;", f"\t@{unfilled} bra $Lexit;"]
