"""eBPF instructions -> PTX statements: one translation function per instruction kind.

``HANDLERS`` is keyed on ``isa.OpSpec.kind`` and each handler opens with the RFC 9669 semantics it
implements; helper calls go to helpers_ptx.py. ``generate_func`` turns a whole program into a ``.func``.
"""

from __future__ import annotations

from ..bpf import isa
from ..bpf.decode import Insn
from ..bpf.helpers import LOOP
from ..bpf.verifier import VerifiedProgram
from . import helpers_ptx
from .devmaps import layout
from .emitter import TABLE_PARAM, Addr, FuncGen, Target, ctx_word_param, lit, sext32, slit


def generate_func(insns: list[Insn], target: Target, name: str, params: list[str],
                  verified: VerifiedProgram | None) -> str:
    """The complete ``.func (.param .b64 %ret) name(.param .b64 <params>...)`` for a program, using what
    the verifier proved about it (None: a program it refused, which only execute_on_gpu runs). With
    ``target.table_param`` the map table's address is one more parameter, TABLE_PARAM, after them."""
    g = FuncGen(insns, target, HANDLERS, verified)
    g.body(helpers_ptx.count_loop_cut)
    formal = params + [ctx_word_param(w) for w in target.ctx_words or ()]
    formal += [TABLE_PARAM] if target.table_param else []
    head = f".func (.param .b64 %ret) {name}({', '.join(f'.param .b64 {p}' for p in formal)})"
    return "\n".join([head, "{", *g.declarations(), *g.prologue(params), *g.lines,
                      "\tst.param.b64 [%ret], %r0;", "\tret;", "}", ""])


# ---- one handler per instruction kind ------------------------------------------------------------

_SIMPLE = {"add": "add.u", "sub": "sub.u", "mul": "mul.lo.u", "or": "or.b", "and": "and.b", "xor": "xor.b"}
_SHIFT = {"lsh": "shl.b", "rsh": "shr.u", "arsh": "shr.s"}


def alu(g: FuncGen, insn: Insn) -> None:
    """dst = dst OP src (RFC 9669 4.1). 32-bit forms use the low halves and zero-extend the result;
    shift counts are masked to the width; imm is sign-extended to 64 bits."""
    w, op, d = insn.width, insn.op, g.reg(insn.dst)
    a = d if w == 64 else g.lo32(d)
    s = g.src64(insn) if w == 64 else g.src32(insn)
    res = d if w == 64 else g.t32()
    if op in _SIMPLE:
        g.emit(f"{_SIMPLE[op]}{w} {res}, {a}, {s};")
    elif op in _SHIFT:
        if insn.use_imm:
            amt = str(insn.imm & (w - 1))
        else:
            amt = g.lo32(s) if w == 64 else s
            g.emit(f"and.b32 {amt}, {amt}, {w - 1};")
        g.emit(f"{_SHIFT[op]}{w} {res}, {a}, {amt};")
    else:
        _divmod(g, insn, w, a, s, res)
    if w == 32:
        g.emit(f"cvt.u64.u32 {d}, {res};")


def _divmod(g: FuncGen, insn: Insn, w: int, a: str, s: str, res: str) -> None:
    """RFC 9669 4.1: x / 0 = 0, x % 0 = x; signed forms truncate toward zero (C), and since PTX leaves
    INT_MIN / -1 undefined, x s/ -1 = -x (wrapping) and x s% -1 = 0, as Linux computes them."""
    signed, is_mod = insn.op in ("sdiv", "smod"), insn.op in ("mod", "smod")
    ty, bt, ones = f"{'s' if signed else 'u'}{w}", f"b{w}", lit(-1, w)
    opname = "rem" if is_mod else "div"
    if insn.use_imm:
        k = insn.imm & ((1 << w) - 1)
        if k == 0:
            g.emit(f"mov.{bt} {res}, {a if is_mod else 0};")
        elif signed and k == (1 << w) - 1:
            g.emit(f"mov.{bt} {res}, 0;" if is_mod else f"neg.s{w} {res}, {a};")
        else:
            g.emit(f"{opname}.{ty} {res}, {a}, {slit(k, w) if signed else lit(k, w)};")
        return
    pz = g.pred()
    g.emit(f"setp.eq.{bt} {pz}, {s}, 0;")
    bad = pz
    if signed:
        pm, bad = g.pred(), g.pred()
        g.emit(f"setp.eq.{bt} {pm}, {s}, {ones};")
        g.emit(f"or.pred {bad}, {pz}, {pm};")
    safe, q = (g.t64(), g.t64()) if w == 64 else (g.t32(), g.t32())
    g.emit(f"selp.{bt} {safe}, 1, {s}, {bad};")
    g.emit(f"{opname}.{ty} {q}, {a}, {safe};")
    if signed:
        if is_mod:
            g.emit(f"selp.{bt} {q}, 0, {q}, {pm};")
        else:
            n = g.t64() if w == 64 else g.t32()
            g.emit(f"neg.s{w} {n}, {a};")
            g.emit(f"selp.{bt} {q}, {n}, {q}, {pm};")
    g.emit(f"selp.{bt} {res}, {a if is_mod else 0}, {q}, {pz};")


