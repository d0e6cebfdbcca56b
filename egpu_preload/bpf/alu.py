"""RFC 9669 arithmetic on concrete values: the one definition the VM runs and the verifier folds with.

Values are unsigned ints. Binary operations and conditions take operands already truncated to the
operation's width (``bits``, 32 or 64: the VM truncates once per instruction, not per call) and return
results truncated to it. The rules (RFC 9669 4.1-4.3, 5.3):

- shift counts are masked to 5 / 6 bits; arsh shifts in the sign bit;
- x / 0 = 0 and x % 0 = x (the dividend); signed forms truncate toward zero, so INT_MIN / -1 wraps to
  INT_MIN and INT_MIN % -1 = 0, and the remainder takes the dividend's sign;
- le/be/bswap on this little-endian machine: le truncates to imm bits, be and bswap reverse its bytes;
- MOVSX sign-extends the low 8/16/32 bits to the width;
- JMP conditions compare unsigned, the js* forms signed, both at the comparison's width.
"""

from __future__ import annotations

from collections.abc import Callable

M32 = (1 << 32) - 1
M64 = (1 << 64) - 1
MASKS = {32: M32, 64: M64}


def signed(v: int, bits: int) -> int:
    """The low ``bits`` of v as a signed int."""
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


def _sdiv(a: int, b: int, bits: int) -> int:
    sa, sb = signed(a, bits), signed(b, bits)
    if sb == 0:
        return 0
    q = abs(sa) // abs(sb)  # truncation toward zero
    return (-q if (sa < 0) != (sb < 0) else q) & MASKS[bits]


def _smod(a: int, b: int, bits: int) -> int:
    sa, sb = signed(a, bits), signed(b, bits)
    if sb == 0:
        return a
    r = abs(sa) % abs(sb)  # the remainder takes the dividend's sign
    return (-r if sa < 0 else r) & MASKS[bits]


BINARY: dict[str, Callable[[int, int, int], int]] = {
    "add": lambda a, b, n: (a + b) & MASKS[n],
    "sub": lambda a, b, n: (a - b) & MASKS[n],
    "mul": lambda a, b, n: (a * b) & MASKS[n],
    "div": lambda a, b, n: a // b if b else 0,
    "sdiv": _sdiv,
    "mod": lambda a, b, n: a % b if b else a,
    "smod": _smod,
    "or": lambda a, b, n: a | b,
    "and": lambda a, b, n: a & b,
    "xor": lambda a, b, n: a ^ b,
    "lsh": lambda a, b, n: (a << (b & (n - 1))) & MASKS[n],
    "rsh": lambda a, b, n: a >> (b & (n - 1)),
    "arsh": lambda a, b, n: (signed(a, n) >> (b & (n - 1))) & MASKS[n],
}

CONDITIONS: dict[str, Callable[[int, int, int], bool]] = {
    "jeq": lambda a, b, n: a == b,
    "jne": lambda a, b, n: a != b,
    "jgt": lambda a, b, n: a > b,
    "jge": lambda a, b, n: a >= b,
    "jlt": lambda a, b, n: a < b,
    "jle": lambda a, b, n: a <= b,
    "jset": lambda a, b, n: bool(a & b),
    "jsgt": lambda a, b, n: signed(a, n) > signed(b, n),
    "jsge": lambda a, b, n: signed(a, n) >= signed(b, n),
    "jslt": lambda a, b, n: signed(a, n) < signed(b, n),
    "jsle": lambda a, b, n: signed(a, n) <= signed(b, n),
}

# Atomic read-modify-write (RFC 9669 5.3): the new value from the old one and the operand; the store
# truncates it to the access size.
ATOMIC: dict[str, Callable[[int, int], int]] = {
    "add": lambda old, v: old + v, "or": lambda old, v: old | v, "and": lambda old, v: old & v,
    "xor": lambda old, v: old ^ v, "xchg": lambda old, v: v,
}


def binary(op: str, bits: int, a: int, b: int) -> int:
    """``a op b`` at width ``bits`` for any unsigned a, b (truncated first)."""
    m = MASKS[bits]
    return BINARY[op](a & m, b & m, bits)


def neg(bits: int, a: int) -> int:
    return -a & MASKS[bits]


def movsx(width: int, bits: int, a: int) -> int:
    """MOVSX: the low ``bits`` of a sign-extended, truncated to ``width`` (32-bit results zero-extend)."""
    return signed(a, bits) & MASKS[width]


def byteswap(op: str, bits: int, a: int) -> int:
    """le / be / bswap of the low ``bits`` of a, zero-extended."""
    v = a & ((1 << bits) - 1)
    return v if op == "le" else int.from_bytes(v.to_bytes(bits // 8, "little"), "big")

