"""PNG plots of bench/suite.py's results: ``python3 bench/plots.py [OUT_DIR | suite.json]`` (default $OUT)
reads suite.json and writes, beside it:

- overhead.png: per workload, each mode's ratio to uninstrumented (log scale), with the goal of each
  instrumented mode as a dashed line in its colour;
- jit.png: translate, rewrite and driver JIT of the 1,000-instruction kernel per probe, with the goal;
- shim.png: ns per launch of every round, uninstrumented and under the shim, with plain + the goal.

Returns the paths written; a part with no data is left out.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import results  # noqa: E402

GOALS = {mode: target for mode, _, target in results.RATIO_GOALS}


def overhead(doc: dict[str, Any], out: Path, plt: Any) -> Path | None:
    summary = doc.get("summary", {})
    modes = [(k, t) for k, t in results.MODES if k != "plain" and any(k in s for s in summary.values())]
    workloads = list(summary)
    if not modes or not workloads:
        return None
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(workloads)), 4.8))
    width = 0.8 / len(modes)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (mode, title) in enumerate(modes):
        xs = [j + (i - (len(modes) - 1) / 2) * width for j in range(len(workloads))]
        ys = [summary[w].get(mode, {}).get("ratio", float("nan")) for w in workloads]
        color = colors[i % len(colors)]
        bars = ax.bar(xs, ys, width, label=title, color=color)
        ax.bar_label(bars, labels=["" if y != y else f"{y:.2f}" for y in ys], fontsize=6, rotation=90, padding=2)
        for x, w, y in zip(xs, workloads, ys):
            if y != y and mode in summary[w]:  # ran, but no ratio: timed out, failed, skipped or unchecked
                ax.text(x, 1.0, results.no_ratio(summary[w][mode]), fontsize=6, rotation=90, ha="center",
                        va="bottom")
        if mode in GOALS:
            ax.axhline(GOALS[mode], color=color, linestyle="--", linewidth=1)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ratio = plt.matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x")
    ax.yaxis.set_major_formatter(ratio)
    ax.yaxis.set_minor_formatter(ratio)
    ax.tick_params(axis="y", which="minor", labelsize=7)
    # a combined doc's (bench/combine.py): under each workload the run of its uninstrumented time, and how
    # many other runs gave it cells (the report's table names them)
    runs: dict[str, list[str]] = {}
    for w, ms in doc.get("cases", {}).items():
        first = (ms.get("plain") or next(iter(ms.values()), {})).get("run")
        if first:
            others = len({r["run"]["json"] for r in ms.values()} - {first["json"]})
            more = [f"+{others} run{'s' * (others > 1)}"] if others else []
            runs[w] = results.run_label(first).rsplit(" ", 1) + more
    ax.set_xticks(range(len(workloads)), ["\n".join([w, *runs.get(w, [])]) for w in workloads],
                  fontsize=8 if runs else None)
    ax.set_ylabel("time / uninstrumented (median, log scale)")
    ax.set_title("egpu overhead per workload (dashed: goals)")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    path = out / "overhead.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def jit(doc: dict[str, Any], out: Path, plt: Any) -> Path | None:
    j = doc.get("jit", {})
    if not j.get("probes"):
        return None
    names = [p["probe"] for p in j["probes"]]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    bottom = [0.0] * len(names)
    for part in ("translate_ms", "rewrite_ms", "driver_ms"):
        ys = [p[part] for p in j["probes"]]
        ax.bar(names, ys, bottom=bottom, label=part.removesuffix("_ms"))
        bottom = [b + y for b, y in zip(bottom, ys)]
    ax.axhline(j.get("goal_ms", results.JIT_GOAL_MS), color="red", linestyle="--", linewidth=1, label="goal")
    ax.axhline(j["driver_original_ms"], color="gray", linestyle=":", linewidth=1, label="driver JIT, uninstrumented")
    ax.set_ylabel("ms")
    ax.set_title(f"JIT cost: {j['kernel']} ({j['instructions']} PTX instructions)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "jit.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def shim(doc: dict[str, Any], out: Path, plt: Any) -> Path | None:
    cases = doc.get("shim", {}).get("cases", {})
    if "plain" not in cases or "shim" not in cases:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name in cases:
        runs = cases[name]["enqueue_ns"]["runs"]
        ax.plot(range(1, len(runs) + 1), runs, marker="o", label=name)
    goal = cases["plain"]["enqueue_ns"]["median"] + doc["shim"].get("goal_ns", results.SHIM_GOAL_NS)
    ax.axhline(goal, color="red", linestyle="--", linewidth=1, label="plain median + goal")
    ax.xaxis.set_major_locator(plt.matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("round (cases run round-robin)")
    ax.set_ylabel("host ns per launch")
    ax.set_title("shim cost per launch")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "shim.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def draw(json_path: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc = json.loads(json_path.read_text())
    return [p for p in (f(doc, json_path.parent, plt) for f in (overhead, jit, shim)) if p is not None]


def main() -> None:
    arg = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "."))
    for path in draw(arg if arg.suffix == ".json" else arg / "suite.json"):
        print(path)


if __name__ == "__main__":
    main()
