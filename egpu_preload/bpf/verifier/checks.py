"""Preconditions and effects of each instruction kind, checked in one place (PREVAIL's AssertExtractor,
the kernel's do_check). ``STEP[insn.kind](env, state, insn)`` raises Reject naming the failed check,
or mutates ``state`` and returns the successors as (state, pc) pairs: none when the path ends, two
at a conditional jump whose outcome is unknown (the second one a copy).

Every memory access must be naturally aligned: a misaligned ld/st faults on the GPU (PTX ISA 6.4.1,
"addresses must be naturally aligned"), and stack frames, map values and ringbuf records all start
8-aligned, so alignment follows from the offset.
"""

from __future__ import annotations

import functools
from typing import Callable

from .. import ctx as egpu_ctx
from .. import isa
from ..decode import Insn
from ..helpers import BPF_NOEXIST, HELPERS, MAX_LOOPS, Helper, printk_refusal
from ..linux_names import helper_name, is_linux_helper
from ..ptregs import PT_REGS
from ..program import (MAP_ARRAY, MAP_BLOOM_FILTER, MAP_PERCPU_ARRAY, MAP_PERF_EVENT_ARRAY,
                       MAP_PERTHREAD_ARRAY, MAP_QUEUE, MAP_RINGBUF, MAP_STACK, MAP_TYPE_NAMES, HASHES, DataPointer,
                       MapDef)
from . import arith
from .cfg import Cfg, Reject
from .precision import reg_key, slot_key
from .state import SPILL_BYTES, UNINIT_SLOT_BYTES, Frame, Slot, State, fmt_value, keyed_values
from .value import (CTX, FUNC, MAP_PTR, MAP_VALUE, MAP_VALUE_OR_NULL, NOT_INIT, NOT_INIT_VALUE, OR_NULL, RINGBUF_MEM,
                    RINGBUF_MEM_OR_NULL, SCALAR, STACK, UNKNOWN, Value, bounded, const, intersect, pointer, s64,
                    sized, t_add, with_var, M32, M64)

MAX_FRAMES = 8          # the kernel's MAX_CALL_FRAMES
MAX_OFF = 1 << 29       # the kernel's BPF_MAX_VAR_OFF: larger offsets are nonsense
FP = isa.FRAME_POINTER

_KEY_VALUE_MAPS = frozenset({MAP_ARRAY, MAP_PERCPU_ARRAY, MAP_PERTHREAD_ARRAY}) | HASHES
MAP_TYPES_FOR_HELPER = {
    "map_lookup_elem": _KEY_VALUE_MAPS, "map_update_elem": _KEY_VALUE_MAPS, "map_delete_elem": _KEY_VALUE_MAPS,
    "ringbuf_output": frozenset({MAP_RINGBUF}), "ringbuf_reserve": frozenset({MAP_RINGBUF}),
    "egpu_warp_mem_record": frozenset({MAP_RINGBUF}),
    "perf_event_output": frozenset({MAP_PERF_EVENT_ARRAY}),
    # the verifier's check_map_func_compatibility: a queue or stack takes only these three, a bloom filter no pop
    "map_push_elem": frozenset({MAP_QUEUE, MAP_STACK, MAP_BLOOM_FILTER}),
    "map_pop_elem": frozenset({MAP_QUEUE, MAP_STACK}),
    "map_peek_elem": frozenset({MAP_QUEUE, MAP_STACK, MAP_BLOOM_FILTER}),
}
_WRITES_MAP = frozenset({"map_update_elem", "map_delete_elem", "map_push_elem", "map_pop_elem"})
_MAX_ERRNO = 4095
# Helpers declared variadic in C (bpf_printk): the registers of arguments the format does not use hold
# whatever clang left there, unset or a pointer, so their "anything" arguments take any value.
_VARIADIC = frozenset({"trace_printk"})
# Linux helpers a probe calls without naming them: what the user wrote instead.
_NOT_WRITTEN = {"bpf_trace_vprintk": "libbpf's bpf_printk calls it for more than three arguments: egpu's takes at "
                                     "most three"}
# bpftime's GPU helpers (its example/gpu/README.md) egpu leaves out: id -> (bpftime's name, what to write instead).
_BPFTIME_NOT_PROVIDED = {501: ("ebpf_puts", "print with bpf_printk, whose format may be the string")}
_BPFTIME_IDS = range(500, 600)   # bpftime numbers its GPU helpers from 501 (a branch's basic-block probes use 512)
_BPFTIME_PROVIDED = [i for i in HELPERS if i in _BPFTIME_IDS]
# Linux helpers probes ported from libbpf reach for, and what does their job in egpu.
_READS = "a probe reads its context, stack, maps and global data directly, and no other memory"
_KERNEL = ("no probe runs in the Linux kernel: a uprobe or host-API probe reads the application's memory with "
           "bpf_probe_read_user")
_TIMERS = "timers are not supported: a probe's callbacks are bpf_loop's alone"
_INSTEAD = {"bpf_tail_call": "call a static __noinline function instead",
            "bpf_for_each_map_elem": "callbacks other than bpf_loop's are not supported: loop over the keys with "
                                     "bpf_loop and bpf_map_lookup_elem",
            **dict.fromkeys(("bpf_timer_init", "bpf_timer_set_callback", "bpf_timer_start", "bpf_timer_cancel"),
                            _TIMERS),
            "bpf_spin_lock": "update the map value with __sync_* atomics",
            "bpf_probe_read_kernel": _KERNEL, "bpf_probe_read_kernel_str": _KERNEL + "_str"}
# The contexts of programs run in the application's threads, in C (uprobes, host-API programs): the only ones
# that may read its memory (Helper.in_process). GPU, launch and egpu/uvm programs run elsewhere.
_IN_PROCESS = (PT_REGS, egpu_ctx.HOST)

Succ = list[tuple[State, int]]


