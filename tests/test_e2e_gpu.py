"""egpu-run on real programs on the GPU: the program's output is bit-identical with and without egpu,
and a kernel-entry counter (tests/probes/count.bpf.c: one ARRAY slot every thread adds 1 to) reads
exactly launches x threads.

Programs (tests/e2e): vecadd.cu with nvcc (static cudart and -cudart shared; CUDA_MODULE_LOADING lazy
and eager), graphs.cu (a captured and a built CUDA graph replayed), refused.cu (a kernel the rewriter
leaves alone beside one it instruments), a CuPy RawKernel (PTX through cuModuleLoadData: instrumented),
a Triton kernel (its PTX instrumented by egpu-ptxas, Triton's ptxas under egpu-run; the cubin it loads
is adopted); a bpf_printk line per thread (tests/e2e/printk_flood.bpf.c), more than the device's trace ring
holds, its drops said.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from stub_job import ROOT, egpu_run

pytestmark = pytest.mark.gpu

E2E = ROOT / "tests" / "e2e"
LAUNCHES, THREADS = 10, 1 << 20


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("e2e_shim")
    done = subprocess.run([sys.executable, str(ROOT / "shim" / "build.py"), str(out)], capture_output=True,
                          text=True, check=True)
    return Path(done.stdout.strip().splitlines()[-1])


def cuda_lib_dirs() -> list[str]:
    """Where nvcc links libcudart.so from (its -L directories, without the stubs)."""
    dry = subprocess.run(["nvcc", "--dryrun", "-cudart", "shared", str(E2E / "vecadd.cu")], capture_output=True,
                         text=True).stderr
    libs = next((ln for ln in dry.splitlines() if "LIBRARIES=" in ln), "")
    return [d for d in re.findall(r'"-L([^"]+)"', libs) if not d.rstrip("/").endswith("stubs")]


@pytest.fixture(scope="module")
def vecadd(tmp_path_factory):
    """vecadd built with static cudart and with -cudart shared (sm_90 SASS + compute_90 PTX, the way a
    program for the H200 ships)."""
    out = tmp_path_factory.mktemp("e2e_vecadd")
    built = {}
    for cudart in ("static", "shared"):
        exe = out / f"vecadd_{cudart}"
        rpath = [f"-Xlinker=-rpath,{d}" for d in cuda_lib_dirs()] if cudart == "shared" else []
        subprocess.run(["nvcc", "-O2", "-arch=sm_90", "-cudart", cudart, *rpath, str(E2E / "vecadd.cu"),
                        "-o", str(exe)], check=True)
        built[cudart] = exe
    return built


def split(stdout: str) -> tuple[list[str], list[dict]]:
    """(the program's lines, egpu-run's JSON documents)."""
    lines = stdout.splitlines()
    docs = [json.loads(ln) for ln in lines if ln.startswith('{"time"')]
    return [ln for ln in lines if not ln.startswith('{"time"')], docs


def env_for(shim: Path, sessions: Path, **extra: str) -> dict[str, str]:
    """The shim built here; sessions (kept by -v) under the test's directory; a job that dies of a
    signal prints its Python stack (PYTHONFAULTHANDLER)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EGPU")}
    env.update(EGPU_SHIM=str(shim), XDG_RUNTIME_DIR=str(sessions), PYTHONFAULTHANDLER="1")
    env.update(extra)
    return env


def plain_and_probed(cmd: list[str], probe: Path, shim: Path, sessions: Path, **extra: str):
    """Run cmd without egpu, then under egpu-run --json -v; (plain, probed) CompletedProcesses."""
    env = env_for(shim, sessions, **extra)
    plain = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    probed = egpu_run(["--json", "-v", "-p", str(probe), *cmd], env, timeout=300)
    return plain, probed


def counts(docs: list[dict]) -> list[int]:
    return [d["maps"]["counts"]["value"] for d in docs]


@pytest.mark.parametrize("cudart, loading", [("static", "LAZY"), ("static", "EAGER"), ("shared", "LAZY"),
                                             ("shared", "EAGER")])
def test_nvcc_program_counts_every_thread(vecadd, shim, probe_obj, tmp_path, cudart, loading):
    plain, probed = plain_and_probed([str(vecadd[cudart]), str(LAUNCHES), str(THREADS)], probe_obj("count"), shim,
                                     tmp_path, CUDA_MODULE_LOADING=loading)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert plain.stdout.startswith(f"vecadd launches {LAUNCHES} threads {THREADS} wrong 0 checksum ")
    assert probed.returncode == 0, probed.stderr
    lines, docs = split(probed.stdout)
    assert lines == plain.stdout.splitlines()  # bit-identical results
    assert counts(docs) == [LAUNCHES * THREADS], probed.stderr
    assert "_Z6vecaddPKfS0_Pfi: instrumented" in probed.stderr


