"""The README's set-up command and its probe example as a reader copies them (tests/readme_blocks.py): the
files the command names exist, and the example verifies, assembles and counts what the README says it prints.
tests/test_e2e_gpu.py runs both on the GPU."""

from __future__ import annotations

import shlex
import subprocess

from egpu_preload.bpf import ctx as ctxmod
from egpu_preload.bpf.ctx import kernel_id
from egpu_preload.bpf.elf import load_object
from egpu_preload.bpf.verifier import verify
from egpu_preload.maps import MapsState
from egpu_preload.output import text
from egpu_preload.output.values import snapshot
from egpu_preload.translate import probe_object_ptx
from egpu_preload.vm import ThreadSim, Vm
from readme_blocks import README, ROOT, build_snippet, quick_start
from test_vm import make_ctx

VECADD = "_Z6vecaddPKfS0_Pfi"   # tests/e2e/vecadd.cu's kernel


def test_the_quick_start_names_files_that_exist_and_the_output_its_probe_gives():
    make_install, make_shim, nvcc, run = quick_start()
    assert (make_install, make_shim) == ("make install", "make shim")
    assert all(f"\n{target}:" in (ROOT / "Makefile").read_text() for target in ("install", "shim"))
    nvcc, run = shlex.split(nvcc), shlex.split(run)
    assert nvcc[0] == "nvcc" and (ROOT / nvcc[-1]).is_file() and nvcc[nvcc.index("-o") + 1] == "vecadd"
    assert run[:2] == ["egpu-run", "-p"] and (ROOT / run[2]).is_file() and run[3] == "./vecadd"
    launches, threads = map(int, run[4:])
    assert f"`@counts: {launches * threads}` (K × N threads)" in README.read_text()


def test_the_example_probe_counts_the_bytes_the_readme_says(tmp_path, ptxas):
    """Two 4-byte loads by each of vecadd's threads, for the quick start's launches and threads."""
    obj = load_object(build_snippet(tmp_path))
    (prog,) = obj.programs
    assert prog.attach.kind == "load"
    verified = verify(prog.code, obj.maps, file=obj.path, section=prog.section)
    assert verified.insns
    (tmp_path / "readme.ptx").write_text(probe_object_ptx(obj))
    done = subprocess.run([ptxas, "-arch=sm_90", str(tmp_path / "readme.ptx"), "-o", str(tmp_path / "readme.cubin")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    state = MapsState(obj.maps)
    vm = Vm(prog.code, obj.maps, state)
    layout = ctxmod.layout_for(prog.attach.kind)
    loads = 2 * 3   # as many as a few threads make: the sum scales with them
    for _ in range(loads):
        ctx = make_ctx(layout, kernel_id=kernel_id(VECADD), size=4, flags=ctxmod.FLAG_LOAD)
        assert vm.run(ctx, ThreadSim()) == 0
    printed = text.render(snapshot(state, obj, {kernel_id(VECADD): VECADD}))
    assert printed.splitlines() == [f"@bytes[vecadd]: {4 * loads}"], printed
    *_, run = quick_start()
    launches, threads = map(int, shlex.split(run)[4:])
    assert f"`@bytes[vecadd]: {launches * threads * 2 * 4}` for the vecadd run above" in README.read_text()
