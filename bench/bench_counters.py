"""Where the entry/exit counter's cost goes, on the suite's vecadd (16 Mi threads, 256 per block).

Usage (on the GPU machine): ``python3 bench/bench_counters.py OUT.json``. One run, same workload, five
modes: uninstrumented; entry/exit probes with an empty body (context, call and lane regrouping only);
the suite's counter (an ARRAY slot the probes only add to, so striped: a row per SM, translate/
striping.py); the same counter kept in one copy (the probe also reads it, in a branch no launch takes:
every warp's aggregated atomic lands on the same address, as before striping); the same counter in a
PERCPU_ARRAY (one slot per SM, declared so). Ratios of the median time per launch to uninstrumented,
each only when its run proves the probe ran (probe_check.check_counter: every launch's 16 Mi threads
entered and exited, the output the plain run's); a mode that does not is reported failed, with why.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import bench_jit  # noqa: E402
import probe_check  # noqa: E402
import suite  # noqa: E402

PROBES = {"empty": "bench/probes/entry_exit_empty", "array": "bench/probes/entry_exit",
          "one_copy": "bench/probes/entry_exit_one_copy", "percpu": "bench/probes/entry_exit_percpu"}
VECADD_THREADS = 1 << 24  # bench/workloads/kernels.cu: n / 256 blocks of 256


def summarize(runs: dict[str, dict]) -> dict[str, dict]:
    """Per mode its median, and its ratio to plain when its probe check passed (else why not)."""
    plain = runs["plain"]
    base = statistics.median(plain["unit_ms"]) if plain["unit_ms"] else None
    doc = {}
    for mode, r in runs.items():
        why = None if mode == "plain" else probe_check.check_counter(r, plain,
                                                                     None if mode == "empty" else VECADD_THREADS)
        median = statistics.median(r["unit_ms"]) if r["unit_ms"] else None
        row = {"status": r["status"] if why is None else "failed", "median_us_per_launch": median and median * 1e3,
               "reps": len(r["unit_ms"])}
        if mode != "plain":
            row["probe_checked"] = why is None
            if why:
                row["probe_check"] = why
        row["ratio"] = median / base if median and base and why is None else None
        doc[mode] = row
    return doc


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "bench_counters.json")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env = {**suite.base_env(work), "CUDA_MODULE_LOADING": "EAGER"}
        exe = suite.build_kernels(work)
        probes = {m: bench_jit.probe_object(src, bench_jit.prebuilt_dir(), work) for m, src in PROBES.items()}
        runs = {"plain": suite.run_case(suite.workload_cmd("vecadd", exe), env, 60)}
        for mode in PROBES:
            runs[mode] = suite.run_case(suite.case_cmd("vecadd", mode, exe, probes), env, 60)
    doc = summarize(runs)
    out.write_text(json.dumps(doc, indent=1))
    for mode, d in doc.items():
        print(f"{mode:>8}: {d['status']:>6} {d['median_us_per_launch'] or float('nan'):9.1f} us/launch "
              f"{d['ratio'] or float('nan'):6.2f}x  reps {d['reps']}  {d.get('probe_check', '')}")


if __name__ == "__main__":
    main()
