"""The VM's compiled programs (vm/compile.py) against its interpreter: the ISA table, the verifier's
accepted programs, random programs (local calls in every stack-atomics-calls one; loops, subprograms,
maps and helpers in structured_programs.py's, which the C engine, shim/launchvm.c, runs too), the
faults, and every probe of tests/probes and examples/ on the same contexts, maps compared after each run. Each
comparison first checks that the compiled form exists (``Vm.program``), so it cannot quietly compare
the interpreter with itself."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest

from egpu_preload.bpf import ctx as C
from egpu_preload.bpf.asm import assemble
from egpu_preload.bpf.compile import compile_probe
from egpu_preload.bpf.elf import load_object
from egpu_preload.errors import EgpuError
from egpu_preload.maps import MapsState
from egpu_preload.runtime.dump import storage_contents
from egpu_preload.vm import ThreadSim, Vm
from tests import structured_programs as structured
from tests.isa_cases import CASES
from tests.verifier_cases import ACCEPT, MAPS
from translate_support import memory_program, straight_line_program

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _vms(code: bytes, *args, **kwargs) -> tuple[Vm, Vm]:
    """The interpreted and the compiled form; the compiled one's program must be there."""
    interpreted, compiled = Vm(code, *args, **kwargs), Vm(code, *args, compiled=True, **kwargs)
    assert interpreted.program is None and compiled.program is not None, "the compiled path is not taken"
    return interpreted, compiled


def _both(code: bytes, mem: bytes | None, budget: int = 100_000) -> None:
    """Interpreted and compiled give the same r0 and memory, or the same fault."""
    results = []
    for vm in _vms(code, budget=budget):
        try:
            results.append(vm.run_with_mem(mem))
        except EgpuError as e:
            results.append(("fault", str(e), e.insn))
    assert results[0] == results[1]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_isa_table(case):
    _both(assemble(case.asm), case.mem)


@pytest.mark.parametrize("asm, mem", [
    ("r0 = *(u64 *)(r1 + 0)\nexit", None),
    ("r0 = *(u32 *)(r1 + 2)\nexit", b"abcd"),
    ("r0 = 0\n*(u64 *)(r10 + 0) = r0\nexit", None),
    ("call 99\nexit", None),
    ("r2 = 1\nlock *(u64 *)(r10 - 4) += r2\nexit", None),
    ("r1 = map[0] ll\nexit", None),
    ("r1 = 0\ncall ringbuf_submit\nexit", None),
    ("r0 = 0", None),
    ("goto +1\nr0 = 1 ll\nexit", None),
    ("r10 = 0\nexit", None),
    ("if r1 > 0 goto +0", None),
    ("call local f\nexit\nf: call local f\nexit", None),
    ("call local f\nexit\nf: r10 = 1\nexit", None),
    ("goto +5\nexit", None),
    ("r1 = 1\ncall local f\nexit\nf: goto +1\nr0 = 1 ll\nexit", None),
], ids=["null", "outside", "stack_top", "helper", "misaligned", "no_map", "submit", "falls_off", "into_lddw", "r10",
        "branch_off_the_end", "recursion", "r10_in_sub", "jump_outside", "sub_into_lddw"])
def test_faults_are_reported_alike(asm, mem):
    _both(assemble(asm), mem)


def test_local_calls_keep_frames_and_callee_saved_registers_apart():
    """Each call gets its own frame (the caller's slot survives the callee's store at the same offset)
    and r6-r9 come back as they were; three levels deep."""
    code = assemble("r6 = 7\nr1 = 5\n*(u64 *)(r10 - 8) = r1\ncall local f\nr1 = *(u64 *)(r10 - 8)\nr0 += r1\n"
                    "r0 += r6\nexit\n"
                    "f: *(u64 *)(r10 - 8) = r6\nr6 = 100\ncall local g\nr1 = *(u64 *)(r10 - 8)\nr0 += r1\nexit\n"
                    "g: r6 = 1000\n*(u64 *)(r10 - 8) = r6\nr0 = *(u64 *)(r10 - 8)\nexit")
    _both(code, None)
    assert Vm(code, compiled=True).run() == 1000 + 7 + 5 + 7


def test_the_budget_stops_a_loop():
    code = assemble("r0 = 0\nl: r0 += 1\ngoto l")
    with pytest.raises(EgpuError, match="instruction budget of 1000 exhausted"):
        Vm(code, budget=1000, compiled=True).run()


@pytest.mark.parametrize("make", [straight_line_program, memory_program], ids=["alu", "stack-atomics-calls"])
def test_random_programs(make):
    rng = random.Random(11)
    for _ in range(150):
        _both(make(rng), None)


