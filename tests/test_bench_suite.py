"""bench/suite.py's parsing, aggregation, goals, report and plots on made-up measurements, and its case
runner on stand-in programs: a formatting bug must fail here, not in the one GPU call. No GPU timing."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

results = importlib.import_module("results")


def case(reps, digest="d", status="ok", **extra):
    return {"status": status, "reps": [[r * 100, 100] for r in reps], "unit_ms": list(reps), "warmup_ms": 99.0,
            "digest": digest, "wall_s": 1.0, **extra}


def entry_exit(reps, entries, threads=None, digest="d", dropped=0, **extra):
    """An entry_exit record whose probe counted ``entries`` entries and exits, with its witness run
    (entries again, ``threads`` launched by 10 launches); ``threads=None``: no witness run."""
    rec = case(reps, digest, counts=[[[entries, entries]]], **extra)
    if threads is not None:
        rec["check_run"] = case([1.0] * 3, digest, counts=[[[entries, entries]], [[threads, 10]]],
                                shim_stats={"dropped": dropped})
    return rec


def fake_cases():
    return {
        "vecadd": {"plain": case([10, 11, 9, 10, 10, 10, 12, 10, 10, 10]),
                   "shim": case([10.1] * 10),
                   "entry_exit": entry_exit([10.2] * 10, 1000, 1000),
                   "mem_count": case([12.0] * 10, counts=[[[600, 400]]], units=100),
                   "mem_trace": case([50.0, 52.0, 48.0], units=100, trace={
                       "records": 1000, "drops": 0,   # 100 MB a unit in its median 50 ms; 20 GB copied in 0.5 s
                       "drain": [{"taken_bytes": 10_000_000_000, "copied_bytes": 20_000_000_000, "copy_s": 0.5}]})},
        "torch_eager": {"plain": case([20.0] * 10, digest="x"),
                        "shim": case([20.0] * 10, digest="y"),
                        "entry_exit": entry_exit([20.4] * 10, 5000, 5000, digest="x"),
                        "mem_count": case([], digest=None, status="timeout"),
                        "mem_trace": case([30.0] * 10, digest="x", trace={"records": 7, "drops": 0}, units=3),
                        "torch_profiler": case([25.0] * 10, digest="x")},
    }


def fake_doc():
    cases = fake_cases()
    summary = results.summarize(cases)
    shim = {"launches": 100000, "runs": 3, "cpus": [1], "goal_ns": 100.0,
            "cases": {"plain": {"enqueue_ns": {"median": 3800.0, "min": 3700.0, "runs": [3800.0, 3700.0, 3900.0]}},
                      "shim": {"enqueue_ns": {"median": 3900.0, "min": 3790.0, "runs": [3850.0, 3790.0, 4100.0],
                                              "added_median": 90.0, "added_runs": [50.0, 90.0, 200.0]}}}}
    jit = {"kernel": "big_unrolled", "instructions": 1113, "driver_original_ms": 20.0, "goal_ms": 100.0,
           "probes": [{"probe": "entry_exit", "translate_ms": 3.0, "rewrite_ms": 4.0, "driver_ms": 30.0,
                       "total_ms": 37.0, "instructions_after": 1169},
                      {"probe": "mem_count", "translate_ms": 3.0, "rewrite_ms": 8.0, "driver_ms": 140.0,
                       "total_ms": 151.0, "instructions_after": 9459}]}
    doc = {"meta": {"gpu": "H200", "date": "d", "commit": "c"}, "cases": cases, "summary": summary,
           "goals": results.goals(summary, shim, jit), "jit": jit, "shim": shim,
           "modules": [{"workload": "vecadd", "mode": "shim", "image": "fatbin compute_90", "kernels": 0,
                        "probes_ms": 1.5, "rewrite_ms": 2.0, "driver_ms": 30.0}],
           "trace": {"vecadd": {"mem_trace": {"records": 1000, "drops": 0},
                                "mem_trace_warp": {"records": 40, "drops": 0, "lanes": 1000}}},
           "hot_swap": {"cycles": 2, "flip_ms": {c: {"median": 1.0, "max": 2.0} for c in ("attach", "swap", "detach")},
                        "round_trip_ms": {c: {"median": 5.0, "max": 6.0} for c in ("attach", "swap", "detach")}}}
    doc["notes"] = results.notes(doc)
    return doc


@pytest.mark.parametrize("stdout, want", [
    ("BENCH_WARMUP 120.5\nBENCH_REP 50.0 100\nBENCH_REP 51.5 50\nBENCH_SPLIT 4.5 61.25\nBENCH_UNITS 158\n"
     "BENCH_DONE abc\n",
     {"warmup_ms": 120.5, "reps": [[50.0, 100], [51.5, 50]], "unit_ms": [0.5, 1.03], "units": 158, "digest": "abc",
      "split": {"host_us": 4.5, "kernel_us": 61.25},
      "tool_patched": None, "tool_seen": None}),
    # egpu-run's maps around the program's lines, a run cut short (no DONE), units left out
    ("@calls[0]: 12\nBENCH_WARMUP 1\n  BENCH_REP 2.5\nkernel vecadd\n",
     {"warmup_ms": 1.0, "reps": [[2.5, 1]], "unit_ms": [2.5], "units": None, "digest": None, "split": None,
      "tool_patched": None, "tool_seen": None}),
    ("BENCH_REP oops\nBENCH_REP 3 x\nBENCH_REP 3 0\nBENCH_UNITS x\nBENCH_SPLIT 1\n",
     {"warmup_ms": None, "reps": [[3.0, 0]], "unit_ms": [], "units": None, "digest": None, "split": None,
      "tool_patched": None, "tool_seen": None}),
    ("BENCH_TOOL_PATCHED 3\nBENCH_TOOL_SEEN 5\n",
     {"warmup_ms": None, "reps": [], "unit_ms": [], "units": None, "digest": None, "split": None, "tool_patched": 3,
      "tool_seen": 5}),
    # --count: the event per unit of the repetition just before; a count before any repetition is nobody's
    ("BENCH_COUNT 7\nBENCH_REP 2.0 4\nBENCH_COUNT 1000\nBENCH_REP 2.0 2\nBENCH_COUNT 1000\n",
     {"warmup_ms": None, "reps": [[2.0, 4], [2.0, 2]], "unit_ms": [0.5, 1.0], "units": None, "digest": None,
      "split": None, "tool_patched": None, "tool_seen": None, "count_per_unit": [250.0, 500.0]}),
    ("BENCH_COUNT_UNAVAILABLE [Errno 2] perf_event_open (instructions): No such file or directory\n",
     {"warmup_ms": None, "reps": [], "unit_ms": [], "units": None, "digest": None, "split": None,
      "tool_patched": None, "tool_seen": None,
      "count_error": "[Errno 2] perf_event_open (instructions): No such file or directory"}),
    ("BENCH_COUNT_EVENT task_clock\n", {"warmup_ms": None, "reps": [], "unit_ms": [], "units": None, "digest": None,
                                        "split": None, "tool_patched": None, "tool_seen": None,
                                        "count_event": "task_clock"}),
])
def test_parse_output(stdout, want):
    assert results.parse_output(stdout) == want


def test_summarize_ratios_and_outputs():
    s = results.summarize(fake_cases())
    assert s["vecadd"]["plain"] == {"status": "ok", "n": 10, "median_ms": 10.0, "min_ms": 9}
    assert s["vecadd"]["shim"]["ratio"] == pytest.approx(1.01)
    assert s["vecadd"]["mem_count"]["ratio"] == pytest.approx(1.2)
    assert s["vecadd"]["mem_trace"]["n"] == 3 and s["vecadd"]["mem_trace"]["ratio"] == pytest.approx(5.0)
    assert s["vecadd"]["mem_trace"]["ratio_min"] == pytest.approx(48 / 9)
    assert s["torch_eager"]["shim"]["same_output"] is False
    assert s["torch_eager"]["entry_exit"]["same_output"] is True
    assert all(s[w][m]["probe_checked"] for w, m in [("vecadd", "entry_exit"), ("vecadd", "mem_count"),
                                                      ("vecadd", "mem_trace"), ("torch_eager", "entry_exit"),
                                                      ("torch_eager", "mem_trace")])
    assert "ratio" not in s["torch_eager"]["mem_count"] and s["torch_eager"]["mem_count"]["status"] == "timeout"


probe_check = importlib.import_module("probe_check")


def mem(mode, n, units, records=None, **extra):
    """A mem_count (``n`` accesses) or mem_trace (``n`` records + drops, ``records`` kept) record."""
    if mode == "mem_count":
        return case([1.0] * 10, counts=[[[n - n // 2, n // 2]]], units=units, **extra)
    kept = n if records is None else records
    return case([1.0] * 10, trace={"records": kept, "drops": n - kept}, units=units, **extra)


@pytest.mark.parametrize("workload, mode, rec, others, why", [
    ("vecadd", "entry_exit", entry_exit([1.0], 0, 0), {}, "run: the probe never ran (0 entries)"),
    ("vecadd", "entry_exit", case([1.0], counts=[[[5, 4]]]), {}, "run: 5 entries but 4 exits"),
    ("vecadd", "entry_exit", case([1.0]), {}, "run: no entry/exit counts in the exit dump"),
    ("vecadd", "entry_exit", entry_exit([1.0], 5), {}, "no witness run (entry_exit with bench/probes/launch_threads)"),
    ("vecadd", "entry_exit", entry_exit([1.0], 5, 8), {},
     "witness run: 5 entries for 8 launched threads (10 launches)"),
    ("vecadd", "entry_exit", entry_exit([1.0], 5, 5, dropped=3), {},
     "witness run: 3 launch records dropped, the launched threads are not all known"),
    ("vecadd", "entry_exit", entry_exit([1.0], 5, 5, digest="other"), {},
     "run: output other differs from the uninstrumented d"),
    ("vecadd", "entry_exit", case([1.0], digest=None), {}, "run: no output digest to compare"),
    ("vecadd", "entry_exit", case([], status="timeout", error="exit -9: "), {}, "run: timeout (exit -9: )"),
    ("vecadd", "mem_count", mem("mem_count", 0, 10), {}, "the probe never ran (0 accesses)"),
    ("vecadd", "mem_count", mem("mem_count", 31, 10), {},
     "31 accesses over 10 units is not the same number every unit"),
    ("vecadd", "mem_count", mem("mem_count", 30, None), {}, "no unit count (BENCH_UNITS) to divide the accesses by"),
    ("vecadd", "mem_count", mem("mem_count", 30, 10), {"mem_trace": mem("mem_trace", 40, 10, records=1)},
     "3 accesses per unit, mem_trace saw 4"),
    ("vecadd", "mem_trace", mem("mem_trace", 40, 10, records=1), {"mem_count": mem("mem_count", 30, 10)},
     "4 accesses per unit, mem_count saw 3"),
    ("vecadd", "mem_trace", mem("mem_trace", 40, 10, records=0), {}, "no trace record delivered (40 dropped)"),
    ("vecadd", "mem_trace", case([1.0]), {}, "no trace in the exit dump"),
    # not deterministic: counts need only be there
    ("cupy", "mem_count", mem("mem_count", 31, 10), {"mem_trace": mem("mem_trace", 40, 10)}, None),
    ("torch_eager", "mem_trace", mem("mem_trace", 7, None, records=7), {}, None),
    # a trace that dropped records is no full trace, whatever else holds
    ("torch_eager", "mem_trace", mem("mem_trace", 7, None, records=2), {},
     "5 of 7 records dropped: a full trace counts only runs that drop none"),
    ("vecadd", "mem_trace", mem("mem_trace", 30, 10, records=29), {"mem_count": mem("mem_count", 30, 10)},
     "1 of 30 records dropped: a full trace counts only runs that drop none"),
    # a partner that computed another output (another run's, another problem) witnesses nothing
    ("vecadd", "mem_count", mem("mem_count", 30, 10), {"mem_trace": mem("mem_trace", 40, 10, digest="e")}, None),
    # a timed-out partner is no witness either way
    ("vecadd", "mem_count", mem("mem_count", 30, 10), {"mem_trace": mem("mem_trace", 40, 10, status="timeout")}, None),
    ("vecadd", "entry_exit", entry_exit([1.0], 5, 5), {}, None),
])
def test_probe_check(workload, mode, rec, others, why):
    assert probe_check.check_cell(workload, mode, {"plain": case([1.0]), mode: rec, **others}) == why


def test_a_cell_that_fails_its_probe_check_has_no_ratio_and_no_goal():
    """An entry/exit counter that never ran reads 1.00x; that ratio is kept aside, the cell and the goal
    say why."""
    cases = fake_cases()
    cases["vecadd"]["entry_exit"] = entry_exit([10.0] * 10, 0, 1000)
    summary = results.summarize(cases)
    cell = summary["vecadd"]["entry_exit"]
    assert "ratio" not in cell and cell["unchecked_ratio"] == pytest.approx(1.0)
    assert (cell["probe_checked"], cell["probe_check"]) == (False, "run: the probe never ran (0 entries)")
    assert results.cell(cell) == "probe check failed"
    row = next(r for r in results.goals(summary, None, None) if r["goal"] == "entry/exit counter")
    assert row["status"] == "not measured everywhere" and row["where"] == "torch_eager"
    assert row["scope"] == "worst of 1 probe-checked workloads, 1 met; no ratio: vecadd"
    assert "vecadd / entry_exit: probe check failed, no ratio: run: the probe never ran (0 entries)" in \
        results.notes({"summary": summary, "cases": cases})
    assert "probe_checked" not in summary["vecadd"]["shim"]


def test_counter_bench_reports_a_counter_that_missed_threads_as_failed():
    bench_counters = importlib.import_module("bench_counters")
    n = bench_counters.VECADD_THREADS
    runs = {"plain": case([2.0] * 10), "empty": case([3.0] * 10),
            "array": case([4.0] * 10, counts=[[[10 * n, 10 * n]]], units=10),
            "percpu": case([4.0] * 10, counts=[[[10 * n - 32, 10 * n - 32]]], units=10),
            "one_copy": case([4.0] * 10, digest="e", counts=[[[10 * n, 10 * n]]], units=10)}
    doc = bench_counters.summarize(runs)
    assert doc["empty"]["ratio"] == 1.5 and doc["array"]["ratio"] == 2.0 and doc["array"]["probe_checked"]
    assert doc["percpu"]["ratio"] is None and doc["percpu"]["status"] == "failed"
    assert doc["percpu"]["probe_check"] == f"run: {10 * n - 32:,} entries for 10 launches of {n:,} threads"
    assert doc["one_copy"]["probe_check"] == "run: output e differs from the uninstrumented d"


def test_counts_from_dumps_sum_arrays_over_processes_and_sms():
    u64 = lambda n: n.to_bytes(8, "little")  # noqa: E731
    docs = [{"probes": [{"maps": [{"values": [u64(3), u64(4)]}, {"records": [b"x"], "drops": 0}]},
                        {"maps": [{"per_cpu": [[0, [u64(1)]], [5, [u64(2)]]]}]}]},
            {"probes": [{"maps": [{"values": [u64(10), u64(20)]}, {"records": [], "drops": 1}]},
                        {"maps": [{"per_cpu": [[1, [u64(7)]]]}]}]},
            {"probes": []}]
    assert probe_check.counts_from_dumps(docs) == [[[13, 24], None], [[10]]]


def test_summarize_without_plain_gives_no_ratio():
    s = results.summarize({"w": {"plain": case([], digest=None, status="failed"), "shim": case([1.0] * 10)}})
    assert s["w"]["plain"]["status"] == "failed"
    assert "ratio" not in s["w"]["shim"] and s["w"]["shim"]["median_ms"] == 1.0


def test_goals_judged_with_margins():
    rows = {r["goal"]: r for r in fake_doc()["goals"]}
    ee = rows["entry/exit counter"]  # vecadd 1.02, torch_eager 1.02: both met
    assert ee["status"] == "met" and ee["value"] == pytest.approx(1.02)
    mc = rows["memory-access counter"]  # vecadd 1.2 met, torch_eager timed out: not everywhere
    assert mc["status"] == "not measured everywhere" and "torch_eager" in mc["scope"]
    tr = rows["full memory trace"]  # worst 5.0x against 2x: missed by 150%
    assert (tr["status"], tr["where"]) == ("missed", "vecadd") and tr["over_by"] == pytest.approx(1.5)
    shim = rows["shim only, per launch"]  # three rounds decide nothing
    assert (shim["status"], shim["value"], shim["spread"]) == ("too few pairs (3)", 90.0, [50.0, 200.0])
    jit = rows["JIT of a 1,000-instruction kernel"]
    assert jit["status"] == "missed" and jit["over_by"] == pytest.approx(51.0) and "mem_count" in jit["where"]


paired = importlib.import_module("paired")


@pytest.mark.parametrize("values, target, want", [
    ([1.0, 1.01, 1.02] * 4, 1.03, "met"),
    ([1.0, 1.01, 1.04] * 4, 1.03, "undecided"),       # the median meets it, one round does not
    ([1.05, 1.2, 1.04] * 4, 1.03, "missed"),
    ([1.0] * 9, 1.03, "too few pairs (9)"),
])
def test_a_paired_goal_is_met_only_when_its_whole_spread_is(values, target, want):
    spread = paired.ratios([1.0] * len(values), values)
    assert paired.verdict(spread, target) == want


def test_paired_rounds_skip_lost_processes_and_take_the_median_of_the_rounds():
    r = paired.ratios([2.0, 4.0, None, 2.0], [3.0, 4.0, 5.0, None])
    assert (r["pairs"], r["values"], r["median"], r["min"], r["max"]) == (2, [1.5, 1.0], 1.25, 1.0, 1.5)
    d = paired.differences([100.0, 90.0, 110.0], [80.0, 100.0, 150.0])
    assert (d["median"], d["min"], d["max"]) == (10.0, -20.0, 40.0)
    assert paired.ratios([], []) == {"pairs": 0, "values": []}


def test_the_shim_goal_is_undecided_when_its_rounds_cross_it():
    """The published case: a median of -19 ns over rounds from -697 to +1,142 ns met nothing."""
    added = [-697.0, -19.0, 1142.0, -300.0, 50.0, -19.0, 400.0, -100.0, -19.0, 20.0, -50.0]
    plain = [4000.0] * len(added)
    shim = {"cases": {"plain": {"enqueue_ns": {"runs": plain}},
                      "shim": {"enqueue_ns": {"runs": [p + a for p, a in zip(plain, added)], "added_median": -19.0}}}}
    row = next(r for r in results.goals({}, shim, None) if r["goal"] == "shim only, per launch")
    assert (row["status"], row["value"], row["spread"]) == ("undecided", -19.0, [-697.0, 1142.0])


def test_a_host_bound_workload_is_judged_on_its_paired_rounds():
    cases = fake_cases()
    cases["torch_eager"]["plain"]["rounds_ms"] = [20.0, 22.0, None] + [20.0] * 9
    cases["torch_eager"]["entry_exit"]["rounds_ms"] = [20.4, 22.0, 21.0] + [20.2] * 9
    s = results.summarize(cases)["torch_eager"]["entry_exit"]
    assert (s["pairs"], s["ratio"], s["spread"]) == (11, pytest.approx(1.01), [1.0, pytest.approx(1.02)])
    assert results.cell(s) == "1.01x (1.00-1.02, 11 pairs)"
    cases["torch_eager"]["entry_exit"]["rounds_ms"][5] = 21.0  # one round at 1.05x
    summary = results.summarize(cases)
    row = next(r for r in results.goals(summary, None, None) if r["goal"] == "entry/exit counter")
    assert row["status"] == "undecided" and row["spread"][1] == pytest.approx(1.05)
    cases["torch_eager"]["entry_exit"]["rounds_ms"] = [20.4, 22.0]
    row = next(r for r in results.goals(results.summarize(cases), None, None) if r["goal"] == "entry/exit counter")
    assert row["status"] == "too few pairs (2)" and "too few pairs: torch_eager" in row["scope"]


def test_goals_without_measurements():
    rows = results.goals({}, None, None)
    assert [r["status"] for r in rows] == ["not measured"] * 6


@pytest.mark.parametrize("summary, want", [
    ({"ratio": 1.0123, "n": 10, "status": "ok"}, "1.01x"),
    ({"ratio": 4.0, "n": 3, "status": "ok", "same_output": False}, "4.00x (n=3) †"),
    ({"ratio": 9.0, "n": 2, "status": "timeout"}, "9.00x (n=2) timeout"),
    ({"n": 0, "status": "timeout"}, "timeout"),
    ({"n": 0, "status": "ok"}, "no runs"),
    (None, "—"),
])
def test_cell(summary, want):
    assert results.cell(summary) == want


def test_markdown_report():
    md = results.markdown(fake_doc())
    lines = md.splitlines()
    header = next(ln for ln in lines if ln.startswith("| workload | uninstrumented"))
    assert header.count("|") == 8  # workload + six modes (torch_profiler appears: torch_eager has it)
    assert "| vecadd | 10000.0 µs / launch | 1.01x | 1.02x | 1.20x | 5.00x (n=3) | — |" in lines
    assert "| torch_eager | 20000.0 µs / training step | 1.00x † | 1.02x | timeout | 1.50x | 1.25x |" in lines
    assert any(ln.startswith("| full memory trace | ≤ 2.0x | 5.000x | 1.500x .. 5.200x | vecadd")
               and ln.endswith("missed by 150% |")
               for ln in lines)
    assert any(ln.startswith("| JIT of a 1,000-instruction kernel | < 100 ms | 151.0 ms | — |")
               and "missed by 51.0 ms" in ln for ln in lines)
    assert "| shim | 3900.0 | 3790.0 | +90.0 |" in lines
    assert "pinned to CPU 1;" in md
    assert "| vecadd | lane records | 1,000 | 0 | — | 2.00 GB/s | 40.0 GB/s |" in lines
    assert "| vecadd | warp records | 40 | 0 | 1,000 | — | — |" in lines   # its run counted no drain
    assert "| attach | 1.0 (2.0) | 5.0 (6.0) |" in lines
    assert "| mem_count | 3.0 ms | 8.0 ms | 140.0 ms | 151.0 ms | 9459 |" in lines
    doc = {**fake_doc(), "trace": {"vecadd": {"mem_trace": {"records": 200, "drops": 800, "streamed": True}}}}
    assert "vecadd: the full trace delivered 200 of 1,000 records (20.0%) into the trace file" in results.notes(doc)[0]
    assert "torch_eager / mem_count: timeout" in md
    assert "torch_eager / shim: the output differs" in md
    for p in results.PUBLISHED:
        assert p["source"] in md
    assert_tables_whole(md)


def assert_tables_whole(md):
    """Every table row of ``md`` has as many cells as its header."""
    tables, current = [], []
    for ln in md.splitlines() + [""]:
        if ln.startswith("|"):
            current.append(ln.count("|"))
        elif current:
            tables.append(current)
            current = []
    assert tables and all(len(set(t)) == 1 for t in tables), tables


def test_markdown_with_parts_skipped():
    doc = fake_doc()
    doc.update(jit={"error": "no nvcc"}, shim={"error": "bench_shim: boom"}, hot_swap={"skipped": "no session"},
               trace={}, modules=[])
    doc["goals"] = results.goals(doc["summary"], None, None)
    md = results.markdown(doc)
    assert "Not measured: no nvcc" in md and "Not measured: bench_shim: boom" in md and "Skipped: no session" in md


# ---- part runs combined (bench/combine.py) -----------------------------------------------------------

combine = importlib.import_module("combine")
SKIPPED = {"skipped": "not selected on the command line"}


def part_run(path, date, cases, parts=False, log=True):
    """A part run's JSON at ``path`` as suite.main writes it, measuring ``cases`` and the parts when ``parts``,
    its log beside it unless ``log`` is False."""
    fake = fake_doc()
    doc = {"meta": {"commit": path.stem[:4] * 10, "dirty": False, "gpu": "H200", "driver": "580", "date": date,
                    "log": "gpu-test.log", "reps": 10},
           "cases": cases, **{p: fake[p] if parts else SKIPPED for p in ("jit", "shim", "hot_swap")}}
    results.complete(doc)
    path.write_text(json.dumps(doc))
    if log:
        path.with_suffix(".log").write_text("suite: the run's lines\n")
    return str(path)


def past_budget(modes):
    return {m: case([], digest=None, status="skipped (time budget)") for m in modes}


def slower(modes, by):
    """The same records with every instrumented mode ``by`` times slower."""
    return {m: r if m == "plain" else {**r, "unit_ms": [v * by for v in r["unit_ms"]]} for m, r in modes.items()}


def test_combine_takes_each_cell_from_the_newest_run_that_ran_it(tmp_path):
    cases = fake_cases()
    old = part_run(tmp_path / "old.json", "2026-12-02T05:00:00Z", cases, parts=True)
    new = part_run(tmp_path / "new.json", "2026-12-04T17:00:00Z",
                   {"vecadd": slower(cases["vecadd"], 1.1), "torch_eager": past_budget(cases["torch_eager"])})
    doc = combine.combine([combine.load(new), combine.load(old)], tmp_path)
    assert list(doc["cases"]) == ["vecadd", "torch_eager"]
    assert doc["summary"]["vecadd"]["shim"]["ratio"] == pytest.approx(1.01 * 1.1)   # the newer run's
    # the older run's: the newer one skipped it
    assert doc["summary"]["torch_eager"]["entry_exit"]["ratio"] == pytest.approx(1.02)
    assert {r["run"]["json"] for r in doc["cases"]["vecadd"].values()} == {str(tmp_path / "new.json")}
    assert {r["run"]["json"] for r in doc["cases"]["torch_eager"].values()} == {str(tmp_path / "old.json")}
    # goals over the cases kept: the entry/exit counter's worst is the newer vecadd's, no longer torch_eager's
    assert doc["goals"] == results.goals(doc["summary"], doc["shim"], doc["jit"])
    entry = next(r for r in doc["goals"] if r["goal"] == "entry/exit counter")
    assert (entry["where"], entry["value"]) == ("vecadd", pytest.approx(1.02 * 1.1))
    assert [r["gave"] for r in doc["meta"]["runs"]] == [["vecadd"], ["torch_eager", "jit", "shim", "hot_swap"]]


def test_combine_keeps_an_older_runs_other_modes_each_against_its_own_runs_plain(tmp_path):
    """A newer run of plain + one mode: the older run's other cells stay, each with its ratio, digest and
    paired rounds against its own run's plain (the two plains differ, so a wrong one shows), and the table
    says which run each came from."""
    old_cases = fake_cases()
    old_cases["torch_eager"]["plain"]["rounds_ms"] = [20.0] * 10
    old_cases["torch_eager"]["entry_exit"]["rounds_ms"] = [20.4] * 10
    old = part_run(tmp_path / "old.json", "2026-12-02T05:00:00Z", old_cases, parts=True)
    new_cases = {"vecadd": {"plain": case([20.0] * 10, digest="n"),
                            "mem_trace": case([60.0] * 10, digest="n", trace={"records": 2000, "drops": 0}, units=100)},
                 "torch_eager": {"plain": case([40.0] * 10, digest="n", rounds_ms=[40.0] * 10),
                                 "mem_trace": case([80.0] * 10, digest="n", trace={"records": 7, "drops": 0}, units=3,
                                                   rounds_ms=[80.0] * 10)}}
    new = part_run(tmp_path / "new.json", "2026-12-04T17:00:00Z", new_cases)
    doc = combine.combine([combine.load(new), combine.load(old)], tmp_path)
    vecadd, eager = doc["summary"]["vecadd"], doc["summary"]["torch_eager"]
    assert vecadd["plain"]["median_ms"] == 20.0 and eager["plain"]["median_ms"] == 40.0   # the newer run's
    assert vecadd["mem_trace"]["ratio"] == pytest.approx(3.0) and vecadd["mem_trace"]["probe_checked"]
    assert vecadd["shim"]["ratio"] == pytest.approx(1.01) and vecadd["mem_count"]["ratio"] == pytest.approx(1.2)
    assert all(vecadd[m]["same_output"] for m in ("shim", "entry_exit", "mem_count", "mem_trace"))
    # mem_count's full-trace partner computed another output ("n"): no witness, so 10 vs 20 per unit is no failure
    assert vecadd["entry_exit"]["probe_checked"] and vecadd["mem_count"]["probe_checked"]
    assert eager["entry_exit"]["pairs"] == 10 and eager["entry_exit"]["ratio"] == pytest.approx(1.02)
    assert eager["mem_trace"]["pairs"] == 10 and eager["mem_trace"]["ratio"] == pytest.approx(2.0)
    assert doc["cases"]["vecadd"]["shim"]["base"] == old_cases["vecadd"]["plain"]
    assert "base" not in doc["cases"]["vecadd"]["mem_trace"] and "base" not in doc["cases"]["vecadd"]["plain"]
    assert {m: r["run"]["json"] for m, r in doc["cases"]["vecadd"].items()} == {
        "plain": new, "shim": old, "entry_exit": old, "mem_count": old, "mem_trace": new}
    assert [r["gave"] for r in doc["meta"]["runs"]] == [
        ["vecadd (plain, mem_trace)", "torch_eager (plain, mem_trace)"],
        ["vecadd (shim, entry_exit, mem_count)", "torch_eager (shim, entry_exit, mem_count, torch_profiler)",
         "jit", "shim", "hot_swap"]]
    assert all(doc[p]["run"]["json"] == old for p in ("jit", "shim", "hot_swap"))
    md = results.markdown(doc)
    link = {p: f"[{results.run_label(json.loads(Path(p).read_text())['meta'] | {'commit': Path(p).stem * 10})}]"
               f"({Path(p).name})" for p in (new, old)}
    assert (f"| vecadd | 20000.0 µs / launch | 1.01x | 1.02x | 1.20x | 3.00x | — | {link[new]}; "
            f"shim, entry_exit, mem_count: {link[old]} |") in md
    assert_tables_whole(md)
    # the same cells taken from the older run whole give what its own report gave
    alone = combine.combine([combine.load(old)], tmp_path)["summary"]
    assert all(vecadd[m] == alone["vecadd"][m] for m in ("shim", "entry_exit", "mem_count"))


def test_combine_keeps_an_older_measured_cell_before_a_newer_attempt_with_no_ratio(tmp_path):
    """A newer timeout does not replace an older ratio, and the notes name it; where no older run measured
    the mode, the newer attempt shows as it ended; a mode only another run's budget skipped is not shown."""
    cases = fake_cases()
    cases["vecadd"]["torch_profiler"] = case([], digest=None, status="skipped (time budget)")
    old = part_run(tmp_path / "old.json", "2026-12-02T05:00:00Z", cases)
    new = part_run(tmp_path / "new.json", "2026-12-04T17:00:00Z",
                   {"vecadd": {"plain": case([20.0] * 10), "mem_count": case([], digest=None, status="timeout"),
                               "mem_trace_warp": case([], digest=None, status="timeout")}})
    doc = combine.combine([combine.load(new), combine.load(old)], tmp_path)
    vecadd = doc["summary"]["vecadd"]
    assert vecadd["mem_count"]["ratio"] == pytest.approx(1.2)
    assert doc["cases"]["vecadd"]["mem_count"]["run"]["json"] == old
    assert vecadd["mem_trace_warp"]["status"] == "timeout" and "ratio" not in vecadd["mem_trace_warp"]
    label = results.run_label(doc["meta"]["runs"][0])
    assert (f"vecadd / mem_count: a newer attempt (run {label}) has no ratio (run: timeout); the ratio shown is the "
            f"run {results.run_label(doc['meta']['runs'][1])}'s") in doc["notes"]
    assert "vecadd / mem_trace_warp: timeout" in doc["notes"]
    assert "torch_profiler" not in doc["cases"]["vecadd"]