def neg(g: FuncGen, insn: Insn) -> None:
    """dst = -dst (RFC 9669 4.1), 32-bit form zero-extended."""
    d = g.reg(insn.dst)
    if insn.width == 64:
        g.emit(f"neg.s64 {d}, {d};")
    else:
        w = g.lo32(d)
        g.emit(f"neg.s32 {w}, {w};")
        g.emit(f"cvt.u64.u32 {d}, {w};")


def mov(g: FuncGen, insn: Insn) -> None:
    """dst = src: MOV64 imm sign-extends, MOV32 zero-extends the low 32 bits (RFC 9669 4.1)."""
    d = g.reg(insn.dst)
    if insn.use_imm:
        g.emit(f"mov.b64 {d}, {lit(sext32(insn.imm) if insn.width == 64 else insn.imm & 0xFFFFFFFF)};")
    elif insn.width == 64:
        if insn.src != insn.dst:
            g.emit(f"mov.b64 {d}, {g.reg(insn.src)};")
    else:
        g.emit(f"and.b64 {d}, {g.reg(insn.src)}, 0xFFFFFFFF;")


def movsx(g: FuncGen, insn: Insn) -> None:
    """dst = (s8|s16|s32) src, sign-extended to 64 bits, or to 32 bits and then zero-extended (MOVSX)."""
    d, s, bits = g.reg(insn.dst), g.reg(insn.src), 8 * insn.size
    if insn.width == 64:
        g.emit(f"cvt.s64.s{bits} {d}, {s};")
    else:
        w = g.t32()
        g.emit(f"cvt.s32.s{bits} {w}, {s};")
        g.emit(f"cvt.u64.u32 {d}, {w};")


def end(g: FuncGen, insn: Insn) -> None:
    """Byte swaps (RFC 9669 4.2): le = truncate to imm bits on this little-endian target; be and bswap
    reverse the low imm bits' bytes; the result is zero-extended."""
    d, bits = g.reg(insn.dst), insn.imm
    if insn.op == "le":
        if bits < 64:
            g.emit(f"and.b64 {d}, {d}, {lit((1 << bits) - 1)};")
        return
    if bits == 64:
        lo, hi, nlo, nhi = g.t32(), g.t32(), g.t32(), g.t32()
        g.emit(f"mov.b64 {{{lo}, {hi}}}, {d};")
        g.emit(f"prmt.b32 {nlo}, {hi}, 0, 0x0123;")
        g.emit(f"prmt.b32 {nhi}, {lo}, 0, 0x0123;")
        g.emit(f"mov.b64 {d}, {{{nlo}, {nhi}}};")
        return
    w = g.lo32(d)
    # prmt selector nibbles pick result bytes 0..3; 4 selects a byte of the zero operand.
    g.emit(f"prmt.b32 {w}, {w}, 0, {'0x4401' if bits == 16 else '0x0123'};")
    g.emit(f"cvt.u64.u32 {d}, {w};")


_CMP = {"jeq": "eq.b", "jne": "ne.b", "jgt": "gt.u", "jge": "ge.u", "jlt": "lt.u", "jle": "le.u",
        "jsgt": "gt.s", "jsge": "ge.s", "jslt": "lt.s", "jsle": "le.s"}


def jmp(g: FuncGen, insn: Insn) -> None:
    """if (dst OP src) goto +off (RFC 9669 4.3); JMP32 compares the low halves; imm is sign-extended."""
    w, signed = insn.width, _CMP.get(insn.op, "").endswith(".s")
    a = g.reg(insn.dst) if w == 64 else g.lo32(g.reg(insn.dst))
    s = g.src64(insn, signed) if w == 64 else g.src32(insn, signed)
    p = g.pred()
    if insn.op == "jset":
        t = g.t64() if w == 64 else g.t32()
        g.emit(f"and.b{w} {t}, {a}, {s};")
        g.emit(f"setp.ne.b{w} {p}, {t}, 0;")
    else:
        g.emit(f"setp.{_CMP[insn.op]}{w} {p}, {a}, {s};")
    g.charge(insn, p)
    g.emit(f"@{p} bra {g.jump_label(insn.jump_target())};")


