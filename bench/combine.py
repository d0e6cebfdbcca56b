"""One suite report from several part runs: ``python3 bench/combine.py OUT_DIR RUN.json[=LOG] ...`` writes
OUT_DIR/suite.json and OUT_DIR/suite.md as bench/suite.py does for one run.

The whole suite does not fit one device call, so it runs in parts (``suite.py OUT PART...``), across calls
and sessions, often a workload's plain with one mode (SUITE_MODES). So each cell is combined on its own
(``cells``): a workload's plain from the newest run (by meta.date) that ran it (some mode not "skipped
(...)"), each other mode from the newest run that ran that mode, unless that attempt has no ratio and an
older one has (the notes name the attempt passed over). Processes differ run to run, so a cell from another
run than the plain shown keeps its own run's plain as "base": its ratio, paired rounds, output digest and
probe check are against it, never another run's plain. Each part (jit, shim, hot_swap) comes from the
newest run that measured it (not {"skipped"} nor {"error"}), an older measurement before a newer skip.
Every case and part keeps its run as "run": that run's commit, dirty state (and the files that differ),
GPU, driver and date, and its JSON, log and report paths relative to the repository. Summary, goals and
notes are derived again from what was kept (results.complete), as for one run.

A run's log is its JSON's path with .log, unless named after "="; a run without a log is refused, as is a
file that is not a suite run, with a line naming it. A run whose summary has no probe_checked field
predates the probe checks (bench/probe_check.py): its probe cells get no ratio whatever its records hold.

Not a suite.py command: suite.py's first argument is its output folder, and combining needs nothing of
the GPU runner (nvcc, probes, the shim), only bench/results.py.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench")]

import results  # noqa: E402
from probe_check import PROBE_MODES  # noqa: E402

PARTS = ("jit", "shim", "hot_swap")
SOURCE = ("commit", "dirty", "differs", "gpu", "driver", "date")  # of a run's meta, kept with what it gave


@dataclass(frozen=True)
class Run:
    doc: dict[str, Any]
    source: dict[str, Any]  # SOURCE from its meta; "json", "log", "report" paths; "predates_probe_checks"


def where(path: Path) -> str:
    """``path`` relative to the repository, absolute when outside it."""
    p = path.resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def malformed(doc: Any) -> str | None:
    """Why ``doc`` is not a suite run's JSON, or None."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    if not isinstance(doc.get("meta"), dict) or not isinstance(doc["meta"].get("date"), str):
        return "no meta.date"
    cases = doc.get("cases")
    if not isinstance(cases, dict) or not all(isinstance(ms, dict) and all(isinstance(r, dict) for r in ms.values())
                                              for ms in cases.values()):
        return "no cases of workload -> mode -> record"
    summary = doc.get("summary", {})
    if not isinstance(summary, dict) or not all(isinstance(ms, dict) for ms in summary.values()):
        return "a summary that is not workload -> mode -> summary"
    bad = [p for p in PARTS if not isinstance(doc.get(p, {}), dict)]
    return f"{bad[0]} is not an object" if bad else None


def load(arg: str) -> Run:
    """RUN.json[=LOG] read and checked; SystemExit naming the file when it cannot be combined."""
    name, _, log = arg.partition("=")
    path = Path(name)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"combine.py: {name}: cannot read it: {e}") from None
    why = malformed(doc)
    if why:
        raise SystemExit(f"combine.py: {name}: not a suite run's JSON: {why}")
    log_path = Path(log) if log else path.with_suffix(".log")
    if not log_path.is_file():
        raise SystemExit(f"combine.py: {name}: no log at {log_path} (name the run's log: {name}=LOG)")
    source = {k: doc["meta"][k] for k in SOURCE if k in doc["meta"]} | {"json": where(path), "log": where(log_path)}
    if path.with_suffix(".md").is_file():
        source["report"] = where(path.with_suffix(".md"))
    probe_cells = any(m in PROBE_MODES for ms in doc["cases"].values() for m in ms)
    if probe_cells and not any("probe_checked" in s for ms in doc.get("summary", {}).values() for s in ms.values()):
        source["predates_probe_checks"] = True
    return Run(doc, source)


def ran(rec: dict[str, Any]) -> bool:
    """Whether a case ran in its run: not skipped ("skipped (time budget)")."""
    return not str(rec.get("status", "")).startswith("skipped")


def measured(part: Any) -> bool:
    return isinstance(part, dict) and bool(part) and not {"skipped", "error"} & part.keys()


def link(path: str, out_dir: Path) -> str:
    """A link from OUT_DIR's report to ``path`` (relative to the repository, or absolute)."""
    return Path(os.path.relpath(ROOT / path, out_dir.resolve())).as_posix()


