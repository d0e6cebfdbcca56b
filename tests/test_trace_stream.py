"""Lossless streaming traces (issue 19): the ring reader that drains rings while kernels run, the PTX of
``--on-full wait``, the trace file and ``egpu trace``."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

import pytest

from egpu_preload.bpf import program as prog
from egpu_preload.translate import probe_function
from egpu_preload.translate.module import probe_runner_ptx
from translate_support import GPU_TEST_PROBES, probe_object


# ---- --on-full wait: the PTX ------------------------------------------------------------------------

def _waiting(maps: list[prog.MapDef]) -> list[prog.MapDef]:
    return [dataclasses.replace(m, wait=True) for m in maps]


@pytest.mark.parametrize("name", ["ring", "ring_mixed", "ring_big"])
def test_a_waiting_ring_spins_on_consumed_and_never_gives_credit_back(name, tmp_path):
    """Group and one-by-one reserves of a ring made to wait assemble for sm_90; they read ``consumed``
    with acquire at system scope in a loop, and no credit is given back (no negative add on reserved),
    unlike the dropping ring's code."""
    asm, maps = GPU_TEST_PROBES[name]
    obj, p = probe_object(asm, _waiting(maps), f"{name}.bpf.o")
    func = probe_function(p, obj, ctx_params=True).func
    assert "ld.acquire.sys.u64" in func and "nanosleep.u32" in func
    assert "neg.s64" not in func and "red.min.u64" not in func
    plain_obj, plain = probe_object(asm, maps, f"{name}.bpf.o")
    dropping = probe_function(plain, plain_obj, ctx_params=True).func
    assert "ld.acquire.sys.u64" not in dropping and "neg.s64" in dropping
    src = tmp_path / "m.ptx"
    src.write_text(probe_runner_ptx(probe_function(p, obj, ctx_params=True)))
    done = subprocess.run(["ptxas", "-arch=sm_90", str(src), "-o", str(tmp_path / "m.cubin")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
