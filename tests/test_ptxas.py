"""egpu-ptxas (runtime/ptxas.py), the ptxas Triton runs under egpu-run: it instruments the PTX Triton
captured on the H200 (tests/fixtures/ptx/triton_*.ptx), hands the copy to the real ptxas with Triton's
other arguments, and leaves a record the runtime finds from the cubin alone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from egpu_preload.bpf.ctx import kernel_id
from egpu_preload.fatbin import ImageKind
from egpu_preload.runtime import config, job
from egpu_preload.runtime import ptxas as wrapper
from stub_job import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "ptx"
FAKE = """#!/bin/sh
# records its arguments and the PTX it was given, writes a made-up cubin naming the marker it found
echo "$@" > "$(dirname "$0")/args"
for a; do case "$a" in *.ptx) cp "$a" "$(dirname "$0")/seen.ptx";; esac; done
out=; prev=
for a; do [ "$prev" = "-o" ] && out=$a; prev=$a; done
[ -n "$out" ] && { printf '\\177ELF'; grep -o '__egpu_ptxas_[0-9a-f]*' "$(dirname "$0")/seen.ptx"; } > "$out"
exit ${FAKE_STATUS:-0}
"""


def wrapper_env(tmp_path: Path, probe: Path, real: str, **extra: str) -> dict[str, str]:
    session = tmp_path / "session"
    session.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EGPU") and k != "PYTHONPATH"}
    cfg = config.Config((probe,), session, None, 0, ptxas=real)
    made = job.job_env(cfg, Path("/s/libegpu_shim.so"), env)   # the paths the job's Triton runs it with
    env.update(config.to_env(cfg), **{k: made[k] for k in ("EGPU_PYTHON", "PYTHONPATH", job.IMPORT_DIRS_ENV)})
    env.update(extra)
    return env


@pytest.fixture
def fake_ptxas(tmp_path) -> Path:
    d = tmp_path / "fake"
    d.mkdir()
    (d / "ptxas").write_text(FAKE)
    (d / "ptxas").chmod(0o755)
    return d


def triton_call(ptx: Path, out: Path) -> list[str]:
    """ptxas's arguments as triton/backends/nvidia/compiler.py builds them."""
    return ["-lineinfo", "-v", "--gpu-name=sm_90a", str(ptx), "-o", str(out)]


# the kernel, its parameters, where the launch id goes (after the last one, aligned to 8: matmul has
# three u64, three u32, two u64 -> 56)
@pytest.mark.parametrize("fixture, kernel, nparams, offset", [
    ("triton_add", "add_kernel", 6, 48), ("triton_matmul", "matmul_kernel", 8, 56),
    ("triton_softmax", "softmax_kernel", 6, 40)])