class Env:
    """What one verification run accumulates besides states: ids and the facts for the translator."""

    __slots__ = ("cfg", "maps", "layout", "regions", "map_choices", "depth", "consts", "arg_align",
                 "arg_stack", "ctx_reads", "ctx_at", "value_uses", "pointers_read", "callbacks", "wants", "touched",
                 "linked", "_last_id")

    def __init__(self, cfg: Cfg, maps: list[MapDef], layout: egpu_ctx.Layout = egpu_ctx.EGPU_CTX) -> None:
        self.cfg = cfg
        self.maps = maps
        self.layout = layout  # the context r1 points to at entry (ctx.layout_for the program's section)
        self.regions: dict[int, str] = {}
        self.map_choices: dict[int, set[int]] = {}   # pc -> every map its paths pass
        self.depth = [0] * len(cfg.subprogs)
        self.consts: dict[int, int | None] = {}
        self.arg_align: dict[tuple[int, int], int] = {}
        self.arg_stack: dict[tuple[int, int], int | None] = {}
        self.ctx_reads: set[int] = set()
        self.ctx_at: dict[int, int | None] = {}
        self.value_uses: dict[int, set[str]] = {}
        self.pointers_read: dict[DataPointer, None] = {}   # unrelocated addresses read from global data, in order
        self.callbacks: dict[int, int] = {}   # pc of a bpf_loop call -> its callback's pc
        # of the instruction being checked, for the search (precision.py): the registers and slots (keys) whose
        # values a check read, the stack slot a fixed-offset access touched, (frame, slot, bytes), and the values a
        # conditional jump narrows through their links
        self.wants: list[int] = []
        self.touched: tuple[int, int, int] | None = None
        self.linked: frozenset[int] = frozenset()
        self._last_id = 0

    def new_id(self) -> int:
        self._last_id += 1
        return self._last_id

    def note_region(self, pc: int, region: str) -> None:
        seen = self.regions.setdefault(pc, region)
        if seen != region:
            if CTX in (seen, region):
                raise Reject(f"the same instruction accesses ctx and {seen if region == CTX else region} "
                             "(one region per ctx access)")
            self.regions[pc] = "mixed"

    def note_map(self, pc: int, index: int) -> None:
        self.map_choices.setdefault(pc, set()).add(index)

    def note_const(self, pc: int, value: int | None) -> None:
        if self.consts.setdefault(pc, value) != value:
            self.consts[pc] = None

    def note_callback(self, pc: int, callback: int) -> None:
        """The translated code calls one callback at a bpf_loop call, known when translating."""
        if self.callbacks.setdefault(pc, callback) != callback:
            raise Reject(f"bpf_loop gets the callback at {self.callbacks[pc]} on one path and at {callback} on "
                         "another: each call takes one function (callback)")

    def note_use(self, index: int, use: str) -> None:
        self.value_uses.setdefault(index, set()).add(use)

    def note_pointers(self, m: MapDef, lo: int, hi: int) -> None:
        """A read of bytes [lo, hi) of global data: the addresses stored there (MapDef.pointers) it may get."""
        self.pointers_read.update((p, None) for p in m.pointers if lo < p.offset + 8 and p.offset < hi)

    def note_ctx(self, pc: int, offset: int, size: int) -> None:
        """A context load: the bytes it reads, and its offset when the same on every path."""
        self.ctx_reads.update(range(offset, offset + size))
        if self.ctx_at.setdefault(pc, offset) != offset:
            self.ctx_at[pc] = None

    def note_arg(self, state: State, pc: int, reg: int, ptr: Value) -> None:
        """A helper's pointer argument: its alignment (every region starts 8-byte aligned: the stack
        frame's top, map values, ringbuf records, the context, so its offset decides) and, when it
        points into the caller's own frame at a constant offset, that offset from r10."""
        t = t_add((ptr.off & M64, 0), (ptr.tv, ptr.tm))
        align = next(a for a in (8, 4, 2, 1) if not (t[0] | t[1]) & (a - 1))
        self.arg_align[pc, reg] = min(self.arg_align.get((pc, reg), 8), align)
        own = ptr.kind == STACK and ptr.is_const and ptr.aux == len(state.frames) - 1
        off = ptr.off + ptr.smin if own else None
        if self.arg_stack.setdefault((pc, reg), off) != off:
            self.arg_stack[pc, reg] = None

    def note_depth(self, state: State, frame: int, lowest: int) -> None:
        sub = state.frames[frame].subprog
        self.depth[sub] = max(self.depth[sub], -lowest)

    def want(self, state: State, *regs: int) -> None:
        """Registers of the running frame whose values a check reads (their bounds, or what they are)."""
        self.wants.extend(reg_key(len(state.frames) - 1, r) for r in regs)


# ---- registers ------------------------------------------------------------------------------------------

def _reg(f: Frame, r: int) -> Value:
    v = f.regs[r]
    if v.kind == NOT_INIT:
        raise Reject(f"r{r} is not initialized (!read_ok)")
    return v


def _writable(r: int) -> None:
    if r == FP:
        raise Reject("r10 is the read-only frame pointer (r10 write)")


def _set(state: State, r: int, v: Value) -> None:
    """Narrow register r to v, and every scalar linked to it (same id) by what the link says."""
    old = state.top.regs[r]
    if old.kind == SCALAR and old.id:
        state.update_id(old.id, lambda w: _linked(w, old, v))
    else:
        state.top.regs[r] = v


def _linked(w: Value, known: Value, narrowed: Value) -> Value:
    """What ``known`` narrowed to teaches about ``w`` of the same id: w = known + (w.off - known.off),
    in 64 bits or, where either is a w-register sum (aux 32), in the low 32 bits, which is all of w
    only when w fits them. The result is also within w's own bounds (sync_linked_regs)."""
    link = dict(id=w.id, off=w.off, aux=w.aux)
    if w.off == known.off and w.aux == known.aux:
        return narrowed._replace(**link)
    width = 64 if w.aux == known.aux == 0 else 32
    derived = arith.alu("add", width, narrowed.var, const(w.off - known.off))
    if known.aux == 32 and w.aux == 0 and w.umax > M32:   # of w only its low half is known's plus a constant
        return (arith.low_half(w.var, derived) or w.var)._replace(**link)
    return (intersect(w.var, derived) or derived)._replace(**link)


def _add_to_link(a: Value, b: Value, op: str, width: int, result: Value) -> Value:
    """``a op b`` = result, where a is a linked scalar: adding a constant keeps the link (off moves),
    anything else makes the result a value of its own."""
    if op in ("add", "sub") and b.is_const and not b.is_pointer:
        c = s64(b.tv) if op == "add" else -s64(b.tv)
        if width == 32:
            off = (a.off + c + (1 << 31)) % (1 << 32) - (1 << 31)  # modulo 2**32: only the low half counts
            return result._replace(id=a.id, off=off, aux=32)
        if a.aux == 0 and abs(a.off + c) < 1 << 31:
            return result._replace(id=a.id, off=a.off + c, aux=0)
    return result


# ---- ALU --------------------------------------------------------------------------------------------

def _alu(env: Env, st: State, insn: Insn) -> Succ:
    """dst = dst op src (or imm): scalars by arith; pointers only +/- a scalar, or ptr - ptr."""
    _writable(insn.dst)
    f = st.top
    # RFC 9669 4.1: imm is sign-extended to 64 bits; a 32-bit operation reads its low half.
    b = const(insn.imm) if insn.use_imm else _reg(f, insn.src)
    if insn.op == "mov":
        if b.is_pointer and insn.width == 32:
            raise Reject(f"partial copy of a pointer (r{insn.src} is {b.kind})")
        # a w-register copy of a value that fits 32 bits is the value itself
        exact = insn.width == 64 or b.umax <= M32
        if exact and b.kind == SCALAR and not b.is_const and not insn.use_imm and not b.id:
            b = b._replace(id=env.new_id())  # link the copies: a later check on one narrows both
            f.regs[insn.src] = b
        f.regs[insn.dst] = b if exact else arith.alu("mov", 32, b, b)
        return [(st, insn.pc + 1)]
    a = _reg(f, insn.dst)
    for r, v in ((insn.dst, a), (insn.src, b)):
        if v.kind == FUNC:
            raise Reject(f"arithmetic on a function's address prohibited (r{r} is func): it is bpf_loop's callback "
                         "and nothing else")
    if a.is_pointer or b.is_pointer:
        if not a.is_pointer:       # the scalar's bounds become the pointer's offset
            env.want(st, insn.dst)
        elif not b.is_pointer and not insn.use_imm:
            env.want(st, insn.src)
        if insn.width == 32:
            p = insn.dst if a.is_pointer else insn.src
            raise Reject(f"32-bit arithmetic on a pointer prohibited (r{p} is {(a if a.is_pointer else b).kind})")
        if insn.op == "sub" and a.kind == b.kind == MAP_VALUE:
            env.note_use(a.aux, "address")   # a distance between two values: each lookup's row must be one
        f.regs[insn.dst] = _pointer_alu(insn, a, b)
    else:
        result = arith.alu(insn.op, insn.width, a, b)
        f.regs[insn.dst] = _add_to_link(a, b, insn.op, insn.width, result) if a.id else result
    return [(st, insn.pc + 1)]


