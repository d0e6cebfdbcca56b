"""bpftime's GPU example probes (tests/fixtures/bpftime) built as bpftime's Makefiles build them: by the
tests here, and by scripts/gpu-prep.sh for the GPU machine, which has no clang. Also the programs three of
them trace where the GPU machine lacks the library: stand-ins for faiss' and llama.cpp's kernels
(tests/bpftime_targets), and bpftime's own CUTLASS GEMM program, built by gpu-prep.sh against CUTLASS's
headers from PyPI."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from egpu_preload import fatbin
from egpu_preload.bpf.compile import find_clang
from egpu_preload.bpf.elf import load_object
from egpu_preload.translate.rewrite import RewriteResult, instrument, probe_specs

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
TARGETS = Path(__file__).parent / "bpftime_targets"
# bpftime's probes whose example program needs a library the GPU machine lacks -> a program in TARGETS
# whose kernel has the probe's mangled name exactly and does that kernel's kind of work
STAND_INS = {"faiss-test/threadhist.bpf.c": "faiss_l2norm", "llama-cpp-test/threadhist.bpf.c": "llama_rms_norm"}
SM_90 = ["-gencode", "arch=compute_90,code=[sm_90,compute_90]"]   # SASS, and the PTX egpu rewrites
# bpftime's example/gpu/cutlass: the program its counter probe traces, its gemm/Makefile's NVCC_FLAGS
# (no -arch: SM_90 added), and the CUTLASS that Makefile clones (v3.5.0), whose headers PyPI's
# nvidia-cutlass wheel of that version carries under cutlass_library/source/
CUTLASS_GEMM = FIXTURES / "cutlass" / "gemm" / "cutlass_gemm.cu"
CUTLASS_PROBE = "cutlass/counter/cutlass_launch_counter.bpf.c"
CUTLASS_VERSION = "3.5.0.0"
CUTLASS_INCLUDES = ("cutlass_library/source/include/", "cutlass_library/source/tools/util/include/")
CUTLASS_NVCC_FLAGS = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "--use_fast_math"]


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


def build_stand_in(probe: str, out: Path, ptx: bool = False) -> Path:
    """STAND_INS[probe] compiled by nvcc into out: an executable, or with ptx its PTX alone."""
    src = TARGETS / f"{STAND_INS[probe]}.cu"
    mode = ["-ptx", "-arch=sm_90"] if ptx else ["-O2", *SM_90]
    subprocess.run(["nvcc", *mode, str(src), "-o", str(out)], check=True)
    return out


def build_cutlass_gemm(deps: Path, out: Path) -> Path:
    """bpftime's cutlass_gemm.cu built as its Makefile builds it, into out, against CUTLASS_VERSION's headers
    (downloaded into deps, once). Raises RuntimeError with pip's or nvcc's message."""
    pattern = f"nvidia_cutlass-{CUTLASS_VERSION}-*.whl"
    if not any(deps.glob(pattern)):
        _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(deps),
              f"nvidia-cutlass=={CUTLASS_VERSION}"], "pip")
    wheel = next(deps.glob(pattern))
    root = deps / wheel.name.removesuffix(".whl")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(root, [m for m in z.namelist() if m.startswith(CUTLASS_INCLUDES)])
    # -lcudart alone: the Makefile's -lcuda needs a libcuda to link against, and this machine has none
    # (the program calls no driver function: cudart finds the driver at run time)
    _run(["nvcc", *CUTLASS_NVCC_FLAGS, *SM_90, *[f"-I{root / inc}" for inc in CUTLASS_INCLUDES],
          str(CUTLASS_GEMM), "-o", str(out), "-lcudart"], "nvcc")
    return out


def _run(cmd: list[str], what: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{what}: {done.stderr[-2000:]}")


def rewrite(probe_obj: Path, ptx: str) -> RewriteResult:
    """ptx instrumented with the object's probes by egpu's rewriter: each kernel instrumented, untouched (no
    probe selects it) or failed."""
    return instrument(ptx, probe_specs(load_object(probe_obj)))


def binary_ptx(exe: Path) -> str:
    """The PTX an sm_90 device JITs from exe's fatbins, as egpu's runtime picks it."""
    entry = fatbin.best_ptx(fatbin.find_fatbins(exe.read_bytes()), 90)
    if entry is None:
        raise RuntimeError(f"{exe}: no PTX for sm_90 in it")
    return entry.ptx()


def prepare_cutlass(out_dir: Path, deps: Path) -> Path:
    """out_dir/cutlass_gemm, built, and out_dir's build of CUTLASS_PROBE instruments its GEMM kernel: the
    probe's section names the kernel exactly. RuntimeError naming each kernel and why if it does not."""
    exe = build_cutlass_gemm(deps, out_dir / "cutlass_gemm")
    res = rewrite(out_dir / object_name(CUTLASS_PROBE), binary_ptx(exe))
    if not any(k.status == "instrumented" for k in res.kernels):
        kernels = "; ".join(f"{k.name}: {k.status} ({k.reason})" for k in res.kernels)
        raise RuntimeError(f"{exe}: {CUTLASS_PROBE} instruments none of its kernels: {kernels}")
    return exe