def test_triton_ptx_is_instrumented_before_the_real_ptxas(probe_obj, tmp_path, fake_ptxas, fixture, kernel,
                                                          nparams, offset):
    src = tmp_path / f"{fixture}.ptx"
    shutil.copy(FIXTURES / f"{fixture}.ptx", src)
    env = wrapper_env(tmp_path, probe_obj("count"), str(fake_ptxas / "ptxas"))
    r = subprocess.run([str(job.PTXAS_WRAPPER), *triton_call(src, tmp_path / "out.cubin")], env=env,
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    args = (fake_ptxas / "args").read_text().split()
    seen = (fake_ptxas / "seen.ptx").read_text()
    key = seen.rsplit(wrapper.MARKER, 1)[1][:16]
    # Triton's arguments, the input replaced by the instrumented copy in the session
    assert args == triton_call(tmp_path / "session" / "ptxas" / f"{key}.ptx", tmp_path / "out.cubin")
    assert "__egpu_maps_" in seen and src.read_text() != seen
    rec = wrapper.read_record(tmp_path / "session", (tmp_path / "out.cubin").read_bytes())
    assert rec["ptx"] == src.read_text()
    (name, status, _, calls, off, n), = rec["kernels"]
    assert (name, status, n, off) == (kernel, "instrumented", nparams, offset) and calls > 0


@pytest.mark.parametrize("args, status", [(["--version"], 0), (["--version"], 3)])
def test_anything_but_a_ptx_compile_passes_through(probe_obj, tmp_path, fake_ptxas, args, status):
    env = wrapper_env(tmp_path, probe_obj("count"), str(fake_ptxas / "ptxas"), FAKE_STATUS=str(status))
    r = subprocess.run([str(job.PTXAS_WRAPPER), *args], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == status
    assert (fake_ptxas / "args").read_text().split() == args
    assert not (tmp_path / "session" / "ptxas").exists()


def test_ptx_no_probe_matches_is_compiled_as_given(probe_obj, tmp_path, fake_ptxas):
    src = tmp_path / "k.ptx"
    shutil.copy(FIXTURES / "triton_add.ptx", src)
    env = wrapper_env(tmp_path, probe_obj("count"), str(fake_ptxas / "ptxas"), EGPU_KERNEL="nothing*")
    r = subprocess.run([str(job.PTXAS_WRAPPER), *triton_call(src, tmp_path / "o.cubin")], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (fake_ptxas / "args").read_text().split() == triton_call(src, tmp_path / "o.cubin")


def test_the_real_ptxas_compiles_it_and_the_runtime_adopts_the_cubin(probe_obj, ptxas, tmp_path):
    """CUDA's ptxas assembles the instrumented Triton PTX; the cubin names its record, and the runtime
    takes it as an instrumented module whose kernel gets the launch id after its own 6 parameters."""
    src = tmp_path / "add.ptx"
    shutil.copy(FIXTURES / "triton_add.ptx", src)
    out = tmp_path / "add.cubin"
    env = wrapper_env(tmp_path, probe_obj("count"), ptxas)
    r = subprocess.run([str(job.PTXAS_WRAPPER), *triton_call(src, out)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    cubin = out.read_bytes()
    assert cubin[:4] == b"\x7fELF" and b"__egpu_maps_" in cubin
    runtime = SimpleNamespace(cfg=config.Config(session=tmp_path / "session"), kernel_names={}, probes=[])
    mod = SimpleNamespace(kernels={}, status="untouched", image="cubin")
    assert wrapper.adopt(runtime, mod, SimpleNamespace(kind=ImageKind.ELF, data=cubin))
    k = mod.kernels["add_kernel"]
    assert (mod.status, k.status, k.nparams, k.launch_param_offset) == ("instrumented", "instrumented", 6, 48)
    assert runtime.kernel_names == {kernel_id("add_kernel"): "add_kernel"}
    assert mod.original == src.read_bytes() + b"\0"
    # a cubin compiled without egpu-ptxas is left alone
    other = SimpleNamespace(kernels={}, status="untouched", image="cubin")
    assert not wrapper.adopt(runtime, other, SimpleNamespace(kind=ImageKind.ELF,
                                                             data=cubin.replace(b"__egpu_ptxas_", b"__other_ptxas")))


@pytest.mark.parametrize("theirs, real", [("", None), ("/opt/cuda/bin/ptxas", "/opt/cuda/bin/ptxas"),
                                          (str(job.PTXAS_WRAPPER), None)])
def test_the_job_runs_triton_through_the_wrapper(theirs, real):
    cfg = config.Config((Path("/p.bpf.o"),), Path("/run/s"), None, 0)
    base = {"PATH": "/bin", **({"TRITON_PTXAS_PATH": theirs} if theirs else {})}
    env = job.job_env(cfg, Path("/s/libegpu_shim.so"), base)
    assert env["TRITON_PTXAS_PATH"] == str(job.PTXAS_WRAPPER) and os.access(job.PTXAS_WRAPPER, os.X_OK)
    assert config.from_env(env).ptxas == real
    assert env["TRITON_CACHE_DIR"] == "/run/s/triton" and env["TORCHINDUCTOR_CACHE_DIR"] == "/run/s/inductor"
    assert env["EGPU_PYTHON"] == sys.executable


def test_under_on_full_wait_triton_kernels_wait_for_room_as_the_runtimes_do(probe_obj, tmp_path):
    """The ring a Triton kernel writes is the one the runtime's reader drains: under --on-full wait its
    producers must wait too, or a full ring drops records in Triton's kernels only (the H200, 2026-12-04f)."""
    from egpu_preload.runtime.probes import load_probes
    from egpu_preload.translate.rewrite import instrument
    text, probe = (FIXTURES / "triton_add.ptx").read_text(), probe_obj("ringbuf")
    made = {}
    for on_full in config.ON_FULLS:
        cfg = config.Config((probe,), tmp_path, None, 0, on_full=on_full)
        _, ptx, _ = wrapper.instrument_file(text, cfg)
        made[on_full] = ptx.split(f".visible .global .align 1 .b8 {wrapper.MARKER}")[0].rstrip("\n")
        runtime = instrument(text, [s for p in load_probes([probe], wait=on_full == "wait") for s in p.specs])
        assert made[on_full] == runtime.text.rstrip("\n"), on_full
    assert made["wait"] != made["drop"]
