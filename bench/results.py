"""The suite's results: a workload program's output parsed, runs reduced to ratios, the goals judged,
and the markdown report. Pure functions over plain dicts but publish, which writes them (bench/suite.py
measures, bench/combine.py joins part runs, bench/plots.py draws, tests/test_bench_suite.py checks these
with made-up measurements).

A case is one (workload, mode) process; its raw record (suite.run_case) is
``{"status": ok|failed|timeout, "warmup_ms", "reps": [[ms, units]], "unit_ms": [...], "digest", "wall_s",
"error", ...}``: a repetition does ``units`` units of work (a launch, a training step, a forward), and
``unit_ms`` is each repetition's ms per unit, what the ratios compare.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import paired
from probe_check import PROBE_MODES, TRACED, check_cell

# Modes in table order: (key, column title). "torch_profiler" runs only for the PyTorch workloads.
MODES = (("plain", "uninstrumented"), ("shim", "shim only"), ("entry_exit", "entry/exit counter"),
         ("mem_count", "mem-access counter"), ("mem_trace", "full mem trace"),
         ("mem_trace_warp", "full mem trace, warp records"), ("torch_profiler", "torch.profiler (CUPTI)"))
MIN_RUNS = 10
UNITS = {"torch_eager": "training step", "torch_compile": "forward"}  # otherwise a launch

# Goals on the median ratio to uninstrumented (every workload must meet them), and on two costs.
RATIO_GOALS = (("entry_exit", "entry/exit counter", 1.03), ("mem_count", "memory-access counter", 1.3),
               ("mem_trace", "full memory trace", 2.0), ("mem_trace_warp", "full memory trace, warp records", 2.0))
SHIM_GOAL_NS = 100.0
JIT_GOAL_MS = 100.0

# Published overheads of the peers, quoted, not measured here. All are vector-add microbenchmarks of a
# few microseconds per kernel on other GPUs, so they bound the order of magnitude, not our numbers.
PUBLISHED = (
    {"tool": "bpftime", "what": "kernel invocation count + time probe (cuda_probe.bpf.c), vec_add, 10,000 launches",
     "gpu": "RTX 5090", "ratio": 2.0, "detail": "4.1 us -> 8.2 us per kernel",
     "source": "eunomia-bpf/bpftime benchmark/gpu/README.md (commit 12a4f1e5), 'Performance Results'"},
    {"tool": "bpftime", "what": "same probe and program", "gpu": "Tesla P40", "ratio": 1.56,
     "detail": "51.8 us -> 81.1 us", "source": "eunomia-bpf/bpftime benchmark/gpu/README.md (commit 12a4f1e5)"},
    {"tool": "NVBit", "what": "equivalent timing tool (nvbit_vec_add.cu), same program", "gpu": "RTX 5090",
     "ratio": 13.6, "detail": "4.1 us -> 55.8 us",
     "source": "eunomia-bpf/bpftime benchmark/gpu/README.md (commit 12a4f1e5); measured by bpftime's authors"},
    {"tool": "NVBit", "what": "same", "gpu": "Tesla P40", "ratio": 3.37, "detail": "51.8 us -> 174.4 us",
     "source": "eunomia-bpf/bpftime benchmark/gpu/README.md (commit 12a4f1e5)"},
    {"tool": "bpftime", "what": "entry + exit probes, vec_add 'medium'", "gpu": "RTX 5090", "ratio": 1.20,
     "detail": "5.31 us -> 6.38 us",
     "source": "eunomia-bpf/bpftime benchmark/gpu/micro/micro_vec_add_result.md (commit 5137dff9)"},
    {"tool": "bpftime", "what": "memtrace (a ring-buffer record per access), vec_add 'medium' / 'large'",
     "gpu": "RTX 5090", "ratio": 1.85, "detail": "1.85x medium, 4.19x large",
     "source": "eunomia-bpf/bpftime benchmark/gpu/micro/micro_vec_add_result.md (commit 5137dff9)"},
    {"tool": "NVBit", "what": "tutorial mem_trace / instr_count tools, vec_add 'tiny'", "gpu": "RTX 5090",
     "ratio": 7.34, "detail": "mem_trace 7.34x, instr_count 13.36x",
     "source": "eunomia-bpf/bpftime benchmark/gpu/nvbit/nvbit_vec_add_result.md (commit 495d42b9); "
               "measured by bpftime's authors"},
)
UNQUOTED = ("NVBit's own paper (Villa et al., MICRO 2019): we could not locate its overhead figures to quote them "
            "exactly, so none is given; the NVBit rows above are bpftime's authors' measurements.")


# ---- a workload program's output ---------------------------------------------------------------------

def parse_output(stdout: str) -> dict[str, Any]:
    """The BENCH_ lines of a workload program (bench/workloads): warm-up, repetitions ("ms units", units
    1 when left out), every unit the process ran, digest, kernels.cu's split of one launch's time
    (host_us in the call, kernel_us between events), the modules bench/empty_patch patched and the loads it
    was called back for when it was injected, and --count's event ("count_event") per unit of each repetition
    ("count_per_unit") or why nothing was counted ("count_error"), where the program was asked to count. Other lines
    (egpu-run's maps) are ignored; a run cut short keeps the repetitions it printed."""
    warmup, reps, units, digest, split, tool_patched, tool_seen = None, [], None, None, None, None, None
    counted: dict[str, Any] = {}   # --count's: per unit of each repetition, or why nothing was counted
    for line in stdout.splitlines():
        key, _, value = line.strip().partition(" ")
        try:
            if key == "BENCH_WARMUP":
                warmup = float(value)
            elif key == "BENCH_REP":
                ms, *n = value.split()
                reps.append([float(ms), int(n[0]) if n else 1])
            elif key == "BENCH_UNITS":
                units = int(value)
            elif key == "BENCH_TOOL_PATCHED":
                tool_patched = int(value)
            elif key == "BENCH_TOOL_SEEN":
                tool_seen = int(value)
            elif key == "BENCH_COUNT" and reps and reps[-1][1] > 0:
                counted.setdefault("count_per_unit", []).append(int(value) / reps[-1][1])
            elif key == "BENCH_COUNT_UNAVAILABLE":
                counted["count_error"] = value.strip()
            elif key == "BENCH_COUNT_EVENT":
                counted["count_event"] = value.strip()
            elif key == "BENCH_SPLIT":
                host_us, kernel_us = map(float, value.split())
                split = {"host_us": host_us, "kernel_us": kernel_us}
        except (ValueError, IndexError):
            continue
        if key == "BENCH_DONE":
            digest = value.strip() or None
    return {"warmup_ms": warmup, "reps": reps, "unit_ms": [ms / n for ms, n in reps if n > 0], "units": units,
            "digest": digest, "split": split, "tool_patched": tool_patched,
            "tool_seen": tool_seen, **counted}


# ---- runs to ratios ----------------------------------------------------------------------------------

def summarize_case(case: dict[str, Any], base: dict[str, Any] | None) -> dict[str, Any]:
    """Median and min of a case's ms per unit, its ratio to ``base`` (the plain case's summary) with the
    spread the goals judge, and whether its output digest matches the plain run's. The spread: with
    paired rounds (``rounds_ms`` in both), the per-round ratios (bench/paired.py), "pairs" their number;
    else each repetition over the plain median, "pairs" None."""
    reps = case.get("unit_ms") or []
    out: dict[str, Any] = {"status": case.get("status", "ok"), "n": len(reps)}
    if reps:
        out["median_ms"] = statistics.median(reps)
        out["min_ms"] = min(reps)
    if case.get("rounds_ms"):
        out["rounds_ms"] = case["rounds_ms"]
    if reps and base and base.get("median_ms"):
        if base.get("rounds_ms") and case.get("rounds_ms"):
            rounds = paired.ratios(base["rounds_ms"], case["rounds_ms"])
            out["ratio"], out["spread"] = rounds["median"], [rounds["min"], rounds["max"]]
            out["pairs"] = rounds["pairs"]
        else:
            out["ratio"] = out["median_ms"] / base["median_ms"]
            out["spread"] = [min(reps) / base["median_ms"], max(reps) / base["median_ms"]]
            out["pairs"] = None
        out["ratio_min"] = out["min_ms"] / base["min_ms"]
    if base is not None and case.get("digest") and base.get("digest"):
        out["same_output"] = case["digest"] == base["digest"]
    return out


def _base(plain: dict[str, Any]) -> dict[str, Any]:
    """What summarize_case compares a case with: the plain record's summary and its output digest."""
    return summarize_case(plain, None) | {"digest": plain.get("digest")}


def summarize(cases: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, dict[str, Any]]]:
    """``cases[workload][mode]`` raw records -> the same shape of summaries (ratios to that workload's
    plain, or to a record's "base": the plain of its own run, which bench/combine.py gives a record taken
    from another run than the plain shown, since processes differ run to run). A probe mode's ratio stands
    only when probe_check.check_cell proves its probe ran: "probe_checked" true; else false with
    "probe_check" the reason, and the ratio kept aside as "unchecked_ratio", which no goal and no table
    counts. A record whose "run" (bench/combine.py's) predates the probe checks fails them whatever it
    holds."""
    out = {}
    for workload, modes in cases.items():
        shown = _base(modes.get("plain", {}))
        out[workload] = {mode: summarize_case(raw, _base(raw["base"]) if "base" in raw else shown)
                         if mode != "plain" else {k: v for k, v in shown.items() if k != "digest"}
                         for mode, raw in modes.items()}
        for mode in PROBE_MODES:
            if mode not in modes:
                continue
            s = out[workload][mode]
            if mode in TRACED and "trace" in modes[mode]:
                s["records_delivered"] = modes[mode]["trace"]["records"]
                s["records_dropped"] = modes[mode]["trace"]["drops"]
                if "lanes" in modes[mode]["trace"]:
                    s["lanes_delivered"] = modes[mode]["trace"]["lanes"]
                s.update(drain_rates(modes[mode], s))
            why = check_cell(workload, mode, modes)
            if modes[mode].get("run", {}).get("predates_probe_checks"):
                why = "its run predates the probe checks" + (f" ({why})" if why else "")
            s["probe_checked"] = why is None
            if why is not None:
                s["probe_check"] = why
                if "ratio" in s:
                    s["unchecked_ratio"] = s.pop("ratio")
                    for k in ("ratio_min", "spread", "pairs"):
                        s.pop(k, None)
    return out


