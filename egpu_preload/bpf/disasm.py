"""Instructions -> text in llvm-objdump's BPF syntax, the spelling every BPF developer already reads.

The reference is ``llvm-objdump-19 -d --mattr=+alu32 --no-show-raw-insn``: with ``+alu32`` llvm prints
sub-64-bit loads, stores and atomics with ``w`` registers and decodes the 32-bit fetch atomics, xchg32
and cmpxchg32 (without it, it prints ``atomic_fetch_add`` on u32 as a plain ``lock ... +=`` and the
other two as ``<unknown>``). Where llvm's text loses information, egpu prints its own form so that
``asm.assemble`` can invert every line:

- jumps: no ``<symbol+offset>`` suffix;
- local calls ``call local -0x1`` and kfunc calls ``call kfunc 0x7`` (llvm prints both as ``call N``);
- map references after loading ``r1 = map[2] ll`` and ``r1 = map_value[2] + 0x10 ll``; other pseudo
  sources ``ld_pseudo r1, 0x1, 0x3`` with the full 64-bit immediate (llvm prints only its low half).
"""

from __future__ import annotations

from ..errors import EgpuError
from . import isa
from .decode import Insn, decode
from .program import MAP_TYPE_NAMES, BpfObject

ALU_SYMBOLS = {"add": "+=", "sub": "-=", "mul": "*=", "div": "/=", "sdiv": "s/=", "or": "|=", "and": "&=",
               "lsh": "<<=", "rsh": ">>=", "mod": "%=", "smod": "s%=", "xor": "^=", "arsh": "s>>="}
JMP_SYMBOLS = {"jeq": "==", "jne": "!=", "jgt": ">", "jge": ">=", "jlt": "<", "jle": "<=", "jsgt": "s>",
               "jsge": "s>=", "jslt": "s<", "jsle": "s<=", "jset": "&"}
# The non-fetch atomics print as compound assignments, like ALU ops.
LOCK_SYMBOLS = {"add": "+=", "or": "|=", "and": "&=", "xor": "^="}


def hex_imm(v: int) -> str:
    """llvm's immediate spelling: signed hex, ``0x2a`` / ``-0x1``."""
    return f"-0x{-v:x}" if v < 0 else f"0x{v:x}"


def _signed64(v: int) -> int:
    return v - (1 << 64) if v & (1 << 63) else v


def _reg(n: int, width: int) -> str:
    return f"{'w' if width == 32 else 'r'}{n}"


def _addr(insn: Insn, base: int) -> str:
    sign = "-" if insn.off < 0 else "+"
    return f"r{base} {sign} 0x{abs(insn.off):x}"


def _pc_offset(v: int) -> str:
    return f"-0x{-v:x}" if v < 0 else f"+0x{v:x}"


def _alu(i: Insn) -> str:
    rhs = hex_imm(i.imm) if i.use_imm else _reg(i.src, i.width)
    return f"{_reg(i.dst, i.width)} {ALU_SYMBOLS[i.op]} {rhs}"


def _mov(i: Insn) -> str:
    return f"{_reg(i.dst, i.width)} = {hex_imm(i.imm) if i.use_imm else _reg(i.src, i.width)}"


def _movsx(i: Insn) -> str:
    return f"{_reg(i.dst, i.width)} = (s{i.size * 8}){_reg(i.src, i.width)}"


def _neg(i: Insn) -> str:
    return f"{_reg(i.dst, i.width)} = -{_reg(i.dst, i.width)}"


def _end(i: Insn) -> str:
    return f"r{i.dst} = {i.op}{i.imm} r{i.dst}"


def _lddw(i: Insn) -> str:
    if i.src == isa.LDDW_IMM64:
        return f"r{i.dst} = {hex_imm(_signed64(i.imm))} ll"
    if i.src == isa.LDDW_MAP_IDX:
        return f"r{i.dst} = map[{i.imm}] ll"
    if i.src == isa.LDDW_MAP_IDX_VALUE:
        return f"r{i.dst} = map_value[{i.imm & 0xFFFFFFFF}] + 0x{i.imm >> 32:x} ll"
    if i.src == isa.LDDW_CODE_ADDR and not i.imm >> 32:
        return f"r{i.dst} = func {_pc_offset(i.callback - i.pc - 1)} ll"
    return f"ld_pseudo r{i.dst}, 0x{i.src:x}, 0x{i.imm:x}"


