"""The ISA table (isa_cases.py) on the reference VM: exact r0 and memory, and every ISA row covered."""

from __future__ import annotations

import pytest

from egpu_preload.bpf import isa
from egpu_preload.bpf.asm import assemble
from egpu_preload.bpf.decode import decode
from egpu_preload.vm import run_with_mem
from isa_cases import CASES, Case


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_on_vm(case: Case) -> None:
    r0, mem = run_with_mem(assemble(case.asm), case.mem)
    assert r0 == case.r0, f"r0 = 0x{r0:x}, expected 0x{case.r0:x}"
    if case.mem_after is not None:
        assert mem == case.mem_after


def test_every_row_has_a_case() -> None:
    covered = {i.spec for c in CASES for i in decode(assemble(c.asm))}
    missing = [f"0x{o.opcode:02x}/{o.name}/{o.width}" for o in isa.OPS if o not in covered]
    assert not missing, f"ISA rows without a case: {missing}"


def test_names_are_unique() -> None:
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))
    assert len(CASES) >= 200
