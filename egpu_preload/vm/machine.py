"""The reference interpreter: RFC 9669 to the letter, the oracle the GPU translator is checked against.

Each instruction is turned once into a closure ``op(run) -> next pc`` by the builder for its kind
(``BUILDERS``); running is a loop over those closures with an instruction budget. Registers hold
unsigned 64-bit ints. Arithmetic, conditions and atomics are bpf/alu.py's (RFC 9669 4.1-4.3, 5.3;
the verifier folds constants with the same functions). The other rules the GPU translator must match:

- a local call gets a fresh 512-byte frame and its own r10; r6-r9 and r10 are restored on return
  (RFC 9669 4.3, program-local functions; the BPF ABI makes r6-r9 callee-saved and r10 read-only);
- bpf_loop (helpers.py) calls its callback as a local call, r1 the index, r2 the ctx, r3-r5 zero (Linux's
  callback(i, ctx, 0, 0, 0)), a fresh frame each round; the callback's exit ends the round (Run.end_round);
  an lddw of a function's address gives a handle (FUNC_HANDLE_BASE + its pc), as a map's does;
- atomics must be naturally aligned, as on the GPU (and the kernel verifier) - the VM refuses otherwise;
- a budgeted backward jump (bpf/verifier's VerifiedProgram.budgeted: a loop of a directly-run program the
  verifier could not bound) spends one of the run's LOOP_BUDGET when taken; the one past them ends the
  program as helper 507 (exit) does, r0 = 0, and counts the cut in the maps' state (MapsState.loops_cut).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence

from ..bpf import alu, isa
from ..bpf.alu import MASKS
from ..bpf.decode import Insn, decode
from ..bpf.helpers import LOOP, MAX_LOOPS
from ..bpf.disasm import disasm_insn
from ..bpf.program import MapDef
from ..bpf.verifier import LOOP_BUDGET
from ..errors import EgpuError, VmError
from ..maps import E2BIG, EINVAL, MapsState, RingbufStorage
from . import calls
from .memory import MASK64, REGION_SHIFT, Memory
from .thread import Dim3, ThreadSim, grid_threads
from .warps import Warps

DEFAULT_BUDGET = 10_000_000
MAX_FRAMES = 8  # the kernel's MAX_CALL_FRAMES
# Map references (lddw map[N]) become handles in an address range no region ever occupies.
MAP_HANDLE_BASE = ((1 << 27) - 1) << REGION_SHIFT
# Functions' addresses (lddw of a callback) are handles past every map's.
FUNC_HANDLE_BASE = MAP_HANDLE_BASE + (1 << 32)
STOP = -1  # the pc returned when the outermost frame exits
ROUND = -2  # the return pc of a bpf_loop callback's frame: its exit ends the round

Op = Callable[["Run"], int]


class Run:
    """The state of one execution: registers, memory, call frames, open ringbuf reservations."""

    def __init__(self, vm: "Vm", mem: Memory, thread: ThreadSim) -> None:
        self.vm = vm
        self.mem = mem
        self.thread = thread
        self.regs = [0] * isa.NUM_REGS
        self.frames: list[tuple[int, list[int], int]] = []  # (return pc, caller r6-r9, caller frame base)
        self.frame = mem.add("stack frame 0", bytearray(isa.STACK_SIZE), writable=True)
        self.regs[isa.FRAME_POINTER] = self.frame + isa.STACK_SIZE
        self.reservations: dict[int, tuple[RingbufStorage, bytearray]] = {}
        self.loops = LOOP_BUDGET   # budgeted backward jumps this run may still take
        self.rounds: list[list[int]] = []   # bpf_loop calls under way, innermost last: [callback pc, ctx,
                                            # nr_loops, index, the pc after the call]

    def push_frame(self, ret: int) -> None:
        """A local call's fresh frame; ``ret`` is where the callee's exit goes."""
        if len(self.frames) + 1 >= MAX_FRAMES:
            raise VmError(f"call depth exceeds {MAX_FRAMES} frames")
        r = self.regs
        self.frames.append((ret, r[6:10], self.frame))
        self.frame = self.mem.add(f"stack frame {len(self.frames)}", bytearray(isa.STACK_SIZE), writable=True)
        r[isa.FRAME_POINTER] = self.frame + isa.STACK_SIZE

    def enter_round(self) -> int:
        """The innermost bpf_loop's next round: its callback called, r1 the index, r2 the ctx, r3-r5 zero."""
        callback, ctx, _, index, _ = self.rounds[-1]
        self.push_frame(ROUND)
        self.regs[1:6] = [index, ctx, 0, 0, 0]
        return callback

    def end_round(self) -> int:
        """The callback returned: a non-zero r0 (1: the verifier allows no other) or the last index ends the
        loop with r0 = the rounds made (Linux's bpf_loop), else the next round starts."""
        loop = self.rounds[-1]
        loop[3] += 1
        if self.regs[0] or loop[3] == loop[2]:
            self.rounds.pop()
            self.regs[0] = loop[3]
            return loop[4]
        return self.enter_round()

    def back_edge(self) -> bool:
        """A budgeted backward jump: whether it is taken; once LOOP_BUDGET were, the run ends as helper 507
        ends it, the cut counted."""
        if self.loops:
            self.loops -= 1
            return True
        self.vm.state.loops_cut += 1
        calls.exit(self)   # r0 = 0, as helper 507 leaves it
        return False

    def map_index(self, handle: int, what: str, reg: int | None = None) -> int:
        """The map a handle names; else a fault naming ``what`` (and ``reg``: "what's rN")."""
        index = handle - MAP_HANDLE_BASE
        if not 0 <= index < len(self.vm.state.storages):
            name = what if reg is None else f"{what}'s r{reg}"
            raise VmError(f"{name} is not a map (0x{handle:x})")
        return index