def _load(i: Insn) -> str:
    kind = "s" if i.spec.signed else "u"
    width = 32 if i.size < 8 and not i.spec.signed else 64
    return f"{_reg(i.dst, width)} = *({kind}{i.size * 8} *)({_addr(i, i.src)})"


def _store(i: Insn) -> str:
    rhs = hex_imm(i.imm) if i.use_imm else _reg(i.src, 32 if i.size < 8 else 64)
    return f"*(u{i.size * 8} *)({_addr(i, i.dst)}) = {rhs}"


def _atomic(i: Insn) -> str:
    w, bits, op = i.width, i.size * 8, i.atomic_op
    src = _reg(i.src, w)
    if op == "xchg":
        return f"{src} = xchg{'32' if w == 32 else ''}_{bits}({_addr(i, i.dst)}, {src})"
    if op == "cmpxchg":
        return f"{_reg(0, w)} = cmpxchg{'32' if w == 32 else ''}_{bits}({_addr(i, i.dst)}, {_reg(0, w)}, {src})"
    if i.fetch:
        return f"{src} = atomic_fetch_{op}((u{bits} *)({_addr(i, i.dst)}), {src})"
    return f"lock *(u{bits} *)({_addr(i, i.dst)}) {LOCK_SYMBOLS[op]} {src}"


def _jmp(i: Insn) -> str:
    rhs = hex_imm(i.imm) if i.use_imm else _reg(i.src, i.width)
    return f"if {_reg(i.dst, i.width)} {JMP_SYMBOLS[i.op]} {rhs} goto {_pc_offset(i.off)}"


def _ja(i: Insn) -> str:
    return f"gotol {_pc_offset(i.imm)}" if i.op == "ja32" else f"goto {_pc_offset(i.off)}"


def _call(i: Insn) -> str:
    prefix = {isa.CALL_HELPER: "", isa.CALL_LOCAL: "local ", isa.CALL_BTF: "kfunc "}[i.src]
    return f"call {prefix}{hex_imm(i.imm)}"


def _exit(i: Insn) -> str:
    return "exit"


FORMATTERS = {"alu": _alu, "mov": _mov, "movsx": _movsx, "neg": _neg, "end": _end, "lddw": _lddw,
              "load": _load, "store": _store, "atomic": _atomic, "jmp": _jmp, "ja": _ja, "call": _call,
              "exit": _exit}


def disasm_insn(insn: Insn) -> str:
    """One instruction in llvm-objdump's syntax (see the module docstring for where it differs)."""
    return FORMATTERS[insn.kind](insn)


def disasm(code: bytes) -> list[str]:
    """Every instruction of a program, one string each (an ``lddw`` is one line covering two slots)."""
    return [disasm_insn(i) for i in decode(code)]


def listing(code: bytes) -> str:
    """llvm-objdump's layout: the slot number right-aligned, a tab, the instruction."""
    return "\n".join(f"{i.pc:8d}:\t{disasm_insn(i)}" for i in decode(code))


def object_listing(obj: BpfObject) -> str:
    """What ``egpu disasm`` prints: the maps that ``map[N]`` refers to, then each program under its
    section, relocated (static subprograms appended after the program's own code)."""
    out = [f"map[{n}] = {m.name} ({MAP_TYPE_NAMES.get(m.type, m.type)}, key {m.key_size}, value {m.value_size}, "
           f"max_entries {m.max_entries})" for n, m in enumerate(obj.maps)]
    for p in obj.programs:
        try:
            out += ["", f"{p.section} <{p.name}>:", listing(p.code)]
        except EgpuError as e:   # the loader relocates instructions but does not decode them
            raise e.where(file=obj.path, section=p.section)
    return "\n".join(out).lstrip("\n")
