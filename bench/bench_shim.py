"""ns added per launch by the shim: with no probe, with a launch-level probe, with --durations (CUPTI),
and what CUDA events around every launch would cost, against the same launch-bound loop without
LD_PRELOAD, all in one run.

Usage (on the GPU machine): ``python3 bench/bench_shim.py OUT.json [LAUNCHES]``.

The loop is bench/launch_loop.cu (built here with nvcc): LAUNCHES launches of an empty kernel through
cudaLaunchKernel in batches of 256 that never fill the launch queue, so "enqueue_ns" is the host's cost
per launch call (the number the shim adds to); "wall_ns" is the whole loop per launch, GPU included.
Each case runs RUNS times; the median is reported with every run. Cases:

- plain: no LD_PRELOAD.
- shim: egpu-run with no probe (the launch hook: one table lookup, counters).
- launch_probe: egpu-run -p examples/launch_count (records on: one clock read and one ring push per
  launch; the probe runs on the runtime's thread, which competes for the CPU and drops records, counted
  in the shim's stats, when it falls behind).
- durations: egpu-run --durations (CUPTI concurrent-kernel activity records).
- events: no LD_PRELOAD, the loop records a CUDA event before and after each launch (what timing
  kernels with events in the shim would add).

Goal: shim and launch_probe under 100 ns per launch above plain.
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
RUNS = 5


def build(out: Path) -> Path:
    exe = out / "launch_loop"
    subprocess.run(["nvcc", "-O2", "-arch=sm_90", "-o", str(exe), str(ROOT / "bench" / "launch_loop.cu")], check=True)
    return exe


def launch_probe(out: Path) -> Path:
    """examples/launch_count as an object: prebuilt (the GPU machine has no clang) or compiled here."""
    prebuilt = os.environ.get("EGPU_PREBUILT_PROBES")
    if prebuilt and (Path(prebuilt) / "launch_count.v3.bpf.o").is_file():
        return Path(prebuilt) / "launch_count.v3.bpf.o"
    sys.path.insert(0, str(ROOT))
    from egpu_preload.bpf.compile import compile_probe
    return compile_probe(ROOT / "examples" / "launch_count.bpf.c", out / "launch_count.bpf.o")


def run(cmd: list[str], env: dict[str, str]) -> dict:
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith('{"mode"')]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(cmd)}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return json.loads(lines[0])


def main() -> None:
    out_path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("bench_shim.json")
    launches = sys.argv[2] if len(sys.argv) > 2 else "200000"
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        exe = str(build(d))
        probe = str(launch_probe(d))
        env = {k: v for k, v in os.environ.items() if not k.startswith("EGPU_") or k == "EGPU_SHIM"}
        env.update(XDG_RUNTIME_DIR=str(d), PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
        egpu = [sys.executable, "-c", "import launcher; launcher.run_main()", "--json"]
        cases = {
            "plain": [exe, "plain", launches],
            "shim": [*egpu, exe, "plain", launches],
            "launch_probe": [*egpu, "-p", probe, exe, "plain", launches],
            "durations": [*egpu, "--durations", exe, "plain", launches],
            "events": [exe, "events", launches],
        }
        results = {}
        for name, cmd in cases.items():
            runs = [run(cmd, env) for _ in range(RUNS)]
            results[name] = {"enqueue_ns": statistics.median(r["enqueue_ns"] for r in runs),
                             "wall_ns": statistics.median(r["wall_ns"] for r in runs), "runs": runs}
            print(f"{name:>13}: enqueue {results[name]['enqueue_ns']:8.1f} ns/launch, "
                  f"wall {results[name]['wall_ns']:8.1f} ns/launch", flush=True)
    base = results["plain"]
    added = {name: {"enqueue_ns": r["enqueue_ns"] - base["enqueue_ns"], "wall_ns": r["wall_ns"] - base["wall_ns"]}
             for name, r in results.items() if name != "plain"}
    for name, a in added.items():
        print(f"{name:>13}: +{a['enqueue_ns']:.1f} ns enqueue, +{a['wall_ns']:.1f} ns wall per launch")
    doc = {"launches": int(launches), "runs": RUNS, "median": results, "added_over_plain": added,
           "goal_ns": 100, "shim_meets_goal": added["shim"]["enqueue_ns"] < 100,
           "launch_probe_meets_goal": added["launch_probe"]["enqueue_ns"] < 100}
    out_path.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
