"""Transfer functions on scalars: ALU results and what a conditional jump teaches about its operands.

Constants are computed exactly by bpf/alu.py, the VM's own RFC 9669 arithmetic; everything else by
interval and tnum arithmetic, as the Linux verifier does.
"""

from __future__ import annotations

from .. import alu as concrete
from .value import (M32, M64, S32_MAX, S32_MIN, S64_MAX, S64_MIN, SCALAR, UNKNOWN, Value, bounded, const,
                    fits_s32, fits_u32, intersect, lo32, s64, sext32, sync, t_add, t_and, t_arsh, t_mul, t_or, t_sub,
                    t_xor)


def _t(v: Value) -> tuple[int, int]:
    return v.tv, v.tm


def _add(a: Value, b: Value) -> Value:
    umin, umax = a.umin + b.umin, a.umax + b.umax
    if umax > M64:
        umin, umax = 0, M64
    smin, smax = a.smin + b.smin, a.smax + b.smax
    if smin < S64_MIN or smax > S64_MAX:
        smin, smax = S64_MIN, S64_MAX
    return bounded(umin, umax, smin, smax, t_add(_t(a), _t(b)), _low_halves(
        (a.u32min + b.u32min, a.u32max + b.u32max), (a.s32min + b.s32min, a.s32max + b.s32max)))


def _sub(a: Value, b: Value) -> Value:
    umin, umax = (a.umin - b.umax, a.umax - b.umin) if a.umin >= b.umax else (0, M64)
    smin, smax = a.smin - b.smax, a.smax - b.smin
    if smin < S64_MIN or smax > S64_MAX:
        smin, smax = S64_MIN, S64_MAX
    return bounded(umin, umax, smin, smax, t_sub(_t(a), _t(b)), _low_halves(
        (a.u32min - b.u32max, a.u32max - b.u32min), (a.s32min - b.s32max, a.s32max - b.s32min)))


def _low_halves(u: tuple[int, int], s: tuple[int, int]) -> tuple[int, int, int, int]:
    """The low half's bounds of a sum or difference, which is the 32-bit sum or difference of the low halves
    (the kernel's scalar32_min_max_add and _sub): each pair kept where it does not wrap."""
    u = u if 0 <= u[0] and u[1] <= M32 else (0, M32)
    s = s if S32_MIN <= s[0] and s[1] <= S32_MAX else (S32_MIN, S32_MAX)
    return (*u, *s)


def _mul(a: Value, b: Value) -> Value:
    t = t_mul(_t(a), _t(b))
    if a.umax * b.umax <= M64:
        return bounded(a.umin * b.umin, a.umax * b.umax, t=t)
    return bounded(t=t)