def _fail(reason: str) -> Op:
    def op(run: Run) -> int:
        raise VmError(reason)
    return op


def _alu(i: Insn, nxt: int) -> Op:
    """dst = dst OP src|imm; imm sign-extended to 64 bits, then both truncated to the width."""
    f, n, m, dst, src = alu.BINARY[i.op], i.width, MASKS[i.width], i.dst, i.src
    if i.use_imm:
        k = i.imm & m

        def op(run: Run) -> int:
            r = run.regs
            r[dst] = f(r[dst] & m, k, n)
            return nxt
        return op

    def op_reg(run: Run) -> int:
        r = run.regs
        r[dst] = f(r[dst] & m, r[src] & m, n)
        return nxt
    return op_reg


def _mov(i: Insn, nxt: int) -> Op:
    m, dst, src = MASKS[i.width], i.dst, i.src
    if i.use_imm:
        k = i.imm & m  # mov64 sign-extends imm; mov32 zero-extends its low 32 bits

        def op(run: Run) -> int:
            run.regs[dst] = k
            return nxt
        return op

    def op_reg(run: Run) -> int:
        run.regs[dst] = run.regs[src] & m
        return nxt
    return op_reg


def _unary(f: Callable[[int], int], dst: int, src: int, nxt: int) -> Op:
    def op(run: Run) -> int:
        run.regs[dst] = f(run.regs[src])
        return nxt
    return op


def _movsx(i: Insn, nxt: int) -> Op:
    """dst = (s8|s16|s32) src, extended to the width (32-bit results then zero-extended)."""
    return _unary(functools.partial(alu.movsx, i.width, 8 * i.size), i.dst, i.src, nxt)


def _neg(i: Insn, nxt: int) -> Op:
    return _unary(functools.partial(alu.neg, i.width), i.dst, i.dst, nxt)


def _end(i: Insn, nxt: int) -> Op:
    """le: truncate to imm bits (this is a little-endian machine); be/bswap: reverse imm/8 bytes."""
    return _unary(functools.partial(alu.byteswap, i.op, i.imm), i.dst, i.dst, nxt)