def _pointer_alu(insn: Insn, a: Value, b: Value) -> Value:
    if insn.op == "add":
        if a.is_pointer and b.is_pointer:
            raise Reject(f"pointer += pointer prohibited (r{insn.dst} is {a.kind}, r{insn.src} is {b.kind})")
        return _offset(a, b, +1, insn.dst) if a.is_pointer else _offset(b, a, +1, insn.src)
    if insn.op == "sub":
        if a.is_pointer and b.is_pointer:
            if a.kind != b.kind or a.aux != b.aux or a.kind in OR_NULL or a.kind == MAP_PTR:
                raise Reject(f"subtraction of pointers to different regions (r{insn.dst} is {a.kind}, "
                             f"r{insn.src} is {b.kind})")
            # A distance is known only within one object: two lookups of a map (or two records) have the
            # same offsets and lie apart, as far as the verifier knows (the kernel makes every such
            # difference unknown).
            if a.is_const and b.is_const and _one_region(a, b):
                return const(a.off + s64(a.tv) - b.off - s64(b.tv))
            return UNKNOWN
        if b.is_pointer:
            raise Reject(f"scalar -= pointer prohibited (r{insn.src} is {b.kind})")
        return _offset(a, b, -1, insn.dst)
    p = insn.dst if a.is_pointer else insn.src
    raise Reject(f"pointer arithmetic with {insn.op} prohibited (r{p} is {(a if a.is_pointer else b).kind})")


def _offset(p: Value, s: Value, sign: int, reg: int) -> Value:
    if p.kind in OR_NULL:
        raise Reject(f"pointer arithmetic on {p.kind} prohibited: compare it with 0 first (r{reg})")
    if p.kind == MAP_PTR:
        raise Reject(f"pointer arithmetic on map_ptr prohibited (r{reg})")
    var = arith.alu("add" if sign > 0 else "sub", 64, p.var, s)
    if not var.is_const:
        return with_var(p, var)
    # a constant moves the fixed offset, so a pointer's variable part is constant only when it is 0
    off = p.off + s64(var.tv)
    if abs(off) >= MAX_OFF:
        raise Reject(f"pointer offset {off} out of range (r{reg})")
    return with_var(p._replace(off=off), const(0))


def _unary(env: Env, st: State, insn: Insn) -> Succ:
    """neg, le/be/bswap and movsx: scalars only."""
    _writable(insn.dst)
    f = st.top
    src = insn.src if insn.kind == "movsx" else insn.dst
    v = _reg(f, src)
    if v.is_pointer:
        raise Reject(f"{insn.op} of a pointer prohibited (r{src} is {v.kind})")
    if insn.kind == "neg":
        f.regs[insn.dst] = arith.neg(insn.width, v)
    elif insn.kind == "end":
        f.regs[insn.dst] = arith.byteswap(insn.op, insn.imm, v)
    else:
        f.regs[insn.dst] = arith.movsx(insn.width, insn.size * 8, v)
    return [(st, insn.pc + 1)]


def _lddw(env: Env, st: State, insn: Insn) -> Succ:
    """dst = imm64, a map (map_ptr), a pointer into a global-data map's value (cfg checked the index) or a
    function's address (func)."""
    _writable(insn.dst)
    if insn.src == isa.LDDW_IMM64:
        v = const(insn.imm)
    elif insn.src == isa.LDDW_MAP_IDX:
        v = pointer(MAP_PTR, aux=insn.imm)
        env.note_map(insn.pc, insn.imm)
    elif insn.src == isa.LDDW_CODE_ADDR:   # cfg made the target a function of its own
        v = pointer(FUNC, aux=insn.callback)
    else:
        v = pointer(MAP_VALUE, off=insn.imm >> 32, aux=insn.imm & 0xFFFFFFFF)
        env.note_map(insn.pc, insn.imm & 0xFFFFFFFF)
    st.top.regs[insn.dst] = v
    return [(st, insn.pc + 2)]


# ---- memory -----------------------------------------------------------------------------------------

def _load(env: Env, st: State, insn: Insn) -> Succ:
    """dst = *(size *)(src + off)."""
    _writable(insn.dst)
    f = st.top
    v = _access(env, st, insn, insn.src, _reg(f, insn.src), "read", signed=insn.spec.signed)
    f.regs[insn.dst] = v
    return [(st, insn.pc + 1)]


def _store(env: Env, st: State, insn: Insn) -> Succ:
    """*(size *)(dst + off) = src (or imm, sign-extended to 64 bits: RFC 9669 5.1)."""
    f = st.top
    value = const(insn.imm) if insn.use_imm else _reg(f, insn.src)
    _access(env, st, insn, insn.dst, _reg(f, insn.dst), "write", value=value)
    return [(st, insn.pc + 1)]


def _atomic(env: Env, st: State, insn: Insn) -> Succ:
    """Read-modify-write of 4 or 8 bytes on the stack, a map value or a ringbuf record (RFC 9669 5.3)."""
    f = st.top
    base, operand = _reg(f, insn.dst), _reg(f, insn.src)
    if operand.is_pointer:
        raise Reject(f"r{insn.src} leaks addr into memory (atomic operand is {operand.kind})")
    cmpxchg = insn.atomic_op == "cmpxchg"
    if cmpxchg and _reg(f, 0).is_pointer:
        raise Reject(f"r0 leaks addr into memory (cmpxchg comparand is {f.regs[0].kind})")
    if insn.fetch and not cmpxchg:
        _writable(insn.src)
    _access(env, st, insn, insn.dst, base, "atomic")
    if insn.atomic_op == "add":  # a constant added by every lane aggregates across a warp
        env.note_const(insn.pc, operand.tv if operand.is_const else None)
        env.want(st, insn.src)
    old = sized(insn.size)  # the old value, zero-extended for the 32-bit forms
    if cmpxchg:
        f.regs[0] = old
    elif insn.fetch:
        f.regs[insn.src] = old
    return [(st, insn.pc + 1)]


