"""Issue 17 item 3's cost table in one GPU call: ``python3 bench/bench_sass.py OUT.json`` on the GPU machine
(nvcc, PyTorch, and the probes prebuilt by scripts/gpu-prep.sh in EGPU_PREBUILT_PROBES or .gpubuild/probes).
About 3-4 minutes on an H200; a row that would start after DEADLINE_S is skipped and says so.

One process per row, each timed inside itself by the suite's protocol (bench/workloads: a warm-up unit,
calibration, repetitions of about 100 ms; the median per unit), so start-up, patching and the JIT stay out:

- vecadd (bench/workloads/kernels.cu: 16 Mi threads, PTX and SASS, so both back ends serve it): plain, and
  the entry/exit and memory-access counters (bench/probes) under --backend ptx and --backend sass, the
  entry/exit counter under each back end both counted at the launch (translate/launch_eval.py: the default)
  and put into the kernel (``_in_kernel``: egpu-run --in-kernel); sanitizer_empty and sanitizer_empty_mem
  (below).
- torch_gpu (bench/workloads/frameworks.py: a stock PyTorch eager CNN training step, GPU-bound; SASS only,
  so every probe runs through the SASS back end): plain; torch_profiler (plain inside torch.profiler);
  standby (egpu-run with no probe: subscribed, nothing patched); unselected (bench/probes/unselected: entry,
  exit and memory programs whose glob matches no kernel, so no module is patched: a probe costs nothing
  where it selects nothing); sanitizer_empty; entry_exit_empty (egpu's floor: empty programs in every
  kernel, each launch given its record, --in-kernel); entry_exit (counted at the launch, no kernel patched);
  entry_exit_in_kernel (the same counter patched into every kernel); sanitizer_empty_mem; mem_count.
- sanitizer_empty and sanitizer_empty_mem: no egpu at all, but bench/empty_patch, a sanitizer tool of its
  own patching every module at block enter and exit (or at every global access) with functions that return
  at once: what the patching mechanism costs by itself, the floor no patch function can go below.

Before any ratio, each row must prove it measured what it says (bench/probe_check.py), else its ratio is
left out and the reason given: every row the plain output (the digest); vecadd's counters exact
(entries == exits == launches x threads; 2 loads and 1 store per thread); torch_gpu's entry/exit counter
== the threads launched, as a second process with bench/probes/launch_threads beside it counts them
(``entry_exit_witness``: its per-launch cost stays out of the timed row); its memory counter > 0; standby
and unselected subscribed with no module patched, unselected with its modules left unpatched, the counted
rows with no module patched, and the patched rows' launches given records (``check_sass``); the empty patch
rows' tool patched a module.

Goals (issue 17 item 3): torch_gpu entry_exit <= 1.1x plain, mem_count <= 2x plain; vecadd's SASS memory
counter <= 1.5x the PTX back end's.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import empty_patch  # noqa: E402
import probe_check  # noqa: E402
import suite  # noqa: E402

DEADLINE_S = 300
VECADD_THREADS = 1 << 24
UNCOMPARED = ("plain", "entry_exit_witness")   # no ratio: the reference, and a count the checks read
GOALS = {"torch_gpu entry_exit / plain": 1.1, "torch_gpu mem_count / plain": 2.0,
         "vecadd sass_mem_count / ptx_mem_count": 1.5}


@dataclass(frozen=True)
class Row:
    name: str
    workload: str             # "vecadd" (kernels.cu) or "torch_gpu" (frameworks.py)
    backend: str | None       # None: no egpu-run
    probes: tuple[str, ...] = ()
    profile: bool = False     # inside torch.profiler
    empty_patch: tuple[str, ...] = ()   # bench/empty_patch injected, patching these classes
    in_kernel: bool = False   # egpu-run --in-kernel: counters patched into the kernels, not counted at the launch

    @property
    def counted(self) -> bool:
        """The SASS back end counts its probes at the launch: the entry/exit counter's programs qualify."""
        return self.backend == "sass" and "entry_exit" in self.probes and not self.in_kernel


