"""The launch probes' C engine (shim/launchvm.c, runtime/native.py) held to the Python VM: the ISA table,
the faults, the context it builds, which probe objects it takes, and every launch probe of the tree run
on both over the same launches with the maps compared entry by entry."""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_preload.bpf import ctx as C
from egpu_preload.bpf.asm import assemble
from egpu_preload.bpf.compile import compile_probe
from egpu_preload.bpf.program import HOST_ONLY_MAPS
from egpu_preload.bpf.sections import parse_section
from egpu_preload.runtime import dump, launches, native
from egpu_preload.runtime.probes import load_probe
from egpu_preload.vm import Vm, run_with_mem
from isa_cases import CASES, Case
from stub_job import ROOT
from translate_support import assert_random_u32, memory_program, straight_line_program


def _exec(shim_api, code: bytes, mem: bytes | None) -> tuple[int, int, int, bytes | None]:
    """(fault, r0, pc, memory after) of egpu_lvm_exec."""
    ffi, lib = shim_api
    p = ffi.gc(lib.egpu_lvm_prog_new(code, len(code) // 8, ffi.NULL, 0), lib.egpu_lvm_prog_free)
    buf = ffi.new("unsigned char[]", len(mem)) if mem else ffi.NULL
    if mem:
        ffi.memmove(buf, mem, len(mem))
    r0, pc = ffi.new("unsigned long long *"), ffi.new("unsigned int *")
    fault = lib.egpu_lvm_exec(p, buf, len(mem or b""), r0, pc)
    return fault, r0[0], pc[0], bytes(ffi.buffer(buf)) if mem else None


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_isa_case_in_c(shim_api, case: Case) -> None:
    fault, r0, pc, mem = _exec(shim_api, assemble(case.asm), case.mem)
    assert fault == 0, f"{native.FAULTS[fault]} at pc {pc}"
    assert r0 == case.r0, f"r0 = 0x{r0:x}, expected 0x{case.r0:x}"
    if case.mem_after is not None:
        assert mem == case.mem_after


@pytest.mark.parametrize("asm, mem, fault, pc", [
    ("r0 = *(u64 *)(r1 + 0)\nexit", None, "bad memory access", 0),                     # NULL
    ("r0 = *(u64 *)(r10 + 0)\nexit", None, "bad memory access", 0),                    # above the stack
    ("r0 = *(u64 *)(r1 + 4)\nexit", b"\0" * 8, "bad memory access", 0),                # past mem's end
    ("r1 = r10\nr1 += -12\nr2 = 1\nlock *(u64 *)(r1 + 0) += r2\nr0 = 0\nexit", None,
     "unaligned atomic access", 3),
    ("r0 = 0\nl: r0 += 1\ngoto l", None, "instruction budget exhausted (unbounded loop?)", 2),
    ("call local f\nexit\nf: call local f\nexit", None, "call depth exceeds 8 frames", 2),
    ("r1 = 0 ll\nr0 = 0\nexit", None, None, None),                                      # fine: a control
])
def test_faults_stop_the_run_where_they_happen(shim_api, asm, mem, fault, pc):
    got, _, at, _ = _exec(shim_api, assemble(asm), mem)
    assert (native.FAULTS.get(got), at if got else None) == (fault, pc)


@pytest.mark.parametrize("make", [straight_line_program, memory_program], ids=["alu-branches", "stack-atomics-calls"])
def test_random_programs_run_as_on_the_vm(shim_api, make):
    """shim/launchvm.c's decoded fast path and its step() for the rest (atomics, sign extension, division,
    bpf-to-bpf calls) against the VM: every ALU and branch row of the ISA table, in both widths, with the
    immediate and with a register, on edge values."""
    rng = random.Random(23)
    for n in range(300):
        code = make(rng)
        fault, r0, pc, mem = _exec(shim_api, code, bytes(8))
        assert (native.FAULTS.get(fault), pc if fault else 0) == (None, 0), n
        assert (r0, mem) == Vm(code).run_with_mem(bytes(8)), n


# bpf_loop(rounds, cb, &sum, flags) with r6 set around it; r0 = the rounds made << 32 | the sum + r6. The callback
# adds its index, r3 | r4 | r5 and what its frame held (a fresh frame each round: 0) into the sum, clobbers r6 (the
# caller's comes back) and stops at index `stop` (returning 1 there); a nested loop adds 0 + 1 + 2 per round.
LOOP = """
    r6 = 77
    *(u64 *)(r10 - 8) = 0
    r1 = {rounds} ll
    r2 = func cb ll
    r3 = r10
    r3 += -8
    r4 = {flags}
    call loop
    r0 <<= 32
    r1 = *(u64 *)(r10 - 8)
    r0 |= r1
    r0 += r6
    exit
cb: r7 = r3
    r7 |= r4
    r7 |= r5
    r8 = *(u64 *)(r10 - 16)
    *(u64 *)(r10 - 16) = r1
    r6 = r2
    r7 += r8
    r7 += r1
    r3 = *(u64 *)(r2 + 0)
    r3 += r7
    *(u64 *)(r2 + 0) = r3
    if r1 != {nested} goto stop
    r1 = 3
    r2 = func inner ll
    r3 = r6
    r4 = 0
    call loop
stop:
    r0 = 0
    if r1 < {stop} goto +1
    r0 = 1
    exit
inner:
    r3 = *(u64 *)(r2 + 0)
    r3 += r1
    *(u64 *)(r2 + 0) = r3
    r0 = 0
    exit
"""


def _c_and_vm(shim_api, code: bytes) -> tuple[tuple, tuple]:
    """(C's, the VM's) run of ``code`` on 8 bytes: (0, r0, memory after), or (the faulting pc,)."""
    from egpu_preload.errors import EgpuError
    fault, r0, pc, mem = _exec(shim_api, code, bytes(8))
    try:
        want = (0, *Vm(code).run_with_mem(bytes(8)))
    except EgpuError as e:
        want = (e.insn,)
    return ((pc,) if fault else (0, r0, mem)), want


@pytest.mark.parametrize("rounds, flags, stop, nested", [
    (10, 0, 100, 99),               # every round
    (10, 0, 4, 99),                 # the callback returns 1 at index 4
    (10, 0, 100, 2),                # a loop inside the callback's third round
    (0, 0, 100, 99),                # no round, no call
    ((1 << 32) + 3, 0, 100, 99),    # nr_loops is a u32
    (1 << 23, 0, 1, 99),            # the most rounds Linux takes
    ((1 << 23) + 1, 0, 1, 99),      # more: -E2BIG, no call
    (10, 1, 100, 99),               # flags: -EINVAL, no call
], ids=["all", "stopped", "nested", "none", "u32", "most", "e2big", "flags"])
def test_bpf_loop_runs_as_on_the_vm(shim_api, rounds, flags, stop, nested):
    got, want = _c_and_vm(shim_api, assemble(LOOP.format(rounds=rounds, flags=flags, stop=stop, nested=nested)))
    assert got == want and want[0] == 0


@pytest.mark.parametrize("asm", [
    "r1 = 1\nr2 = 0\nr3 = 0\nr4 = 0\ncall loop\nexit",                           # r2 no function's address
    "r1 = 1\nr2 = func cb ll\nr2 += 1\nr3 = 0\nr4 = 0\ncall loop\nexit\ncb: r0 = 1 ll\nexit",   # an lddw's half
    "r1 = 1\nr2 = func cb ll\nr2 += 9\nr3 = 0\nr4 = 0\ncall loop\nexit\ncb: r0 = 0\nexit",    # past the end
    "r1 = 1\nr2 = func cb ll\nr3 = 0\nr4 = 0\ncall loop\nexit\n"
    "cb: r1 = 1\nr2 = func cb ll\nr3 = 0\nr4 = 0\ncall loop\nexit",                  # past MAX_FRAMES
], ids=["not_a_function", "into_lddw", "past_the_end", "depth"])
def test_bpf_loop_faults_where_the_vm_does(shim_api, asm):
    got, want = _c_and_vm(shim_api, assemble(asm))
    assert got == want and len(want) == 1


def _raw(code: int, regs: int) -> bytes:
    return struct.pack("<BBhi", code, regs, 0, 0)


@pytest.mark.parametrize("code", [
    assemble("r0 = 0"), assemble("goto +1\nr0 = 1 ll\nexit"), assemble("r10 = 0\nexit"),
    assemble("if r1 > 0 goto +0"), assemble("if r1 == 0 goto +5\nexit"), assemble("w0 = 1\nif w0 s> -1 goto +4\nexit"),
    assemble("goto -2\nexit"), assemble("r1 = 1\ncall local f\nexit\nf: goto +1\nr0 = 1 ll\nexit"),
    assemble("r0 = 1") + _raw(0xf4, 0) + assemble("exit"), assemble("r0 = 2 ll"), _raw(0xb7, 0x0b) + assemble("exit"),
    assemble("r0 = 1") + _raw(0x0c, 0xb0) + assemble("exit"),
], ids=["falls_off", "into_lddw", "r10", "branch_to_the_end", "branch_out_not_taken", "jmp32_out", "before_start",
        "sub_into_lddw", "unknown_alu", "lddw_falls_off", "dst_r11", "src_r11"])
def test_bad_programs_fault_where_the_vm_does(shim_api, code):
    """What decode() leaves to step() faults at the VM's pc when it runs: a branch to outside the program
    faults taken or not, one to the end faults there; a register out of range or an unknown operation,
    which the VM's decoder refuses, faults when it is reached."""
    from egpu_preload.errors import EgpuError
    try:
        Vm(code).run_with_mem(bytes(8))
        on_vm = None
    except EgpuError as e:
        on_vm = e.insn
    fault, _, pc, _ = _exec(shim_api, code, bytes(8))
    assert (fault != 0, pc if fault else None) == (on_vm is not None, on_vm)


def test_every_opcode_runs_or_faults_as_on_the_vm(shim_api):
    """Each opcode byte, its fields in range, out of range or reserved but set, reached by the run: where the
    VM's decoder takes it, C runs it as the VM does, fault and pc included. What that decoder refuses (a
    reserved field not zero, an offset that selects no operation) never reaches C, whose programs are the
    decoded and verified ones (runtime/native.py), so C's reading of it is left open."""
    from egpu_preload.errors import DecodeError, EgpuError
    rng = random.Random(11)
    prefix = assemble("r3 = r10\nr3 += -16\nr4 = 5")
    for opcode in range(256):
        for _ in range(24):
            regs = rng.choice((0x00, 0x01, 0x03, 0x04, 0x10, 0x13, 0x31, 0x41, 0x14, 0x1a, 0xa1, 0x30, 0x0b, 0xb0))
            off = rng.choice((0, 0, 0, 1, 2, -8, 8, 16, 32))
            imm = rng.choice((0, 0, 0, 1, -8, 8, 16, 32, 64, 0xe1, 0xf1, 0xe0))
            insn = struct.pack("<BBhi", opcode, regs, off, imm)
            if opcode == 0x18:
                insn += struct.pack("<BBhi", rng.choice((0, 0, 0x95, 0)), rng.choice((0, 0, 1)), 0, 7)
            code = prefix + insn + assemble("exit")
            fault, r0, pc, mem = _exec(shim_api, code, bytes(16))
            try:
                want = (0, *Vm(code).run_with_mem(bytes(16)))
            except DecodeError:
                continue
            except EgpuError as e:
                want = (e.insn,)
            assert ((pc,) if fault else (0, r0, mem)) == want, (opcode, regs, off, imm)


def test_pid_tgid_is_the_process(shim_api):
    """Helper 14 as bpf/helpers.py defines it, in C as on the VM (tests/test_bpftime_examples.py)."""
    fault, r0, _, _ = _exec(shim_api, assemble("call 14\nexit"), None)
    assert (fault, r0) == (0, os.getpid() << 32 | os.getpid())


def test_other_clocks_and_the_numa_node_in_c(shim_api):
    """Helpers 125, 160 and 42 in C, in a run whose ktime is an event's time (0 here, as egpu_lvm_exec gives):
    boot ns is it plus the time the machine slept (BOOTTIME - MONOTONIC, as Python reads them around the
    call), so never before it; coarse ns is it; the node is one the machine has online."""
    def r0(helper: str) -> int:
        fault, value, _, _ = _exec(shim_api, assemble(f"call {helper}\nr0 = r0\nexit"), None)
        assert fault == 0
        return value
    assert r0("ktime_get_ns") == 0 == r0("ktime_get_coarse_ns")
    before = time.clock_gettime_ns(time.CLOCK_BOOTTIME) - time.monotonic_ns()
    slept = r0("ktime_get_boot_ns")
    after = time.clock_gettime_ns(time.CLOCK_BOOTTIME) - time.monotonic_ns()
    assert 0 <= slept and before - 1_000_000 <= slept <= after + 1_000_000
    online = Path("/sys/devices/system/node/online")
    nodes = {int(n) for part in online.read_text().strip().split(",") for lo, _, hi in [part.partition("-")]
             for n in range(int(lo), int(hi or lo) + 1)} if online.exists() else {0}
    assert r0("get_numa_node_id") in nodes


def test_uid_gid_is_the_processs_real_ids(shim_api):
    """Helper 15 as bpf/helpers.py defines it, gid << 32 | uid, in C as on the VM (it was an unknown helper)."""
    code = assemble("call get_current_uid_gid\nexit")
    want = os.getgid() << 32 | os.getuid()
    assert _exec(shim_api, code, None)[:2] == (0, want)
    assert run_with_mem(code, b"")[0] == want


@pytest.mark.skipif(os.geteuid() != 0, reason="setting another real uid takes root")
def test_uid_gid_is_the_calling_threads(shim_api):
    """Linux gives the ids of the thread that runs the program (the raw setresuid/setresgid syscalls change one
    thread's; glibc's change all), so a uprobe gets its caller's: here a thread's real ids set apart from the
    process's (its effective ids, root, kept), read in C and on the VM in that thread."""
    code = assemble("call get_current_uid_gid\nexit")
    got = []

    def other_ids() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.syscall(119, 4321, -1, -1) == 0 and libc.syscall(117, 1234, -1, -1) == 0   # x86-64 setres[gu]id
        got.append((_exec(shim_api, code, None)[:2], run_with_mem(code, b"")[0]))

    t = threading.Thread(target=other_ids)
    t.start()
    t.join()
    assert got == [((0, 4321 << 32 | 1234), 4321 << 32 | 1234)]
    assert os.getuid() == 0


def test_prandom_is_a_u32_of_each_threads_own_sequence(shim_api):
    """Helper 7, for sampling (it was an unknown helper): in C a generator per thread, seeded apart (8 threads'
    draws together still look random: none repeats another's), and Python's random on the VM."""
    code = assemble("call get_prandom_u32\nexit")
    drawn: list[int] = []

    def draw() -> None:
        drawn.extend(_exec(shim_api, code, None)[1] for _ in range(512))

    threads = [threading.Thread(target=draw) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert_random_u32(drawn)
    assert_random_u32([run_with_mem(code)[0] for _ in range(1024)])


PRANDOM_ACROSS_A_FORK = """
import os, sys
sys.path.insert(0, "tests")
from conftest import shim_api_of
from egpu_preload.bpf.asm import assemble
from test_launchvm import _exec

shim = shim_api_of(sys.argv[1])
shim[1].egpu_uprobe_attach(b"/none", b"none", shim[0].NULL, shim[0].NULL, 0)   # the shim's fork handlers registered
code = assemble("call get_prandom_u32\\nexit")
_exec(shim, code, None)   # this thread's generator seeded before the fork
r, w = os.pipe()
if (pid := os.fork()) == 0:
    os.write(w, " ".join(str(_exec(shim, code, None)[1]) for _ in range(8)).encode())
    os._exit(0)
os.waitpid(pid, 0)
print(os.read(r, 4096).decode())
print(*(_exec(shim, code, None)[1] for _ in range(8)))
"""


def test_prandom_in_a_forked_child_is_not_its_parents_sequence(built):
    """A child forked after the thread drew (a uprobe's process forking, say) draws from a generator seeded
    again (egpu_lvm_fork): copying the parent's state, it would draw the numbers the parent draws next."""
    r = subprocess.run([sys.executable, "-c", PRANDOM_ACROSS_A_FORK, str(built / "libegpu_shim.so")], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    child, parent = (line.split() for line in r.stdout.splitlines())
    assert len(child) == len(parent) == 8 and not set(child) & set(parent), (child, parent)


@pytest.fixture
def edge_of_mapped() -> Iterator[int]:
    """The end of two pages the process has mapped, where a third it has not begins."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                               ctypes.c_int, ctypes.c_int, ctypes.c_long]
    page = os.sysconf("SC_PAGE_SIZE")
    base = libc.mmap(None, 3 * page, 3, 0x22, -1, 0)   # PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS
    assert base not in (None, ctypes.c_void_p(-1).value)
    try:
        assert libc.munmap(ctypes.c_void_p(base + 2 * page), ctypes.c_size_t(page)) == 0
        yield base + 2 * page
    finally:
        libc.munmap(ctypes.c_void_p(base), ctypes.c_size_t(2 * page))


# (helper, where the bytes lie from the edge of mapped memory (None: at address 0), bytes, size, r0, dst): as
# Linux's bpf_probe_read_user (copy_from_user) and _str (strncpy_from_user reads all size bytes, then makes the
# last a NUL): -EFAULT (-14) with dst zeroed where any byte read is not mapped.
_READS = [
    ("probe_read_user", -4, b"abcd", 8, -14, bytes(8)),                    # runs off the mapped pages
    ("probe_read_user", None, b"", 0, 0, b""),                             # nothing read: even NULL is fine
    ("probe_read_user", -5000, bytes(range(250)) * 20, 5000, 0, bytes(range(250)) * 20),   # over a page
    ("probe_read_user_str", -4, b"abc\0", 16, 4, b"abc\0"),               # the NUL ends the page
    ("probe_read_user_str", -1, b"\0", 16, 1, b"\0"),                      # empty: 1, as Linux since 6.4
    ("probe_read_user_str", -4, b"abcd", 16, -14, bytes(16)),               # no NUL before the unmapped page
    ("probe_read_user_str", -3, b"abc", 4, -14, bytes(4)),                  # the size-th byte is unmapped
    ("probe_read_user_str", None, b"", 1, -14, bytes(1)),                   # NULL: its one byte is read
    ("probe_read_user_str", None, b"", 0, 0, b""),
    ("probe_read_user_str", -100, b"abcdefgh\0", 4, 4, b"abc\0"),          # cut to size, the last byte a NUL
    ("probe_read_user_str", -4099, b"abcdef\0", 16, 7, b"abcdef\0"),       # from one mapped page into the next
    ("probe_read_user_str", -8000, b"x" * 5000 + b"\0", 6000, 5001, b"x" * 5000 + b"\0"),   # over a page
    ("probe_read_str", -4, b"abc\0", 8, 4, b"abc\0"),
    ("probe_read", -4, b"abcd", 8, -14, bytes(8)),
]


@pytest.mark.parametrize("helper, where, data, size, r0, dst", _READS)
def test_probe_read_user_returns_and_zeroes_as_linux(shim_api, edge_of_mapped, helper, where, data, size, r0, dst):
    """The application's memory read by its threads' programs (shim/launchvm.c), at the edge of what it has
    mapped. The bytes of dst past the string's NUL are not held (Linux's own depend on its word stride); those
    past size are never written."""
    src = 0 if where is None else edge_of_mapped + where
    if data:
        ctypes.memmove(src, data, len(data))
    code = assemble(f"r2 = {size}\nr3 = {src} ll\ncall {helper}\nexit")
    fault, got, _, mem = _exec(shim_api, code, b"\xff" * (size + 8))
    assert (fault, got) == (0, r0 & (1 << 64) - 1)
    assert mem[:len(dst)] == dst and mem[size:] == b"\xff" * 8


@pytest.mark.parametrize("size", [0, 1, 4, 16, 20])
def test_comm_is_the_main_threads_name_as_strscpy_pad_copies_it(shim_api, size):
    """Helper 16 outside a calling thread (a launch record's run, here from a thread named otherwise): the main
    thread's name, at most size - 1 bytes of it, the rest zeroed, the bytes past size untouched; in C as on the
    VM."""
    name = Path("/proc/self/comm").read_bytes().rstrip(b"\n")
    code = assemble(f"r2 = {size}\ncall get_current_comm\nexit")
    got = []

    def named_thread() -> None:
        ctypes.CDLL(None).prctl(15, b"egpu-other")   # PR_SET_NAME: this thread's, not the main thread's
        got.append(_exec(shim_api, code, b"\xff" * 20))

    t = threading.Thread(target=named_thread)
    t.start()
    t.join()
    want = name[:max(size - 1, 0)].ljust(size, b"\0") + b"\xff" * (20 - size)
    assert got == [(0, 0, 0, want)]
    assert run_with_mem(code, b"\xff" * 20) == (0, want)


def test_the_vms_comm_reads_the_name_once_a_process(monkeypatch):
    """The Python VM's helper 16 opened /proc/self/comm at every call (a launch probe's, every launch); it reads
    it once a process, as the C engine does, and again in a forked child (another pid)."""
    from egpu_preload.bpf import helpers
    opened = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda f, *a, **k: opened.append(f) or real_open(f, *a, **k))
    monkeypatch.setattr(helpers, "_comm", [0, b""])
    first = helpers.main_comm()
    assert helpers.main_comm() == first and len(opened) == 1
    monkeypatch.setattr(os, "getpid", lambda: -1)
    assert helpers.main_comm() == first and len(opened) == 2


def test_the_context_is_the_one_ctx_py_lays_out(shim_api):
    ffi, lib = shim_api
    launch = launches.Launch(7, 1_000, 0x1234, 0xABC, (4, 2, 1), (128, 3, 1), "k")
    rec = _record(ffi, launch)
    out = ffi.new("unsigned char[]", C.SIZE)
    lib.egpu_lvm_context(rec, 99, out)
    assert bytes(ffi.buffer(out)) == launches.context_bytes(launch, 99)


def _record(ffi, launch: launches.Launch):
    return ffi.new("struct egpu_launch_record *", {
        "launch_id": launch.launch_id, "time_ns": launch.time_ns, "function": ffi.cast("void *", launch.function),
        "stream": ffi.cast("void *", launch.stream), "grid": list(launch.grid), "block": list(launch.block)})


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """``probe("examples/launch_count", "v3") -> Probe``, compiled once."""
    out = tmp_path_factory.mktemp("launchvm")

    def make(path: str, mcpu: str = "v3"):
        name = path.replace("/", "_")
        return load_probe(compile_probe(ROOT / f"{path}.bpf.c", out / f"{name}.{mcpu}.bpf.o", mcpu=mcpu))
    return make


NAMES = ["_Z6vecaddPKfS0_Pfi", "_Z9vectorAddPKfS0_Pfi", "other", None]


def _launches(n: int) -> list[launches.Launch]:
    """Launches of four handles, one never looked up (no name), with grids and streams that vary."""
    return [launches.Launch(i + 1, 10_000 + 37 * i, 0x1000 + 16 * (i % 4), 0x50 + i % 3,
                            (1 + i % 5, 1 + i % 2, 1), (32 * (1 + i % 4), 1 + i % 3, 1), NAMES[i % 4])
            for i in range(n)]


def _run_launches(probes: launches.LaunchProbes, ffi, batch: list[launches.Launch], engine: str) -> None:
    """Each launch through the Python VM ("vm"), or through the C router, routed the first time its handle
    is seen ("c")."""
    for launch in batch:
        if engine == "vm":
            probes.run(launch)
            continue
        if launch.function not in probes.router.python:
            probes.route(launch.function, launch.name)
        probes.router.run(_record(ffi, launch), probes.offset)


@pytest.mark.parametrize("path, mcpu", [
    ("examples/launch_count", "v3"), ("tests/probes/launch", "v3"), ("tests/probes/histogram", "v3"),
    ("tests/launch_probes/launch_maps", "v3"), ("tests/launch_probes/launch_maps", "v4"),
    ("examples/launch_latency", "v3"), ("examples/launchlate", "v3"), ("tests/launch_probes/shared_rw", "v3"),
    ("tests/launch_probes/output_flags", "v3"), ("tests/launch_probes/queue_stack", "v3"),
    ("tests/launch_probes/percpu_hash", "v3"), ("tests/launch_probes/loop", "v3"),
])
def test_c_and_the_vm_leave_the_same_maps(shim_api, probe, path, mcpu):
    """Every launch probe of the tree that the C engine takes, over 300 launches: each map's entries
    (and their order) as the Python VM leaves them, and every run counted, none faulting."""
    ffi, _ = shim_api
    obj = probe(path, mcpu)
    on_vm, in_c = launches.LaunchProbes([obj]), launches.LaunchProbes([obj], engine=shim_api)
    assert in_c.sides[0].native is not None and not in_c.sides[0].programs
    on_vm.offset = in_c.offset = 5_000
    for launch in _launches(300):
        on_vm.run(launch)
        if launch.function not in in_c.router.python:
            assert in_c.route(launch.function, launch.name) is False
        in_c.router.run(_record(ffi, launch), in_c.offset)
    vm_state, c_state = on_vm.sides[0].host_state(), in_c.sides[0].host_state()
    for m, vm_map, c_map in zip(vm_state.maps, vm_state.storages, c_state.storages):
        assert list(c_map.items()) == list(vm_map.items()), m.name
        if m.type in HOST_ONLY_MAPS:   # a bloom filter's bits, which are no items
            assert dump.storage_contents(c_map) == dump.storage_contents(vm_map), m.name
    assert in_c.runs == on_vm.runs > 0 and in_c.faults() == [] == on_vm.errors


def test_per_cpu_hashes_and_clocks_in_c(shim_api, probe):
    """tests/launch_probes/percpu_hash over 300 launches in C: the PERCPU_HASH fills (-E2BIG) and has keys
    deleted, the LRU_PERCPU_HASH evicts (it keeps 4 of 7 keys; NOEXIST meets its hot one: -EEXIST), every value is
    CPU 0's, and boot ns and coarse ns held against ktime ns in every run."""
    ffi, _ = shim_api
    in_c = launches.LaunchProbes([probe("tests/launch_probes/percpu_hash")], engine=shim_api)
    in_c.offset = 5_000
    _run_launches(in_c, ffi, _launches(300), "c")
    state = in_c.sides[0].host_state()
    recent = state.by_name("recent")
    assert len(recent.entries) == 4 and recent.cpus() == [0]
    bss, = [s for s in state.storages if s.mapdef.name.endswith(".bss")]
    boot, coarse, ok, full, exists = struct.unpack("<5Q", bss.values[0])
    assert (boot, coarse) == (300, 300) and ok > 0 and full > 0 and exists > 0
    assert in_c.faults() == []


def test_host_only_maps_read_from_c_go_back_as_they_were(shim_api, probe):
    """C maps read (native.Side.storages, as a live probe's uprobes' final maps are) and loaded into fresh ones
    (Side.load): a queue and a stack keep their values and order, a bloom filter its bits (its bits were once
    never read back, the exit dump's were zeros, nor loaded)."""
    ffi, lib = shim_api
    obj = probe("tests/launch_probes/queue_stack")
    lp = launches.LaunchProbes([obj], engine=shim_api)
    lp.offset = 5_000
    _run_launches(lp, ffi, _launches(40), "c")
    side = lp.sides[0].native
    left = side.storages()
    again = native.Side(ffi, lib, obj.obj.maps, left, [])
    for i, storage in left.items():
        again.load(i, storage)
    names = [m.name for m in obj.obj.maps]
    seen = left[names.index("seen")]
    assert any(seen.bits) and all(seen.test(struct.pack("<Q", 2 * i)) == 0 for i in range(1, 41))
    assert {i: dump.storage_contents(s) for i, s in again.storages().items()} == \
        {i: dump.storage_contents(s) for i, s in left.items()}


@pytest.mark.parametrize("engine", ["c", "vm"])
def test_output_helpers_refuse_flags_linux_refuses(shim_api, probe, engine):
    """bpf_perf_event_output with flags beyond the CPU index and bpf_ringbuf_output with flags beyond
    BPF_RB_NO_WAKEUP | BPF_RB_FORCE_WAKEUP return -EINVAL and send nothing (bpf_trace.c, ringbuf.c); valid
    flags return 0. Both were once taken as valid by one engine or all (a helper's probe sweep)."""
    ffi, _ = shim_api
    obj = probe("tests/launch_probes/output_flags", "v3")
    lp = launches.LaunchProbes([obj], engine=shim_api) if engine == "c" else launches.LaunchProbes([obj])
    lp.offset = 5_000
    _run_launches(lp, ffi, _launches(3), engine)
    state = lp.sides[0].host_state()
    results = dict(state.storages[[m.name for m in state.maps].index("results")].items())
    assert [struct.unpack("<q", results[struct.pack("<I", k)])[0] for k in range(4)] == [0, -22, 0, -22]


@pytest.mark.parametrize("engine", ["c", "vm"])
def test_a_retired_probe_runs_no_more_and_the_others_go_on(shim_api, probe, engine):
    """A probe egpu-run started with, detached or swapped out live (LaunchProbes.retire): its launch
    programs ran on after the detach, where nothing read their maps (a helper's sweep). From the retire on
    none of its programs runs, on either engine, and the other probe's count every launch; restored (the
    change that retired it failed), it runs again."""
    ffi, _ = shim_api
    objs = [probe("examples/launch_count", "v3"), probe("tests/probes/launch", "v3")]
    probes = launches.LaunchProbes(objs, engine=shim_api, in_c=engine == "c")

    def run(batch: list[launches.Launch]) -> None:
        _run_launches(probes, ffi, batch, engine)

    def maps(i: int) -> dict:
        return dump.state_contents(probes.sides[i].host_state())

    batch = _launches(60)
    run(batch[:30])
    before = [maps(0), maps(1)]
    assert probes.runs > 0
    assert probes.retire(objs[0]) and not probes.retire(objs[0])   # once
    run(batch[30:45])
    assert maps(0) == before[0] and maps(1) != before[1]
    probes.restore(objs[0])
    run(batch[45:])
    assert maps(0) != before[0]


def test_retiring_a_probe_attached_live_does_not_wait_for_a_pass(shim_api, probe):
    """A detach or swap stops the old probe's host programs in the drainer first (Drainer.retire); a probe
    attached live has none there, yet waited for the drain's lock, which a pass holds while it runs records:
    on the H200 live detaches and swaps in a PyTorch job waited 130-510 ms. Now only egpu-run's own probes
    take the lock."""
    import threading
    ffi, lib = shim_api
    started, live = probe("examples/launch_count", "v3"), probe("tests/probes/launch", "v3")
    drainer = launches.Drainer(ffi, lib, launches.LaunchProbes([started], engine=shim_api), lambda f: None,
                               lambda: None)
    done = threading.Event()
    with drainer._lock:   # a pass running records
        threading.Thread(target=lambda: (drainer.retire(live), drainer.restore(live), done.set()), daemon=True).start()
        assert done.wait(5), "retire of a probe attached live waited for the drain's lock"
        retired = threading.Event()
        threading.Thread(target=lambda: (drainer.retire(started), retired.set()), daemon=True).start()
        assert not retired.wait(0.2)   # egpu-run's own probe waits for the pass, as it must
    assert retired.wait(5) and drainer.probes.retired == {0}


def test_the_checked_semantics_are_reached(shim_api, probe):
    """launch_maps exercises what it says: the LRU evicted but kept what was used, the hash filled up,
    flags were refused."""
    ffi, _ = shim_api
    in_c = launches.LaunchProbes([probe("tests/launch_probes/launch_maps", "v4")], engine=shim_api)
    for launch in _launches(300):
        if launch.function not in in_c.router.python:
            in_c.route(launch.function, launch.name)
        in_c.router.run(_record(ffi, launch), 0)
    state = in_c.sides[0].host_state()
    codes = {struct.unpack("<I", k)[0]: struct.unpack("<Q", v)[0] for k, v in state.by_name("codes").items()}
    assert codes[0] > 0 and codes[2] > 0 and codes[17] > 0 and codes[22] == 300  # 0, ENOENT, EEXIST, EINVAL
    recent = {struct.unpack("<Q", k)[0]: struct.unpack("<Q", v[:8])[0] for k, v in state.by_name("recent").items()}
    assert len(recent) == 4 and recent[0] > 50  # key 0, looked up every third launch, was never evicted


@pytest.mark.parametrize("path, why", [
    ("tests/launch_probes/launch_printk", "say_launch calls trace_printk"),
    ("tests/probes/ringbuf", None),
])
def test_objects_the_c_engine_leaves_to_the_vm(shim_api, probe, path, why):
    obj = probe(path)
    sides = launches.LaunchProbes([obj], engine=shim_api).sides
    if why is None:  # no launch program at all
        assert sides == [None]
        return
    assert sides[0].native is None and sides[0].programs and sides[0].refusal == why


def test_a_refusal_names_the_helper(probe):
    obj = probe("tests/launch_probes/launch_maps")
    (p,) = [p for p in obj.obj.programs if p.attach.kind == "launch"]
    printk = assemble("r1 = r10\nr1 += -8\n*(u64 *)(r1 + 0) = 0\nr2 = 8\ncall 6\nr0 = 0\nexit")
    import dataclasses
    assert native.refusal([dataclasses.replace(p, code=printk)], obj.obj.maps, set()) == \
        f"{p.name} calls trace_printk"


def test_bpf_loop_runs_in_c(probe):
    """C calls bpf_loop's callback (it once left such launch programs to the Python VM and refused an object
    with host-API programs calling it, which run only in C): neither refusal says a word now."""
    import dataclasses
    obj = probe("tests/launch_probes/launch_maps")
    (p,) = [p for p in obj.obj.programs if p.attach.kind == "launch"]
    loop = dataclasses.replace(p, code=assemble("r1 = 1\nr2 = func cb ll\nr3 = 0\nr4 = 0\ncall loop\nexit\n"
                                                 "cb: r0 = 0\nexit"))
    assert native.refusal([loop], obj.obj.maps, set()) is None
    api = dataclasses.replace(loop, attach=parse_section("egpu/memcpy/*"))
    assert native.api_refusal(dataclasses.replace(obj.obj, programs=[api])) is None


@pytest.mark.parametrize("shape, made", [
    ((2, 4, 8, 16), True),                # ARRAY of 16 u64
    ((2, 1, 8, 16), False),               # an array key is 4 bytes
    ((1, 8, 0, 16), False),               # no value
    ((1, 8, 8, native.MAX_ENTRIES + 1), False),
    ((9, 8, 8, 1 << 30), False),          # refused at once (an index of 2^31 entries never fit an int)
    ((1, 8, native.MAX_VALUE + 1, 1), False),
    ((27, 0, 0, 4096), False),            # a ring buffer is not a C map
    ((22, 0, 8, 4), True),                # QUEUE of 4 u64
    ((23, 4, 8, 4), False),               # a stack has no key
    ((22, 0, 8, 0), False),               # nor a queue without entries
    ((30, 0, native.MAX_VALUE, native.MAX_ENTRIES), True),   # a bloom filter keeps bits (2^27), not values
])
def test_map_shapes_past_the_limits_are_refused(shim_api, shape, made):
    ffi, lib = shim_api
    m = lib.egpu_lvm_map_new(*shape, 0, ffi.NULL, 0, 0)
    assert (m != ffi.NULL) == made
    lib.egpu_lvm_map_free(m)


@pytest.mark.parametrize("access", ["r0 = *(u64 *)(r0 + 0)", "r0 = *(u32 *)(r0 + 4)", "r0 = *(u32 *)(r0 + 0)"])
def test_an_access_is_bounded_by_its_value_not_its_map(shim_api, access):
    """A lookup's pointer reaches its own 4-byte value only (the VM maps each value apart), though the
    next value lies 8 bytes on in C."""
    from egpu_preload.bpf import program as prog
    from egpu_preload.errors import VmError
    from egpu_preload.vm import Vm, run_with_mem
    ffi, lib = shim_api
    code = assemble("\n".join(["*(u32 *)(r10 - 4) = 0", "r2 = r10", "r2 += -4", "r1 = map[0] ll",
                               "call map_lookup_elem", "if r0 == 0 goto out", access, "out:", "exit"]))
    mapdef = prog.MapDef("a", prog.MAP_ARRAY, 4, 4, 2)
    m = ffi.gc(lib.egpu_lvm_map_new(prog.MAP_ARRAY, 4, 4, 2, 0, ffi.NULL, 0, 0), lib.egpu_lvm_map_free)
    p = ffi.gc(lib.egpu_lvm_prog_new(code, len(code) // 8, ffi.new("struct egpu_lvm_map *[]", [m]), 1),
               lib.egpu_lvm_prog_free)
    r0, pc = ffi.new("unsigned long long *"), ffi.new("unsigned int *")
    fault = lib.egpu_lvm_exec(p, ffi.NULL, 0, r0, pc)
    try:
        Vm(code, [mapdef]).run()
        on_vm = None
    except VmError:
        on_vm = "bad memory access"
    assert native.FAULTS.get(fault) == on_vm
    assert on_vm is None or pc[0] == 7  # the load (lddw takes two slots)


@pytest.mark.parametrize("asm, pc", [
    ("goto +5\nexit", 0), ("r0 = 1\nif r0 == 1 goto +7\nexit", 1), ("call local +9\nexit", 0)])
def test_a_jump_out_of_the_program_faults_where_it_is(shim_api, asm, pc):
    fault, _, at, _ = _exec(shim_api, assemble(asm), None)
    assert (native.FAULTS[fault], at) == ("invalid instruction", pc)


def _map_op(op: str, key: int, value: int, flags: int) -> bytes:
    """r1's u64 <- what one helper call on map 0 returned: update's or delete's code, a lookup's value
    (-1 when absent)."""
    call = {"lookup": ["call map_lookup_elem", "if r0 == 0 goto none", "r0 = *(u64 *)(r0 + 0)", "goto out",
                       "none: r0 = -1", "out:"],
            "update": ["r3 = r10", "r3 += -16", f"r4 = {flags}", "call map_update_elem"],
            "delete": ["call map_delete_elem"]}[op]
    return assemble("\n".join(["r6 = r1", f"r7 = {key}", "*(u64 *)(r10 - 8) = r7", f"r7 = {value}",
                               "*(u64 *)(r10 - 16) = r7", "r1 = map[0] ll", "r2 = r10", "r2 += -8", *call,
                               "*(u64 *)(r6 + 0) = r0", "exit"]))


@pytest.mark.parametrize("seed", range(24))
def test_random_hash_sessions_match_the_vm(shim_api, seed):
    """Lookups, updates with every flag (and a bad one) and deletes on a small hash map of each kind, more
    keys than it holds: every result as the VM's, and the entries in the VM's order along the way."""
    import random
    from egpu_preload.bpf import program as prog
    from egpu_preload.maps import MapsState
    from egpu_preload.vm import Vm, run_with_mem
    ffi, lib = shim_api
    rng = random.Random(seed)
    mtype, size = rng.choice(sorted(prog.HASHES)), rng.randint(1, 12)   # a per-CPU one's are CPU 0's here
    mapdef = prog.MapDef("m", mtype, 8, 8, size)
    state = MapsState([mapdef])
    m = ffi.gc(lib.egpu_lvm_map_new(mtype, 8, 8, size, 0, ffi.NULL, 0, 0), lib.egpu_lvm_map_free)
    table = ffi.new("struct egpu_lvm_map *[]", [m])
    out, r0, pc = ffi.new("unsigned char[]", 8), ffi.new("unsigned long long *"), ffi.new("unsigned int *")
    for step in range(150):
        op = rng.choice(["lookup", "update", "update", "update", "delete"])
        code = _map_op(op, rng.randrange(3 * size + 2), rng.randrange(1000), rng.choice([0, 0, 1, 2, 3]))
        on_vm = Vm(code, [mapdef], state).run_with_mem(bytes(8))[1]
        p = ffi.gc(lib.egpu_lvm_prog_new(code, len(code) // 8, table, 1), lib.egpu_lvm_prog_free)
        assert lib.egpu_lvm_exec(p, out, 8, r0, pc) == 0
        assert bytes(ffi.buffer(out)) == on_vm, (step, op)
        if step % 10 == 9:
            n = lib.egpu_lvm_map_read(m, ffi.NULL, ffi.NULL, 0)
            keys, values = ffi.new("unsigned char[]", 8 * n + 1), ffi.new("unsigned char[]", 8 * n + 1)
            lib.egpu_lvm_map_read(m, keys, values, n)
            kb, vb = ffi.buffer(keys), ffi.buffer(values)
            assert [(kb[8 * i:8 * i + 8], vb[8 * i:8 * i + 8]) for i in range(n)] == list(state.storages[0].items())


def _peek(storage, key: bytes) -> bytes | None:
    """A key's value without counting as use (an LRU's lookup would reorder the VM's map)."""
    value = storage.entries.get(key) if hasattr(storage, "entries") else storage.lookup(key)
    return bytes(value) if value is not None else None


@pytest.mark.parametrize("path", ["tests/launch_probes/shared_rw", "examples/launch_latency", "examples/launchlate"])
def test_c_logs_the_changes_the_vm_would_push(shim_api, probe, path):
    """Maps GPU probes share: after the same launches, the keys C logged as changed (to copy to the
    device) are the keys the VM's Touched collected, each with the host value; a read, or a value
    written back unchanged, is not a change; taking them empties the log."""
    ffi, _ = shim_api
    obj = probe(path)
    on_vm, in_c = launches.LaunchProbes([obj]), launches.LaunchProbes([obj], engine=shim_api)
    vm_side, c_side = on_vm.sides[0], in_c.sides[0]
    assert c_side.native is not None and c_side.shared == vm_side.shared != set()
    on_vm.offset = in_c.offset = 5_000
    for batch in range(3):  # taken between batches, as the drainer pushes every period
        for launch in _launches(40)[batch * 13:batch * 13 + 13]:
            on_vm.run(launch)
            if launch.function not in in_c.router.python:
                in_c.route(launch.function, launch.name)
            in_c.router.run(_record(ffi, launch), in_c.offset)
        assert c_side.has_pending() == bool(vm_side.pending)
        host = vm_side.host_state()
        for i in sorted(c_side.shared):
            storage, taken = c_side.native.changes(i)
            assert set(taken) == vm_side.pending.get(i, set()), (batch, obj.obj.maps[i].name)
            for key in taken:
                assert _peek(storage, key) == _peek(host.storages[i], key)
            assert c_side.native.changes(i)[1] == []
        vm_side.pending = {}
    assert not c_side.has_pending()


_LOOK = ["r2 = r10", "r2 += -4", "call map_lookup_elem"]


def _wait(flag: str, name: str) -> list[str]:
    """Assembly: r0 = 1 once the u64 at `flag` is set, 0 after 2M turns without (labels `name`...)."""
    return ["r0 = 0", "r3 = 2000000", f"{name}: r1 = *(u64 *){flag}", f"if r1 != 0 goto {name}_set", "r3 += -1",
            f"if r3 != 0 goto {name}", f"goto {name}_end", f"{name}_set: r0 = 1", f"{name}_end:"]


def _tracked_pair(ffi, lib) -> tuple:
    """(shared, flags, progs): a tracked array (the value GPU probes share) and two programs that change its
    key 0 in runs on two threads, in turns set by flags[0..2]. W: 5 into it, flags[0] = 1, wait for flags[1],
    0 into it. V: wait for flags[0], look it up (5: W's change, not settled), flags[1] = 1, wait for flags[2]
    (set once W's run has ended), 5 into it. Each returns whether the wait it ends on came."""
    from egpu_preload.bpf import program as prog
    look = _LOOK
    keys = ["*(u32 *)(r10 - 4) = 0", "r1 = map[1] ll", *look, "r7 = r0", "*(u32 *)(r10 - 4) = 1", "r1 = map[1] ll",
            *look, "r8 = r0", "*(u32 *)(r10 - 4) = 2", "r1 = map[1] ll", *look, "r9 = r0", "*(u32 *)(r10 - 4) = 0"]
    w = [*keys, "r1 = map[0] ll", *look, "r6 = r0", "r1 = 5", "*(u64 *)(r6 + 0) = r1", "r1 = 1",
         "*(u64 *)(r7 + 0) = r1", *_wait("(r8 + 0)", "w1"), "r1 = 0", "*(u64 *)(r6 + 0) = r1", "exit"]
    v = [*keys, *_wait("(r7 + 0)", "v0"), "r1 = map[0] ll", *look, "r6 = r0", "r1 = 1", "*(u64 *)(r8 + 0) = r1",
         *_wait("(r9 + 0)", "v2"), "r1 = 5", "*(u64 *)(r6 + 0) = r1", "exit"]
    shared = ffi.gc(lib.egpu_lvm_map_new(prog.MAP_ARRAY, 4, 8, 1, 0, ffi.NULL, 0, 0), lib.egpu_lvm_map_free)
    flags = ffi.gc(lib.egpu_lvm_map_new(prog.MAP_ARRAY, 4, 8, 3, 0, ffi.NULL, 0, 0), lib.egpu_lvm_map_free)
    lib.egpu_lvm_map_track(shared)
    table = ffi.new("struct egpu_lvm_map *[]", [shared, flags])
    progs = [ffi.gc(lib.egpu_lvm_prog_new(code, len(code) // 8, table, 2), lib.egpu_lvm_prog_free)
             for code in (assemble("\n".join(w)), assemble("\n".join(v)))]
    return shared, flags, progs


def test_a_value_changed_by_runs_at_once_is_logged_though_each_put_back_what_it_saw(shim_api):
    """Runs on many threads share a tracked map: W changes key 0 (5), V looks it up before W's run has ended
    and sees 5, W puts 0 back and ends, V writes 5 and ends. Each run's value at its end is what its lookup
    handed out, but the map's value has changed since the runtime took it (0): the key is logged."""
    import threading
    ffi, lib = shim_api
    shared, flags, (w, v) = _tracked_pair(ffi, lib)
    saw, pc = [ffi.new("unsigned long long *") for _ in range(2)], ffi.new("unsigned int[2]")
    other = threading.Thread(target=lambda: lib.egpu_lvm_exec(v, ffi.NULL, 0, saw[1], pc + 1))
    other.start()
    lib.egpu_lvm_exec(w, ffi.NULL, 0, saw[0], pc)
    lib.egpu_lvm_map_load(flags, struct.pack("<I", 2), struct.pack("<Q", 1), 1)
    other.join()
    assert (saw[0][0], saw[1][0]) == (1, 1)  # the turns came as written
    value = ffi.new("unsigned long long *")
    lib.egpu_lvm_map_read(shared, ffi.new("unsigned int *"), value, 1)
    assert value[0] == 5
    assert lib.egpu_lvm_map_changes(shared, ffi.NULL, ffi.NULL, ffi.NULL, 0) == 1


def test_a_value_the_runtime_took_in_the_middle_of_a_run_is_logged_again(shim_api):
    """A run looks up key 0 of a tracked array (logged as changed: 3), writes 7 and waits; meanwhile the runtime
    takes the changes (7); the run puts 3 back and ends. Its value at the end is what its lookup handed out,
    but not what the runtime took: the key is logged again."""
    from egpu_preload.bpf import program as prog
    ffi, lib = shim_api
    shared = ffi.gc(lib.egpu_lvm_map_new(prog.MAP_ARRAY, 4, 8, 1, 0, ffi.NULL, 0, 0), lib.egpu_lvm_map_free)
    flags = ffi.gc(lib.egpu_lvm_map_new(prog.MAP_ARRAY, 4, 8, 2, 0, ffi.NULL, 0, 0), lib.egpu_lvm_map_free)
    lib.egpu_lvm_map_track(shared)
    table = ffi.new("struct egpu_lvm_map *[]", [shared, flags])
    code = ["*(u32 *)(r10 - 4) = 1", "r1 = map[1] ll", *_LOOK, "r8 = r0", "*(u32 *)(r10 - 4) = 0", "r1 = map[1] ll",
            *_LOOK, "r7 = r0", "r1 = map[0] ll", *_LOOK, "r6 = r0", "r1 = 7", "*(u64 *)(r6 + 0) = r1", "r1 = 1",
            "*(u64 *)(r7 + 0) = r1", *_wait("(r8 + 0)", "w"), "r1 = 3", "*(u64 *)(r6 + 0) = r1", "exit"]
    run, put = [ffi.gc(lib.egpu_lvm_prog_new(c, len(c) // 8, table, 2), lib.egpu_lvm_prog_free)
                for c in (assemble("\n".join(code)), _map_op("update", 0, 3, 0))]  # put: key 0 = 3
    r0, pc, out = ffi.new("unsigned long long *"), ffi.new("unsigned int *"), ffi.new("unsigned char[]", 8)
    assert lib.egpu_lvm_exec(put, out, 8, r0, pc) == 0 and bytes(out) == bytes(8)  # 3, logged
    import threading
    other = threading.Thread(target=lambda: lib.egpu_lvm_exec(run, ffi.NULL, 0, r0, pc))
    other.start()
    value = ffi.new("unsigned long long[2]")
    while not value[0] and other.is_alive():  # the run wrote 7 and waits
        lib.egpu_lvm_map_read(flags, ffi.new("unsigned int[2]"), value, 2)
    keys, taken, present = ffi.new("unsigned int *"), ffi.new("unsigned long long *"), ffi.new("unsigned char *")
    assert lib.egpu_lvm_map_changes(shared, keys, taken, present, 1) == 1 and taken[0] == 7
    lib.egpu_lvm_map_load(flags, struct.pack("<I", 1), struct.pack("<Q", 1), 1)
    other.join()
    assert r0[0] == 1  # the run's wait ended as written
    assert lib.egpu_lvm_map_changes(shared, ffi.NULL, ffi.NULL, ffi.NULL, 0) == 1


def test_a_key_a_run_logged_at_its_lookup_is_taken_again_after_the_run_wrote_it(shim_api):
    """A run that looked up more values of a tracked map than it keeps (16) logs the next key at its lookup,
    before it writes through the pointer. The runtime takes the changes in between (key 0: 0), then the run
    writes 9 and ends: the key is still logged, so the next take carries the 9 to the GPU's copy."""
    import threading
    from egpu_preload.bpf import program as prog
    ffi, lib = shim_api
    shared = ffi.gc(lib.egpu_lvm_map_new(prog.MAP_ARRAY, 4, 8, 32, 0, ffi.NULL, 0, 0), lib.egpu_lvm_map_free)
    flags = ffi.gc(lib.egpu_lvm_map_new(prog.MAP_ARRAY, 4, 8, 2, 0, ffi.NULL, 0, 0), lib.egpu_lvm_map_free)
    lib.egpu_lvm_map_track(shared)
    table = ffi.new("struct egpu_lvm_map *[]", [shared, flags])
    watched = [x for k in range(1, 17) for x in (f"*(u32 *)(r10 - 4) = {k}", "r1 = map[0] ll", *_LOOK)]
    code = ["*(u32 *)(r10 - 4) = 1", "r1 = map[1] ll", *_LOOK, "r8 = r0", "*(u32 *)(r10 - 4) = 0", "r1 = map[1] ll",
            *_LOOK, "r7 = r0", *watched, "*(u32 *)(r10 - 4) = 0", "r1 = map[0] ll", *_LOOK, "r6 = r0", "r1 = 1",
            "*(u64 *)(r7 + 0) = r1", *_wait("(r8 + 0)", "w"), "r1 = 9", "*(u64 *)(r6 + 0) = r1", "exit"]
    blob = assemble("\n".join(code))
    run = ffi.gc(lib.egpu_lvm_prog_new(blob, len(blob) // 8, table, 2), lib.egpu_lvm_prog_free)
    r0, pc = ffi.new("unsigned long long *"), ffi.new("unsigned int *")
    other = threading.Thread(target=lambda: lib.egpu_lvm_exec(run, ffi.NULL, 0, r0, pc))
    other.start()
    flag = ffi.new("unsigned long long[2]")
    while not flag[0] and other.is_alive():  # the run looked key 0 up and waits
        lib.egpu_lvm_map_read(flags, ffi.new("unsigned int[2]"), flag, 2)
    keys, values, present = ffi.new("unsigned int[32]"), ffi.new("unsigned long long[32]"), ffi.new("unsigned char[32]")
    n = lib.egpu_lvm_map_changes(shared, keys, values, present, 32)
    assert (n, keys[0], values[0]) == (1, 0, 0)   # key 0, logged at its lookup; the watched 16 are not yet
    lib.egpu_lvm_map_load(flags, struct.pack("<I", 1), struct.pack("<Q", 1), 1)
    other.join()
    assert r0[0] == 1   # the run's wait ended as written
    n = lib.egpu_lvm_map_changes(shared, keys, values, present, 32)
    assert {keys[i]: values[i] for i in range(min(n, 32))}.get(0) == 9


TRACE_RECORDS = 16384   # launchvm.c's trace buffer


def _printk_loop(ffi, lib, n: int, maps=None):
    """A program that makes n bpf_printk lines, "call" with n, n - 1, .., 1 as the first argument; given ``maps``
    (a cdata array of maps it may use: a per-CPU one makes its runs hold cpu_lock), with them."""
    code = assemble("\n".join([f"r6 = {n}", f"*(u32 *)(r10 - 8) = {int.from_bytes(b'call', 'little')}",
                               "loop: r1 = r10", "r1 += -8", "r2 = 4", "r3 = r6", "call trace_printk", "r6 += -1",
                               "if r6 != 0 goto loop", "r0 = 0", "exit"]))
    return ffi.gc(lib.egpu_lvm_prog_new(code, len(code) // 8, maps if maps is not None else ffi.NULL,
                                        len(maps) if maps is not None else 0), lib.egpu_lvm_prog_free)


def _take_all(ffi, lib) -> list[int]:
    """The first argument of every record in C's trace buffer, taken out of it."""
    out, got = ffi.new("struct egpu_lvm_trace[]", 1024), []
    while n := lib.egpu_lvm_trace_take(out, 1024):
        got += [out[k].args[0] for k in range(n)]
    return got


def _lost(ffi, lib, p, nmaps: int = 0) -> int:
    """The bpf_printk lines p's runs lost (egpu_lvm_prog_lost writes nmaps + 1 counts)."""
    lost = ffi.new("unsigned long long[]", nmaps + 1)
    lib.egpu_lvm_prog_lost(p, lost)
    return lost[0]


def _timed_exec(ffi, lib, p) -> float:
    """Seconds one run of p took, run on this thread."""
    r0, pc = ffi.new("unsigned long long *"), ffi.new("unsigned int *")
    start = time.monotonic()
    assert lib.egpu_lvm_exec(p, ffi.NULL, 0, r0, pc) == 0
    return time.monotonic() - start


def test_runs_wait_for_a_slow_take_under_on_full_wait_and_lose_nothing(shim_api):
    """egpu-run --on-full wait: a run whose bpf_printk finds C's buffer full (16 Ki records) waits until the
    take, slow but taking, makes room: a burst of 40,000 lines arrives whole and in order, none lost. Under
    drop (no egpu_lvm_trace_wait) the lines past the buffer were lost."""
    ffi, lib = shim_api
    n, p = 40000, _printk_loop(ffi, lib, 40000)
    _take_all(ffi, lib)
    ready, done, got = threading.Event(), threading.Event(), []
    out = ffi.new("struct egpu_lvm_trace[]", 1024)

    def take() -> None:   # the drain thread's part: 1,024 lines every 5 ms at most
        lib.egpu_lvm_trace_wait(5 * 10**9)
        ready.set()
        try:
            while (k := lib.egpu_lvm_trace_take(out, 1024)) or not done.is_set():
                got.extend(out[i].args[0] for i in range(k))
                time.sleep(0.005)
        finally:
            lib.egpu_lvm_trace_wait(0)

    taker = threading.Thread(target=take)
    taker.start()
    ready.wait()
    _timed_exec(ffi, lib, p)
    done.set()
    taker.join()
    assert got == list(range(n, 0, -1)) and _lost(ffi, lib, p) == 0


@contextlib.contextmanager
def _stuck_take(lib, stall_ns: int) -> Iterator[None]:
    """A thread that takes C's trace records (egpu_lvm_trace_wait) but never does, until the block ends."""
    ready, release = threading.Event(), threading.Event()

    def stuck() -> None:
        lib.egpu_lvm_trace_wait(stall_ns)
        ready.set()
        release.wait()
        lib.egpu_lvm_trace_wait(0)

    taker = threading.Thread(target=stuck)
    taker.start()
    ready.wait()
    try:
        yield
    finally:
        release.set()
        taker.join()


def test_runs_give_up_once_the_take_has_not_run_for_the_stall_time(shim_api):
    """A take that stopped taking (stuck): the first line that finds the buffer full waits out the stall time
    (200 ms here), then it and every line after it are dropped at once, counted, and the run goes on."""
    ffi, lib = shim_api
    n, p = 20000, _printk_loop(ffi, lib, 20000)
    _take_all(ffi, lib)
    with _stuck_take(lib, 200 * 10**6):
        took = _timed_exec(ffi, lib, p)
    assert 0.1 < took < 2, took   # one wait of the stall time, not one a line
    assert _lost(ffi, lib, p) == n - TRACE_RECORDS
    assert _take_all(ffi, lib) == list(range(n, n - TRACE_RECORDS, -1))


def _exec_holding_the_gil(ffi, path: Path, p) -> float:
    """Seconds one run of p took, called through ctypes.PyDLL, which keeps the GIL across the call."""
    shim = ctypes.PyDLL(str(path))
    r0, pc = ctypes.c_ulonglong(), ctypes.c_uint()
    start = time.monotonic()
    shim.egpu_lvm_exec(ctypes.c_void_p(int(ffi.cast("uintptr_t", p))), None, ctypes.c_size_t(0), ctypes.byref(r0),
                       ctypes.byref(pc))
    return time.monotonic() - start


@pytest.mark.parametrize("where", ["taking-thread", "take-ended", "gil-held"])
def test_runs_never_wait_where_the_take_cannot_come(shim_api, built, where):
    """Under --on-full wait a full buffer still drops at once (counted) on the thread that takes (it would wait
    for itself: a launch program the drain thread runs), once the take's thread ended (egpu_lvm_trace_wait(0):
    the job's exit), and in a thread that holds the GIL, which the runtime's take needs. A run that waited would
    wait out the 10 s stall."""
    ffi, lib = shim_api
    n, p = 20000, _printk_loop(ffi, lib, 20000)
    _take_all(ffi, lib)
    if where == "taking-thread":
        lib.egpu_lvm_trace_wait(10**10)
        try:
            took = _timed_exec(ffi, lib, p)
        finally:
            lib.egpu_lvm_trace_wait(0)
    elif where == "take-ended":
        with _stuck_take(lib, 10**10):
            pass
        took = _timed_exec(ffi, lib, p)
    else:
        with _stuck_take(lib, 10**10):
            took = _exec_holding_the_gil(ffi, built / "libegpu_shim.so", p)
    assert took < 2, took
    assert _lost(ffi, lib, p) == n - TRACE_RECORDS
    assert len(_take_all(ffi, lib)) == TRACE_RECORDS


@contextlib.contextmanager
def waiting_with_cpu_lock(ffi, lib) -> Iterator[tuple[Any, Any]]:
    """A run of a program with a per-CPU array (its runs hold cpu_lock) waiting for room for the most of its 60,000
    bpf_printk lines, under a slow take (1,024 lines every 50 ms, each after egpu_lvm_drain's route_lock and with the
    GIL, as the drain thread's); yields its program and one of a line with the same array, the take and the run
    ended after the block."""
    from egpu_preload.bpf import program as prog
    percpu = ffi.gc(lib.egpu_lvm_map_new(prog.MAP_PERCPU_ARRAY, 4, 8, 1, 0, ffi.NULL, 0, 0), lib.egpu_lvm_map_free)
    maps = ffi.new("struct egpu_lvm_map *[]", [percpu])
    p = _printk_loop(ffi, lib, 60000, maps)
    _take_all(ffi, lib)
    ready, done = threading.Event(), threading.Event()

    def take() -> None:
        lib.egpu_lvm_trace_wait(10**10)
        router, rec = lib.egpu_lvm_router_new(), ffi.new("struct egpu_launch_record[1]")
        out = ffi.new("struct egpu_lvm_trace[]", 1024)
        ready.set()
        try:
            while True:
                lib.egpu_lvm_drain(router, rec, 1, 0, ffi.NULL)
                if not lib.egpu_lvm_trace_take(out, 1024) and done.is_set():
                    break
                time.sleep(0.05)
        finally:
            lib.egpu_lvm_trace_wait(0)
            lib.egpu_lvm_router_free(router)

    taker = threading.Thread(target=take)
    taker.start()
    ready.wait()
    waiting = threading.Thread(target=_timed_exec, args=(ffi, lib, p))
    waiting.start()
    time.sleep(0.3)   # its first 16 Ki lines queued, the rest waiting for room, cpu_lock held
    try:
        yield p, _printk_loop(ffi, lib, 1, maps)
    finally:
        waiting.join()
        done.set()
        taker.join()


def test_a_run_waiting_with_cpu_lock_gives_up_for_a_thread_holding_the_gil_that_needs_it(shim_api, built):
    """Runs of a program with a per-CPU map hold cpu_lock, waiting for room too. A thread that holds the GIL and
    needs cpu_lock (a host-API program on a PyTorch launch) then stops the take, which needs the GIL: the waiting
    run must give up at once (its lines dropped, counted), as for the taking thread's own wait for cpu_lock, not
    after the 10 s stall while every Python thread of the job stands still."""
    ffi, lib = shim_api
    with waiting_with_cpu_lock(ffi, lib) as (p, q):
        took = _exec_holding_the_gil(ffi, built / "libegpu_shim.so", q)
    assert took < 2, took
    assert _lost(ffi, lib, p, 1) > 0


FORK_WHILE_A_RUN_WAITS = """
import os, sys, time
sys.path.insert(0, "tests")
from conftest import shim_api_of
from test_launchvm import waiting_with_cpu_lock

ffi, lib = shim_api_of(sys.argv[1])
lib.egpu_uprobe_attach(b"/none", b"none", ffi.NULL, ffi.NULL, 0)   # the shim's fork handlers registered
with waiting_with_cpu_lock(ffi, lib):
    start = time.monotonic()
    if (pid := os.fork()) == 0:
        os._exit(0)
    took = time.monotonic() - start
    os.waitpid(pid, 0)
print(took)
"""


def test_a_fork_ends_the_wait_of_a_run_holding_cpu_lock(built):
    """A fork's handlers take the VM's locks, route_lock (which the drain thread's pass needs before it takes) and
    cpu_lock (which a per-CPU array's run holds while it waits for room) among them: a run waiting with cpu_lock
    must give up for the fork, or the fork waits out the 10 s stall."""
    r = subprocess.run([sys.executable, "-c", FORK_WHILE_A_RUN_WAITS, str(built / "libegpu_shim.so")], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert float(r.stdout) < 2, r.stdout