def cells(w: str, having: list[Run], own: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """Workload ``w``'s records from ``having`` (the runs that hold it, newest first; ``own`` each one's
    summary by its JSON), and notes on newer attempts passed over. Plain comes from the newest run that ran
    the workload; each other mode from the newest run that ran it, unless that attempt has no ratio (timed
    out, failed, failed its probe check) and an older one has: a measured cell is not replaced by a failed
    attempt, which the notes name instead. A record from another run than the plain shown carries its own
    run's plain as "base" (none: {}), which its ratio, digest and paired rounds are compared with."""
    shown = next((r for r in having if any(ran(rec) for rec in r.doc["cases"][w].values())), having[0])
    order = [k for k, _ in results.MODES]
    modes = sorted(dict.fromkeys(m for r in having for m in r.doc["cases"][w]),
                   key=lambda m: order.index(m) if m in order else len(order))
    picked, notes = {}, []
    for m in modes:
        held = [r for r in having if m in r.doc["cases"][w]]
        if m == "plain" and shown in held:
            picked[m] = shown
            continue
        # a mode no run ran shows as the plain's run left it ("skipped (time budget)"), else not at all
        tried = [r for r in held if ran(r.doc["cases"][w][m])] or [shown] * (shown in held)
        if not tried:
            continue
        picked[m] = next((r for r in tried if "ratio" in own[r.source["json"]][w][m]), tried[0])
        for newer in tried[:tried.index(picked[m])]:
            s = own[newer.source["json"]][w][m]
            notes.append(f"{w} / {m}: a newer attempt (run {results.run_label(newer.source)}) has no ratio "
                         f"({s.get('probe_check') or results.no_ratio(s)}); the ratio shown is the run "
                         f"{results.run_label(picked[m].source)}'s")
    out = {m: {**r.doc["cases"][w][m], "run": r.source} for m, r in picked.items()}
    for m, r in picked.items():
        if m != "plain" and r is not picked.get("plain"):
            out[m]["base"] = r.doc["cases"][w].get("plain", {})
    return out, notes


def gave(run: Run, cases: dict[str, dict[str, Any]]) -> list[str]:
    """What ``run`` gave the combined ``cases``: a workload by name when all its cells are the run's, else
    with the modes it gave."""
    out = []
    for w, modes in cases.items():
        mine = [m for m, rec in modes.items() if rec["run"]["json"] == run.source["json"]]
        if mine:
            out.append(w if len(mine) == len(modes) else f"{w} ({', '.join(mine)})")
    return out


def combine(runs: list[Run], out_dir: Path) -> dict[str, Any]:
    """The combined doc, completed (results.complete); its meta lists the runs, newest first, each with
    what it gave and links from OUT_DIR."""
    paths = [r.source["json"] for r in runs]
    twice = next((p for p in paths if paths.count(p) > 1), None)
    if twice:
        raise SystemExit(f"combine.py: {twice}: given twice")
    newest = sorted(runs, key=lambda r: r.doc["meta"]["date"], reverse=True)
    # each run's cells summarized against its own plain: which of them have a ratio
    own = {r.source["json"]: results.summarize({w: {m: {**rec, "run": r.source} for m, rec in ms.items()}
                                                for w, ms in r.doc["cases"].items()}) for r in runs}
    doc: dict[str, Any] = {"cases": {}, "notes": []}
    for w in dict.fromkeys(w for r in reversed(newest) for w in r.doc["cases"]):  # the oldest run's order first
        doc["cases"][w], notes = cells(w, [r for r in newest if w in r.doc["cases"]], own)
        doc["notes"] += notes
    given = {r.source["json"]: gave(r, doc["cases"]) for r in runs}
    for part in PARTS:
        run = next((r for r in newest if measured(r.doc.get(part))), None)
        if run is None:
            doc[part] = {"skipped": "measured in none of the runs combined"}
            continue
        doc[part] = {**run.doc[part], "run": run.source}
        given[run.source["json"]].append(part)
    doc["meta"] = {"combined": f"{len(runs)} run{'s' * (len(runs) > 1)}, each cell from the newest that ran it, "
                               "each part from the newest that measured it",
                   "gpu": ", ".join(sorted({r.source.get("gpu", "?") for r in runs})),
                   "driver": ", ".join(sorted({r.source.get("driver", "?") for r in runs})),
                   "runs": [{**r.source, "gave": given[r.source["json"]],
                             "links": {k: link(r.source[k], out_dir) for k in ("json", "log", "report")
                                       if k in r.source}} for r in newest]}
    results.complete(doc)
    return doc


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit("usage: combine.py OUT_DIR RUN.json[=LOG] [RUN.json[=LOG] ...]")
    out_dir = Path(argv[0])
    runs = [load(a) for a in argv[1:]]
    out_dir.mkdir(parents=True, exist_ok=True)
    print(results.publish(combine(runs, out_dir), out_dir))


if __name__ == "__main__":
    main(sys.argv[1:])
