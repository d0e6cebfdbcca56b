"""The eBPF instruction set (RFC 9669) as one table of data.

Every consumer - decoder, disassembler, assembler, VM, verifier, translator - reads ``OPS``; each has a
test that fails when it lacks a handler for one of its rows.

Encoding (RFC 9669 section 3): ``opcode:8 | src:4 dst:4 | offset:16 | imm:32``, little endian, with the
register nibbles as ``dst`` in the low half of byte 1. ``lddw`` takes a second 8-byte slot whose imm holds
the upper 32 bits.
"""

from __future__ import annotations

from dataclasses import dataclass

# Instruction classes (RFC 9669 3.3), the low 3 bits of the opcode.
LD, LDX, ST, STX, ALU, JMP, JMP32, ALU64 = range(8)
CLASS_NAMES = {LD: "ld", LDX: "ldx", ST: "st", STX: "stx", ALU: "alu", JMP: "jmp", JMP32: "jmp32",
               ALU64: "alu64"}

# Source bit for arithmetic and jumps (RFC 9669 3.3.1): K = immediate, X = register.
SRC_K, SRC_X = 0x00, 0x08

# Size and mode for loads and stores (RFC 9669 5).
SIZE_W, SIZE_H, SIZE_B, SIZE_DW = 0x00, 0x08, 0x10, 0x18
SIZE_BYTES = {SIZE_W: 4, SIZE_H: 2, SIZE_B: 1, SIZE_DW: 8}
MODE_IMM, MODE_ABS, MODE_IND, MODE_MEM, MODE_MEMSX, MODE_ATOMIC = 0x00, 0x20, 0x40, 0x60, 0x80, 0xC0

# Arithmetic operations (RFC 9669 4.1), the high 4 bits.
ALU_ADD, ALU_SUB, ALU_MUL, ALU_DIV, ALU_OR, ALU_AND, ALU_LSH, ALU_RSH = (0x00, 0x10, 0x20, 0x30, 0x40,
                                                                         0x50, 0x60, 0x70)
ALU_NEG, ALU_MOD, ALU_XOR, ALU_MOV, ALU_ARSH, ALU_END = 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0

# Jump operations (RFC 9669 4.3).
JMP_JA, JMP_JEQ, JMP_JGT, JMP_JGE, JMP_JSET, JMP_JNE, JMP_JSGT, JMP_JSGE = (0x00, 0x10, 0x20, 0x30, 0x40,
                                                                           0x50, 0x60, 0x70)
JMP_CALL, JMP_EXIT, JMP_JLT, JMP_JLE, JMP_JSLT, JMP_JSLE = 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0

# Atomic operations, carried in imm (RFC 9669 5.3).
ATOMIC_FETCH = 0x01
ATOMIC_OPS = {0x00: "add", 0x40: "or", 0x50: "and", 0xA0: "xor", 0xE0: "xchg", 0xF0: "cmpxchg"}

# Pseudo sources of lddw (RFC 9669 5.4) and call (4.3.1).
LDDW_IMM64, LDDW_MAP_FD, LDDW_MAP_VALUE, LDDW_VAR_ADDR, LDDW_CODE_ADDR, LDDW_MAP_IDX, \
    LDDW_MAP_IDX_VALUE = range(7)
CALL_HELPER, CALL_LOCAL, CALL_BTF = 0, 1, 2

NUM_REGS = 11  # r0-r9 general, r10 the read-only frame pointer
FRAME_POINTER = 10
STACK_SIZE = 512


@dataclass(frozen=True)
class OpSpec:
    """One row: the opcode byte (and the offset where it selects the operation) and what it means.

    ``kind`` selects the handler in every consumer: alu, neg, end, mov, movsx, jmp, ja, call, exit,
    lddw, load, store, atomic.
    """

    opcode: int
    offset: int | None  # the offset value that selects this row, or None when offset is an operand
    kind: str
    name: str           # the operation: "add", "sdiv", "jeq", "ldx", "atomic", ...
    width: int = 64     # 32 or 64: ALU vs ALU64, JMP32 vs JMP, and the atomic operand size
    size: int = 0       # bytes moved, for memory operations; for end/bswap the bit width lives in imm
    use_imm: bool = False
    signed: bool = False  # sign-extending load (MEMSX)