def _in_c(shim_api, code: bytes, contexts: list[bytes]) -> tuple[list, list]:
    """shim/launchvm.c's r0 (or fault and pc) for each context, one map state, then every map's entries."""
    ffi, lib = shim_api
    maps = [ffi.gc(lib.egpu_lvm_map_new(m.type, m.key_size, m.value_size, m.max_entries, 0, ffi.NULL, 0, 0),
                   lib.egpu_lvm_map_free) for m in structured.MAPS]
    p = ffi.gc(lib.egpu_lvm_prog_new(code, len(code) // 8, ffi.new("struct egpu_lvm_map *[]", maps), len(maps)),
               lib.egpu_lvm_prog_free)
    r0, pc, r0s = ffi.new("unsigned long long *"), ffi.new("unsigned int *"), []
    for c in contexts:
        fault = lib.egpu_lvm_exec(p, ffi.new("unsigned char[]", c), len(c), r0, pc)
        r0s.append(("fault", fault, pc[0]) if fault else r0[0])
    contents = []
    for m, cm in zip(structured.MAPS, maps):
        n = lib.egpu_lvm_map_read(cm, ffi.NULL, ffi.NULL, 0)
        keys, values = ffi.new("unsigned char[]", m.key_size * n + 1), ffi.new("unsigned char[]", m.value_size * n + 1)
        lib.egpu_lvm_map_read(cm, keys, values, n)
        k, v = ffi.buffer(keys), ffi.buffer(values)
        contents.append([(k[m.key_size * i:m.key_size * (i + 1)], v[m.value_size * i:m.value_size * (i + 1)])
                         for i in range(n)])
    return r0s, contents


def _on_vm(code: bytes, contexts: list[bytes], compiled: bool) -> tuple[list, list]:
    """The VM's r0 (or fault and pc) for each context, one map state, then every map's entries."""
    state = MapsState(list(structured.MAPS))
    vm = Vm(code, list(structured.MAPS), state, compiled=compiled)
    assert (vm.program is not None) == compiled, "the compiled path is not taken"
    r0s = []
    for c in contexts:
        try:
            r0s.append(vm.run(c, ThreadSim()))
        except EgpuError as e:
            r0s.append(("fault", str(e)))
    return r0s, [list(s.items()) for s in state.storages]


def test_structured_programs_run_alike_on_every_executor(shim_api):
    """Random programs the verifier accepts, with loops, subprograms, maps and helpers
    (tests/structured_programs.py), each run on three contexts against one map state per executor: the
    interpreter, the compiled VM and the C engine give the same r0s (each a fold of the registers and the
    stack) and leave the same maps. None faults: the verifier accepted them. Every program runs on each."""
    texts = structured.programs(seed=3, count=200)
    rng = random.Random(3)
    ran = {"interpreter": 0, "compiled": 0, "c": 0}
    for n, text in enumerate(texts):
        code = assemble(text)
        contexts = [rng.randbytes(C.SIZE) for _ in range(3)]
        interpreted = _on_vm(code, contexts, False)
        ran["interpreter"] += 1
        compiled = _on_vm(code, contexts, True)
        ran["compiled"] += 1
        in_c = _in_c(shim_api, code, contexts)
        ran["c"] += 1
        assert not any(isinstance(r, tuple) for r in interpreted[0]), (n, interpreted[0], text)
        assert compiled == interpreted, (n, text)
        assert in_c == interpreted, (n, text)
    assert ran == dict.fromkeys(ran, len(texts)) and len(texts) == 200


def _ctx(rng: random.Random) -> bytes:
    buf = bytearray(C.SIZE)
    for f in C.FIELDS:
        for e in range(f.count):
            struct.pack_into(f"<{'BHIQ'[f.size.bit_length() - 1]}", buf, f.offset + e * f.size,
                             rng.getrandbits(8 * f.size) & (0xFFFF if f.size > 2 else -1))
    return bytes(buf)


def _probes(probe_obj) -> list[Path]:
    tests = sorted(p.name.removesuffix(".bpf.c") for p in (Path(__file__).parent / "probes").glob("*.bpf.c"))
    return [probe_obj(n) for n in tests]


def test_every_probe_runs_alike(probe_obj, tmp_path):
    """Every program of every test probe and example, 40 runs each on random contexts against one map
    state per form: the same r0s and the same maps after. Every one compiles."""
    objs = _probes(probe_obj) + [compile_probe(src, tmp_path / f"{src.stem}.o")
                                 for src in sorted(EXAMPLES.glob("*.bpf.c"))]
    compiled = total = 0
    for path in objs:
        obj = load_object(path)
        for p in obj.programs:
            states, r0s = [], []
            for form in (False, True):
                rng = random.Random(5)
                state = MapsState(obj.maps)
                vm = Vm(p.code, obj.maps, state, compiled=form)
                compiled += form and vm.program is not None
                out = []
                for n in range(40):
                    thread = ThreadSim(thread_idx=(n % 64, 0, 0), block_idx=(n // 64, 0, 0), globaltimer=1000 + n)
                    try:
                        out.append(vm.run(_ctx(rng), thread))
                    except EgpuError as e:
                        out.append(str(e))
                r0s.append(out)
                states.append([storage_contents(s) for s in state.storages] + [list(state.trace)])
            assert r0s[0] == r0s[1] and states[0] == states[1], f"{path.name}:{p.section}"
            total += 1
    assert total > 30 and compiled == total


@pytest.mark.parametrize("case", ACCEPT, ids=[c.name for c in ACCEPT])
def test_verifier_accepted_programs(case):
    code = assemble(case.asm)
    results = []
    for form in (False, True):
        state = MapsState(list(MAPS))
        vm = Vm(code, list(MAPS), state, compiled=form)
        assert (vm.program is not None) == form, "the compiled path is not taken"
        try:
            r0 = vm.run(bytes(C.SIZE), ThreadSim())
        except EgpuError as e:
            r0 = str(e)
        results.append((r0, [storage_contents(s) for s in state.storages]))
    assert results[0] == results[1]
