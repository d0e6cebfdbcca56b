"""ns a host uprobe adds to each call of a hot library function (runtime/uprobes.py, shim/uprobe.c).

Usage: ``python3 bench/bench_uprobe.py OUT.json [CALLS]``. Runs on the CPU only: the job is
tests/uprobe_app's ``app_uprobe bench CALLS`` (CALLS calls of libupt's ``int upt_inc(int)`` through the
PLT, timed inside the process in batches of 10,000: the fastest batch's ns per call, since on a shared
machine most batches also hold time the CPU gave other processes), against the stand-in driver of tests/stub_driver (the
program starts it so that egpu's runtime comes up). Cases:

- plain: no egpu-run.
- uprobe: egpu-run -p bench/probes/uprobe_count.bpf.c: an entry probe counting calls in an array map
  (the stub, the context, the C interpreter's read section, the map update).
- uprobe_uretprobe: bench/probes/uprobe_count_ret.bpf.c: a return probe too (the return-address swap and a second run).

As in bench_shim.py, the cases run round-robin RUNS times pinned to one CPU, and a case's cost is the
median of its per-round difference to plain, with the spread (min..max); the goal (< GOAL_NS per call)
is met only when the whole spread is under it (bench/paired.py). "counted" is what the probe counted in
each round (None: egpu-run printed no maps), to check that it saw every call.

"threads" repeats plain and uprobe with THREADS threads calling upt_inc at once (``app_uprobe bench_threads``,
pinned to as many CPUs as there are threads, up to the machine's): per thread, the median over the threads of
each one's fastest batch (ns_per_call), and aggregate_ns_per_call, the wall time over every thread's calls
(what a call costs the process when the threads share the CPUs). Runs on the C VM take no process-wide lock
(launchvm.c), so the uprobe's cost per thread should stay near its single-threaded cost while the threads
have a CPU each.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

import paired  # noqa: E402
from bench_shim import pick_cpus  # noqa: E402

RUNS = 11
GOAL_NS = 100.0
CASES = ("plain", "uprobe", "uprobe_uretprobe")
THREADS = (1, 2, 4)
THREAD_RUNS = 5
APP = ROOT / "tests" / "uprobe_app"
STUB = ROOT / "tests" / "stub_driver"


def build(out: Path) -> tuple[Path, dict[str, Path]]:
    """(the app, case -> probe object), the stand-in driver and libupt.so beside the app."""
    cc = ["gcc", "-O2"]
    steps = [cc + ["-shared", "-fPIC", "-Wl,-Bsymbolic", "-Wl,-soname,libcuda.so.1", str(STUB / "libcuda_stub.c"),
                   str(ROOT / "tests" / "runtime_stub" / "driver_more.c"), "-o", str(out / "libcuda.so.1")],
             cc + ["-shared", "-fPIC", str(APP / "libupt.c"), "-o", str(out / "libupt.so")],
             cc + [str(APP / "app_uprobe.c"), "-o", str(out / "app_uprobe"), f"-L{out}", "-lupt", "-l:libcuda.so.1",
                   f"-Wl,-rpath,{out}", "-ldl"]]
    for step in steps:
        subprocess.run(step, check=True)
    return out / "app_uprobe", {"uprobe": probe(out, "uprobe_count"),
                                "uprobe_uretprobe": probe(out, "uprobe_count_ret")}


def probe(out: Path, name: str) -> Path:
    """bench/probes/NAME.bpf.c as an object: prebuilt (the GPU machine has no clang) or compiled here."""
    prebuilt = os.environ.get("EGPU_PREBUILT_PROBES")
    if prebuilt and (Path(prebuilt) / f"{name}.v3.bpf.o").is_file():
        return Path(prebuilt) / f"{name}.v3.bpf.o"
    from egpu_preload.bpf.compile import compile_probe
    return compile_probe(ROOT / "bench" / "probes" / f"{name}.bpf.c", out / f"{name}.bpf.o")


def run(cmd: list[str], env: dict[str, str], cpus: set[int] | None) -> dict:
    """ns per call, and the calls the probe counted (egpu-run --json's ``calls`` map) when it ran one."""
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus is not None else None
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT, preexec_fn=pin)
    found = re.search(r" ns_per_call=([0-9.]+)", done.stdout)
    if done.returncode != 0 or not found:
        raise RuntimeError(f"{' '.join(cmd)}: exit {done.returncode}\n{done.stderr[-2000:]}")
    result: dict = {"ns_per_call": float(found.group(1))}
    aggregate = re.search(r"aggregate_ns_per_call=([0-9.]+)", done.stdout)
    if aggregate:
        result["aggregate_ns_per_call"] = float(aggregate.group(1))
    for line in done.stdout.splitlines():
        if line.startswith('{"time"'):
            calls = json.loads(line).get("maps", {}).get("calls")
            if calls:
                result["counted"] = [e["value"] for e in calls["entries"]]
    return result


