"""What instrumenting adds to a module's assembly as its kernels multiply, no GPU:
``python3 bench/ptxas_scale.py OUT.json [N ...]`` (default 100 2000).

A module of N small kernels (kernel i: a[j] = b[j] + i; nvcc -ptx for sm_90) instrumented with
tests/probes/memtrace.bpf.c (an LRU hash map), then the original and the instrumented PTX assembled by ptxas for
sm_90, as the driver's JIT would: ptxas compiles each probe again for every kernel that calls it, so the
instrumented module's time grows with its kernels. The best of REPS runs of each; the README's load-time sentence
quotes its run on the CI machine (docs/bench/ptxas_scale_ci.json).
Not a bench_*.py: it needs no GPU, so `make gpu-test` leaves it out."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROBE = ROOT / "tests" / "probes" / "memtrace.bpf.c"
REPS = 2
WHAT = (f"ptxas -arch=sm_90 on a module of N small kernels, as nvcc made it and instrumented with {PROBE.name}: "
        f"the best of {REPS} runs each, in seconds")


def kernels_source(n: int) -> str:
    """CUDA C++ of n small kernels, each its own name."""
    return "".join(f'extern "C" __global__ void k{i}(float *a, const float *b, int n)\n'
                   f"{{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) a[i] = b[i] + {i}.0f; }}\n"
                   for i in range(n))


def assemble_s(ptx: Path, out: Path) -> float:
    """The best of REPS ptxas runs on ``ptx``, in seconds."""
    best = float("inf")
    for _ in range(REPS):
        t = time.perf_counter()
        subprocess.run(["ptxas", "-arch=sm_90", str(ptx), "-o", str(out)], check=True)
        best = min(best, time.perf_counter() - t)
    return best


def measure(n: int, work: Path, probe) -> dict:
    from egpu_preload.translate.rewrite import instrument
    src, ptx = work / f"k{n}.cu", work / f"k{n}.ptx"
    src.write_text(kernels_source(n))
    subprocess.run(["nvcc", "-ptx", "-arch=sm_90", str(src), "-o", str(ptx)], check=True)
    res = instrument(ptx.read_text(), list(probe.specs))
    probed = work / f"k{n}.probed.ptx"
    probed.write_text(res.text)
    instrumented = sum(1 for k in res.kernels if k.status == "instrumented")
    return {"kernels": n, "instrumented": instrumented, "original_s": round(assemble_s(ptx, work / "o.cubin"), 3),
            "instrumented_s": round(assemble_s(probed, work / "p.cubin"), 3)}


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__.splitlines()[1].strip())
    from egpu_preload.bpf.compile import compile_probe
    from egpu_preload.runtime.probes import load_probe
    sizes = [int(a) for a in sys.argv[2:]] or [100, 2000]
    version = subprocess.run(["ptxas", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        probe = load_probe(compile_probe(PROBE, Path(tmp) / "memtrace.bpf.o"))
        rows = [measure(n, Path(tmp), probe) for n in sizes]
    doc = {"what": WHAT, "probe": "tests/probes/memtrace.bpf.c", "ptxas": version,
           "cpus": os.cpu_count(), "python": platform.python_version(), "commit": commit,
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "modules": rows}
    Path(sys.argv[1]).write_text(json.dumps(doc, indent=1) + "\n")
    for r in rows:
        print(f"{r['kernels']} kernels ({r['instrumented']} instrumented): {r['original_s']:.2f} s -> "
              f"{r['instrumented_s']:.2f} s")


if __name__ == "__main__":
    main()
