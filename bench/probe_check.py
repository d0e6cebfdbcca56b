"""Whether a probe cell of the suite measured a probe that ran, before its ratio may count.

A probe silently not applied costs nothing and would read 1.00x, so a cell's ratio counts only when
its run proves, from the maps the job dumped at exit, that the probe ran as often as it must, and its
output is the uninstrumented run's:

- entry_exit: entries == exits > 0 in the timed run; and in a second process of the same cell run
  with bench/probes/launch_threads beside it (a launch probe: every launch the shim records adds its
  grid x block), entries == exits == the launched threads, with no launch record dropped. The witness
  runs in its own process so its per-launch cost stays out of the timed run.
- mem_count: accesses > 0; for a deterministic workload (the same kernel every unit, nothing else
  launched) a whole number per unit, equal to the full trace's per unit (another process, of this run or,
  in a combined report, another one that computed the same output).
- mem_trace: records delivered (> 0); for a deterministic workload records + drops a whole number per
  unit, equal to the memory counter's per unit.
- mem_trace_warp: warp records delivered (> 0), none dropped, and the lanes they stand for (counted from
  the trace file by suite.count_lanes) checked as mem_trace's records are.

Records are ``suite.run_case``'s, with "counts" (``counts_from_dumps``), "units" (BENCH_UNITS) and, for
entry_exit, "check_run" (the witness process's record). Pure functions: tests/test_bench_suite.py
checks them on made-up records.
"""

from __future__ import annotations

from typing import Any

PROBE_MODES = ("entry_exit", "mem_count", "mem_trace", "mem_trace_warp")
TRACED = ("mem_trace", "mem_trace_warp")   # the modes run under egpu-run --trace
# nvcc workloads launch one kernel per unit and nothing else; CuPy and PyTorch launch kernels of their
# own (setup, allocator, autotuning), so their counts per unit are not fixed
DETERMINISTIC = frozenset({"vecadd", "stencil", "gemm"})


def counts_from_dumps(docs: list[dict[str, Any]]) -> list[list[list[int] | None]]:
    """Per probe object (in -p order), per map: the u64 values of an ARRAY (a PERCPU_ARRAY summed over
    SMs), summed over the job's processes; None for other maps."""
    out: list[list[list[int] | None]] = []
    for d in docs:
        for p_i, probe in enumerate(d.get("probes", [])):
            if p_i == len(out):
                out.append([])
            for m_i, storage in enumerate(probe.get("maps", [])):
                values = _u64s(storage)
                if m_i == len(out[p_i]):
                    out[p_i].append(values)
                elif values is not None and out[p_i][m_i] is not None:
                    out[p_i][m_i] = [a + b for a, b in zip(out[p_i][m_i], values)]
    return out


def _u64s(storage: dict[str, Any]) -> list[int] | None:
    if "values" in storage:
        return [int.from_bytes(bytes(v)[:8], "little") for v in storage["values"]]
    if "per_cpu" in storage:
        sums: list[int] = []
        for _, values in storage["per_cpu"]:
            got = [int.from_bytes(bytes(v)[:8], "little") for v in values]
            sums = [a + b for a, b in zip(sums, got)] if sums else got
        return sums
    return None


def _first_array(rec: dict[str, Any], probe: int = 0) -> list[int] | None:
    counts = rec.get("counts") or []
    return counts[probe][0] if len(counts) > probe and counts[probe] else None


def _same_output(rec: dict[str, Any], plain: dict[str, Any], what: str) -> str | None:
    if rec.get("status", "ok") != "ok":
        return f"{what}: {rec.get('status')}" + (f" ({rec['error']})" if rec.get("error") else "")
    if not rec.get("digest") or not plain.get("digest"):
        return f"{what}: no output digest to compare"
    if rec["digest"] != plain["digest"]:
        return f"{what}: output {rec['digest']} differs from the uninstrumented {plain['digest']}"
    return None


def _entries(rec: dict[str, Any], what: str) -> tuple[int, str | None]:
    """The entries the run's probe counted (slot 0 of its first array), and why they do not stand:
    none, or exits (slot 1, when the probe has one) that differ."""
    calls = _first_array(rec)
    if not calls:
        return 0, f"{what}: no entry/exit counts in the exit dump"
    entries, exits = calls[0], calls[1] if len(calls) > 1 else calls[0]
    if entries == 0:
        return 0, f"{what}: the probe never ran (0 entries)"
    if entries != exits:
        return entries, f"{what}: {entries:,} entries but {exits:,} exits"
    return entries, None


def _witnessed(check: dict[str, Any] | None, plain: dict[str, Any]) -> str | None:
    if check is None:
        return "no witness run (entry_exit with bench/probes/launch_threads)"
    why = _same_output(check, plain, "witness run")
    if why:
        return why
    entries, why = _entries(check, "witness run")
    if why:
        return why
    launched = _first_array(check, 1)
    if not launched or len(launched) < 2:
        return "witness run: no launch counts in the exit dump"
    dropped = (check.get("shim_stats") or {}).get("dropped", 0)
    if dropped:
        return f"witness run: {dropped:,} launch records dropped, the launched threads are not all known"
    if entries != launched[0]:
        return f"witness run: {entries:,} entries for {launched[0]:,} launched threads ({launched[1]:,} launches)"
    return None


