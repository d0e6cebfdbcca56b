"""Inline hooks for host uprobes on functions no GOT slot or dlsym reaches: those linked into the
executable (static cudart's ``cudaLaunchKernel`` and ``__cudaLaunchKernel``, the application's own
functions), found in the object's ``.symtab``. The function's first instructions, at least 5 bytes of
them, move to a trampoline on a page within 2 GB (capstone decodes them; what is relative to where an
instruction runs is re-encoded), and shim/uprobe.c writes a 5-byte jump to the uprobe stub over them.

Refused, with the reason: a function shorter than 5 bytes, one whose first 5 bytes hold a jump or a
return (a relative call is moved), and one not starting within 3 bytes of an 8-byte boundary (the jump
is written with one atomic store). A jump from elsewhere in the function back into its first bytes would
land inside the jump: compilers do not emit one there, and nothing here checks it.
"""

from __future__ import annotations

import ctypes
from typing import Any

from egpu_preload.errors import EgpuError, elf_refusals

JUMP = 5            # jmp rel32
TRAMPOLINE = 16     # where the trampoline starts on the near page (shim/uprobe.c NEAR_TRAMPOLINE)
UNPATCHABLE = -3    # egpu_uprobe_result EGPU_UPROBE_UNPATCHABLE
_READ = 32          # bytes read from the function: the instructions covering JUMP fit (15 bytes at most each)


def function_address(ffi: Any, lib: Any, path: str, symbol: str) -> tuple[int, int] | None:
    """(address, size) of SYMBOL, a function defined in the loaded object PATH (its ``.symtab``, else
    its ``.dynsym``); None when PATH is not loaded or defines no such function."""
    from elftools.elf.elffile import ELFFile
    file, base = ffi.new("char[]", 4096), ffi.new("unsigned long long *")
    if not lib.egpu_uprobe_object(path.encode(), file, 4096, base):
        return None
    try:
        with open(ffi.string(file).decode(), "rb") as f:
            elf = ELFFile(f)
            for name in (".symtab", ".dynsym"):
                table = elf.get_section_by_name(name)
                for sym in (table.get_symbol_by_name(symbol) or []) if table is not None else []:
                    if sym["st_info"]["type"] == "STT_FUNC" and sym["st_shndx"] != "SHN_UNDEF" and sym["st_value"]:
                        return base[0] + sym["st_value"], sym["st_size"]
    except (OSError, *elf_refusals()):
        return None
    return None


def moved(code: bytes, at: int, to: int) -> tuple[bytes, int]:
    """The instructions of ``code`` (running at ``at``) that cover its first JUMP bytes, re-encoded to run
    at ``to``; and how many bytes of ``code`` they are. Raises EgpuError when they cannot move."""
    from capstone import CS_ARCH_X86, CS_GRP_CALL, CS_GRP_INT, CS_GRP_IRET, CS_GRP_JUMP, CS_GRP_RET, CS_MODE_64, Cs
    from capstone.x86 import X86_OP_MEM, X86_REG_RIP
    md = Cs(CS_ARCH_X86, CS_MODE_64)
    md.detail = True
    out, cut = bytearray(), 0
    for insn in md.disasm(code, at):
        if cut >= JUMP:
            break
        b, here = bytearray(insn.bytes), to + len(out)
        what = f"{insn.mnemonic} {insn.op_str}".strip()
        if insn.group(CS_GRP_CALL) and b[0] == 0xE8 and insn.size == 5:   # call rel32: the same callee
            b[1:5] = _rel32(insn.operands[0].imm - (here + 5), what).to_bytes(4, "little", signed=True)
        elif insn.mnemonic != "syscall" and \
                any(insn.group(g) for g in (CS_GRP_JUMP, CS_GRP_CALL, CS_GRP_RET, CS_GRP_INT, CS_GRP_IRET)):
            # a syscall returns to the instruction after it, moved or not (a restart runs the moved copy again)
            raise EgpuError(f"its first {JUMP} bytes hold a branch ({what}), which cannot be moved")
        elif any(op.type == X86_OP_MEM and op.mem.base == X86_REG_RIP for op in insn.operands):
            k, n = insn.disp_offset, insn.disp_size
            disp = int.from_bytes(b[k:k + n], "little", signed=True) + insn.address - here
            b[k:k + n] = _rel32(disp, what).to_bytes(n, "little", signed=True)
        out += b
        cut += insn.size
    if cut < JUMP:
        raise EgpuError(f"its first {JUMP} bytes do not decode as instructions")
    return bytes(out), cut


def _rel32(value: int, what: str) -> int:
    if not -(1 << 31) <= value < 1 << 31:
        raise EgpuError(f"{what} cannot reach its operand from the trampoline")
    return value


def attach(ffi: Any, lib: Any, path: str, symbol: str, handles: Any, rets: Any, n: int) -> tuple[int, str | None]:
    """Hook SYMBOL of PATH inline for the ``n`` programs (as egpu_uprobe_attach takes them): the
    egpu_uprobe_result, and why when it is UNPATCHABLE. -1 (no symbol) when PATH does not define it."""
    found = function_address(ffi, lib, path, symbol)
    if found is None:
        return -1, None
    address, size = found
    if 0 < size < JUMP:
        return UNPATCHABLE, f"it is {size} bytes long, shorter than the {JUMP}-byte jump"
    if address % 8 > 3:
        return UNPATCHABLE, f"it starts {address % 8} bytes past an 8-byte boundary (at most 3: one atomic store)"
    function = ffi.cast("void *", address)
    near = lib.egpu_uprobe_near(function)
    if near == ffi.NULL:
        return UNPATCHABLE, "no page within 2 GB of it could be mapped"
    code = ctypes.string_at(address, _READ)
    to = int(ffi.cast("uintptr_t", near)) + TRAMPOLINE
    if code[0] == 0xE9 and address + JUMP + int.from_bytes(code[1:5], "little", signed=True) == to - TRAMPOLINE:
        instructions, cut = b"", JUMP   # hooked already (by an earlier attach): its trampoline is in place
    else:
        try:
            instructions, cut = moved(code, address, to)
        except EgpuError as e:
            return UNPATCHABLE, str(e)
        except ImportError:
            return UNPATCHABLE, "an inline hook needs capstone (pip install capstone)"
    result = lib.egpu_uprobe_attach_inline(path.encode(), symbol.encode(), function, near, instructions,
                                           len(instructions), cut, handles, rets, n)
    return result, None
