"""The SASS back end's cost next to the PTX back end's, against no instrumentation, in one run.

Usage (on the GPU machine): ``python3 bench/bench_sass.py OUT.json [PROBE.bpf.o]`` (default: the
kernel-entry counter tests/probes/count.bpf.c, prebuilt by scripts/gpu-prep.sh).

- nvcc kernels: the suite's vecadd (bench/workloads/kernels.cu, 16 Mi threads, PTX and sm_90 SASS, so
  both back ends can serve it): plain, ``egpu-run --backend ptx`` (PTX rewritten) and ``--backend sass``
  (SASS patched), each timed inside its process by the suite's protocol (warm-up, calibration,
  repetitions of about 100 ms; median per launch), so start-up and JIT stay out. (Until 2026-12-01 this
  differenced whole-process times at 20 and 220 launches, which process noise drove negative.)
- PyTorch: one eager training step (matmul, conv, MLP forward, backward and SGD) timed in the process
  (median of STEPS after a warm-up): plain, ``--backend ptx`` (the shim only: PyTorch ships no PTX) and
  ``--backend sass`` (every kernel patched, the probe in each); with the shim, the launches and the
  shim's calls into Python per timed step too (``torch_shim_per_step``). A job with no probe at all is
  bench_torch_shim.py's, in pinned rounds: one unpinned process per mode cannot resolve it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import suite  # noqa: E402

STEPS = 50
BACKENDS = ("plain", "ptx", "sass")

TORCH_STEP = r"""
import os, statistics, time
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch, torch.nn.functional as F
dev = "cuda"
g = torch.Generator(device="cpu").manual_seed(0)
A, B = torch.randn(512, 512, generator=g).to(dev), torch.randn(512, 512, generator=g).to(dev)
img, w = torch.randn(8, 16, 64, 64, generator=g).to(dev), torch.randn(32, 16, 3, 3, generator=g).to(dev)
mlp = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(dev)
inp, tgt = torch.randn(64, 256, generator=g).to(dev), torch.randint(0, 10, (64,), generator=g).to(dev)
opt = torch.optim.SGD(mlp.parameters(), lr=0.1)
def step():
    C = A @ B
    o = F.conv2d(img, w, padding=1)
    loss = F.cross_entropy(mlp(inp), tgt) + C.mean() * 0 + o.mean() * 0
    opt.zero_grad(); loss.backward(); opt.step()
    torch.cuda.synchronize()
def shim_counts():  # (launches, Python calls) so far; None without the shim
    import ctypes
    stats = getattr(ctypes.CDLL(None), "egpu_shim_stats", None)
    if stats is None:
        return None
    s = (ctypes.c_ulonglong * 6)()
    stats(s)
    return s[0], s[5]
for _ in range(5):
    step()
before = shim_counts()
times = []
for _ in range(STEPS):
    t = time.perf_counter(); step(); times.append(time.perf_counter() - t)
print(f"STEP_US {statistics.median(times) * 1e6:.1f}")
if before:
    after = shim_counts()
    print(f"SHIM_PER_STEP {(after[0] - before[0]) / STEPS:.1f} {(after[1] - before[1]) / STEPS:.2f}")
"""


def command(backend: str, probe: Path, cmd: list[str]) -> list[str]:
    return cmd if backend == "plain" else suite.egpu_run() + ["--backend", backend, "-p", str(probe), *cmd]


def vecadd_us(exe: Path, backend: str, probe: Path, env: dict[str, str]) -> tuple[float, str | None]:
    """(median µs per launch, the output's digest) of the suite's vecadd under ``backend``."""
    rec = suite.run_case(command(backend, probe, suite.workload_cmd("vecadd", exe)), env, suite.TIMEOUT_S["cuda"])
    if rec["status"] != "ok":
        raise SystemExit(f"vecadd ({backend}): {rec['status']}: {rec.get('error', '')}")
    return statistics.median(rec["unit_ms"]) * 1e3, rec["digest"]


def torch_step(backend: str, probe: Path, env: dict[str, str], script: Path) -> tuple[float, list[float]]:
    """(median µs per step, [launches, calls into Python] per timed step; empty without the shim)."""
    cmd = command(backend, probe, [sys.executable, str(script)])
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    found = {ln.split()[0]: [float(x) for x in ln.split()[1:]] for ln in out.stdout.splitlines()
             if ln.startswith(("STEP_US", "SHIM_PER_STEP"))}
    if out.returncode or "STEP_US" not in found:
        raise SystemExit(f"torch step ({backend}): exit {out.returncode}\n{out.stderr[-2000:]}")
    return found["STEP_US"][0], found.get("SHIM_PER_STEP", [])


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    out_path = Path(sys.argv[1])
    prebuilt = Path(os.environ.get("EGPU_PREBUILT_PROBES", ROOT / ".gpubuild" / "probes"))
    probe = Path(sys.argv[2]) if len(sys.argv) > 2 else prebuilt / "count.v3.bpf.o"
    result: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        env = suite.base_env(Path(tmp))
        exe = suite.build_kernels(Path(tmp))
        runs = {b: vecadd_us(exe, b, probe, env) for b in BACKENDS}
        if len({digest for _, digest in runs.values()}) != 1:
            raise SystemExit(f"vecadd: the back ends' outputs differ: {runs}")
        result["vecadd_us_per_launch"] = {b: us for b, (us, _) in runs.items()}
        script = Path(tmp) / "step.py"
        script.write_text(TORCH_STEP.replace("STEPS", str(STEPS)))
        if subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available()"],
                          capture_output=True).returncode == 0:
            steps = {b: torch_step(b, probe, env, script) for b in BACKENDS}
            result["torch_step_us"] = {b: us for b, (us, _) in steps.items()}
            # what the shim's hooks did per step: a call into Python per launch would be the cost
            result["torch_shim_per_step"] = {b: dict(zip(("launches", "python_calls"), per))
                                             for b, (_, per) in steps.items() if per}
    for case in ("vecadd_us_per_launch", "torch_step_us"):
        if case not in result:
            continue
        times = result[case]
        times.update({f"{b}_ratio": round(times[b] / times["plain"], 3) for b in BACKENDS if b != "plain"})
        print(f"{case:24s} " + "  ".join(f"{b} {times[b]:10.1f}" for b in BACKENDS)
              + f"   ptx x{times['ptx_ratio']}  sass x{times['sass_ratio']}")
    out_path.write_text(json.dumps({"probe": str(probe), "vecadd_threads": 1 << 24, **result}, indent=1))


if __name__ == "__main__":
    main()
