"""The verifier: the case tables, every realistic probe, the facts it hands the translator, soundness of
its arithmetic, fuzzing, and `egpu verify`."""

from __future__ import annotations

import random
import struct
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from egpu_preload.bpf import alu, isa
from egpu_preload.bpf.asm import assemble
from egpu_preload.bpf.compile import compile_probe
from egpu_preload.bpf.decode import decode
from egpu_preload.bpf.elf import load_object
from egpu_preload.bpf.verifier import VerifiedProgram, verify
from egpu_preload.bpf.verifier import arith
from egpu_preload.bpf.verifier.checks import STEP
from egpu_preload.bpf.verifier.value import M64, bounded, const, contains, lo32, sext32
from egpu_preload.errors import DecodeError, EgpuError, VerifierError
from egpu_preload.vm import execute
from tests.verifier_cases import ACCEPT, C_PROBES, C_REFUSED, MAPS, REJECT

PROBES = sorted(p.name.removesuffix(".bpf.c") for p in (Path(__file__).parent / "probes").glob("*.bpf.c"))


@pytest.mark.parametrize("case", REJECT, ids=[c.name for c in REJECT])
def test_rejects(case):
    with pytest.raises(VerifierError) as info:
        verify(assemble(case.asm), list(MAPS), file="t.bpf.o", section="kprobe/x", max_insns=case.max_insns)
    e = info.value
    assert case.expect in e.reason
    assert e.insn == case.at or case.at is None
    assert str(e).startswith(f"t.bpf.o:kprobe/x:{e.insn}: ")


@pytest.mark.parametrize("case", ACCEPT, ids=[c.name for c in ACCEPT])
def test_accepts(case):
    v = verify(assemble(case.asm), list(MAPS))
    assert isinstance(v, VerifiedProgram) and v.processed >= len(v.insns) > 0


def test_case_tables_are_large_and_distinct():
    assert len(REJECT) >= 35 and len(ACCEPT) >= 12
    names = [c.name for c in REJECT + ACCEPT]
    assert len(names) == len(set(names))
    assert all(c.expect and c.at is not None for c in REJECT if c.name != "loop_too_complex")


def test_every_instruction_kind_has_a_check():
    assert set(STEP) == set(isa.KINDS)


@pytest.mark.parametrize("mcpu", ["v3", "v4"])
@pytest.mark.parametrize("name", PROBES)
def test_every_probe_verifies(probe_obj, name, mcpu):
    obj = load_object(probe_obj(name, mcpu))
    assert obj.programs
    for prog in obj.programs:
        v = verify(prog.code, obj.maps, file=obj.path, section=prog.section)
        loads = [i.pc for i in v.insns if i.kind in ("load", "store", "atomic")]
        assert sorted(v.regions) == loads  # every access is reached and classified


@pytest.mark.parametrize("mcpu", ["v3", "v4"])
@pytest.mark.parametrize("name", sorted(C_PROBES))
def test_tricky_c_probes_verify(tmp_path, name, mcpu):
    src = tmp_path / f"{name}.bpf.c"
    src.write_text(C_PROBES[name])
    obj = load_object(compile_probe(src, mcpu=mcpu))
    for prog in obj.programs:
        verify(prog.code, obj.maps, file=obj.path, section=prog.section)


@pytest.mark.parametrize("mcpu", ["v3", "v4"])
@pytest.mark.parametrize("name", sorted(C_REFUSED))
def test_c_probes_refused(tmp_path, name, mcpu):
    """Refused quickly too: the worst (a loop waiting on a map value) took 43 s and 480 MB to say "too
    complex" at the 1M-instruction budget; the cap on pending branches answers in thousands of rounds."""
    source, reason = C_REFUSED[name]
    src = tmp_path / f"{name}.bpf.c"
    src.write_text(source)
    obj = load_object(compile_probe(src, mcpu=mcpu))
    (prog,) = obj.programs
    start = time.process_time()
    with pytest.raises(VerifierError) as info:
        verify(prog.code, obj.maps, file=obj.path, section=prog.section)
    assert time.process_time() - start < 5
    assert reason in info.value.reason


def test_log_names_instruction_and_state():
    text = "r6 = r1\n" + REJECT_BY_NAME["map_value_not_null_checked"].asm
    with pytest.raises(VerifierError) as info:
        verify(assemble(text), list(MAPS))
    e = info.value
    assert e.insn == 7
    assert e.reason == ("r0 = *(u64 *)(r0 + 0x0): invalid mem access 'map_value_or_null' "
                        "(r0: compare it with 0 first)")
    lines = e.detail.splitlines()
    assert lines[0] == "0: r6 = r1" and "6: call 0x1" in lines
    assert "frame0: R0=map_value_or_null(id=1,map=counts,off=0,vs=8) R6=ctx(off=0) R10=fp0 fp-8=ssssuuuu(0)" in lines
    assert lines[-1] == f"7: {e.reason}"


