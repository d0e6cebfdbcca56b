"""Checkpoint directories: written atomically, read back with full validation, and every kind of corrupt
or partial directory refused with the directory and the reason; restore plans match allocations by
creation number, size and kind, and refuse before any byte is written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from egpu_preload.cow import snapshot
from egpu_preload.cow.allocations import Allocation, AllocationTable, AllocKind
from egpu_preload.cow.snapshot import SnapshotWriter, load, plan_restore
from egpu_preload.errors import SnapshotError

MODULE = "sha256:ab12"


def _contents(seq: int, size: int) -> bytes:
    return bytes((seq * 7 + i) & 0xff for i in range(size))


@pytest.fixture
def table() -> AllocationTable:
    t = AllocationTable()
    t.insert(0x10000, 4096, AllocKind.DEVICE)          # 0
    t.insert(0x20000, 100, AllocKind.MANAGED)          # 1, freed below
    t.insert(0x30000, 3 * 1024 + 5, AllocKind.ASYNC)   # 2
    t.insert(0x40000, 0, AllocKind.DEVICE)             # 3: an empty allocation is still one
    t.remove(0x20000)
    return t


def _write(directory: Path, table: AllocationTable) -> snapshot.Manifest:
    with SnapshotWriter(directory, pid=4242, argv=["./app", "--n", "8"], cut={0: 17, 0x7f00: 21}) as w:
        for a in reversed(table.by_creation()):   # copy order is free (copy-on-write goes first)
            data = _contents(a.seq, a.size)
            w.add_allocation(a, [data[:1000], memoryview(data)[1000:]] if a.size > 1000 else data)
        w.add_global(MODULE, "g_table", b"\1" * 64, 64)
        return w.commit()


@pytest.fixture
def written(tmp_path, table) -> Path:
    _write(tmp_path / "ckpt", table)
    return tmp_path / "ckpt"


def test_round_trip(written, table):
    m = load(written)
    assert not written.with_name("ckpt.tmp").exists()
    assert (m.pid, m.argv, m.cut, m.version) == (4242, ("./app", "--n", "8"), {0: 17, 0x7f00: 21}, 1)
    assert [(e.index, e.address, e.size, e.kind) for e in m.allocations] == [
        (0, 0x10000, 4096, 1), (2, 0x30000, 3077, 4), (3, 0x40000, 0, 1)]
    assert [(g.module, g.symbol, g.size) for g in m.globals] == [(MODULE, "g_table", 64)]
    for e in m.allocations:
        assert (written / e.file).read_bytes() == _contents(e.index, e.size)
    assert json.loads((written / "manifest.json").read_text())["cut"] == [
        {"stream": 0, "seq": 17}, {"stream": 0x7f00, "seq": 21}]


def _edit_manifest(change):
    def edit(d: Path) -> None:
        raw = json.loads((d / "manifest.json").read_text())
        change(raw)
        (d / "manifest.json").write_text(json.dumps(raw))
    return edit


def _flip_byte(d: Path) -> None:
    p = d / "alloc-000000.bin"
    data = bytearray(p.read_bytes())
    data[100] ^= 1
    p.write_bytes(bytes(data))


def _interrupted(d: Path) -> None:
    d.rename(d.with_name("ckpt.tmp"))


# corruption -> reason the refusal must give
CORRUPT = {
    "manifest missing": (lambda d: (d / "manifest.json").unlink(), "manifest.json missing"),
    "manifest truncated": (lambda d: (d / "manifest.json").write_text('{"version": 1, "pid'),
                           "not valid JSON"),
    "manifest not UTF-8": (lambda d: (d / "manifest.json").write_bytes(b"\xff\xfe"), "not valid JSON"),
    "other version": (_edit_manifest(lambda r: r.update(version=2)), "format version 2"),
    "version missing": (_edit_manifest(lambda r: r.pop("version")), "version missing"),
    "size not an integer": (_edit_manifest(lambda r: r["allocations"][1].update(size="3077")),
                            "allocations[1].size is not an integer"),
    "manifest a list": (lambda d: (d / "manifest.json").write_text("[]"), "version missing"),
    "allocation file missing": (lambda d: (d / "alloc-000002.bin").unlink(), "alloc-000002.bin missing"),
    "global file missing": (lambda d: (d / "global-0000.bin").unlink(), "global-0000.bin missing"),
    "file truncated": (lambda d: (d / "alloc-000002.bin").write_bytes(b"x" * 10),
                       "alloc-000002.bin: 10 bytes, the manifest says 3077"),
    "contents flipped": (_flip_byte, "sha256 mismatch"),
    "file name escapes": (_edit_manifest(lambda r: r["allocations"][0].update(file="../x")),
                          "not a plain name"),
    "two entries one file": (_edit_manifest(lambda r: r["allocations"][1].update(file="alloc-000000.bin")),
                             "share a file"),
    "two entries one index": (_edit_manifest(lambda r: r["allocations"][1].update(index=0)),
                              "share an index"),
    "interrupted write": (_interrupted, "interrupted checkpoint"),
    "no directory": (lambda d: os.rename(d, d.with_name("elsewhere")), "no such checkpoint directory"),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_or_partial_checkpoints_are_refused_naming_dir_and_reason(written, case):
    corrupt, reason = CORRUPT[case]
    corrupt(written)
    with pytest.raises(SnapshotError) as e:
        load(written)
    assert str(e.value).startswith(f"{written}: ") and reason in str(e.value), str(e.value)


def test_without_verify_sizes_are_still_checked_but_contents_are_not(written):
    _flip_byte(written)
    load(written, verify=False)
    (written / "alloc-000000.bin").write_bytes(b"short")
    with pytest.raises(SnapshotError, match="5 bytes"):
        load(written, verify=False)


# ---- writing ----

def test_an_exception_while_writing_leaves_neither_dir_nor_tmp(tmp_path, table):
    d = tmp_path / "ckpt"
    with pytest.raises(RuntimeError):
        with SnapshotWriter(d, pid=1, argv=[], cut={}) as w:
            w.add_allocation(table.by_creation()[0], _contents(0, 4096))
            raise RuntimeError("app died")
    assert not d.exists() and not d.with_name("ckpt.tmp").exists()


def test_a_failed_publish_leaves_no_directory(tmp_path, table, monkeypatch):
    d = tmp_path / "ckpt"

    def rename(src, dst):
        raise OSError(18, "Invalid cross-device link")
    monkeypatch.setattr(snapshot.os, "rename", rename)
    with pytest.raises(SnapshotError, match="cannot publish the checkpoint: Invalid cross-device link"):
        _write(d, table)
    assert not d.exists() and not d.with_name("ckpt.tmp").exists()


@pytest.mark.parametrize("case,reason", [
    ("dir exists", "already exists"),
    ("tmp exists", "ckpt.tmp exists"),
    ("short data", "allocation #0: 4095 bytes given for 4096"),
    ("twice", "allocation #0 written twice"),
    ("vmm handle", "is a VMM handle"),
    ("global twice", "global g of m written twice"),
])
def test_writer_refusals(tmp_path, table, case, reason):
    d = tmp_path / "ckpt"
    if case == "dir exists":
        d.mkdir()
    if case == "tmp exists":
        d.with_name("ckpt.tmp").mkdir()
    a0 = table.by_creation()[0]
    with pytest.raises(SnapshotError, match=reason):
        with SnapshotWriter(d, pid=1, argv=[], cut={}) as w:
            if case == "short data":
                w.add_allocation(a0, _contents(0, 4095))
            if case == "twice":
                w.add_allocation(a0, _contents(0, 4096))
                w.add_allocation(a0, _contents(0, 4096))
            if case == "vmm handle":
                w.add_allocation(Allocation(9, 0x77, 4096, AllocKind.VMM_HANDLE), b"")
            if case == "global twice":
                w.add_global("m", "g", b"12", 2)
                w.add_global("m", "g", b"12", 2)
    assert not d.with_name("ckpt.tmp").exists() or case == "tmp exists"
    assert (case == "dir exists") == d.exists()


# ---- restore plans ----

def _rerun(sizes: dict[int, tuple[int, AllocKind]]) -> list[Allocation]:
    """The live allocations of a re-run: same creation numbers, new addresses."""
    return [Allocation(seq, 0x900000 + seq * 0x10000, size, kind) for seq, (size, kind) in sizes.items()]


SAME = {0: (4096, AllocKind.DEVICE), 2: (3077, AllocKind.ASYNC), 3: (0, AllocKind.DEVICE),
        4: (64, AllocKind.DEVICE)}   # 4: allocated after the cut, left alone


def test_plan_matches_by_creation_number_and_execute_writes_everything(written):
    m = load(written)
    plan = plan_restore(m, _rerun(SAME), {(MODULE, "g_table"): (0x5000, 64)})
    assert [(c.what, c.address, c.size) for c in plan.copies] == [
        ("allocation #0", 0x900000, 4096), ("allocation #2", 0x920000, 3077), ("allocation #3", 0x930000, 0),
        (f"global g_table of {MODULE}", 0x5000, 64)]
    assert plan.bytes == 4096 + 3077 + 64
    memory: dict[int, int] = {}

    def write(address: int, data: memoryview) -> None:
        for i, b in enumerate(data):
            memory[address + i] = b
    plan.execute(write, chunk=1000)
    assert bytes(memory[0x920000 + i] for i in range(3077)) == _contents(2, 3077)
    assert bytes(memory[0x900000 + i] for i in range(4096)) == _contents(0, 4096)
    assert len(memory) == plan.bytes


@pytest.mark.parametrize("live,globals_,reason", [
    ({k: v for k, v in SAME.items() if k != 2}, None, "allocation #2 (3077 bytes) has not been recreated"),
    (SAME | {2: (3078, AllocKind.ASYNC)}, None, "allocation #2: the checkpoint has 3077 bytes of ASYNC, "
                                                "the live one 3078 bytes of ASYNC"),
    (SAME | {0: (4096, AllocKind.MANAGED)}, None, "allocation #0: the checkpoint has 4096 bytes of DEVICE, "
                                                 "the live one 4096 bytes of MANAGED"),
    (SAME, {}, "global g_table of module sha256:ab12 is not loaded"),
    (SAME, {(MODULE, "g_table"): (0x5000, 32)}, "global g_table: the checkpoint has 64 bytes, the live one 32"),
])
def test_plan_refuses_mismatches_before_writing(written, live, globals_, reason):
    m = load(written)
    with pytest.raises(SnapshotError) as e:
        plan_restore(m, _rerun(live), {(MODULE, "g_table"): (0x5000, 64)} if globals_ is None else globals_)
    assert str(e.value) == f"{written}: {reason}"


def test_plan_refuses_files_changed_after_loading_and_unloaded_manifests(written, table):
    m = load(written)
    live = {(MODULE, "g_table"): (0x5000, 64)}
    p = written / "alloc-000002.bin"
    os.utime(p, ns=(0, 12345))
    with pytest.raises(SnapshotError, match="alloc-000002.bin changed after the checkpoint was checked"):
        plan_restore(m, _rerun(SAME), live)
    fresh = _write(written.with_name("other"), table)
    with pytest.raises(SnapshotError, match="never checked: restore from snapshot.load"):
        plan_restore(fresh, _rerun(SAME), live)


@pytest.mark.gpu
def test_gpu_checkpoint_then_restore_device_buffers(tmp_path):
    """vector_add on the device: its launch's buffers from the PTX sets, a checkpoint of every
    allocation, a launch that overwrites c, then a restore that brings c (and a, b) back."""
    import ctypes
    import struct

    import ptx_corpus
    from egpu_preload.cow.allocations import launch_uses, pack_args
    from egpu_preload.cow.dag import Dag
    from egpu_preload.cow.rwsets import analyse
    from test_rewrite_gpu import Gpu

    gpu, n = Gpu(), 1 << 16
    text = ptx_corpus.build()["vector_add.sm_90"]
    rw = analyse(text)["vector_add"]
    fn = gpu.ok(gpu.cu.cuModuleGetFunction(gpu.load(text), b"vector_add"))
    a, b = struct.pack(f"<{n}f", *range(n)), struct.pack(f"<{n}f", *(2.0 * i for i in range(n)))
    table = AllocationTable()
    ptrs = [gpu.alloc(x) for x in (a, b, bytes(4 * n))]
    allocs = [table.insert(p, 4 * n, AllocKind.DEVICE) for p in ptrs]

    def launch(x: int, y: int, z: int) -> bytes:
        values = [ctypes.c_uint64(x), ctypes.c_uint64(y), ctypes.c_uint64(z), ctypes.c_int32(n)]
        params = (ctypes.c_void_p * 4)(*[ctypes.addressof(v) for v in values])
        gpu.ok(gpu.cu.cuLaunchKernel(fn, n // 256, 1, 1, 256, 1, 1, 0, 0, ctypes.addressof(params), 0))
        gpu.ok(gpu.cu.cuCtxSynchronize())
        return pack_args([bytes(v) for v in values], rw.params)

    dag = Dag()
    uses = launch_uses(launch(*ptrs), table, rw.params, rw)
    assert uses.modes == {allocs[0]: "r", allocs[1]: "r", allocs[2]: "w"} and not uses.anything
    dag.add(0, "launch", [x for x, m in uses.modes.items() if "r" in m],
            [x for x, m in uses.modes.items() if "w" in m], "vector_add")
    want = gpu.read(ptrs[2], 4 * n)
    assert want == struct.pack(f"<{n}f", *(3.0 * i for i in range(n)))
    with SnapshotWriter(tmp_path / "ckpt", pid=os.getpid(), argv=["test"], cut=dag.frontier()) as w:
        for x in table.by_creation():
            w.add_allocation(x, gpu.read(x.address, x.size))
        w.commit()
    launch(ptrs[2], ptrs[2], ptrs[2])   # c = 2c after the cut
    assert gpu.read(ptrs[2], 4 * n) != want
    plan = plan_restore(load(tmp_path / "ckpt"), table.by_creation())
    plan.execute(lambda address, data: gpu.write(address, bytes(data)))
    assert [gpu.read(p, 4 * n) for p in ptrs] == [a, b, want]
