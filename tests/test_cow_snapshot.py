"""Checkpoint directories: written atomically and privately (0600 files in 0700), sealed, read back with
full validation, and every kind of corrupt, partial, tampered or exposed directory refused with the
directory and the reason; restore plans match allocations by creation number, size and kind, the whole
cut when rolling back the process that took it, and refuse before any byte is written."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest

from egpu_preload.control import ControlError
from egpu_preload.cow import seal, snapshot
from egpu_preload.cow.allocations import Allocation, AllocationTable, AllocKind
from egpu_preload.cow.snapshot import Job, SnapshotWriter, load, plan_restore
from egpu_preload.errors import SnapshotError

MODULE = "sha256:ab12"
NOBODY = 65534
JOB = Job("token-of-4242", 4242, ("./app", "--n", "8"))


@pytest.fixture(autouse=True)
def state_home(tmp_path, monkeypatch) -> Path:
    """This user's checkpoint key in the test's directory."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state"


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
    with SnapshotWriter(directory, pid=JOB.pid, argv=JOB.argv, cut={0: 17, 0x7f00: 21}, process=JOB.process) as w:
        for a in reversed(table.by_creation()):   # copy order is free (copy-on-write goes first)
            data = _contents(a.seq, a.size)
            w.add_allocation(a, [data[:1000], memoryview(data)[1000:]] if a.size > 1000 else data)
        w.add_global(MODULE, "g_table", b"\1" * 64, 64)
        w.add_global(MODULE, "g_count", b"\2" * 8, 8)
        return w.commit()


@pytest.fixture
def written(tmp_path, table) -> Path:
    _write(tmp_path / "ckpt", table)
    return tmp_path / "ckpt"


def test_round_trip(written, table):
    m = load(written)
    assert not written.with_name("ckpt.tmp").exists()
    assert (m.pid, m.argv, m.cut, m.version) == (4242, ("./app", "--n", "8"), {0: 17, 0x7f00: 21}, 2)
    assert (m.process, m.allocations_made) == (JOB.process, 4)
    assert [(e.index, e.address, e.size, e.kind) for e in m.allocations] == [
        (0, 0x10000, 4096, 1), (2, 0x30000, 3077, 4), (3, 0x40000, 0, 1)]
    assert [(g.module, g.symbol, g.size) for g in m.globals] == [(MODULE, "g_table", 64), (MODULE, "g_count", 8)]
    for e in m.allocations:
        assert (written / e.file).read_bytes() == _contents(e.index, e.size)
    assert json.loads((written / "manifest.json").read_text())["cut"] == [
        {"stream": 0, "seq": 17}, {"stream": 0x7f00, "seq": 21}]


def _edit_manifest(change, resealed: bool = True):
    """An edit of manifest.json; ``resealed``: sealed again with this user's key (as only this user can),
    so that what refuses it is the check behind the seal."""
    def edit(d: Path) -> None:
        raw = json.loads((d / "manifest.json").read_text())
        change(raw)
        _replace_manifest(json.dumps(raw).encode(), resealed)(d)
    return edit