def _lddw(i: Insn, nxt: int) -> Op:
    dst, imm = i.dst, i.imm
    if i.src == isa.LDDW_IMM64:
        def op(run: Run) -> int:
            run.regs[dst] = imm
            return nxt
        return op
    if i.src == isa.LDDW_MAP_IDX:
        what = f"map[{imm}]"

        def op_map(run: Run) -> int:
            run.regs[dst] = MAP_HANDLE_BASE + run.map_index(MAP_HANDLE_BASE + imm, what)
            return nxt
        return op_map
    if i.src == isa.LDDW_MAP_IDX_VALUE:
        index, off = imm & 0xFFFFFFFF, imm >> 32
        what = f"map_value[{index}]"

        def op_value(run: Run) -> int:
            value = calls.map_value_address(run, run.map_index(MAP_HANDLE_BASE + index, what))
            run.regs[dst] = (value + off) & MASK64
            return nxt
        return op_value
    if i.src == isa.LDDW_CODE_ADDR:
        handle = FUNC_HANDLE_BASE + i.callback

        def op_func(run: Run) -> int:
            run.regs[dst] = handle
            return nxt
        return op_func
    return _fail(f"lddw pseudo source {i.src} is resolved by the loader, not the VM")


def _load(i: Insn, nxt: int) -> Op:
    dst, src, off, size, signed = i.dst, i.src, i.off, i.size, i.spec.signed

    def op(run: Run) -> int:
        v = run.mem.load((run.regs[src] + off) & MASK64, size)
        run.regs[dst] = alu.movsx(64, 8 * size, v) if signed else v
        return nxt
    return op


def _store(i: Insn, nxt: int) -> Op:
    dst, src, off, size, imm = i.dst, i.src, i.off, i.size, i.imm & MASK64
    use_imm = i.use_imm

    def op(run: Run) -> int:
        run.mem.store((run.regs[dst] + off) & MASK64, size, imm if use_imm else run.regs[src])
        return nxt
    return op


def _atomic(i: Insn, nxt: int) -> Op:
    """RFC 9669 5.3: read-modify-write; FETCH puts the old value in src, cmpxchg compares with r0."""
    dst, src, off, size, m = i.dst, i.src, i.off, i.size, MASKS[i.width]
    name, fetch = i.atomic_op, i.fetch

    def op(run: Run) -> int:
        r = run.regs
        addr = (r[dst] + off) & MASK64
        if addr % size:
            raise VmError(f"atomic access at 0x{addr:x} is not {size}-byte aligned")
        old = run.mem.load(addr, size)
        if name == "cmpxchg":
            if old == r[0] & m:
                run.mem.store(addr, size, r[src])
            r[0] = old
            return nxt
        run.mem.store(addr, size, alu.ATOMIC[name](old, r[src] & m))
        if fetch:
            r[src] = old
        return nxt
    return op


def _jmp(i: Insn, nxt: int) -> Op:
    cond, n, m, dst, src, target = alu.CONDITIONS[i.op], i.width, MASKS[i.width], i.dst, i.src, i.jump_target()
    if i.use_imm:
        k = i.imm & m  # sign-extended, then compared as unsigned where the condition is unsigned

        def op(run: Run) -> int:
            return target if cond(run.regs[dst] & m, k, n) else nxt
        return op

    def op_reg(run: Run) -> int:
        r = run.regs
        return target if cond(r[dst] & m, r[src] & m, n) else nxt
    return op_reg


def _ja(i: Insn, nxt: int) -> Op:
    target = i.jump_target()
    return lambda run: target


def _call(i: Insn, nxt: int) -> Op:
    if i.src == isa.CALL_LOCAL:
        target = i.call_target()

        def op_local(run: Run) -> int:
            run.push_frame(nxt)
            return target
        return op_local
    if i.src == isa.CALL_BTF:
        return _fail("kfunc calls are not supported")
    helper = calls.HANDLERS.get(i.imm)
    if helper is None:
        return _fail(f"unknown helper {i.imm}")

    def op_helper(run: Run) -> int:
        return STOP if helper(run) else nxt
    return op_helper