def _alu_rows() -> list[OpSpec]:
    rows: list[OpSpec] = []
    binary = {ALU_ADD: "add", ALU_SUB: "sub", ALU_MUL: "mul", ALU_OR: "or", ALU_AND: "and",
              ALU_LSH: "lsh", ALU_RSH: "rsh", ALU_XOR: "xor", ALU_ARSH: "arsh"}
    for cls, width in ((ALU, 32), (ALU64, 64)):
        for src, use_imm in ((SRC_K, True), (SRC_X, False)):
            for op, name in binary.items():
                rows.append(OpSpec(cls | src | op, 0, "alu", name, width, use_imm=use_imm))
            # offset 0 = unsigned, 1 = signed (RFC 9669 4.1: "sdiv", "smod")
            rows.append(OpSpec(cls | src | ALU_DIV, 0, "alu", "div", width, use_imm=use_imm))
            rows.append(OpSpec(cls | src | ALU_DIV, 1, "alu", "sdiv", width, use_imm=use_imm))
            rows.append(OpSpec(cls | src | ALU_MOD, 0, "alu", "mod", width, use_imm=use_imm))
            rows.append(OpSpec(cls | src | ALU_MOD, 1, "alu", "smod", width, use_imm=use_imm))
            rows.append(OpSpec(cls | src | ALU_MOV, 0, "mov", "mov", width, use_imm=use_imm))
        rows.append(OpSpec(cls | ALU_NEG, 0, "neg", "neg", width))
        # MOVSX: register source only; 32-bit form allows s8/s16, 64-bit also s32 (RFC 9669 4.1).
        for bits in ((8, 16) if width == 32 else (8, 16, 32)):
            rows.append(OpSpec(cls | SRC_X | ALU_MOV, bits, "movsx", f"movsx{bits}", width, size=bits // 8))
    # Byte swaps (RFC 9669 4.2): ALU class with K=le, X=be; ALU64 class with K=unconditional bswap.
    rows.append(OpSpec(ALU | SRC_K | ALU_END, 0, "end", "le", 64))
    rows.append(OpSpec(ALU | SRC_X | ALU_END, 0, "end", "be", 64))
    rows.append(OpSpec(ALU64 | SRC_K | ALU_END, 0, "end", "bswap", 64))
    return rows


def _jmp_rows() -> list[OpSpec]:
    rows: list[OpSpec] = []
    conds = {JMP_JEQ: "jeq", JMP_JGT: "jgt", JMP_JGE: "jge", JMP_JSET: "jset", JMP_JNE: "jne",
             JMP_JSGT: "jsgt", JMP_JSGE: "jsge", JMP_JLT: "jlt", JMP_JLE: "jle", JMP_JSLT: "jslt",
             JMP_JSLE: "jsle"}
    for cls, width in ((JMP, 64), (JMP32, 32)):
        for src, use_imm in ((SRC_K, True), (SRC_X, False)):
            for op, name in conds.items():
                rows.append(OpSpec(cls | src | op, None, "jmp", name, width, use_imm=use_imm))
    rows.append(OpSpec(JMP | JMP_JA, None, "ja", "ja", 64))
    rows.append(OpSpec(JMP32 | JMP_JA, 0, "ja", "ja32", 32))  # gotol: the target is in imm
    rows.append(OpSpec(JMP | JMP_CALL, 0, "call", "call", 64))
    rows.append(OpSpec(JMP | JMP_EXIT, 0, "exit", "exit", 64))
    return rows


def _mem_rows() -> list[OpSpec]:
    rows: list[OpSpec] = [OpSpec(LD | MODE_IMM | SIZE_DW, 0, "lddw", "lddw", 64, size=8)]
    for size, nbytes in SIZE_BYTES.items():
        rows.append(OpSpec(LDX | MODE_MEM | size, None, "load", "ldx", size=nbytes))
        rows.append(OpSpec(ST | MODE_MEM | size, None, "store", "st", size=nbytes, use_imm=True))
        rows.append(OpSpec(STX | MODE_MEM | size, None, "store", "stx", size=nbytes))
        if nbytes < 8:
            rows.append(OpSpec(LDX | MODE_MEMSX | size, None, "load", "ldxs", size=nbytes, signed=True))
    for size, width in ((SIZE_W, 32), (SIZE_DW, 64)):
        rows.append(OpSpec(STX | MODE_ATOMIC | size, None, "atomic", "atomic", width, size=width // 8))
    return rows


OPS: tuple[OpSpec, ...] = tuple(_alu_rows() + _jmp_rows() + _mem_rows())
KINDS: frozenset[str] = frozenset(op.kind for op in OPS)

# Lookup used by the decoder: exact (opcode, offset) rows first, then rows where offset is an operand.
BY_OPCODE_OFFSET: dict[tuple[int, int], OpSpec] = {(o.opcode, o.offset): o for o in OPS if o.offset is not None}
BY_OPCODE: dict[int, OpSpec] = {o.opcode: o for o in OPS if o.offset is None}


def lookup(opcode: int, offset: int) -> OpSpec | None:
    """The row for an opcode byte and its (signed) offset field, or None when the pair is not in RFC 9669."""
    return BY_OPCODE_OFFSET.get((opcode, offset)) or BY_OPCODE.get(opcode)