def test_combine_keeps_an_older_measured_part_before_a_newer_skip(tmp_path):
    cases = fake_cases()
    old = part_run(tmp_path / "old.json", "2026-12-01T00:00:00Z", cases, parts=True)
    new = part_run(tmp_path / "new.json", "2026-12-03T00:00:00Z", cases)   # jit and shim as {"error"}, hot_swap skipped
    doc = combine.combine([combine.load(old), combine.load(new)], tmp_path)
    assert all(doc[p]["run"]["json"] == str(tmp_path / "old.json") for p in ("jit", "shim", "hot_swap"))
    assert doc["jit"]["probes"] == fake_doc()["jit"]["probes"] and "cases" in doc["shim"]
    assert all(r["run"]["json"] == str(tmp_path / "new.json") for r in doc["cases"]["vecadd"].values())
    newer = part_run(tmp_path / "newer.json", "2026-12-04T00:00:00Z", {}, parts=True)
    doc = combine.combine([combine.load(p) for p in (old, new, newer)], tmp_path)
    assert doc["hot_swap"]["run"]["json"] == str(tmp_path / "newer.json")
    none = combine.combine([combine.load(new)], tmp_path)
    assert none["jit"] == {"error": "measured in none of the runs combined"} and "Skipped: measured in none" in \
        results.markdown(none)