def _exit(i: Insn, nxt: int) -> Op:
    def op(run: Run) -> int:
        if not run.frames:
            return STOP
        ret, saved, frame = run.frames.pop()
        run.mem.remove(run.frame)
        run.frame = frame
        run.regs[6:10] = saved
        run.regs[isa.FRAME_POINTER] = frame + isa.STACK_SIZE
        return run.end_round() if ret == ROUND else ret
    return op


def _loop(nxt: int, starts: frozenset[int]) -> Op:
    """bpf_loop(nr_loops, callback, ctx, flags), as Linux's: flags other than 0 give -EINVAL, nr_loops (its low 32
    bits) past MAX_LOOPS -E2BIG, 0 rounds r0 = 0, all without a call; else the first round."""
    def op(run: Run) -> int:
        r = run.regs
        rounds = r[1] & 0xFFFFFFFF
        if r[4]:
            r[0] = -EINVAL & MASK64
            return nxt
        if rounds > MAX_LOOPS or not rounds:
            r[0] = -E2BIG & MASK64 if rounds else 0
            return nxt
        if r[2] - FUNC_HANDLE_BASE not in starts:
            raise VmError(f"bpf_loop's r2 is no function's address (0x{r[2]:x})")
        run.rounds.append([r[2] - FUNC_HANDLE_BASE, r[3], rounds, 0, nxt])
        return run.enter_round()
    return op


def _budgeted(op: Op, target: int) -> Op:
    """A budgeted backward jump: ``op``, its jump to ``target`` taken only while the run's budget lasts."""
    def op_budgeted(run: Run) -> int:
        pc = op(run)
        return pc if pc != target or run.back_edge() else STOP
    return op_budgeted


BUILDERS: dict[str, Callable[[Insn, int], Op]] = {
    "alu": _alu, "mov": _mov, "movsx": _movsx, "neg": _neg, "end": _end, "lddw": _lddw, "load": _load,
    "store": _store, "atomic": _atomic, "jmp": _jmp, "ja": _ja, "call": _call, "exit": _exit,
}
# Kinds that write their destination register: never r10, the read-only frame pointer (BPF ABI).
WRITES_DST = frozenset(("alu", "mov", "movsx", "neg", "end", "lddw", "load"))


def _build(insns: Sequence[Insn], slots: int, budgeted: frozenset[int]) -> list[Op]:
    """One op per slot; slots that are not instruction starts (lddw's second half, the end) fail."""
    ops: list[Op] = [_fail("jump into the middle of lddw")] * slots + [_fail("fell off the end of the program")]
    starts = frozenset(i.pc for i in insns)
    for i in insns:
        nxt = i.pc + i.slots
        if i.kind in WRITES_DST and i.dst == isa.FRAME_POINTER:
            ops[i.pc] = _fail("r10 is read-only")
            continue
        if i.kind in ("jmp", "ja") and not 0 <= i.jump_target() <= slots:
            ops[i.pc] = _fail(f"jump to {i.jump_target()}, outside the program")
            continue
        if i.kind == "call" and i.src == isa.CALL_LOCAL and not 0 <= i.call_target() < slots:
            ops[i.pc] = _fail(f"call to {i.call_target()}, outside the program")
            continue
        ops[i.pc] = _loop(nxt, starts) if i.helper == LOOP else BUILDERS[i.kind](i, nxt)
        if i.pc in budgeted:
            ops[i.pc] = _budgeted(ops[i.pc], i.jump_target())
    return ops