# ---- goals -------------------------------------------------------------------------------------------

def _judge(name: str, target: float, value: float | None, where: str, unit: str, scope: str,
           spreads: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A goal's row: ``value`` the worst median; judged by ``spreads`` (one per place the goal must
    hold; paired.verdict each: missed if one is missed, else too few pairs or undecided if one is,
    else met) when given, else by the value alone."""
    row: dict[str, Any] = {"goal": name, "target": target, "unit": unit, "value": value, "where": where,
                           "scope": scope}
    if value is None:
        row["status"] = "not measured"
        return row
    if spreads:
        row["spread"] = [min(s["min"] for s in spreads), max(s["max"] for s in spreads)]
        verdicts = [paired.verdict(s, target) for s in spreads]
        row["status"] = next((v for key in ("missed", "too few", "undecided") for v in verdicts if v.startswith(key)),
                             "met")
    else:
        row["status"] = "met" if value <= target else "missed"
    if value > target:
        row["over_by"] = value - target if unit != "x" else value / target - 1
    return row


def goals(summary: dict[str, dict[str, dict[str, Any]]], shim: dict[str, Any] | None,
          jit: dict[str, Any] | None) -> list[dict[str, Any]]:
    """One row per goal: the worst measured median, where it was, and met, missed or undecided as
    paired.verdict judges the spread over every workload (the least min to the greatest max; a
    workload with too few pairs decides nothing), by how much the worst median missed (ratios: a
    fraction of the target; ns and ms: the excess). Only probe-checked cells have a ratio."""
    rows = []
    for mode, name, target in RATIO_GOALS:
        cells = [(w, s[mode]) for w, s in summary.items() if mode in s and "ratio" in s[mode]]
        lost = [w for w, s in summary.items() if mode in s and "ratio" not in s[mode]]
        few = [w for w, c in cells if c.get("pairs") is not None and c["pairs"] < paired.MIN_PAIRS]
        worst = max(((c["ratio"], w) for w, c in cells), default=(None, ""))
        scope = f"worst of {len(cells)} probe-checked workloads, {sum(c['spread'][1] <= target for _, c in cells)} met"
        spreads = [{"min": c["spread"][0], "max": c["spread"][1], "pairs": c.get("pairs")} for _, c in cells]
        row = _judge(name, target, worst[0], worst[1], "x",
                     scope + (f"; too few pairs: {', '.join(few)}" if few else "")
                     + (f"; no ratio: {', '.join(lost)}" if lost else ""), spreads)
        # a workload that failed, timed out or failed its probe check has not met it
        if lost and row["status"] == "met":
            row["status"] = "not measured everywhere"
        rows.append(row)
    added, spread = None, None
    if shim and "shim" in shim.get("cases", {}):
        e = shim["cases"]["shim"]["enqueue_ns"]
        added = e["added_median"]
        spread = [paired.differences(shim["cases"]["plain"]["enqueue_ns"]["runs"], e["runs"])]
    rows.append(_judge("shim only, per launch", SHIM_GOAL_NS, added, "launch_loop", "ns",
                       "median of per-round differences to plain, judged on their spread", spread))
    total, where = None, ""
    if jit and jit.get("probes"):
        worst = max(jit["probes"], key=lambda p: p["total_ms"])
        total, where = worst["total_ms"], f"{jit['kernel']} ({jit['instructions']} PTX insns), {worst['probe']}"
    rows.append(_judge("JIT of a 1,000-instruction kernel", JIT_GOAL_MS, total, where, "ms",
                       "translate + rewrite + driver JIT, worst probe"))
    return rows


def notes(doc: dict[str, Any]) -> list[str]:
    """Facts the reader needs to read the table right, derived from the results (the analysis of why a
    goal was missed is written by whoever reads them)."""
    out = []
    for w, traced in doc.get("trace", {}).items():
        for mode, t in traced.items():
            total = t["records"] + t["drops"]
            if total and t["drops"]:
                kept = f"{t['records']:,} of {total:,} records ({t['records'] / total:.1%})"
                out.append(f"{w}{'' if mode == 'mem_trace' else f' ({mode})'}: the full trace delivered {kept} "
                           + ("into the trace file: its ring dropped the rest, so the cell has no ratio."
                              if t.get("streamed") else
                              "from a ring read at exit: once it was full the rest took the drop path, so the cell "
                              "has no ratio."))
    for w, modes in doc.get("summary", {}).items():
        for m, s in modes.items():
            if s.get("status") not in (None, "ok"):
                err = doc.get("cases", {}).get(w, {}).get(m, {}).get("error", "")
                out.append(f"{w} / {m}: {s['status']}" + (f" ({err})" if err else ""))
            elif s.get("probe_checked") is False:
                out.append(f"{w} / {m}: probe check failed, no ratio: {s['probe_check']}")
            elif s.get("same_output") is False:
                out.append(f"{w} / {m}: the output differs from the uninstrumented run's")
    if "torch_eager" in doc.get("summary", {}):
        out.append("torch_eager's kernels (cuDNN, cuBLAS, PyTorch's own) ship no PTX: under egpu-run the "
                   "SASS back end (Compute Sanitizer patching) serves the probes there, the PTX back end "
                   "everywhere else; torch_compile mixes both (Triton's kernels are PTX, cuBLAS's SASS).")
    return out


def drain_rates(raw: dict[str, Any], s: dict[str, Any]) -> dict[str, float]:
    """A full trace's pace in GB/s, from its run's drain (the reader's counts, printed under egpu-run's trace line):
    ``records_gb_s``, the records' bytes a unit (those the reader took over the run, over its units) in the median
    unit's time; ``copies_gb_s``, the bytes the reader copied out of the rings in the time of its copies (the host
    link's pace, as that run's copies found it). Each left out where the run printed no such counts (before
    2026-12-06c)."""
    drain = (raw["trace"].get("drain") or [{}])[0]
    out = {}
    if drain.get("taken_bytes") and raw.get("units") and s.get("median_ms"):
        out["records_gb_s"] = drain["taken_bytes"] / raw["units"] / (s["median_ms"] / 1e3) / 1e9
    if drain.get("copied_bytes") and drain.get("copy_s"):
        out["copies_gb_s"] = drain["copied_bytes"] / drain["copy_s"] / 1e9
    return out


def complete(doc: dict[str, Any]) -> None:
    """Into a doc holding "cases", "jit", "shim" and "hot_swap" (one run's, or bench/combine.py's of
    several): the summary, per-module timings, trace deliveries, goals and notes derived from them; a JIT
    or shim part that measured nothing becomes {"error": why}."""
    cases = doc["cases"]
    doc["summary"] = summarize(cases)
    doc["modules"] = [{"workload": w, "mode": m, **mod} for w, ms in cases.items() for m, r in ms.items()
                      for mod in r.get("modules", [])]
    doc["trace"] = {w: {m: ms[m]["trace"] for m in TRACED if "trace" in ms.get(m, {})} for w, ms in cases.items()}
    shim = doc["shim"] if "cases" in doc["shim"] else None
    jit = doc["jit"] if "probes" in doc["jit"] else None
    doc["goals"] = goals(doc["summary"], shim, jit)
    if jit is None:
        doc["jit"] = {"error": doc["jit"].get("skipped", "not measured")}
    if shim is None:
        doc["shim"] = {"error": doc["shim"].get("skipped", "not measured")}
    doc.setdefault("notes", []).extend(notes(doc))


def publish(doc: dict[str, Any], out_dir: Path) -> str:
    """OUT_DIR/suite.json and OUT_DIR/suite.md of a completed doc; the markdown."""
    md = markdown(doc)
    (out_dir / "suite.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out_dir / "suite.md").write_text(md)
    return md


# ---- markdown ----------------------------------------------------------------------------------------

def _num(v: float | None, unit: str = "", digits: int = 2) -> str:
    return "—" if v is None else f"{v:.{digits}f}{unit}"


def no_ratio(s: dict[str, Any]) -> str:
    """Why a cell that ran has no ratio: its probe check failed, its status (timed out, failed, skipped), or
    no repetition finished."""
    if s.get("probe_checked") is False and s.get("status") == "ok":
        return "probe check failed"
    return s.get("status", "failed") if s.get("status") != "ok" else "no runs"


def cell(s: dict[str, Any] | None) -> str:
    """One table cell: the ratio, with its spread and pairs when paired, else n when fewer than
    MIN_RUNS, and a mark when the output differs."""
    if s is None:
        return "—"
    if "ratio" not in s:
        return no_ratio(s)
    text = f"{s['ratio']:.2f}x"
    if s.get("pairs") is not None:
        text += f" ({s['spread'][0]:.2f}-{s['spread'][1]:.2f}, {s['pairs']} pairs)"
    elif s["n"] < MIN_RUNS:
        text += f" (n={s['n']})"
    if s.get("status") == "timeout":
        text += " timeout"
    if s.get("same_output") is False:
        text += " †"
    return text


def overhead_table(summary: dict[str, dict[str, dict[str, Any]]], runs: dict[str, str] | None = None) -> list[str]:
    """The ratios, a row per workload; with ``runs`` (a combined doc's), a last column saying its runs."""
    modes = [(k, t) for k, t in MODES if any(k in s for s in summary.values())]
    lines = ["| workload | " + " | ".join(t if k != "plain" else "uninstrumented (per unit)" for k, t in modes)
             + (" | run |" if runs else " |"),
             "| --- |" + " ---: |" * len(modes) + (" --- |" if runs else "")]
    for workload, s in summary.items():
        plain = s.get("plain", {})
        first = (f"{plain['median_ms'] * 1e3:.1f} µs / {UNITS.get(workload, 'launch')}" if "median_ms" in plain
                 else plain.get("status", "—"))
        lines.append(f"| {workload} | {first} | " + " | ".join(cell(s.get(k)) for k, _ in modes[1:])
                     + (f" | {runs[workload]} |" if runs else " |"))
    return lines


def goal_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| goal | target | measured (worst median) | spread | where | status |",
             "| --- | ---: | ---: | ---: | --- | --- |"]
    for r in rows:
        unit = r["unit"]
        fmt = (lambda v: f"{v:.3f}x") if unit == "x" else (lambda v: f"{v:.1f} {unit}")
        status = r["status"]
        if status == "missed":
            status += f" by {r['over_by']:.0%}" if unit == "x" else f" by {r['over_by']:.1f} {unit}"
        where = f"{r['where']} ({r['scope']})" if r["where"] else r["scope"]
        target = f"≤ {r['target']}x" if unit == "x" else f"< {r['target']:.0f} {unit}"
        spread = f"{fmt(r['spread'][0])} .. {fmt(r['spread'][1])}" if "spread" in r else "—"
        lines.append(f"| {r['goal']} | {target} | {'—' if r['value'] is None else fmt(r['value'])} | {spread} | "
                     f"{where} | {status} |")
    return lines


