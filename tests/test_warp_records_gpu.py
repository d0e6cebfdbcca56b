"""On the GPU: examples/mem_trace_warp.bpf.c expands to the trace examples/access_trace.bpf.c writes, lane
for lane but the time (each lane of a per-thread trace reads the clock itself; a warp record carries its
leader's), on tests/e2e/vecadd.cu (one launch, 4096 threads: every record affine, every address vecadd's
index math, site base + 4 * (blockIdx.x * 256 + threadIdx.x)) and on tests/e2e/gather.cu
(4001 threads: records of all three forms, lanes writing their own tail entries, partial masks).

Run by the lead: ``python3 -m pytest -m gpu tests/test_warp_records_gpu.py`` (nvcc and a GPU needed).
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from egpu_preload.output import warp_records as wr
from stub_job import ROOT, egpu_run
from test_e2e_gpu import env_for, shim, split, vecadd  # noqa: F401 - fixtures

pytestmark = pytest.mark.gpu
THREADS, BLOCK = 4096, 256


def _example(name: str, out: Path) -> Path:
    prebuilt = os.environ.get("EGPU_PREBUILT_PROBES")  # the GPU machine has no clang (scripts/gpu-prep.sh)
    if prebuilt:
        return Path(prebuilt) / f"{name}.v3.bpf.o"
    from egpu_preload.bpf.compile import compile_probe
    return compile_probe(ROOT / "examples" / f"{name}.bpf.c", out / f"{name}.bpf.o")


@pytest.fixture(scope="module")
def gather(tmp_path_factory) -> Path:
    exe = tmp_path_factory.mktemp("gather") / "gather"
    subprocess.run(["nvcc", "-O2", "-arch=sm_90", str(ROOT / "tests" / "e2e" / "gather.cu"), "-o", str(exe)],
                   check=True)
    return exe


def _records(cmd: list[str], probe: Path, ring: str, env: dict[str, str]) -> list:
    done = egpu_run(["--json", "-p", str(probe), *cmd], env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines, docs = split(done.stdout)
    assert any("wrong 0" in ln for ln in lines), lines
    value = docs[-1]["maps"][ring]
    assert value["dropped"] == 0
    return [r["value"] for r in value["records"]]


def _lane(value) -> wr.LaneAccess:
    """access_trace's record as the JSON has it: struct mem_event by field, or hex where untyped."""
    if isinstance(value, str):
        return wr.LaneAccess.unpack(bytes.fromhex(value))
    return wr.LaneAccess(value["ts"], value["addr"], value["kernel_id"], value["launch_id"], value["site"],
                         value["size"], value["flags"], value["sm"], tuple(value["block"]), tuple(value["thread"]))


def _untimed(r: wr.LaneAccess) -> tuple:
    return (r.addr, r.kernel_id, r.launch_id, r.site, r.size, r.flags, r.sm, r.block, r.thread)


def _placed(lanes: list[wr.LaneAccess]) -> Counter:
    """Lanes untimed and unplaced: each address as its offset from its site's lowest, and each SM as the
    block's. The two runs are two processes, whose buffers the driver places apart (the H200 put vecadd's
    0x7f2c... in one and 0x7f38... in the other; each site of these programs reads or writes one buffer),
    and whose blocks the GPU places on SMs of its choosing (block 0 ran on SM 124 in one and 128 in the
    other while other tests ran beside them, 2026-12-04d). Within a run, every lane of a block must carry
    that block's one SM."""
    low: dict[int, int] = {}
    sms: dict[tuple, set[int]] = {}
    for r in lanes:
        low[r.site] = min(low.get(r.site, r.addr), r.addr)
        sms.setdefault(r.block, set()).add(r.sm)
    assert all(len(s) == 1 for s in sms.values()), {b: s for b, s in sms.items() if len(s) > 1}
    return Counter((r.addr - low[r.site], *_untimed(r)[1:6], *_untimed(r)[7:]) for r in lanes)


def _same_lanes(expanded: list[wr.LaneAccess], per_lane: list[wr.LaneAccess]) -> None:
    """The same lanes, as multisets; else a short account (pytest's own diff of 10^5 records runs minutes)."""
    got, want = _placed(expanded), _placed(per_lane)
    same = got == want
    assert same, (f"{len(expanded)} expanded lanes, {len(per_lane)} per-lane records; only expanded "
                  f"({sum((got - want).values())}): {sorted(got - want)[:4]}; only per-lane "
                  f"({sum((want - got).values())}): {sorted(want - got)[:4]}")