def test_nvcc_program_text_output(vecadd, shim, probe_obj, tmp_path):
    """Without --json: bpftrace's text after the program's own output."""
    env = env_for(shim, tmp_path)
    r = egpu_run(["-p", str(probe_obj("count")), str(vecadd["static"]), "3", "2560"], env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == f"@counts: {3 * 2560}"


def test_the_readmes_quick_start_and_example_probe_print_what_the_readme_says(shim, probe_obj, tmp_path):
    """README's set-up command past `make install && make shim` (gpu-test.sh installed and built them), as
    written, from the repository's root; then its example probe (gpu-prep.sh compiled it: no clang here) on
    the same program."""
    from readme_blocks import SNIPPET_NAME, build_snippet, quick_start
    _, _, nvcc, run = quick_start()
    subprocess.run(shlex.split(nvcc.replace("-o vecadd", f"-o {tmp_path / 'vecadd'}")), cwd=ROOT, check=True)
    env = env_for(shim, tmp_path)
    _, _, probe, _, *args = shlex.split(run)
    assert probe == "tests/probes/count.bpf.c"
    r = egpu_run(["-p", str(probe_obj("count")), str(tmp_path / "vecadd"), *args], env, timeout=300)
    assert r.returncode == 0, r.stderr
    launches, threads = map(int, args)
    assert r.stdout.splitlines()[-1] == f"@counts: {launches * threads}", r.stdout
    prebuilt = os.environ.get("EGPU_PREBUILT_PROBES")
    snippet = Path(prebuilt) / f"{SNIPPET_NAME}.v3.bpf.o" if prebuilt else build_snippet(tmp_path)
    r = egpu_run(["-p", str(snippet), str(tmp_path / "vecadd"), *args], env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == f"@bytes[vecadd]: {launches * threads * 2 * 4}", r.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """graphs.cu, refused.cu and big_shared.cu, built as vecadd is."""
    out = tmp_path_factory.mktemp("e2e_built")
    exes = {}
    for name in ("graphs", "refused", "big_shared"):
        exes[name] = out / name
        subprocess.run(["nvcc", "-O2", "-arch=sm_90", str(E2E / f"{name}.cu"), "-o", str(exes[name])], check=True)
    return exes


def test_cuda_graph_replays_run_instrumented_kernels(built, shim, probe_obj, tmp_path):
    """A graph captured from a stream (two launches) and one built with a kernel node, each replayed
    LAUNCHES times: every replayed thread counted, results identical."""
    plain, probed = plain_and_probed([str(built["graphs"]), str(LAUNCHES), str(THREADS)], probe_obj("count"), shim,
                                     tmp_path)
    assert plain.returncode == 0 and " wrong 0 " in plain.stdout, plain.stdout + plain.stderr
    assert probed.returncode == 0, probed.stderr
    lines, docs = split(probed.stdout)
    assert lines == plain.stdout.splitlines()
    assert counts(docs) == [3 * LAUNCHES * THREADS], probed.stderr


def test_a_kernel_raised_past_48_kb_of_shared_memory_runs_across_the_flip(built, shim, probe_obj, tmp_path):
    """big_shared.cu's kernel asks for 64 KB of dynamic shared memory (cudaFuncSetAttribute): counted at the
    launch, then the capture's flip loads its instrumented copy, which gets that limit too (or the launches
    after the flip fail): every thread counted, results identical."""
    plain, probed = plain_and_probed([str(built["big_shared"]), str(LAUNCHES), str(THREADS)], probe_obj("count"),
                                     shim, tmp_path)
    assert plain.returncode == 0 and " wrong 0" in plain.stdout, plain.stdout + plain.stderr
    assert probed.returncode == 0, probed.stdout + probed.stderr
    lines, docs = split(probed.stdout)
    assert lines == plain.stdout.splitlines()
    assert counts(docs) == [3 * LAUNCHES * THREADS], probed.stderr
    assert "probes counted at the launch are put into the kernels from now on" in probed.stderr, probed.stderr


def test_a_kernel_the_rewriter_refuses_runs_as_it_was(built, shim, probe_obj, tmp_path):
    """refused.cu's first kernel names a global in egpu's reserved prefix: it runs uninstrumented, the
    second kernel is counted, the result is the plain run's, and egpu says why."""
    n = 1 << 16
    plain, probed = plain_and_probed([str(built["refused"]), str(n)], probe_obj("count"), shim, tmp_path)
    assert plain.returncode == 0 and " wrong 0 " in plain.stdout, plain.stdout + plain.stderr
    assert probed.returncode == 0, probed.stderr
    lines, docs = split(probed.stdout)
    assert lines == plain.stdout.splitlines()
    assert counts(docs) == [n], probed.stderr
    assert "scaled: failed (kernel already uses the reserved prefix __egpu)" in probed.stderr
    assert "plus_one: instrumented" in probed.stderr


def test_cupy_rawkernel_is_instrumented(shim, probe_obj, tmp_path):
    if subprocess.run([sys.executable, "-c", "import cupy"], capture_output=True).returncode:
        pytest.skip("CuPy is not installed")
    # CuPy's own kernels (arange, empty_like) are instrumented too: --kernel keeps the count to ours.
    # Fresh caches: a cubin cached by the plain run would be SASS only under egpu-run.
    plain = subprocess.run([sys.executable, str(E2E / "cupy_scale.py"), str(LAUNCHES), str(THREADS)],
                           env=env_for(shim, tmp_path, CUPY_CACHE_DIR=str(tmp_path / "plain")), capture_output=True,
                           text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr
    probed = egpu_run(["--json", "-v", "--kernel", "scale", "-p", str(probe_obj("count")), sys.executable,
                       str(E2E / "cupy_scale.py"), str(LAUNCHES), str(THREADS)],
                      env_for(shim, tmp_path, CUPY_CACHE_DIR=str(tmp_path / "probed")), timeout=300)
    assert probed.returncode == 0, probed.stderr
    lines, docs = split(probed.stdout)
    assert lines == plain.stdout.splitlines()
    assert counts(docs) == [LAUNCHES * THREADS], probed.stderr
    assert "scale: instrumented" in probed.stderr


def test_numba_kernel_is_instrumented_exactly(shim, probe_obj, tmp_path):
    """numba.cuda: every thread of every launch of a @cuda.jit kernel counted, output unchanged. The GPU
    image's numba needs an older numpy than the image has: scripts/gpu-test.sh installs the one gpu-prep
    carried (.whl/numba) into EGPU_TEST_NUMBA_SITE, for this test's processes only."""
    site = os.environ.get("EGPU_TEST_NUMBA_SITE")
    path = os.pathsep.join([site] * bool(site) + [str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = env_for(shim, tmp_path, PYTHONPATH=path, NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    check = subprocess.run([sys.executable, "-c", "import numba.cuda"], env=env, capture_output=True, text=True)
    if check.returncode:
        pytest.skip(f"numba.cuda does not import: {check.stderr.strip().splitlines()[-1:]}")
    cmd = [sys.executable, str(E2E / "numba_scale.py"), str(LAUNCHES), str(THREADS)]
    plain = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr
    probed = egpu_run(["--json", "-v", "--kernel", "*scale*", "-p", str(probe_obj("count")), *cmd], env, timeout=300)
    assert probed.returncode == 0, probed.stderr
    lines, docs = split(probed.stdout)
    assert lines == plain.stdout.splitlines()
    assert counts(docs) == [LAUNCHES * THREADS], probed.stderr


def test_triton_kernel_is_instrumented_exactly(shim, probe_obj, tmp_path):
    """Every thread of every launch counted: grid cdiv(N, 1024) x num_warps 4 x 32 threads, 5 launches
    (--kernel keeps PyTorch's own kernels out; they are SASS only anyway)."""
    if subprocess.run([sys.executable, "-c", "import triton, torch"], capture_output=True).returncode:
        pytest.skip("Triton/PyTorch are not installed")
    cmd = [sys.executable, str(E2E / "triton_add.py"), "5", str(THREADS)]
    env = env_for(shim, tmp_path)
    plain = subprocess.run(cmd, env={**env, "TRITON_CACHE_DIR": str(tmp_path / "plain")}, capture_output=True,
                           text=True, timeout=300)
    probed = egpu_run(["--json", "-v", "--kernel", "add", "-p", str(probe_obj("count")), *cmd], env, timeout=300)
    assert plain.returncode == 0, plain.stderr
    assert probed.returncode == 0, probed.stderr
    lines, docs = split(probed.stdout)
    assert lines == plain.stdout.splitlines()
    assert "cubin from egpu-ptxas: instrumented" in probed.stderr
    assert counts(docs) == [5 * (THREADS // 1024) * 4 * 32], probed.stderr


def test_printk_lines_a_full_trace_ring_dropped_are_said(vecadd, shim, tmp_path):
    """A bpf_printk line from each of 2^20 threads overflows the device's trace_printk ring (1 MiB, ~40 bytes a
    line): the lines kept and the count said dropped add up to the entries the probe counted."""
    prebuilt = os.environ.get("EGPU_PREBUILT_PROBES")   # scripts/gpu-prep.sh's: the GPU machine has no clang
    if prebuilt:
        probe = Path(prebuilt, "printk_flood.v3.bpf.o")
    else:
        from egpu_preload.bpf.compile import compile_probe
        probe = compile_probe(E2E / "printk_flood.bpf.c", tmp_path / "printk_flood.bpf.o")
    r = egpu_run(["--json", "-p", str(probe), str(vecadd["static"]), "1", str(THREADS)], env_for(shim, tmp_path),
                 timeout=300)
    assert r.returncode == 0, r.stderr
    _, docs = split(r.stdout)
    (doc,) = docs
    lines, dropped = doc["trace"], doc.get("trace_dropped", 0)
    assert doc["maps"]["entries"]["value"] == THREADS
    assert lines and all(ln.startswith("entry ") for ln in lines)
    assert dropped > 0 and len(lines) + dropped == THREADS, (len(lines), dropped)