def _replace_manifest(text: bytes, resealed: bool = True):
    def replace(d: Path) -> None:
        (d / "manifest.json").write_bytes(text)
        if resealed:
            (d / "manifest.hmac").write_text(seal.seal(text))
    return replace


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
    "manifest truncated": (_replace_manifest(b'{"version": 2, "pid'), "not valid JSON"),
    "manifest not UTF-8": (_replace_manifest(b"\xff\xfe"), "not valid JSON"),
    "other version": (_edit_manifest(lambda r: r.update(version=3)), "format version 3"),
    "version missing": (_edit_manifest(lambda r: r.pop("version")), "version missing"),
    "size not an integer": (_edit_manifest(lambda r: r["allocations"][1].update(size="3077")),
                            "allocations[1].size is not an integer"),
    "manifest a list": (_replace_manifest(b"[]"), "version missing"),
    "process missing": (_edit_manifest(lambda r: r.pop("process")), "process missing"),
    "kind not saved": (_edit_manifest(lambda r: r["allocations"][0].update(kind=int(AllocKind.HOST))),
                       "allocation #0 is of kind 5, which no checkpoint saves"),
    "index past the cut": (_edit_manifest(lambda r: r.update(allocations_made=3)),
                           "allocation #3 was not made by the cut (3 allocations)"),
    "global twice": (_edit_manifest(lambda r: r["globals"][1].update(symbol="g_table")), "a global is listed twice"),
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
    "seal missing": (lambda d: (d / "manifest.hmac").unlink(), "manifest.hmac missing: the manifest is not sealed"),
    "no directory": (lambda d: os.rename(d, d.with_name("elsewhere")), "no such checkpoint directory"),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_or_partial_checkpoints_are_refused_naming_dir_and_reason(written, case):
    corrupt, reason = CORRUPT[case]
    corrupt(written)
    with pytest.raises(SnapshotError) as e:
        load(written)
    assert str(e.value).startswith(f"{written}: ") and reason in str(e.value), str(e.value)


def _rewrite_data_and_sha256(d: Path) -> None:
    """What an attacker without the key does: new contents, and the manifest's sha256 made to match."""
    (d / "alloc-000000.bin").write_bytes(bytes(4096))
    import hashlib
    _edit_manifest(lambda r: r["allocations"][0].update(sha256=hashlib.sha256(bytes(4096)).hexdigest()),
                   resealed=False)(d)


# tampering by someone without this user's key: every one breaks the seal
TAMPERED = {
    "allocation deleted": _edit_manifest(lambda r: r["allocations"].pop(1), resealed=False),
    "global deleted": _edit_manifest(lambda r: r["globals"].pop(0), resealed=False),
    "data and sha256 rewritten": _rewrite_data_and_sha256,
    "pid edited": _edit_manifest(lambda r: r.update(pid=1), resealed=False),
    "argv edited": _edit_manifest(lambda r: r.update(argv=["./other"]), resealed=False),
    "address edited": _edit_manifest(lambda r: r["allocations"][0].update(address=0x10008), resealed=False),
    "allocations_made edited": _edit_manifest(lambda r: r.update(allocations_made=9), resealed=False),
    "seal of another manifest": lambda d: (d / "manifest.hmac").write_text(seal.seal(b"{}")),
    "seal not hex": lambda d: (d / "manifest.hmac").write_text("\u00e9t\u00e9"),
}


@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_tampered_manifests_break_the_seal(written, case):
    TAMPERED[case](written)
    with pytest.raises(SnapshotError) as e:
        load(written)
    assert str(e.value) == (f"{written}: manifest.json does not match its seal (manifest.hmac): edited since it was "
                            "written, or written by another user")


def test_another_users_key_or_none_is_refused(written, tmp_path, monkeypatch, state_home):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "other-user"))
    with pytest.raises(SnapshotError, match="no checkpoint key: checkpoints are sealed with a key this user does not"):
        load(written)
    _write(tmp_path / "theirs", _table())   # makes a key of "the other user's"
    with pytest.raises(SnapshotError, match="does not match its seal"):
        load(written)
    monkeypatch.setenv("XDG_STATE_HOME", str(state_home))
    with pytest.raises(SnapshotError, match="does not match its seal"):
        load(tmp_path / "theirs")
    load(written)


@pytest.mark.parametrize("damage, reason", [
    (lambda k: k.chmod(0o644), "not a checkpoint key private to uid {uid} (uid {uid}, mode 0644, 32 bytes)"),
    (lambda k: k.write_bytes(b"short"), "not a checkpoint key private to uid {uid} (uid {uid}, mode 0600, 5 bytes)"),
    (lambda k: k.unlink() or k.symlink_to(k.parent / "elsewhere"), "cannot open the checkpoint key: Too many levels"),
])
def test_a_key_that_is_not_private_is_refused(written, damage, reason):
    key = seal.key_path()
    damage(key)
    with pytest.raises(SnapshotError) as e:
        load(written)
    assert str(e.value).startswith(f"{key}: " + reason.format(uid=os.geteuid())), str(e.value)