def _div(a: Value, b: Value) -> Value:
    if b.umax == 0:
        return const(0)
    if b.umin == 0:  # the divisor may be 0, which gives 0
        return bounded(0, a.umax)
    return bounded(a.umin // b.umax, a.umax // b.umin)


def _mod(a: Value, b: Value) -> Value:
    if b.umax == 0 or a.umax < b.umin:  # modulo by zero keeps the dividend; x % d == x when x < d
        return a.var
    return bounded(0, a.umax if b.umin == 0 else min(a.umax, b.umax - 1))


def _shift(op: str, a: Value, b: Value, bits: int) -> Value:
    if not b.is_const:
        return bounded(0, a.umax) if op == "rsh" else UNKNOWN
    s = b.tv & (bits - 1)
    if op == "lsh":
        t = ((a.tv << s) & M64, (a.tm << s) & M64)
        if a.umax << s <= M64:
            return bounded(a.umin << s, a.umax << s, t=t)
        if s == 32:   # the low half, now the high one: what clang's `<<= 32; s>>= 32` sign-extends
            return bounded(smin=a.s32min << 32, smax=a.s32max << 32, t=t)
        return bounded(t=t)
    if op == "rsh":
        return bounded(a.umin >> s, a.umax >> s, t=(a.tv >> s, a.tm >> s))
    return bounded(smin=a.smin >> s, smax=a.smax >> s, t=t_arsh(_t(a), s, 64))


def _binary(op: str, a: Value, b: Value, bits: int) -> Value:
    """A 64-bit-wide abstract result; 32-bit callers pass zero-extended (or, for arsh, sign-extended) operands."""
    if op == "add":
        return _add(a, b)
    if op == "sub":
        return _sub(a, b)
    if op == "mul":
        return _mul(a, b)
    if op == "div":
        return _div(a, b)
    if op == "mod":
        return _mod(a, b)
    if op == "and":   # under a mask of 32 bits, at most the other's low half (clang's r1 &= 0xf after w1 < 10)
        hi = min(a.umax, b.umax, *(lo32(x).umax for x, mask in ((a, b), (b, a)) if mask.umax <= M32))
        return bounded(0, hi, t=t_and(_t(a), _t(b)))
    if op == "or":
        return bounded(max(a.umin, b.umin), t=t_or(_t(a), _t(b)))
    if op == "xor":
        return bounded(t=t_xor(_t(a), _t(b)))
    if op in ("lsh", "rsh", "arsh"):
        return _shift(op, a, b, bits)
    return UNKNOWN  # sdiv, smod of non-constants


def alu(op: str, width: int, a: Value, b: Value) -> Value:
    """``a op b`` for scalars (a's bounds are ignored for mov)."""
    if op == "mov":
        return lo32(b) if width == 32 else b
    if a.is_const and b.is_const:
        return const(concrete.binary(op, width, a.tv, b.tv))
    if width == 64:
        return _binary(op, a, b, 64)
    a32, b32 = lo32(a), lo32(b)
    if op == "arsh":
        if not b32.is_const:
            return bounded(0, M32)
        return lo32(_shift("arsh", sext32(a32), b32, 32))
    return lo32(_binary(op, a32, b32, 32))


def neg(width: int, a: Value) -> Value:
    if a.is_const:
        return const(concrete.neg(width, a.tv))
    if width == 64 and a.smin > S64_MIN:
        return bounded(smin=-a.smax, smax=-a.smin)
    if width == 32 and a.s32min > S32_MIN:
        return bounded(0, M32, low=(0, M32, -a.s32max, -a.s32min))
    return UNKNOWN if width == 64 else bounded(0, M32)


def movsx(width: int, bits: int, a: Value) -> Value:
    """Sign-extend the low ``bits`` of ``a`` (RFC 9669 4.1 MOVSX); 32-bit forms zero-extend the result."""
    if a.is_const:
        return const(concrete.movsx(width, bits, a.tv))
    if a.umax < 1 << (bits - 1):
        v = a.var   # the sign bit is 0: the value is unchanged
    elif bits == 32:
        v = bounded(smin=a.s32min, smax=a.s32max)
    else:
        v = bounded(smin=-(1 << (bits - 1)), smax=(1 << (bits - 1)) - 1)
    return lo32(v) if width == 32 else v


def byteswap(op: str, bits: int, a: Value) -> Value:
    """le/be/bswap (RFC 9669 4.2) on a little-endian machine: le truncates, be and bswap reverse bytes."""
    mask = (1 << bits) - 1
    if a.is_const:
        return const(concrete.byteswap(op, bits, a.tv))
    if op == "le" and a.umax <= mask:
        return a.var
    return bounded(0, mask)


# ---- conditional jumps ------------------------------------------------------------------------------

NEGATE = {"jeq": "jne", "jne": "jeq", "jgt": "jle", "jle": "jgt", "jge": "jlt", "jlt": "jge", "jsgt": "jsle",
          "jsle": "jsgt", "jsge": "jslt", "jslt": "jsge", "jset": "jnset", "jnset": "jset"}
SIGNED_OPS = frozenset({"jsgt", "jsge", "jslt", "jsle"})


def outcome(op: str, a: Value, b: Value) -> bool | None:
    """Whether ``a op b`` always (True) or never (False) holds; None when both can happen."""
    if op == "jeq":
        if a.is_const and b.is_const:
            return a.tv == b.tv
        if a.umax < b.umin or b.umax < a.umin or a.smax < b.smin or b.smax < a.smin:
            return False
        return False if (a.tv ^ b.tv) & ~a.tm & ~b.tm else None
    if op == "jne":
        r = outcome("jeq", a, b)
        return None if r is None else not r
    if op == "jset":
        if a.tv & b.tv:
            return True
        return False if not (a.tv | a.tm) & (b.tv | b.tm) else None
    if op == "jnset":
        r = outcome("jset", a, b)
        return None if r is None else not r
    lo_a, hi_a, lo_b, hi_b = ((a.smin, a.smax, b.smin, b.smax) if op in SIGNED_OPS
                              else (a.umin, a.umax, b.umin, b.umax))
    if op in ("jgt", "jsgt"):
        return True if lo_a > hi_b else False if hi_a <= lo_b else None
    if op in ("jge", "jsge"):
        return True if lo_a >= hi_b else False if hi_a < lo_b else None
    if op in ("jlt", "jslt"):
        return True if hi_a < lo_b else False if lo_a >= hi_b else None
    return True if hi_a <= lo_b else False if lo_a > hi_b else None  # jle, jsle


def _narrow(v: Value, **bounds: int) -> Value | None:
    return sync(v._replace(**{k: (max(getattr(v, k), x) if k.endswith("min") else min(getattr(v, k), x))
                              for k, x in bounds.items()}))


def refine(op: str, a: Value, b: Value) -> tuple[Value, Value] | None:
    """``a`` and ``b`` narrowed by knowing ``a op b`` holds; None when it cannot hold."""
    if op == "jeq":
        both = intersect(a, b)
        return None if both is None else (both._replace(id=a.id), both._replace(id=b.id))
    if op == "jne":
        if a.is_const and b.is_const and a.tv == b.tv:
            return None
        return _exclude(a, b), _exclude(b, a)
    if op == "jset":
        if b.is_const and b.tv and b.tv & (b.tv - 1) == 0:  # one bit: it is set
            na = sync(a._replace(tv=a.tv | b.tv, tm=a.tm & ~b.tv))
            return None if na is None else (na, b)
        return a, b
    if op == "jnset":
        if b.is_const:  # every bit of b is clear in a
            na = sync(a._replace(tv=a.tv & ~b.tv, tm=a.tm & ~b.tv))
            return None if na is None else (na, b)
        return a, b
    if op in ("jlt", "jle", "jslt", "jsle"):  # a < b  <=>  b > a
        flipped = refine({"jlt": "jgt", "jle": "jge", "jslt": "jsgt", "jsle": "jsge"}[op], b, a)
        return None if flipped is None else (flipped[1], flipped[0])
    strict = 1 if op in ("jgt", "jsgt") else 0
    if op in SIGNED_OPS:
        na = _narrow(a, smin=b.smin + strict)
        nb = _narrow(b, smax=a.smax - strict)
    else:
        na = _narrow(a, umin=b.umin + strict)
        nb = _narrow(b, umax=a.umax - strict)
    if na is None or nb is None:
        return None
    return na, nb


def _exclude(a: Value, b: Value) -> Value:
    """``a`` knowing ``a != b``: only a constant at the edge of a's range can be cut off."""
    if not b.is_const:
        return a
    c = b.tv
    if a.umin == c:
        a = _narrow(a, umin=c + 1) or a
    elif a.umax == c:
        a = _narrow(a, umax=c - 1) or a
    sc = s64(c)
    if a.smin == sc:
        a = _narrow(a, smin=sc + 1) or a
    elif a.smax == sc:
        a = _narrow(a, smax=sc - 1) or a
    return a


def branch(op: str, width: int, a: Value, b: Value) -> tuple[bool | None, tuple[Value, Value] | None,
                                                               tuple[Value, Value] | None]:
    """A conditional jump on scalars: (known outcome, operands if taken, operands if not taken).

    JMP32 compares the low halves (RFC 9669 4.3); what it learns goes back to a 64-bit operand only
    when that operand equals its 32-bit view: zero-extended for unsigned views, sign-extended for
    signed ones, or zero-extended with a signed view that stays on one side of zero.
    """
    if width == 32:
        signed = op in SIGNED_OPS
        va, vb = lo32(a), lo32(b)
        if signed:
            va, vb = sext32(va), sext32(vb)
    else:
        va, vb = a, b
    known = outcome(op, va, vb)
    if known is not None:
        return known, None, None
    taken, fallen = refine(op, va, vb), refine(NEGATE[op], va, vb)
    if width == 32:
        taken = _back32(taken, a, b, signed)
        fallen = _back32(fallen, a, b, signed)
    return None, taken, fallen


def _back32(views: tuple[Value, Value] | None, a: Value, b: Value, signed: bool) -> tuple[Value, Value] | None:
    if views is None:
        return None
    out = []
    for view, full in zip(views, (a, b)):
        if fits_u32(full):
            narrowed = intersect(full, lo32(view) if signed else view)
        elif signed and fits_s32(full):
            narrowed = intersect(full, view)
        else:
            narrowed = low_half(full, lo32(view) if signed else view)
        if narrowed is None:
            return None
        out.append(narrowed._replace(kind=SCALAR, id=full.id))
    return out[0], out[1]


def low_half(full: Value, view: Value) -> Value | None:
    """``full``, wider than 32 bits, knowing that its low 32 bits are a value of ``view`` (in [0, 2**32)): its low
    half's bounds and tnum narrowed to view's (the kernel's u32 and s32 bounds, __reg_bound_offset), so that a 32-bit
    compare bounds what a 32-bit move or a mask then takes of it (``if (w0 < 10)`` before ``w1 = w0``: [0, 9]);
    None where they contradict what full knows (the branch cannot be taken)."""
    if (full.tv ^ view.tv) & ~full.tm & ~view.tm & M32:
        return None
    return sync(full._replace(tv=full.tv | view.tv, tm=full.tm & (view.tm | ~M32), u32min=max(full.u32min, view.umin),
                              u32max=min(full.u32max, view.umax), s32min=max(full.s32min, view.s32min),
                              s32max=min(full.s32max, view.s32max)))
