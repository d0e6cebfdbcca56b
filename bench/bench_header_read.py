"""Whether warps waiting on a ring's header slow the host's access to it: ``python3 bench/bench_header_read.py
OUT.json [ROUNDS]`` (GPU; about 10 s).

bench/header_read.cu, built here with nvcc, times ROUNDS host reads of 36 bytes (a ring header) and 8-byte
writes (``consumed``), each on a non-blocking stream with its own synchronize, of the line the kernel's warps
poll and of a line 4 KiB away, in four modes: no kernel (idle), every warp's lane 0 polling 256 ns apart
as `--on-full wait` producers do (poll), the pause doubling to 8 us (backoff), and polls with an atom.add on
the line each time (poll_atomics). Each mode's median and 90th percentile per access, in microseconds.
The --trace reader's header phase took about 2.5 ms a pass in PyTorch eager's warp trace (2026-12-05c); a
read of the polled line that is slow only while warps poll says the producers' polling is what it waits for.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = ("idle", "poll", "backoff", "poll_atomics")
ACCESSES = ("read_line_us", "read_far_us", "write_line_us", "write_far_us")


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median": round(statistics.median(ordered), 2), "p90": ordered[int(0.9 * (len(ordered) - 1))],
            "max": ordered[-1]}


def main() -> None:
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    out, rounds = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) == 3 else 200
    with tempfile.TemporaryDirectory() as work:
        exe = Path(work) / "header_read"
        subprocess.run(["nvcc", "-O2", "-arch=sm_90", str(ROOT / "bench" / "header_read.cu"), "-o", str(exe)],
                       check=True)
        doc: dict = {"rounds": rounds, "modes": {}}
        for mode in MODES:
            try:   # a kernel that never saw the host's stop would hold the program
                r = subprocess.run([str(exe), mode, str(rounds)], capture_output=True, text=True, timeout=120)
                failed = r.stderr.strip()[-500:] if r.returncode else None
            except subprocess.TimeoutExpired:
                failed = "did not end within 120 s"
            if failed:
                doc["modes"][mode] = {"error": failed}
                print(f"header_read {mode}: {failed}")
                continue
            run = json.loads(r.stdout)
            doc["modes"][mode] = {"warps_polling": run["warps_polling"], "stop_us": run["stop_us"],
                                  **{a: summary(run[a]) for a in ACCESSES}}
            cells = "  ".join(f"{a.removesuffix('_us')} {doc['modes'][mode][a]['median']:.1f}"
                              f" (p90 {doc['modes'][mode][a]['p90']:.1f})" for a in ACCESSES)
            print(f"{mode:>12}: {cells} us")
    out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