ENTER_EXIT, MEM = ("enter", "exit"), ("mem",)
ROWS = (
    Row("plain", "vecadd", None),
    Row("ptx_entry_exit", "vecadd", "ptx", ("entry_exit",)),
    Row("ptx_entry_exit_in_kernel", "vecadd", "ptx", ("entry_exit",), in_kernel=True),
    Row("sass_entry_exit", "vecadd", "sass", ("entry_exit",)),
    Row("sass_entry_exit_in_kernel", "vecadd", "sass", ("entry_exit",), in_kernel=True),
    Row("ptx_mem_count", "vecadd", "ptx", ("mem_count",)),
    Row("sass_mem_count", "vecadd", "sass", ("mem_count",)),
    Row("sanitizer_empty", "vecadd", None, empty_patch=ENTER_EXIT),
    Row("sanitizer_empty_mem", "vecadd", None, empty_patch=MEM),
    Row("plain", "torch_gpu", None),
    Row("torch_profiler", "torch_gpu", None, profile=True),
    Row("standby", "torch_gpu", "sass"),
    Row("unselected", "torch_gpu", "sass", ("unselected",)),
    Row("sanitizer_empty", "torch_gpu", None, empty_patch=ENTER_EXIT),
    Row("entry_exit_empty", "torch_gpu", "sass", ("entry_exit_empty",), in_kernel=True),
    Row("entry_exit", "torch_gpu", "sass", ("entry_exit",)),
    Row("entry_exit_in_kernel", "torch_gpu", "sass", ("entry_exit",), in_kernel=True),
    Row("entry_exit_witness", "torch_gpu", "sass", ("entry_exit", "launch_threads")),   # before the slow rows
    Row("sanitizer_empty_mem", "torch_gpu", None, empty_patch=MEM),
    Row("mem_count", "torch_gpu", "sass", ("mem_count",)),
)


def command(row: Row, exe: Path, probes: Path) -> list[str]:
    if row.workload == "vecadd":
        cmd = [str(exe), row.workload, str(suite.REPS), str(suite.BUDGET_S)]
    else:
        cmd = [sys.executable, str(suite.BENCH / "workloads" / "frameworks.py"), row.workload, str(suite.REPS),
               str(suite.BUDGET_S), *(["--profile"] if row.profile else [])]
    if row.backend is None:
        return cmd
    loaded = [a for p in row.probes for a in ("-p", str(probes / f"{p}.v3.bpf.o"))]
    return [*suite.egpu_run(), "--keep", "--backend", row.backend, *(["--in-kernel"] if row.in_kernel else []),
            *loaded, *cmd]


def check_sass(row: Row, rec: dict[str, Any]) -> str | None:
    """Why a row under the SASS back end did not run as its name says: standby and unselected subscribed
    with no module patched, unselected with modules left unpatched for want of a selected kernel; the
    others' patched kernels launched with records."""
    sass = rec.get("sass") or {}
    if "subscribed" not in sass.get("states", []):
        return f"the sanitizer was not subscribed ({', '.join(sass.get('states', [])) or 'no SASS state in the dump'})"
    if row.name in ("standby", "unselected") or row.counted:
        if sass.get("modules_patched"):
            return f"{row.name} patched {sass['modules_patched']} modules"
        if row.name == "unselected" and not sass.get("modules_unselected"):
            return "no module was left unpatched: the probe's programs were never weighed against a kernel"
        return None
    if not sass.get("probed"):
        return "no launch of a patched kernel got a record: the probes never ran"
    return None


def check_empty_patch(rec: dict[str, Any]) -> str | None:
    return None if rec.get("tool_patched") else "the empty patch tool patched no module"


def vecadd_accesses(rec: dict[str, Any]) -> str | None:
    """vecadd reads a[i] and b[i] and writes c[i] in every thread: mem_count's [loads, stores] must be
    exactly [2, 1] x launches x threads."""
    counts = ((rec.get("counts") or [[None]])[0] or [None])[0]
    if not counts or len(counts) < 2:
        return "run: no access counts in the exit dump"
    if not rec.get("units"):
        return "run: no unit count (BENCH_UNITS)"
    want = [2 * rec["units"] * VECADD_THREADS, rec["units"] * VECADD_THREADS]
    if counts[:2] != want:
        return (f"run: {counts[0]:,} loads and {counts[1]:,} stores for {rec['units']:,} launches "
                f"(want {want[0]:,}, {want[1]:,})")
    return None


def check(row: Row, rec: dict[str, Any], plain: dict[str, Any] | None, witness: dict[str, Any] | None) -> str | None:
    """Why ``row``'s record does not prove it measured what it says (None: it does); ``plain`` is its
    workload's plain record, ``witness`` torch_gpu's entry_exit_witness record."""
    if rec.get("status") != "ok":
        return f"run: {rec.get('status')}" + (f" ({rec['error']})" if rec.get("error") else "")
    if row.name in UNCOMPARED:
        return None
    if plain is None:
        return "no plain run to compare with"
    why = probe_check.check_counter(rec, plain, None)   # the plain output
    if why:
        return why
    if row.empty_patch:
        return check_empty_patch(rec)
    if row.workload == "vecadd":
        return probe_check.check_counter(rec, plain, VECADD_THREADS) if "entry_exit" in row.probes \
            else vecadd_accesses(rec)
    if row.backend == "sass":
        why = check_sass(row, rec)
        if why:
            return why
    if row.probes == ("entry_exit",):   # counted or patched, the same count
        return probe_check.check_cell(row.workload, "entry_exit",
                                      {"entry_exit": {**rec, "check_run": witness}, "plain": plain})
    if row.probes == ("mem_count",):
        return probe_check.check_cell(row.workload, "mem_count", {"mem_count": rec, "plain": plain})
    return None


