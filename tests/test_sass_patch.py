"""The SASS back end's patch module without a GPU: every tests/probes probe assembled by
``ptxas --compile-as-tools-patch``, the patch ABI of the entry points, the table-parameter form of
probes, the per-program selection (mask bit, load/store filter, scope) and the image cache."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from egpu_preload.bpf import ctx as C
from egpu_preload.bpf import program as prog
from egpu_preload.bpf.asm import assemble
from egpu_preload.bpf.elf import load_object
from egpu_preload.errors import TranslateError
from egpu_preload.translate import probe_function
from egpu_preload.translate.sass_patch import ENTER, EXIT, MAX_PROGRAMS, MEM, RECORD, build_image, patch_module
from translate_support import COUNTER, EMPTY

needs_ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas not installed")
COUNTS = [prog.MapDef("counts", 2, 4, 8, 1)]  # ARRAY, key u32, value u64, 1 entry


# Every field a kernel site can read, each at a fixed offset (so the probe takes context words), and a
# load whose offset differs by path (so it takes a %ctx address).
FIXED_READS = "\n".join(f"r2 = *(u{8 * f.size} *)(r1 + {f.offset + f.size * e})" for f in C.FIELDS
                        if f.name != "pad" for e in range(f.count)) + "\nr0 = 0\nexit"
PATH_READS = "r2 = *(u32 *)(r1 + 24)\nif r2 == 0 goto +1\nr1 += 84\nr0 = *(u32 *)(r1 + 24)\nexit"


def obj_of(sections: list[tuple[str, str, str, str]], maps=COUNTS, path="p.bpf.o", code=COUNTER) -> prog.BpfObject:
    """An object with one program per (section, kind, glob, scope) running ``code`` (default: counting
    into map 0)."""
    progs = [prog.Program(f"p{k}", sec, prog.Attach(kind, glob, scope), assemble(code))
             for k, (sec, kind, glob, scope) in enumerate(sections)]
    return prog.BpfObject(path, progs, maps)


@needs_ptxas
def test_every_probe_assembles_as_a_tools_patch(probe_obj, probe_names, tmp_path):
    built = 0
    for name in probe_names:
        pm = patch_module([load_object(probe_obj(name))])
        if not pm.programs:   # launch-only probes have nothing to patch
            assert pm.entries == ()
            continue
        image = build_image(pm.ptx, 90, tmp_path)
        assert image.read_bytes()[:4] == b"\x7fELF", name
        built += 1
    assert built >= 8


@needs_ptxas
def test_all_probes_in_one_module(probe_obj, probe_names, tmp_path):
    objs = [load_object(probe_obj(n)) for n in probe_names]
    pm = patch_module(objs)
    digest = f"{pm.image_id:012x}"   # the entry points carry the module text's digest
    assert set(pm.entries) == {f"{ENTER}_{digest}", f"{EXIT}_{digest}", f"{MEM}_{digest}"}
    assert pm.entry_names() == [None, f"{ENTER}_{digest}", f"{EXIT}_{digest}", f"{MEM}_{digest}"]
    assert pm.instruction_classes() == (1 << 1) | (1 << 2) | (1 << 3)
    # tables back to back: object j's starts after the maps and trace ring of those before it
    sizes = [8 * (len(o.maps) + 1) for o in objs]
    assert list(pm.table_offsets) == [sum(sizes[:j]) for j in range(len(objs))]
    build_image(pm.ptx, 90, tmp_path)


def test_entry_points_have_the_patch_abi():
    pm = patch_module([obj_of([("kprobe/*", "entry", "*", "thread"), ("kretprobe/*", "exit", "*", "thread"),
                               ("egpu/mem/*", "mem", "*", "thread")])])
    d = f"{pm.image_id:012x}"
    assert f".visible .func (.param .b32 %res) egpu_sass_block_enter_{d}(.param .b64 %ud, .param .b64 %pc)" in pm.ptx
    assert f".visible .func (.param .b32 %res) egpu_sass_block_exit_{d}(.param .b64 %ud, .param .b64 %pc)" in pm.ptx
    assert (f".visible .func (.param .b32 %res) egpu_sass_global_access_{d}(.param .b64 %ud, .param .b64 %pc, "
            ".param .b64 %ptr, .param .b32 %size, .param .b32 %flags, .param .b64 %data)") in pm.ptx
    assert pm.ptx.count("egpu_sass_") == 3   # each name once: the sanitizer finds entry points by name


def test_images_of_different_probe_sets_have_different_entry_points():
    a = patch_module([obj_of([("kprobe/*", "entry", "*", "thread")])])
    b = patch_module([obj_of([("kprobe/*", "entry", "*", "thread"), ("kretprobe/*", "exit", "*", "thread")])])
    assert a.entries[0] != b.entries[0] and a.image_id != b.image_id
    # globs are no part of the image (the shim asks which programs run per kernel): same code, same image
    assert patch_module([obj_of([("kprobe/vec*", "entry", "vec*", "thread")])]).entries == a.entries


def test_probe_takes_its_table_as_a_parameter():
    obj = obj_of([("kprobe/*", "entry", "*", "thread")])
    p = probe_function(obj.programs[0], obj, tag="t", table_param=True)
    assert p.func.startswith(f".func (.param .b64 %ret) {p.name}(.param .b64 %ctx, .param .b64 %maps)")
    assert p.globals == ()
    assert "ld.global.u64 %t0, [%maptab+0];" in p.func and "ld.const" not in p.func


def _program_block(ptx: str, bit: int) -> str:
    """The code that runs program ``bit``: from the label before it (or the table's load) to its own."""
    end = ptx.index(f"$Lskip{bit}:")
    return ptx[max(ptx.rfind(f"[%u+{RECORD.TABLES}];", 0, end), ptx.rfind(f"$Lskip{bit - 1}:", 0, end)):end]


@pytest.mark.parametrize("kind, scope, present, absent", [
    ("entry", "thread", [], ["activemask", "%tid"]),
    ("entry", "warp", ["activemask.b32 %w0;", "%lanemask_lt"], ["%tid"]),
    ("entry", "block", ["mov.u32 %w0, %tid.x;", "%tid.z"], ["activemask"]),
    ("load", "thread", [f"and.b32 %w0, %flags_e, {C.FLAG_LOAD};"], []),
    ("store", "thread", [f"and.b32 %w0, %flags_e, {C.FLAG_STORE};"], []),
    ("mem", "thread", [], ["and.b32 %w0, %flags_e"]),
])
def test_selection_per_program(kind, scope, present, absent):
    pm = patch_module([obj_of([("s", kind, "*", scope)])])
    block = _program_block(pm.ptx, 0)
    for s in present:
        assert s in pm.ptx
    for s in absent:
        assert s not in block
    # the counter reads no context: it takes only its table, and nothing is stored to local memory
    assert f"call (%rv), {pm.programs[0].func}, (%a0);" in block and "__ctx" not in pm.ptx


def test_record_and_ctx_fields_read_where_sass_c_writes_them():
    pm = patch_module([obj_of([("m", "mem", "*", "thread")], code=FIXED_READS)])
    for off in (RECORD.KERNEL_ID, RECORD.LAUNCH_ID, RECORD.START, RECORD.MASK, RECORD.TABLES, RECORD.STREAM):
        assert f"[%u+{off}]" in pm.ptx
    for reg in ("%nctaid.x", "%nctaid.y", "%nctaid.z", "%ntid.x", "%ntid.y", "%ntid.z", "[%ptr]", "[%size]", "[%pc]"):
        assert reg in pm.ptx
    # NULL userdata (a kernel no probe selects) returns before touching anything
    assert re.search(r"ld\.param\.b64 %u, \[%ud\];\s+setp\.eq\.u64 %p0, %u, 0;\s+@%p0 bra \$Ldone;", pm.ptx)


def test_context_words_go_as_parameters_and_only_those_read():
    """A program whose context loads the verifier pinned takes exactly those words, in registers; one
    whose load moves with the path gets a %ctx holding the words of the fields it reads, and no others."""
    words = patch_module([obj_of([("m", "mem", "*", "thread")], code="r0 = *(u32 *)(r1 + 112)\nexit")])
    assert "__ctx" not in words.ptx and words.programs[0].words == (14,)   # grid[1] and grid[2]
    assert "%nctaid.y" in words.ptx and "%nctaid.z" in words.ptx and "%ntid" not in words.ptx
    assert f"call (%rv), {words.programs[0].func}, (%a0, %a1);" in words.ptx
    by_path = patch_module([obj_of([("m", "mem", "*", "thread")], code=PATH_READS)])
    assert by_path.programs[0].words is None
    stores = sorted(int(m) for m in re.findall(r"st\.local\.u64 \[__ctx\+(\d+)\]", by_path.ptx))
    assert stores == [24, 104, 112]   # site's word, and grid's (ctx + 108 is grid[0]): no others


@needs_ptxas
@pytest.mark.parametrize("kind", ["entry", "exit", "mem"])
@pytest.mark.parametrize("code", [FIXED_READS, PATH_READS], ids=["words", "address"])
def test_context_forms_assemble_as_a_tools_patch(kind, code, tmp_path):
    pm = patch_module([obj_of([("s", kind, "*", "thread"), ("t", kind, "*", "warp")], code=code)])
    assert build_image(pm.ptx, 90, tmp_path).read_bytes()[:4] == b"\x7fELF"


def test_programs_and_objects_are_numbered_in_order():
    a = obj_of([("kprobe/a*", "entry", "a*", "thread"), ("egpu/load/a*", "load", "a*", "thread")], path="a.o")
    b = obj_of([("launch", "launch", "*", "launch"), ("kretprobe/b*", "exit", "b*", "warp")],
               maps=COUNTS * 3, path="b.o")
    pm = patch_module([a, b])
    assert [(p.bit, p.obj, p.attach.kind) for p in pm.programs] == [(0, 0, "entry"), (1, 0, "load"), (2, 1, "exit")]
    assert pm.table_offsets == (0, 16)
    assert "add.u64 %t1, %tab, 16;" in _program_block(pm.ptx, 2)


def test_too_many_programs_is_refused():
    with pytest.raises(TranslateError, match="more than 64"):
        patch_module([obj_of([("s", "entry", "*", "thread")] * (MAX_PROGRAMS + 1))])


def test_no_kernel_site_programs_give_an_empty_module():
    obj = prog.BpfObject("l.o", [prog.Program("l", "egpu/launch/*", prog.Attach("launch", "*", "launch"),
                                              assemble(EMPTY))], [])
    pm = patch_module([obj])
    assert (pm.programs, pm.entries, pm.instruction_classes()) == ((), (), 0)


@needs_ptxas
def test_image_is_cached_by_text_and_sm(tmp_path):
    pm = patch_module([obj_of([("kprobe/*", "entry", "*", "thread")])])
    first = build_image(pm.ptx, 90, tmp_path)
    stamp = first.stat().st_mtime_ns
    assert build_image(pm.ptx, 90, tmp_path) == first and first.stat().st_mtime_ns == stamp
    assert build_image(pm.ptx, 80, tmp_path) != first


def test_ptxas_errors_are_reported(tmp_path):
    fake = tmp_path / "ptxas"
    fake.write_text("#!/bin/sh\necho 'ptxas fatal   : Unknown option' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(TranslateError, match="tools-patch failed for sm_90: ptxas fatal"):
        build_image(".version 6.3\n", 90, tmp_path / "cache", ptxas=str(fake))
