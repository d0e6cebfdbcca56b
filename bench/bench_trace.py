"""What a full memory trace costs and how fast egpu-run --trace drains it (issue 19, item 4).

Usage: ``python3 bench/bench_trace.py OUT.json [THREADS...]`` (default SIZES). One launch of
tests/e2e/vecadd.cu at N threads (3 global accesses each), under ``egpu-run`` with no probe and under
``egpu-run --trace F -p access_trace`` (an 80-byte ring record per access, ``--on-full wait``: none may be dropped), F
an Arrow IPC file and a Parquet file in turn (the writer's two forms, output/tracefile.py), for growing N until
DEADLINE_S. The drain's rate is the records' bytes over the time the traced run took beyond the untraced one (start-up,
the JIT and the kernel's own time are in both). Beside it, the host link's limit: a pinned device-to-host
copy of 1 GiB (torch), the fastest of three. Probes prebuilt by scripts/gpu-prep.sh."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import suite  # noqa: E402

RECORD_BYTES = 80   # examples/access_trace.bpf.c's 72-byte struct behind the ring's 8-byte header
DEADLINE_S = 120.0
FORMATS = (".arrow", ".parquet")   # the trace file's suffix picks its form
SIZES = (1 << 20, 1 << 22, 1 << 24)
DELIVERED = re.compile(r"^egpu-run: ([\d,]+) records? in \S+?(, none dropped)?(?:[,;].*)?$", re.M)


PACE = re.compile(r"drained in ([\d,]+) passes, ([\d,.]+) MB copied(?: \(([\d,.]+) MB of records taken, "
                  r"(?:([\d,.]+) MB of them unwalked, )?([\d,.]+) MB past a record not yet complete\))?; reader: "
                  r"(.*?)(?:; spool writes ([\d.]+) s(?: into (\d+) files)?)?; writer ([\d.]+) s$", re.M)
PHASE = re.compile(r"([a-z][a-z ]*) ([\d.]+) s(?: \(([\d.]+) s in the driver\))?$")


def pace(stderr: str) -> dict | None:
    """Where the drain's time went, from egpu-run's line under the trace line (streaming.pace_line)."""
    m = PACE.search(stderr)
    if m is None:
        return None
    spent = {}
    for part in m.group(6).split(", "):   # "header 2.31 s (0.02 s in the driver)", "scan 4.30 s"
        phase = PHASE.match(part)
        if phase:
            name = phase.group(1).replace(" ", "_")
            spent[f"{name}_s"] = float(phase.group(2))
            if phase.group(3) is not None:
                spent[f"{name}_driver_s"] = float(phase.group(3))
    spooled = {"spool_write_s": float(m.group(7))} if m.group(7) is not None else {}
    if m.group(8) is not None:   # since the spool had several files (one: not printed)
        spooled["spool_files"] = int(m.group(8))
    mb = {f"{what}_mb": float(m.group(g).replace(",", ""))
          for what, g in (("copied", 2), ("taken", 3), ("whole", 4), ("unwalked", 5))
          if m.group(g) is not None}   # taken, unwalked: since they were printed; whole: since passes took it
    return {"passes": int(m.group(1).replace(",", "")), **mb, **spent, **spooled, "write_s": float(m.group(9))}


def delivered(stderr: str) -> tuple[int | None, bool]:
    """(records written, whether none was dropped) from egpu-run's line about the trace file."""
    m = DELIVERED.search(stderr)
    return (int(m.group(1).replace(",", "")), m.group(2) is not None) if m else (None, False)


def timed(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[float, subprocess.CompletedProcess[str] | None]:
    """(wall time, what ``cmd`` did; None past ``timeout``): suite.run_session."""
    done, wall_s, timed_out = suite.run_session(cmd, env, timeout)
    return wall_s, None if timed_out else done


def vecadd_line(stdout: str) -> list[str]:
    """vecadd's own line (wrong elements and the checksum), whatever egpu-run printed around it."""
    return [line for line in stdout.splitlines() if line.startswith("vecadd ")]


def one_size(exe: Path, probe: Path, trace: Path, threads: int, env: dict[str, str], timeout: float) -> dict:
    """One launch at ``threads`` threads untraced and traced: what was delivered, in how long."""
    base_s, base = timed([*suite.egpu_run(), str(exe), "1", str(threads)], env, timeout)
    trace_s, traced = timed([*suite.egpu_run(), "--trace", str(trace), "-p", str(probe), str(exe), "1",
                             str(threads)], env, timeout)
    run: dict = {"threads": threads, "format": trace.suffix.lstrip("."), "records_expected": 3 * threads,
                 "untraced_s": round(base_s, 3), "traced_s": round(trace_s, 3)}
    if base is None or traced is None:
        return {**run, "error": f"{'untraced' if base is None else 'traced'} run past {timeout:.0f} s"}
    records, none_dropped = delivered(traced.stderr)
    run.update(records_delivered=records, none_dropped=none_dropped,
               same_output=traced.returncode == 0 and vecadd_line(base.stdout) == vecadd_line(traced.stdout) != [],
               file_bytes=trace.stat().st_size if trace.exists() else None, drain_pace=pace(traced.stderr))
    if records and trace_s > base_s:
        run["drain_gbps"] = round(records * RECORD_BYTES / (trace_s - base_s) / 1e9, 3)
    if records is None:
        run["stderr_tail"] = traced.stderr[-2000:]
    trace.unlink(missing_ok=True)
    return run


def link_gbps() -> float | None:
    """A pinned device-to-host copy of 1 GiB, the fastest of three (torch), its memory given back."""
    try:
        import torch
    except ImportError:
        return None
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    best = float("inf")
    for _ in range(3):
        torch.cuda.synchronize()
        t = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    del src, dst
    torch.cuda.empty_cache()
    return (1 << 30) / best / 1e9


def main() -> None:
    if len(sys.argv) < 2 or not all(a.isdigit() for a in sys.argv[2:]):
        raise SystemExit(__doc__)
    suite.exit_on_term()
    out_path, sizes = Path(sys.argv[1]), tuple(int(a) for a in sys.argv[2:]) or SIZES
    probe = Path(os.environ.get("EGPU_PREBUILT_PROBES", ROOT / ".gpubuild" / "probes")) / "access_trace.v3.bpf.o"
    if not probe.exists():
        raise SystemExit(f"bench_trace: no prebuilt {probe} (run scripts/gpu-prep.sh)")
    doc: dict = {"record_bytes": RECORD_BYTES, "runs": []}
    deadline = time.monotonic() + DEADLINE_S
    with tempfile.TemporaryDirectory() as tmp:
        env = suite.base_env(Path(tmp))
        exe = Path(tmp) / "vecadd"
        subprocess.run(["nvcc", "-O2", "-arch=sm_90", str(ROOT / "tests" / "e2e" / "vecadd.cu"), "-o", str(exe)],
                       check=True)
        for n, suffix in ((n, f) for n in sizes for f in FORMATS):
            left = deadline - time.monotonic()
            if left < 5:
                break
            run = one_size(exe, probe, Path(tmp) / f"trace{suffix}", n, env, left / 2)
            doc["runs"].append(run)
            print(json.dumps(run), flush=True)
            out_path.write_text(json.dumps(doc, indent=1))
    doc["link_dtoh_pinned_gbps"] = link_gbps()   # after the runs: none of them beside torch's context
    print(f"link (pinned dtoh): {doc['link_dtoh_pinned_gbps']} GB/s")
    out_path.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