def table(records: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    """Per workload and row: ms per unit, its check, its ratio to plain (only when checked); the goals."""
    out: dict[str, Any] = {}
    witness = records.get(("torch_gpu", "entry_exit_witness"))
    for row in ROWS:
        rec = records.get((row.workload, row.name))
        if rec is None:
            continue
        plain = records.get((row.workload, "plain"))
        why = rec.get("skipped") or check(row, rec, plain, witness)
        cell: dict[str, Any] = {"ms_per_unit": statistics.median(rec["unit_ms"]) if rec.get("unit_ms") else None,
                                "check": why, **({"split": rec["split"]} if rec.get("split") else {})}
        if why is None and row.name not in UNCOMPARED and plain and plain.get("unit_ms") and cell["ms_per_unit"]:
            cell["ratio"] = round(cell["ms_per_unit"] / statistics.median(plain["unit_ms"]), 3)
        out.setdefault(row.workload, {})[row.name] = cell
    vecadd, torch = out.get("vecadd", {}), out.get("torch_gpu", {})
    sass_mem, ptx_mem = vecadd.get("sass_mem_count", {}), vecadd.get("ptx_mem_count", {})
    got = {"torch_gpu entry_exit / plain": torch.get("entry_exit", {}).get("ratio"),
           "torch_gpu mem_count / plain": torch.get("mem_count", {}).get("ratio"),
           "vecadd sass_mem_count / ptx_mem_count":
               round(sass_mem["ms_per_unit"] / ptx_mem["ms_per_unit"], 3)
               if sass_mem.get("check", "x") is None and ptx_mem.get("check", "x") is None else None}
    out["goals"] = {k: {"value": v, "goal": GOALS[k], "met": None if v is None else v <= GOALS[k]}
                    for k, v in got.items()}
    return out


def run_rows(rows: tuple[Row, ...], exe: Path, probes: Path, env: dict[str, str], deadline: float,
             tool: tuple[Path, Path] | str) -> dict[tuple[str, str], dict[str, Any]]:
    """One process per row; ``tool``: bench/empty_patch built, or why it could not be."""
    records: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        left = deadline - time.monotonic()
        if left < 20:
            records[(row.workload, row.name)] = {"skipped": f"skipped: past the {DEADLINE_S} s budget"}
        elif row.empty_patch and isinstance(tool, str):
            records[(row.workload, row.name)] = {"skipped": tool}
        else:
            timeout = min(suite.TIMEOUT_S["cuda" if row.workload == "vecadd" else "python"], left)
            row_env = {**env, **empty_patch.env(tool, row.empty_patch)} if row.empty_patch else env
            records[(row.workload, row.name)] = suite.run_case(command(row, exe, probes), row_env, timeout)
    return records


def build_tool(work: Path) -> tuple[Path, Path] | str:
    try:
        return empty_patch.build(work)
    except (OSError, subprocess.CalledProcessError) as e:
        return f"skipped: bench/empty_patch did not build ({e})"


def main() -> None:
    suite.exit_on_term()
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    out_path = Path(sys.argv[1])
    probes = Path(os.environ.get("EGPU_PREBUILT_PROBES", ROOT / ".gpubuild" / "probes"))
    missing = sorted({p for r in ROWS for p in r.probes if not (probes / f"{p}.v3.bpf.o").exists()})
    if missing:
        raise SystemExit(f"bench_sass: {probes}: no prebuilt {', '.join(missing)} (run scripts/gpu-prep.sh)")
    deadline = time.monotonic() + DEADLINE_S
    with tempfile.TemporaryDirectory() as tmp:
        env = suite.base_env(Path(tmp))
        records = run_rows(ROWS, suite.build_kernels(Path(tmp)), probes, env, deadline, build_tool(Path(tmp)))
    result = table(records)
    for workload in ("vecadd", "torch_gpu"):
        for name, cell in result.get(workload, {}).items():
            ms = f"{cell['ms_per_unit']:10.3f} ms" if cell["ms_per_unit"] else " " * 13
            shown = f"x{cell['ratio']}" if "ratio" in cell else cell["check"] or ""
            split = cell.get("split")
            if split:   # one launch alone: its host call and its kernel
                shown += f"  (launch call {split['host_us']} us, kernel {split['kernel_us']} us)"
            print(f"{workload:14s} {name:20s} {ms}  {shown}")
    for goal, g in result["goals"].items():
        print(f"goal {goal}: {g['value']} (<= {g['goal']}: {g['met']})")
    out_path.write_text(json.dumps({"rows": result, "raw": {f"{w}/{n}": r for (w, n), r in records.items()}},
                                   indent=1, default=str))


if __name__ == "__main__":
    main()