def _access(env: Env, st: State, insn: Insn, reg: int, ptr: Value, mode: str, *, value: Value | None = None,
            signed: bool = False) -> Value:
    """Check one load ("read"), store ("write") or atomic through ``ptr``; returns what a read gives."""
    kind, size = ptr.kind, insn.size
    if kind in (SCALAR, MAP_PTR, FUNC) or kind in OR_NULL:
        hint = ": compare it with 0 first" if kind in OR_NULL else ""
        raise Reject(f"invalid mem access '{kind}' (r{reg}{hint})" + (_data_pointers(env) if kind == SCALAR else ""))
    if value is not None and value.is_pointer and kind != STACK:
        raise Reject(f"r{insn.src} leaks addr into {kind} (pointer store)")
    # A record is the kernel's PTR_TO_MEM, which check_atomic takes like a map value; the context is not.
    if mode == "atomic" and kind not in (STACK, MAP_VALUE, RINGBUF_MEM):
        raise Reject(f"atomic access to {kind} prohibited, only stack, map values and ringbuf records (r{reg})")
    env.note_region(insn.pc, kind)
    fixed = ptr.off + insn.off
    if kind == CTX:
        read = _ctx(env.layout, ptr, fixed, size, mode, signed, reg)
        env.note_ctx(insn.pc, fixed, size)
        return read
    _bounded(ptr, kind, reg)
    t = t_add((fixed & M64, 0), (ptr.tv, ptr.tm))
    if (t[0] | t[1]) & (size - 1):
        raise Reject(f"misaligned {kind} access off={_off(ptr, fixed)} size={size} (r{reg} alignment)")
    if kind == STACK:
        return _stack(env, st, ptr, fixed, size, mode, value, signed, reg)
    if kind == MAP_VALUE:
        m = env.maps[ptr.aux]
        plain_add = mode == "atomic" and insn.atomic_op == "add" and not insn.fetch
        env.note_use(ptr.aux, f"add{size}" if plain_add else mode)
        if denied := _map_denied(m, mode):
            raise Reject(f"{denied[0]} (r{reg} {denied[1]})")
        _within(ptr, fixed, size, m.value_size, "map value", "value_size", reg)
        if mode != "write" and m.pointers:
            env.note_pointers(m, fixed + ptr.smin, fixed + ptr.smax + size)
        if mode == "read" and m.readonly and m.initial is not None and ptr.is_const:
            data = m.initial[fixed:fixed + size].ljust(size, b"\0")  # .rodata: known at load time
            return const(int.from_bytes(data, "little", signed=signed))
    else:
        _within(ptr, fixed, size, ptr.aux, "ringbuf record", "size", reg)
    return sized(size, signed)


def _data_pointers(env: Env) -> str:
    """Why a number may stand where the program expects a pointer: it read addresses stored in global data,
    which the loader leaves unrelocated, as libbpf does (MapDef.pointers); "" when it read none."""
    held = list(env.pointers_read)
    if not held:
        return ""
    named = [f"{p.section}+{p.offset}{f' ({p.holder})' if p.holder else ''} holds &{p.target}" for p in held[:3]]
    more = f" and {len(held) - 3} more" if len(held) > 3 else ""
    return "; pointers stored in global data are not relocated (as in libbpf): " + ", ".join(named) + more + \
        " as a plain number"


def _map_denied(m: MapDef, mode: str) -> tuple[str, str] | None:
    """Why a program's read, write or atomic (both) of a map's value is refused, and the check's name, as
    Linux's check_map_access_type refuses it: a write into .rodata or a BPF_F_RDONLY_PROG map, a read of a
    BPF_F_WRONLY_PROG map."""
    if mode != "read" and not m.prog_writes:
        return f"write into read-only map {m.name}", "readonly"
    if mode != "write" and not m.prog_reads:
        return f"read from write-only map {m.name}", "writeonly"
    return None


def _off(ptr: Value, fixed: int) -> str:
    return str(fixed) if ptr.is_const else f"{fixed}+[{ptr.smin}, {ptr.smax}]"


def _bounded(ptr: Value, kind: str, reg: int) -> None:
    if ptr.smin < -MAX_OFF or ptr.smax > MAX_OFF:
        raise Reject(f"unbounded variable offset into {kind} (r{reg} smin={ptr.smin} smax={ptr.smax}): "
                     "bound the index with 'if (i < N)' or 'i &= N - 1'")


def _within(ptr: Value, fixed: int, size: int, limit: int, what: str, limit_name: str, reg: int) -> None:
    if fixed + ptr.smin < 0 or fixed + ptr.smax + size > limit:
        raise Reject(f"invalid access to {what}, {limit_name}={limit} off={_off(ptr, fixed)} size={size} "
                     f"(r{reg} bounds)")


@functools.cache
def _ctx_slots(layout: egpu_ctx.Layout) -> frozenset[tuple[int, int]]:
    """Every (offset, size) read that stays inside one element of one field of ``layout`` and is aligned."""
    out = set()
    for fld in layout.fields:
        for e in range(fld.count):
            start = fld.offset + e * fld.size
            for size in (1, 2, 4, 8):
                if size <= fld.size:
                    out.update((o, size) for o in range(start, start + fld.size, size))
    return frozenset(out)


def _field_of_other(layout: egpu_ctx.Layout, offset: int) -> str | None:
    """What a read at ``offset`` would be in the struct of the other side: struct egpu_ctx and struct
    egpu_host_ctx share no offset, so a field of one read in a section of the other is told by its offset
    (None: ``layout`` is neither, or nothing is there either)."""
    if layout is egpu_ctx.EGPU_CTX:
        other, who = egpu_ctx.HOST, "host-API sections (egpu/memcpy, memset, alloc, free, sync)"
    elif layout is egpu_ctx.HOST:
        other, who = egpu_ctx.EGPU_CTX, "GPU and launch sections"
    else:
        return None
    names = [f.name for f in other.fields if f.offset <= offset < f.offset + f.size * f.count]
    return f"{'/'.join(names)} is a field of struct {other.name}, which only {who} receive" if names else None


def _ctx(layout: egpu_ctx.Layout, ptr: Value, fixed: int, size: int, mode: str, signed: bool, reg: int) -> Value:
    if mode != "read":
        raise Reject(f"cannot write into ctx: struct {layout.name} is read-only (r{reg})")
    if not ptr.is_const:
        raise Reject(f"variable ctx access prohibited (r{reg} smin={ptr.smin} smax={ptr.smax})")
    if (fixed, size) not in _ctx_slots(layout):
        other = _field_of_other(layout, fixed)
        if other is not None:
            raise Reject(f"invalid ctx access off={fixed} size={size}: {other} (section context)")
        spans = [f.name for f in layout.fields
                 if f.offset < fixed + size and fixed < f.offset + f.size * f.count]
        hint = (f": the read spans {' and '.join(spans)}, as clang reads a struct copied whole (__builtin_memcpy, "
                "an assignment); read the fields one by one" if len(spans) > 1 else "")
        raise Reject(f"invalid ctx access off={fixed} size={size} (struct {layout.name} is {layout.size} bytes "
                     f"of aligned fields{hint})")
    return sized(size, signed)


def _stack(env: Env, st: State, ptr: Value, fixed: int, size: int, mode: str, value: Value | None,
           signed: bool, reg: int) -> Value:
    lo, hi = fixed + ptr.smin, fixed + ptr.smax + size
    if lo < -isa.STACK_SIZE or hi > 0:
        raise Reject(f"invalid stack access off={_off(ptr, fixed)} size={size}, the frame is "
                     f"[-{isa.STACK_SIZE}, 0) (r{reg} stack bounds)")
    if value is not None and value.kind == STACK and value.aux > ptr.aux:
        raise Reject("cannot store a pointer to a callee's stack into its caller's frame (stack pointer spill)")
    env.note_depth(st, ptr.aux, lo)
    f = st.frames[ptr.aux]
    if not ptr.is_const:
        return _stack_var(f, lo, hi, size, mode, value, signed)
    env.touched = (ptr.aux, _slot_of(fixed)[0], size)
    out = UNKNOWN
    if mode != "write":
        out = _stack_read(f, fixed, size, signed, mode == "atomic")
    if mode != "read":
        _stack_write(f, fixed, size, value)
    return out


