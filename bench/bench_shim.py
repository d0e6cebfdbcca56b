"""ns added per launch by the shim: with no probe, with a launch-level probe, with --durations (CUPTI),
and what CUDA events around every launch would cost, against the same launch-bound loop without
LD_PRELOAD, all in one run.

Usage (on the GPU machine): ``python3 bench/bench_shim.py OUT.json [LAUNCHES [CASE,...]]`` (plain always
runs; all cases take longer than 300 s); bench/suite.py calls ``measure`` with fewer cases.

The loop is bench/launch_loop.cu (built here with nvcc): LAUNCHES launches of an empty kernel through
cudaLaunchKernel in batches of 256 that never fill the launch queue, so "enqueue_ns" is the host's cost
per launch call (the number the shim adds to); "wall_ns" is the whole loop per launch, GPU included.
Cases:

- plain: no LD_PRELOAD.
- shim: egpu-run with no probe (the launch hook: one table lookup, counters).
- standby: egpu-run --live-sass with no probe: the same, with the Compute Sanitizer subscribed from cuInit
  (its launch callbacks off until a module is patched), as a job that may take SASS probes live runs.
- launch_probe: egpu-run -p examples/launch_count (records on: one clock read and one ring push per
  launch; the probe runs in C, shim/launchvm.c, on the runtime's thread, which here shares the loop's
  CPU (see below), so its work is counted against the launches, and records are dropped, counted in
  the shim's stats, when it falls behind).
- launch_probe_vm: the same with --launch-vm python: the probe on the Python VM, tens of us a record.
- durations: egpu-run --durations (CUPTI concurrent-kernel activity records).
- events: no LD_PRELOAD, the loop records a CUDA event before and after each launch (what timing
  kernels with events in the shim would add).

Noise: one process's number moves by several hundred ns between runs (CPU frequency, which core,
cache state), more than the effect measured. So the cases run round-robin (plain, shim, ..., plain,
shim, ...) RUNS times, every process pinned to one CPU (sched_setaffinity, inherited by the job), and
the cost of a case is the median over rounds of (case - plain) in the same round: drift between rounds
cancels. Its spread (min..max over rounds) is reported with it, and a case meets the goal only when
the whole spread does (bench/paired.py; RUNS >= paired.MIN_PAIRS). The median and minimum of each case
are reported too.

Pinned to one CPU, the launch probe cases measure the probe's work, not the launch path. So they run
again pinned to two CPUs ("spare_cpu": the runtime's thread can run beside the loop, as on any machine
with a core to spare), where the difference is what the launching thread pays (one clock read and one
ring push), and "seen" is the fraction of launches the probe counted: below 1 the probe fell behind
and the ring dropped records.

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
sys.path.insert(0, str(ROOT / "bench"))

import paired  # noqa: E402

RUNS = 11
CASES = ("plain", "shim", "standby", "launch_probe", "launch_probe_vm", "durations", "events")
GOAL_NS = 100.0
WARMUP = 1000  # launch_loop.cu's untimed launches
SPARE_CPU_CASES = ("plain", "launch_probe", "launch_probe_vm")


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


def pick_cpus(n: int) -> set[int] | None:
    """n CPUs of those this process may use, not the first (which tends to take interrupts)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    return set(cpus[1:n + 1]) if len(cpus) > n else set(cpus[:n])


def run(cmd: list[str], env: dict[str, str], cpus: set[int] | None) -> dict:
    """The loop's JSON line; with egpu-run --json, "seen" too: launches the launch probe counted (its
    ``launches`` map summed) over the launches made, when the job ran one."""
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus is not None else None
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT, preexec_fn=pin)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith('{"mode"')]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(cmd)}: exit {done.returncode}\n{done.stderr[-2000:]}")
    result = json.loads(lines[0])
    for ln in done.stdout.splitlines():
        counted = _launches_counted(ln)
        if counted is not None:
            result["seen"] = counted / (result["launches"] + WARMUP)
    return result


def _launches_counted(line: str) -> int | None:
    if not line.startswith('{"time"'):
        return None
    launches = json.loads(line).get("maps", {}).get("launches")
    return sum(e["value"] for e in launches["entries"]) if launches else None