def test_a_key_directory_open_to_others_is_refused(written):
    seal.key_path().parent.chmod(0o755)
    with pytest.raises(ControlError, match="mode 0755"):
        load(written)


def test_files_are_0600_in_a_0700_directory_whatever_the_umask(tmp_path, table):
    old = os.umask(0)
    try:
        _write(tmp_path / "ckpt", table)
    finally:
        os.umask(old)
    d = tmp_path / "ckpt"
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    files = sorted(p.name for p in d.iterdir())
    assert files == ["alloc-000000.bin", "alloc-000002.bin", "alloc-000003.bin", "global-0000.bin",
                     "global-0001.bin", "manifest.hmac", "manifest.json"]
    assert {stat.S_IMODE(os.stat(d / f).st_mode) for f in files} == {0o600}
    assert stat.S_IMODE(os.stat(seal.key_path()).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(seal.key_path().parent).st_mode) == 0o700


@pytest.mark.parametrize("expose, reason", [
    (lambda d: d.chmod(0o770), "the directory is owned by uid {uid} with mode 0770"),
    (lambda d: (d / "alloc-000002.bin").chmod(0o602), "alloc-000002.bin is owned by uid {uid} with mode 0602"),
    (lambda d: (d / "manifest.json").chmod(0o620), "manifest.json is owned by uid {uid} with mode 0620"),
    (lambda d: os.chown(d / "global-0000.bin", NOBODY, NOBODY), f"global-0000.bin is owned by uid {NOBODY}"),
    (lambda d: (d / "alloc-000000.bin").unlink() or (d / "alloc-000000.bin").symlink_to(d / "alloc-000002.bin"),
     "alloc-000000.bin is not a plain file"),
])
def test_a_checkpoint_others_may_write_is_refused(written, expose, reason):
    if "chown" in repr(expose.__code__.co_names) and os.geteuid() != 0:
        pytest.skip("chown needs root")
    expose(written)
    with pytest.raises(SnapshotError) as e:
        load(written)
    assert str(e.value).startswith(f"{written}: " + reason.format(uid=os.geteuid())), str(e.value)


def _denied(*names: str):
    """os.lstat, os.stat and open raising EACCES for these names, as for a user without read or search
    permission (the tests may run as root, who has both)."""
    def wrap(real):
        def call(path, *a, **k):
            if Path(path).name in names:
                raise PermissionError(13, "Permission denied", str(path))
            return real(path, *a, **k)
        return call
    return wrap


@pytest.mark.parametrize("name", ["alloc-000002.bin", "manifest.json", "manifest.hmac"])
def test_a_file_the_user_cannot_read_is_refused_naming_it(written, monkeypatch, name):
    deny = _denied(name)
    monkeypatch.setattr(snapshot.os, "lstat", deny(os.lstat))
    monkeypatch.setattr(snapshot.os, "stat", deny(os.stat))
    monkeypatch.setattr(snapshot, "open", deny(open), raising=False)
    with pytest.raises(SnapshotError) as e:
        load(written)
    assert str(e.value) == f"{written}: {name}: cannot read: Permission denied", str(e.value)


def test_a_data_file_that_cannot_be_opened_is_refused_naming_it(written, monkeypatch):
    monkeypatch.setattr(snapshot, "open", _denied("alloc-000002.bin")(open), raising=False)
    with pytest.raises(SnapshotError) as e:
        load(written)
    assert str(e.value) == f"{written}: alloc-000002.bin: cannot read: Permission denied", str(e.value)


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


