"""Where the SASS back end's patch cost goes: ``python3 bench/bench_sass_sweep.py OUT.json`` on the GPU
machine (nvcc, the probes prebuilt by scripts/gpu-prep.sh). About a minute.

bench_sass found an entry/exit patch that returns at once adding 1.28 ms to a 65,536-block vecadd launch and
2.5 us to a one-block one, all of it in the kernel, none in the launch call (BENCH_SPLIT, 2026-12-04c). This
runs bench/workloads/grid_sweep.cu plain, under bench/empty_patch (a sanitizer tool of its own patching
block enter and exit with functions that return at once, egpu nowhere: what the patching mechanism costs
by itself) and under egpu with entry_exit_empty (empty programs in every kernel, each launch given its
record: egpu's floor), at 1 to 64 blocks per SM and 32, 256 and 1024 threads a block. How the added time
grows with blocks per SM and threads a block places the cost: per launch, per block, per warp or per
thread. The egpu row must show launches given records, the tool a module patched, else it is left out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import bench_sass  # noqa: E402
import empty_patch  # noqa: E402
import results  # noqa: E402
import suite  # noqa: E402

EMPTY, EGPU = "sanitizer_empty", "entry_exit_empty"


def parse(stdout: str) -> dict[str, Any]:
    """grid_sweep's lines: {"us": {"threads/blocks": us}, "attr": [regs, local bytes, blocks per SM]}, and
    the modules bench/empty_patch patched when it was injected."""
    out: dict[str, Any] = {"us": {}, "attr": None, "done": False,
                           "tool_patched": results.parse_output(stdout)["tool_patched"]}
    for line in stdout.splitlines():
        key, *values = line.split()
        if key == "SWEEP" and len(values) == 3:
            out["us"][f"{values[0]}/{values[1]}"] = float(values[2])
        elif key == "ATTR" and len(values) == 3:
            out["attr"] = [int(v) for v in values]
        elif key == "SWEEP_DONE":
            out["done"] = True
    return out


def added(plain: dict[str, float], floor: dict[str, float]) -> dict[str, dict[str, float]]:
    """Per shape: the time the floor adds, and that over the blocks launched (ns a block)."""
    out = {}
    for shape, us in floor.items():
        if shape in plain:
            blocks = int(shape.split("/")[1])
            out[shape] = {"added_us": round(us - plain[shape], 2),
                          "ns_per_block": round((us - plain[shape]) * 1e3 / blocks, 2)}
    return out


def main() -> None:
    suite.exit_on_term()
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    probes = Path(os.environ.get("EGPU_PREBUILT_PROBES", ROOT / ".gpubuild" / "probes"))
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "grid_sweep"
        subprocess.run(["nvcc", "-O2", "-gencode", "arch=compute_90,code=[sm_90,compute_90]",
                        str(ROOT / "bench/workloads/grid_sweep.cu"), "-o", str(exe)], check=True)
        env = suite.base_env(Path(tmp))
        runs: dict[str, list[str]] = {"plain": [str(exe)]}
        envs: dict[str, dict[str, str]] = {}
        tool = bench_sass.build_tool(Path(tmp))
        if isinstance(tool, str):
            result[EMPTY] = {"check": tool}
        else:
            envs[EMPTY] = {**env, **empty_patch.env(tool, bench_sass.ENTER_EXIT)}
            runs[EMPTY] = [str(exe)]
        runs[EGPU] = [*suite.egpu_run(), "--keep", "--backend", "sass", "-p", str(probes / f"{EGPU}.v3.bpf.o"),
                      str(exe)]
        for name, cmd in runs.items():
            done, wall_s, timed_out = suite.run_session(cmd, envs.get(name, env), 120)
            rec = {"status": "timeout" if timed_out else "ok" if done.returncode == 0 else "failed",
                   "wall_s": wall_s, **parse(done.stdout)}
            m = suite.SESSION_RE.search(done.stderr)
            if m:
                rec.update(suite.dump_facts(Path(m.group(1))))
            if name != "plain":
                rec["check"] = (f"run: {rec['status']} ({done.stderr.strip()[-300:]})"
                                if rec["status"] != "ok" or not rec["done"] else
                                bench_sass.check_empty_patch(rec) if name == EMPTY else
                                bench_sass.check_sass(bench_sass.Row(name, "vecadd", "sass", (name,)), rec))
            result[name] = rec
    if result["plain"]["status"] != "ok" or not result["plain"]["done"]:
        raise SystemExit(f"bench_sass_sweep: the plain run {result['plain']['status']}: nothing to compare with")
    plain = result["plain"]["us"]
    table = {f: added(plain, result[f]["us"]) for f in (EMPTY, EGPU) if result[f].get("check") is None}
    for floor, rows in table.items():
        print(f"## {floor} (attr plain {result['plain']['attr']}, here {result[floor]['attr']})")
        for shape, a in rows.items():
            print(f"{shape:>12} threads/blocks  plain {plain[shape]:9.2f} us  +{a['added_us']:9.2f} us  "
                  f"{a['ns_per_block']:8.2f} ns/block")
    for f in (EMPTY, EGPU):
        if result[f].get("check"):
            print(f"{f}: left out: {result[f]['check']}")
    Path(sys.argv[1]).write_text(json.dumps({"added": table, "raw": result}, indent=1, default=str))


if __name__ == "__main__":
    main()
