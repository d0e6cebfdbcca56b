"""egpu-run --trace on the GPU: a full memory trace of tests/e2e/vecadd.cu (examples/access_trace.bpf.c,
a record per global access, through a 16 MiB ring several times over) with ``--on-full wait``, the
default under --trace: no record dropped, and every address the kernel's index math says
(``c[i] = a[i] + b[i] * (i % 3)``: a load of a[i] and of b[i] and a store of c[i], once per thread i).
Needs pyarrow on the GPU machine (scripts/gpu-prep.sh puts its wheel in .whl)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from stub_job import ROOT, egpu_run
from test_e2e_gpu import env_for, shim  # noqa: F401  (the shim fixture)

pytestmark = pytest.mark.gpu

THREADS = 1 << 18   # 786,432 records of 80 bytes: 60 MB through the 16 MiB ring
LOAD, STORE = 1, 2  # egpu.bpf.h's EGPU_F_LOAD, EGPU_F_STORE


def _access_trace(tmp_path: Path) -> Path:
    prebuilt = os.environ.get("EGPU_PREBUILT_PROBES")   # the GPU machine has no clang (gpu-prep.sh)
    if prebuilt:
        return Path(prebuilt) / "access_trace.v3.bpf.o"
    from egpu_preload.bpf.compile import compile_probe
    return compile_probe(ROOT / "examples" / "access_trace.bpf.c", tmp_path / "access_trace.bpf.o")


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_a_full_memory_trace_of_vecadd_keeps_every_access(shim, tmp_path, suffix):  # noqa: F811
    """Both of the writer's forms: Arrow IPC's first run on the H200 segfaulted the job in write_table at
    exit (2026-12-04d), behind the teardown of pyarrow state first used after the exit hook was armed. Some of the
    records are taken by passes that walk none (the submits counted on the SMs' lines: devmaps.py COMMITTED)."""
    pa = pytest.importorskip("pyarrow")
    import numpy as np
    import pyarrow.compute as pc
    from egpu_preload.output import tracefile
    exe = tmp_path / "vecadd"
    subprocess.run(["nvcc", "-O2", "-arch=sm_90", str(ROOT / "tests" / "e2e" / "vecadd.cu"), "-o", str(exe)],
                   check=True)
    out = tmp_path / f"trace{suffix}"
    r = egpu_run(["--trace", str(out), "-p", str(_access_trace(tmp_path)), str(exe), "1", str(THREADS)],
                 env_for(shim, tmp_path), timeout=600)
    assert r.returncode == 0, r.stderr
    assert " wrong 0 " in r.stdout
    assert f"egpu-run: {3 * THREADS:,} records in {out}, none dropped" in r.stderr, r.stderr
    # the submits counted on the SMs' lines: passes that found them summing to head took records unwalked
    whole = re.search(r"MB of records taken, ([\d,.]+) MB of them unwalked", r.stderr)
    assert whole and float(whole.group(1).replace(",", "")) > 0, r.stderr
    trace = tracefile.read(out)
    assert trace.complete and trace.dropped == {"events": 0, "trace_printk": 0}
    t = trace.rows.select(["map", "seq", "addr", "flags", "site", "block[0]", "thread[0]"])
    t = t.filter(pc.equal(t.column("map").cast(pa.string()), "events"))
    assert t.num_rows == 3 * THREADS
    assert np.array_equal(np.sort(t.column("seq").to_numpy()), np.arange(3 * THREADS, dtype=np.uint64))
    i = t.column("block[0]").to_numpy().astype(np.int64) * 256 + t.column("thread[0]").to_numpy()
    addr = t.column("addr").to_numpy().astype(np.int64)
    flags, site = t.column("flags").to_numpy(), t.column("site").to_numpy()
    bases = {}
    for s in np.unique(site):
        at = site == s
        base = addr[at] - 4 * i[at]           # one array per site: addr = base + 4 i for every thread
        assert (base == base[0]).all(), f"site {s}: addresses off the index math"
        assert np.array_equal(np.sort(i[at]), np.arange(THREADS)), f"site {s}: not once per thread"
        assert len(set(flags[at])) == 1
        bases[int(s)] = (int(base[0]), int(flags[at][0]))
    kinds = sorted(f for _, f in bases.values())
    assert kinds == [LOAD, LOAD, STORE], bases           # a[i], b[i] loaded; c[i] stored
    starts = sorted(b for b, _ in bases.values())
    assert all(hi - lo >= 4 * THREADS for lo, hi in zip(starts, starts[1:]))   # three distinct arrays


def test_a_probe_waiting_for_its_own_record_ends_after_the_stall_time(shim, probe_obj, tmp_path):  # noqa: F811
    """tests/probes/self_wait.bpf.c reserves a second record while it holds the first unsubmitted, and two
    never fit its ring: under --on-full wait the second waits for a reader that stops at the first. With
    the stall time at 500 ms (EGPU_WAIT_STALL_MS) the second gives its credit back and is dropped,
    counted, the first is kept, and the job ends (the kernel never did before)."""
    pytest.importorskip("pyarrow")
    from egpu_preload.output import tracefile
    exe = tmp_path / "vecadd"
    subprocess.run(["nvcc", "-O2", "-arch=sm_90", str(ROOT / "tests" / "e2e" / "vecadd.cu"), "-o", str(exe)],
                   check=True)
    out = tmp_path / "t.arrow"
    env = env_for(shim, tmp_path) | {"EGPU_WAIT_STALL_MS": "500"}
    r = egpu_run(["--trace", str(out), "-p", str(probe_obj("self_wait")), str(exe), "1", "32"], env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert " wrong 0 " in r.stdout
    assert (f"egpu-run: 1 record in {out}, 1 dropped by the probes (larger than the ring, or waiting on a "
            "reader that took nothing for 0.5 s)") in r.stderr, r.stderr
    trace = tracefile.read(out)
    assert trace.dropped["events"] == 1 and trace.rows.num_rows == 1
