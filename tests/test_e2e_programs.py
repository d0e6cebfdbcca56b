"""The GPU end-to-end programs (tests/e2e/*.cu) without a GPU: nvcc's PTX of each, instrumented with a
translated probe, is what the GPU tests expect (kernels instrumented or refused, and why) and ptxas
takes it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import ptx_corpus
from egpu_preload.bpf.elf import load_object
from egpu_preload.translate.rewrite import instrument, probe_specs

E2E = Path(__file__).parent / "e2e"


@pytest.mark.parametrize("program, statuses", [
    ("vecadd", {"_Z6vecaddPKfS0_Pfi": "instrumented"}),
    ("graphs", {"_Z6vecaddPKfS0_Pfi": "instrumented"}),
    ("refused", {"scaled": "failed", "plus_one": "instrumented"}),
    ("swap_loop", None), ("cow_mutate", None), ("globaltimer", None),
])
def test_e2e_programs_instrument_as_the_gpu_tests_expect(program, statuses, probe_obj, tmp_path):
    ptx = tmp_path / f"{program}.ptx"
    subprocess.run(["nvcc", "-arch=sm_90", "-ptx", str(E2E / f"{program}.cu"), "-o", str(ptx)], check=True)
    res = instrument(ptx.read_text(), probe_specs(load_object(probe_obj("count"))))
    got = {k.name: k.status for k in res.kernels}
    if statuses is not None:
        assert got == statuses
    else:
        assert set(got.values()) == {"instrumented"}, res.kernels
    if program == "refused":
        assert res.status("scaled").reason == "kernel already uses the reserved prefix __egpu"
    [(_, _, rc, _, err)] = ptx_corpus.ptxas([(program, "sm_90", res.text)])
    assert rc == 0, err
