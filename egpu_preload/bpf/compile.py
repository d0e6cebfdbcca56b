"""Probe source -> eBPF object: clang with the flags and include path an egpu probe needs."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import CompileError, EgpuError
from ..outpaths import check_output_file

INCLUDE_DIR = Path(__file__).resolve().parent.parent / "include"  # egpu.bpf.h
CLANGS = ("clang-19", "clang")  # clang-19 first: it knows -mcpu=v4
# platform.machine() -> libbpf's __TARGET_ARCH_* spelling (bpf_tracing.h keys pt_regs layouts on it).
_TARGET_ARCH = {"x86_64": "x86", "amd64": "x86", "aarch64": "arm64", "arm64": "arm64", "ppc64le": "powerpc",
                "s390x": "s390", "riscv64": "riscv"}


def find_clang() -> str:
    """The first clang of CLANGS on PATH; EgpuError when there is none."""
    for name in CLANGS:
        path = shutil.which(name)
        if path:
            return path
    raise EgpuError(f"no clang found (looked for {', '.join(CLANGS)}): install clang to compile probes")


def clang_flags(mcpu: str = "v3", include: Sequence[Path] = ()) -> list[str]:
    """The flags a probe needs, for this machine. v3 gives atomics and jmp32; v4 adds sdiv/movsx/bswap/ja32.
    ``include``: the user's directories, searched after egpu's own header (a bpftime or libbpf-tools
    probe's vmlinux.h, say)."""
    flags = ["-O2", "-g", "-target", "bpf", f"-mcpu={mcpu}", "-I", str(INCLUDE_DIR)]
    # linux/types.h includes asm/types.h, which Debian keeps under the multiarch directory only.
    multiarch = sysconfig.get_config_var("MULTIARCH")
    if multiarch and Path("/usr/include", multiarch).is_dir():
        flags += ["-idirafter", str(Path("/usr/include", multiarch))]
    arch = _TARGET_ARCH.get(platform.machine().lower())
    if arch:
        flags.append(f"-D__TARGET_ARCH_{arch}")
    return flags + [a for d in include for a in ("-I", str(d))]


def clang_args(src: Path, out: Path, mcpu: str = "v3", include: Sequence[Path] = ()) -> list[str]:
    """Everything after the clang executable (``include``: as clang_flags takes it)."""
    return clang_flags(mcpu, include) + ["-c", str(src), "-o", str(out)]


def compile_probe(src: Path, out: Path | None = None, *, mcpu: str = "v3", clang: str | None = None,
                  warn: Callable[[str], None] | None = None, include: Sequence[Path] = ()) -> Path:
    """Compile ``X.bpf.c`` to ``X.bpf.o`` (or ``out``); returns the object's path. ``warn`` gets clang's
    diagnostics of a successful compile (its warnings), as clang printed them; ``include``: directories
    added to the include path.

    Raises CompileError naming the source, with clang's diagnostics in ``detail``; EgpuError for a
    source that is not a C file or an output that cannot be written.
    """
    src = Path(src)
    if src.suffix != ".c":
        raise EgpuError("not a probe source (expected X.bpf.c; a .bpf.o is compiled already)", file=str(src))
    out = Path(out) if out is not None else src.with_suffix(".o")
    if not src.is_file():
        raise EgpuError("no such probe source" if not src.exists() else "not a file", file=str(src))
    if str(out) == "-":   # clang would write the object into its captured stdout
        raise EgpuError("-o -: an object goes into a file (egpu loads it back to check it)", file=str(src))
    if out.exists() and out.samefile(src):
        raise EgpuError("the output is the source itself: clang would overwrite it with the object "
                        "(-o X.bpf.o)", file=str(src))
    check_output_file(out)
    if out.exists() and not out.is_file():   # -o /dev/null: read back as "a device", then removed, as root
        raise EgpuError("-o: not a regular file (a device, a pipe): the object is loaded back to check it, and "
                        "removed when refused", file=str(out))
    missing = [d for d in include if not Path(d).is_dir()]
    if missing:   # clang would only say that a header it looked for there is missing
        raise EgpuError(f"-I {missing[0]}: not a directory", file=str(src))
    cmd = [clang or find_clang(), *clang_args(src, out, mcpu, include)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise EgpuError(f"cannot run {cmd[0]}: {e.strerror}", file=str(src)) from None
    if done.returncode != 0:
        why = f"clang failed (exit {done.returncode})"
        if mcpu != "v4" and "unsupported signed division" in done.stderr:   # clang names neither the cause nor v4
            why += ": signed division and modulo need -mcpu=v4 (egpu compile --mcpu v4, then use its .bpf.o)"
        raise CompileError(why, file=str(src), detail=done.stderr.rstrip() or None)
    if done.stderr.strip() and warn is not None:
        warn(done.stderr.rstrip())
    return out
