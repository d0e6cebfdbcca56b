"""bpftime's GPU example probes (tests/fixtures/bpftime) built as bpftime's Makefiles build them: by the
tests here, and by scripts/gpu-prep.sh for the GPU machine, which has no clang."""

from __future__ import annotations

import subprocess
from pathlib import Path

from egpu_preload.bpf.compile import find_clang

FIXTURES = Path(__file__).parent / "fixtures" / "bpftime"
SOURCES = sorted(FIXTURES.glob("**/*.bpf.c"))
# bpftime's probes as `egpu attach` takes them into a running job, each a fixture a few lines apart (its
# comment says which; tests/test_bpftime_examples.py pins them): built with bpftime's flags too
LIVE = Path(__file__).parent / "fixtures" / "bpftime-live"
LIVE_SOURCES = sorted(LIVE.glob("*.bpf.c"))


def name(src: Path) -> str:
    """``threadhist/threadhist.bpf.c``: a source's path under the fixtures, as bpftime's example/gpu has it;
    ``live/launchlate.bpf.c`` for a live one."""
    return str(src.relative_to(FIXTURES)) if src.is_relative_to(FIXTURES) else f"live/{src.name}"


def object_name(src: Path) -> str:
    return name(src).replace("/", "_").removesuffix(".c") + ".o"


def bpftime_cflags(clang: str) -> list[str]:
    """example/gpu/*/Makefile: clang -g -O2 -target bpf -D__TARGET_ARCH_x86, vmlinux.h's directory on the
    include path, and clang's own system directories as -idirafter (CLANG_BPF_SYS_INCLUDES)."""
    out = subprocess.run([clang, "-v", "-E", "-"], input="", capture_output=True, text=True).stderr
    search = out.split("#include <...> search starts here:")[1].split("End of search list.")[0]
    sys_includes = [a for d in search.split() for a in ("-idirafter", d)]
    return ["-g", "-O2", "-target", "bpf", "-D__TARGET_ARCH_x86", "-I", str(FIXTURES / "vmlinux" / "x86"),
            *sys_includes]


def build_all(out_dir: Path) -> dict[str, Path]:
    """Compile every fixture into out_dir; name -> object. Raises RuntimeError with clang's message."""
    clang = find_clang()
    flags = bpftime_cflags(clang)
    out_dir.mkdir(parents=True, exist_ok=True)
    objs = {}
    for src in SOURCES + LIVE_SOURCES:
        obj = out_dir / object_name(src)
        done = subprocess.run([clang, *flags, "-c", str(src), "-o", str(obj)], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{name(src)}: {done.stderr[-2000:]}")
        objs[name(src)] = obj
    return objs
