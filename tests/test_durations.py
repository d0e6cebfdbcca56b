"""Kernel durations (runtime/durations.py): the log2 slots, the aggregate per kernel, the text egpu-run
--durations prints, and whole jobs where a stand-in libcupti (tests/runtime_stub/cupti_stub.c) hands
over CUPTI-shaped kernel records."""

from __future__ import annotations

import json
import subprocess

import pytest

from egpu_preload.runtime import durations, spread
from stub_job import MORE, egpu_run


@pytest.mark.parametrize("ns, slot", [(0, 0), (1, 0), (2, 1), (3, 1), (1023, 9), (1024, 10), (1 << 70, 63)])
def test_log2_slots(ns, slot):
    assert spread.log2_slot(ns) == slot


def test_records_aggregate_per_kernel_and_skip_other_kinds():
    d = durations.Durations()
    durations.parse_records([(10, 100, 1100, "k"), (3, 0, 3000, "k"), (1, 0, 50, "memcpy"),
                             (10, 500, 400, "backwards"), (10, 0, 7, "j")], d)
    assert d.dump() == [["j", 1, 7, 7, 7, [[2, 1]]], ["k", 2, 4000, 1000, 3000, [[9, 1], [11, 1]]]]


DOC = {"pid": 9, "durations": [["k", 2, 4000, 1000, 3000, [[9, 1], [11, 1]]], ["j", 1, 7, 7, 7, [[2, 1]]]],
       "durations_error": None}
BAR = "@" * 52


def test_text_lists_the_longest_total_first_with_empty_buckets_between():
    assert durations.render([DOC]).splitlines() == [
        "@duration_ns[k]: count 2, total 4000, mean 2000, min 1000, max 3000",
        f"[512, 1K)              1 |{BAR}|",
        "[1K, 2K)               0 |" + " " * 52 + "|",
        f"[2K, 4K)               1 |{BAR}|",
        "",
        "@duration_ns[j]: count 1, total 7, mean 7, min 7, max 7",
        f"[4, 8)                 1 |{BAR}|"]


def test_without_cupti_the_reason_is_printed():
    why = "no libcupti (tried libcupti.so)"
    doc = {"pid": 3, "durations": [], "durations_error": why, "copies_error": why, "uvm_error": why}
    assert durations.render([doc]) == "durations: pid 3: none (no libcupti (tried libcupti.so))\n"
    (line,) = durations.render_json([doc], 1.5).splitlines()
    assert json.loads(line) == {"time": 1.5, "pid": 3, "durations": {}, "copies": [], "uvm": {}, "error": why,
                                "copies_error": why, "uvm_error": why}


@pytest.fixture(scope="module")
def cupti_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("cupti")
    subprocess.run(["gcc", "-O1", "-Wall", "-Werror", "-shared", "-fPIC", str(MORE / "cupti_stub.c"), "-o",
                    str(d / "libcupti.so")], check=True)
    return d


@pytest.mark.parametrize("as_json", [False, True])
def test_durations_of_sass_only_kernels(stub_job, cupti_dir, tmp_path, as_json):
    log = tmp_path / "log"
    env = stub_job.env(log, EGPU_STUB_CUPTI="vecadd:1500,vecadd:3000,_Z5otherv:70000")
    env["LD_LIBRARY_PATH"] = f"{cupti_dir}:{env['LD_LIBRARY_PATH']}"
    r = egpu_run([*(["--json"] if as_json else []), "--durations", str(stub_job.app), "cubin", "3", "64", "0"], env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "app_vec cubin launches=3 threads=64 result=0"
    if as_json:
        doc = json.loads(lines[1])
        assert doc["durations"]["vecadd"] == {"count": 2, "total_ns": 4500, "min_ns": 1500, "max_ns": 3000,
                                              "hist_log2_ns": {"10": 1, "11": 1}}
        assert doc["error"] is None
    else:
        assert lines[1:] == [
            "@duration_ns[_Z5otherv]: count 1, total 70000, mean 70000, min 70000, max 70000",
            f"[64K, 128K)            1 |{BAR}|",
            "",
            "@duration_ns[vecadd]: count 2, total 4500, mean 2250, min 1500, max 3000",
            f"[1K, 2K)               1 |{BAR}|",
            f"[2K, 4K)               1 |{BAR}|"]
    calls = [ln.split(" ", 1)[1] for ln in log.read_text().splitlines()]
    # concurrent-kernel records (they do not serialize kernels), copies and sets, unified-memory counters
    # (the stand-in refuses all eight: the basic four again), flushed once at exit after the sync
    assert [c for c in calls if c.startswith("cupti")] == [
        "cuptiActivityEnable 10", "cuptiActivityEnable 1", "cuptiActivityEnable 2", "cuptiActivityEnable 22",
        *(f"cuptiActivityConfigureUnifiedMemoryCounter {k}" for k in (1, 2, 3, 4)), "cuptiActivityEnable 25",
        "cuptiActivityFlushAll 1"]
    assert calls.index("cuptiActivityFlushAll 1") > max(i for i, c in enumerate(calls)
                                                        if c.startswith("cuCtxSynchronize"))