REJECT_BY_NAME = {c.name: c for c in REJECT}
ACCEPT_BY_NAME = {c.name: c for c in ACCEPT}


def test_facts_for_the_translator():
    v = verify(assemble(ACCEPT_BY_NAME["two_lookups_path_sensitive"].asm), list(MAPS))
    assert dict(v.maps) == {4: 0, 6: 0, 11: 1, 13: 1}  # two lddw and two calls
    assert dict(v.regions) == {1: "stack", 8: "stack", 16: "map_value", 17: "map_value"}
    assert v.subprogs == (0,) and v.stack_depth == (4,)
    sub = verify(assemble(ACCEPT_BY_NAME["subprogram_with_stack_args"].asm), list(MAPS))
    assert sub.subprogs == (0, 7) and sub.stack_depth == (8, 8)
    assert dict(sub.regions) == {0: "stack", 7: "stack", 8: "stack", 9: "stack", 11: "stack"}
    rb = verify(assemble(ACCEPT_BY_NAME["ringbuf_submit_or_discard"].asm), list(MAPS))
    assert dict(rb.regions) == {8: "ringbuf_mem"} and dict(rb.maps) == {0: 2, 4: 2}


@pytest.mark.parametrize("text, consts, arg_align, arg_stack, dead", [
    # a constant key and a constant atomic operand; the key slot is 4-aligned
    ("*(u32 *)(r10 - 4) = 3\nr2 = r10\nr2 += -4\nr1 = map[1] ll\ncall map_lookup_elem\n"
     "if r0 == 0 goto out\nr1 = 1\nlock *(u64 *)(r0 + 0) += r1\nout:\nr0 = 0\nexit",
     {5: 3, 8: 1}, {(5, 2): 4}, {(5, 2): -4}, []),
    # keys that differ per path, an operand that is not a constant: no constants; two slots: no offset
    ("call get_lane_id\n*(u32 *)(r10 - 8) = 1\n*(u32 *)(r10 - 16) = 2\nr2 = r10\nr2 += -8\n"
     "if r0 == 0 goto l\nr2 += -8\nl:\nr1 = map[1] ll\ncall map_lookup_elem\nif r0 == 0 goto out\n"
     "r1 = *(u64 *)(r0 + 8)\nlock *(u64 *)(r0 + 0) += r1\nout:\nr0 = 0\nexit",
     {}, {(9, 2): 8}, {}, []),
    # a branch the verifier decides: the other side is dead
    ("r1 = 1\nif r1 == 1 goto out\nr1 = 2\nout:\nr0 = 0\nexit", {}, {}, {}, [2]),
])
def test_facts_for_fast_code(text, consts, arg_align, arg_stack, dead):
    v = verify(assemble(text), list(MAPS))
    assert dict(v.consts) == consts
    assert dict(v.arg_align) == arg_align
    assert dict(v.arg_stack) == arg_stack
    assert v.reached == {i.pc for i in decode(assemble(text))} - set(dead)


@pytest.mark.parametrize("text, reads", [
    ("r0 = 0\nexit", set()),
    ("r2 = *(u64 *)(r1 + 16)\nr0 = 0\nexit", set(range(16, 24))),
    # the pointer's own offset counts: ctx + 36, then + 0 reads kind
    ("r1 += 36\nr2 = *(u32 *)(r1 + 0)\nr0 = 0\nexit", set(range(36, 40))),
    # a byte of args[0] and the low half of nargs, on different paths
    ("r2 = *(u8 *)(r1 + 41)\nif r2 == 0 goto out\nr2 = *(u16 *)(r1 + 104)\nout:\nr0 = 0\nexit",
     {41, 104, 105}),
    # perf_event_output takes ctx but reads none of it
    ("*(u64 *)(r10 - 8) = 0\nr4 = r10\nr4 += -8\nr2 = map[5] ll\nr3 = 0\nr5 = 8\n"
     "call perf_event_output\nr0 = 0\nexit", set()),
])
def test_ctx_reads(text, reads):
    assert verify(assemble(text), list(MAPS)).ctx_reads == reads


def test_mixed_regions_are_reported():
    text = """
        call get_lane_id
        *(u64 *)(r10 - 8) = 0
        r2 = r10
        r2 += -8
        if r0 == 0 goto read
        r2 = map_value[4] + 0x0 ll
    read:
        r0 = *(u64 *)(r2 + 0x0)
        exit"""
    assert verify(assemble(text), list(MAPS)).regions[7] == "mixed"