def ja(g: FuncGen, insn: Insn) -> None:
    """goto +off (JA) or +imm (JA32, gotol)."""
    g.charge(insn)
    g.emit(f"bra {g.jump_label(insn.jump_target())};")


def exit_(g: FuncGen, insn: Insn) -> None:
    """Return r0 to the caller frame, or from the probe."""
    g.emit(f"bra {g.ret_label};")


def lddw(g: FuncGen, insn: Insn) -> None:
    """dst = imm64, or a map / a map value address after loading (RFC 9669 5.4, libbpf fd_array form), or a
    function's address (a callback: its pc)."""
    d = g.reg(insn.dst)
    if insn.src == isa.LDDW_IMM64:
        g.emit(f"mov.b64 {d}, {lit(insn.imm)};")
    elif insn.src in (isa.LDDW_MAP_IDX, isa.LDDW_MAP_IDX_VALUE):
        index = insn.imm & 0xFFFFFFFF
        m = g.map_def(insn, index)
        g.table_entry(d, index)
        if insn.src == isa.LDDW_MAP_IDX_VALUE:
            lay = layout(m)
            if lay.stripe:   # striped global data: this SM's copy
                helpers_ptx.sm_row(g, d, lay)
            off = lay.value_off + (insn.imm >> 32)  # the single value of a global-data map
            if off:
                g.emit(f"add.u64 {d}, {d}, {off};")
    elif insn.src == isa.LDDW_CODE_ADDR:   # only bpf_loop takes it, and it knows its callback (loop_call)
        g.emit(f"mov.b64 {d}, {insn.callback};")
    else:
        raise g.fail(insn, f"lddw with pseudo source {insn.src} is left unresolved by the loader")


def load(g: FuncGen, insn: Insn) -> None:
    """dst = *(size *)(src + off), zero-extended (LDX) or sign-extended (LDXSX)."""
    if g.ctx_load(insn):
        return
    a = g.address(insn, insn.src, insn.size)
    g.load(g.reg(insn.dst), a, insn.size, insn.spec.signed)


def store(g: FuncGen, insn: Insn) -> None:
    """*(size *)(dst + off) = src or imm (ST/STX); imm is sign-extended, then truncated to size."""
    a = g.address(insn, insn.dst, insn.size)
    g.store(sext32(insn.imm) if insn.use_imm else g.reg(insn.src), a, insn.size)


_RMW = {"add": "add.u", "or": "or.b", "and": "and.b", "xor": "xor.b", "xchg": "exch.b"}


def atomic(g: FuncGen, insn: Insn) -> None:
    """Atomic read-modify-write of *(dst + off) (RFC 9669 5.3): add/or/and/xor, whose FETCH form loads
    the old value into src; xchg; cmpxchg, which compares with r0 and loads the old value into r0.
    32-bit forms zero-extend what they load. Map values and ringbuf records lie in the maps' device memory
    (emitter.SPACES): atom/red.global, on the address cvta.to.global gives. Stack slots are thread-private
    and a misaligned address cannot be atomic on a GPU (it faults), so both take a plain read-modify-write:
    what one thread observes is the same. PTX atomics on generic addresses that point to local memory are
    undefined, so a generic base (a "mixed" region, or an unverified program) is tested with isspacep.local
    at run time, and for alignment too when nothing proved it."""
    a = g.address(insn, insn.dst, insn.size)
    if a.space == ".local" or a.aligned is False:
        _rmw_plain(g, insn, a)
    elif a.space == ".global":
        _rmw_atomic(g, insn, a)
    else:
        p = g.t64()
        g.emit(f"add.u64 {p}, {a.base}, {a.off};")
        slow = g.pred()
        g.emit(f"isspacep.local {slow}, {p};")
        if a.aligned is None:
            g.emit(f"or.pred {slow}, {slow}, {g.misaligned(p, insn.size)};")
        g.either(slow, lambda: _rmw_atomic(g, insn, Addr("", p, 0, True)),
                 lambda: _rmw_plain(g, insn, Addr("", p, 0, a.aligned)))


