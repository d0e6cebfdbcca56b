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

A probed case's ratio counts only when its run proves the probe ran (bench/probe_check.py): vecadd,
entries == launches x 16 Mi threads and the plain output; PyTorch under --backend sass, entries == the
threads launched, as a second process with bench/probes/launch_threads beside the probe counts them
(its per-launch cost stays out of the timed one). PyTorch ships no PTX, so under --backend ptx no
kernel has the probe: that case is reported as the shim's cost, not a probe's ("ptx_probe_check").
Otherwise the ratio is left out and the reason is given.
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

import probe_check  # noqa: E402
import suite  # noqa: E402

STEPS = 50
VECADD_THREADS = 1 << 24
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


def command(backend: str, probe: Path, cmd: list[str], witness: Path | None = None) -> list[str]:
    if backend == "plain":
        return cmd
    probes = [a for p in [probe, *([witness] if witness else [])] for a in ("-p", str(p))]
    return suite.egpu_run() + ["--keep", "--backend", backend, *probes, *cmd]


def vecadd_run(exe: Path, backend: str, probe: Path, env: dict[str, str]) -> dict:
    """The suite's record of vecadd under ``backend`` (counts from the dump when probed)."""
    rec = suite.run_case(command(backend, probe, suite.workload_cmd("vecadd", exe)), env, suite.TIMEOUT_S["cuda"])
    if rec["status"] != "ok":
        raise SystemExit(f"vecadd ({backend}): {rec['status']}: {rec.get('error', '')}")
    return rec


def torch_step(backend: str, probe: Path, env: dict[str, str], script: Path, witness: Path | None = None) -> dict:
    """{"us": median µs per step, "per_step": [launches, calls into Python] per timed step (empty
    without the shim), "counts": the probes' arrays from the dump (probe_check.counts_from_dumps)}."""
    cmd = command(backend, probe, [sys.executable, str(script)], witness)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    found = {ln.split()[0]: [float(x) for x in ln.split()[1:]] for ln in out.stdout.splitlines()
             if ln.startswith(("STEP_US", "SHIM_PER_STEP"))}
    if out.returncode or "STEP_US" not in found:
        raise SystemExit(f"torch step ({backend}): exit {out.returncode}\n{out.stderr[-2000:]}")
    session = suite.SESSION_RE.search(out.stderr)
    facts = suite.dump_facts(Path(session.group(1))) if session else {}
    if session:
        suite.shutil.rmtree(session.group(1), ignore_errors=True)
    return {"us": found["STEP_US"][0], "per_step": found.get("SHIM_PER_STEP", []), "counts": facts.get("counts"),
            "shim_stats": facts.get("shim_stats")}


def torch_sass_check(step: dict, witness: dict) -> str | None:
    """Why the sass back end's torch step does not prove its probe (an entry counter) ran in every
    launched thread, from the witness process's counts; None when it does."""
    timed = (step.get("counts") or [[None]])[0][0]
    if not timed or not timed[0]:
        return "run: the probe never ran (0 entries)"
    counts = witness.get("counts") or []
    if len(counts) < 2 or not counts[0][0] or not counts[1][0]:
        return "witness run: no counts in the exit dump"
    if (witness.get("shim_stats") or {}).get("dropped"):
        return f"witness run: {witness['shim_stats']['dropped']:,} launch records dropped"
    entries, (threads, launches) = counts[0][0][0], counts[1][0][:2]
    if entries != threads:
        return f"witness run: {entries:,} entries for {threads:,} launched threads ({launches:,} launches)"
    return None


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    out_path = Path(sys.argv[1])
    prebuilt = Path(os.environ.get("EGPU_PREBUILT_PROBES", ROOT / ".gpubuild" / "probes"))
    probe = Path(sys.argv[2]) if len(sys.argv) > 2 else prebuilt / "count.v3.bpf.o"
    result: dict[str, dict] = {}
    witness = prebuilt / "launch_threads.v3.bpf.o"
    result: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        env = suite.base_env(Path(tmp))
        exe = suite.build_kernels(Path(tmp))
        runs = {b: vecadd_run(exe, b, probe, env) for b in BACKENDS}
        checks = {b: probe_check.check_counter(runs[b], runs["plain"], VECADD_THREADS) for b in BACKENDS[1:]}
        result["vecadd_us_per_launch"] = {b: statistics.median(r["unit_ms"]) * 1e3 for b, r in runs.items()}
        result["vecadd_probe_check"] = checks
        script = Path(tmp) / "step.py"
        script.write_text(TORCH_STEP.replace("STEPS", str(STEPS)))
        if subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available()"],
                          capture_output=True).returncode == 0:
            steps = {b: torch_step(b, probe, env, script) for b in BACKENDS}
            result["torch_step_us"] = {b: st["us"] for b, st in steps.items()}
            result["torch_probe_check"] = {
                "ptx": "no kernel has the probe (PyTorch ships no PTX): the shim's cost, not a probe's",
                "sass": torch_sass_check(steps["sass"], torch_step("sass", probe, env, script, witness))}
            # what the shim's hooks did per step: a call into Python per launch would be the cost
            result["torch_shim_per_step"] = {b: dict(zip(("launches", "python_calls"), st["per_step"]))
                                             for b, st in steps.items() if st["per_step"]}
    for case, check in (("vecadd_us_per_launch", "vecadd_probe_check"), ("torch_step_us", "torch_probe_check")):
        if case not in result:
            continue
        times = result[case]
        times.update({f"{b}_ratio": round(times[b] / times["plain"], 3) for b in BACKENDS[1:]
                      if result[check][b] is None})
        print(f"{case:24s} " + "  ".join(f"{b} {times[b]:10.1f}" for b in BACKENDS)
              + "   " + "  ".join(f"{b} x{times[f'{b}_ratio']}" if f"{b}_ratio" in times else f"{b}: {result[check][b]}"
                                  for b in BACKENDS[1:]))
    out_path.write_text(json.dumps({"probe": str(probe), "vecadd_threads": VECADD_THREADS, **result}, indent=1))


if __name__ == "__main__":
    main()
