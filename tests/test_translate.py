"""eBPF -> PTX without a GPU: every ISA case and every probe assembled by ptxas (sm_90 and sm_75) with
registers and stack per program reported, a golden PTX text, refusals, the analyses that make the
code fast, device map images and the host side of the GPU runner."""

from __future__ import annotations

import ctypes
import os
import re
import struct
import subprocess
from pathlib import Path

import pytest

from egpu_preload.bpf import ctx as C
from egpu_preload.bpf import program as prog
from egpu_preload.bpf.asm import assemble
from egpu_preload.bpf.elf import load_object
from egpu_preload.bpf.program import BpfObject, Program
from egpu_preload.bpf.sections import parse_section
from egpu_preload.bpf.verifier import verify
from egpu_preload.errors import TranslateError, VerifierError
from egpu_preload.maps import MapsState
from egpu_preload.translate import devmaps, probe_function, program_to_ptx
from egpu_preload.translate.execute import layout_memories
from egpu_preload.translate.gpu import pack_params
from egpu_preload.translate.module import batch_ptx, entries_ptx, header, probe_runner_ptx
import structured_programs
from isa_cases import CASES
from translate_support import (COUNTER, GPU_TEST_PROBES, PTXAS_REPORTS, bench_probes, memory_program,
                               probe_object, verified_programs)

ARCHS = ("sm_90", "sm_75")
GOLDEN = Path(__file__).parent / "golden"


