"""ns per thread of a probe call, against the same kernel without it, measured in one run.

Usage (on the GPU machine): ``python3 bench/bench_translate.py OUT.json [THREADS]``.

Each case launches THREADS threads of the probe runner kernel (module.probe_runner_ptx: every thread
copies a struct egpu_ctx into local memory and calls the probe once); the baseline is the same kernel
with no call. Times are the best of REPS launches after one warm-up (wall clock around launch +
synchronize). Cases: an empty probe, a counter (ARRAY, constant key, warp-aggregated atomic add), a
hash-map update (4096 keys, BPF_ANY) and a ring-buffer event (16 bytes into a ring that holds one
launch's events; maps are reset between launches, outside the timing; deliveries and drops reported);
the probes are tests/translate_support.py's, which test_translate.py assembles.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from egpu_preload.bpf import program as prog  # noqa: E402
from egpu_preload.translate.execute import ProbeLaunch  # noqa: E402
from translate_support import bench_probes, probe_object  # noqa: E402

REPS = 10


def _launch(asm: str, maps: list[prog.MapDef], calls: int = 1) -> ProbeLaunch:
    obj, p = probe_object(asm, maps, "bench.bpf.o")
    return ProbeLaunch(obj, p, calls=calls)


def best_seconds(run: ProbeLaunch, threads: int) -> float:
    """Best of REPS timed launches after a warm-up; maps reset before each (not timed)."""
    run.launch(threads)  # warm-up: first-launch costs, caches
    best = float("inf")
    for _ in range(REPS):
        run.reset_maps()
        t0 = time.perf_counter()
        run.launch(threads)
        best = min(best, time.perf_counter() - t0)
    return best


def main(out: Path, threads: int) -> dict:
    ring_bytes = 1 << (24 * threads - 1).bit_length()  # one launch's 24-byte records fit: none dropped
    cases = bench_probes(ring_bytes)
    base_run = _launch(*cases["empty"], calls=0)
    try:
        base = best_seconds(base_run, threads)
    finally:
        base_run.close()
    results = {}
    for name, (asm, maps) in cases.items():
        run = _launch(asm, maps)
        try:
            t = best_seconds(run, threads)
            state = run.read_back()
        finally:
            run.close()
        row = {"seconds": t, "ns_per_thread": t / threads * 1e9,
               "ns_added_per_thread": (t - base) / threads * 1e9, "ratio": t / base}
        if maps and maps[0].type == prog.MAP_RINGBUF:
            row["delivered"] = len(state[0].records)
            row["dropped"] = state[0].drops
        if maps and maps[0].type == prog.MAP_ARRAY:
            row["count"] = int.from_bytes(state[0].values[0], "little")
            row["expected_count"] = threads  # the last launch's, after a reset
        results[name] = row
    report = {"threads": threads, "reps": REPS, "baseline_seconds": base,
              "baseline_ns_per_thread": base / threads * 1e9, "cases": results}
    out.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: bench_translate.py OUT.json [THREADS]")
    print(json.dumps(main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 22), indent=2))
