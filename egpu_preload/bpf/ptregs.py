"""``struct pt_regs`` of x86-64: what a host uprobe sees in r1 (shim/uprobe.c fills it; the verifier
checks reads against it). The kernel's layout (arch/x86/include/asm/ptrace.h), which bpf_tracing.h's
PT_REGS_PARM1..6 (di, si, dx, cx, r8, r9) and PT_REGS_RC (ax) read with -D__TARGET_ARCH_x86.
"""

from __future__ import annotations

from .ctx import Field, Layout

NAMES = ("r15", "r14", "r13", "r12", "bp", "bx", "r11", "r10", "r9", "r8", "ax", "cx", "dx", "si", "di",
         "orig_ax", "ip", "cs", "flags", "sp", "ss")
FIELDS: tuple[Field, ...] = tuple(Field(name, 8 * i, 8) for i, name in enumerate(NAMES))
SIZE = 8 * len(NAMES)
ARGS = ("di", "si", "dx", "cx", "r8", "r9")  # PT_REGS_PARM1..6
PT_REGS = Layout("pt_regs", FIELDS, SIZE)
