"""Probes and programs shared by the translator's tests (test_translate.py assembles them, the GPU tests
run them) and its benchmark (bench/bench_translate.py imports this module through sys.path)."""

from __future__ import annotations

import random

from egpu_preload.bpf import isa
from egpu_preload.bpf import program as prog
from egpu_preload.bpf.asm import assemble
from egpu_preload.bpf.decode import Insn, encode
from egpu_preload.bpf.verifier import verify
from egpu_preload.errors import VerifierError


# (title, [(program, registers, stack bytes)]) of every ptxas report test_translate.py made this run;
# conftest.py prints a line per report at the end.
PTXAS_REPORTS: list[tuple[str, list[tuple[str, int, int]]]] = []


def report_lines() -> list[str]:
    out = []
    for title, rows in PTXAS_REPORTS:
        heavy = max(rows, key=lambda r: (r[1], r[2]))
        stacked = sum(1 for r in rows if r[2])
        out.append(f"{title}: {len(rows)} programs, registers {min(r[1] for r in rows)}-{heavy[1]} "
                   f"(most: {heavy[0]}), {stacked} with a stack frame (largest {max(r[2] for r in rows)} bytes)")
    return out


def assert_random_u32(values: list[int]) -> None:
    """What bpf_get_prandom_u32's draws should look like, its values left open: each a u32, nearly all
    distinct (two equal among 4,096 u32s come once in 500 tries), each bit set in about half (within 5 sigma)."""
    n = len(values)
    assert all(0 <= v < 1 << 32 for v in values), [v for v in values if not 0 <= v < 1 << 32][:4]
    assert len(set(values)) >= n - 2, f"{n - len(set(values))} repeated of {n}"
    for bit in range(32):
        ones = sum(v >> bit & 1 for v in values)
        assert abs(ones - n / 2) < 2.5 * n ** 0.5, f"bit {bit} set in {ones} of {n}"


def probe_object(asm: str, maps: list[prog.MapDef], path: str = "probe.bpf.o") -> tuple[prog.BpfObject,
                                                                                          prog.Program]:
    """A one-program object (attached to every kernel's entry, per thread) from assembler text."""
    p = prog.Program("p", "kprobe/*", prog.Attach("entry", "*", "thread"), assemble(asm))
    return prog.BpfObject(path, [p], maps), p


def _dim3(helper: str, slot: int) -> str:
    """Call a get_*_idx/dim helper storing x, y, z at r10 - slot, - slot - 8, - slot - 16."""
    return "".join(f"r{r} = r10\nr{r} += -{slot + 8 * k}\n" for k, r in enumerate((1, 2, 3))) + f"call {helper}\n"


def _ringbuf_output(slot: int, size: int) -> str:
    """r6 in each 8 bytes of [r10 - slot, r10 - slot + size), output as one record of map 0."""
    stores = "".join(f"*(u64 *)(r10 - {slot - k}) = r6\n" for k in range(0, size, 8))
    return stores + f"r1 = map[0] ll\nr2 = r10\nr2 += -{slot}\nr3 = {size}\nr4 = 0\ncall ringbuf_output\nr0 = 0\nexit\n"


# r6 = this thread's x index (THREAD_ID) or global x index (GLOBAL_ID)
THREAD_ID = _dim3("get_thread_idx", 8) + "r6 = *(u64 *)(r10 - 8)\n"
GLOBAL_ID = (_dim3("get_block_idx", 8) + _dim3("get_block_dim", 32) + _dim3("get_thread_idx", 56) +
             "r6 = *(u64 *)(r10 - 8)\nr7 = *(u64 *)(r10 - 32)\nr6 *= r7\nr7 = *(u64 *)(r10 - 56)\nr6 += r7\n")

EMPTY = "r0 = 0\nexit"


def _array_add(slot: int, then: str = "") -> str:
    """Add 1 to the first u64 of ARRAY map 0's value 0 (key 0 written at r10 - slot), then ``then``."""
    return (f"r1 = 0\n*(u32 *)(r10 - {slot}) = r1\nr2 = r10\nr2 += -{slot}\nr1 = map[0] ll\ncall map_lookup_elem\n"
            f"if r0 == 0 goto out\nr1 = 1\nlock *(u64 *)(r0 + 0) += r1\n{then}out:\nr0 = 0\nexit\n")