def _accesses(rec: dict[str, Any], mode: str) -> int | None:
    """Memory accesses the run's probe saw: the counter's sum, the trace's records + drops, or the lanes of
    the warp trace's records."""
    if mode == "mem_count":
        counts = _first_array(rec)
        return sum(counts) if counts else None
    trace = rec.get("trace")
    if mode == "mem_trace_warp":
        return trace.get("lanes") if trace else None
    return trace["records"] + trace["drops"] if trace else None


def _per_unit(rec: dict[str, Any], mode: str) -> int | None:
    """Accesses per unit of a deterministic run that checked out as whole, else None (a warp trace that
    dropped records counts only the lanes of those delivered)."""
    n, units = _accesses(rec, mode), rec.get("units")
    if rec.get("status", "ok") != "ok" or not n or not units or n % units:
        return None
    if mode == "mem_trace_warp" and _warp_trace(rec):
        return None
    return n // units


def _memory(workload: str, mode: str, modes: dict[str, dict[str, Any]]) -> str | None:
    rec = modes[mode]
    why = _warp_trace(rec) if mode == "mem_trace_warp" else None
    if why:
        return why
    n = _accesses(rec, mode)
    if n is None:
        return f"no {'access counts' if mode == 'mem_count' else 'trace'} in the exit dump"
    if n == 0:
        return "the probe never ran (0 accesses)"
    if mode in TRACED and rec["trace"]["records"] == 0:
        return f"no trace record delivered ({rec['trace']['drops']:,} dropped)"
    if workload not in DETERMINISTIC:
        return _dropped(rec, mode, n)
    units = rec.get("units")
    if not units:
        return "no unit count (BENCH_UNITS) to divide the accesses by"
    if n % units:
        return f"{n:,} accesses over {units:,} units is not the same number every unit"
    for other in TRACED if mode == "mem_count" else ("mem_count",):
        # The partner may come from another run (bench/combine.py): it witnesses only when it computed this
        # output, whose digest (kernels.cu hashes every element) pins the problem a deterministic kernel
        # makes a fixed number of accesses per unit over.
        partner = modes.get(other, {})
        theirs = _per_unit(partner, other) if partner.get("digest") == rec.get("digest") else None
        if theirs is not None and theirs != n // units:
            return f"{n // units:,} accesses per unit, {other} saw {theirs:,}"
    return _dropped(rec, mode, n)


def _warp_trace(rec: dict[str, Any]) -> str | None:
    """Why a warp trace's lanes cannot stand for its accesses: they count only the records delivered."""
    t = rec.get("trace")
    if t and t["drops"]:
        return (f"{t['drops']:,} warp records dropped ({t['records']:,} delivered): a full trace counts only runs "
                "that drop none")
    if t and "lanes_error" in t:
        return f"the warp records' lanes were not counted: {t['lanes_error']}"
    return None


def _dropped(rec: dict[str, Any], mode: str, n: int) -> str | None:
    """A full trace is one that kept every record."""
    if mode == "mem_trace" and rec["trace"]["drops"]:
        return f"{rec['trace']['drops']:,} of {n:,} records dropped: a full trace counts only runs that drop none"
    return None


def check_counter(rec: dict[str, Any], plain: dict[str, Any], threads_per_unit: int | None) -> str | None:
    """For a workload whose threads per unit are known (bench_counters' and bench_sass's vecadd): the
    output is plain's and, unless ``threads_per_unit`` is None (a probe that counts nothing), entries
    (== exits, for a probe that counts them) == units x threads."""
    why = _same_output(rec, plain, "run")
    if why or threads_per_unit is None:
        return why
    entries, why = _entries(rec, "run")
    if why:
        return why
    if not rec.get("units"):
        return "run: no unit count (BENCH_UNITS)"
    if entries != rec["units"] * threads_per_unit:
        return f"run: {entries:,} entries for {rec['units']:,} launches of {threads_per_unit:,} threads"
    return None


def check_cell(workload: str, mode: str, modes: dict[str, dict[str, Any]]) -> str | None:
    """Why ``modes[mode]`` (a probe mode's raw record; ``modes`` all of the workload's) does not prove
    its probe ran as often as it must with the uninstrumented output, or None when it does. Its
    uninstrumented record is its "base" (its own run's, bench/combine.py's) when it has one, else plain."""
    rec = modes[mode]
    plain = rec.get("base", modes.get("plain", {}))
    why = _same_output(rec, plain, "run")
    if why:
        return why
    if mode == "entry_exit":
        return _entries(rec, "run")[1] or _witnessed(rec.get("check_run"), plain)
    return _memory(workload, mode, modes)