def test_a_directory_that_cannot_be_made_is_refused_naming_it(tmp_path, table):
    (tmp_path / "file").write_text("")
    for d, made in ((tmp_path / "file" / "ckpt", "file: not a directory"),
                    (tmp_path / "file" / "sub" / "ckpt", "file/sub: Not a directory")):
        with pytest.raises(SnapshotError, match=f"^{d}: cannot create {tmp_path}/{made}$"):
            _write(d, table)


def test_a_full_filesystem_is_refused_naming_the_file_and_leaves_nothing(tmp_path, table, monkeypatch):
    d = tmp_path / "ckpt"

    def fsync(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(snapshot.os, "fsync", fsync)
    with pytest.raises(SnapshotError, match=f"^{d}: cannot write alloc-000003.bin: No space left on device$"):
        _write(d, table)
    assert not d.exists() and not d.with_name("ckpt.tmp").exists()


FSIZE_JOB = """
import resource, signal, sys
from egpu_preload.cow.allocations import Allocation, AllocKind
from egpu_preload.cow.snapshot import SnapshotWriter
from egpu_preload.errors import SnapshotError
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)   # as in the job: the shim's interpreter leaves it alone
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
try:
    with SnapshotWriter(sys.argv[1], pid=1, argv=[], cut={}) as w:
        w.add_allocation(Allocation(0, 0x1000, 64, AllocKind.DEVICE), bytes(64))
        w.commit()
except SnapshotError as e:
    print(e)
"""


@pytest.mark.parametrize("limit, reason", [
    (32, "alloc-000000.bin: 64 bytes, past the job's file size limit \\(ulimit -f\\) of 32 bytes"),
    (100, r"manifest.json: \d+ bytes, past the job's file size limit \(ulimit -f\) of 100 bytes"),
])
def test_a_file_size_limit_is_refused_without_ending_the_job(tmp_path, limit, reason):
    """Writing past RLIMIT_FSIZE sends SIGXFSZ, which ended the job the checkpoint was taken of."""
    import subprocess
    import sys
    d = tmp_path / "ckpt"
    r = subprocess.run([sys.executable, "-c", FSIZE_JOB, str(d), str(limit)], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parent.parent, timeout=30)
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert re.fullmatch(f"{re.escape(str(d))}: {reason}\n", r.stdout), r.stdout
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


GLOBALS = {(MODULE, "g_table"): (0x5000, 64), (MODULE, "g_count"): (0x5040, 8)}


def test_plan_matches_by_creation_number_and_execute_writes_everything(written):
    m = load(written)
    plan = plan_restore(m, _rerun(SAME), GLOBALS)
    assert [(c.what, c.address, c.size) for c in plan.copies] == [
        ("allocation #0", 0x900000, 4096), ("allocation #2", 0x920000, 3077), ("allocation #3", 0x930000, 0),
        (f"global g_table of {MODULE}", 0x5000, 64), (f"global g_count of {MODULE}", 0x5040, 8)]
    assert plan.bytes == 4096 + 3077 + 64 + 8
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
    (SAME, GLOBALS | {(MODULE, "g_table"): (0x5000, 32)},
     "global g_table: the checkpoint has 64 bytes, the live one 32"),
    (SAME, GLOBALS | {(MODULE, "g_new"): (0x5080, 4)}, "global g_new of module sha256:ab12 is not in the checkpoint: "
                                                       "a restore puts back all of the cut or nothing"),
])
def test_plan_refuses_mismatches_before_writing(written, live, globals_, reason):
    m = load(written)
    with pytest.raises(SnapshotError) as e:
        plan_restore(m, _rerun(live), GLOBALS if globals_ is None else globals_)
    assert str(e.value) == f"{written}: {reason}"


