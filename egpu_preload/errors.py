"""One exception family for everything egpu refuses.

Messages read subject first, like libbpf's pr_warn and the CLI line the user sees:
``probe.bpf.o:kprobe/foo:17: divisor may be zero (r3)``.
"""

from __future__ import annotations


class EgpuError(Exception):
    """A clean refusal: where it happened (file, section, instruction) and why."""

    def __init__(self, reason: str, *, file: str | None = None, section: str | None = None,
                 insn: int | None = None, detail: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.file = file
        self.section = section
        self.insn = insn
        self.detail = detail  # multi-line log (verifier state), printed below the one-line message
        self.program: str | None = None   # the program refused, where its section may hold others

    def where(self, *, file: str | None = None, section: str | None = None,
              program: str | None = None) -> "EgpuError":
        """Fill in location fields an inner layer could not know; returns self for `raise e.where(...)`."""
        self.file = self.file or file
        self.section = self.section or section
        self.program = self.program or program
        return self

    def __str__(self) -> str:
        """The one line the CLI prints (``detail`` goes below it). A reason quoting a library's message of
        several lines (pyarrow's "Couldn't deserialize thrift: ...\\nDeserializing page header failed.") has
        them joined; what a terminal would act on rather than show (a tab aside), there or in a file or section
        name (read from the file), is escaped: C0 and C1 controls, line and bidi marks, every character Python
        calls unprintable. pyarrow's "don't know what type: \\x0f" switched the terminal's character set."""
        parts = [p for p in (self.file, self.section) if p]
        if self.insn is not None:
            parts.append(str(self.insn))
        reason = "; ".join(filter(None, map(str.strip, self.reason.splitlines())))
        line = ":".join(parts + [" " + reason]) if parts else reason
        return "".join(c if c.isprintable() or c == "\t" else repr(c)[1:-1] for c in line)


class CompileError(EgpuError):
    """clang refused a probe source; ``detail`` holds its diagnostics, which every caller shows."""


class ElfError(EgpuError):
    """The object file is not a usable eBPF ELF."""


class BtfError(EgpuError):
    """The .BTF section is malformed."""


class DecodeError(EgpuError):
    """Bytes that are not a valid RFC 9669 instruction."""


class AsmError(EgpuError):
    """Assembler input that does not parse."""


class VerifierError(EgpuError):
    """The verifier rejected the program."""


class VmError(EgpuError):
    """The reference VM met something it cannot run."""


class TranslateError(EgpuError):
    """The eBPF -> PTX translator cannot handle the program."""


class PtxError(EgpuError):
    """PTX that the parser or rewriter cannot handle."""


class FatbinError(EgpuError):
    """A malformed fatbin or fatbin wrapper."""


class CowError(EgpuError):
    """Checkpoint/restore bookkeeping (cow/) met an inconsistency."""


class SnapshotError(CowError):
    """A checkpoint directory that cannot be written, read or restored."""


def elf_refusals() -> tuple[type[BaseException], ...]:
    """What pyelftools raises reading a malformed file: its own errors, and Python's where a header field
    points outside the file (a seek past 2**63, a short read, an index or a string that is not there).
    For code that only reads through pyelftools: around egpu's own logic it would hide bugs."""
    import struct

    from elftools.common.exceptions import ELFError
    from elftools.construct.core import ConstructError
    return ELFError, ConstructError, ValueError, struct.error, OverflowError, IndexError, KeyError, EOFError
