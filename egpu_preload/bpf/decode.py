"""Bytes -> instructions. Nothing after this module touches raw instruction bits.

An instruction is decoded once into a frozen ``Insn`` naming its ``OpSpec`` row; immediates are
sign-extended and offsets signed, as RFC 9669 defines them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..errors import DecodeError
from . import isa

_SLOT = struct.Struct("<BBhi")
_LDDW = isa.LD | isa.MODE_IMM | isa.SIZE_DW


@dataclass(frozen=True)
class Insn:
    """One decoded instruction. ``pc`` counts 8-byte slots, so the slot after a ``lddw`` is skipped."""

    pc: int
    spec: isa.OpSpec
    dst: int
    src: int      # a register, or the pseudo source of lddw / call
    off: int      # signed 16-bit
    imm: int      # signed 32-bit; for lddw the full 64-bit value (unsigned)

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def op(self) -> str:
        return self.spec.name

    @property
    def width(self) -> int:
        return self.spec.width

    @property
    def size(self) -> int:
        return self.spec.size

    @property
    def use_imm(self) -> bool:
        return self.spec.use_imm

    @property
    def slots(self) -> int:
        return 2 if self.spec.kind == "lddw" else 1

    @property
    def atomic_op(self) -> str:
        """For atomics: add/or/and/xor/xchg/cmpxchg."""
        return isa.ATOMIC_OPS[self.imm & ~isa.ATOMIC_FETCH]

    @property
    def fetch(self) -> bool:
        """For atomics: whether the old value is written back (xchg and cmpxchg always fetch)."""
        return bool(self.imm & isa.ATOMIC_FETCH)

    @property
    def helper(self) -> int | None:
        """The helper a helper call (src = CALL_HELPER) calls; None for any other instruction."""
        return self.imm if self.spec.kind == "call" and self.src == isa.CALL_HELPER else None

    def jump_target(self) -> int:
        """The pc a jump lands on (RFC 9669 4.3: relative to the next instruction)."""
        return self.pc + 1 + (self.imm if self.spec.name == "ja32" else self.off)

    def call_target(self) -> int:
        """The pc a local call (src = CALL_LOCAL) enters."""
        return self.pc + 1 + self.imm

    @property
    def callback(self) -> int | None:
        """The pc whose address an lddw of a function (src = LDDW_CODE_ADDR, Linux's BPF_PSEUDO_FUNC) loads, a
        callback: relative to the next slot, as a call's, by the signed low half of imm (Linux's insn[0].imm);
        None for any other instruction."""
        if self.spec.kind == "lddw" and self.src == isa.LDDW_CODE_ADDR:
            return self.pc + 1 + _s32(self.imm)
        return None


def _reserved(pc: int, what: str) -> DecodeError:
    return DecodeError(what, insn=pc)


def _check_fields(pc: int, spec: isa.OpSpec, dst: int, src: int, off: int, imm: int) -> None:
    """Field legality per kind: registers in range, reserved fields zero (RFC 9669 3)."""
    kind = spec.kind
    if dst >= isa.NUM_REGS:
        raise _reserved(pc, f"invalid destination register r{dst}")
    if kind in ("alu", "mov", "movsx", "neg", "end", "load", "store", "atomic") or (kind == "jmp" and not spec.use_imm):
        if not spec.use_imm and src >= isa.NUM_REGS:
            raise _reserved(pc, f"invalid source register r{src}")
    if kind in ("alu", "mov") and spec.use_imm and src != 0:
        raise _reserved(pc, "reserved source field is not zero")
    if kind in ("alu", "mov") and not spec.use_imm and imm != 0:
        raise _reserved(pc, "reserved immediate field is not zero")
    if kind == "neg" and (src != 0 or imm != 0):
        raise _reserved(pc, "reserved fields of neg are not zero")
    if kind == "movsx" and imm != 0:
        raise _reserved(pc, "reserved immediate field is not zero")
    if kind == "end":
        if src != 0 or off != 0:
            raise _reserved(pc, "reserved fields of a byte swap are not zero")
        if imm not in (16, 32, 64):
            raise _reserved(pc, f"byte swap width {imm} is not 16, 32 or 64")
    if kind == "jmp":
        if spec.use_imm and src != 0:
            raise _reserved(pc, "reserved source field is not zero")
        if not spec.use_imm and imm != 0:
            raise _reserved(pc, "reserved immediate field is not zero")
    if kind == "ja" and (dst or src or (imm if spec.name == "ja" else off)):
        raise _reserved(pc, "reserved fields of a jump are not zero")
    if kind == "call":
        if dst != 0 or off != 0:
            raise _reserved(pc, "reserved fields of a call are not zero")
        if src not in (isa.CALL_HELPER, isa.CALL_LOCAL, isa.CALL_BTF):
            raise _reserved(pc, f"unknown call source {src}")
    if kind == "exit" and (dst or src or off or imm):
        raise _reserved(pc, "reserved fields of exit are not zero")
    if kind == "load" and imm != 0:
        raise _reserved(pc, "reserved immediate field of a load is not zero")
    if kind == "store" and spec.use_imm and src != 0:
        raise _reserved(pc, "reserved source field of a store is not zero")
    if kind == "store" and not spec.use_imm and imm != 0:
        raise _reserved(pc, "reserved immediate field of a store is not zero")
    if kind == "atomic":
        base = imm & ~isa.ATOMIC_FETCH
        if base not in isa.ATOMIC_OPS or imm & ~0xF1:
            raise _reserved(pc, f"unknown atomic operation 0x{imm & 0xFFFFFFFF:x}")
        if base in (0xE0, 0xF0) and not imm & isa.ATOMIC_FETCH:
            raise _reserved(pc, "xchg and cmpxchg must have the fetch flag")


def decode(code: bytes) -> list[Insn]:
    """Decode a program. Raises DecodeError naming the slot of the first invalid instruction."""
    if len(code) % 8:
        raise DecodeError(f"program length {len(code)} is not a multiple of 8")
    insns: list[Insn] = []
    n = len(code) // 8
    pc = 0
    while pc < n:
        opcode, regs, off, imm = _SLOT.unpack_from(code, pc * 8)
        dst, src = regs & 0x0F, regs >> 4
        spec = isa.lookup(opcode, off)
        if opcode == _LDDW and off:
            raise _reserved(pc, f"invalid bpf_ld_imm64 insn: reserved offset field of lddw is {off}, not zero")
        if spec is None:
            why = f"unknown opcode 0x{opcode:02x}" + (f" with offset {off}" if off else "")
            if opcode == 0x8D:  # BPF_JMP | BPF_CALL | BPF_X
                why += " (callx, a call through a register: clang -O0 calls helpers so; compile with -O1 or more)"
            raise _reserved(pc, why)
        if spec.kind == "lddw":
            if pc + 1 >= n:
                raise _reserved(pc, "lddw is missing its second slot")
            op2, regs2, off2, imm2 = _SLOT.unpack_from(code, (pc + 1) * 8)
            if op2 or regs2 or off2:
                raise _reserved(pc, f"invalid bpf_ld_imm64 insn: reserved fields of lddw's second slot are not zero "
                                    f"(opcode 0x{op2:02x}, registers 0x{regs2:02x}, offset {off2})")
            if src > isa.LDDW_MAP_IDX_VALUE:
                raise _reserved(pc, f"unknown lddw source {src}")
            if dst >= isa.NUM_REGS:
                raise _reserved(pc, f"invalid destination register r{dst}")
            value = (imm & 0xFFFFFFFF) | ((imm2 & 0xFFFFFFFF) << 32)
            insns.append(Insn(pc, spec, dst, src, off, value))
            pc += 2
            continue
        _check_fields(pc, spec, dst, src, off, imm)
        insns.append(Insn(pc, spec, dst, src, off, imm))
        pc += 1
    return insns


def encode(insn: Insn) -> bytes:
    """The bytes of one instruction (two slots for lddw); the inverse of decode."""
    regs = (insn.src << 4) | insn.dst
    off = insn.off if insn.spec.offset is None else insn.spec.offset
    if insn.spec.kind == "lddw":
        lo, hi = insn.imm & 0xFFFFFFFF, (insn.imm >> 32) & 0xFFFFFFFF
        return (_SLOT.pack(insn.spec.opcode, regs, off, _s32(lo)) + _SLOT.pack(0, 0, 0, _s32(hi)))
    return _SLOT.pack(insn.spec.opcode, regs, off, insn.imm)


def _s32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v
