"""ns the shim adds to an allocation-heavy program: PyTorch allocating and freeing tensors of many
sizes with its cache off, so every allocation and free reaches cuMemAlloc/cuMemFree through the
shim's allocation hooks (the table cow/ checkpoints from), against the same program without LD_PRELOAD.

Usage (on the GPU machine): ``python3 bench/bench_alloc.py OUT.json [PAIRS]``. The cases run
round-robin, pinned to one CPU, and the cost is the median of per-round differences, as in
bench_shim.py. Goal (the cow/ issue): no measurable slowdown, read here as under 1% of a pair, met only
when every round's shim/plain ratio is (bench/paired.py: at least 10 rounds).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import paired  # noqa: E402
from bench_shim import pick_cpus, run, summarize  # noqa: E402

RUNS = 11


def measure(work: Path, pairs: int = 20000, runs: int = RUNS) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EGPU_") or k == "EGPU_SHIM"}
    env.update(XDG_RUNTIME_DIR=str(work), PYTORCH_NO_CUDA_MEMORY_CACHING="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    prog = [sys.executable, str(ROOT / "bench" / "workloads" / "alloc_churn.py"), str(pairs)]
    commands = {"plain": prog, "shim": [sys.executable, "-c", "import launcher; launcher.run_main()", *prog]}
    cpu = pick_cpus(1)
    run(commands["shim"], env, cpu)  # builds the shim if it is stale, outside the timing
    rounds = [{case: run(cmd, env, cpu) for case, cmd in commands.items()} for _ in range(runs)]
    doc = {"pairs": pairs, "runs": runs, "cpus": sorted(cpu or ()),
           "cases": summarize(rounds, ("pair_ns",), float("inf"))}
    plain = doc["cases"]["plain"]["pair_ns"]["median"]
    doc["added_fraction"] = doc["cases"]["shim"]["pair_ns"]["added_median"] / plain
    ratios = paired.ratios(doc["cases"]["plain"]["pair_ns"]["runs"], doc["cases"]["shim"]["pair_ns"]["runs"])
    doc["added_fraction_spread"] = [ratios["min"] - 1, ratios["max"] - 1]
    doc["goal"] = paired.verdict(ratios, 1.01)
    doc["meets_goal"] = doc["goal"] == "met"
    return doc


def main() -> None:
    out_path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("bench_alloc.json")
    with tempfile.TemporaryDirectory() as tmp:
        doc = measure(Path(tmp), int(sys.argv[2]) if len(sys.argv) > 2 else 20000)
    shim = doc["cases"]["shim"]["pair_ns"]
    plain = doc["cases"]["plain"]["pair_ns"]["median"]
    print(f"plain {plain:.0f} ns per allocate+free, shim +{shim['added_median']:.0f} ns "
          f"({100 * doc['added_fraction']:.2f}%, rounds {100 * doc['added_fraction_spread'][0]:+.2f}% .. "
          f"{100 * doc['added_fraction_spread'][1]:+.2f}%: {doc['goal']})")
    out_path.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
