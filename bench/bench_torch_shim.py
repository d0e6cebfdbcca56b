"""What a job started with no probe (for a later ``egpu attach``) costs a host-bound PyTorch step.

Usage (on the GPU machine): ``python3 bench/bench_torch_shim.py OUT.json [ROUNDS [MODES]]`` (default
paired.MIN_PAIRS, 10, and plain,shim,standby: about 6 minutes; MODES comma-separated, plain among them).

The suite's torch_eager workload (bench/workloads/frameworks.py: a CNN training step of ~1.5 ms, 29
launches, SASS-only kernels), timed inside each process by the suite's protocol, in rounds of three
processes on the suite's pinned CPUs, each round's order turned by one from the round before: plain,
``egpu-run`` with no probe (the default: no sanitizer until a probe needs one) and ``egpu-run --live-sass``
(the Compute Sanitizer subscribed from cuInit in standby, so that a probe attached later can patch SASS-only
kernels); ``plain_again``, a second plain process each round, is the control: its ratios are what a change
that costs nothing gets, the floor any other mode's spread is read against. ``sanitizer_none``,
``sanitizer_resource`` and ``sanitizer_loads`` take egpu out and inject bench/empty_patch subscribed alone (no
callback, the whole resource domain, the module load and unload callbacks standby asks for), patching nothing:
what the subscription itself costs, apart from what egpu adds to it. Processes of one program vary by
10-20% here, so the ratios are per round (each against the plain run of its round), all kept, summarized
as their median and spread (bench/paired.py); a lost process loses its round's pair, not the run.

Beside the time, each process counts the user-space instructions its threads retire per step
(workloads/instructions.py), paired the same way: a measure the core, clock and neighbours do not move,
so a standby cost too small for the time's spread shows there. Where the machine gives no instruction
counter (a VM without a virtual PMU, as the H200's) its threads' CPU time (task_clock) is counted instead,
which scheduling and waits do not move, though the clock does; "counted" names the event.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import empty_patch  # noqa: E402
import paired  # noqa: E402
import suite  # noqa: E402


def summarize(per_step: dict[str, list[float | None]]) -> dict[str, dict]:
    """Per mode other than plain: the per-round ratios to plain, their median and spread."""
    plain = per_step["plain"]
    return {m: paired.ratios(plain, ts) for m, ts in per_step.items() if m != "plain"}


def median_or_none(values: list[float] | None) -> float | None:
    return round(statistics.median(values), 1) if values else None


def rotated(modes: dict[str, list[str]], i: int) -> list[tuple[str, list[str]]]:
    """Round ``i``'s order: the modes turned by i, so that each runs first, second, ... as often as the others
    (with plain always first, the control ran second in every round of 2026-12-06c and measured 1.061x: a place in
    the round that costs or gains must not read as a mode's cost)."""
    order = list(modes.items())
    return order[i % len(order):] + order[:i % len(order)]


SUBSCRIBED = {"sanitizer_none": "none", "sanitizer_resource": "resource", "sanitizer_loads": "loads"}


def subscribed_alone(step: list[str], names: list[str], work: Path) -> dict[str, list[str]]:
    """The step under bench/empty_patch subscribed as each of ``names`` says (those of them in SUBSCRIBED)."""
    wanted = [n for n in names if n in SUBSCRIBED]
    if not wanted:
        return {}
    tool, _ = empty_patch.build(work)
    return {n: ["env", f"CUDA_INJECTION64_PATH={tool}", f"EMPTY_PATCH_SUBSCRIBE={SUBSCRIBED[n]}", *step]
            for n in wanted}


def tool_unproven(mode: str, rec: dict) -> str | None:
    """Why a subscribed-alone run does not show the tool subscribed as asked (None: it does)."""
    if mode not in SUBSCRIBED:
        return None
    if rec.get("tool_patched") != 0 or rec.get("tool_seen") is None:
        return "the subscribing tool was not injected, or patched a module"
    if (rec["tool_seen"] > 0) != (mode != "sanitizer_none"):
        return f"the tool was called back for {rec['tool_seen']} module loads"
    return None


def main() -> None:
    suite.exit_on_term()
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    out_path, rounds = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else paired.MIN_PAIRS
    step = [*suite.workload_cmd("torch_eager", Path()), "--count", "instructions,task_clock"]
    run = [*suite.egpu_run(), "--keep"]   # kept sessions: run_case reads the shim's counters from the dumps
    known = {"plain": step, "plain_again": step, "shim": [*run, *step], "standby": [*run, "--live-sass", *step],
             **dict.fromkeys(SUBSCRIBED)}
    names = sys.argv[3].split(",") if len(sys.argv) > 3 else ["plain", "shim", "standby"]
    if "plain" not in names or not set(names) <= known.keys():
        raise SystemExit(f"bench_torch_shim: MODES are {', '.join(known)}, plain among them: not {sys.argv[3]}")
    with tempfile.TemporaryDirectory() as tmp:
        known |= subscribed_alone(step, names, Path(tmp))
        modes = {m: known[m] for m in ["plain", *(n for n in names if n != "plain")]}
        env = suite.base_env(Path(tmp))
        cpus = suite.bench_shim.pick_cpus(suite.CASE_CPUS)
        suite.subprocess.run([*suite.egpu_run(), "true"], env=env, cwd=ROOT, capture_output=True)  # the shim, built
        doc: dict = {"cpus": sorted(cpus or ()), "fixed_layout": suite.FIXED_LAYOUT,
                     "us_per_step": {m: [] for m in modes}, "counted": [], "counted_per_step": {m: [] for m in modes},
                     "shim_stats": {}, "errors": [], "ratios": {}, "counted_ratios": {}}
        for i in range(rounds):
            for mode, cmd in rotated(modes, i):
                rec = suite.run_case(cmd, env, suite.TIMEOUT_S["python"], cpus)
                unproven = tool_unproven(mode, rec) if rec["status"] == "ok" else None
                if unproven:
                    rec |= {"status": "unproven", "error": unproven}
                ok = rec["status"] == "ok" and rec["unit_ms"]
                doc["us_per_step"][mode].append(round(statistics.median(rec["unit_ms"]) * 1e3, 1) if ok else None)
                doc["counted_per_step"][mode].append(median_or_none(rec.get("count_per_unit")) if ok else None)
                if rec.get("count_event") and rec["count_event"] not in doc["counted"]:
                    doc["counted"].append(rec["count_event"])   # one event in every process, or pairs mean nothing
                if rec.get("count_error"):
                    doc["count_unavailable"] = rec["count_error"]
                if not ok:
                    doc["errors"].append(f"round {i} {mode}: {rec['status']}: {rec.get('error', '')}")
                doc["shim_stats"].setdefault(mode, rec.get("shim_stats"))
                print(f"round {i} {mode:>8}: {doc['us_per_step'][mode][-1]} us/step, "
                      f"{doc['counted_per_step'][mode][-1]} {rec.get('count_event', 'nothing counted')}/step",
                      flush=True)
            doc["ratios"] = summarize(doc["us_per_step"])   # written each round: a call cut short keeps them
            doc["counted_ratios"] = summarize(doc["counted_per_step"]) if len(doc["counted"]) <= 1 else {}
            out_path.write_text(json.dumps(doc, indent=1))
    for name in ("ratios", "counted_ratios"):
        print(name, json.dumps({m: {k: r.get(k) for k in ("pairs", "median", "min", "max")}
                                for m, r in doc[name].items()}))
    out_path.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