def _slot_of(o: int) -> tuple[int, int]:
    """Slot index and byte index within it of frame offset o (< 0)."""
    k = (-o - 1) // 8
    return k, o + 8 * (k + 1)


def _stack_read(f: Frame, o: int, size: int, signed: bool, atomic: bool) -> Value:
    k, i = _slot_of(o)
    slot = f.stack.get(k)
    if slot is None or "u" in slot.bytes[i:i + size]:
        raise Reject(f"invalid read from stack off={o} size={size}: not initialized (stack init)")
    sp = slot.spill
    if sp is None or "s" not in slot.bytes[i:i + size]:
        return sized(size, signed)
    if sp.is_pointer:
        if size == 8 and not atomic:
            return sp
        raise Reject(f"invalid size {size} of a read of a spilled {sp.kind} (register fill)")
    run, n = slot.bytes.index("s"), slot.bytes.count("s")
    if sp.is_const and slot.bytes[i:i + size] == "s" * size:  # any bytes of a known value are known
        data = bytes(run) + sp.tv.to_bytes(8, "little")[:n] + bytes(8 - run - n)
        return const(int.from_bytes(data[i:i + size], "little", signed=signed))
    # little endian: the low bytes of a spill, read from its start, are the value when it fits them
    if i == run and size <= n and sp.umax < 1 << (8 * size - (1 if signed else 0)):
        return sp if size == n else sp.var
    return sized(size, signed)


def _stack_write(f: Frame, o: int, size: int, value: Value | None) -> None:
    k, i = _slot_of(o)
    if value is not None and value.is_pointer:
        if size != 8:
            raise Reject(f"invalid size {size} of a pointer spill, pointers take 8 bytes (register spill)")
        f.stack[k] = Slot(SPILL_BYTES, value)  # 8-aligned by the alignment check
        return
    slot = f.stack.get(k)
    if slot is not None and slot.holds_pointer and size != 8:
        raise Reject(f"attempt to corrupt spilled {slot.spill.kind} at fp{-8 * (k + 1)} with a {size}-byte store "
                     "(register spill)")
    b = UNINIT_SLOT_BYTES if slot is None else slot.as_data().bytes
    spill = None
    if value is not None:
        if value.is_const:
            spill = const(value.tv & ((1 << (8 * size)) - 1))
        elif value.umax < 1 << (8 * size):
            spill = value  # the bytes hold the whole value: keep its bounds (and its links)
    fill = "s" if spill is not None else "m"
    f.stack[k] = Slot(b[:i] + fill * size + b[i + size:], spill)


def _stack_var(f: Frame, lo: int, hi: int, size: int, mode: str, value: Value | None, signed: bool) -> Value:
    """A variable-offset access to the bytes [lo, hi): reads need them all initialized and free of
    spilled pointers; writes may or may not touch each byte, so spills there become plain data and
    uninitialized bytes stay uninitialized. A read gives any value of its size, sign-extended for ldxs."""
    if value is not None and value.is_pointer:
        raise Reject("variable-offset pointer spill prohibited (register spill)")
    for k in range(_slot_of(hi - 1)[0], _slot_of(lo)[0] + 1):
        slot = f.stack.get(k)
        first, last = max(lo, -8 * (k + 1)), min(hi, -8 * k)
        b = slot.bytes[first + 8 * (k + 1):last + 8 * (k + 1)] if slot is not None else "u"
        if mode != "write":
            if "u" in b:
                raise Reject(f"invalid variable-offset read from stack [{lo}, {hi}): byte at fp{first:+d} "
                             "not initialized (stack init)")
            if slot.spill is not None and slot.spill.is_pointer:
                raise Reject(f"variable-offset read of a spilled {slot.spill.kind} at fp{-8 * (k + 1)} (register fill)")
        if mode != "read" and slot is not None and slot.spill is not None:
            if slot.holds_pointer:
                raise Reject(f"spilled {slot.spill.kind} at fp{-8 * (k + 1)} in range of a variable-offset "
                             "stack write (register spill)")
            f.stack[k] = slot.as_data()
    return sized(size, signed)


# ---- jumps ------------------------------------------------------------------------------------------

def _ja(env: Env, st: State, insn: Insn) -> Succ:
    return [(st, insn.jump_target())]


def _jmp(env: Env, st: State, insn: Insn) -> Succ:
    """if dst op src goto target: both outcomes unless the operands decide; each side learns bounds."""
    f = st.top
    a = _reg(f, insn.dst)
    # JMP32 compares the low 32 bits with imm (RFC 9669 4.3); arith.branch takes the low half.
    b = const(insn.imm) if insn.use_imm else _reg(f, insn.src)
    target, nxt = insn.jump_target(), insn.pc + 1
    if FUNC in (a.kind, b.kind):
        raise Reject(f"comparison of a function's address prohibited (r{insn.dst} is {a.kind}"
                     + ("" if insn.use_imm else f", r{insn.src} is {b.kind}") + "): it is bpf_loop's callback and "
                     "nothing else")
    operands = (insn.dst,) if insn.use_imm else (insn.dst, insn.src)
    if a.is_pointer or b.is_pointer:
        env.want(st, *(r for r in operands if f.regs[r].kind == SCALAR))   # a null check's 0
        for v in (a, b) if a.is_pointer and b.is_pointer else ():
            if v.kind in (MAP_VALUE, MAP_VALUE_OR_NULL):   # compared by address: one row per lookup (striping.py)
                env.note_use(v.aux, "address")
        return _null_check(st, insn, a, b, target, nxt)
    ids = {v.id for v in (a, b) if v.id}
    if ids:
        env.linked = frozenset(key for key, v in keyed_values(st) if v.kind == SCALAR and v.id in ids)
    known, taken, fallen = arith.branch(insn.op, insn.width, a, b)
    if known is not None or taken is None or fallen is None:
        env.want(st, *operands)   # their bounds decide the way: a state they differ in may go the other
    if known is not None:
        return [(st, target if known else nxt)]
    if taken is not None and fallen is not None:
        other = st.copy()
        return [(_narrowed(st, insn, fallen), nxt), (_narrowed(other, insn, taken), target)]
    if fallen is not None:
        return [(_narrowed(st, insn, fallen), nxt)]
    return [(_narrowed(st, insn, taken), target)] if taken is not None else []


def _narrowed(s: State, insn: Insn, ops: tuple[Value, Value]) -> State:
    _set(s, insn.dst, ops[0])
    if not insn.use_imm and insn.src != insn.dst:
        _set(s, insn.src, ops[1])
    return s


