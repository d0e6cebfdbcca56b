"""One suite case run again and again, to catch a hang that comes now and then:
``python3 bench/repeat_case.py OUT.json WORKLOAD MODE [TIMES [TIMEOUT_S]]``.

Each run is the suite's own (suite.run_workload_case: its command, environment, CPUs, lane count and
timeout path; a run past TIMEOUT_S leaves every thread's Python and native stacks in its ``stderr_tail``).
OUT.json holds each run's status, wall time, units and, for a traced mode, the records delivered and
dropped (scripts/gpu-test.sh stamps it)."""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_shim  # noqa: E402
import suite  # noqa: E402

KEPT = ("status", "wall_s", "unit_ms", "error", "trace", "stderr_tail")


def main() -> None:
    if len(sys.argv) < 4:
        raise SystemExit(__doc__.splitlines()[1].strip())
    out, name, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    times = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    if name not in suite.WORKLOADS or mode not in ("plain", "torch_profiler", *suite.PROBES):
        raise SystemExit(f"repeat_case.py: no case {name} {mode}")
    timeout = float(sys.argv[5]) if len(sys.argv) > 5 else suite.case_limit(name, mode)
    suite.exit_on_term()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        env, exe, probes = suite.prepare(Path(tmp))
        cpus = bench_shim.pick_cpus(suite.CASE_CPUS)
        for i in range(times):
            rec = suite.run_workload_case(name, mode, exe, probes, env, timeout, cpus)
            runs.append({k: rec[k] for k in KEPT if k in rec})
            median = statistics.median(rec["unit_ms"]) * 1e3 if rec["unit_ms"] else float("nan")
            print(f"repeat: {name} {mode} run {i}: {rec['status']} ({rec['wall_s']:.1f} s, median {median:.1f} us/unit"
                  f"{', ' + str(rec['trace'].get('records')) + ' records' if 'trace' in rec else ''})", flush=True)
    out.write_text(json.dumps({"workload": name, "mode": mode, "timeout_s": timeout, "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
