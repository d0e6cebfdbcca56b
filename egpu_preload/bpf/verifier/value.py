"""Abstract values: what the verifier knows about one register or spilled stack slot.

A scalar is described, as in the Linux verifier, by unsigned and signed 64-bit bounds, a tnum
(``tv`` known bits, ``tm`` unknown-bit mask: the value is ``tv | x`` for some ``x`` within ``tm``) and
the unsigned and signed bounds of its low 32 bits, which a 32-bit compare of a wider value narrows (Linux's
u32_min_value, u32_max_value, s32_min_value and s32_max_value).
A pointer is a region (its kind and ``aux``: map index, frame number or record size) plus a fixed
offset ``off`` and a variable offset described by the same scalar fields.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

M64 = (1 << 64) - 1
M32 = (1 << 32) - 1
SIGN64 = 1 << 63
SIGN32 = 1 << 31
S64_MIN, S64_MAX = -(1 << 63), (1 << 63) - 1
S32_MIN, S32_MAX = -(1 << 31), (1 << 31) - 1

# Kinds. The *_OR_NULL kinds must be compared against 0 before any use but a copy or a spill.
NOT_INIT = "not_init"
SCALAR = "scalar"
CTX = "ctx"
STACK = "stack"
MAP_VALUE = "map_value"
MAP_VALUE_OR_NULL = "map_value_or_null"
MAP_PTR = "map_ptr"
RINGBUF_MEM = "ringbuf_mem"
RINGBUF_MEM_OR_NULL = "ringbuf_mem_or_null"
FUNC = "func"   # a static function's address (Linux's PTR_TO_FUNC): aux is its pc; only bpf_loop takes it
OR_NULL = {MAP_VALUE_OR_NULL: MAP_VALUE, RINGBUF_MEM_OR_NULL: RINGBUF_MEM}


class Value(NamedTuple):
    kind: str
    umin: int = 0
    umax: int = M64
    smin: int = S64_MIN
    smax: int = S64_MAX
    tv: int = 0
    tm: int = M64
    off: int = 0   # pointers: the fixed offset; linked scalars: the constant added since the copy
    aux: int = 0   # map index (map_*), frame number (stack), record size (ringbuf_mem*), pc (func); linked scalars:
                   # 32 when the value is the low half of (base + off) (a w-register add), else 0
    id: int = 0    # links copies: scalars refined together, or_null pointers null-checked together,
                   # ringbuf records released together (the id is also the reference id). Scalars of
                   # one id are base + off each (the kernel's linked registers, BPF_ADD_CONST)
    u32min: int = 0     # the low 32 bits' unsigned and signed bounds: only narrowing keeps them (every new
    u32max: int = M32   # value is built with the defaults, or through sync, which fills them in)
    s32min: int = S32_MIN
    s32max: int = S32_MAX

    @property
    def is_pointer(self) -> bool:
        return self.kind not in (SCALAR, NOT_INIT)

    @property
    def is_const(self) -> bool:
        return self.tm == 0

    @property
    def low(self) -> tuple[int, int, int, int]:
        """The low half's bounds: u32min, u32max, s32min, s32max (bounded's ``low``)."""
        return self.u32min, self.u32max, self.s32min, self.s32max

    @property
    def var(self) -> "Value":
        """The scalar part: the value of a scalar, the variable offset of a pointer."""
        return Value(SCALAR, self.umin, self.umax, self.smin, self.smax, self.tv, self.tm,
                     u32min=self.u32min, u32max=self.u32max, s32min=self.s32min, s32max=self.s32max)


NOT_INIT_VALUE = Value(NOT_INIT)
UNKNOWN = Value(SCALAR)


def s64(v: int) -> int:
    v &= M64
    return v - (1 << 64) if v & SIGN64 else v


def s32(v: int) -> int:
    v &= M32
    return v - (1 << 32) if v & SIGN32 else v


@lru_cache(maxsize=4096)   # every immediate operand is one: a verify makes millions
def const(v: int) -> Value:
    u = v & M64
    return Value(SCALAR, u, u, s64(u), s64(u), u, 0, u32min=u & M32, u32max=u & M32, s32min=s32(u), s32max=s32(u))


ZERO_OFFSET = const(0)


def pointer(kind: str, *, off: int = 0, aux: int = 0, id: int = 0, var: Value = ZERO_OFFSET) -> Value:
    return Value(kind, var.umin, var.umax, var.smin, var.smax, var.tv, var.tm, off, aux, id)


def with_var(p: Value, var: Value) -> Value:
    return p._replace(umin=var.umin, umax=var.umax, smin=var.smin, smax=var.smax, tv=var.tv, tm=var.tm,
                      u32min=var.u32min, u32max=var.u32max, s32min=var.s32min, s32max=var.s32max)


def sized(size: int, signed: bool = False) -> Value:
    """What a load of ``size`` bytes of unknown memory gives: zero- or sign-extended."""
    bits = size * 8
    if bits == 64:
        return UNKNOWN
    if signed:
        return bounded(smin=-(1 << (bits - 1)), smax=(1 << (bits - 1)) - 1)
    return bounded(0, (1 << bits) - 1)


def bounded(umin: int = 0, umax: int = M64, smin: int = S64_MIN, smax: int = S64_MAX,
            t: tuple[int, int] = (0, M64), low: tuple[int, int, int, int] = (0, M32, S32_MIN, S32_MAX)) -> Value:
    """A scalar from bounds (``low``: the low half's u32min, u32max, s32min, s32max); an impossible
    combination becomes unknown (never raised on)."""
    return sync(Value(SCALAR, umin, umax, smin, smax, t[0], t[1], 0, 0, 0, *low)) or UNKNOWN


# ---- tnums (kernel/bpf/tnum.c) ---------------------------------------------------------------------

def t_range(lo: int, hi: int) -> tuple[int, int]:
    bits = (lo ^ hi).bit_length()
    if bits > 63:
        return 0, M64
    delta = (1 << bits) - 1
    return lo & ~delta & M64, delta


def t_add(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    sm, sv = a[1] + b[1], a[0] + b[0]
    mu = ((sm + sv) ^ sv) | a[1] | b[1]
    return sv & ~mu & M64, mu & M64


def t_sub(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    dv = a[0] - b[0]
    mu = ((dv + a[1]) ^ (dv - b[1])) | a[1] | b[1]
    return dv & ~mu & M64, mu & M64


def t_and(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    v = a[0] & b[0]
    return v, (a[0] | a[1]) & (b[0] | b[1]) & ~v


def t_or(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    v = a[0] | b[0]
    return v, (a[1] | b[1]) & ~v


def t_xor(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    mu = a[1] | b[1]
    return (a[0] ^ b[0]) & ~mu, mu


def t_mul(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    acc_v = (a[0] * b[0]) & M64
    acc_m = (0, 0)
    av, am = a
    bv, bm = b
    while av or am:
        if av & 1:
            acc_m = t_add(acc_m, (0, bm))
        elif am & 1:
            acc_m = t_add(acc_m, (0, bv | bm))
        av, am = av >> 1, am >> 1
        bv, bm = (bv << 1) & M64, (bm << 1) & M64
    return t_add((acc_v, 0), acc_m)


def t_arsh(a: tuple[int, int], shift: int, bits: int) -> tuple[int, int]:
    mask = (1 << bits) - 1

    def sx(x: int) -> int:
        return x - (1 << bits) if x >> (bits - 1) & 1 else x
    return (sx(a[0]) >> shift) & mask, (sx(a[1]) >> shift) & mask


def t_in(outer: tuple[int, int], inner: tuple[int, int]) -> bool:
    """Every value of ``inner`` is a value of ``outer``."""
    return not inner[1] & ~outer[1] and outer[0] == inner[0] & ~outer[1]


# ---- bounds -------------------------------------------------------------------------------------------

def sync(v: Value) -> Value | None:
    """Share what the tnum, the four bounds and the low half's four know (the kernel's reg_bounds_sync);
    None when empty."""
    umin, umax, smin, smax, tv, tm = v.umin, v.umax, v.smin, v.smax, v.tv, v.tm
    lmin, lmax, l_smin, l_smax = v.u32min, v.u32max, v.s32min, v.s32max
    for _ in range(2):
        lmin, lmax = max(lmin, tv & M32), min(lmax, (tv | tm) & M32)
        l_smin = max(l_smin, s32(tv | (tm & SIGN32)))
        l_smax = min(l_smax, s32(tv | (tm & M32 & ~SIGN32)))
        if umin >> 32 == umax >> 32:   # one upper half: the bounds' low halves bound the low half, and back
            high = umin & ~M32
            lmin, lmax = max(lmin, umin & M32), min(lmax, umax & M32)
            if s32(umin) <= s32(umax):
                l_smin, l_smax = max(l_smin, s32(umin)), min(l_smax, s32(umax))
            umin, umax = max(umin, high | lmin), min(umax, high | lmax)
        if smin >> 32 == smax >> 32:   # the same for the signed bounds
            lmin, lmax = max(lmin, smin & M32), min(lmax, smax & M32)
            if s32(smin) <= s32(smax):
                l_smin, l_smax = max(l_smin, s32(smin)), min(l_smax, s32(smax))
        if S32_MIN <= smin and smax <= S32_MAX:   # the value is its low half, sign-extended
            l_smin, l_smax = max(l_smin, smin), min(l_smax, smax)
            smin, smax = max(smin, l_smin), min(smax, l_smax)
        if l_smin > l_smax:
            return None
        if l_smin >= 0 or l_smax < 0:   # the low half's signed range stays in one sign half
            lmin, lmax = max(lmin, l_smin & M32), min(lmax, l_smax & M32)
        if lmin > lmax:
            return None
        if (lmin ^ lmax) & SIGN32 == 0:   # its unsigned range does
            l_smin, l_smax = max(l_smin, s32(lmin)), min(l_smax, s32(lmax))
        if l_smin > l_smax:
            return None
        lv, lm = t_range(lmin, lmax)
        if (tv ^ lv) & ~tm & ~lm & M32:
            return None
        tv, tm = tv | lv, tm & (lm | ~M32)
        umin, umax = max(umin, tv), min(umax, tv | tm)
        smin = max(smin, s64(tv | (tm & SIGN64)))
        smax = min(smax, s64(tv | (tm & ~SIGN64)))
        if umin > umax or smin > smax:
            return None
        if (umin ^ umax) & SIGN64 == 0:   # the unsigned range stays in one sign half
            smin, smax = max(smin, s64(umin)), min(smax, s64(umax))
        if smin >= 0 or smax < 0:         # the signed range stays in one sign half
            umin, umax = max(umin, smin & M64), min(umax, smax & M64)
        if umin > umax or smin > smax:
            return None
        rv, rm = t_range(umin, umax)
        if (tv ^ rv) & ~tm & ~rm:
            return None
        tv, tm = (tv | rv) & M64, tm & rm
    return v._replace(umin=umin, umax=umax, smin=smin, smax=smax, tv=tv, tm=tm, u32min=lmin, u32max=lmax,
                      s32min=l_smin, s32max=l_smax)


def intersect(a: Value, b: Value) -> Value | None:
    if (a.tv ^ b.tv) & ~a.tm & ~b.tm:
        return None
    return sync(a._replace(umin=max(a.umin, b.umin), umax=min(a.umax, b.umax), smin=max(a.smin, b.smin),
                           smax=min(a.smax, b.smax), tv=a.tv | b.tv, tm=a.tm & b.tm,
                           u32min=max(a.u32min, b.u32min), u32max=min(a.u32max, b.u32max),
                           s32min=max(a.s32min, b.s32min), s32max=min(a.s32max, b.s32max)))


def contains(outer: Value, inner: Value) -> bool:
    """Every concrete value of ``inner``'s scalar part is one of ``outer``'s."""
    if not (outer.umin <= inner.umin and inner.umax <= outer.umax and outer.smin <= inner.smin
            and inner.smax <= outer.smax and t_in((outer.tv, outer.tm), (inner.tv, inner.tm))):
        return False
    if outer.u32min == 0 and outer.u32max == M32 and outer.s32min == S32_MIN and outer.s32max == S32_MAX:
        return True
    low = lo32(inner)
    return (outer.u32min <= low.umin and low.umax <= outer.u32max and outer.s32min <= low.s32min
            and low.s32max <= outer.s32max)


def lo32(v: Value) -> Value:
    """The low 32 bits, zero-extended: what a 32-bit operation reads, and what it writes back
    (RFC 9669 4.1: 32-bit results are zero-extended)."""
    lo, hi = (v.umin & M32, v.umax & M32) if v.umin >> 32 == v.umax >> 32 else (0, M32)
    return bounded(lo, hi, t=(v.tv & M32, v.tm & M32), low=v.low)   # sync narrows lo, hi to the u32 bounds


def sext32(v: Value) -> Value:
    """A value in [0, 2**32) read as a signed 32-bit number, sign-extended to 64 bits."""
    if v.umax <= S32_MAX:
        return v
    if v.umin > S32_MAX:
        return bounded(smin=v.umin - (1 << 32), smax=v.umax - (1 << 32), t=((v.tv | ~M32) & M64, v.tm), low=v.low)
    tv, tm = v.tv, v.tm
    if tm >> 31 & 1:
        tm |= M64 & ~M32
    elif tv >> 31 & 1:
        tv |= M64 & ~M32
    return bounded(smin=v.s32min, smax=v.s32max, t=(tv, tm), low=v.low)


def fits_u32(v: Value) -> bool:
    return v.umax <= M32


def fits_s32(v: Value) -> bool:
    return v.smin >= S32_MIN and v.smax <= S32_MAX