class Vm:
    """A decoded program with its maps, ready to run any number of times against ``state``."""

    def __init__(self, code: bytes, maps: Sequence[MapDef] = (), state: MapsState | None = None, *,
                 budget: int = DEFAULT_BUDGET, compiled: bool = False, budgeted: frozenset[int] = frozenset()) -> None:
        """``compiled``: run the program as a Python function (compile.py) where it can be. ``budgeted``: the
        verifier's VerifiedProgram.budgeted; between two such jumps a run goes only forward (every other
        jump of their loops is budgeted too), so each adds at most the program's length to ``budget``."""
        from .compile import compile_program
        self.insns = decode(code)
        self.by_pc = {i.pc: i for i in self.insns}
        self.state = state if state is not None else MapsState(list(maps))
        self.budgeted = budgeted
        self.budget = budget + (LOOP_BUDGET * len(code) // 8 if budgeted else 0)
        self.warps = Warps()  # which runs are one warp instruction (egpu_warp_mem_record)
        self.ops = _build(self.insns, len(code) // 8, budgeted)
        self.program = compile_program(self) if compiled else None

    def run(self, ctx: bytes = b"", thread: ThreadSim | None = None) -> int:
        """Run as a probe: r1 = a read-only copy of ``ctx`` (struct egpu_ctx); returns r0."""
        mem = Memory()
        r1 = mem.add("ctx", bytearray(ctx), writable=False)
        return self._execute(mem, thread or ThreadSim(), r1, 0)

    def run_grid(self, grid: Dim3, block: Dim3, ctx: bytes = b"", launches: int = 1) -> None:
        """Run as a kernel of its own: ``launches`` launches of ``grid`` blocks of ``block`` threads, one
        thread after another (thread.grid_threads), each reading its own indices and the launch's start
        time; r0 is dropped, as a kernel's return is."""
        for _ in range(launches):
            for t in grid_threads(grid, block, time.time_ns()):
                self.run(ctx, t)

    def run_with_mem(self, mem: bytes | None = None, thread: ThreadSim | None = None) -> tuple[int, bytes | None]:
        """``execute``'s contract, also returning the memory after the run."""
        space = Memory()
        buf = bytearray(mem) if mem is not None else None
        r1 = space.add("mem", buf, writable=True) if buf is not None else 0
        r0 = self._execute(space, thread or ThreadSim(), r1, len(buf) if buf is not None else 0)
        return r0, bytes(buf) if buf is not None else None

    def _execute(self, mem: Memory, thread: ThreadSim, r1: int, r2: int) -> int:
        run = Run(self, mem, thread)
        run.regs[1], run.regs[2] = r1, r2
        if self.program is not None:
            r0 = self.program(run)
        else:
            self._interpret(run)
            r0 = run.regs[0] & MASK64
        if run.reservations:
            raise VmError(f"exited holding {len(run.reservations)} unsubmitted ringbuf reservation(s)")
        return r0

    def _interpret(self, run: Run) -> None:
        ops, budget, pc = self.ops, self.budget, 0
        try:
            while pc >= 0:
                budget -= 1
                if budget < 0:
                    raise VmError(f"instruction budget of {self.budget} exhausted (unbounded loop?)")
                pc = ops[pc](run)
        except EgpuError as e:  # VmError, or a map refusing an operation its type lacks
            self.locate(e, pc)
            raise

    def locate(self, e: EgpuError, pc: int) -> None:
        """A fault's report: the pc it happened at, and the instruction."""
        if e.insn is None:
            e.insn = pc
            insn = self.by_pc.get(pc)
            if insn is not None:
                e.reason = f"{e.reason} ({disasm_insn(insn)})"


def run_with_mem(code: bytes, mem: bytes | None = None, *, budget: int = DEFAULT_BUDGET) -> tuple[int, bytes | None]:
    """Like ``execute``, also returning what the program left in mem (None when there was none)."""
    return Vm(code, budget=budget).run_with_mem(mem)


def execute(code: bytes, mem: bytes | None = None, *, budget: int = DEFAULT_BUDGET) -> int:
    """Run ``code``: r1 = a copy of mem (0 when None), r2 = len(mem), r10 = top of a 512-byte stack.

    Returns r0 as unsigned 64-bit. Raises DecodeError for bytes that are not a program and VmError
    (naming the pc and instruction) for a program the VM cannot run.
    """
    return run_with_mem(code, mem, budget=budget)[0]
