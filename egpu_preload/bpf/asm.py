"""Text -> bytes for tests: the inverse of ``disasm`` (llvm-objdump's BPF syntax), plus labels.

One instruction per line; ``;``, ``#`` and ``//`` start comments; blank lines are skipped. A line may
start with a label ``name:`` and, so that a pasted ``llvm-objdump`` listing assembles, with a slot number
``12:``; a trailing ``<f+0x48>`` is ignored. Numbers are decimal or hex, signed.

Beyond llvm's syntax (all of it printed back by ``disasm``):

- jumps take a label or a relative slot count: ``goto out``, ``if r1 > -1 goto +0x3``, ``gotol loop``;
- ``call 1`` or ``call map_lookup_elem`` calls a helper (helpers.py), ``call local LABEL`` or
  ``call local -0x3`` a static subprogram (src = CALL_LOCAL), ``call kfunc N`` a BTF function;
- map references as the loader leaves them: ``r1 = map[N] ll`` (src = LDDW_MAP_IDX, imm = N) and
  ``r1 = map_value[N] + OFF ll`` (src = LDDW_MAP_IDX_VALUE, imm = N | OFF << 32);
- a function's address, a callback of bpf_loop: ``r2 = func LABEL ll`` or ``r2 = func +0x3 ll`` (src =
  LDDW_CODE_ADDR, imm relative to the next slot, as a local call's);
- ``ld_pseudo r1, SRC, IMM`` for the other lddw pseudo sources.

32-bit loads, stores and atomics accept ``w`` or ``r`` registers, as llvm prints them with and without
``--mattr=+alu32``; the register letter chooses ALU vs ALU64 and JMP vs JMP32 everywhere else.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from ..errors import AsmError, DecodeError
from . import isa
from .decode import Insn, decode, encode
from .disasm import ALU_SYMBOLS, JMP_SYMBOLS, LOCK_SYMBOLS
from .helpers import BY_NAME as HELPER_BY_NAME

_NUM = r"[+-]?\s*(?:0[xX][0-9a-fA-F]+|\d+)"
_REG = r"[rw]\d+"
_LABEL = r"[A-Za-z_.$][\w.$]*"
_TARGET = rf"(?P<target>{_NUM}|{_LABEL})"
_ADDR = rf"(?P<base>r\d+)\s*(?P<sign>[+-])\s*(?P<off>{_NUM})"
_SIZES = {"8": 1, "16": 2, "32": 4, "64": 8}


def _alt(symbols: dict[str, str]) -> str:
    """A regex alternation of operator spellings, longest first so ``s>>=`` wins over ``>>=``."""
    return "|".join(re.escape(s) for s in sorted(symbols.values(), key=len, reverse=True))


_ALU_BY_SYMBOL = {s: n for n, s in ALU_SYMBOLS.items()}
_JMP_BY_SYMBOL = {s: n for n, s in JMP_SYMBOLS.items()}
_LOCK_BY_SYMBOL = {s: n for n, s in LOCK_SYMBOLS.items()}
_ATOMIC_CODES = {name: code for code, name in isa.ATOMIC_OPS.items()}

# (pattern, handler name); tried in order, the first full match wins.
_FORMS: tuple[tuple[str, str], ...] = (
    (r"exit", "exit"),
    (rf"(?P<op>gotol|goto)\s+{_TARGET}", "ja"),
    (rf"call\s+(?P<how>local|kfunc)\s+{_TARGET}", "call_pseudo"),
    (rf"call\s+(?P<target>{_NUM}|{_LABEL})", "call_helper"),
    (rf"if\s+(?P<dst>{_REG})\s*(?P<op>{_alt(JMP_SYMBOLS)})\s*(?P<rhs>{_REG}|{_NUM})\s+goto\s+{_TARGET}", "jmp"),
    (rf"lock\s+\*\(u(?P<bits>32|64)\s*\*\)\({_ADDR}\)\s*(?P<op>{_alt(LOCK_SYMBOLS)})\s*(?P<src>{_REG})",
     "lock"),
    (rf"(?P<dst>{_REG})\s*=\s*atomic_fetch_(?P<op>add|or|and|xor)\(\(u(?P<bits>32|64)\s*\*\)\({_ADDR}\),"
     rf"\s*(?P<src>{_REG})\)", "fetch"),
    (rf"(?P<dst>{_REG})\s*=\s*xchg(?:32)?_(?P<bits>32|64)\({_ADDR},\s*(?P<src>{_REG})\)", "xchg"),
    (rf"(?P<dst>{_REG})\s*=\s*cmpxchg(?:32)?_(?P<bits>32|64)\({_ADDR},\s*(?P<old>{_REG}),"
     rf"\s*(?P<src>{_REG})\)", "cmpxchg"),
    (rf"\*\(u(?P<bits>8|16|32|64)\s*\*\)\({_ADDR}\)\s*=\s*(?P<rhs>{_REG}|{_NUM})", "store"),
    (rf"(?P<dst>{_REG})\s*=\s*\*\((?P<sign_kind>[us])(?P<bits>8|16|32|64)\s*\*\)\({_ADDR}\)", "load"),
    (rf"(?P<dst>{_REG})\s*=\s*(?P<op>le|be|bswap)(?P<bits>16|32|64)\s+(?P<src>{_REG})", "end"),
    (rf"(?P<dst>{_REG})\s*=\s*-\s*(?P<src>{_REG})", "neg"),
    (rf"(?P<dst>{_REG})\s*=\s*\(s(?P<bits>8|16|32)\)\s*(?P<src>{_REG})", "movsx"),
    (rf"(?P<dst>{_REG})\s*=\s*map\[(?P<idx>{_NUM})\]\s+ll", "map"),
    (rf"(?P<dst>{_REG})\s*=\s*map_value\[(?P<idx>{_NUM})\](?:\s*\+\s*(?P<off>{_NUM}))?\s+ll", "map_value"),
    (rf"(?P<dst>{_REG})\s*=\s*(?P<imm>{_NUM})\s+ll", "lddw"),
    (rf"(?P<dst>{_REG})\s*=\s*func\s+{_TARGET}\s+ll", "func"),
    (rf"ld_pseudo\s+(?P<dst>{_REG}),\s*(?P<src>{_NUM}),\s*(?P<imm>{_NUM})", "ld_pseudo"),
    (rf"(?P<dst>{_REG})\s*=\s*(?P<rhs>{_REG}|{_NUM})", "mov"),
    (rf"(?P<dst>{_REG})\s*(?P<op>{_alt(ALU_SYMBOLS)})\s*(?P<rhs>{_REG}|{_NUM})", "alu"),
)


@functools.cache
def _compiled() -> tuple[tuple[re.Pattern[str], str], ...]:
    return tuple((re.compile(p), h) for p, h in _FORMS)


@functools.cache
def _specs() -> dict[tuple[str, str, int, bool, int, bool], isa.OpSpec]:
    return {(o.kind, o.name, o.width, o.use_imm, o.size, o.signed): o for o in isa.OPS}


def _spec(kind: str, name: str, width: int = 64, use_imm: bool = False, size: int = 0,
          signed: bool = False) -> isa.OpSpec:
    return _specs()[(kind, name, width, use_imm, size, signed)]


@dataclass
class _Pending:
    """One parsed line: an instruction whose jump or call target may still be a label."""

    line: int
    text: str
    spec: isa.OpSpec
    dst: int = 0
    src: int = 0
    off: int = 0
    imm: int = 0
    target: str | None = None   # label or relative number, resolved into off (jumps) or imm
    target_field: str = "off"

    @property
    def slots(self) -> int:
        return 2 if self.spec.kind == "lddw" else 1


class _Line:
    """Field parsing for one source line; every error names the line."""

    def __init__(self, number: int, text: str) -> None:
        self.number = number
        self.text = text

    def error(self, reason: str) -> AsmError:
        return AsmError(f"line {self.number}: {reason}: {self.text.strip()!r}")

    def num(self, s: str, lo: int, hi: int, what: str) -> int:
        try:
            v = int(s.replace(" ", ""), 0)
        except ValueError:
            raise self.error(f"bad number {s.strip()}") from None
        if not lo <= v <= hi:
            raise self.error(f"{what} {s.strip()} out of range")
        return v

    def imm32(self, s: str, width: int) -> int:
        """A 32-bit immediate; 32-bit operations also take unsigned spellings such as 0xffffffff."""
        v = self.num(s, -(1 << 31), (1 << 32) - 1 if width == 32 else (1 << 31) - 1, "immediate")
        return v - (1 << 32) if v >= 1 << 31 else v

    def reg(self, s: str, width: int | None = None) -> int:
        n = int(s[1:])
        if n >= isa.NUM_REGS:
            raise self.error(f"no register {s}")
        if width is not None and (s[0] == "w") != (width == 32):
            raise self.error(f"register {s} does not match the {width}-bit operation")
        return n

    def width(self, s: str) -> int:
        return 32 if s[0] == "w" else 64

    def mem_reg(self, s: str, size: int) -> int:
        """Loads, stores and atomics of less than 8 bytes take wN or rN; 8 bytes need rN."""
        return self.reg(s, 64 if size == 8 else None)

    def addr(self, m: re.Match[str]) -> tuple[int, int]:
        off = self.num(m["off"], 0, 1 << 15, "offset")
        off = -off if m["sign"] == "-" else off
        if not -(1 << 15) <= off < 1 << 15:
            raise self.error(f"offset {off} out of range")
        return self.reg(m["base"], 64), off


def _parse(ln: _Line, handler: str, m: re.Match[str]) -> _Pending:
    """One instruction from a matched form."""
    if handler == "exit":
        return _Pending(ln.number, ln.text, _spec("exit", "exit"))
    if handler == "ja":
        wide = m["op"] == "gotol"
        return _Pending(ln.number, ln.text, _spec("ja", "ja32" if wide else "ja", 32 if wide else 64),
                        target=m["target"], target_field="imm" if wide else "off")
    if handler == "call_pseudo":
        src = isa.CALL_LOCAL if m["how"] == "local" else isa.CALL_BTF
        if src == isa.CALL_BTF:
            return _Pending(ln.number, ln.text, _spec("call", "call"), src=src, imm=ln.imm32(m["target"], 64))
        return _Pending(ln.number, ln.text, _spec("call", "call"), src=src, target=m["target"],
                        target_field="imm")
    if handler == "call_helper":
        name = m["target"]
        if name in HELPER_BY_NAME:
            imm = HELPER_BY_NAME[name].id
        elif re.fullmatch(_NUM, name):
            imm = ln.imm32(name, 64)
        else:
            raise ln.error(f"unknown helper {name} (use 'call local {name}' for a subprogram)")
        return _Pending(ln.number, ln.text, _spec("call", "call"), imm=imm)
    if handler == "jmp":
        width = ln.width(m["dst"])
        dst = ln.reg(m["dst"], width)
        use_imm = not re.fullmatch(_REG, m["rhs"])
        spec = _spec("jmp", _JMP_BY_SYMBOL[m["op"]], width, use_imm)
        src, imm = (0, ln.imm32(m["rhs"], width)) if use_imm else (ln.reg(m["rhs"], width), 0)
        return _Pending(ln.number, ln.text, spec, dst, src, imm=imm, target=m["target"])
    if handler in ("lock", "fetch", "xchg", "cmpxchg"):
        bits = int(m["bits"])
        width = bits
        dst, off = ln.addr(m)
        src = ln.mem_reg(m["src"], bits // 8)
        if handler == "lock":
            code = _ATOMIC_CODES[_LOCK_BY_SYMBOL[m["op"]]]
        else:
            code = _ATOMIC_CODES[m["op"] if handler == "fetch" else handler] | isa.ATOMIC_FETCH
            # The fetched value lands in src (r0 for cmpxchg), so the left side must name it.
            out = "old" if handler == "cmpxchg" else "src"
            if ln.mem_reg(m["dst"], bits // 8) != ln.mem_reg(m[out], bits // 8):
                raise ln.error(f"{handler} writes its result to {m[out]}, not {m['dst']}")
            if handler == "cmpxchg" and ln.mem_reg(m["old"], bits // 8) != 0:
                raise ln.error("cmpxchg compares with r0")
        return _Pending(ln.number, ln.text, _spec("atomic", "atomic", width, size=bits // 8), dst, src, off,
                        code)
    if handler == "store":
        size = _SIZES[m["bits"]]
        dst, off = ln.addr(m)
        if re.fullmatch(_REG, m["rhs"]):
            return _Pending(ln.number, ln.text, _spec("store", "stx", size=size), dst,
                            ln.mem_reg(m["rhs"], size), off)
        imm = ln.imm32(m["rhs"], 32 if size < 8 else 64)
        return _Pending(ln.number, ln.text, _spec("store", "st", use_imm=True, size=size), dst, 0, off, imm)
    if handler == "load":
        size, signed = _SIZES[m["bits"]], m["sign_kind"] == "s"
        if signed and size == 8:
            raise ln.error("there is no sign-extending 64-bit load")
        src, off = ln.addr(m)
        dst = ln.reg(m["dst"], 64) if signed else ln.mem_reg(m["dst"], size)
        spec = _spec("load", "ldxs" if signed else "ldx", size=size, signed=signed)
        return _Pending(ln.number, ln.text, spec, dst, src, off)
    if handler == "end":
        dst = ln.reg(m["dst"], 64)
        if ln.reg(m["src"], 64) != dst:
            raise ln.error("a byte swap reads and writes the same register")
        return _Pending(ln.number, ln.text, _spec("end", m["op"]), dst, imm=int(m["bits"]))
    if handler == "neg":
        width = ln.width(m["dst"])
        dst = ln.reg(m["dst"], width)
        if ln.reg(m["src"], width) != dst:
            raise ln.error("neg reads and writes the same register")
        return _Pending(ln.number, ln.text, _spec("neg", "neg", width), dst)
    if handler == "movsx":
        width, bits = ln.width(m["dst"]), int(m["bits"])
        if width == 32 and bits == 32:
            raise ln.error("32-bit movsx takes s8 or s16")
        spec = _spec("movsx", f"movsx{bits}", width, size=bits // 8)
        return _Pending(ln.number, ln.text, spec, ln.reg(m["dst"], width), ln.reg(m["src"], width), spec.offset)
    if handler == "func":
        return _Pending(ln.number, ln.text, _spec("lddw", "lddw", size=8), ln.reg(m["dst"], 64), isa.LDDW_CODE_ADDR,
                        target=m["target"], target_field="func")
    if handler in ("map", "map_value", "lddw", "ld_pseudo"):
        dst = ln.reg(m["dst"], 64)
        if handler == "map":
            src, imm = isa.LDDW_MAP_IDX, ln.num(m["idx"], 0, (1 << 32) - 1, "map index")
        elif handler == "map_value":
            off = ln.num(m["off"], 0, (1 << 32) - 1, "value offset") if m["off"] else 0
            src, imm = isa.LDDW_MAP_IDX_VALUE, ln.num(m["idx"], 0, (1 << 32) - 1, "map index") | off << 32
        elif handler == "lddw":
            src, imm = isa.LDDW_IMM64, ln.num(m["imm"], -(1 << 63), (1 << 64) - 1, "immediate")
        else:
            src = ln.num(m["src"], isa.LDDW_MAP_FD, isa.LDDW_CODE_ADDR, "ld_pseudo source")
            imm = ln.num(m["imm"], -(1 << 63), (1 << 64) - 1, "immediate")
        return _Pending(ln.number, ln.text, _spec("lddw", "lddw", size=8), dst, src, 0, imm & ((1 << 64) - 1))
    # mov and alu: the destination's letter chooses ALU (w) or ALU64 (r).
    width = ln.width(m["dst"])
    dst = ln.reg(m["dst"], width)
    use_imm = not re.fullmatch(_REG, m["rhs"])
    name = "mov" if handler == "mov" else _ALU_BY_SYMBOL[m["op"]]
    spec = _spec("mov" if handler == "mov" else "alu", name, width, use_imm)
    src, imm = (0, ln.imm32(m["rhs"], width)) if use_imm else (ln.reg(m["rhs"], width), 0)
    return _Pending(ln.number, ln.text, spec, dst, src, spec.offset or 0, imm)


def _strip(text: str) -> str:
    text = re.split(r";|#|//", text, maxsplit=1)[0]
    text = re.sub(r"<[^<>]*>\s*$", "", text)      # llvm's jump annotation <f+0x48>
    return re.sub(r"^\s*\d+:", "", text).strip()   # llvm's slot number


def assemble(text: str) -> bytes:
    """Assemble a program. Raises AsmError naming the line of the first thing it cannot read."""
    pending: list[_Pending] = []
    labels: dict[str, int] = {}
    pc = 0
    for number, raw in enumerate(text.splitlines(), 1):
        ln = _Line(number, raw)
        body = _strip(raw)
        while lm := re.match(rf"({_LABEL}):\s*", body):
            if lm[1] in labels:
                raise ln.error(f"label {lm[1]} defined twice")
            labels[lm[1]] = pc
            body = body[lm.end():]
        if not body:
            continue
        for pattern, handler in _compiled():
            if m := pattern.fullmatch(body):
                p = _parse(ln, handler, m)
                break
        else:
            raise ln.error("not an instruction")
        pending.append(p)
        pc += p.slots
    out = bytearray()
    pc = 0
    for p in pending:
        if p.target is not None:
            _resolve(p, p.target, pc, labels)
        insn = Insn(pc, p.spec, p.dst, p.src, p.off, p.imm)
        data = encode(insn)
        try:
            decode(data)  # the decoder's field rules are the single source of legality
        except DecodeError as e:
            raise _Line(p.line, p.text).error(e.reason) from None
        out += data
        pc += p.slots
    return bytes(out)


def _resolve(p: _Pending, target: str, pc: int, labels: dict[str, int]) -> None:
    """Fill a jump's off (or gotol's / a local call's / a function address's imm) from a label or a relative
    number."""
    ln = _Line(p.line, p.text)
    if re.fullmatch(_NUM, target):
        delta = ln.num(target, -(1 << 31), (1 << 31) - 1, "jump offset")
    elif target in labels:
        delta = labels[target] - (pc + 1)  # RFC 9669 4.3: relative to the next instruction
    else:
        raise ln.error(f"undefined label {target}")
    if p.target_field == "off":
        if not -(1 << 15) <= delta < 1 << 15:
            raise ln.error(f"jump offset {delta} does not fit 16 bits (use gotol)")
        p.off = delta
    elif p.target_field == "func":   # the low half of lddw's 64-bit imm, the high half zero
        p.imm = delta & 0xFFFFFFFF
    else:
        p.imm = delta