def test_combine_records_each_cases_run_and_links_it_in_the_report(tmp_path):
    run_dir, out = tmp_path / "gpu-results", tmp_path / "docs"
    run_dir.mkdir()
    path = part_run(run_dir / "call2-suite.json", "2026-12-04T16:44:28Z", fake_cases(), parts=True, log=False)
    (run_dir / "call2-suite.md").write_text("# its report\n")
    (run_dir / "call2.log").write_text("suite: ...\n")
    doc = combine.combine([combine.load(f"{path}={run_dir / 'call2.log'}")], out)
    source = {"commit": "call" * 10, "dirty": False, "gpu": "H200", "driver": "580", "date": "2026-12-04T16:44:28Z",
              "json": path, "log": str(run_dir / "call2.log"), "report": str(run_dir / "call2-suite.md")}
    assert doc["cases"]["torch_eager"]["mem_count"]["run"] == source == doc["shim"]["run"]
    assert doc["meta"]["runs"][0]["links"] == {"json": "../gpu-results/call2-suite.json",
                                               "log": "../gpu-results/call2.log",
                                               "report": "../gpu-results/call2-suite.md"}
    md = results.markdown(doc)
    link = "[2026-12-04 16:44 callcal](../gpu-results/call2-suite.md)"
    assert "| vecadd | 10000.0 µs / launch | 1.01x | 1.02x | 1.20x | 5.00x (n=3) | — | " + link + " |" in md
    assert md.count(f"From the run {link}.") == 3   # JIT, hot swap, shim
    assert "combined: 1 run, each cell from the newest that ran it" in md
    assert "| clean | H200, 580 | vecadd, torch_eager, jit, shim, hot_swap |" in md
    assert_tables_whole(md)
    combine.main([str(out), f"{path}={run_dir / 'call2.log'}"])
    assert (out / "suite.md").read_text() == md and json.loads((out / "suite.json").read_text()) == doc


def test_a_run_from_before_the_probe_checks_gives_no_probe_ratio(tmp_path):
    """Its records may satisfy today's checks or not: it never proved its probes ran, so no ratio."""
    path = tmp_path / "old.json"
    part_run(path, "2026-12-02T05:38:22Z", fake_cases())
    doc = json.loads(path.read_text())
    for modes in doc["summary"].values():
        for s in modes.values():
            s.pop("probe_checked", None)
    path.write_text(json.dumps(doc))
    combined = combine.combine([combine.load(str(path))], tmp_path)
    vecadd = combined["summary"]["vecadd"]
    assert vecadd["shim"]["ratio"] == pytest.approx(1.01)   # not a probe cell
    assert all("ratio" not in vecadd[m] and vecadd[m]["probe_checked"] is False for m in ("entry_exit", "mem_count"))
    assert vecadd["entry_exit"]["probe_check"] == "its run predates the probe checks"
    md = results.markdown(combined)
    failed = " | ".join(["probe check failed"] * 3)
    assert f"| vecadd | 10000.0 µs / launch | 1.01x | {failed} |" in md
    assert "(before the probe checks)" in md