# Every thread adds 1 to ARRAY map 0's value 0 (constant key, constant addend: one atomic per warp).
COUNTER = _array_add(4)

# ---- the GPU tests' million threads -------------------------------------------------------------

# Thread i adds 1 to key i % 1024 of HASH map 0, inserting it when absent (lost races retry the lookup).
HASH_COUNT = GLOBAL_ID + """
r6 &= 1023
*(u64 *)(r10 - 80) = r6
r1 = 1
*(u64 *)(r10 - 88) = r1
r2 = r10
r2 += -80
r1 = map[0] ll
call map_lookup_elem
if r0 != 0 goto add
r1 = map[0] ll
r2 = r10
r2 += -80
r3 = r10
r3 += -88
r4 = 1
call map_update_elem
if r0 == 0 goto out
r1 = map[0] ll
r2 = r10
r2 += -80
call map_lookup_elem
if r0 == 0 goto out
add:
r1 = 1
lock *(u64 *)(r0 + 0) += r1
out:
r0 = 0
exit
"""

# Every thread adds 1 to each u64 of ARRAY map 0's value 0: a constant add (one atomic per warp), a
# fetch-add of 1 the verifier cannot prove constant (the global index >> 63, plus 1: one atomic per
# thread) and a constant fetch-add (one per warp, the old value shared out by rank).
ARRAY_COUNT = GLOBAL_ID + _array_add(80, "r6 >>= 63\nr6 += 1\nr6 = atomic_fetch_add((u64 *)(r0 + 8), r6)\n"
                                         "r1 = 1\nr1 = atomic_fetch_add((u64 *)(r0 + 16), r1)\n")

# Thread i inserts key i (value i) into HASH map 0 and deletes it again; r0 = 1 when both succeeded, so
# every thread's r0 and an empty map at the end show no insert or delete was lost.
INSERT_DELETE = GLOBAL_ID + """
*(u64 *)(r10 - 80) = r6
r1 = map[0] ll
r2 = r10
r2 += -80
r3 = r10
r3 += -80
r4 = 1
call map_update_elem
r7 = r0
r1 = map[0] ll
r2 = r10
r2 += -80
call map_delete_elem
r0 |= r7
if r0 != 0 goto fail
r0 = 1
exit
fail:
r0 = 0
exit
"""

# HASH_COUNT over keys i % 4096 into an LRU_HASH of 1024 entries: the map evicts all along, under a
# million threads, and no thread waits on another.
LRU_COUNT = HASH_COUNT.replace("r6 &= 1023", "r6 &= 4095")

RING_EVENTS = GLOBAL_ID + _ringbuf_output(80, 8)   # one 8-byte record per thread: its global index
# The same with 8 bytes from even threads and 16 from odd ones: a warp's lanes ask for different sizes,
# so they reserve one by one, not as a group (helpers_ptx._reserve).
RING_MIXED = GLOBAL_ID + """*(u64 *)(r10 - 80) = r6
*(u64 *)(r10 - 72) = r6
r3 = r6
r3 &= 1
r3 <<= 3
r3 += 8
r1 = map[0] ll
r2 = r10
r2 += -80
r4 = 0
call ringbuf_output
r0 = 0
exit
"""
RING_CAPACITY = 1 << 20
# 128-byte records into a 4 KiB ring: a warp's 32 records (4352 bytes with headers) never fit at once,
# so a group keeps the records there is room for and drops the rest.
RING_BIG = GLOBAL_ID + _ringbuf_output(128, 128)