def _one_region(a: Value, b: Value) -> bool:
    """Whether two pointers lie in one region that every back end lays out alike: one stack frame, the
    context, one ringbuf record (its reference id). Not two map values: nothing tells two lookups apart."""
    if a.kind != b.kind or a.aux != b.aux:
        return False
    return a.kind in (STACK, CTX) or (a.kind == RINGBUF_MEM and a.id == b.id != 0)


def _null_check(st: State, insn: Insn, a: Value, b: Value, target: int, nxt: int) -> Succ:
    """The comparisons a pointer takes: == 0 / != 0, which splits an or_null pointer in two, and == / != with
    another pointer (64 bits), or an ordering (signed or not) of two pointers into one region
    (_one_region), which prove nothing: both outcomes go on as they were. The kernel allows these where
    pointers may leak (allow_ptr_leaks: CAP_PERFMON, every tracing program) and learns no bounds from them
    outside packet pointers (reg_set_min_max); clang makes them of "a && b && a != b". Refused: jset and
    JMP32, which test an address's bits, and an order of two regions (two map values, "a < b ? a : b"),
    which the VM gives by first lookup and the C engine and the GPU by key: the three would disagree."""
    if a.is_pointer and b.is_pointer:
        what = f"pointer comparison prohibited (r{insn.dst} is {a.kind}, r{insn.src} is {b.kind})"
        if insn.op == "jset":
            raise Reject(f"{what}: jset tests an address's bits")
        # The VM and the C engine put each region at a multiple of 2**36, so a pointer's low half is its
        # offset there (two values at one offset are equal in 32 bits), not the GPU address's low half.
        if insn.width == 32:
            raise Reject(f"{what}: JMP32 compares an address's low half")
        # Regions order alike everywhere only from within: the VM maps each map value apart, in the order
        # of first lookup, where the C engine and the GPU lay a map's values out by key.
        if insn.op not in ("jeq", "jne") and not _one_region(a, b):
            raise Reject(f"{what}: an order between two regions differs between the VM and the GPU")
        return [(st, nxt), (st.copy(), target)]
    p, s, reg = (a, b, insn.dst) if a.is_pointer else (b, a, insn.src)
    if insn.width == 32 or insn.op not in ("jeq", "jne") or not (s.is_const and s.tv == 0):
        raise Reject(f"pointer comparison prohibited (r{reg} is {p.kind}): only == 0 and != 0 null checks")
    null_pc, ok_pc = (target, nxt) if insn.op == "jeq" else (nxt, target)
    if p.kind not in OR_NULL:
        return [(st, ok_pc)]  # a valid pointer is never NULL
    null = st.copy()
    null.update_id(p.id, lambda v: const(0))
    if p.kind == RINGBUF_MEM_OR_NULL:
        null.refs.pop(p.id, None)  # nothing was reserved, nothing to release
    keep = p.kind == RINGBUF_MEM_OR_NULL  # the id of a record is its reference
    st.update_id(p.id, lambda v: v._replace(kind=OR_NULL[v.kind], id=v.id if keep else 0))
    return [(st, ok_pc), (null, null_pc)] if ok_pc == nxt else [(null, null_pc), (st, ok_pc)]


# ---- calls and exit ------------------------------------------------------------------------------------

def _call(env: Env, st: State, insn: Insn) -> Succ:
    if insn.src == isa.CALL_LOCAL:
        return _local_call(env, st, insn)
    h = HELPERS.get(insn.imm)
    if h is None:
        # The kernel's spellings: "unknown func NAME#N" for a helper with a name, else "invalid func unknown#N".
        if is_linux_helper(insn.imm):
            name = helper_name(insn.imm)
            why = _NOT_WRITTEN.get(name, "a Linux helper egpu does not provide" +
                                   (f": {_INSTEAD[name]}" if name in _INSTEAD else ""))
            raise Reject(f"unknown func {name}#{insn.imm} ({why})")
        if insn.imm in _BPFTIME_NOT_PROVIDED:
            name, instead = _BPFTIME_NOT_PROVIDED[insn.imm]
            raise Reject(f"unknown func {name}#{insn.imm} (bpftime's GPU helper egpu does not provide: {instead})")
        if insn.imm in _BPFTIME_IDS:
            raise Reject(f"invalid func unknown#{insn.imm} (an id in bpftime's GPU helpers' range that egpu does not "
                         f"provide: it provides {min(_BPFTIME_PROVIDED)}-{max(_BPFTIME_PROVIDED)})")
        raise Reject(f"invalid func unknown#{insn.imm} (helper id)")
    if h.in_process and env.layout not in _IN_PROCESS:
        raise Reject(f"bpf_{h.name}#{h.id} reads the application's memory: only uprobes and host-API programs, which "
                     f"run in its threads, may call it ({_READS} elsewhere)")
    f = st.top
    m: int | None = None
    mem: tuple[int, Value, str] | None = None   # (arg, pointer, its kind: mem, mem_out or record)
    key: int | None = None   # a key known when verifying
    release = size = callback = 0
    for n, arg in enumerate(h.args, 1):
        v = f.regs[n]
        if arg == "anything" and h.name in _VARIADIC:
            if v.kind == MAP_VALUE:
                env.note_use(v.aux, "address")   # bpf_printk("%p", &counter) shows the SM's row
            continue
        if v.kind == NOT_INIT:
            raise Reject(f"r{n} is not initialized (!read_ok): arg{n} of {h.name}")
        if arg == "map":
            m = _map_arg(env, insn, h, n, v)
        elif arg in ("key", "value", "value_out"):
            md = env.maps[m]
            need = md.key_size if arg == "key" else md.value_size
            # a bloom filter's peek reads the value it tests; a queue's or stack's fills it in. A value stored
            # may hold bytes never written (a struct's padding), as Linux's privileged programs' may: they mean
            # nothing there, where in a key, or in a bloom filter's value, they would choose the entry
            _helper_mem(env, st, h, n, v, need, write=arg == "value_out" and md.type != MAP_BLOOM_FILTER,
                        unwritten=arg == "value" and md.type != MAP_BLOOM_FILTER)
            if arg == "key":  # a constant key folds to an address
                key = _stack_const(st, v, need)
                env.note_const(insn.pc, key)
                if v.kind == STACK and v.is_const and need <= 8:
                    o = v.off + v.smin
                    env.wants.extend(slot_key(v.aux, k) for k in range(_slot_of(o + need - 1)[0], _slot_of(o)[0] + 1))
        elif arg in ("mem", "mem_out", "record"):
            mem = (n, v, arg)
        elif arg == "size":
            env.want(st, n)
            _size_arg(h, n, v)
            _helper_mem(env, st, h, mem[0], mem[1], v.umax, write=mem[2] == "mem_out",
                        unwritten=mem[2] == "record")
        elif arg == "const_size":
            env.want(st, n)
            if v.kind != SCALAR or not v.is_const:
                raise Reject(f"r{n} is not a constant: {h.name} needs a size known when verifying (arg{n})")
            if v.tv > env.maps[m].max_entries:
                raise Reject(f"record of {v.tv} bytes exceeds ringbuf {env.maps[m].name} of "
                             f"{env.maps[m].max_entries} (arg{n} of {h.name})")
            size = v.tv
        elif arg == "u64_out":
            _helper_mem(env, st, h, n, v, 8, write=True)
        elif arg == "ctx":
            env.want(st, n)
            if not ((v.kind == CTX and v.off == 0 and v.is_const) or (v.kind == SCALAR and v.is_const and v.tv == 0)):
                raise Reject(f"r{n} is {v.kind}, {h.name} needs the unmodified ctx pointer from r1 (arg{n})")
        elif arg == "func":
            if v.kind != FUNC:
                raise Reject(f"r{n} is {v.kind}, {h.name} needs a static function's address, its callback (arg{n})")
            callback = v.aux
        elif arg == "callback_ctx":
            if v.kind not in (STACK, MAP_VALUE, SCALAR):
                hint = ": compare it with 0 first" if v.kind in OR_NULL else ""
                raise Reject(f"r{n} is {v.kind}, {h.name} passes its callback a pointer to the stack or a map value, "
                             f"or a number (arg{n}{hint})")
        elif arg == "ringbuf_mem":
            if v.kind != RINGBUF_MEM:
                hint = ": compare it with 0 first" if v.kind == RINGBUF_MEM_OR_NULL else ""
                raise Reject(f"r{n} is {v.kind}, {h.name} needs a record from ringbuf_reserve (arg{n}{hint})")
            if v.off or not v.is_const or v.tv:
                raise Reject(f"r{n} points inside the record (off={v.off}): {h.name} needs the pointer "
                             f"ringbuf_reserve returned (arg{n})")
            release = v.id
        elif v.is_pointer:  # anything
            raise Reject(f"r{n} leaks addr into {h.name} (arg{n} is {v.kind})")
        if v.kind in (STACK, MAP_VALUE, RINGBUF_MEM):
            env.note_arg(st, insn.pc, n, v)
    if h.name == "trace_printk":
        _printk_format(env, f.regs[1], f.regs[2])
    if h.name == "map_update_elem":
        env.want(st, 4)   # BPF_NOEXIST or not: whether an array's slot may change
    if m is not None and h.name != "map_lookup_elem" and not (h.name == "map_update_elem" and _noexist(f.regs[4])):
        env.note_use(m, "helper")
    if release:
        st.update_id(release, lambda v: None)
        st.refs.pop(release, None)
    if h.name == "exit":  # bpftime's exit ends the probe here, from any frame: nothing may stay reserved
        no_leaked_refs(st, " before bpf_exit()")
        return []
    if h.name == "loop":
        return _loop(env, st, insn, callback)
    longest = f.regs[h.args.index("size") + 1].umax if h.ret == "size_or_errno" else 0
    for r in range(1, 6):
        f.regs[r] = NOT_INIT_VALUE
    if h.ret == "size_or_errno":   # the kernel's do_refine_retval_range
        f.regs[0] = bounded(smin=-_MAX_ERRNO, smax=longest)
    elif h.ret == "map_value_or_null" and _never_null(env.maps[m], key):
        f.regs[0] = pointer(MAP_VALUE, aux=m)
    elif h.ret == "map_value_or_null":
        f.regs[0] = pointer(MAP_VALUE_OR_NULL, aux=m, id=env.new_id())
    elif h.ret == "ringbuf_mem_or_null":
        ref = env.new_id()
        st.refs[ref] = insn.pc
        f.regs[0] = pointer(RINGBUF_MEM_OR_NULL, aux=size, id=ref)
    else:
        f.regs[0] = NOT_INIT_VALUE if h.ret == "void" else UNKNOWN
    return [(st, insn.pc + 1)]