def test_combine_refuses_a_run_it_cannot_read_naming_the_file(tmp_path):
    good = part_run(tmp_path / "good.json", "2026-12-04T00:00:00Z", fake_cases())
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[]")
    (tmp_path / "nodate.json").write_text(json.dumps({"meta": {}, "cases": {}}))
    (tmp_path / "cases.json").write_text(json.dumps({"meta": {"date": "d"}, "cases": {"vecadd": []}}))
    nolog = part_run(tmp_path / "nolog.json", "2026-12-04T00:00:00Z", fake_cases(), log=False)
    for args, why in (([str(tmp_path / "gone.json")], "gone.json: cannot read it"),
                      ([str(tmp_path / "bad.json")], "bad.json: cannot read it: Expecting"),
                      ([str(tmp_path / "list.json")], "list.json: not a suite run's JSON: not a JSON object"),
                      ([str(tmp_path / "nodate.json")], "nodate.json: not a suite run's JSON: no meta.date"),
                      ([str(tmp_path / "cases.json")], "cases.json: not a suite run's JSON: no cases"),
                      ([nolog], "nolog.json: no log at .*nolog.log"),
                      ([good, good], "good.json: given twice")):
        with pytest.raises(SystemExit, match=f"^combine.py: .*{why}"):
            combine.main([str(tmp_path / "out"), *args])


