"""Host-API probes on the GPU: an nvcc program with a known set of copies, sets, allocations, frees and
stream waits (tests/e2e/host_copies.cu) and PyTorch's .to("cuda") / .cpu() (tests/e2e/torch_copies.py),
counted by tests/e2e/copy_sizes.bpf.c per (kind, bytes): the counts equal what the program did. And
the cost: a loop of synchronous 64 KiB host-to-device copies under examples/memcpy_bytes.bpf.c takes at
most 1.05x its time without egpu."""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from egpu_preload.bpf import ctx as C
from egpu_preload.runtime import dump
from stub_job import ROOT, egpu_run

pytestmark = pytest.mark.gpu

E2E = ROOT / "tests" / "e2e"
KINDS = {"H2D": C.COPY_H2D, "D2H": C.COPY_D2H, "D2D": C.COPY_D2D, "SET": C.COPY_SET,
         "ALLOC_DEVICE": C.ALLOC_DEVICE, "ALLOC_HOST": C.ALLOC_HOST, "FREE_DEVICE": C.ALLOC_DEVICE,
         "FREE_HOST": C.ALLOC_HOST}
SIZED = struct.Struct("<IIQ")  # copy_sizes.bpf.c struct sized


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hostapi_shim")
    done = subprocess.run([sys.executable, str(ROOT / "shim" / "build.py"), str(out)], capture_output=True,
                          text=True, check=True)
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def probes(tmp_path_factory) -> dict[str, Path]:
    """copy_sizes and memcpy_bytes, prebuilt by scripts/gpu-prep.sh (the GPU machine has no clang), else
    compiled here."""
    prebuilt = os.environ.get("EGPU_PREBUILT_PROBES")
    out = tmp_path_factory.mktemp("hostapi_probes")
    paths = {}
    for name, src in (("copy_sizes", E2E), ("memcpy_bytes", ROOT / "examples")):
        if prebuilt:
            paths[name] = Path(prebuilt, f"{name}.v3.bpf.o")
        else:
            from egpu_preload.bpf.compile import compile_probe
            paths[name] = compile_probe(src / f"{name}.bpf.c", out / f"{name}.bpf.o")
    return paths


@pytest.fixture(scope="module")
def copies(tmp_path_factory) -> Path:
    exe = tmp_path_factory.mktemp("host_copies") / "host_copies"
    subprocess.run(["nvcc", "-O2", "-arch=sm_90", str(E2E / "host_copies.cu"), "-o", str(exe)], check=True)
    return exe


def env_for(shim: Path, sessions: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EGPU")}
    env.update(EGPU_SHIM=str(shim), XDG_RUNTIME_DIR=str(sessions), PYTHONFAULTHANDLER="1")
    return env


def probed(shim: Path, tmp: Path, probe: Path, *cmd: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    r = egpu_run(["--keep", "-p", str(probe), *cmd], env_for(shim, tmp), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    kept = [ln.removeprefix("egpu-run: session kept in ") for ln in r.stderr.splitlines() if "session kept" in ln]
    return r, dump.read_all(Path(kept[0]))


def sized(doc: dict, index: int) -> Counter:
    """Map ``index`` of copy_sizes.bpf.c's object as {(kind, bytes): count}."""
    out: Counter = Counter()
    for k, v in doc["probes"][0]["maps"][index]["entries"]:
        kind, _, size = SIZED.unpack(k)
        out[(kind, size)] += struct.unpack("<Q", v)[0]
    return out


def expected(stdout: str) -> dict[str, Counter]:
    """The program's EXPECT lines: copies (sets too), allocs, frees by (kind, bytes); stream syncs."""
    want = {"copies": Counter(), "allocs": Counter(), "frees": Counter(), "syncs": 0}
    for line in stdout.splitlines():
        parts = line.split()
        if not parts or parts[0] != "EXPECT":
            continue
        if parts[1] == "SYNC_STREAM":
            want["syncs"] += int(parts[2])
            continue
        table = "allocs" if parts[1].startswith("ALLOC") else "frees" if parts[1].startswith("FREE") else "copies"
        want[table][(KINDS[parts[1]], int(parts[2]))] += int(parts[3])
    return want


def test_an_nvcc_programs_copies_sets_allocations_and_waits_are_counted_exactly(shim, probes, copies, tmp_path):
    r, docs = probed(shim, tmp_path, probes["copy_sizes"], str(copies))
    (doc,) = docs
    want = expected(r.stdout)
    print("copies", dict(sized(doc, 0)), "allocs", dict(sized(doc, 1)), "frees", dict(sized(doc, 2)))
    assert sized(doc, 0) == want["copies"]
    assert sized(doc, 1) == want["allocs"]
    assert sized(doc, 2) == want["frees"]
    syncs, blocked_ns = struct.unpack("<QQ", doc["probes"][0]["maps"][3]["values"][0][:16])  # .bss
    assert syncs == want["syncs"] and blocked_ns > 0


def test_pytorch_to_and_cpu_copies_are_counted(shim, probes, tmp_path):
    """.to("cuda") of a pageable and of a pinned tensor are two host-to-device copies of its bytes,
    .cpu() one device-to-host copy; PyTorch's other copies (if any) are of other sizes."""
    r, docs = probed(shim, tmp_path, probes["copy_sizes"], sys.executable, str(E2E / "torch_copies.py"))
    (doc,) = docs
    want = expected(r.stdout)["copies"]
    got = sized(doc, 0)
    print("copies", dict(got))
    assert {k: got[k] for k in want} == dict(want)


def test_a_copy_bound_loop_costs_at_most_5_percent(shim, probes, copies, tmp_path):
    """20,000 synchronous 64 KiB host-to-device copies, plain and under memcpy_bytes (3 rounds each,
    interleaved; the fastest of each): probed / plain <= 1.05, and the probe counted every copy."""
    n = 20_000
    env = env_for(shim, tmp_path)
    plain, under = [], []
    for _ in range(3):
        p = subprocess.run([str(copies), "loop", str(n)], env=env, capture_output=True, text=True, check=True)
        plain.append(int(re.search(r"TIME_NS (\d+)", p.stdout).group(1)))
        r = egpu_run(["-p", str(probes["memcpy_bytes"]), str(copies), "loop", str(n)], env,
                     timeout=300)
        assert r.returncode == 0, r.stderr
        under.append(int(re.search(r"TIME_NS (\d+)", r.stdout).group(1)))
        assert re.search(rf"@by_direction\[EGPU_COPY_H2D\]: {{ copies: {n + 1}, bytes: {(n + 1) * 65536},", r.stdout)
    ratio = min(under) / min(plain)
    print(f"plain {min(plain) / n:.0f} ns/copy, probed {min(under) / n:.0f} ns/copy, ratio {ratio:.3f}")
    assert ratio <= 1.05