def _printk_format(env: Env, fmt: Value, size: Value) -> None:
    """A format in read-only data (bpf_printk's) must be one the host prints as Linux would: the probe sends
    its arguments as numbers, so %s would print as the two characters it is, and a conversion Linux
    refuses (%f, %pB) as written, taking no argument."""
    if fmt.kind != MAP_VALUE or not fmt.is_const or size.kind != SCALAR or not size.is_const:
        return
    m = env.maps[fmt.aux]
    if not m.readonly or m.initial is None:
        return
    start = fmt.off + fmt.tv
    text = m.initial[start:start + size.tv].split(b"\0", 1)[0]
    decoded = text.decode("utf-8", "replace")
    if (why := printk_refusal(decoded)) is not None:
        raise Reject(f'format "{decoded.encode("unicode_escape").decode()}": {why}')


def _noexist(flags: Value) -> bool:
    return flags.kind == SCALAR and flags.is_const and flags.tv == BPF_NOEXIST


def _never_null(md: MapDef, key: int | None) -> bool:
    """A lookup that finds its value on every engine: an array's, with a key known below max_entries (Linux
    6.14's can_elide_value_nullness, so its r0 needs no NULL check; the key's stack bytes are wanted above)."""
    return md.type in (MAP_ARRAY, MAP_PERCPU_ARRAY) and key is not None and key < md.max_entries


def _stack_const(st: State, v: Value, size: int) -> int | None:
    """The bytes [v, v + size) as a number when v is a stack pointer at a known offset to known bytes."""
    if v.kind != STACK or not v.is_const or size > 8:
        return None
    o = v.off + v.smin
    if _slot_of(o)[0] != _slot_of(o + size - 1)[0]:
        return None
    got = _stack_read(st.frames[v.aux], o, size, False, False)
    return got.tv if got.is_const else None


def _map_arg(env: Env, insn: Insn, h: Helper, n: int, v: Value) -> int:
    if v.kind != MAP_PTR:
        raise Reject(f"r{n} is {v.kind}, {h.name} needs a map (arg{n})")
    md = env.maps[v.aux]
    if md.type not in MAP_TYPES_FOR_HELPER[h.name]:
        kind = MAP_TYPE_NAMES.get(md.type, str(md.type))
        raise Reject(f"map {md.name} of type {kind} cannot be used with {h.name} (arg{n} map type)")
    if h.name in _WRITES_MAP and not md.prog_writes:
        raise Reject(f"write into read-only map {md.name} ({h.name})")
    env.note_map(insn.pc, v.aux)
    return v.aux


def _size_arg(h: Helper, n: int, v: Value) -> None:
    if v.is_pointer:
        raise Reject(f"r{n} leaks addr into {h.name} (arg{n} is {v.kind}, a size)")
    if v.smin < 0 and v.umax > MAX_OFF:
        raise Reject(f"r{n} min value is negative: use an unsigned size or 'if (n < N)' (arg{n} of {h.name})")
    if v.umax > MAX_OFF:
        raise Reject(f"r{n} unbounded memory access: bound the size with 'if (n < N)' (arg{n} of {h.name})")