def ptxas(ptx: str, arch: str, tmp_path: Path) -> dict[str, tuple[int, int]]:
    """Assemble; returns {entry: (registers, stack bytes)} from ``ptxas -v``; fails with ptxas' errors."""
    src = tmp_path / f"m_{arch}.ptx"
    src.write_text(ptx)
    done = subprocess.run(["ptxas", f"-arch={arch}", "-v", str(src), "-o", str(tmp_path / "m.cubin")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    report, entry = {}, None
    for line in done.stderr.splitlines():
        if m := re.search(r"Compiling entry function '(\w+)'", line):
            entry = m.group(1)
        elif entry and (m := re.search(r"Used (\d+) registers.*?(\d+) bytes cumulative stack", line)):
            report[entry] = (int(m.group(1)), int(m.group(2)))
        elif entry and (m := re.search(r"Used (\d+) registers", line)):
            report[entry] = (int(m.group(1)), 0)
    return report


def print_report(title: str, rows: list[tuple[str, int, int]]) -> None:
    """Registers and stack of each program: all rows with -s, a summary at the end of every run."""
    print(f"\n{title}\n{'program':60} regs  stack")
    for name, regs, stack in rows:
        print(f"{name[:60]:60} {regs:4}  {stack:5}")
    PTXAS_REPORTS.append((title, rows))


# ---- everything assembles ---------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
def test_every_isa_case_assembles(arch, tmp_path):
    codes = [assemble(c.asm) for c in CASES]
    report = ptxas(entries_ptx(codes), arch, tmp_path)
    assert len(report) == len(CASES)
    print_report(f"ISA cases, {arch}", [(c.name, *report[f"egpu_exec{k}"]) for k, c in enumerate(CASES)])
    ptxas(batch_ptx(codes), arch, tmp_path)  # the one-launch module execute_batch_on_gpu loads


@pytest.fixture(scope="module")
def probe_objects(probe_obj, probe_names):
    return [load_object(probe_obj(name)) for name in probe_names]


@pytest.mark.parametrize("ctx_params", [True, False], ids=["ctx-words", "ctx-address"])
@pytest.mark.parametrize("arch", ARCHS)
def test_every_probe_assembles(arch, ctx_params, probe_objects, tmp_path):
    rows = []
    for obj in probe_objects:
        for p in obj.programs:
            probe = probe_function(p, obj, ctx_params=ctx_params)
            report = ptxas(probe_runner_ptx(probe), arch, tmp_path)
            rows.append((f"{Path(obj.path).name}:{p.section}", *report["egpu_probe_run"]))
    assert rows
    print_report(f"probes (runner kernel + probe, context {'in words' if ctx_params else 'by address'}), {arch}",
                 rows)


def test_probe_function_contract(probe_objects):
    obj = next(o for o in probe_objects if o.maps)
    p = probe_function(obj.programs[0], obj, tag="t1")
    assert p.name == f"__egpu_t1_{obj.programs[0].name}"
    assert p.func.startswith(f".func (.param .b64 %ret) {p.name}(.param .b64 %ctx)") and p.ctx_words is None
    assert p.globals == (f".visible .const .align 8 .u64 __egpu_maps_t1[{len(obj.maps) + 1}];",)
    assert (p.version, p.sm) == ((6, 3), 70)


def _ctx_probe(asm_text: str) -> BpfObject:
    return BpfObject("t.o", [Program("p", "kprobe/*", parse_section("kprobe/*"), assemble(asm_text))], [])


@pytest.mark.parametrize("asm_text, words, moves", [
    # ctx->launch_id, ctx->flags (low half of word 4) and ctx->kind (high half), sign-extended size
    ("r2 = *(u64 *)(r1 + 8)\nr3 = *(u32 *)(r1 + 32)\nr0 = *(u32 *)(r1 + 36)\nr0 += r3\nr0 += r2\nexit",
     (1, 4), ["mov.b64 %r2, %c1;", "and.b64 %r3, %c4, 0xFFFFFFFF;", "shr.u64 %t0, %c4, 32;",
              "and.b64 %r0, %t0, 0xFFFFFFFF;"]),
    ("r0 = *(s16 *)(r1 + 18)\nexit", (2,), ["shr.u64 %t0, %c2, 16;", "cvt.s64.s16 %r0, %t0;"]),
    ("r0 = *(u8 *)(r1 + 47)\nexit", (5,), ["shr.u64 %t0, %c5, 56;", "and.b64 %r0, %t0, 255;"]),
    ("r0 = 0\nexit", (), []),
])
def test_probes_take_the_context_words_they_read(asm_text, words, moves, tmp_path):
    """ctx_params: one parameter per context word read; each ctx load becomes register moves (r1 holds
    a placeholder address, never dereferenced)."""
    obj = _ctx_probe(asm_text)
    p = probe_function(obj.programs[0], obj, tag="t", ctx_params=True)
    assert p.ctx_words == words
    head = ", ".join(f".param .b64 %cw{w}" for w in words)
    assert p.func.startswith(f".func (.param .b64 %ret) {p.name}({head})")
    body = [line.strip() for line in p.func.splitlines()]
    assert f"mov.b64 %r1, 0x{C.NO_ADDRESS:X};" in body and "ld.param.b64 %r1, [%ctx];" not in body
    assert [b for b in body if b in moves] == moves and not any(b.startswith("ld.u") for b in body)
    ptxas(probe_runner_ptx(p), "sm_90", tmp_path)


def test_a_context_load_at_offsets_that_differ_by_path_keeps_the_address_form():
    """The verifier allows ctx + a constant chosen per path; such a load has no single word, so the
    probe takes %ctx and reads memory."""
    obj = _ctx_probe("r2 = *(u32 *)(r1 + 24)\nif r2 == 0 goto +1\nr1 += 8\nr0 = *(u64 *)(r1 + 0)\nexit")
    p = probe_function(obj.programs[0], obj, tag="t", ctx_params=True)
    assert p.ctx_words is None and "(.param .b64 %ctx)" in p.func


# ---- golden text ----------------------------------------------------------------------------------

def test_golden_small_program():
    code = assemble("r0 = *(u32 *)(r1 + 0)\nw0 s/= w2\nif r0 > 7 goto out\nr0 = -r0\nout:\nexit")
    text = program_to_ptx(code)
    golden = GOLDEN / "translate_small.ptx"
    assert text == golden.read_text(), f"regenerate {golden} if the change is intended"


# ---- refusals -----------------------------------------------------------------------------------

MAP_ARRAY = prog.MapDef("counts", prog.MAP_ARRAY, 4, 8, 4)


# Programs the verifier refuses are translated only by execute_on_gpu, without its facts.
@pytest.mark.parametrize("asm, reason", [
    ("r1 = map[0] ll\nr0 = 0\nexit", "maps are not available here"),
    ("call kfunc 7\nexit", "kfunc calls are not supported"),
    ("r0 = 0\ngoto +1\nexit\nif r0 == 0 goto -2", "falls off the end"),
    ("r0 = 1\nr0 += 1", "falls off the end"),
    ("r0 = 0\ncall local f\nexit\nf:\ngoto -3", "leaves its function"),
    ("r1 = 0\nr0 = 0\ncall map_lookup_elem\nexit", "r1 is not a map known at translation time (an unverified"),
    ("ld_pseudo r1, 0x1, 0x3\nr0 = 0\nexit", "pseudo source 1"),
    ("r1 = 1\nr2 = func f ll\nr3 = 0\nr4 = 0\ncall loop\nexit\nf: r0 = 2\nexit",
     "bpf_loop's callback is known from the verifier: an unverified program has none"),
])
def test_refusals(asm, reason):
    with pytest.raises(TranslateError, match=re.escape(reason)) as e:
        program_to_ptx(assemble(asm))
    assert e.value.insn is not None or "kfunc" in reason


@pytest.mark.parametrize("asm, reason", [
    ("r1 = map[3] ll\nr0 = 0\nexit", "map[3]"),
    ("r1 = 1\ncall local f\nexit\nf:\ncall local f\nexit", "recursive call"),
    ("r1 = 0\nr0 = 0\ncall map_lookup_elem\nexit", "r1 is scalar, map_lookup_elem needs a map"),
])
def test_probes_are_verified_first(asm, reason):
    with pytest.raises(VerifierError, match=re.escape(reason)):
        obj, p = probe_object(asm, [MAP_ARRAY])
        probe_function(p, obj, tag="t")


def test_verified_program_of_other_maps_is_refused():
    verified = verify(assemble("r1 = map[1] ll\nr0 = 0\nexit"), [MAP_ARRAY, MAP_ARRAY])
    obj, p = probe_object("r1 = map[1] ll\nr0 = 0\nexit", [MAP_ARRAY])
    with pytest.raises(TranslateError, match="map index 1 out of range"):
        probe_function(p, obj, tag="t", verified=verified)


# ---- what the analyses buy ------------------------------------------------------------------------

def _probe_text(asm: str, maps: list[prog.MapDef]) -> str:
    obj, p = probe_object(asm, maps)
    return probe_function(p, obj, tag="t").func


@pytest.mark.parametrize("asm, present, absent", [
    # constant key 0 into an ARRAY: the value address is the map base + header, no key load, no bounds test
    (COUNTER, ["add.u64 %t1, %t0, 64;"], ["ld.local.u32", "setp.ge.u64"]),
    # a constant added by every lane: one red per group of lanes on the same address
    (COUNTER, ["match.any.sync.b64", "popc.b32", "red.global.add.u64"], ["atom.add"]),
    # r10-relative slots use local addressing at a static offset in a frame of the used 8 bytes
    ("r1 = 5\n*(u64 *)(r10 - 8) = r1\nr0 = *(u32 *)(r10 - 8)\nexit",
     ["st.local.u64 [__stack+0]", "ld.local.u32 %r0, [__stack+0]", "__stack[8]"], ["and.b64"]),
    # the stack through another register: local addressing too
    ("r1 = 5\n*(u64 *)(r10 - 8) = r1\nr2 = r10\nr2 += -8\nr0 = *(u32 *)(r2 + 4)\nexit",
     ["cvta.to.local.u64 %t0, %r2;", "ld.local.u32 %r0, [%t0+4]"], ["and.b64"]),
    # a map value: global addressing, aligned because the verifier checked it
    ("r1 = 0\n*(u32 *)(r10 - 4) = r1\nr2 = r10\nr2 += -4\nr1 = map[0] ll\ncall map_lookup_elem\n"
     "if r0 == 0 goto out\nr0 = *(u32 *)(r0 + 4)\nout:\nexit", ["ld.global.u32 %r0, ["], ["ld.u8", "ld.u32"]),
    # the context is 8-aligned and its accesses are checked: loaded directly
    ("r0 = *(u64 *)(r1 + 8)\nexit", ["ld.u64 %r0, [%r1+8];"], ["ld.u8"]),
    # a helper's key and value in this frame: static local loads, no run-time alignment test
    ("*(u64 *)(r10 - 8) = 5\nr2 = r10\nr2 += -8\nr3 = r10\nr3 += -8\nr4 = 0\nr1 = map[1] ll\n"
     "call map_update_elem\nr0 = 0\nexit", ["ld.local.u64 %t1, [__stack+0];"], ["%r2, 7;", "%r3, 7;", "ld.u8"]),
    # no function uses the stack: no local memory at all
    ("r1 = r10\nr0 = 0\nexit", ["mov.b64 %r10, 0;"], ["__stack", ".local"]),
])
def test_generated_code(asm, present, absent):
    text = _probe_text(asm, [MAP_ARRAY, prog.MapDef("h", prog.MAP_HASH, 8, 8, 16)])
    for s in present:
        assert s in text
    for s in absent:
        assert s not in text


@pytest.mark.parametrize("kind", [prog.MAP_HASH, prog.MAP_LRU_HASH])
def test_hash_update_claims_a_slot_in_one_place(kind):
    """One claim (CAS to BUSY), one credit on the entry count and, for LRU, one eviction loop, whether the
    free slot was EMPTY or a tombstone: ptxas compiles the probe again for every kernel that calls it,
    and a copy per state made it compile the LRU update's loops twice (k100 with tests/probes/memtrace:
    2.56 s against 1.89 s)."""
    asm = ("*(u64 *)(r10 - 8) = 5\nr2 = r10\nr2 += -8\nr3 = r10\nr3 += -8\nr4 = 0\nr1 = map[1] ll\n"
           "call map_update_elem\nr0 = 0\nexit")
    lines = [line.strip() for line in _probe_text(asm, [MAP_ARRAY, prog.MapDef("h", kind, 8, 8, 16)]).splitlines()]
    claims = [s for s in lines if s.startswith("atom.cas.b32") and s.endswith(f", {devmaps.BUSY};")]
    credits = [s for s in lines if s.startswith("atom.add.u32")]
    evictions = [s for s in lines if s.startswith("ld.relaxed.gpu.u64")]   # the LRU scan reads each time
    assert (len(claims), len(credits), len(evictions)) == (1, 1, int(kind == prog.MAP_LRU_HASH))
    # the eviction scan stays a loop: unrolled, ptxas spent a quarter of an LRU probe's time on it
    rolled = [lines[i - 1] for i, s in enumerate(lines) if s == '.pragma "nounroll";']
    assert len(rolled) == len(evictions) and all(re.fullmatch(r"\$La\d+:", lab) for lab in rolled)


@pytest.mark.parametrize("kind", [prog.MAP_PERCPU_HASH, prog.MAP_LRU_PERCPU_HASH])
def test_per_cpu_hash_update_writes_its_sms_row_and_zeroes_a_revived_key(kind):
    """A per-CPU hash's update claims and credits as a HASH's, in one place; the value goes to this SM's row
    (%smid), and a revived tombstone's value is zeroed in every row, by one rolled loop, before the slot is
    published (a new key's other SMs read zeros)."""
    asm = ("*(u64 *)(r10 - 8) = 5\nr2 = r10\nr2 += -8\nr3 = r10\nr3 += -16\n*(u64 *)(r10 - 16) = 1\n"
           "*(u32 *)(r10 - 24) = 1\nr4 = 0\nr1 = map[1] ll\ncall map_update_elem\nr0 = 0\nexit")
    text = _probe_text(asm, [MAP_ARRAY, prog.MapDef("h", kind, 8, 12, 16)])
    lines = [line.strip() for line in text.splitlines()]
    claims = [s for s in lines if s.startswith("atom.cas.b32") and s.endswith(f", {devmaps.BUSY};")]
    credits = [s for s in lines if s.startswith("atom.add.u32")]
    zeroes = [i for i, s in enumerate(lines) if re.fullmatch(r"st\.u64 \[%\w+\+(0|8)\], 0;", s)]
    publish = [i for i, s in enumerate(lines)
               if s.startswith("st.release.gpu.u32") and s.endswith(f", {devmaps.FULL};")]
    assert (len(claims), len(credits), len(zeroes)) == (1, 1, 2)   # 12 bytes: two u64 stores, once
    assert "%smid" in text and len(publish) == 1 and max(zeroes) < publish[0]
    rolled = sum(s == '.pragma "nounroll";' for s in lines)
    assert rolled == 1 + (kind == prog.MAP_LRU_PERCPU_HASH)   # the zeroing loop (and the LRU's scan)


@pytest.mark.parametrize("asm, present, absent", [
    # an unverified program's base: aligned fast path and byte-wise slow path
    ("r0 = *(u64 *)(r1 + 1)\nexit", ["and.b64", "ld.u8"], []),
    # and its atomics test the state space and the alignment at run time
    ("r2 = 1\nlock *(u64 *)(r1 + 0) += r2\nr0 = 0\nexit", ["isspacep.local", "and.b64", "red.add.u64"],
     ["match.any"]),
])
def test_generated_code_unverified(asm, present, absent):
    text = program_to_ptx(assemble(asm))
    for s in present:
        assert s in text
    for s in absent:
        assert s not in text


CALLED_STACK = "call local f\nexit\nf:\nr1 = 1\n*(u64 *)(r10 - 8) = r1\nr0 = 0\nexit"


@pytest.mark.parametrize("asm, decl", [
    ("r0 = 1\nexit", None),
    (CALLED_STACK, ".local .align 8 .b8 __stack[8];"),                       # the verifier's depths: 0 + 8
    ("r0 = r2\n" + CALLED_STACK, ".local .align 8 .b8 __stack[1024];"),       # refused (r2): 512 per frame
])
def test_stack_sized_by_the_verifier(asm, decl):
    text = program_to_ptx(assemble(asm))
    if decl is None:
        assert "__stack" not in text and ".local" not in text
    else:
        assert decl in text


# ---- device map images --------------------------------------------------------------------------

HASH = prog.MapDef("h", prog.MAP_HASH, 8, 16, 10)
LRU = prog.MapDef("l", prog.MAP_LRU_HASH, 4, 8, 3)
PERCPU = prog.MapDef("p", prog.MAP_PERCPU_ARRAY, 4, 4, 3)
PERCPU_HASH = prog.MapDef("ph", prog.MAP_PERCPU_HASH, 8, 12, 10)
LRU_PERCPU_HASH = prog.MapDef("lph", prog.MAP_LRU_PERCPU_HASH, 4, 8, 3)
RING = prog.MapDef("r", prog.MAP_RINGBUF, 0, 0, 4096)
DATA = prog.MapDef(".data", prog.MAP_ARRAY, 4, 12, 1, initial=b"hello world!")


@pytest.mark.parametrize("m, size", [
    (MAP_ARRAY, 64 + 4 * 8),
    (HASH, 64 + 32 * (8 + 8 + 16)),
    (LRU, 64 + 16 * (16 + 8 + 8)),
    (PERCPU, 64 + 5 * 128),   # each SM's 3 x 8 bytes on a line of its own
    (RING, 64 + 2 * 4096 + 5 * 128),   # data, slack, then each SM's full mark and drops on a line
    (PERCPU_HASH, 640 + 5 * 512),   # 32 slots of state and key on 5 lines, then each SM's 32 x 16-byte values
    (LRU_PERCPU_HASH, 512 + 5 * 128),   # 16 slots of 24 bytes (the last use too) end on the 4th line
])
def test_region_sizes(m, size):
    assert devmaps.layout(m).region_size(ncpu=5) == size


def test_images_round_trip():
    maps = [MAP_ARRAY, HASH, LRU, PERCPU, DATA, PERCPU_HASH]
    src = MapsState(maps)
    src[0].update(struct.pack("<I", 2), struct.pack("<Q", 7))
    for k in range(10):
        assert src[1].update(struct.pack("<Q", k * 977), bytes([k]) * 16) == 0
    src[2].update(b"abcd", b"12345678")
    src[3].update(struct.pack("<I", 1), b"wxyz", cpu=4)
    for k in range(10):
        assert src[5].update(struct.pack("<Q", k), bytes([k + 1]) * 12, cpu=k % 5) == 0
        assert src[5].update(struct.pack("<Q", k), bytes([k + 7]) * 12, cpu=4 - k % 5) == 0
    dst = MapsState(maps)
    for i, m in enumerate(maps):
        devmaps.apply_region(dst, i, devmaps.region_image(m, src[i], ncpu=5))
    for i in (0, 1, 2, 4):
        assert sorted(dst[i].items()) == sorted(src[i].items())
    assert list(dst[3].items(4)) == list(src[3].items(4))
    assert dst[4].values[0] == b"hello world!"
    assert dict(dst[5].entries) == dict(src[5].entries)   # each key's values by SM


def test_per_cpu_hash_values_are_in_each_sms_row():
    """A per-CPU hash's key has one slot, and its value for SM c sits in row c: rows_off + c * cpu_stride."""
    state = MapsState([PERCPU_HASH])
    key = struct.pack("<Q", 3)
    state[0].update(key, b"a" * 12, cpu=0)
    state[0].update(key, b"b" * 12, cpu=2)
    img = devmaps.region_image(PERCPU_HASH, state[0], 3)
    lay = devmaps.layout(PERCPU_HASH)
    home = devmaps.slot_hash(key) & (lay.entries - 1)
    assert struct.unpack_from("<II", img, 0) == (1, 3)   # one key, three rows
    assert struct.unpack_from("<I", img, 64 + home * lay.stride)[0] == devmaps.FULL
    rows = [img[lay.rows_off + c * lay.cpu_stride + home * 16:][:12] for c in range(3)]
    assert rows == [b"a" * 12, bytes(12), b"b" * 12]


@pytest.mark.parametrize("m", [PERCPU, PERCPU_HASH])
def test_a_value_for_an_sm_the_device_has_no_row_for_is_refused(m):
    """A per-CPU map's value for SM 4 where the device has 3 rows (a document of a GPU with more SMs, egpu
    run-on-gpu --maps): its region would leave it out, so region_image names the map and the SM; a zero there
    loses nothing and passes, as does every value on a device with the rows."""
    state = MapsState([m])
    key = bytes(m.key_size)
    state[0].update(key, b"\1" * m.value_size, cpu=1)
    state[0].update(key, bytes(m.value_size), cpu=5)
    devmaps.region_image(m, state[0], 3)
    state[0].update(key, b"\2" * m.value_size, cpu=4)
    with pytest.raises(devmaps.NoRow, match=rf"^map {m.name}: a value for SM 4, but its region on this device has "
                                            r"rows for 3 SMs \(0-2\)$"):
        devmaps.region_image(m, state[0], 3)
    devmaps.region_image(m, state[0], 5)


class _CountingImage(bytes):
    """A region image that counts the bytes its slices copy."""

    copied = 0

    def __getitem__(self, index):
        part = super().__getitem__(index)
        if isinstance(index, slice):
            _CountingImage.copied += len(part)
        return part


def test_reading_a_per_cpu_hash_back_copies_its_values_not_its_image():
    """Each (key, SM) value is read where it lies: a slice to the image's end per value made reading back a
    10,240-key map of 132 SMs copy terabytes."""
    state = MapsState([PERCPU_HASH])
    for k in range(8):
        state[0].update(struct.pack("<Q", k), bytes([k + 1]) * 12, cpu=k % 3)
    img = _CountingImage(devmaps.region_image(PERCPU_HASH, state[0], 64))
    _CountingImage.copied = 0
    out = MapsState([PERCPU_HASH])
    devmaps.apply_region(out, 0, img)
    assert dict(out[0].entries) == dict(state[0].entries)
    assert _CountingImage.copied <= 8 * 64 * (PERCPU_HASH.key_size + PERCPU_HASH.value_size)


def test_hash_image_follows_slot_hash():
    state = MapsState([HASH])
    key = struct.pack("<Q", 12345)
    state[0].update(key, bytes(16))
    img = devmaps.region_image(HASH, state[0], 1)
    lay = devmaps.layout(HASH)
    home = devmaps.slot_hash(key) & (lay.entries - 1)
    assert struct.unpack_from("<I", img, 64 + home * lay.stride)[0] == devmaps.FULL
    assert struct.unpack_from("<I", img, 0)[0] == 1


def _record(length: int, flags: int, data: bytes) -> bytes:
    return struct.pack("<II", length, flags) + data.ljust(devmaps.round8(length), b"\0")


def test_ring_reader_stops_at_unfinished_record():
    lay = devmaps.layout(RING)
    body = (_record(3, devmaps.REC_READY | 7 << 8, b"abc") + _record(8, devmaps.REC_DISCARD, b"x" * 8)
            + _record(5, devmaps.REC_READY, b"hello") + _record(4, devmaps.REC_BUSY, b"zzzz"))
    img = struct.pack("<QQQQ", len(body), len(body), 0, 3).ljust(64, b"\0") + body
    img = img.ljust(lay.region_size(), b"\0")
    records, dropped, pos = devmaps.read_ring(img, lay)
    assert records == [(7, b"abc"), (0, b"hello")]
    assert dropped == 3 and pos == len(body) - 16


def test_the_trace_rings_dropped_count_reaches_the_state_and_its_dump():
    """A device whose trace_printk ring filled says how many lines it lost (they were read and thrown away
    unsaid); the count is the ring's own, which only grows, so a later, smaller image never lowers it."""
    from egpu_preload.runtime import dump
    lay = devmaps.trace_layout()
    line = struct.pack("<QQQ", 1, 2, 3) + b"x=%d\0"
    body = _record(len(line), devmaps.REC_READY | 4 << 8, line)
    img = struct.pack("<QQQQ", len(body), len(body), 0, 9).ljust(64, b"\0") + body
    img = img.ljust(lay.region_size(), b"\0")
    state = devmaps.apply_images(MapsState([]), [img])
    assert [(t.cpu, t.args) for t in state.trace] == [(4, (1, 2, 3))] and state.trace_dropped == 9
    devmaps.apply_trace(state, bytes(devmaps.trace_image(1)))
    assert state.trace_dropped == 9
    back = dump.restore_state(MapsState([]), dump.state_contents(state))
    assert back.trace_dropped == 9 and len(back.trace) == 1
    older = {k: v for k, v in dump.state_contents(state).items() if k != "trace_dropped"}   # a dump made before it
    assert dump.restore_state(MapsState([]), older).trace_dropped == 0


def test_an_empty_ring_has_a_line_per_sm_and_its_drops_are_summed():
    lay = devmaps.layout(RING)
    img = bytearray(devmaps.ring_image(lay, 3))
    assert len(img) == lay.region_size(3) and struct.unpack_from("<I", img, devmaps.RING_NCPU) == (3,)
    lines = [lay.lines_off + cpu * devmaps.LINE for cpu in range(3)]
    assert [struct.unpack_from("<QQ", img, o) for o in lines] == [(devmaps.M64, 0)] * 3   # nothing refused yet
    assert devmaps.read_ring(bytes(img), lay) == ([], 0, 0)
    struct.pack_into("<Q", img, 24, 1)   # the header's count and the SMs' counts add up
    for o, n in zip(lines, (5, 7, 0)):
        struct.pack_into("<QQ", img, o, 48, n)
    assert devmaps.read_ring(bytes(img), lay)[1] == 13


def test_the_runs_loop_budgets_cut_are_summed_from_the_trace_rings_lines():
    """Each SM counts the runs it cut at LOOPS_CUT of its line; the sum only grows, as the drops do."""
    lay, ncpu = devmaps.trace_layout(), 3
    img = bytearray(devmaps.trace_image(ncpu))
    for cpu, n in enumerate((2, 0, 5)):
        struct.pack_into("<Q", img, lay.lines_off + cpu * devmaps.LINE + devmaps.LOOPS_CUT, n)
    state = MapsState([])
    devmaps.apply_trace(state, bytes(img))
    assert state.loops_cut == 7 and state.trace_dropped == 0
    devmaps.apply_trace(state, bytes(devmaps.trace_image(ncpu)))
    assert state.loops_cut == 7


@pytest.mark.parametrize("asm, jump", [("r0 = 0\nloop:\nr1 = 0\ngoto loop\nexit", "goto"),
                                       ("r0 = 0\nloop:\nr0 += 1\nif r0 != 0 goto loop\nexit", "if")])
def test_a_budgeted_loop_counts_down_and_ends_at_the_cut(asm, jump, tmp_path):
    """A directly-run program's budgeted backward jump: LOOP_BUDGET rounds in %loops, then $Lcut, which counts
    the run on the SM's line of the trace ring and returns 0; ptxas takes it. The same loop bounded by the
    exploration charges nothing (and without budgeted loops the code is the same as before them: the golden
    and ptxas tests)."""
    from egpu_preload.bpf.sections import DIRECTLY_RUN
    from egpu_preload.bpf.verifier import LOOP_BUDGET
    p = Program("p", DIRECTLY_RUN, parse_section(DIRECTLY_RUN), assemble(asm))
    obj = BpfObject("loop.bpf.o", [p], [])
    text = probe_function(p, obj).func
    assert f"mov.b32 %loops, {LOOP_BUDGET};" in text and text.count("bra $Lcut;") == 1
    guard, taken = r"setp\.eq\.u32 (%p\d+), %loops, 0;", ""
    if jump == "if":
        guard, taken = r"setp\.eq\.and\.u32 (%p\d+), %loops, 0, (%p\d+);", r"@\2 "
    charge = rf"\s+@\1 bra \$Lcut;\s+{taken}sub\.u32 %loops, %loops, 1;\s+{taken}bra \$L0_1;"
    assert re.search(guard + charge, text), text
    assert re.search(rf"\$Lcut:.*red\.add\.u64 \[%t\d+\+{devmaps.LOOPS_CUT}\], 1;\s+mov\.b64 %r0, 0;\s+\$Lexit:",
                     text, re.S), text
    ptxas(probe_runner_ptx(probe_function(p, obj, ctx_params=True)), "sm_90", tmp_path)
    bounded = Program("p", DIRECTLY_RUN, parse_section(DIRECTLY_RUN),
                      assemble("r0 = 0\nloop:\nr0 += 1\nif r0 < 5 goto loop\nexit"))
    assert "%loops" not in probe_function(bounded, BpfObject("b.bpf.o", [bounded], [])).func


class FakeMemory:
    def __init__(self):
        self.blocks: dict[int, bytearray] = {}
        self.next = 0x1000

    def alloc(self, n):
        self.next += (n + 0xFFF) & ~0xFFF
        self.blocks[self.next] = bytearray(n)
        return self.next

    def free(self, p):
        del self.blocks[p]

    def htod(self, p, data):
        self.blocks[p][:len(data)] = data

    def dtoh(self, p, n):
        return bytes(self.blocks[p][:n])


def test_device_maps_table_and_read_back():
    mem = FakeMemory()
    state = MapsState([MAP_ARRAY, RING])
    dm = devmaps.DeviceMaps(mem, state, ncpu=4)
    table = struct.unpack("<3Q", dm.table())
    assert set(table) == set(mem.blocks)
    arr = mem.blocks[table[0]]
    arr[64 + 8:64 + 16] = struct.pack("<Q", 99)
    ring = mem.blocks[table[1]]
    ring[:32] = struct.pack("<QQQQ", 16, 16, 0, 2)
    ring[64:80] = _record(4, devmaps.REC_READY, b"evnt")
    trace = mem.blocks[table[2]]
    trace[:32] = struct.pack("<QQQQ", 48, 48, 0, 0)
    trace[64:112] = _record(24 + 8, devmaps.REC_READY, struct.pack("<QQQ", 5, 6, 7) + b"n=%d\n\0\0\0")
    dm.read_back()
    assert state[0].lookup(struct.pack("<I", 1)) == struct.pack("<Q", 99)
    assert state[1].records == [b"evnt"] and state[1].drops == 2
    assert state.trace[0].text() == "n=5\n"
    dm.free()
    assert not mem.blocks


def test_the_processs_ids_on_the_gpu_are_read_from_the_trace_rings_header(tmp_path, monkeypatch):
    """bpf_get_current_uid_gid and bpf_get_current_pid_tgid on the GPU: loaded from the trace ring's header,
    where laying the maps out wrote the process's real gid << 32 | uid and its tgid (once: pid_tgid is tgid <<
    32 | tgid); ptxas takes both."""
    monkeypatch.setattr(os, "getuid", lambda: 1234)
    monkeypatch.setattr(os, "getgid", lambda: 4321)
    mem = FakeMemory()
    dm = devmaps.DeviceMaps(mem, MapsState([MAP_ARRAY]), ncpu=4)
    trace = mem.blocks[struct.unpack("<2Q", dm.table())[1]]
    assert struct.unpack_from("<IQ", trace, devmaps.TGID) == (os.getpid(), 4321 << 32 | 1234)
    obj, p = probe_object("call get_current_uid_gid\nr6 = r0\ncall get_current_pid_tgid\nr0 += r6\nexit",
                          [MAP_ARRAY])
    text = probe_function(p, obj).func
    assert re.search(rf"ld\.global\.nc\.u64 %r0, \[%t\d+\+{devmaps.UID_GID}\];", text), text
    ptxas(probe_runner_ptx(probe_function(p, obj, ctx_params=True)), "sm_90", tmp_path)
    dm.free()


def test_prandom_on_the_gpu_reads_no_memory_and_assembles(tmp_path):
    """bpf_get_prandom_u32 on the GPU hashes the clock and the thread's place (bpf/helpers.py): no state in
    memory that threads would share or wait on; ptxas takes it. What its draws look like: test_translate_gpu."""
    obj, p = probe_object("call get_prandom_u32\nexit", [])
    text = probe_function(p, obj).func
    assert "%clock64" in text and not re.search(r"\b(ld|st|atom|red)\.(?!param)", text), text
    ptxas(probe_runner_ptx(probe_function(p, obj, ctx_params=True)), "sm_90", tmp_path)


def test_comm_on_the_gpu_is_copied_from_the_name_the_host_wrote_into_the_trace_rings_header(tmp_path):
    """bpf_get_current_comm on the GPU, where no host thread runs the probe: a copy (at most size - 1 bytes,
    then zeros) from the trace ring's header, where laying the maps out wrote the main thread's name; ptxas
    takes it for a constant size and a bounded one."""
    mem = FakeMemory()
    dm = devmaps.DeviceMaps(mem, MapsState([MAP_ARRAY]), ncpu=4)
    trace = mem.blocks[struct.unpack("<2Q", dm.table())[1]]
    name = Path("/proc/self/comm").read_bytes().rstrip(b"\n")
    assert bytes(trace[devmaps.COMM:devmaps.COMM + 16]) == name[:15].ljust(16, b"\0")
    for size in ("r2 = 16", "r2 = *(u32 *)(r10 - 4)\nr2 &= 15"):
        asm = f"*(u32 *)(r10 - 4) = 9\nr1 = r10\nr1 += -24\n{size}\ncall get_current_comm\nr0 = *(u8 *)(r10 - 24)\nexit"
        obj, p = probe_object(asm, [MAP_ARRAY])
        text = probe_function(p, obj).func
        assert f", {devmaps.COMM};" in text and "ld.global.nc.u8" in text
        ptxas(probe_runner_ptx(probe_function(p, obj, ctx_params=True)), "sm_90", tmp_path)
    dm.free()


# ---- host side of the GPU runner ----------------------------------------------------------------

def test_pack_params_points_at_each_value():
    keep, addr = pack_params([("u64", 0x1122334455667788), ("u32", 7)])
    ptrs = (ctypes.c_void_p * 2).from_address(addr)
    assert ctypes.c_uint64.from_address(ptrs[0]).value == 0x1122334455667788
    assert ctypes.c_uint32.from_address(ptrs[1]).value == 7
    assert keep


def test_memory_layout():
    offsets, size = layout_memories([b"abc", None, b"", b"x" * 300])
    assert offsets == [0, 256, 256, 512] and size == 1024


# ---- the CLI ----------------------------------------------------------------------------------

def test_egpu_ptx_prints_the_module(probe_obj):
    from typer.testing import CliRunner

    from launcher import egpu
    result = CliRunner().invoke(egpu, ["ptx", str(probe_obj("count"))])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(".version 6.3\n.target sm_70\n")
    assert ".func (.param .b64 %ret) __egpu_" in result.output


def test_programs_whose_names_differ_only_outside_ptx_identifiers_get_distinct_functions(tmp_path):
    """C takes $ and UTF-8 in names, PTX functions neither: "$" and "_", "café" and "cafè" were one name
    each, which ptxas refused as a duplicate definition."""
    from egpu_preload.translate import probe_object_ptx
    code = assemble("r0 = 0\nexit")
    names = ["$", "_", "café", "cafè", "caf_"]
    obj = BpfObject("n.bpf.o", [Program(n, "kprobe/*", parse_section("kprobe/*"), code) for n in names])
    text = probe_object_ptx(obj)
    funcs = re.findall(r"^\.func \(\.param \.b64 %ret\) (\S+)\(", text, re.M)
    assert len(set(funcs)) == len(names), funcs
    ptxas(text, "sm_90", tmp_path)


# ---- what the GPU tests and the benchmark will load -----------------------------------------------

def test_gpu_test_and_bench_probes_assemble(tmp_path):
    rows = []
    probes = {**GPU_TEST_PROBES, **{f"bench {k}": v for k, v in bench_probes(1 << 20).items()}}
    for name, (asm, maps) in probes.items():
        obj, p = probe_object(asm, maps, f"{name}.bpf.o")
        report = ptxas(probe_runner_ptx(probe_function(p, obj, ctx_params=True)), "sm_90", tmp_path)
        rows.append((name, *report["egpu_probe_run"]))
    assert len(rows) == len(probes) == 14
    print_report("GPU-test and benchmark probes, sm_90", rows)


def test_random_programs_assemble(tmp_path):
    ptxas(batch_ptx(verified_programs(seed=7, count=100)), "sm_90", tmp_path)
    ptxas(batch_ptx(verified_programs(seed=7, count=100, make=memory_program)), "sm_90", tmp_path)


def test_structured_programs_assemble(tmp_path):
    """tests/structured_programs.py's loops, subprograms, maps and helpers, each translated as a probe in
    both context forms, all in one module with a runner kernel per translation: ptxas takes every one."""
    texts = structured_programs.programs(seed=5, count=60)
    parts = []
    for k, text in enumerate(texts):
        obj, p = probe_object(text, list(structured_programs.MAPS), f"s{k}.bpf.o")
        for words in (True, False):
            probe = probe_function(p, obj, tag=f"s{k}{'w' if words else 'a'}", ctx_params=words)
            runner = probe_runner_ptx(probe, kernel=f"egpu_run_s{k}{'w' if words else 'a'}")
            parts.append(runner.removeprefix(header(probe.version, probe.sm)))
    report = ptxas(header() + "\n".join(parts), "sm_90", tmp_path)
    assert len(report) == 2 * len(texts) == 120


# ---- the foundation's other programs ----------------------------------------------------------------
# (ptxas 13 has no sm_70: CUDA 13 dropped Volta; the .target sm_70 the PTX declares is for older drivers.)

@pytest.mark.parametrize("arch", ARCHS)
def test_every_program_the_verifier_accepts_assembles(arch, tmp_path):
    """The verifier's accepted cases (tests/verifier_cases.py) translate, in both context forms, and
    ptxas takes them; those only host programs may run (a queue's pop) are refused by name, not a KeyError."""
    from verifier_cases import ACCEPT, MAPS
    rows = []
    for case in ACCEPT:
        obj, p = probe_object(case.asm, list(MAPS), f"{case.name}.bpf.o")
        if not case.gpu:
            with pytest.raises(TranslateError, match=r"map_pop_elem has no GPU form: host programs only"):
                probe_function(p, obj, ctx_params=True)
            continue
        for ctx_params in (True, False):
            report = ptxas(probe_runner_ptx(probe_function(p, obj, ctx_params=ctx_params)), arch, tmp_path)
            rows.append((f"{case.name}{'' if ctx_params else ' (ctx address)'}", *report["egpu_probe_run"]))
    assert len(rows) == 2 * sum(c.gpu for c in ACCEPT) > 0
    print_report(f"verifier's accepted programs, {arch}", rows)


@pytest.mark.parametrize("mcpu", ["v3", "v4"])
def test_tricky_c_probes_and_v4_builds_assemble(mcpu, probe_obj, probe_names, tmp_path):
    """clang's harder output (verifier_cases.C_PROBES) and every probe built for -mcpu=v4 (sdiv, movsx,
    bswap, ja32) translate and assemble for sm_90."""
    from egpu_preload.bpf.compile import compile_probe
    from verifier_cases import C_PROBES
    objs = [load_object(probe_obj(name, mcpu)) for name in probe_names]
    for name, text in C_PROBES.items():
        src = tmp_path / f"{name}.bpf.c"
        src.write_text(text)
        objs.append(load_object(compile_probe(src, tmp_path / f"{name}.{mcpu}.bpf.o", mcpu=mcpu)))
    rows = []
    for obj in objs:
        for p in obj.programs:
            report = ptxas(probe_runner_ptx(probe_function(p, obj, ctx_params=True)), "sm_90", tmp_path)
            rows.append((f"{Path(obj.path).name}:{p.section}", *report["egpu_probe_run"]))
    assert len(rows) >= len(objs)
    print_report(f"probes and tricky C probes, -mcpu={mcpu}, sm_90", rows)


@pytest.mark.parametrize("name", ["insert_delete", "lru", "ring_mixed"])
def test_gpu_test_programs_do_on_the_vm_what_their_tests_assert(name):
    """The million-thread programs, run one thread after another on the VM (the GPU runs them at once):
    inserts and deletes of own keys all succeed and leave nothing; the LRU stays within its entries;
    mixed-size records hold their thread's index, 8 bytes for even threads and 16 for odd ones."""
    from egpu_preload.vm import ThreadSim, Vm
    obj, p = probe_object(*GPU_TEST_PROBES[name], path=f"{name}.bpf.o")
    state = MapsState(obj.maps)
    vm = Vm(p.code, obj.maps, state)
    threads = 6000
    r0s = [vm.run(bytes(C.SIZE), ThreadSim(thread_idx=(i % 256, 0, 0), block_idx=(i // 256, 0, 0),
                                           block_dim=(256, 1, 1))) for i in range(threads)]
    if name == "ring_mixed":
        recs = state[0].records
        assert len(recs) == threads and [struct.unpack_from("<Q", r)[0] for r in recs] == list(range(threads))
        assert [len(r) for r in recs] == [8 + 8 * (i & 1) for i in range(threads)]
        return
    entries = list(state[0].items())
    if name == "insert_delete":
        assert r0s == [1] * threads and entries == []
    else:
        assert 0 < len(entries) <= 1024 and all(struct.unpack("<Q", v)[0] <= 2 for _, v in entries)


def test_a_probe_returns_before_reading_maps_through_an_unfilled_table(probe_objects):
    """A module used in a context where the runtime did not fill its map table (another device's, or a second
    context's: instrumenter.py's Limits) has a table of zeros; a probe that went on would load map headers at
    address 0 and fault the job's kernel. So the probe's first use of the table checks its last entry (the
    trace ring's, never 0 once filled) and leaves with r0 = 0 when it is 0."""
    checked = 0
    for obj in probe_objects:
        for p in obj.programs:
            probe = probe_function(p, obj, tag="t", ctx_params=True)
            body = probe.func.splitlines()
            loads = [i for i, line in enumerate(body) if "[__egpu_maps_t+" in line]
            if not loads:
                continue
            first = loads[0]
            reg = body[first].split()[1].rstrip(",")
            assert body[first].strip() == f"ld.const.u64 {reg}, [__egpu_maps_t+{8 * len(obj.maps)}];", p.name
            pred = body[first + 1].split()[1].rstrip(",")
            assert body[first + 1].strip() == f"setp.eq.u64 {pred}, {reg}, 0;", p.name
            assert body[first + 2].strip() == f"@{pred} bra $Lexit;", p.name
            assert "\tmov.b64 %r0, 0;" in body[:first], p.name
            checked += 1
    assert checked
