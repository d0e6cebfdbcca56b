"""egpu-run --perfetto FILE (runtime/job_trace.py, durations.Timeline, output/perfetto.py): per-launch CUPTI
records kept bounded, the record type of ring buffers found by their ``ts`` field, and whole jobs against
the stand-in driver and libcupti (tests/runtime_stub/cupti_stub.c) written as one Chrome JSON trace."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from egpu_preload.bpf.compile import compile_probe
from egpu_preload.bpf.elf import load_object
from egpu_preload.runtime import durations, job_trace
from stub_job import MORE, ROOT, egpu_run
from test_durations import cupti_dir  # noqa: F401  (the stand-in libcupti, built once per module)

STUB_T0 = 1_000_000  # cupti_stub.c: cuptiGetTimestamp() and the first record's start
EVENTS_PROBE = MORE / "launch_events.bpf.c"


def test_timeline_keeps_launches_up_to_its_limit_and_counts_the_rest():
    t = durations.Timeline(clock_offset_ns=5, clock="test", limit=2)
    for i in range(4):
        t.add(100 * i, 100 * i + 10 + i, "k" if i % 2 else "j", 7, 40 + i, (i + 1, 1, 1), (32, 2, 1))
    d = t.dump()
    assert d["dropped"] == 2 and d["names"] == ["j", "k"] and d["clock_offset_ns"] == 5
    assert durations.timeline_records(d) == [
        durations.KernelRecord("j", 5, 15, 7, 40, (1, 1, 1), (32, 2, 1)),
        durations.KernelRecord("k", 105, 116, 7, 41, (2, 1, 1), (32, 2, 1))]


@pytest.mark.parametrize("source, types", [
    (EVENTS_PROBE, {"launch_events": "struct launch_event"}),
    (ROOT / "examples/access_trace.bpf.c", {"events": "struct mem_event"}),
    (ROOT / "tests/probes/ringbuf.bpf.c", {}),   # its struct event is not in BTF: records stay hex
    (ROOT / "tests/probes/count.bpf.c", {}),     # no ring buffer
])
def test_ring_buffer_record_types_come_from_the_struct_with_ts(source, types, tmp_path):
    obj = load_object(compile_probe(source, tmp_path / "p.bpf.o"))
    assert job_trace.record_types(obj) == types


def check_chrome_trace(doc: dict) -> list[dict]:
    """The Trace Event Format as Perfetto imports it: events; X with dur > 0; per track times in order."""
    events = doc["traceEvents"]
    assert {e["ph"] for e in events} <= {"X", "i", "M"}
    last: dict[tuple[int, int], float] = {}
    for e in events:
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int) and isinstance(e["name"], str)
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "process_labels", "thread_name")
            continue
        assert isinstance(e["ts"], float) and e["ts"] >= last.get((e["pid"], e["tid"]), 0.0)
        last[e["pid"], e["tid"]] = e["ts"]
        if e["ph"] == "X":
            assert e["dur"] > 0
    return events


def _job(stub_job, cupti_dir, tmp_path, *args: str, env_extra: dict[str, str] | None = None):  # noqa: F811
    log = tmp_path / "log"
    env = stub_job.env(log, EGPU_STUB_CUPTI="vecadd:1500,vecadd:3000,_Z5otherv:70000", **(env_extra or {}))
    env["LD_LIBRARY_PATH"] = f"{cupti_dir}:{env['LD_LIBRARY_PATH']}"
    return egpu_run([*args, str(stub_job.app), "cubin", "3", "64", "0"], env), log


def test_egpu_run_perfetto_writes_launches_and_ring_buffer_instants(stub_job, cupti_dir, tmp_path):  # noqa: F811
    path = tmp_path / "trace.json"
    before = time.clock_gettime_ns(time.CLOCK_REALTIME)
    r, _ = _job(stub_job, cupti_dir, tmp_path, "--perfetto", str(path), "-p", str(EVENTS_PROBE))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "app_vec cubin launches=3 threads=64 result=0"
    assert "@duration_ns" not in r.stdout  # --perfetto alone prints no durations
    assert "egpu-run: 3 kernel launches traced in" in r.stderr
    doc = json.loads(path.read_text())
    events = check_chrome_trace(doc)
    (proc,) = [e for e in events if e["name"] == "process_name"]
    assert proc["args"]["name"].startswith(str(stub_job.app) + " cubin 3 64 0")
    (labels,) = [e["args"]["labels"] for e in events if e["name"] == "process_labels"]
    assert "launches dropped: 0" in labels and "@launch_events dropped: 0" in labels
    threads = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert sorted(threads.values()) == ["@launch_events", "stream 0x7", "stream 0x8"]
    slices = [(e["name"], threads[e["tid"]], e["dur"], e["args"]["correlation_id"], e["args"]["grid"])
              for e in events if e["ph"] == "X"]
    assert slices == [("vecadd", "stream 0x7", 1.5, 100, [1, 1, 1]), ("vecadd", "stream 0x8", 3.0, 101, [2, 1, 1]),
                      ("other", "stream 0x7", 70.0, 102, [3, 1, 1])]
    # the launch probe's records, one per launch, with their BTF field names
    instants = [e for e in events if e["ph"] == "i"]
    assert len(instants) == 3 and {threads[e["tid"]] for e in instants} == {"@launch_events"}
    assert [e["args"]["launch_id"] for e in instants] == sorted(e["args"]["launch_id"] for e in instants)
    assert all(e["args"]["kernel_id"] == "vecadd" and int(e["args"]["ts"]) >= before for e in instants)
    # both on CLOCK_REALTIME: the stand-in's kernels (cuptiGetTimestamp = STUB_T0 at start) land near the run
    first_kernel = doc["otherData"]["base_ns"] + round(min(e["ts"] for e in events if e["ph"] == "X") * 1000)
    assert before - 1_000_000 <= first_kernel <= time.clock_gettime_ns(time.CLOCK_REALTIME)
    _trace_processor_slice_count(path, 3)


@pytest.mark.parametrize("target, reason", [("missing/trace.json", "no such directory"), (".", "is a directory")])
def test_an_unwritable_trace_file_stops_the_job_before_it_starts(
        stub_job, cupti_dir, tmp_path, target, reason):  # noqa: F811
    r, log = _job(stub_job, cupti_dir, tmp_path, "--perfetto", str(tmp_path / target))
    assert r.returncode == 125 and reason in r.stderr and r.stderr.startswith("egpu-run: ")
    assert not log.exists()  # the stand-in driver was never called


def _trace_processor_slice_count(path: Path, count: int) -> None:
    """With the perfetto package and a trace_processor_shell (EGPU_TRACE_PROCESSOR: the package would
    otherwise download one), the trace processor loads the file and finds ``count`` slices."""
    try:
        from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig
    except ImportError:
        return
    shell = os.environ.get("EGPU_TRACE_PROCESSOR")
    if not shell:
        return
    tp = TraceProcessor(trace=str(path), config=TraceProcessorConfig(bin_path=shell))
    try:
        assert [r.n for r in tp.query("select count(*) as n from slice where dur > 0")] == [count]
    finally:
        tp.close()


def test_copies_syncs_and_migrations_share_the_timeline_with_kernels(stub_job, cupti_dir, tmp_path):  # noqa: F811
    from test_cupti_activity import COPIES, UVM
    path = tmp_path / "trace.json"
    r, _ = _job(stub_job, cupti_dir, tmp_path, "--perfetto", str(path),
                env_extra={"EGPU_STUB_CUPTI_COPIES": COPIES, "EGPU_STUB_CUPTI_UVM": UVM})
    assert r.returncode == 0, r.stderr
    doc = json.loads(path.read_text())
    events = check_chrome_trace(doc)
    threads = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert sorted(threads.values()) == ["host synchronization", "stream 0x7", "stream 0x8",
                                        "unified memory cpu_page_fault", "unified memory gpu_page_fault",
                                        "unified memory htod"]
    base = doc["otherData"]["base_ns"]
    kernel_start = min(e["ts"] for e in events if e.get("cat") == "kernel")

    def rel(e: dict) -> float:  # µs after the first kernel: cupti_stub.c puts kernels and copies at STUB_T0 + ...
        return round(e["ts"] - kernel_start, 3)

    on_7 = [(e["name"], rel(e), e["dur"], e["args"].get("bytes")) for e in events
            if e["ph"] == "X" and threads[e["tid"]] == "stream 0x7"]
    assert on_7 == [("vecadd", 0.0, 1.5, None), ("other", 2.0, 70.0, None), ("memcpy HtoD", 100.0, 2.0, 1048576),
                    ("memcpy HtoD", 110.0, 6.0, 1048576), ("memset device", 140.0, 0.5, 256)]
    (sync,) = [e for e in events if e["ph"] == "X" and threads[e["tid"]] == "host synchronization"]
    assert (sync["name"], rel(sync), sync["dur"], sync["args"]["stream"]) == ("stream_synchronize", 150.0, 0.9, 7)
    um = [(threads[e["tid"]], e["ph"], rel(e), e.get("dur"), e["args"]["address"], e["args"]["value"])
          for e in events if e.get("cat") == "uvm"]
    assert um == [("unified memory cpu_page_fault", "i", 0.2, None, "0x401234", 0),
                  ("unified memory gpu_page_fault", "X", 0.3, 0.05, "0x7f0000200000", 2),
                  ("unified memory htod", "X", 0.0, 3.0, "0x7f0000200000", 65536),
                  ("unified memory htod", "X", 0.1, 0.1, "0x7f0000210000", 4096)]
    (labels,) = [e["args"]["labels"] for e in events if e["name"] == "process_labels"]
    assert "copies dropped: 0" in labels and "unified memory records dropped: 0" in labels
    assert base > 0
    _trace_processor_slice_count(path, 3 + 5 + 1 + 3)