def _rmw_plain(g: FuncGen, insn: Insn, a: Addr) -> None:
    op, size, src = insn.atomic_op, insn.size, g.reg(insn.src)
    old = g.t64()
    g.load(old, a, size)
    if op == "cmpxchg":
        cmp = g.reg(0)
        if size == 4:
            cmp = g.t64()
            g.emit(f"and.b64 {cmp}, {g.reg(0)}, 0xFFFFFFFF;")
        p = g.pred()
        g.emit(f"setp.ne.b64 {p}, {old}, {cmp};")
        skip = g.label()
        g.emit(f"@{p} bra {skip};")
        g.store(src, a, size)
        g.place(skip)
        g.emit(f"mov.b64 {g.reg(0)}, {old};")
        return
    if op == "xchg":
        g.store(src, a, size)
    else:
        new = g.t64()
        g.emit(f"{_RMW[op]}64 {new}, {old}, {src};")
        g.store(new, a, size)
    if insn.fetch:
        g.emit(f"mov.b64 {src}, {old};")


def _rmw_atomic(g: FuncGen, insn: Insn, a: Addr) -> None:
    op, w, src = insn.atomic_op, insn.width, g.reg(insn.src)
    const = g.const(insn.pc) if op == "add" else None
    if const is not None:
        _warp_add(g, insn, a, const)
        return
    v = src if w == 64 else g.lo32(src)
    if op == "cmpxchg":
        cmp = g.reg(0) if w == 64 else g.lo32(g.reg(0))
        old = g.t64() if w == 64 else g.t32()
        g.emit(f"atom{a.space}.cas.b{w} {old}, {a.at()}, {cmp}, {v};")
        g.emit(f"mov.b64 {g.reg(0)}, {old};" if w == 64 else f"cvt.u64.u32 {g.reg(0)}, {old};")
    elif not insn.fetch:
        g.emit(f"red{a.space}.{_RMW[op]}{w} {a.at()}, {v};")
    else:
        old = g.t64() if w == 64 else g.t32()
        g.emit(f"atom{a.space}.{_RMW[op]}{w} {old}, {a.at()}, {v};")
        g.emit(f"mov.b64 {src}, {old};" if w == 64 else f"cvt.u64.u32 {src}, {old};")


def _warp_add(g: FuncGen, insn: Insn, a: Addr, c: int) -> None:
    """Add a constant with one atomic per group of lanes hitting the same address: match.any.sync groups
    the active lanes by address, the lowest lane adds c * popc(group), and for FETCH it broadcasts the
    old value (shfl.sync) so that each lane sees old + c * (its rank in the group), as if the lanes had
    added one after the other in lane order (PTX ISA: match.sync, activemask, shfl.sync; sm_70+)."""
    w, src = insn.width, g.reg(insn.src)
    p = g.t64()
    g.emit(f"add.u64 {p}, {a.base}, {a.off};")
    mask, peers = g.t32(), g.t32()
    g.emit(f"activemask.b32 {mask};")
    g.emit(f"match.any.sync.b64 {peers}, {p}, {mask};")
    rank, n, lead = helpers_ptx.group_rank(g, peers)
    if w == 64:
        tot = g.t64()
        g.emit(f"cvt.u64.u32 {tot}, {n};")
        g.emit(f"mul.lo.u64 {tot}, {tot}, {lit(c)};")
    else:
        tot = g.t32()
        g.emit(f"mul.lo.u32 {tot}, {n}, {lit(c, 32)};")
    if not insn.fetch:
        g.emit(f"@{lead} red{a.space}.add.u{w} [{p}], {tot};")
        return
    old = g.t64() if w == 64 else g.t32()
    g.emit(f"mov.b{w} {old}, 0;")
    g.emit(f"@{lead} atom{a.space}.add.u{w} {old}, [{p}], {tot};")
    helpers_ptx.from_leader(g, old, w, helpers_ptx.group_leader(g, peers), peers)
    if w == 64:
        r64 = g.t64()
        g.emit(f"cvt.u64.u32 {r64}, {rank};")
        g.emit(f"mad.lo.u64 {src}, {r64}, {lit(c)}, {old};")
    else:
        g.emit(f"mad.lo.u32 {old}, {rank}, {lit(c, 32)}, {old};")
        g.emit(f"cvt.u64.u32 {src}, {old};")



def call(g: FuncGen, insn: Insn) -> None:
    """A helper (inlined PTX; bpf_loop a loop around its callback) or a static subprogram (inlined with its own
    frame)."""
    if insn.src == isa.CALL_LOCAL:
        g.inline_call(insn)
        return
    if insn.helper == LOOP:
        g.loop_call(insn)
        return
    helpers_ptx.emit_helper(g, insn)


HANDLERS = {"alu": alu, "neg": neg, "mov": mov, "movsx": movsx, "end": end, "jmp": jmp, "ja": ja,
            "exit": exit_, "lddw": lddw, "load": load, "store": store, "atomic": atomic, "call": call}