def test_pruning_keeps_many_paths_cheap():
    # 24 independent branches: 2**24 paths without pruning, a few hundred instructions with it
    body = "\n".join(f"call get_lane_id\nif r0 > {i} goto +1\nr6 = {i}" for i in range(24))
    v = verify(assemble(f"r6 = 0\n{body}\nr0 = r6\nexit"), [])
    assert v.processed < 2000


def test_decode_errors_name_the_file():
    with pytest.raises(DecodeError) as info:
        verify(bytes(8), [], file="x.bpf.o", section="kprobe/y")
    assert str(info.value).startswith("x.bpf.o:kprobe/y:0: unknown opcode")


def test_empty_program():
    with pytest.raises(VerifierError, match="empty program"):
        verify(b"", [])


# ---- soundness of the abstract arithmetic ----------------------------------------------------------

_OPS = ("add", "sub", "mul", "div", "mod", "sdiv", "smod", "or", "and", "xor", "lsh", "rsh", "arsh")
_JMPS = tuple(arith.NEGATE)
_u64 = st.one_of(st.integers(0, 16), st.integers(0, M64), st.integers(M64 - 16, M64), st.integers(0, 300))


def _around(x: int, a: int, b: int) -> object:
    """An abstract value holding the concrete x: a range [x - a, x + b] (clipped)."""
    return bounded(max(0, x - a), min(M64, x + b))


@settings(max_examples=400, deadline=None)
@given(x=_u64, y=_u64, a=st.integers(0, 40), b=st.integers(0, 40), c=st.integers(0, 40), d=st.integers(0, 40),
       op=st.sampled_from(_OPS), width=st.sampled_from((32, 64)))
def test_alu_results_contain_the_concrete_result(x, y, a, b, c, d, op, width):
    ax, ay = _around(x, a, b), _around(y, c, d)
    r = alu.binary(op, width, x, y)
    assert contains(arith.alu(op, width, ax, ay), const(r)), (op, width, x, y)


def _holds(op: str, width: int, x: int, y: int) -> bool:
    """The comparison on concrete values (RFC 9669 4.3; JMP32 compares the low halves)."""
    mask = (1 << width) - 1
    ux, uy = x & mask, y & mask
    sx, sy = (v - (1 << width) if v >> (width - 1) else v for v in (ux, uy))
    return {"jeq": ux == uy, "jne": ux != uy, "jgt": ux > uy, "jge": ux >= uy, "jlt": ux < uy, "jle": ux <= uy,
            "jsgt": sx > sy, "jsge": sx >= sy, "jslt": sx < sy, "jsle": sx <= sy, "jset": bool(ux & uy),
            "jnset": not ux & uy}[op]


@settings(max_examples=400, deadline=None)
@given(x=_u64, y=_u64, a=st.integers(0, 40), b=st.integers(0, 40), c=st.integers(0, 40), d=st.integers(0, 40),
       op=st.sampled_from(_JMPS), width=st.sampled_from((32, 64)))
def test_branch_refinement_keeps_the_concrete_values(x, y, a, b, c, d, op, width):
    ax, ay = _around(x, a, b), _around(y, c, d)
    holds = _holds(op, width, x, y)
    known, taken, fallen = arith.branch(op, width, ax, ay)
    if known is not None:
        assert known == holds
        return
    side = taken if holds else fallen
    assert side is not None and contains(side[0], const(x)) and contains(side[1], const(y))


_UNARY = {
    "r0 = -r0": lambda v: arith.neg(64, v), "w0 = -w0": lambda v: arith.neg(32, v),
    **{f"r0 = (s{b})r0": (lambda b: lambda v: arith.movsx(64, b, v))(b) for b in (8, 16, 32)},
    **{f"w0 = (s{b})w0": (lambda b: lambda v: arith.movsx(32, b, v))(b) for b in (8, 16)},
    **{f"r0 = {op}{b} r0": (lambda op, b: lambda v: arith.byteswap(op, b, v))(op, b)
       for op in ("le", "be", "bswap") for b in (16, 32, 64)},
}


@settings(max_examples=200, deadline=None)
@given(x=_u64, a=st.integers(0, 40), b=st.integers(0, 40), text=st.sampled_from(sorted(_UNARY)))
def test_unary_results_contain_the_vm_result(x, a, b, text):
    r = execute(assemble(f"r0 = {x} ll\n{text}\nexit"))
    assert contains(_UNARY[text](_around(x, a, b)), const(r)), (text, x)


# ---- fuzzing ---------------------------------------------------------------------------------------

def _programs() -> list[bytes]:
    return [assemble(c.asm) for c in ACCEPT]