def summarize(rounds: list[dict[str, dict]], metrics: tuple[str, ...] = ("enqueue_ns", "wall_ns"),
              goal_ns: float = GOAL_NS) -> dict:
    """Per case: median and min of each metric over rounds, and (not for plain) the median of the
    per-round differences to plain with their spread, and the first metric's verdict against
    ``goal_ns`` (paired.verdict: met only when every round's difference is under it)."""
    cases = list(rounds[0])
    out: dict[str, dict] = {}
    for case in cases:
        row: dict = {}
        for metric in metrics:
            values = [r[case][metric] for r in rounds]
            row[metric] = {"median": statistics.median(values), "min": min(values), "runs": values}
            if case != "plain":
                diffs = paired.differences([r["plain"][metric] for r in rounds], values)
                row[metric].update(added_median=diffs["median"], added_min=diffs["min"], added_max=diffs["max"],
                                   added_runs=diffs["values"])
        if case != "plain":
            e = row[metrics[0]]
            row["goal"] = paired.verdict({"min": e["added_min"], "max": e["added_max"], "pairs": len(rounds)}, goal_ns)
            row["meets_goal"] = row["goal"] == "met"
        out[case] = row
    return out


def measure(work: Path, launches: int = 200_000, runs: int = RUNS, cases: tuple[str, ...] = CASES) -> dict:
    exe = str(build(work))
    probe = str(launch_probe(work)) if "launch_probe" in cases else ""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EGPU_") or k == "EGPU_SHIM"}
    env.update(XDG_RUNTIME_DIR=str(work), PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    egpu = [sys.executable, "-c", "import launcher; launcher.run_main()", "--json"]
    n = str(launches)
    commands = {
        "plain": [exe, "plain", n],
        "shim": [*egpu, exe, "plain", n],
        "standby": [*egpu, "--live-sass", exe, "plain", n],
        "launch_probe": [*egpu, "-p", probe, exe, "plain", n],
        "launch_probe_vm": [*egpu, "--launch-vm", "python", "-p", probe, exe, "plain", n],
        "durations": [*egpu, "--durations", exe, "plain", n],
        "events": [exe, "events", n],
    }
    one, two = pick_cpus(1), pick_cpus(2)
    run(commands["shim"], env, one)  # builds the shim if it is stale, outside the timing
    order = ("plain", *[c for c in cases if c != "plain"])
    spare = [c for c in SPARE_CPU_CASES if c in cases] if "launch_probe" in cases else []
    rounds, spare_rounds = [], []
    for _ in range(runs):
        rounds.append({case: run(commands[case], env, one) for case in order})
        if spare:
            spare_rounds.append({case: run(commands[case], env, two) for case in spare})
    doc = {"launches": launches, "runs": runs, "cpus": sorted(one or ()), "goal_ns": GOAL_NS,
           "cases": summarize(rounds)}
    if spare:
        doc["spare_cpu"] = {"cpus": sorted(two or ()), "cases": summarize(spare_rounds)}
        for case in spare[1:]:
            seen = [r[case]["seen"] for r in spare_rounds if "seen" in r[case]]
            doc["spare_cpu"][f"{case}_seen"] = min(seen) if seen else None
    return doc


def main() -> None:
    out_path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("bench_shim.json")
    launches = int(sys.argv[2]) if len(sys.argv) > 2 else 200_000
    cases = tuple(sys.argv[3].split(",")) if len(sys.argv) > 3 else CASES
    unknown = set(cases) - set(CASES)
    if unknown:
        raise SystemExit(f"bench_shim.py: no case {', '.join(sorted(unknown))} (cases: {', '.join(CASES)})")
    with tempfile.TemporaryDirectory() as tmp:
        doc = measure(Path(tmp), launches, cases=cases)
    for title, cases in (("one CPU", doc["cases"]), ("two CPUs", doc.get("spare_cpu", {}).get("cases", {}))):
        for name, row in cases.items():
            e, w = row["enqueue_ns"], row["wall_ns"]
            added = (f"   +{e['added_median']:7.1f} ns enqueue ({e['added_min']:+.1f} .. {e['added_max']:+.1f}: "
                     f"{row['goal']}), +{w['added_median']:7.1f} ns wall" if name != "plain" else "")
            print(f"{title:>8} {name:>15}: enqueue {e['median']:8.1f} (min {e['min']:8.1f}) ns/launch, "
                  f"wall {w['median']:8.1f}{added}")
    for case in SPARE_CPU_CASES[1:]:
        if f"{case}_seen" in doc.get("spare_cpu", {}):
            print(f"{case} saw {doc['spare_cpu'][f'{case}_seen']} of the launches on two CPUs")
    out_path.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
