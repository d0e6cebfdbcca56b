"""Loops bounded at run time: a DIRECTLY_RUN program's loop the exploration cannot bound is widened and its
backward jumps budgeted (bpf/verifier); every other section refuses it as Linux does."""

from __future__ import annotations

import pytest

from egpu_preload.bpf.asm import assemble
from egpu_preload.bpf.decode import decode
from egpu_preload.bpf.sections import DIRECTLY_RUN
from egpu_preload.bpf.verifier import WIDEN_AFTER, verify
from egpu_preload.bpf.verifier import cfg as cfg_mod
from egpu_preload.bpf.verifier.state import State, Slot, covers, widen
from egpu_preload.bpf.verifier.value import M32, UNKNOWN, bounded, const, pointer
from egpu_preload.errors import VerifierError
from tests.verifier_cases import MAPS, RESERVE

WHILE_ONE = "r0 = 0\nloop:\nr1 = 0\ngoto loop\nexit"
COUNT_FOREVER = "r0 = 0\nloop:\nr0 += 1\nif r0 != 0 goto loop\nexit"
KEEPS_A_BIT = "r0 = *(u64 *)(r1 + 0x0)\nloop:\nr0 |= 1\nif r0 != 0 goto loop\nexit"
# r3 moves 8 bytes down the stack a round, r2 rounds read from the context
WALKS_A_POINTER = """
    r2 = *(u64 *)(r1 + 0x0)
    r3 = r10
loop:
    r3 += -8
    r2 += -1
    if r2 != 0 goto loop
    r0 = 0
    exit"""
# r7 = 4 * r6 indexes the stack: only the exact rounds know r7 < 400
CORRELATED = """
    r6 = 0
    r7 = 0
loop:
    r1 = r10
    r1 += -512
    r1 += r7
    *(u32 *)(r1 + 0) = 0
    r6 += 1
    r7 += 4
    if r6 < 100 goto loop
    r0 = 0
    exit"""
CALLS_IN_THE_LOOP = """
    r6 = 0
loop:
    call local sub
    r6 += 1
    if r6 != 0 goto loop
    r0 = 0
    exit
sub:
    r0 = 0
    exit"""


def _verify(asm: str, section: str, **kw):
    return verify(assemble(asm), list(MAPS), file="t.bpf.o", section=section, **kw)


@pytest.mark.parametrize("asm, refusal", [(WHILE_ONE, "infinite loop detected"),
                                          (KEEPS_A_BIT, "infinite loop detected"),
                                          (COUNT_FOREVER, "program too complex")],
                         ids=["while_one", "keeps_a_bit", "count_forever"])
def test_a_loop_without_a_bound_runs_to_the_budget_in_directly_run_sections_only(asm, refusal):
    """Refused in a kernel's probe as Linux refuses it; in a directly-run program its backward jump is
    budgeted (pc 2 in each)."""
    with pytest.raises(VerifierError, match=refusal):
        _verify(asm, "kprobe/vectorAdd", max_insns=5_000)
    assert _verify(asm, DIRECTLY_RUN).budgeted == frozenset({2})


def test_short_loops_stay_exact_and_longer_ones_are_budgeted():
    """Fewer rounds than WIDEN_AFTER: explored exactly, nothing budgeted; more: widened, budgeted."""
    short = f"r0 = 0\nloop:\nr0 += 1\nif r0 < {WIDEN_AFTER} goto loop\nexit"
    assert _verify(short, DIRECTLY_RUN).budgeted == frozenset()
    assert _verify(short.replace(str(WIDEN_AFTER), str(WIDEN_AFTER + 1)), DIRECTLY_RUN).budgeted == {2}


def test_a_loop_the_widened_search_refuses_gets_the_exact_one():
    """Widened, r7 is any u32 and the store may leave the stack; explored round by round it may not: the
    program is accepted, with no loop budgeted, after the same exploration as in any other section. Refused
    by both (past the stack), it is the widened search's reason that is given: what a loop run to the budget
    must fix."""
    exact = _verify(CORRELATED, DIRECTLY_RUN)
    assert exact.budgeted == frozenset() and exact.processed == _verify(CORRELATED, "kprobe/x").processed
    with pytest.raises(VerifierError, match="unbounded variable offset into stack") as info:
        _verify(CORRELATED.replace("r6 < 100", "r6 < 200"), DIRECTLY_RUN)
    assert info.value.insn == 5


@pytest.mark.parametrize("asm", [WALKS_A_POINTER, CALLS_IN_THE_LOOP], ids=["walks_a_pointer", "calls"])
def test_pointer_walks_and_loops_around_a_call_are_refused_as_anywhere(asm):
    with pytest.raises(VerifierError, match="program too complex"):
        _verify(asm, DIRECTLY_RUN, max_insns=5_000)


def test_a_record_reserved_across_a_budgeted_loop_is_refused():
    """The budget ends the program at the loop's jump as bpf_exit does: a record reserved before it would stay
    reserved, its ring's later records never read; refused as bpf_exit with one is."""
    asm = RESERVE + """
        if r0 == 0 goto out
        r6 = r0
        r7 = 0
    loop:
        r7 += 1
        if r7 != 0 goto loop
        r1 = r6
        r2 = 0
        call ringbuf_submit
    out:
        r0 = 0
        exit"""
    with pytest.raises(VerifierError, match="reserve at 4: submit or discard it before a loop bounded at run time"):
        _verify(asm, DIRECTLY_RUN)
    assert _verify(asm.replace("r7 != 0", "r7 < 3"), DIRECTLY_RUN).budgeted == frozenset()


def test_run_time_loops_are_strongly_connected_parts_without_calls():
    def loops(asm: str) -> dict[int, frozenset[int]]:
        return cfg_mod.run_time_loops(cfg_mod.build(decode(assemble(asm)), list(MAPS)))
    assert loops(WHILE_ONE) == {1: frozenset({2})}
    assert loops(CALLS_IN_THE_LOOP) == {}
    two_back_edges = "r0 = 0\nloop:\nr0 += 1\nif r0 == 5 goto loop\nif r0 != 0 goto loop\nexit"
    assert loops(two_back_edges) == {1: frozenset({2, 3})}
    assert loops("r0 = 0\ngoto +1\nexit\ngoto -2") == {}   # backward, but on no cycle


def test_widen_makes_changed_scalars_unknown_within_their_type_and_keeps_the_rest():
    old, new = State.entry(), State.entry()
    for st, i in ((old, 3), (new, 4)):
        st.top.regs[2] = const(i)
        st.top.regs[3] = const(7)
        st.top.regs[4] = const(-i)
        st.top.stack[0] = Slot("ssssssss", const(1 << 40 | i))
    live = [0b11110]
    w = widen(old, new, live)
    assert w.top.regs[2] == bounded(0, M32) and w.top.regs[3] == const(7)
    assert w.top.regs[4] == bounded(smin=-(1 << 31), smax=(1 << 31) - 1)
    assert w.top.stack[0].spill == UNKNOWN
    assert covers(w, old, live) and covers(w, new, live)


def test_widen_refuses_a_pointer_that_moves():
    old, new = State.entry(), State.entry()
    old.top.regs[3] = pointer("stack", off=-8)
    new.top.regs[3] = pointer("stack", off=-16)
    assert widen(old, new, [0b1000]) is None
    assert widen(old, new, [0]) is not None   # unless nothing reads it