_SEEDS = _programs()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(min_size=0, max_size=400))
def test_random_bytecode_fails_cleanly(data):
    try:
        verify(data, list(MAPS), max_insns=20_000)
    except EgpuError:
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, len(_SEEDS) - 1), flips=st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)),
                                                            min_size=1, max_size=4))
def test_mutated_programs_fail_cleanly(seed, flips):
    code = bytearray(_SEEDS[seed])
    for pos, val in flips:
        code[pos % len(code)] = val
    try:
        verify(bytes(code), list(MAPS), max_insns=20_000)
    except EgpuError:
        pass


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, len(_SEEDS) - 1), rnd=st.randoms(use_true_random=False), n=st.integers(1, 3))
def test_mutated_fields_fail_cleanly(seed, rnd: random.Random, n):
    """Mutations that keep the instruction encoding valid more often: one field of one slot at a time."""
    code = bytearray(_SEEDS[seed])
    for _ in range(n):
        slot = rnd.randrange(len(code) // 8) * 8
        opcode, regs, off, imm = struct.unpack_from("<BBhi", code, slot)
        field = rnd.randrange(4)
        if field == 0:
            regs = rnd.randrange(256) & 0xAA | regs & 0x55
        elif field == 1:
            off = rnd.choice((-1, 1, 8, -8, -512, 4, rnd.randrange(-(1 << 15), 1 << 15)))
        elif field == 2:
            imm = rnd.choice((0, 1, -1, 8, 64, 1 << 31 - 1, rnd.randrange(-(1 << 31), 1 << 31)))
        else:
            opcode = rnd.choice([o.opcode for o in isa.OPS])
        struct.pack_into("<BBhi", code, slot, opcode, regs, off, imm)
    try:
        verify(bytes(code), list(MAPS), max_insns=20_000)
    except EgpuError:
        pass


# ---- egpu verify ----------------------------------------------------------------------------------

UNSAFE_PROBE = """
#include "egpu.bpf.h"
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 64); __type(key, __u32); __type(value, __u64); }
    counts SEC(".maps");
SEC("kprobe/*")
int unchecked(struct egpu_ctx *ctx)
{
    __u32 key = ctx->site;
    __u64 *n = bpf_map_lookup_elem(&counts, &key);
    *n += 1;
    return 0;
}
char LICENSE[] SEC("license") = "GPL";
"""


def _egpu(*args: str):
    from launcher import egpu
    return CliRunner().invoke(egpu, list(args))


def test_cli_verify_ok(probe_obj):
    path = probe_obj("ringbuf")
    r = _egpu("verify", str(path))
    assert r.exit_code == 0, r.output
    assert r.output.splitlines() == ["prog block_enter (kprobe.block/*): ok, 28 insns",
                                     "prog block_exit (kretprobe.block/*): ok, 19 insns"]


def test_cli_verify_names_the_striped_counters(probe_obj):
    r = _egpu("verify", str(probe_obj("globals")))
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[-1] == "map globals.bss: only added to (8-byte adds): 8 rows per SM, summed when read"


def test_cli_verify_unsafe(tmp_path):
    src = tmp_path / "unsafe.bpf.c"
    src.write_text(UNSAFE_PROBE)
    obj = compile_probe(src)
    r = _egpu("verify", str(obj))
    assert r.exit_code == 1
    first, *log = r.output.splitlines()
    assert first.startswith(f"egpu: {obj}:kprobe/*:")
    assert first.endswith("invalid mem access 'map_value_or_null' (r0: compare it with 0 first)")
    assert any(line.startswith("frame0: R0=map_value_or_null") for line in log)


@pytest.mark.parametrize("what", ["truncated", "not_bpf", "missing"])
def test_cli_verify_bad_files(tmp_path, probe_obj, what):
    path = tmp_path / "x.bpf.o"
    if what == "truncated":
        path.write_bytes(probe_obj("count").read_bytes()[:600])
    elif what == "not_bpf":
        path = Path("/bin/true")
    r = _egpu("verify", str(path))
    assert r.exit_code == 1
    assert len(r.output.splitlines()) == 1 and r.output.startswith(f"egpu: {path}: ")
    assert "Traceback" not in r.output


@pytest.mark.parametrize("source, where", [
    ("tests/probes/launch", "launch programs: in C (the shim's interpreter)"),
    ("examples/launch_latency", "launch programs: in C (the shim's interpreter)"),  # a map shared with the GPU
    ("tests/launch_probes/launch_printk", "launch programs: on the Python VM (say_launch calls trace_printk)"),
])
def test_cli_verify_says_where_launch_programs_run(tmp_path, source, where):
    from egpu_preload.bpf.compile import compile_probe
    root = Path(__file__).resolve().parent.parent
    r = _egpu("verify", str(compile_probe(root / f"{source}.bpf.c", tmp_path / "p.bpf.o")))
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[-1] == where