def _table() -> AllocationTable:
    t = AllocationTable()
    for address, size, kind in ((0x10000, 4096, AllocKind.DEVICE), (0x20000, 100, AllocKind.MANAGED),
                                (0x30000, 3 * 1024 + 5, AllocKind.ASYNC), (0x40000, 0, AllocKind.DEVICE)):
        t.insert(address, size, kind)
    t.remove(0x20000)
    return t


def _now(table: AllocationTable, *more: Allocation) -> list[Allocation]:
    """The allocations of the process that took the checkpoint, as they are at the rollback."""
    return table.by_creation() + list(more)


# rollback into the process that took it: edits this user made and sealed again are refused by the job itself
@pytest.mark.parametrize("edit, live, job, reason", [
    (_edit_manifest(lambda r: r["allocations"].pop(1)), (), JOB,
     "allocation #2 (3077 bytes of ASYNC) was live at the cut but is not in the checkpoint: a restore puts back "
     "all of the cut or nothing"),
    (_edit_manifest(lambda r: r["globals"].pop(0)), (), JOB,
     "global g_table of module sha256:ab12 is not in the checkpoint: a restore puts back all of the cut or nothing"),
    (_edit_manifest(lambda r: r["allocations"][0].update(address=0x10008)), (), JOB,
     "allocation #0: the checkpoint has it at 0x10008, the job at 0x10000"),
    (_edit_manifest(lambda r: r.update(pid=4243)), (), JOB, "a checkpoint of process 4243 (./app --n 8), not of this "
     "one (4242): roll back only the process that took it; egpu-run --restore starts a new one from it"),
    (_edit_manifest(lambda r: r.update(argv=["./app"])), (), JOB, "a checkpoint of process 4242 (./app), not of this"),
    (None, (), Job("token-of-a-later-4242", 4242, JOB.argv), "a checkpoint of process 4242 (./app --n 8), not of this"),
    (_edit_manifest(lambda r: r.update(allocations_made=3) or r["allocations"].pop()), (), JOB,
     None),   # allocation #3 is empty: nothing of it to save, so it need not be listed
    (None, (Allocation(4, 0x50000, 64, AllocKind.DEVICE), Allocation(5, 0x60000, 64, AllocKind.HOST)), JOB,
     None),   # made after the cut
])
def test_a_rollback_puts_back_the_whole_cut_of_its_own_process_or_nothing(written, table, edit, live, job, reason):
    if edit is not None:
        edit(written)
    m = load(written)
    if reason is None:
        plan_restore(m, _now(table, *live), GLOBALS, job)
        return
    with pytest.raises(SnapshotError) as e:
        plan_restore(m, _now(table, *live), GLOBALS, job)
    assert str(e.value).startswith(f"{written}: {reason}"), str(e.value)


def test_a_rerun_may_have_allocations_the_cut_had_freed(written):
    """Allocation #1 was freed before the cut; a re-run restores before it frees it: matched by number."""
    plan = plan_restore(load(written), _rerun(SAME | {1: (100, AllocKind.MANAGED)}), GLOBALS)
    assert [c.what for c in plan.copies][:3] == ["allocation #0", "allocation #2", "allocation #3"]


def test_plan_refuses_files_changed_after_loading_and_unloaded_manifests(written, table):
    m = load(written)
    live = GLOBALS
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
    with SnapshotWriter(tmp_path / "ckpt", pid=os.getpid(), argv=["test"], cut=dag.frontier(), process="t") as w:
        for x in table.by_creation():
            w.add_allocation(x, gpu.read(x.address, x.size))
        w.commit()
    launch(ptrs[2], ptrs[2], ptrs[2])   # c = 2c after the cut
    assert gpu.read(ptrs[2], 4 * n) != want
    plan = plan_restore(load(tmp_path / "ckpt"), table.by_creation(), None, Job("t", os.getpid(), ("test",)))
    plan.execute(lambda address, data: gpu.write(address, bytes(data)))
    assert [gpu.read(p, 4 * n) for p in ptrs] == [a, b, want]
