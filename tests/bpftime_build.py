"""bpftime's GPU example probes (tests/fixtures/bpftime) built as bpftime's Makefiles build them: by the
tests here, and by scripts/gpu-prep.sh for the GPU machine, which has no clang."""

from __future__ import annotations

import subprocess
from pathlib import Path

from egpu_preload.bpf.compile import find_clang

FIXTURES = Path(__file__).parent / "fixtures" / "bpftime"
SOURCES = sorted(FIXTURES.glob("**/*.bpf.c"))
# bpftime's probes as `egpu attach` takes them into a running job: name -> (the fixture, its edits: each
# (text, replacement), the text found exactly once). Live, a uprobe names its target in its section (no
# egpu-run --uprobe names it) and makes no bpf_printk line (nothing drains a host program's lines in a
# job that started without them).
LIVE = {"live/launchlate.bpf.c": ("launchlate/launchlate.bpf.c", (
    ('SEC("uprobe")\n', 'SEC("uprobe/libcudart.so:__cudaLaunchKernel")\n'),
    ('\tbpf_printk("CPU: cudaLaunchKernel called at ts=%lu ns (calibrated=%lu), pid=%u\\n",\n'
     '\t\t   ts_mono, ts_calibrated, pid);\n', ''),
))}


def name(src: Path) -> str:
    """``threadhist/threadhist.bpf.c``: a source's path under the fixtures, as bpftime's example/gpu has it."""
    return str(src.relative_to(FIXTURES))


def object_name(name: str) -> str:
    return name.replace("/", "_").removesuffix(".c") + ".o"


def live_source(name: str) -> str:
    """The text of LIVE's ``name``: its fixture with its edits made; ValueError when one does not apply."""
    fixture, edits = LIVE[name]
    text = (FIXTURES / fixture).read_text()
    for old, new in edits:
        if text.count(old) != 1:
            raise ValueError(f"{name}: {old!r} is not in {fixture} exactly once")
        text = text.replace(old, new)
    return text


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
    sources = {name(src): src for src in SOURCES}
    for n in LIVE:
        sources[n] = out_dir / n
        sources[n].parent.mkdir(exist_ok=True)
        sources[n].write_text(live_source(n))
    objs = {}
    for n, src in sources.items():
        obj = out_dir / object_name(n)
        done = subprocess.run([clang, *flags, "-c", str(src), "-o", str(obj)], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{n}: {done.stderr[-2000:]}")
        objs[n] = obj
    return objs