def jit_tables(jit: dict[str, Any] | None, modules: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    if jit and jit.get("probes"):
        lines += [f"`{jit['kernel']}` ({jit['instructions']} PTX instructions); the driver JITs the original in "
                  f"{jit['driver_original_ms']:.1f} ms (cache off).", "",
                  "| probe | translate | rewrite | driver JIT | total | PTX insns after |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for p in jit["probes"]:
            lines.append(f"| {p['probe']} | {p['translate_ms']:.1f} ms | {p['rewrite_ms']:.1f} ms | "
                         f"{p['driver_ms']:.1f} ms | {p['total_ms']:.1f} ms | {p['instructions_after']} |")
        lines.append("")
    elif jit and jit.get("error"):
        lines += [f"Not measured: {jit['error']}", ""]
    if modules:
        lines += ["Per module in the suite's runs (the runtime's exit dump; probes loaded once per process):", "",
                  "| workload | mode | module | kernels | probes load | rewrite | driver load + JIT |",
                  "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
        for m in modules:
            lines.append(f"| {m['workload']} | {m['mode']} | {m['image']} | {m['kernels']} | "
                         f"{_num(m.get('probes_ms'), ' ms', 1)} | {_num(m.get('rewrite_ms'), ' ms', 1)} | "
                         f"{_num(m.get('driver_ms'), ' ms', 1)} |")
        lines.append("")
    return lines


def swap_lines(swap: dict[str, Any] | None) -> list[str]:
    if not swap:
        return ["Not measured."]
    if "skipped" in swap:
        return [f"Skipped: {swap['skipped']}"]
    lines = [f"{swap['cycles']} cycles on a running job (tests/e2e/swap_loop.cu); median (max) in ms:", "",
             "| request | flip (in the job) | round trip (egpu → job → egpu) |", "| --- | ---: | ---: |"]
    for cmd in ("attach", "swap", "detach"):
        f, r = swap["flip_ms"][cmd], swap["round_trip_ms"][cmd]
        lines.append(f"| {cmd} | {f['median']:.1f} ({f['max']:.1f}) | {r['median']:.1f} ({r['max']:.1f}) |")
    return lines


def shim_lines(shim: dict[str, Any] | None) -> list[str]:
    if not shim or "cases" not in shim:
        return [f"Not measured{': ' + shim['error'] if shim and 'error' in shim else '.'}"]
    cpus = ", ".join(map(str, shim.get("cpus", ()))) or "none"
    lines = [f"{shim['launches']:,} empty-kernel launches per run, {shim['runs']} rounds round-robin, pinned to "
             f"CPU {cpus}; ns per launch (host time in the launch call):", "",
             "| case | median | min | added (median of paired differences) |", "| --- | ---: | ---: | ---: |"]
    for name, row in shim["cases"].items():
        e = row["enqueue_ns"]
        added = f"+{e['added_median']:.1f}" if "added_median" in e else "—"
        lines.append(f"| {name} | {e['median']:.1f} | {e['min']:.1f} | {added} |")
    return lines


def trace_lines(summary_trace: dict[str, dict[str, Any]], summary: dict[str, dict[str, Any]]) -> list[str]:
    rows = [(w, mode, t, summary.get(w, {}).get(mode, {})) for w, traced in summary_trace.items()
            for mode, t in traced.items()]
    if not rows:
        return []
    lines = ["Full-trace records delivered (into egpu-run --trace's file while the job ran) and dropped (the ring "
             "was full): a full-trace ratio counts only a run that dropped none. A warp record stands for the "
             "lanes that made one access together: egpu trace expands it to a row per lane. The drain's pace: "
             "the records' bytes a unit over the median unit's time, beside the pace of the reader's copies out "
             "of the rings in the same run (the host link as it found it); — where the run did not count them.", "",
             "| workload | trace | delivered | dropped | lanes | records | the reader's copies |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for w, mode, t, s in rows:
        lanes = f"{t['lanes']:,}" if "lanes" in t else "—"
        kind = "warp records" if mode == "mem_trace_warp" else "lane records"
        lines.append(f"| {w} | {kind} | {t['records']:,} | {t['drops']:,} | {lanes} | "
                     f"{_num(s.get('records_gb_s'), ' GB/s')} | {_num(s.get('copies_gb_s'), ' GB/s', 1)} |")
    return lines + [""]


META_SHOWN = ("combined", "gpu", "driver", "date", "commit", "dirty", "log", "total_s", "cpus")


def run_label(source: dict[str, Any]) -> str:
    """A run as a reader tells it apart: its date, time and short commit."""
    return f"{source['date'][:10]} {source['date'][11:16]} {str(source.get('commit', '?'))[:7]}"


def run_link(meta: dict[str, Any], source: dict[str, Any]) -> str:
    """A link to the run ``source`` names in a combined doc's meta: its report, else its JSON."""
    run = next(r for r in meta["runs"] if r["json"] == source["json"])
    return f"[{run_label(run)}]({run['links'].get('report', run['links']['json'])})"


def row_runs(meta: dict[str, Any], modes: dict[str, dict[str, Any]]) -> str:
    """A combined row's runs: the one its uninstrumented cell came from, then each other with the modes it
    gave ("[run A]; mem_trace_warp: [run B]")."""
    if not modes:
        return "—"
    by_run: dict[str, list[str]] = {}
    for m, rec in modes.items():
        by_run.setdefault(rec["run"]["json"], []).append(m)
    sources = {rec["run"]["json"]: rec["run"] for rec in modes.values()}
    first = (modes.get("plain") or next(iter(modes.values())))["run"]["json"]
    return "; ".join([run_link(meta, sources[first])] + [f"{', '.join(ms)}: {run_link(meta, sources[j])}"
                                                         for j, ms in by_run.items() if j != first])


def runs_table(meta: dict[str, Any]) -> list[str]:
    """A combined doc's runs, newest first: the tree that ran, what each gave, its files."""
    lines = ["| run | tree | GPU, driver | gave | files |", "| --- | --- | --- | --- | --- |"]
    for r in meta["runs"]:
        tree = ("clean" if r.get("dirty") is False else
                f"dirty ({r['differs']['count']} files differ, listed in its JSON)" if r.get("differs") else
                "dirty" if r.get("dirty") else "not recorded (the run predates provenance stamps)")
        gave = ", ".join(r["gave"]) or "nothing newer runs did not measure"
        if r.get("predates_probe_checks"):
            gave += " (before the probe checks)"
        files = ", ".join(f"[{k}]({r['links'][k]})" for k in ("report", "json", "log") if k in r["links"])
        lines.append(f"| {run_label(r)} | {tree} | {r.get('gpu', '?')}, {r.get('driver', '?')} | {gave} | {files} |")
    return lines


def from_run(doc: dict[str, Any], part: str) -> list[str]:
    """In a combined doc, the line saying which run a part came from."""
    source = (doc.get(part) or {}).get("run")
    return [f"From the run {run_link(doc['meta'], source)}.", ""] if source else []


def markdown(doc: dict[str, Any]) -> str:
    """The report: overheads, goals, JIT, hot swap, shim per launch, trace delivery, published numbers."""
    meta = doc.get("meta", {})
    summary = doc["summary"]
    combined = "runs" in meta
    out = ["# egpu benchmark suite", "",
           " · ".join(f"{k}: {v}" for k, v in meta.items() if k in META_SHOWN), ""]
    if combined:
        out += ["Runs combined (bench/combine.py), newest first:", ""] + runs_table(meta) + [""]
    out += ["## Overhead: steady-state time relative to uninstrumented", "",
           "Each cell: the median time per unit of work (a launch, a training step, a forward) over the "
           "repetitions of the workload's timed region, divided by the uninstrumented median. The region "
           "follows a warm-up, so process start-up, compilation and the JIT are excluded; each repetition "
           f"takes about 100 ms (fewer units when a mode is slower); n is shown when fewer than {MIN_RUNS} "
           "repetitions fit the time budget; † marks an output that differs from the uninstrumented run. "
           "A probe cell shows a ratio only when its run proved the probe ran as often as it must, with the "
           "uninstrumented output (bench/probe_check.py); otherwise \"probe check failed\", the reason in the notes."
           + (" Each cell comes from the newest run that ran its mode (an older measured cell before a newer "
              "attempt with no ratio, named in the notes), its ratio against that run's own uninstrumented "
              "case. The last column names the run of the uninstrumented time shown, then any other with the "
              "modes it gave; — marks a mode no run ran." if combined else ""), ""]
    runs = {w: row_runs(meta, ms) for w, ms in doc["cases"].items()} if combined else None
    out += overhead_table(summary, runs)
    out += ["", "## Goals", ""] + goal_table(doc["goals"])
    out += ["", "## JIT and instrumentation cost", ""] + from_run(doc, "jit") + jit_tables(doc.get("jit"),
                                                                                         doc.get("modules", []))
    out += ["## Hot swap", ""] + from_run(doc, "hot_swap") + swap_lines(doc.get("hot_swap"))
    out += ["", "## Shim cost per launch", ""] + from_run(doc, "shim") + shim_lines(doc.get("shim"))
    out += [""] + trace_lines(doc.get("trace", {}), doc.get("summary", {}))
    out += ["## Published numbers of the peers (quoted, not measured here)", "",
            "| tool | what | GPU | overhead | detail | source |", "| --- | --- | --- | ---: | --- | --- |"]
    out += [f"| {p['tool']} | {p['what']} | {p['gpu']} | {p['ratio']:.2f}x | {p['detail']} | {p['source']} |"
            for p in PUBLISHED]
    out += ["", UNQUOTED, ""]
    if doc.get("notes"):
        out += ["## Notes", ""] + [f"- {n}" for n in doc["notes"]] + [""]
    return "\n".join(out)
