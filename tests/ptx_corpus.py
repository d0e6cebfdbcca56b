"""The PTX corpus the rewriter is tested on: nvcc output of tests/cuda/*.cu plus checked-in PTX.

Built once per machine state (cached under the temp dir, keyed by nvcc's version and the sources),
with two nvcc processes at a time. Also the counting probe the tests splice in, and a ptxas runner.

``python3 tests/ptx_corpus.py docs/ptx-corpus.md`` writes the table of rewrite and ptxas times.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from egpu_preload.bpf.program import Attach  # noqa: E402
from egpu_preload.translate.rewrite import ProbeSpec, instrument  # noqa: E402

CUDA_DIR = ROOT / "tests" / "cuda"
FIXTURES = ROOT / "tests" / "fixtures" / "ptx"
SCOPES = ("thread", "warp", "block")
JOBS = 2


@dataclass(frozen=True)
class Variant:
    name: str          # "vector_add.sm_90"
    source: Path
    arch: str          # what nvcc targets; ptxas checks this and sm_90
    flags: tuple[str, ...] = ()
    fatbin: bool = False   # the whitespace-normalized PTX nvcc embeds in a fatbin


RDC = ("-rdc=true",)   # relocatable device code: what makes nvcc emit .weak


def variants() -> list[Variant]:
    """Each source for sm_75, sm_90 and as fatbin PTX; sm_80 and sm_89 only for the sources whose PTX
    changes there (cp.async, and redux.sync in cg::reduce, both from sm_80 on: for the others nvcc's
    sm_80 and sm_89 PTX is its sm_90 PTX with another .target); then the builds with flags of their own."""
    own = {"wgmma", "relocatable", "tma_cluster", "warp_specialized"}
    out = []
    for src in sorted(CUDA_DIR.glob("*.cu")):
        if src.stem in own:
            continue
        archs = ("sm_75", "sm_80", "sm_89", "sm_90") if src.stem in ("cp_async", "coop_groups") else ("sm_75", "sm_90")
        out += [Variant(f"{src.stem}.{arch}", src, arch) for arch in archs]
        out.append(Variant(f"{src.stem}.sm_90.fatbin", src, "sm_90", fatbin=True))
    rdc = CUDA_DIR / "relocatable.cu"
    out += [Variant("wgmma.sm_90a", CUDA_DIR / "wgmma.cu", "sm_90a"),
            Variant("tma_cluster.sm_90a", CUDA_DIR / "tma_cluster.cu", "sm_90a"),
            Variant("warp_specialized.sm_90a", CUDA_DIR / "warp_specialized.cu", "sm_90a"),
            Variant("gemm_tiled.sm_90.debug", CUDA_DIR / "gemm_tiled.cu", "sm_90", ("-G",)),
            Variant("reduction.sm_90.lineinfo", CUDA_DIR / "reduction.cu", "sm_90", ("-lineinfo",)),
            Variant("relocatable.sm_75.rdc", rdc, "sm_75", RDC),
            Variant("relocatable.sm_90.rdc", rdc, "sm_90", RDC),
            Variant("relocatable.sm_90.rdc.fatbin", rdc, "sm_90", RDC, fatbin=True)]
    return out


def _nvcc(v: Variant, work: Path) -> str:
    work.mkdir(parents=True, exist_ok=True)
    if not v.fatbin:
        out = work / "out.ptx"
        _run(["nvcc", "-ptx", f"-arch={v.arch}", *v.flags, "-o", str(out), str(v.source)])
        return out.read_text()
    out = work / "out.fatbin"
    code = v.arch.replace("sm_", "compute_")
    _run(["nvcc", "-fatbin", "--compress-mode=none", f"-gencode=arch={code},code={code}", *v.flags,
          "-o", str(out), str(v.source)])
    data = out.read_bytes()
    start = data.index(b".version")   # one uncompressed PTX entry, NUL-terminated
    return data[start:data.index(b"\0", start)].decode()


def _run(cmd: list[str]) -> None:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stderr}")


@functools.cache
def build() -> dict[str, str]:
    """name -> PTX text for every nvcc variant and every checked-in fixture."""
    vs = variants()
    nvcc_version = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256(nvcc_version.encode() + b"".join(
        v.name.encode() + v.source.read_bytes() + " ".join(v.flags).encode() for v in vs)).hexdigest()[:16]
    cache = Path(tempfile.gettempdir()) / f"egpu-ptx-corpus-{key}"
    if not all((cache / f"{v.name}.ptx").exists() for v in vs):
        tmp = Path(tempfile.mkdtemp(prefix="egpu-nvcc-"))
        with ThreadPoolExecutor(JOBS) as pool:
            texts = list(pool.map(lambda v: _nvcc(v, tmp / v.name), vs))
        cache.mkdir(exist_ok=True)
        for v, text in zip(vs, texts):
            (cache / f"{v.name}.ptx").write_text(text)
        shutil.rmtree(tmp, ignore_errors=True)
    corpus = {v.name: (cache / f"{v.name}.ptx").read_text() for v in vs}
    for f in sorted(FIXTURES.glob("*.ptx")):
        corpus[f"fixture.{f.stem}"] = f.read_text()
    return corpus


def check_archs(text: str) -> list[str]:
    """Where ptxas must accept a module: sm_90, and its own .target where that is lower (an
    arch-specific target such as sm_90a only assembles for itself)."""
    target = next((line.split()[1].rstrip(",") for line in text.splitlines()
                   if line.startswith(".target")), "sm_90")
    if not target[3:].isdigit():
        return [target]
    return sorted({target, "sm_90"}) if int(target[3:]) <= 90 else [target]


# The context words stats_probe reads when it takes words (rewrite.ProbeSpec.ctx_words): kernel_id,
# launch_id, addr, site|size, flags|kind, args[0], nargs|grid[0].
STATS_WORDS = (0, 1, 2, 3, 4, 5, 13)


def stats_probe(scope: str, words: bool = False) -> str:
    """A probe of the rewriter's ABI that counts into ``__egpu_test_stats_<scope>[16]`` (u64):
    0 entry, 1 exit, 2 memory sites, 3 loads, 4 stores, 5 sum of load addresses, 6 sum of store
    addresses, 7 sum of sizes, 8 max launch_id, 9 kernel_id, 10 args[0], 11 nargs, 12 atomics.
    It takes ``%ctx`` (the context's address) or, with ``words``, the context words STATS_WORDS."""
    s = f"test_stats_{scope}"
    if words:
        params = ", ".join(f".param .b64 %cw{w}" for w in STATS_WORDS)
        fields = "\n\t".join([f"ld.param.b64 %cw{w}r, [%cw{w}];" for w in STATS_WORDS] + [
            "shr.u64 %x, %cw4r, 32;", "cvt.u32.u64 %kind, %x;"])
        reads = {"launch_id": "mov.b64 %x, %cw1r;", "kernel_id": "mov.b64 %x, %cw0r;",
                 "arg0": "mov.b64 %x, %cw5r;", "nargs": "and.b64 %x, %cw13r, 0xFFFFFFFF;",
                 "flags": "cvt.u32.u64 %flags, %cw4r;", "addr": "mov.b64 %a, %cw2r;",
                 "size": "shr.u64 %x, %cw3r, 32;"}
        regs = "\t.reg .b64 " + ", ".join(f"%cw{w}r" for w in STATS_WORDS) + ";\n"
    else:
        params = ".param .b64 %ctx"
        fields = "ld.param.b64 %c, [%ctx];\n\tld.u32 %kind, [%c+36];"
        reads = {"launch_id": "ld.u64 %x, [%c+8];", "kernel_id": "ld.u64 %x, [%c+0];",
                 "arg0": "ld.u64 %x, [%c+40];", "nargs": "ld.u32 %t, [%c+104];\n\tcvt.u64.u32 %x, %t;",
                 "flags": "ld.u32 %flags, [%c+32];", "addr": "ld.u64 %a, [%c+16];",
                 "size": "ld.u32 %t, [%c+28];\n\tcvt.u64.u32 %x, %t;"}
        regs = ""
    return f"""\
.visible .global .align 8 .u64 __egpu_{s}[16];
.func (.param .b64 %ret) egpu_{s}({params})
{{
{regs}\t.reg .b64 %c, %base, %a, %x;
\t.reg .b32 %kind, %flags, %t;
\t.reg .pred %p;
\t{fields}
\tmov.u64 %base, __egpu_{s};
\tcvta.global.u64 %base, %base;
\tmul.wide.u32 %x, %kind, 8;
\tadd.s64 %a, %base, %x;
\tred.add.u64 [%a], 1;
\t{reads["launch_id"]}
\tred.max.u64 [%base+64], %x;
\t{reads["kernel_id"]}
\tst.u64 [%base+72], %x;
\t{reads["arg0"]}
\tst.u64 [%base+80], %x;
\t{reads["nargs"]}
\tst.u64 [%base+88], %x;
\tsetp.ne.u32 %p, %kind, 2;
\t@%p bra $done;
\t{reads["flags"]}
\t{reads["addr"]}
\t{reads["size"]}
\tred.add.u64 [%base+56], %x;
\tand.b32 %t, %flags, 1;
\tsetp.eq.u32 %p, %t, 0;
\t@!%p red.add.u64 [%base+24], 1;
\t@!%p red.add.u64 [%base+40], %a;
\tand.b32 %t, %flags, 2;
\tsetp.eq.u32 %p, %t, 0;
\t@!%p red.add.u64 [%base+32], 1;
\t@!%p red.add.u64 [%base+48], %a;
\tand.b32 %t, %flags, 4;
\tsetp.eq.u32 %p, %t, 0;
\t@!%p red.add.u64 [%base+96], 1;
$done:
\tmov.u64 %x, 0;
\tst.param.b64 [%ret], %x;
\tret;
}}
"""


ABIS = ("words", "ctx")   # the two ways a probe takes its context (rewrite.ProbeSpec.ctx_words)


def stats_probes(scopes: tuple[str, ...] = SCOPES, glob: str = "*", abi: str = "words") -> list[ProbeSpec]:
    """entry + exit + mem probes in each scope, each scope counting into its own array."""
    words = abi == "words"
    return [ProbeSpec(Attach(kind, glob, scope), f"egpu_test_stats_{scope}", stats_probe(scope, words),
                      ctx_words=STATS_WORDS if words else None)
            for scope in scopes for kind in ("entry", "exit", "mem")]


def ptxas(jobs: list[tuple[str, str, str]]) -> list[tuple[str, str, int, float, str]]:
    """Assemble (name, arch, text) jobs two at a time: (name, arch, returncode, seconds, stderr)."""
    tmp = Path(tempfile.mkdtemp(prefix="egpu-ptxas-"))

    def one(job: tuple[str, str, str]) -> tuple[str, str, int, float, str]:
        name, arch, text = job
        src = tmp / f"{name}.{arch}.ptx"
        src.write_text(text)
        t0 = time.perf_counter()
        p = subprocess.run(["ptxas", f"-arch={arch}", str(src), "-o", str(src.with_suffix(".cubin"))],
                           capture_output=True, text=True)
        return name, arch, p.returncode, time.perf_counter() - t0, p.stderr

    with ThreadPoolExecutor(JOBS) as pool:
        out = list(pool.map(one, jobs))
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def table(path: Path) -> None:
    """Rewrite every corpus module with all probes, assemble it, and write the timing table."""
    load, rows, jobs = os.getloadavg()[0], [], []
    for name, text in build().items():
        t0 = time.perf_counter()
        res = instrument(text, stats_probes())
        rewrite = time.perf_counter() - t0
        inst = sum(k.status == "instrumented" for k in res.kernels)
        calls = sum(k.calls for k in res.kernels)
        rows.append((name, len(text.splitlines()), len(res.kernels), inst, calls, rewrite))
        archs = check_archs(text)
        jobs.append((name, "sm_90" if "sm_90" in archs else archs[0], res.text))
    results = {r[0]: r for r in ptxas(jobs)}
    tools = subprocess.run(["ptxas", "--version"], capture_output=True, text=True).stdout.splitlines()[-2]
    lines = ["# PTX corpus: rewrite and ptxas times", "",
             f"Every kernel of each of the {len(rows)} modules instrumented with entry + exit + memory probes in all",
             "three scopes (9 probes, `stats_probes()` in `tests/ptx_corpus.py`, taking their context as words),",
             "then assembled by `ptxas -arch=sm_90` (modules for sm_90a: `-arch=sm_90a`). Modules are nvcc builds",
             "of `tests/cuda/*.cu` named source.arch (.fatbin: the whitespace-normalized PTX nvcc embeds; .rdc:",
             "`-rdc=true`; .debug: `-G`; .lineinfo) and `fixture.*`, the PTX in `tests/fixtures/ptx/` captured",
             "from Triton, numba, CuPy and NVRTC (triton_style is hand-written in Triton's shape).",
             "Rewrite time is egpu's; ptxas time is what the driver's JIT will spend too: it grows with the",
             "probe calls spliced in (entry and exit sites and every global or generic memory access, times",
             "three scopes). Generated by `python3 tests/ptx_corpus.py docs/ptx-corpus.md` on the CI machine",
             f"(2 shared cores, load average {load:.1f} when it started), {tools}.",
             "", "| module | lines | kernels | instrumented | probe calls | rewrite ms | ptxas ms | ptxas |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, nlines, nk, inst, calls, rewrite in rows:
        _, _, rc, secs, _ = results[name]
        lines.append(f"| {name} | {nlines} | {nk} | {inst} | {calls} | {rewrite * 1e3:.2f} | {secs * 1e3:.0f} | "
                     f"{'ok' if rc == 0 else 'FAIL'} |")
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    table(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "ptx-corpus.md")