def test_plots_written(tmp_path):
    pytest.importorskip("matplotlib")
    plots = importlib.import_module("plots")
    (tmp_path / "suite.json").write_text(json.dumps(fake_doc()))
    paths = plots.draw(tmp_path / "suite.json")
    assert [p.name for p in paths] == ["overhead.png", "jit.png", "shim.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)


def test_plots_skip_missing_parts(tmp_path):
    pytest.importorskip("matplotlib")
    plots = importlib.import_module("plots")
    (tmp_path / "suite.json").write_text(json.dumps({"summary": {}, "jit": {"error": "x"}, "shim": {"error": "y"}}))
    assert plots.draw(tmp_path / "suite.json") == []


# ---- the runner on stand-in programs ----------------------------------------------------------------

@pytest.fixture(scope="module")
def suite():
    return importlib.import_module("suite")


def test_run_case_ok_failed_and_timeout(suite, tmp_path):
    py = sys.executable
    ok = suite.run_case([py, "-c", "print('BENCH_WARMUP 5'); print('BENCH_REP 1.5 3'); print('BENCH_DONE ab')"], {}, 30)
    assert (ok["status"], ok["unit_ms"], ok["digest"]) == ("ok", [0.5], "ab")
    bad = suite.run_case([py, "-c", "import sys; print('BENCH_REP 1'); sys.exit('boom')"], {}, 30)
    assert bad["status"] == "failed" and bad["error"] == "exit 1: boom"
    # cut short: what it printed before the kill is kept, its child is killed with it
    slow = suite.run_case([py, "-c", "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
                           "'import time; time.sleep(60)']); print('BENCH_REP 2', flush=True); time.sleep(60)"], {}, 2)
    assert slow["status"] == "timeout" and slow["unit_ms"] == [2.0] and slow["wall_s"] < 30
    cpu = min(os.sched_getaffinity(0))
    show = "import os; print('BENCH_REP 1 1'); print('BENCH_DONE', *os.sched_getaffinity(0))"
    pinned = suite.run_case([py, "-c", show], {}, 30, {cpu})
    assert (pinned["status"], pinned["digest"]) == ("ok", str(cpu))


def test_fixed_layout_turns_randomization_off_in_the_case_and_its_children(suite, monkeypatch):
    """SUITE_FIXED_LAYOUT's experiment: the case's process and a child of it run with ADDR_NO_RANDOMIZE set
    and PYTHONHASHSEED 0; without it, neither (the default)."""
    show = ("import os, subprocess, sys; child = subprocess.run(['cat', '/proc/self/personality'], "
            "capture_output=True, text=True).stdout.strip(); print('BENCH_REP 1 1'); "
            "print('BENCH_DONE', child, os.environ.get('PYTHONHASHSEED'))")
    monkeypatch.setattr(suite, "FIXED_LAYOUT", True)
    fixed = suite.run_case([sys.executable, "-c", show], {}, 30)
    monkeypatch.setattr(suite, "FIXED_LAYOUT", False)
    default = suite.run_case([sys.executable, "-c", show], {}, 30)
    flag = lambda digest: int(digest.split()[0], 16) & suite.ADDR_NO_RANDOMIZE   # noqa: E731
    assert fixed["status"] == default["status"] == "ok", (fixed, default)
    assert flag(fixed["digest"]) and fixed["digest"].split()[1] == "0"
    assert not flag(default["digest"]) and default["digest"].split()[1] == "None"


def test_a_case_past_its_time_leaves_the_stacks_of_its_threads(suite):
    """A hung case's stderr keeps where each of its threads waited (SIGABRT to Python's fault handler, as
    base_env turns it on) before it is killed: what tells a slow drain from a deadlock on the GPU."""
    hang = ("import threading, time\n"
            "def ring_reader(): time.sleep(60)\n"
            "threading.Thread(target=ring_reader, daemon=True).start()\n"
            "def waits_for_the_gpu(): time.sleep(60)\n"
            "print('BENCH_WARMUP 1', flush=True); waits_for_the_gpu()\n")
    rec = suite.run_case([sys.executable, "-c", hang], {"PYTHONFAULTHANDLER": "1"}, 2)
    assert rec["status"] == "timeout" and rec["warmup_ms"] == 1.0
    assert rec["wall_s"] < 2 + suite.ABORT_GRACE_S + suite.STACKS_S
    assert "Fatal Python error: Aborted" in rec["stderr_tail"]
    assert "in ring_reader" in rec["stderr_tail"] and "in waits_for_the_gpu" in rec["stderr_tail"]
    assert suite.base_env(Path("/tmp"))["PYTHONFAULTHANDLER"] == "1"
    # and, where a debugger is on the PATH, where those threads wait in C: both sleeping in the kernel
    if shutil.which("cuda-gdb") or shutil.which("gdb"):
        native = rec["stderr_tail"].split("== native stacks of pid ", 1)[1]
        assert native.count("\nThread ") == 2 and native.count("sleep") >= 2, native


def test_session_pids_are_the_processes_of_a_session(suite):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        assert suite.session_pids(child.pid) == [child.pid]
        assert os.getpid() not in suite.session_pids(child.pid)
    finally:
        child.kill()
        child.wait()


def test_a_terminated_bench_kills_the_case_it_waits_for(tmp_path):
    """`timeout` on a bench sends SIGTERM to the bench alone; the case it runs (its own session) must
    not outlive it and take the CPUs and the GPU from the next bench."""
    pid_file = tmp_path / "case.pid"
    bench = subprocess.Popen([sys.executable, "-c", f"""
import sys; sys.path.insert(0, {str(BENCH)!r}); import suite
suite.exit_on_term()
case = "import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
suite.run_case([sys.executable, "-c", case], {{}}, 60)
"""])
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    case = int(pid_file.read_text())
    bench.terminate()
    assert bench.wait(timeout=30) == 128 + signal.SIGTERM
    while time.monotonic() < deadline:
        try:
            os.kill(case, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    pytest.fail(f"the case (pid {case}) outlived its terminated bench")


def test_facts_from_dumps(suite):
    docs = [{"timing": {"probes_ms": 4.0},
             "modules": [{"image": "fatbin compute_90", "status": "instrumented",
                          "timing": {"rewrite_ms": 2.0, "driver_ms": 9.0},
                          "kernels": [["a", "instrumented", ""], ["b", "untouched", ""]]},
                         {"image": "cubin", "status": "SASS only", "timing": {}, "kernels": []}],
             "probes": [{"maps": [{"values": [b"\0" * 8]}, {"records": [b"r1", b"r2"], "drops": 5}]}]},
            {"modules": [], "probes": [{"maps": [{"records": [b"r3"], "drops": 1}]}],
             "stats": {"launches": 10, "python_calls": 4},
             "sass": {"state": "subscribed", "error": "", "serving": "", "launches": 7, "probed": 0}}]
    docs[0]["stats"] = {"launches": 5, "python_calls": 1}
    assert suite.facts_from_dumps(docs) == {
        "modules": [{"image": "fatbin compute_90", "status": "instrumented", "probes_ms": 4.0, "kernels": 1,
                     "rewrite_ms": 2.0, "driver_ms": 9.0}],
        "trace": {"records": 3, "drops": 6, "streamed": False}, "shim_stats": {"launches": 15, "python_calls": 5},
        "sass": {"states": ["subscribed"], "launches": 7, "probed": 0}, "counts": [[[0], None]]}


def test_facts_from_dumps_of_a_streamed_trace(suite):
    """egpu-run --trace: the records the file got and the probes' drops, not the rings' leftovers at exit."""
    docs = [{"trace": {"path": "t.parquet", "records": 70, "dropped": 2, "error": None},
             "probes": [{"maps": [{"records": [b"r1"], "drops": 0}]}]},
            {"trace": {"path": "t.9.parquet", "records": 30, "dropped": 0, "error": None}}]
    assert suite.facts_from_dumps(docs)["trace"] == {"records": 100, "drops": 2, "streamed": True}
    # each process's drain pace kept beside them
    docs[1]["trace"]["drain"] = {"passes": 3, "copy_s": 0.5}
    assert suite.facts_from_dumps(docs)["trace"] == {"records": 100, "drops": 2, "streamed": True,
                                                     "drain": [{"passes": 3, "copy_s": 0.5}]}


@pytest.mark.parametrize("name, modes", [
    ("vecadd", ["plain", "shim", "entry_exit", "mem_count", "mem_trace_warp", "mem_trace"]),
    ("torch_eager", ["plain", "shim", "entry_exit", "mem_count", "mem_trace_warp", "mem_trace", "torch_profiler"]),
])
def test_case_commands(suite, name, modes, tmp_path):
    probes = {m: tmp_path / f"{m}.bpf.o" for m in suite.PROBES}
    assert suite.modes_for(name) == modes
    exe = tmp_path / "kernels"
    for mode in modes:
        cmd = suite.case_cmd(name, mode, exe, probes)
        wrapped = mode not in ("plain", "torch_profiler")
        assert ("--keep" in cmd) == wrapped
        assert [a for a in cmd if a.endswith(".bpf.o")] == ([str(probes[mode])] if mode in probes else [])
        assert ("--profile" in cmd) == (mode == "torch_profiler")
        assert cmd[cmd.index("--trace") + 1:][:1] == [str(tmp_path / "trace.arrow")] if mode.startswith("mem_trace") \
            else "--trace" not in cmd
        base = suite.workload_cmd(name, exe, profile=mode == "torch_profiler")
        assert cmd[-len(base):] == base and name in base and str(suite.REPS) in base


def test_suite_parts_and_rounds(suite, monkeypatch):
    assert suite.selected([]) == (list(suite.WORKLOADS), True)
    assert suite.selected(["torch_eager"]) == (["torch_eager"], False)
    assert suite.selected(["gemm", "parts", "vecadd"]) == (["vecadd", "gemm"], True)
    with pytest.raises(SystemExit, match="unknown part 'resnet'"):
        suite.selected(["resnet"])
    assert suite.rounds_of("gemm") == [suite.modes_for("gemm")]
    eager = suite.rounds_of("torch_eager")
    assert len(eager) == suite.PAIRS and eager[0] == suite.modes_for("torch_eager")
    assert all(r == ["plain", "shim", "entry_exit", "mem_count", "torch_profiler"] for r in eager[1:])
    monkeypatch.setattr(suite, "TRACE_PAIRS", True)
    assert suite.rounds_of("torch_eager") == [suite.modes_for("torch_eager")] * suite.PAIRS
    ok = {"status": "ok", "unit_ms": [3.0, 1.0, 2.0]}
    assert suite.round_ms(ok) == 2.0 and suite.round_ms({**ok, "trace": {"records": 9, "drops": 0}}) == 2.0
    assert suite.round_ms({**ok, "trace": {"records": 9, "drops": 1}}) is None
    assert suite.round_ms({**ok, "status": "timeout"}) is None and suite.round_ms({**ok, "unit_ms": []}) is None


def test_shim_summary_pairs_rounds():
    bench_shim = importlib.import_module("bench_shim")
    rounds = [{"plain": {"enqueue_ns": 3800.0, "wall_ns": 4000.0}, "shim": {"enqueue_ns": 3850.0, "wall_ns": 4100.0}},
              {"plain": {"enqueue_ns": 4200.0, "wall_ns": 4400.0}, "shim": {"enqueue_ns": 4260.0, "wall_ns": 4420.0}},
              {"plain": {"enqueue_ns": 3600.0, "wall_ns": 3800.0}, "shim": {"enqueue_ns": 3900.0, "wall_ns": 3900.0}}]
    s = bench_shim.summarize(rounds)
    assert s["plain"]["enqueue_ns"]["median"] == 3800.0 and "added_median" not in s["plain"]["enqueue_ns"]
    # paired: 50, 60, 300 -> 60; unpaired medians would say 3900 - 3800 = 100
    assert s["shim"]["enqueue_ns"]["added_median"] == 60.0 and s["shim"]["enqueue_ns"]["min"] == 3850.0
    assert (s["shim"]["enqueue_ns"]["added_min"], s["shim"]["enqueue_ns"]["added_max"]) == (50.0, 300.0)
    assert (s["shim"]["goal"], s["shim"]["meets_goal"]) == ("too few pairs (3)", False)
    ten = rounds * 3 + rounds[:1]
    assert bench_shim.summarize(ten)["shim"]["goal"] == "undecided"   # a round at +300 against 100
    under = [{"plain": r["plain"], "shim": {**r["shim"], "enqueue_ns": r["plain"]["enqueue_ns"] + 60}} for r in ten]
    assert bench_shim.summarize(under)["shim"]["meets_goal"] is True


def test_shim_bench_times_the_launch_probe_again_with_a_spare_cpu(monkeypatch, tmp_path):
    """measure: plain and launch_probe run a second time on two CPUs, paired with each other, and the
    fraction of launches the probe counted comes from egpu-run's JSON (its ``launches`` map)."""
    bench_shim = importlib.import_module("bench_shim")

    def fake_subprocess_run(cmd, env, capture_output, text, timeout, cwd, preexec_fn):
        loop = {"mode": "plain", "launches": 9000, "enqueue_ns": 4000.0, "wall_ns": 4100.0}
        out = json.dumps(loop) + "\n"
        if "-p" in cmd:
            loop["enqueue_ns"] = 4030.0
            maps = {"launches": {"kind": "map", "entries": [{"key": 1, "value": 4000}, {"key": 2, "value": 1000}]}}
            out = json.dumps(loop) + "\n" + json.dumps({"time": 1.0, "maps": maps}) + "\n"
        return subprocess.CompletedProcess(cmd, 0, out, "")

    monkeypatch.setattr(bench_shim, "build", lambda work: work / "launch_loop")
    monkeypatch.setattr(bench_shim, "launch_probe", lambda work: work / "launch_count.bpf.o")
    monkeypatch.setattr(bench_shim.subprocess, "run", fake_subprocess_run)
    doc = bench_shim.measure(tmp_path, launches=9000, runs=3)
    assert set(doc["cases"]) == set(bench_shim.CASES)
    spare = doc["spare_cpu"]
    assert set(spare["cases"]) == {"plain", "launch_probe", "launch_probe_vm"}
    assert spare["cases"]["launch_probe"]["enqueue_ns"]["added_median"] == pytest.approx(30.0)
    seen = pytest.approx(5000 / (9000 + bench_shim.WARMUP))
    assert spare["launch_probe_seen"] == spare["launch_probe_vm_seen"] == seen
    assert "spare_cpu" not in bench_shim.measure(tmp_path, launches=9000, runs=1, cases=("plain", "shim"))


def test_alloc_bench_pairs_rounds_and_reads_the_goal_as_a_fraction(monkeypatch, tmp_path):
    """bench_alloc.measure on made-up runs: the added cost is the median per-round difference, and the
    goal (no measurable slowdown) is under 1% of a plain allocate + free."""
    bench_alloc = importlib.import_module("bench_alloc")
    plain, shim = iter([1000.0, 1004.0, 996.0]), iter([0.0, 1003.0, 1009.0, 1001.0])   # shim: a warm-up first

    def fake_run(cmd, env, cpu):
        return {"mode": "churn", "pair_ns": next(shim if "launcher" in " ".join(cmd) else plain)}

    monkeypatch.setattr(bench_alloc, "run", fake_run)
    doc = bench_alloc.measure(tmp_path, pairs=10, runs=3)
    assert doc["cases"]["shim"]["pair_ns"]["added_runs"] == [3.0, 5.0, 5.0]
    assert doc["cases"]["shim"]["pair_ns"]["added_median"] == 5.0
    assert doc["added_fraction"] == pytest.approx(5.0 / 1000.0)
    assert (doc["goal"], doc["meets_goal"]) == ("too few pairs (3)", False)
    plain = iter([1000.0] * 10)
    shim = iter([0.0] + [1005.0] * 9 + [1012.0])   # one round of ten at +1.2%
    doc = bench_alloc.measure(tmp_path, pairs=10, runs=10)
    assert doc["goal"] == "undecided" and doc["added_fraction_spread"] == [pytest.approx(0.005), pytest.approx(0.012)]


def warp_trace(path: Path, masks: list[int]) -> None:
    """A trace file as egpu-run --trace writes mem_trace_warp's ring: a record per mask, affine."""
    from egpu_preload.output import tracefile
    from egpu_preload.output import warp_records as wr
    writer = tracefile.TraceWriter(path, [("warp_events", tracefile.whole_records(wr.RECORD_TYPE))])
    ins = wr.Instruction(1, 2, 3, 4, 4, 1, 0, (0, 0, 0), (32, 1), 0)
    writer.add(0, [(0, wr.encode(wr.warp_record(ins, {i: 64 + 4 * i for i in wr.lanes_of(m)}))) for m in masks])
    writer.close({"warp_events": 0})


@pytest.mark.parametrize("damage, why", [
    (None, None),
    ("drop", "1 warp records dropped (2 delivered): a full trace counts only runs that drop none"),
    ("cut", "the warp records' lanes were not counted: "),
    ("more", "the warp records' lanes were not counted: the files hold 2 warp records, the job reported 3"),
])
def test_a_warp_traces_lanes_are_counted_from_its_file(suite, tmp_path, damage, why):
    """The lanes come from the file the case wrote, and only a whole, undropped warp trace stands for its
    accesses, checked against the counter's as the per-lane trace's records are."""
    pytest.importorskip("pyarrow")
    path = tmp_path / "trace.arrow"
    warp_trace(path, [0x7FFF, 0x7FFF0000])
    if damage == "cut":
        path.write_bytes(path.read_bytes()[:20])
    trace = {"records": 3 if damage == "more" else 2, "drops": 1 if damage == "drop" else 0, "streamed": True}
    suite.count_lanes(trace, [path])
    assert trace.get("lanes") == (None if damage in ("cut", "more") else 30)
    rec = case([1.0], trace=trace, units=10)
    got = probe_check.check_cell("vecadd", "mem_trace_warp", {"plain": case([1.0]), "mem_trace_warp": rec,
                                                               "mem_count": mem("mem_count", 30, 10)})
    assert got == why if not why or why.endswith(("none", "3")) else got.startswith(why)
    counter = probe_check.check_cell("vecadd", "mem_count", {"plain": case([1.0]), "mem_trace_warp": rec,
                                                              "mem_count": mem("mem_count", 30, 10)})
    assert counter is None   # a warp trace that does not stand refutes no counter
    if damage is None:   # a counter that saw another number per unit refutes it
        other = probe_check.check_cell("vecadd", "mem_trace_warp", {"plain": case([1.0]), "mem_trace_warp": rec,
                                                                     "mem_count": mem("mem_count", 40, 10)})
        assert other == "3 accesses per unit, mem_count saw 4"


def test_main_end_to_end_with_stand_ins(suite, tmp_path, monkeypatch):
    """main() with every measurement replaced: the JSON and the report come out whole."""
    monkeypatch.setattr(suite.subprocess, "run", lambda *a, **k: None)
    monkeypatch.setattr(suite.bench_jit, "probe_object", lambda src, pre, work: tmp_path / f"{Path(src).name}.bpf.o")
    monkeypatch.setattr(suite.bench_jit, "measure", lambda work: fake_doc()["jit"])
    monkeypatch.setattr(suite.bench_shim, "measure", lambda *a: fake_doc()["shim"])
    monkeypatch.setattr(suite, "hot_swap", lambda *a: (_ for _ in ()).throw(RuntimeError("no egpu attach here")))
    monkeypatch.setattr(suite, "meta", lambda: {"gpu": "stand-in"})

    def fake_run(cmd, env, timeout, cpus=None):
        """A run whose probes counted as a checked run must: 10 units, 2 threads and 3 accesses each."""
        probes = [Path(a).name.split(".")[0] for a in cmd if a.endswith(".bpf.o")]
        slow = 3.0 if "access_trace" in probes else 1.5 if "mem_trace_warp" in probes else 1.0
        counts = {"entry_exit": [[20, 20]], "mem_count": [[10, 20]], "launch_threads": [[20, 10]]}
        dropped = 30 if "gemm" in cmd and slow == 3.0 else 0   # gemm's full trace drops some
        trace = {"trace": {"records": 30 - dropped, "drops": dropped, "streamed": "--trace" in cmd}} if slow > 1 else {}
        if "mem_trace_warp" in probes:   # two warp records of 15 lanes in the file the suite counts lanes in
            trace["trace"]["records"] = 2
            warp_trace(Path(cmd[cmd.index("--trace") + 1]), [0x7FFF, 0xFFFE0000 >> 1])
        return {**case([10.0 * slow] * 10), **trace,
                "units": 10, "counts": [counts.get(p, [None]) for p in probes], "shim_stats": {"dropped": 0},
                "modules": [{"image": "ptx", "kernels": 3, "rewrite_ms": 1.0}] if "--keep" in cmd else []}
    monkeypatch.setattr(suite, "run_case", fake_run)
    monkeypatch.setattr(suite.sys, "argv", ["suite.py", str(tmp_path)])
    suite.main()
    doc = json.loads((tmp_path / "suite.json").read_text())
    assert set(doc["summary"]) == set(suite.WORKLOADS)
    assert doc["summary"]["vecadd"]["mem_trace"]["ratio"] == pytest.approx(3.0)
    gemm = doc["summary"]["gemm"]["mem_trace"]   # its drops make it no full trace: no ratio
    assert (gemm["records_delivered"], gemm["records_dropped"], gemm["probe_checked"]) == (0, 30, False)
    assert "ratio" not in gemm and gemm["unchecked_ratio"] == pytest.approx(3.0)
    assert "torch_profiler" in doc["summary"]["torch_eager"] and "torch_profiler" not in doc["summary"]["cupy"]
    assert doc["hot_swap"]["skipped"].startswith("hot swap: RuntimeError: no egpu attach here")
    assert doc["trace"]["vecadd"]["mem_trace"] == {"records": 30, "drops": 0, "streamed": True}
    assert all(doc["summary"][w][m]["probe_checked"] for w in suite.WORKLOADS for m in suite.PROBES
               if (w, m) != ("gemm", "mem_trace"))
    eager = doc["summary"]["torch_eager"]
    # every mode of the host-bound step in pairs, but the full traces: one round
    assert eager["entry_exit"]["pairs"] == eager["mem_count"]["pairs"] == suite.PAIRS == 10
    assert eager["mem_trace"]["pairs"] == 1
    assert doc["summary"]["gemm"]["mem_count"]["pairs"] is None
    mem = next(r for r in doc["goals"] if r["goal"] == "memory-access counter")
    trace = next(r for r in doc["goals"] if r["goal"] == "full memory trace")
    assert "too few pairs" not in mem["scope"] and "too few pairs: torch_eager" in trace["scope"], (mem, trace)
    assert len(doc["cases"]["torch_eager"]["shim"]["rounds_ms"]) == 10
    assert doc["cases"]["gemm"]["entry_exit"]["check_run"]["counts"][1] == [[20, 10]]
    assert len(doc["modules"]) == 6 * 5  # shim, entry_exit, mem_count, mem_trace, mem_trace_warp per workload
    assert doc["summary"]["vecadd"]["mem_trace_warp"]["ratio"] == pytest.approx(1.5)
    assert doc["trace"]["vecadd"]["mem_trace_warp"] == {"records": 2, "drops": 0, "streamed": True, "lanes": 30}
    md = (tmp_path / "suite.md").read_text()
    assert "| full memory trace | ≤ 2.0x | 3.000x |" in md and "Skipped: hot swap" in md


def test_module_timings_come_back_from_a_real_dump(suite, stub_job, probe_obj, tmp_path):
    """egpu-run on the stand-in driver: the runtime's dump gives each instrumented module its rewrite and
    driver times and the probes' load time, and run_case reads them."""
    env = stub_job.env(tmp_path / "log")
    # --in-kernel: a counter alone is counted at the launch, its module loaded as the application gave it (no times)
    rec = suite.run_case([*suite.egpu_run(), "--keep", "--in-kernel", "-p", str(probe_obj("count")),
                          str(stub_job.app), "module", "1", "32", "0"], env, 60)
    (mod,) = [m for m in rec["modules"] if m["status"] == "instrumented"]
    assert mod["kernels"] >= 1 and mod["rewrite_ms"] > 0 and mod["driver_ms"] >= 0 and mod["probes_ms"] > 0


def test_swap_latency_on_a_live_job(suite, stub_job, probe_obj, tmp_path):
    """The attach / swap / detach cycle against a job on the stand-in driver: the job's replies carry the
    flip time the report reads."""
    from egpu_preload.control import ControlClient
    from test_live import Job

    job = Job(stub_job, tmp_path)
    try:
        count = probe_obj("count").read_bytes()
        got = suite.swap_latency(ControlClient(job.pid, directory=job.dir, timeout=30), count, count, 0.0)
    finally:
        status, _, err = job.finish()
    assert status == 0, err
    assert got["cycles"] == 1
    for cmd in ("attach", "swap", "detach"):
        flip, trip = got["flip_ms"][cmd], got["round_trip_ms"][cmd]
        assert len(flip["runs"]) == 1 and 0 < flip["median"] <= trip["median"]


def sass_records(sass, **changed):
    """A record per bench_sass row that checks out (vecadd exact, torch_gpu's counters witnessed), ``changed``
    replacing some: what a clean GPU run of bench_sass.py would give its table."""
    t = sass.VECADD_THREADS
    ms = {"plain": 1.0, "ptx_entry_exit": 1.01, "ptx_entry_exit_in_kernel": 1.5, "sass_entry_exit": 1.05,
          "sass_entry_exit_in_kernel": 2.0, "ptx_mem_count": 2.0, "sass_mem_count": 2.5, "sanitizer_empty": 1.75,
          "sanitizer_empty_mem": 2.25,
          "torch_profiler": 1.2, "standby": 1.02, "unselected": 1.01, "entry_exit_empty": 1.55, "entry_exit": 1.04,
          "entry_exit_in_kernel": 1.6, "mem_count": 4.0, "entry_exit_witness": 9.0}
    out = {}
    for row in sass.ROWS:
        rec = case([ms[row.name]] * 5, units=10)
        if row.empty_patch:
            rec["tool_patched"] = 3
        elif row.workload == "vecadd" and "entry_exit" in row.probes:
            rec["counts"] = [[[10 * t, 10 * t]]]
        elif row.workload == "vecadd" and "mem_count" in row.probes:
            rec["counts"] = [[[20 * t, 10 * t]]]
        elif row.backend == "sass":
            idle = row.name in ("standby", "unselected") or row.counted
            rec["sass"] = {"states": ["subscribed"], "launches": 0 if idle else 40, "probed": 0 if idle else 40,
                           "modules_patched": 0 if idle else 12,
                           "modules_unselected": 12 if row.name == "unselected" or row.counted else 0}
            rec["counts"] = {"entry_exit": [[[500, 500]]], "entry_exit_in_kernel": [[[500, 500]]],
                             "mem_count": [[[70, 30]]], "entry_exit_witness": [[[500, 500]], [[500, 7]]]}.get(row.name)
            rec["shim_stats"] = {"dropped": 0}
        out[(row.workload, row.name)] = rec
    out.update(changed)
    return out


def test_sass_bench_table_takes_ratios_of_checked_rows_only():
    sass = importlib.import_module("bench_sass")
    doc = sass.table(sass_records(sass))
    assert {n: c["ratio"] for n, c in doc["vecadd"].items() if "ratio" in c} == \
        {"ptx_entry_exit": 1.01, "ptx_entry_exit_in_kernel": 1.5, "sass_entry_exit": 1.05,
         "sass_entry_exit_in_kernel": 2.0, "ptx_mem_count": 2.0, "sass_mem_count": 2.5, "sanitizer_empty": 1.75,
         "sanitizer_empty_mem": 2.25}
    assert {n: c["ratio"] for n, c in doc["torch_gpu"].items() if "ratio" in c} == \
        {"torch_profiler": 1.2, "standby": 1.02, "unselected": 1.01, "sanitizer_empty": 1.75, "entry_exit_empty": 1.55,
         "entry_exit": 1.04, "entry_exit_in_kernel": 1.6, "sanitizer_empty_mem": 2.25, "mem_count": 4.0}
    assert all(c["check"] is None for w in ("vecadd", "torch_gpu") for c in doc[w].values())
    assert doc["goals"] == {"torch_gpu entry_exit / plain": {"value": 1.04, "goal": 1.1, "met": True},
                            "torch_gpu mem_count / plain": {"value": 4.0, "goal": 2.0, "met": False},
                            "vecadd sass_mem_count / ptx_mem_count": {"value": 1.25, "goal": 1.5, "met": True}}


@pytest.mark.parametrize("where, change, why", [
    (("vecadd", "sass_mem_count"), {"counts": [[[20 << 24, 9 << 24]]]},
     "run: 335,544,320 loads and 150,994,944 stores for 10 launches (want 335,544,320, 167,772,160)"),
    (("vecadd", "sass_entry_exit"), {"digest": "x"}, "run: output x differs from the uninstrumented d"),
    (("torch_gpu", "unselected"), {"sass": {"states": ["subscribed"], "modules_patched": 3}},
     "unselected patched 3 modules"),
    (("torch_gpu", "entry_exit"), {"sass": {"states": ["subscribed"], "modules_patched": 2}},
     "entry_exit patched 2 modules"),   # counted at the launch: no kernel patched
    (("torch_gpu", "unselected"), {"sass": {"states": ["subscribed"], "modules_unselected": 0}},
     "no module was left unpatched: the probe's programs were never weighed against a kernel"),
    (("torch_gpu", "entry_exit_empty"), {"sass": {"states": ["subscribed"], "launches": 40, "probed": 0}},
     "no launch of a patched kernel got a record: the probes never ran"),
    (("vecadd", "sanitizer_empty"), {"tool_patched": 0}, "the empty patch tool patched no module"),
    (("torch_gpu", "sanitizer_empty_mem"), {"digest": "x"}, "run: output x differs from the uninstrumented d"),
    (("torch_gpu", "standby"), {"sass": {"states": ["failed"]}}, "the sanitizer was not subscribed (failed)"),
    (("torch_gpu", "entry_exit_witness"), {"counts": [[[400, 400]], [[500, 7]]]},
     "witness run: 400 entries for 500 launched threads (7 launches)"),
    (("torch_gpu", "mem_count"), {"counts": [[[0, 0]]]}, "the probe never ran (0 accesses)"),
    (("torch_gpu", "entry_exit"), {"status": "timeout"}, "run: timeout"),
])
def test_sass_bench_leaves_out_a_row_that_does_not_prove_itself(where, change, why):
    sass = importlib.import_module("bench_sass")
    records = sass_records(sass)
    records[where] = {**records[where], **change}
    doc = sass.table(records)
    shown = where if where[1] != "entry_exit_witness" else ("torch_gpu", "entry_exit")   # it checks entry_exit
    cell = doc[shown[0]][shown[1]]
    assert cell["check"] == why and "ratio" not in cell
    goal = {"entry_exit": "torch_gpu entry_exit / plain", "mem_count": "torch_gpu mem_count / plain",
            "sass_mem_count": "vecadd sass_mem_count / ptx_mem_count"}.get(shown[1])
    if goal:
        assert doc["goals"][goal] == {"value": None, "goal": sass.GOALS[goal], "met": None}


def test_sass_bench_runs_every_row_once_in_one_call(suite, tmp_path, monkeypatch):
    """main(): one process per row (plain without egpu-run, the others with their back end and prebuilt
    probes), the rows past the time budget skipped with the reason, the table written."""
    sass = importlib.import_module("bench_sass")
    for p in {p for r in sass.ROWS for p in r.probes}:
        (tmp_path / f"{p}.v3.bpf.o").write_bytes(b"")
    monkeypatch.setenv("EGPU_PREBUILT_PROBES", str(tmp_path))
    records = sass_records(sass)
    seen = []

    def fake_run(cmd, env, timeout):
        backend = cmd[cmd.index("--backend") + 1] if "--backend" in cmd else None
        probes = tuple(Path(cmd[i + 1]).name.split(".")[0] for i, a in enumerate(cmd) if a == "-p")
        tool = tuple(c for c in ("enter", "exit", "mem") if f"EMPTY_PATCH_{c.upper()}" in env)
        assert bool(tool) == ("CUDA_INJECTION64_PATH" in env)
        row = next(r for r in sass.ROWS if (r.backend, r.probes, r.profile, r.empty_patch, r.in_kernel) ==
                   (backend, probes, "--profile" in cmd, tool, "--in-kernel" in cmd) and r.workload in cmd
                   and (r, backend) not in seen)
        seen.append((row, backend))
        if len(seen) == len(sass.ROWS) - 1:   # the budget runs out before the last row
            monkeypatch.setattr(sass.time, "monotonic", lambda: 1e12)
        return records[(row.workload, row.name)]
    monkeypatch.setattr(suite, "run_case", fake_run)
    monkeypatch.setattr(suite, "build_kernels", lambda work: work / "kernels")
    monkeypatch.setattr(sass, "build_tool", lambda work: (work / "tool.so", work / "image.fatbin"))
    monkeypatch.setattr(suite, "exit_on_term", lambda: None)   # pytest keeps its own SIGTERM
    out = tmp_path / "sass.json"
    monkeypatch.setattr(sass.sys, "argv", ["bench_sass.py", str(out)])
    sass.main()
    assert [r for r, _ in seen] == list(sass.ROWS[:-1])
    doc = json.loads(out.read_text())["rows"]
    assert doc["torch_gpu"]["mem_count"]["check"] == f"skipped: past the {sass.DEADLINE_S} s budget"
    assert doc["torch_gpu"]["sanitizer_empty_mem"]["ratio"] == 2.25
    assert doc["goals"]["torch_gpu mem_count / plain"]["value"] is None


def test_sass_bench_skips_the_empty_patch_rows_when_the_tool_does_not_build(suite, tmp_path, monkeypatch):
    sass = importlib.import_module("bench_sass")
    calls = []
    monkeypatch.setattr(suite, "run_case", lambda cmd, env, timeout: calls.append(cmd) or {"status": "ok"})
    records = sass.run_rows(sass.ROWS, tmp_path / "kernels", tmp_path, {}, 1e12, "skipped: no nvcc")
    assert len(calls) == sum(not r.empty_patch for r in sass.ROWS)
    assert records[("torch_gpu", "sanitizer_empty")] == {"skipped": "skipped: no nvcc"}


def test_sass_bench_refuses_to_start_without_its_probes(tmp_path, monkeypatch):
    sass = importlib.import_module("bench_sass")
    monkeypatch.setattr(sass.suite, "exit_on_term", lambda: None)   # pytest keeps its own SIGTERM
    monkeypatch.setenv("EGPU_PREBUILT_PROBES", str(tmp_path))
    monkeypatch.setattr(sass.sys, "argv", ["bench_sass.py", str(tmp_path / "out.json")])
    with pytest.raises(SystemExit, match=r"no prebuilt entry_exit, entry_exit_empty, launch_threads, mem_count, "
                                         r"unselected \(run scripts/gpu-prep.sh\)"):
        sass.main()


def test_torch_shim_bench_pairs_each_round_with_its_plain_run(suite, tmp_path, monkeypatch):
    """bench_torch_shim.py: rounds of plain, egpu-run with no probe and egpu-run --live-sass (standby), on
    the suite's CPUs, each round's order turned by one; each ratio against its own round's plain run; a failed
    process is no result; the file holds every round finished, so a call cut short keeps them."""
    bench = importlib.import_module("bench_torch_shim")
    monkeypatch.setattr(suite, "exit_on_term", lambda: None)   # pytest keeps its own SIGTERM
    us = iter([1.5, 1.8, 1.5, 1.2, 1.1, 1.0])   # ms per step: round 0, then round 1 (shim, standby, plain)
    seen = []

    def fake_run(cmd, env, timeout, cpus):
        seen.append(("--live-sass" in cmd and "standby") or ("--keep" in cmd and "default"))
        assert cmd[-2:] == ["--count", "instructions,task_clock"]
        t = next(us)
        return case([t] * 3, shim_stats={"launches": 29, "python_calls": 0} if "--keep" in cmd else None,
                    count_per_unit=[t * 1e6, t * 1e6, 1.0], count_event="task_clock")
    monkeypatch.setattr(suite, "run_case", fake_run)
    monkeypatch.setattr(suite.subprocess, "run", lambda *a, **k: None)
    out = tmp_path / "torch_shim.json"
    monkeypatch.setattr(bench.sys, "argv", ["bench_torch_shim.py", str(out), "2"])
    bench.main()
    doc = json.loads(out.read_text())
    assert seen == [False, "default", "standby", "default", "standby", False]
    assert doc["us_per_step"] == {"plain": [1500.0, 1000.0], "shim": [1800.0, 1200.0], "standby": [1500.0, 1100.0]}
    assert doc["ratios"]["shim"]["values"] == [1.2, 1.2] and doc["ratios"]["standby"]["median"] == pytest.approx(1.05)
    assert (doc["ratios"]["standby"]["min"], doc["ratios"]["standby"]["max"]) == (1.0, pytest.approx(1.1))
    assert doc["shim_stats"]["shim"] == {"launches": 29, "python_calls": 0} and doc["shim_stats"]["plain"] is None
    # the event counted per step (each process's median) paired as the time is, and named
    assert doc["counted"] == ["task_clock"] and doc["counted_per_step"]["standby"] == [1.5e6, 1.1e6]
    assert doc["counted_ratios"]["standby"]["median"] == pytest.approx(1.05)
    # a lost process loses its round's pair, not the run
    no_pmu = "[Errno 2] perf_event_open (instructions): No such file or directory"
    outcomes = iter([case([1.0] * 3, count_error=no_pmu), case([], status="failed", error="exit 1: boom"),
                     case([1.1] * 3, count_error=no_pmu), case([], status="failed", error="exit 1: boom"),
                     case([1.1] * 3, count_error=no_pmu), case([1.0] * 3, count_error=no_pmu)])
    monkeypatch.setattr(suite, "run_case", lambda *a: next(outcomes))
    bench.main()
    doc = json.loads(out.read_text())
    assert doc["ratios"]["shim"]["pairs"] == 0 and doc["ratios"]["standby"]["pairs"] == 2
    assert doc["count_unavailable"] == no_pmu and doc["counted_ratios"]["standby"]["pairs"] == 0
    assert doc["errors"] == ["round 0 shim: failed: exit 1: boom", "round 1 shim: failed: exit 1: boom"]
    # killed in round 1 (the device call's timeout): round 0 is in the file
    outcomes = iter([case([1.0] * 3), case([1.1] * 3), case([1.2] * 3)])
    monkeypatch.setattr(suite, "run_case", lambda *a: next(outcomes))
    with pytest.raises(StopIteration):
        bench.main()
    doc = json.loads(out.read_text())
    assert doc["us_per_step"] == {"plain": [1000.0], "shim": [1100.0], "standby": [1200.0]}
    assert doc["ratios"]["standby"]["median"] == pytest.approx(1.2)
    # the control: a second plain process each round, paired as any mode; modes named, plain first
    outcomes = iter([case([t] * 3) for t in (1.0, 1.1)])
    commands = []
    monkeypatch.setattr(suite, "run_case", lambda cmd, *a: (commands.append(cmd), next(outcomes))[1])
    monkeypatch.setattr(bench.sys, "argv", ["bench_torch_shim.py", str(out), "2", "standby,plain"])
    with pytest.raises(StopIteration):
        bench.main()
    assert "--live-sass" not in commands[0] and "--live-sass" in commands[1]
    monkeypatch.setattr(bench.sys, "argv", ["bench_torch_shim.py", str(out), "1", "plain_again,plain"])
    outcomes = iter([case([t] * 3) for t in (1.0, 1.1)])
    bench.main()
    doc = json.loads(out.read_text())
    assert list(doc["us_per_step"]) == ["plain", "plain_again"]
    assert doc["ratios"]["plain_again"]["median"] == pytest.approx(1.1)
    monkeypatch.setattr(bench.sys, "argv", ["bench_torch_shim.py", str(out), "1", "shim"])
    with pytest.raises(SystemExit, match="plain among them"):
        bench.main()


def test_torch_shim_bench_weighs_the_subscription_alone(suite, tmp_path, monkeypatch):
    """The sanitizer_* modes: the step under bench/empty_patch subscribed as named, no egpu; a run whose
    tool output does not show the subscription asked for (not injected, patched, called back for loads it
    should not see or none it should) is no result."""
    bench = importlib.import_module("bench_torch_shim")
    monkeypatch.setattr(suite, "exit_on_term", lambda: None)
    monkeypatch.setattr(suite.subprocess, "run", lambda *a, **k: None)
    monkeypatch.setattr(bench.empty_patch, "build", lambda work: (work / "tool.so", work / "image.fatbin"))
    runs = iter([case([1.0] * 3), case([1.1] * 3, tool_patched=0, tool_seen=0),
                 case([1.2] * 3, tool_patched=0, tool_seen=4), case([1.1] * 3, tool_patched=0, tool_seen=7),
                 case([1.1] * 3, tool_patched=0, tool_seen=3), case([1.2] * 3, tool_patched=0, tool_seen=0),
                 case([1.1] * 3, tool_seen=7), case([1.0] * 3)])   # round 1 turned: plain last
    commands = []
    monkeypatch.setattr(suite, "run_case", lambda cmd, *a: (commands.append(cmd), next(runs))[1])
    out = tmp_path / "torch_shim.json"
    monkeypatch.setattr(bench.sys, "argv", ["bench_torch_shim.py", str(out), "2",
                                            "plain,sanitizer_none,sanitizer_loads,sanitizer_resource"])
    bench.main()
    doc = json.loads(out.read_text())
    assert "CUDA_INJECTION64_PATH" not in " ".join(commands[0])
    for cmd, mode in zip(commands[1:4], ("none", "loads", "resource")):
        assert cmd[0] == "env" and cmd[1].startswith("CUDA_INJECTION64_PATH=") and cmd[1].endswith("tool.so")
        assert cmd[2] == f"EMPTY_PATCH_SUBSCRIBE={mode}" and "egpu" not in " ".join(cmd)
    assert doc["us_per_step"]["sanitizer_none"] == [1100.0, None]
    assert doc["us_per_step"]["sanitizer_loads"] == [1200.0, None]
    assert doc["us_per_step"]["sanitizer_resource"] == [1100.0, None]
    assert doc["errors"] == ["round 1 sanitizer_none: unproven: the tool was called back for 3 module loads",
                             "round 1 sanitizer_loads: unproven: the tool was called back for 0 module loads",
                             "round 1 sanitizer_resource: unproven: "
                             "the subscribing tool was not injected, or patched a module"]


provenance = importlib.import_module("provenance")


def _git(repo, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


def test_provenance_verifies_the_files_the_device_received(tmp_path):
    """The manifest is made where git is; the check runs on a copy with no .git, as on the device."""
    repo, device = tmp_path / "repo", tmp_path / "device"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "a.py").write_text("a = 1\n")
    (repo / "run.sh").write_text("echo hi\n")
    (repo / "link").symlink_to("run.sh")
    (repo / ".gitignore").write_text("/.gpubuild/\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "one")
    tree = provenance.manifest(repo)
    assert tree["blobs"]["src/a.py"] == subprocess.run(["git", "rev-parse", "HEAD:src/a.py"], cwd=repo,
                                                       capture_output=True, text=True).stdout.strip()
    shutil.copytree(repo, device, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    (device / ".gpubuild").mkdir()
    (device / ".gpubuild" / "TREE").write_text(json.dumps(tree))
    stamp = provenance.stamp(device)
    assert (stamp["commit"], stamp["dirty"], stamp["log"]) == (tree["commit"], False, "gpu-test.log")
    assert "differs" not in stamp and {"gpu", "driver", "date"} <= stamp.keys()
    (device / "src" / "a.py").write_text("a = 2\n")
    (device / "run.sh").unlink()
    assert provenance.verify(device, tree) == {"commit": tree["commit"], "dirty": True,
                                               "differs": {"count": 2, "files": ["run.sh", "src/a.py"]}}
    # an untracked file that travels makes the tree dirty too
    (repo / "notes.txt").write_text("x")
    tree = provenance.manifest(repo)
    shutil.copy(repo / "notes.txt", device / "notes.txt")
    assert provenance.verify(device, tree)["differs"]["files"][-1] == "notes.txt"


def test_provenance_without_a_manifest_and_annotating_results(tmp_path, capsys):
    stamp = provenance.stamp(tmp_path)
    assert stamp["commit"] == "unknown" and stamp["dirty"] is True and "gpu-prep.sh" in stamp["differs"]["why"]
    good, bad = tmp_path / "r.json", tmp_path / "bad.json"
    good.write_text('{"x": 1}')
    bad.write_text("[1, 2]")
    provenance.annotate(good, {"commit": "c"})
    provenance.annotate(bad, {"commit": "c"})
    assert json.loads(good.read_text()) == {"x": 1, "provenance": {"commit": "c"}}
    assert bad.read_text() == "[1, 2]" and capsys.readouterr().err == f"{bad}: not annotated: not a JSON object\n"


def test_trace_bench_reads_what_egpu_run_delivered(tmp_path, monkeypatch):
    """bench_trace.py: the records written and whether none was dropped, from egpu-run's trace line
    (streaming.notes), whatever is printed around it; no line, no count; no prebuilt probe, no run."""
    bench = importlib.import_module("bench_trace")
    from egpu_preload.runtime import streaming
    for dropped, error in ((0, None), (5, None), (0, "cannot write the trace: disk full")):
        line, = streaming.notes([{"trace": {"records": 786_432, "path": str(tmp_path / "t.parquet"),
                                            "dropped": dropped, "error": error}}])
        assert bench.delivered(f"egpu[1]: a note\n{line}\nvecadd done\n") == (786_432, not dropped and not error)
    assert bench.delivered("egpu-run: job exited 1\n") == (None, False)
    # the drain's pace, from the line egpu-run prints under the trace line
    drain = {"passes": 1_234, "copied_bytes": 8_050_000_000, "taken_bytes": 2_750_000_000, "whole_bytes": 1_500_000_000,
             "unwalked_bytes": 2_600_000_000, "header_s": 0.5, "copy_s": 1.25, "scan_s": 3.0,
             "clear_s": 0.75, "gil_wait_s": 0.25, "hand_off_s": 2.0, "handing_s": 0.0625, "idle_s": 0.125,
             "write_s": 6.5, "header_driver_s": 0.02, "copy_driver_s": 1.0}
    _, pace_line = streaming.notes([{"trace": {"records": 1, "path": "t.arrow", "dropped": 0, "error": None,
                                               "drain": drain}}])
    assert "1,234 passes, 8,050.0 MB copied (2,750.0 MB of records taken, 1,500.0 MB of them unwalked, 2,600.0 MB " \
           "past a record not yet complete); reader: header 0.50 s (0.02 s in the driver), copy 1.25 s " \
           "(1.00 s in the driver), scan 3.00 s" in pace_line
    assert "clear 0.75 s, gil wait 0.25 s, hand off 2.00 s" in pace_line
    assert bench.pace(f"{pace_line}\nvecadd done\n") == {
        "passes": 1_234, "copied_mb": 8_050.0, "taken_mb": 2_750.0, "whole_mb": 1_500.0, "unwalked_mb": 2_600.0,
        "header_s": 0.5,
        "copy_s": 1.25, "scan_s": 3.0, "clear_s": 0.75, "gil_wait_s": 0.25, "hand_off_s": 2.0, "handing_s": 0.06,
        "idle_s": 0.12,
        "write_s": 6.5, "header_driver_s": 0.02, "copy_driver_s": 1.0}
    # a spooling reader's: the spool's writes, on a thread of their own, apart from the reader's phases
    _, pace_line = streaming.notes([{"trace": {"records": 1, "path": "t.arrow", "dropped": 0, "error": None,
                                               "drain": drain | {"spool_write_s": 0.84}}}])
    assert "hand off 2.00 s, handing 0.06 s, idle 0.12 s; spool writes 0.84 s; writer 6.50 s" in pace_line
    assert bench.pace(pace_line)["spool_write_s"] == 0.84 and bench.pace(pace_line)["idle_s"] == 0.12
    # written into four files at once: the threads' times summed, the files named
    _, pace_line = streaming.notes([{"trace": {"records": 1, "path": "t.arrow", "dropped": 0, "error": None,
                                               "drain": drain | {"spool_write_s": 1.5, "spool_files": 4}}}])
    assert "idle 0.12 s; spool writes 1.50 s into 4 files; writer 6.50 s" in pace_line
    assert bench.pace(pace_line)["spool_files"] == 4 and bench.pace(pace_line)["write_s"] == 6.5
    # a line in the form printed before the taken and unwalked bytes were (2fd044f: the numbers of 2026-12-06b)
    old = ("egpu-run:   drained in 1,377 passes, 23,613.8 MB copied; reader: header 0.05 s (0.05 s in the driver), "
           "scan 0.89 s; spool writes 1.45 s; writer 23.88 s")
    assert bench.pace(old) == {"passes": 1_377, "copied_mb": 23_613.8, "header_s": 0.05, "header_driver_s": 0.05,
                               "scan_s": 0.89, "spool_write_s": 1.45, "write_s": 23.88}
    # and in the form printed before the unwalked passes (the whole bytes) were (f88dd0e)
    old = ("egpu-run:   drained in 1,377 passes, 336.5 MB copied (120.5 MB of records taken, 3.5 MB past a record not "
           "yet complete); reader: header 0.05 s; writer 3.88 s")
    assert bench.pace(old) == {"passes": 1_377, "copied_mb": 336.5, "taken_mb": 120.5, "unwalked_mb": 3.5,
                               "header_s": 0.05, "write_s": 3.88}
    assert bench.pace("egpu-run: job exited 1\n") is None
    monkeypatch.setattr(bench.suite, "exit_on_term", lambda: None)   # pytest keeps its own SIGTERM
    monkeypatch.setenv("EGPU_PREBUILT_PROBES", str(tmp_path))
    monkeypatch.setattr(bench.sys, "argv", ["bench_trace.py", str(tmp_path / "out.json")])
    with pytest.raises(SystemExit, match="no prebuilt .*access_trace.v3.bpf.o"):
        bench.main()


def test_trace_bench_times_one_size_against_the_untraced_run(tmp_path, monkeypatch):
    """bench_trace.one_size: the drain's rate is the records' bytes over the time the traced run took
    beyond the untraced one, the output compared on vecadd's own line; a run past its time is an error."""
    bench = importlib.import_module("bench_trace")
    trace = tmp_path / "t.parquet"
    line = "egpu-run: 30,000,000 records in t.parquet, none dropped"

    def fake(cmd, env, timeout):
        traced = "--trace" in cmd
        if traced:
            trace.write_bytes(b"x" * 100)
        out = "vecadd launches 1 threads 10000000 wrong 0 checksum 00ab\n" + ("@maps\n" if traced else "")
        return (3.0 if traced else 1.0), subprocess.CompletedProcess(cmd, 0, out, line if traced else "")
    monkeypatch.setattr(bench, "timed", fake)
    run = bench.one_size(tmp_path / "vecadd", tmp_path / "p.o", trace, 10_000_000, {}, 60)
    assert run == {"threads": 10_000_000, "format": "parquet", "records_expected": 30_000_000, "untraced_s": 1.0,
                   "traced_s": 3.0,
                   "records_delivered": 30_000_000, "none_dropped": True, "same_output": True, "file_bytes": 100,
                   "drain_gbps": 1.2, "drain_pace": None}
    assert not trace.exists()
    monkeypatch.setattr(bench, "timed", lambda cmd, env, timeout:
                        (timeout, None if "--trace" in cmd else fake(cmd, env, 0)[1]))
    assert bench.one_size(tmp_path / "vecadd", tmp_path / "p.o", trace, 1000, {}, 60)["error"] == \
        "traced run past 60 s"


def test_sass_sweep_reads_its_lines_and_the_cost_per_block():
    import bench_sass_sweep as sweep
    got = sweep.parse("noise\nSWEEP 256 132 10.50\nSWEEP 256 264 12.00\nATTR 16 0 8\nSWEEP bad\nSWEEP_DONE ok\n"
                      "BENCH_TOOL_PATCHED 1\n")
    assert got == {"us": {"256/132": 10.5, "256/264": 12.0}, "attr": [16, 0, 8], "done": True, "tool_patched": 1}
    assert sweep.added(got["us"], {"256/132": 13.14, "256/264": 12.0, "32/132": 1.0}) == {
        "256/132": {"added_us": 2.64, "ns_per_block": 20.0}, "256/264": {"added_us": 0.0, "ns_per_block": 0.0}}


def test_suite_modes_keeps_the_modes_named(suite, monkeypatch):
    monkeypatch.setenv("SUITE_MODES", "plain, mem_trace_warp,torch_profiler")
    assert suite.modes_for("vecadd") == ["plain", "mem_trace_warp"]
    assert suite.modes_for("torch_eager") == ["plain", "mem_trace_warp", "torch_profiler"]
    for modes, why in (("plain,mem_trace_wrap", "names no mode mem_trace_wrap"), ("shim", "must keep plain")):
        monkeypatch.setenv("SUITE_MODES", modes)
        with pytest.raises(SystemExit, match=why):
            suite.modes_for("vecadd")


def test_framework_workload_counts_each_repetition_over_the_threads_it_starts(monkeypatch, capsys):
    """frameworks.py --count: the counter opens before the workload is built, so threads it starts are
    counted (perf_event_open's inherit); each repetition's count follows its line and parse_output makes
    it per unit. task_clock (CPU ns) stands in for instructions, which a VM without a PMU lacks."""
    import threading
    sys.path.insert(0, str(BENCH / "workloads"))
    frameworks = importlib.import_module("frameworks")

    def spinning_workload():
        def unit():   # 5 ms of CPU on a thread the workload starts, as autograd's do
            t = threading.Thread(target=_spin, args=(0.005,))
            t.start()
            t.join()
        return unit, lambda: None, lambda: "d"
    monkeypatch.setitem(frameworks.WORKLOADS, "spin", spinning_workload)
    # the first event the machine gives is counted: a made-up one is passed over, named in no output
    monkeypatch.setattr(sys, "argv", ["frameworks.py", "spin", "3", "0.1", "20", "--count", "no_such,task_clock"])
    frameworks.main()
    rec = results.parse_output(capsys.readouterr().out)
    assert rec["count_event"] == "task_clock" and "count_error" not in rec
    assert len(rec["count_per_unit"]) == len(rec["reps"]) == 3
    assert all(4.5e6 < ns < 50e6 for ns in rec["count_per_unit"]), rec["count_per_unit"]
    monkeypatch.setattr(sys, "argv", ["frameworks.py", "spin", "3", "0.1", "20", "--count", "no_such"])
    frameworks.main()
    rec = results.parse_output(capsys.readouterr().out)
    assert rec["count_error"] == "no event no_such" and "count_per_unit" not in rec


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_repeat_case_runs_one_suite_case_again_and_again(suite, tmp_path, monkeypatch):
    """bench/repeat_case.py: the suite's case command and timeout, TIMES runs, each one's outcome kept (a
    hang among them with its stacks), and a case the suite has not refused."""
    repeat = importlib.import_module("repeat_case")
    seen = []

    def run_case(cmd, env, timeout, cpus):
        seen.append((cmd, timeout))
        return ({"status": "timeout", "wall_s": 9.0, "unit_ms": [], "stderr_tail": "stacks"} if len(seen) == 2 else
                {"status": "ok", "wall_s": 1.0, "unit_ms": [2.0], "trace": {"records": 5, "drops": 0}, "digest": "x"})
    monkeypatch.setattr(suite, "run_case", run_case)
    monkeypatch.setattr(suite, "prepare", lambda work: ({}, work / "kernels", {m: work / m for m in suite.PROBES}))
    out = tmp_path / "r.json"
    monkeypatch.setattr(sys, "argv", ["repeat_case.py", str(out), "cupy", "mem_trace_warp", "3", "50"])
    repeat.main()
    doc = json.loads(out.read_text())
    assert [r["status"] for r in doc["runs"]] == ["ok", "timeout", "ok"] and doc["runs"][1]["stderr_tail"] == "stacks"
    # the suite's lane count too: a warp trace whose files do not hold the records it reported says so
    assert doc["runs"][0]["trace"] == {"records": 5, "drops": 0,
                                       "lanes_error": "the files hold 0 warp records, the job reported 5"}
    assert "digest" not in doc["runs"][0]
    assert all(t == 50.0 and "--trace" in cmd and "cupy" in cmd for cmd, t in seen)
    seen.clear()
    monkeypatch.setattr(sys, "argv", ["repeat_case.py", str(out), "cupy", "mem_count", "1"])
    repeat.main()
    assert [t for _, t in seen] == [suite.TIMEOUT_S["python"]]   # an untraced mode: the suite's own limit
    monkeypatch.setattr(sys, "argv", ["repeat_case.py", str(out), "cupy", "nonsense"])
    with pytest.raises(SystemExit, match="no case cupy nonsense"):
        repeat.main()


def test_header_read_builds_and_refuses_an_unknown_mode(tmp_path):
    """bench/header_read.cu, whose run is a GPU call's: nvcc builds it and its usage is checked before any
    CUDA call, so a typo in bench_header_read's modes fails here."""
    exe = tmp_path / "header_read"
    subprocess.run(["nvcc", "-O2", "-arch=sm_90", str(BENCH / "header_read.cu"), "-o", str(exe)], check=True)
    bad = subprocess.run([str(exe), "spin", "3"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown mode spin" in bad.stderr
    header_read = importlib.import_module("bench_header_read")
    assert header_read.summary([float(v) for v in range(1, 12)]) == {"median": 6.0, "p90": 10.0, "max": 11.0}
    for mode in header_read.MODES:   # each mode the bench runs gets past the program's usage check
        r = subprocess.run([str(exe), mode, "1"], capture_output=True, text=True)
        assert "unknown mode" not in r.stderr, r.stderr
