"""CUPTI's copies and unified-memory records on the GPU (runtime/copies.py, runtime/uvm.py).

tests/e2e/copies.cu makes K rounds of known copies on one stream: egpu-run --durations counts exactly
those, with non-zero device times. tests/e2e/uvm_oversub.cu makes managed memory migrate both ways:
CUPTI's totals show GPU and CPU faults and at least the bytes the kernels touched going host-to-device;
examples/uvm_ranges.bpf.c, delivered the same records, sums exactly CUPTI's totals; and
examples/uvm_lru.py reads the --perfetto trace (each test prints what it saw, for the log).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

from stub_job import ROOT, egpu_run
from test_e2e_gpu import env_for, shim, split  # noqa: F401  (shim: the module's fixture)

pytestmark = pytest.mark.gpu

E2E = ROOT / "tests" / "e2e"
MIB = 1 << 20
ROUNDS = 4


def build(name: str, out: Path) -> Path:
    exe = out / name
    subprocess.run(["nvcc", "-O2", "-arch=sm_90", str(E2E / f"{name}.cu"), "-o", str(exe)], check=True)
    return exe


def test_copies_are_counted_as_the_program_made_them(shim, tmp_path):  # noqa: F811
    exe = build("copies", tmp_path)
    r = egpu_run(["--json", "--durations", str(exe), str(ROUNDS)], env_for(shim, tmp_path), timeout=300)
    assert r.returncode == 0, r.stderr
    lines, docs = split(r.stdout)
    print(lines, json.dumps(docs[-1]["copies"]))
    assert lines == [f"copies rounds={ROUNDS} htod={ROUNDS}/{ROUNDS * MIB} memset={ROUNDS}/{ROUNDS * MIB // 4} "
                     f"dtod={ROUNDS}/{ROUNDS * MIB // 2} dtoh={ROUNDS}/{ROUNDS * MIB} bad=0"]
    doc = docs[-1]
    assert doc["copies_error"] is None
    got = {(c["operation"], c["direction"] if c["operation"] != "memset" else "*"): (c["count"], c["bytes"])
           for c in doc["copies"]}
    assert got == {("memcpy", "HtoD"): (ROUNDS, ROUNDS * MIB), ("memset", "*"): (ROUNDS, ROUNDS * MIB // 4),
                   ("memcpy", "DtoD"): (ROUNDS, ROUNDS * MIB // 2), ("memcpy", "DtoH"): (ROUNDS, ROUNDS * MIB)}
    assert len({c["stream"] for c in doc["copies"]}) == 1   # all on the program's one stream
    assert all(c["min_ns"] > 0 for c in doc["copies"])


def test_unified_memory_faults_and_migrations_agree_with_cupti(shim, tmp_path):  # noqa: F811
    exe = build("uvm_oversub", tmp_path)
    probe = _example("uvm_ranges", tmp_path)
    trace = tmp_path / "trace.json"
    r = egpu_run(["--json", "--durations", "--perfetto", str(trace), "-p", str(probe), str(exe), "128", str(ROUNDS)],
                 env_for(shim, tmp_path), timeout=600)
    assert r.returncode == 0, r.stderr
    lines, docs = split(r.stdout)
    print(lines, r.stderr[-2000:])
    (program,) = lines
    fields = dict(kv.split("=") for kv in program.split()[1:])
    assert fields["bad"] == "0"
    timed = next(d for d in docs if "uvm" in d)
    maps = next(d for d in docs if "maps" in d)["maps"]
    print(json.dumps(timed["uvm"]), json.dumps(maps))
    assert timed["uvm_error"] is None
    counters = timed["uvm"]
    # the GPU faulted on every range a kernel touched, and the host took the pages back
    assert counters["gpu_page_fault"]["count"] > 0 and counters["cpu_page_fault"]["count"] > 0
    assert counters["dtoh"]["value"] > 0
    # every range a kernel touched went to the GPU at least once, all its pages (each 4 KiB page was
    # written); each round's 24 ranges come back unless the driver's thrashing mitigation maps some
    # remotely instead (then "thrashing"/"remote_map" count them): the ratio goes to the log
    assert counters["htod"]["value"] >= int(fields["distinct"]) * 2 * MIB
    print("htod bytes / bytes the kernels touched:",
          counters["htod"]["value"] / (int(fields["range_accesses"]) * 2 * MIB))
    # the probe saw exactly CUPTI's records
    events = {e["key"]: e["value"] for e in maps["events"]["entries"]}
    assert events.get(1, 0) == counters["htod"]["count"] and events.get(4, 0) == counters["gpu_page_fault"]["count"]
    assert events.get(3, 0) == counters["cpu_page_fault"]["count"]
    assert sum(e["value"] for e in maps["htod_bytes"]["entries"]) == counters["htod"]["value"]
    assert sum(e["value"] for e in maps["dtoh_bytes"]["entries"]) == counters["dtoh"]["value"]
    # the trace carries the same migrations, and the LRU/LFU replay runs on it
    plot = ["--plot", str(tmp_path / "hit_rate.png")] if importlib.util.find_spec("matplotlib") else []
    lru = subprocess.run(["python3", str(ROOT / "examples/uvm_lru.py"), str(trace), "--sizes", "8,16,24,32", *plot],
                         capture_output=True, text=True)
    print(lru.stdout, lru.stderr)
    assert lru.returncode == 0
    doc = json.loads(trace.read_text())
    tracks = {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    assert {"unified memory htod", "unified memory dtoh", "unified memory gpu_page_fault"} <= tracks


def _example(name: str, out: Path) -> Path:
    """examples/NAME.bpf.c, prebuilt on the GPU machine (scripts/gpu-prep.sh) or compiled here."""
    prebuilt = os.environ.get("EGPU_PREBUILT_PROBES")
    if prebuilt:
        return Path(prebuilt) / f"{name}.v3.bpf.o"
    from egpu_preload.bpf.compile import compile_probe
    return compile_probe(ROOT / "examples" / f"{name}.bpf.c", out / f"{name}.bpf.o")