def measure(work: Path, calls: int = 1_000_000, runs: int = RUNS) -> dict:
    app, probes = build(work)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EGPU_") or k == "EGPU_SHIM"}
    env.update(XDG_RUNTIME_DIR=str(work), LD_LIBRARY_PATH=str(work),
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    egpu = [sys.executable, "-c", "import launcher; launcher.run_main()", "--json"]
    n = str(calls)
    commands = {"plain": [str(app), "bench", n]}
    for case in CASES[1:]:
        commands[case] = [*egpu, "-p", str(probes[case]), str(app), "bench", n]
    cpus = pick_cpus(1)
    run(commands["uprobe"], env, cpus)  # builds the shim if it is stale, outside the timing
    rounds = [{case: run(commands[case], env, cpus) for case in CASES} for _ in range(runs)]
    doc: dict = {"calls": calls, "runs": runs, "cpus": sorted(cpus or ()), "goal_ns": GOAL_NS, "cases": {}}
    for case in CASES:
        values = [r[case]["ns_per_call"] for r in rounds]
        row: dict = {"ns_per_call": {"median": sorted(values)[len(values) // 2], "min": min(values), "runs": values}}
        if case != "plain":
            d = paired.differences([r["plain"]["ns_per_call"] for r in rounds], values)
            row.update(added_median=d["median"], added_min=d["min"], added_max=d["max"], added_runs=d["values"],
                       goal=paired.verdict({"min": d["min"], "max": d["max"], "pairs": d["pairs"]}, GOAL_NS),
                       counted=[r[case].get("counted") for r in rounds])
        doc["cases"][case] = row
    doc["threads"] = {str(n): threaded(app, probes["uprobe"], egpu, env, calls, n) for n in THREADS}
    return doc


def threaded(app: Path, probe_object: Path, egpu: list[str], env: dict[str, str], calls: int, threads: int) -> dict:
    """plain and uprobe with `threads` threads of `calls` calls each, round-robin THREAD_RUNS times: the medians
    of ns_per_call (per thread) and aggregate_ns_per_call, and the uprobe's added median of each."""
    plain = [str(app), "bench_threads", str(calls), str(threads)]
    commands = {"plain": plain, "uprobe": [*egpu, "-p", str(probe_object), *plain]}
    cpus = pick_cpus(min(threads, os.cpu_count() or 1))
    rounds = [{case: run(cmd, env, cpus) for case, cmd in commands.items()} for _ in range(THREAD_RUNS)]
    row: dict = {"cpus": sorted(cpus or ())}
    for case in commands:
        row[case] = {key: sorted(r[case][key] for r in rounds)[len(rounds) // 2]
                     for key in ("ns_per_call", "aggregate_ns_per_call")}
        row[case]["counted"] = [r[case].get("counted") for r in rounds]
    for key in ("ns_per_call", "aggregate_ns_per_call"):
        row["uprobe"][f"added_{key}"] = paired.differences([r["plain"][key] for r in rounds],
                                                           [r["uprobe"][key] for r in rounds])["median"]
    return row


def machine() -> dict[str, str]:
    """Where it ran: CPU model, cores, kernel, load (a shared CI machine is busy with other jobs)."""
    model = ""
    try:
        model = next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                     if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": model, "cores": str(os.cpu_count()), "kernel": platform.release(),
            "load_average": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main() -> None:
    out_path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("bench_uprobe.json")
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
    with tempfile.TemporaryDirectory() as tmp:
        doc = measure(Path(tmp), calls)
    doc["machine"] = machine()
    for name, row in doc["cases"].items():
        added = (f"  +{row['added_median']:6.1f} ns/call ({row['added_min']:+.1f} .. {row['added_max']:+.1f}: "
                 f"{row['goal']}), counted {row['counted']}" if name != "plain" else "")
        print(f"{name:>17}: {row['ns_per_call']['median']:7.1f} ns/call{added}")
    for n, row in doc["threads"].items():
        up = row["uprobe"]
        print(f"{n:>2} thread(s), uprobe: +{up['added_ns_per_call']:6.1f} ns/call per thread "
              f"({up['ns_per_call']:.1f}), aggregate +{up['added_aggregate_ns_per_call']:6.1f} ns/call "
              f"({up['aggregate_ns_per_call']:.1f}); counted {up['counted']}")
    out_path.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