def _both(cmd: list[str], env: dict[str, str], tmp_path: Path) -> tuple[list[wr.LaneAccess], list[bytes]]:
    """(access_trace's records, mem_trace_warp's) of one run each of cmd, after checking that the warp
    records expand to the per-lane ones."""
    per_lane = [_lane(v) for v in _records(cmd, _example("access_trace", tmp_path), "events", env)]
    raw = [bytes.fromhex(v) for v in _records(cmd, _example("mem_trace_warp", tmp_path), "warp_events", env)]
    expanded = [lane for r in raw for lane in wr.expand(r)]
    _same_lanes(expanded, per_lane)
    ring = (sum(wr.LANE.size + 8 for _ in per_lane), sum(len(r) + 8 for r in raw))
    print(f"{Path(cmd[0]).name}: ring bytes per lane {ring[0]}, per warp {ring[1]} ({ring[0] / ring[1]:.1f}x fewer)")
    return per_lane, raw


def test_vecadd_warp_trace_expands_to_the_per_thread_trace(vecadd, shim, tmp_path):  # noqa: F811
    per_lane, raw = _both([str(vecadd["static"]), "1", str(THREADS)], env_for(shim, tmp_path / "s"), tmp_path)
    expanded = [lane for r in raw for lane in wr.expand(r)]
    assert len(per_lane) == 3 * THREADS   # a[i], b[i] loaded, c[i] stored
    assert {wr.decode(r).form for r in raw} == {wr.FORM_AFFINE} and len(raw) == 3 * THREADS // 32
    for site in {r.site for r in expanded}:
        lanes = [r for r in expanded if r.site == site]
        low = min(r.addr for r in lanes)
        assert all(r.addr == low + 4 * (r.block[0] * BLOCK + r.thread[0]) for r in lanes), site


def test_gather_warp_records_of_every_form_expand_to_the_per_thread_trace(gather, shim, tmp_path):  # noqa: F811
    n = 4001   # gcd(7, n) = 1: perm is a permutation; the last warp has one lane
    per_lane, raw = _both([str(gather), str(n)], env_for(shim, tmp_path / "s"), tmp_path)
    assert len(per_lane) == 4 * n + n // 2   # perm[i], in[perm[i]], big[...], out[i]; odd[i >> 1] by odd i
    records = [wr.decode(r) for r in raw]
    assert {r.form for r in records} == {wr.FORM_AFFINE, wr.FORM_OFFSETS, wr.FORM_ADDRS}
    assert any(bin(r.mask).count("1") == n % 32 for r in records)   # the last warp


def _trace_file_lanes(cmd: list[str], probe: Path, env: dict[str, str], path: Path) -> list[wr.LaneAccess]:
    """The lanes of one run of cmd under egpu-run --trace, as egpu trace reads its file back."""
    from egpu_preload.output import tracefile
    done = egpu_run(["--trace", str(path), "-p", str(probe), *cmd], env, timeout=300)
    assert done.returncode == 0 and "wrong 0" in done.stdout, done.stderr[-3000:]
    assert "none dropped" in done.stderr, done.stderr[-3000:]
    return [wr.LaneAccess(r["ts"], r["addr"], r["kernel_id"], r["launch_id"], r["site"], r["size"], r["flags"],
                          r["sm"], (r["block[0]"], r["block[1]"], r["block[2]"]),
                          (r["thread[0]"], r["thread[1]"], r["thread[2]"]))
            for r in tracefile.read(path).rows.to_pylist()]


def test_gather_warp_trace_file_reads_back_as_the_per_thread_trace_file(gather, shim, tmp_path):  # noqa: F811
    """egpu-run --trace keeps mem_trace_warp's records whole; egpu trace's reader expands them into the rows
    access_trace's trace file has, on records of every form."""
    n = 4001
    cmd, env = [str(gather), str(n)], env_for(shim, tmp_path / "s")
    per_lane = _trace_file_lanes(cmd, _example("access_trace", tmp_path), env, tmp_path / "lanes.arrow")
    expanded = _trace_file_lanes(cmd, _example("mem_trace_warp", tmp_path), env, tmp_path / "warp.parquet")
    assert len(per_lane) == 4 * n + n // 2
    _same_lanes(expanded, per_lane)