def _helper_mem(env: Env, st: State, h: Helper, n: int, v: Value, size: int, *, write: bool,
                unwritten: bool = False) -> None:
    """Memory a helper reads or writes: ``size`` bytes (the largest possible) at v; ``unwritten``: stack bytes
    never written may be read (a ``record``, or a ``value`` but a bloom filter's: helpers.py)."""
    if v.kind in OR_NULL:
        raise Reject(f"r{n} is {v.kind}: compare it with 0 before passing it to {h.name} (arg{n})")
    if v.kind not in (STACK, MAP_VALUE, RINGBUF_MEM):
        raise Reject(f"r{n} is {v.kind}, {h.name} needs a pointer to stack or map memory (arg{n})")
    if size == 0:
        return
    _bounded(v, v.kind, n)
    lo, hi = v.off + v.smin, v.off + v.smax + size
    if v.kind == MAP_VALUE:
        md = env.maps[v.aux]
        env.note_use(v.aux, "helper")
        if denied := _map_denied(md, "write" if write else "read"):
            raise Reject(f"{denied[0]} (arg{n} of {h.name})")
        _within(v, v.off, size, md.value_size, "map value", "value_size", n)
        return
    if v.kind == RINGBUF_MEM:
        _within(v, v.off, size, v.aux, "ringbuf record", "size", n)
        return
    if lo < -isa.STACK_SIZE or hi > 0:
        raise Reject(f"invalid stack access off={_off(v, v.off)} size={size}, the frame is "
                     f"[-{isa.STACK_SIZE}, 0) (arg{n} of {h.name})")
    env.note_depth(st, v.aux, lo)
    f = st.frames[v.aux]
    for o in range(lo, hi):
        k, i = _slot_of(o)
        slot = f.stack.get(k)
        if write:
            if slot is not None and slot.holds_pointer and not (v.is_const and lo <= -8 * (k + 1) and -8 * k <= hi):
                raise Reject(f"{h.name} may overwrite part of the spilled {slot.spill.kind} at fp{-8 * (k + 1)} "
                             f"(arg{n} register spill)")
            if v.is_const:  # written for sure
                b = UNINIT_SLOT_BYTES if slot is None else slot.as_data().bytes
                f.stack[k] = Slot(b[:i] + "m" + b[i + 1:], None)
            elif slot is not None and slot.spill is not None:
                f.stack[k] = slot.as_data()
            continue
        if (slot is None or slot.bytes[i] == "u") and not unwritten:
            raise Reject(f"invalid read from stack off={o} size=1: not initialized ({h.name} arg{n})"
                         + _padding_hint(f, lo, hi))
        if slot is not None and slot.spill is not None and slot.spill.is_pointer:
            raise Reject(f"r{n} leaks addr into {h.name}: fp{-8 * (k + 1)} holds {slot.spill.kind} (arg{n})")


def _padding_hint(f: Frame, lo: int, hi: int) -> str:
    """Where a helper's memory argument is partly written: most often a struct key's padding, which the
    kernel's privileged programs may pass (and hash as whatever the stack held) and egpu does not (a value's and a
    record's, which choose nothing, it passes)."""
    slots = [_slot_of(o) for o in range(lo, hi)]
    written = sum(1 for k, i in slots if (slot := f.stack.get(k)) is not None and slot.bytes[i] != "u")
    return (f"; {written} of its {hi - lo} bytes written: a struct's padding? clear the struct first "
            "(__builtin_memset)") if written else ""


def _local_call(env: Env, st: State, insn: Insn) -> Succ:
    """A new frame: r1-r5 passed, r6-r9 unset, its own 512-byte stack; the caller's r0-r5 are clobbered."""
    if len(st.frames) >= MAX_FRAMES:
        raise Reject(f"the call stack of {len(st.frames) + 1} frames is too deep (max {MAX_FRAMES})")
    caller = st.top
    target = insn.call_target()
    regs = [NOT_INIT_VALUE] * 11
    regs[1:6] = caller.regs[1:6]
    regs[FP] = pointer(STACK, aux=len(st.frames))
    for r in range(6):
        caller.regs[r] = NOT_INIT_VALUE
    st.frames.append(Frame(regs, {}, insn.pc, env.cfg.subprog_of[target]))
    return [(st, target)]


def _loop(env: Env, st: State, insn: Insn, callback: int) -> Succ:
    """bpf_loop: the loop's header, reached before each round. Either the caller goes on (r0 the rounds made,
    r1-r5 clobbered) or the callback runs once more: a new frame, r1 the index below nr_loops (its low 32 bits,
    at most MAX_LOOPS), r2 the ctx, r3-r5 unset; its exit comes back here (_exit), with whatever it wrote
    through the ctx in the caller's frames, until the search finds a round covered (verifier's _Search)."""
    env.note_callback(insn.pc, callback)
    env.want(st, 1)   # nr_loops bounds the index
    f = st.top
    nr = f.regs[1]
    rounds = min(nr.umax if nr.umax <= M32 else M32, MAX_LOOPS)
    succ: Succ = []
    if rounds:
        if len(st.frames) >= MAX_FRAMES:
            raise Reject(f"the call stack of {len(st.frames) + 1} frames is too deep (max {MAX_FRAMES}): bpf_loop's "
                         "callback takes one")
        inner = st.copy()
        regs = [NOT_INIT_VALUE] * 11
        regs[1], regs[2] = bounded(0, rounds - 1), f.regs[3]
        regs[FP] = pointer(STACK, aux=len(st.frames))
        inner.frames.append(Frame(regs, {}, insn.pc, env.cfg.subprog_of[callback]))
        succ.append((inner, callback))
    for r in range(1, 6):
        f.regs[r] = NOT_INIT_VALUE
    f.regs[0] = UNKNOWN
    return succ + [(st, insn.pc + 1)]


def _exit(env: Env, st: State, insn: Insn) -> Succ:
    """Return to the caller, or end the program: r0 a scalar, every reserved record released. A
    subprogram's r0 goes back as it is, set or not (the kernel's prepare_func_exit): clang drops the
    result of a call whose value is unused, and a caller that reads it is refused there."""
    r0 = st.top.regs[0]
    if r0.kind == NOT_INIT and len(st.frames) == 1:
        raise Reject("r0 is not initialized at exit (!read_ok)")
    if len(st.frames) > 1 and st.top.callsite in env.cfg.loop_calls:   # a callback's round ends: the next, or not
        env.want(st, 0)
        if r0.kind != SCALAR or r0.umax > 1:
            raise Reject(f"the callback returns {'nothing' if r0.kind == NOT_INIT else fmt_value(r0, env.maps)}: "
                         "bpf_loop's callback returns 0 (go on) or 1 (stop) (callback return)")
        return [(st, st.frames.pop().callsite)]
    if len(st.frames) > 1:
        if r0.kind == STACK and r0.aux == len(st.frames) - 1:
            raise Reject("cannot return a pointer to the callee's stack (r0)")
        callee = st.frames.pop()
        st.top.regs[0] = r0
        return [(st, callee.callsite + 1)]
    if r0.is_pointer:
        raise Reject(f"r0 leaks addr as return value (r0 is {r0.kind})")
    no_leaked_refs(st, "")
    return []


def no_leaked_refs(st: State, where: str) -> None:
    """The program ends here: every record reserved on this path was submitted or discarded."""
    if st.refs:
        ref, pc = min(st.refs.items())
        raise Reject(f"unreleased reference id={ref} from ringbuf_reserve at {pc}: submit or discard it{where} "
                     "on every path (reference leak)")


STEP: dict[str, Callable[[Env, State, Insn], Succ]] = {
    "alu": _alu, "mov": _alu, "neg": _unary, "end": _unary, "movsx": _unary, "lddw": _lddw,
    "load": _load, "store": _store, "atomic": _atomic, "ja": _ja, "jmp": _jmp, "call": _call, "exit": _exit,
}