GPU_TEST_PROBES: dict[str, tuple[str, list[prog.MapDef]]] = {
    "hash": (HASH_COUNT, [prog.MapDef("h", prog.MAP_HASH, 8, 8, 1024)]),
    "array": (ARRAY_COUNT, [prog.MapDef("a", prog.MAP_ARRAY, 4, 24, 1)]),
    "percpu": (ARRAY_COUNT, [prog.MapDef("p", prog.MAP_PERCPU_ARRAY, 4, 24, 1)]),   # one row per SM
    "insert_delete": (INSERT_DELETE, [prog.MapDef("h", prog.MAP_HASH, 8, 8, 1 << 20)]),
    "lru": (LRU_COUNT, [prog.MapDef("l", prog.MAP_LRU_HASH, 8, 8, 1024)]),
    "percpu_hash": (HASH_COUNT, [prog.MapDef("h", prog.MAP_PERCPU_HASH, 8, 8, 1024)]),   # a value per SM a key
    "lru_percpu": (LRU_COUNT, [prog.MapDef("l", prog.MAP_LRU_PERCPU_HASH, 8, 8, 1024)]),
    "ring": (RING_EVENTS, [prog.MapDef("r", prog.MAP_RINGBUF, 0, 0, RING_CAPACITY)]),
    "ring_mixed": (RING_MIXED, [prog.MapDef("r", prog.MAP_RINGBUF, 0, 0, RING_CAPACITY)]),
    "ring_big": (RING_BIG, [prog.MapDef("r", prog.MAP_RINGBUF, 0, 0, 4096)]),
}


def bench_probes(ring_bytes: int) -> dict[str, tuple[str, list[prog.MapDef]]]:
    """The benchmark's cases: an empty probe, a counter, a hash-map update (4096 keys, BPF_ANY) and a
    16-byte ring-buffer event into a ring of ring_bytes."""
    return {
        "empty": (EMPTY, []),
        "counter": (COUNTER, [prog.MapDef("count", prog.MAP_ARRAY, 4, 8, 1)]),
        "hash_update": (THREAD_ID + "r6 &= 4095\n*(u64 *)(r10 - 32) = r6\nr1 = map[0] ll\nr2 = r10\nr2 += -32\n"
                        "r3 = r10\nr3 += -32\nr4 = 0\ncall map_update_elem\nr0 = 0\nexit\n",
                        [prog.MapDef("h", prog.MAP_HASH, 8, 8, 4096)]),
        "ringbuf_event": (THREAD_ID + _ringbuf_output(40, 16), [prog.MapDef("r", prog.MAP_RINGBUF, 0, 0, ring_bytes)]),
    }


# ---- random verified programs -------------------------------------------------------------------

_ROWS = [o for o in isa.OPS if o.kind in ("alu", "neg", "mov", "movsx", "end", "jmp")]
_EDGE_IMMS = [0, 1, -1, 31, 32, 63, 64, -(1 << 31), (1 << 31) - 1]
_EDGE_U64 = [0, 1, (1 << 64) - 1, 1 << 63, (1 << 63) - 1, 0xFFFFFFFF, 1 << 32, 0x80000000]


def straight_line_program(rng: random.Random) -> bytes:
    """r0-r9 set from random 64-bit constants, then ALU ops of every row of the ISA table and forward
    branches (JMP and JMP32), then exit."""
    lddw = next(o for o in isa.OPS if o.kind == "lddw")
    exit_ = next(o for o in isa.OPS if o.kind == "exit")
    insns: list[Insn] = []
    pc = 0
    for r in range(10):
        v = rng.choice(_EDGE_U64) if rng.random() < 0.3 else rng.getrandbits(rng.choice((8, 32, 64)))
        insns.append(Insn(pc, lddw, r, 0, 0, v))
        pc += 2
    n = rng.randint(1, 24)
    for k in range(n):
        spec = rng.choice(_ROWS)
        dst, src = rng.randint(0, 9), rng.randint(0, 9)
        imm = rng.choice(_EDGE_IMMS) if rng.random() < 0.3 else rng.randint(-(1 << 31), (1 << 31) - 1)
        off = 0
        if spec.kind == "end":
            imm, src = rng.choice((16, 32, 64)), 0
        elif spec.kind in ("neg", "movsx"):
            imm = 0
            src = 0 if spec.kind == "neg" else src
        elif spec.kind == "jmp":
            off = rng.randint(0, n - 1 - k)  # forward, landing at most on the exit
        if spec.kind in ("alu", "mov", "jmp"):
            imm, src = (imm, 0) if spec.use_imm else (0, src)
        insns.append(Insn(pc, spec, dst, src, off, imm))
        pc += 1
    insns.append(Insn(pc, exit_, 0, 0, 0, 0))
    return b"".join(encode(i) for i in insns)


_RMW = [("lock *(u{b} *)(r10 - {o}) += {r}", 0), ("lock *(u{b} *)(r10 - {o}) |= {r}", 0),
        ("lock *(u{b} *)(r10 - {o}) &= {r}", 0), ("lock *(u{b} *)(r10 - {o}) ^= {r}", 0),
        ("{r} = atomic_fetch_add((u{b} *)(r10 - {o}), {r})", 1), ("{r} = atomic_fetch_or((u{b} *)(r10 - {o}), {r})", 1),
        ("{r} = atomic_fetch_and((u{b} *)(r10 - {o}), {r})", 1),
        ("{r} = atomic_fetch_xor((u{b} *)(r10 - {o}), {r})", 1)]


def memory_program(rng: random.Random) -> bytes:
    """straight_line_program's ALU code mixed with stack stores, loads (zero- and sign-extending) and
    atomics on 8 slots of 8 bytes, then a call to a subprogram that reads its arguments and its own
    stack and must leave r6-r9 as they were; r0 is a fold of every register."""
    from egpu_preload.bpf.disasm import disasm_insn
    from egpu_preload.bpf.decode import decode
    alu = [disasm_insn(i) for i in decode(straight_line_program(rng))[10:-1] if i.kind != "jmp"]
    lines = [f"r{r} = {rng.choice(_EDGE_U64) if rng.random() < 0.3 else rng.getrandbits(64)} ll" for r in range(10)]
    lines += [f"*(u64 *)(r10 - {8 * k}) = r{k % 10}" for k in range(1, 9)]   # every slot written first
    for _ in range(rng.randint(4, 24)):
        r, o = rng.randint(0, 9), 8 * rng.randint(1, 8)
        size = rng.choice((1, 2, 4, 8))
        at = o - rng.randrange(0, 8, size)   # an aligned piece of the slot
        what = rng.random()
        if what < 0.3 and alu:
            lines.append(rng.choice(alu))
        elif what < 0.5:
            lines.append(f"*(u{8 * size} *)(r10 - {at}) = "
                         + (f"r{r}" if rng.random() < 0.7 else str(rng.randint(-99, 99))))
        elif what < 0.7:
            lines.append(f"{'w' if size == 4 and rng.random() < 0.5 else 'r'}{r} = *(u{8 * size} *)(r10 - {at})")
        elif what < 0.8 and size < 8:
            lines.append(f"r{r} = *(s{8 * size} *)(r10 - {at})")
        else:
            bits = rng.choice((32, 64))
            text, _ = rng.choice(_RMW)
            lines.append(text.format(b=bits, o=o - (4 if bits == 32 and rng.random() < 0.5 else 0),
                                     r=f"{'w' if bits == 32 else 'r'}{rng.randint(1, 9)}"))
    lines += ["r1 = r6", "r2 = r7", "call local sub", "r0 ^= r6", "r0 += r7", "r0 ^= r8", "r0 += r9",
              "r1 = *(u64 *)(r10 - 8)", "r0 += r1", "exit",
              "sub:", "*(u64 *)(r10 - 8) = r1", "r6 = r2", "r6 *= 3", "lock *(u64 *)(r10 - 8) += r6",
              "r0 = *(u64 *)(r10 - 8)", "r7 = 0", "r8 = r1", "r9 = -1", "exit"]
    return assemble("\n".join(lines))


def verified_programs(seed: int, count: int, make=straight_line_program) -> list[bytes]:
    """``count`` random programs of ``make`` that the verifier accepts."""
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        code = make(rng)
        try:
            verify(code, [])
        except VerifierError:
            continue
        out.append(code)
    return out
