"""cow/ against the stand-in driver: the shim's copy/memset/stream records, the soft copy-on-write fast
path (shim/cow.c) seen in the stand-in's call log, and ``egpu checkpoint`` / ``egpu restore`` /
``egpu-run --restore`` end to end on tests/runtime_stub/app_cow.c (stand-in extended by driver_cow.c)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from egpu_preload.control import list_sessions
from egpu_preload.cow import snapshot
from test_shim import CUDA_H, built, full_stub  # noqa: F401  (the shim and stand-in, built once per session)

ROOT = Path(__file__).resolve().parent.parent
STUB = ROOT / "tests" / "stub_driver"
MORE = ROOT / "tests" / "runtime_stub"
WORDS = 8   # app_cow.c: 8 words a buffer


@dataclass(frozen=True)
class CowStub:
    shim: Path
    dir: Path
    app: Path

    def env(self, log: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("EGPU")}
        env.update(LD_LIBRARY_PATH=str(self.dir), EGPU_STUB_LOG=str(log), EGPU_SHIM=str(self.shim),
                   PYTHONPATH=str(ROOT), XDG_RUNTIME_DIR=str(log.parent))
        return env

    def run(self, mode: str, log: Path, *args: str) -> subprocess.CompletedProcess:
        env = {**self.env(log), "LD_PRELOAD": str(self.shim)}
        return subprocess.run([str(self.app), mode, *args], env=env, capture_output=True, text=True, timeout=30)


@pytest.fixture(autouse=True)
def state_home(tmp_path, monkeypatch) -> None:
    """The checkpoint key (cow/seal.py) in the test's directory; jobs and the CLI inherit it."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


@pytest.fixture(scope="session")
def cow_stub(built, full_stub) -> CowStub:  # noqa: F811
    cc = ["gcc", "-O1", "-Wall", "-Werror", "-I", str(ROOT / "shim")]
    subprocess.run(cc + [str(MORE / "app_cow.c"), "-o", str(full_stub / "app_cow"), "-ldl"], check=True)
    return CowStub(built / "libegpu_shim.so", full_stub, full_stub / "app_cow")


def egpu(args: list[str], env: dict[str, str], launcher: str = "egpu_main") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", f"import launcher; launcher.{launcher}()", *args], env=env,
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


# ---- the shim's records -------------------------------------------------------------------------

def test_copies_memsets_streams_and_events_are_recorded(cow_stub, tmp_path):
    r = cow_stub.run("records", tmp_path / "log")
    assert r.returncode == 0, r.stderr
    head = re.match(r"a (\S+) b (\S+) stream (\S+) event (\S+) streams 1 after 0", r.stdout)
    assert head, r.stdout
    a, b, s, e = (int(x, 16) for x in head.groups())
    ops = [tuple(int(x, 0) if x != "(nil)" else 0 for x in ln.split()[1:])
           for ln in r.stdout.splitlines() if ln.startswith("op ")]
    # (kind, flags, dst, src, size, stream): egpu_cow.h enum egpu_op_kind and EGPU_OP_* flags
    assert [o for o in ops if o[0] != 1] == [
        (9, 0, 0, 0, 0, s),              # cuStreamCreateWithPriority
        (6, 0, b, 0xab, 16, 0),          # cuMemsetD8_v2: 16 bytes
        (6, 1, a, 5, 16, s),             # cuMemsetD32Async: 4 words = 16 bytes
        (3, 1, b, a, 24, s),             # cuMemcpyDtoDAsync_v2
        (7, 0, 0, e, 0, s),              # cuEventRecord
        (8, 0, 0, e, 0, 0),              # cuStreamWaitEvent on the legacy stream
        (3, 4, b + 16 + 4, a, 16 + 8, 0),  # cuMemcpy2D: from row 1, byte 4, to the end of the last row
        (10, 0, 0, 0, 0, s),             # cuStreamDestroy_v2
    ]
    assert [o[:3] + o[4:] for o in ops if o[0] == 1] == [(1, 0, a, 64, 0)]   # cuMemcpyHtoD_v2
    seqs = sorted((int(m[0], 16), int(m[1])) for m in re.findall(r"alloc (\S+) \d+ seq (\d+)", r.stdout))
    assert seqs == [(a, 0), (b, 1)]            # the freed third one (seq 2) is gone but was counted:
    assert "stats ops 9 allocations 3 overflow 0 result 0" in r.stdout


# ---- the fast path ------------------------------------------------------------------------------

def _between(log: str, start: str, end: str) -> list[str]:
    lines = log.splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.endswith(f"mark {start}"))
    j = next(k for k, ln in enumerate(lines) if ln.endswith(f"mark {end}"))
    return [ln.split(" ", 1)[1] for ln in lines[i + 1:j] if "cuMemcpyDtoD_v2" not in ln]


def test_a_writer_copies_a_pending_range_first_on_its_own_stream(cow_stub, tmp_path):
    r = cow_stub.run("cow", tmp_path / "log")
    assert r.returncode == 0, r.stderr
    m = re.match(r"streams (\S+) (\S+) side (\S+) buffers (\S+) (\S+) (\S+) (\S+)", r.stdout)
    s, s2, side, *bufs = m.groups()
    b = [int(x, 16) for x in bufs]
    log = (tmp_path / "log").read_text()
    staging = {int(src, 16): dst for dst, src in re.findall(r"cuMemcpyAsync dst=(\S+) src=(\S+)", log)}
    assert sorted(staging) == b, "each range copied exactly once"
    cut_waits = [f"cuStreamWaitEvent stream={{}} event={e}" for e in (5, 6, 7, 8)]   # legacy, s, s2, side

    def after_cut(stream: str) -> list[str]:
        return [w.format(stream) for w in cut_waits]

    cases = [  # (between marks, the calls the stand-in saw there, in order)
        ("armed", "stray", after_cut(s) + [f"cuMemcpyAsync dst={staging[b[0]]} src={b[0]:#x} size=64 stream={s}",
                                           f"cuEventRecord event=1 stream={s}",
                                           f"cuLaunchKernel f=k@1 grid=1 block=1 stream={s} params={b[0]},5"]),
        ("stray", "reader", [f"cuLaunchKernel f=k@1 grid=1 block=1 stream={s} params=4660,5"]),
        ("reader", "htod", [f"cuLaunchKernel f=k2@1 grid=1 block=1 stream={s} params={b[1]}"]),
        ("htod", "other stream", after_cut("(nil)") + [
            f"cuMemcpyAsync dst={staging[b[2]]} src={b[2]:#x} size=64 stream=(nil)",
            "cuEventRecord event=3 stream=(nil)", "cuMemcpyHtoD_v2 size=64 ctx=app"]),
        ("other stream", "copier", [f"cuStreamWaitEvent stream={s2} event=1",
                                    f"cuLaunchKernel f=k@1 grid=1 block=1 stream={s2} params={b[0]},5"]),
        ("copier", "disarmed", [f"cuMemcpyAsync dst={staging[b[1]]} src={b[1]:#x} size=64 stream={side}",
                                f"cuEventRecord event=2 stream={side}",
                                f"cuMemcpyAsync dst={staging[b[3]]} src={b[3]:#x} size=64 stream={side}",
                                f"cuEventRecord event=4 stream={side}"]),
    ]
    for start, end, calls in cases:
        assert _between(log, start, end) == calls, (start, end)
    # the copier's stream waited for the cut on every stream (the legacy one first) before copying
    cut = log[:log.index("mark armed")]
    assert [ln.split(" ", 1)[1] for ln in cut.splitlines() if "cuStreamWaitEvent" in ln] == after_cut(side)
    # the cut came first: events on the legacy stream and every stream the app made
    assert [ln.split(" ", 1)[1] for ln in cut.splitlines() if "cuEventRecord" in ln] == [
        f"cuEventRecord event={e} stream={x}" for e, x in zip((5, 6, 7, 8), ("(nil)", s, s2, side))]
    # every buffer's snapshot is its contents at the cut ("A" = 100 + b), buffer 2's HtoD came after
    assert re.findall(r"staged (\d) (\d+)", r.stdout) == [(str(i), str(100 + i)) for i in range(4)]
    assert ("cow hook_copies 2 hook_waits 1 copier_copies 2 copied 2 checked 5 unknown 0 cut_streams 4 armed 0 "
            "result 0") in r.stdout
    after = log[log.index("mark disarmed"):]
    assert "cuMemcpyAsync" not in after and "cuStreamWaitEvent" not in after


def test_the_cut_marks_every_stream_however_many_the_app_made(cow_stub, tmp_path):
    """5000 streams (more than the 4096 the shim once listed): the cut records an event on each, and on
    the legacy stream."""
    r = cow_stub.run("streams", tmp_path / "log", "5000")
    assert r.returncode == 0, r.stderr
    assert "cut_streams 5001 armed 0 result 0" in r.stdout, r.stdout


def test_a_write_whose_end_wraps_the_address_space_is_still_copied_first(cow_stub, tmp_path):
    """A memset from inside an armed range whose end (dst + size) wraps past 2^64: copy-on-write still
    copies the range before it (the driver refuses the call; what it could write is tracked first)."""
    r = cow_stub.run("overflow", tmp_path / "log")
    assert r.returncode == 0, r.stderr
    assert "overflow hook_copies 1 unknown 0 result 0" in r.stdout, r.stdout


def test_a_parameter_buffer_past_the_drivers_limit_is_never_read(cow_stub, tmp_path):
    """A launch whose CU_LAUNCH_PARAM_BUFFER_SIZE says 4 GiB (the driver takes at most 32764 bytes and
    refuses it): the hook reads none of it (it once scanned the size cut to 32 bits, out of bounds) and
    counts the launch as one that may write anything."""
    r = cow_stub.run("huge-params", tmp_path / "log")
    assert r.returncode == 0, r.stderr
    assert "overflow hook_copies 1 unknown 1 result 0" in r.stdout, r.stdout


def test_a_kernel_that_may_write_anything_copies_every_range_first(cow_stub, tmp_path):
    """A kernel whose PTX writes through a pointer it loads from memory (rwsets: not exact) may write a range
    no argument points into: its launch copies every pending range first, not just those its words name."""
    r = cow_stub.run("anything", tmp_path / "log")
    assert r.returncode == 0, r.stderr
    assert "overflow hook_copies 1 unknown 1 result 0" in r.stdout, r.stdout


def test_an_inexact_write_set_is_registered_as_writing_anything():
    """live.register_layouts hands the shim EGPU_COW_ANYTHING for a kernel rwsets cannot follow (it once
    passed -1, "every word", so a pointer loaded from memory wrote past the copy-on-write)."""
    from types import SimpleNamespace

    import cffi

    from egpu_preload.cow import live
    text = (".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k(.param .u64 k_t)\n{\n"
            ".reg .b64 %rd<4>;\n.reg .b32 %r<2>;\nld.param.u64 %rd1, [k_t];\nld.global.u64 %rd2, [%rd1];\n"
            "st.global.u32 [%rd2], %r1;\nret;\n}\n")
    calls = []
    lib = SimpleNamespace(EGPU_COW_ANYTHING=-2,
                          egpu_cow_layout=lambda f, offs, sizes, n, writes, nwrites: calls.append(nwrites) or 0)
    mod = SimpleNamespace(ptx=text)
    rt = SimpleNamespace(ffi=cffi.FFI(), lib=lib, functions={0x10: (mod, "k")})
    assert live.register_layouts(rt) == 1
    assert calls == [lib.EGPU_COW_ANYTHING]


def test_allocations_the_shims_table_dropped_refuse_a_checkpoint_or_restore(monkeypatch):
    """The shim's table holds 65536 live allocations; one made past that is counted (alloc_overflow) but
    not listed. live_allocations, which checkpoint and restore read, refuses rather than leave it out."""
    from types import SimpleNamespace

    import cffi

    from egpu_preload.cow import live
    from egpu_preload.errors import CowError
    monkeypatch.syspath_prepend(str(ROOT / "shim"))
    from build import header_parts
    ffi = cffi.FFI()
    ffi.cdef(header_parts()[1])

    def stats(out):
        out.alloc_overflow = 3

    lib = SimpleNamespace(egpu_shim_allocations=lambda buf, room: 0, egpu_cow_stats=stats)
    with pytest.raises(CowError, match="3 allocations .* not in the shim's table"):
        live.live_allocations(SimpleNamespace(ffi=ffi, lib=lib))


# ---- egpu checkpoint / restore / egpu-run --restore -----------------------------------------------

class Loop:
    """`app MODE STOP` (app_cow loop by default) under egpu-run with no probe, until ``sessions`` of it answer."""

    def __init__(self, stub: CowStub, tmp: Path, app: Path | None = None, mode: str = "loop", sessions: int = 1,
                 args: tuple[str, ...] | None = None, env: dict[str, str] | None = None) -> None:
        self.log, self.stop = tmp / "log", tmp / "stop"
        self.env = {**stub.env(self.log), **(env or {})}
        app = app or stub.app
        self.proc = subprocess.Popen([sys.executable, "-c", "import launcher; launcher.run_main()", str(app),
                                      *(args or (mode, str(self.stop)))], env=self.env, cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = [x for x in list_sessions(tmp / "egpu") if x.info and str(app) in x.info["argv"]]
            if len(found) >= sessions and self.log.exists() and self.log.read_text().count("cuLaunchKernel") > 20:
                self.pids = sorted(x.pid for x in found)
                self.pid = found[0].pid
                return
            time.sleep(0.05)
        self.stop.touch()
        self.proc.kill()
        try:
            raise AssertionError(f"no session: {self.proc.communicate(timeout=10)}")
        except subprocess.TimeoutExpired:  # a process of the app still holds the pipes
            raise AssertionError("no session, and the app does not end") from None

    def finish(self) -> tuple[int, str, str]:
        self.stop.touch()
        out, err = self.proc.communicate(timeout=30)
        return self.proc.returncode, out, err


def _words(path: Path) -> list[int]:
    data = path.read_bytes()
    return [int.from_bytes(data[i:i + 8], "little") for i in range(0, len(data), 8)]


def test_checkpoint_while_running_then_rollback_and_restore_into_a_rerun(cow_stub, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    loop = Loop(cow_stub, tmp_path)
    ckpt, bad = tmp_path / "ckpt", tmp_path / "bad"
    try:
        r = egpu(["checkpoint", str(loop.pid), str(ckpt), "--compare-stop-the-world"], loop.env)
        assert r.returncode == 0, r.stderr
        assert re.match(rf"checkpoint of {loop.pid} in {ckpt}: 4 allocations, 1 globals, 208 bytes; cut at launch \d+ "
                        r"on \d+ streams; copied in .*; the same copy stopping the job: [\d.]+ ms; partial, not "
                        r"saved: 4096 bytes in 1 HOST allocations$", r.stdout), r.stdout
        r = egpu(["checkpoint", "--json", str(loop.pid), str(tmp_path / "ckpt.json")], loop.env)
        assert r.returncode == 0 and json.loads(r.stdout)["not_saved"] == {"HOST": {"allocations": 1, "bytes": 4096}}
        m = snapshot.load(ckpt)
        # copies of device memory: private whatever the job's umask (the CLI's 0o022 here)
        assert ckpt.stat().st_mode & 0o777 == 0o700 and {p.stat().st_mode & 0o777 for p in ckpt.iterdir()} == {0o600}
        # the allocations in creation order: three buffers, then the counter
        assert [(e.index, e.size) for e in m.allocations] == [(0, 64), (1, 64), (2, 64), (3, 8)]
        assert [g.symbol for g in m.globals] == ["launches"]
        assert m.program.exe == str(cow_stub.app) and len(m.program.sha256) == 64
        assert m.info["bytes"] == 3 * 64 + 8 + 8 and m.info["stall_max_ns"] <= m.info["stall_ns"]
        steps = [_words(ckpt / e.file) for e in m.allocations]
        for b in range(3):  # every word of a buffer from one step
            assert len(set(steps[b])) == 1 and steps[b][0] // 1000000 == b
        s = [steps[b][0] % 1000000 for b in range(3)] + [steps[3][0]]
        # a consistent cut of "buffer 0, 1, 2, counter" per step: a prefix of the program's writes
        assert s[0] >= s[1] >= s[2] >= s[3] >= s[0] - 1 and s[3] > 0, s

        # a damaged copy is refused, by the job and by the launcher, before anything is written
        shutil.copytree(ckpt, bad)
        (bad / m.allocations[1].file).write_bytes(b"\0" * 64)
        before = loop.log.read_text().count("cuCtxSynchronize")
        r = egpu(["restore", str(loop.pid), str(bad)], loop.env)
        assert r.returncode == 1 and "sha256 mismatch (corrupt contents)" in r.stderr, r.stderr
        assert loop.log.read_text().count("cuCtxSynchronize") == before

        # rollback: launches held, context drained, every allocation and the global written back
        r = egpu(["restore", str(loop.pid), str(ckpt)], loop.env)
        assert r.returncode == 0, r.stderr
        assert re.match(rf"restored {ckpt} into {loop.pid}: 4 allocations, 1 globals, 208 bytes", r.stdout), r.stdout
        tail = loop.log.read_text().splitlines()
        sync = max(i for i, ln in enumerate(tail) if "cuCtxSynchronize" in ln)
        written = [ln for ln in tail[:sync] if "cuMemcpyDtoD_v2" in ln][-5:]
        assert sorted(int(re.search(r"dst=(\S+)", ln)[1], 16) for ln in written) == sorted(
            [e.address for e in m.allocations] + [0x600000000000 + (1 << 24) + 16 * _offset_of_launches()])
        # --json: the reply alone on stdout, as egpu checkpoint --json gives its own
        r = egpu(["restore", "--json", str(loop.pid), str(ckpt)], loop.env)
        assert r.returncode == 0, r.stderr
        reply = json.loads(r.stdout)
        assert {k: reply[k] for k in ("dir", "allocations", "globals", "bytes")} == {
            "dir": str(ckpt), "allocations": 4, "globals": 1, "bytes": 208} and reply["held_ms"] >= 0, r.stdout
    finally:
        code, out, err = loop.finish()
    assert code == 0 and "result=0" in out, err

    r = egpu(["--restore", str(bad), str(cow_stub.app), "resume"], loop.env, "run_main")
    assert r.returncode == 125 and "sha256 mismatch" in r.stderr and "counter" not in r.stdout, r.stderr
    for mode in ("resume", "resume-captured"):   # a launch into a capture does not restore: the next one does
        r = egpu(["--restore", str(ckpt), str(cow_stub.app), mode], loop.env, "run_main")
        assert r.returncode == 0, r.stderr
        assert f"egpu: restored {ckpt}: 4 allocations, 1 globals, 208 bytes" in r.stderr
        assert re.findall(r"buffer (\d) (\d+)", r.stdout) == [(str(b), str(b * 1000000 + s[b])) for b in range(3)]
        assert f"counter {s[3]} result 0" in r.stdout
        assert ("capture 0" in r.stdout) == (mode == "resume-captured"), r.stdout


def test_the_cuts_hold_on_launches_and_copies_is_reported_beside_the_stall(cow_stub, tmp_path, monkeypatch):
    """The stall the reply gave counted copy-on-write inside hooks only, not the time launches and copies
    waited at the cut while an event went on every stream (a sweep). A stand-in driver taking 20 ms to
    record an event holds them at least that long per stream cut."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    loop = Loop(cow_stub, tmp_path, env={"EGPU_STUB_EVENT_RECORD_US": "20000"})
    try:
        r = egpu(["checkpoint", "--json", str(loop.pid), str(tmp_path / "ckpt")], loop.env)
        assert r.returncode == 0, r.stderr
        reply = json.loads(r.stdout)
        assert reply["cut_streams"] * 20_000_000 <= reply["cut_hold_ns"] <= reply["copy_ms"] * 1e6, reply
        assert snapshot.load(tmp_path / "ckpt").info["cut_hold_ns"] == reply["cut_hold_ns"]
        r = egpu(["checkpoint", str(loop.pid), str(tmp_path / "ckpt2")], loop.env)
        line = re.search(r"on (\d+) streams; .* ms in copy-on-write hooks \(longest [\d.]+ ms\), cut held launches "
                         r"and copies ([\d.]+) ms(;|$)", r.stdout)
        assert line and float(line[2]) >= 20 * int(line[1]), r.stdout
    finally:
        code, _, err = loop.finish()
    assert code == 0, err


def test_a_job_killed_while_egpu_restore_checks_its_checkpoint_is_said_to_have_exited(cow_stub, tmp_path, monkeypatch):
    """egpu restore reads every byte of the checkpoint before it asks the job (seconds for a big one): a job
    killed meanwhile left its socket with nobody listening, and egpu said 'no egpu session in process N' as
    of a pid that never had one (a sweep)."""
    from typer.testing import CliRunner

    import launcher
    from egpu_preload.cow import remote
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    loop = Loop(cow_stub, tmp_path)
    try:
        assert egpu(["checkpoint", str(loop.pid), str(tmp_path / "ckpt")], loop.env).returncode == 0

        def killed_meanwhile(directory: Path) -> Path:
            os.kill(loop.pid, signal.SIGKILL)
            return checked(directory)
        checked = remote.checked
        monkeypatch.setattr(remote, "checked", killed_meanwhile)
        r = CliRunner().invoke(launcher.egpu, ["restore", str(loop.pid), str(tmp_path / "ckpt")])
        assert (r.exit_code, r.stderr) == (1, f"egpu: process {loop.pid} exited during restore\n"), r.stderr
    finally:
        code, _, _ = loop.finish()
    assert code == 128 + signal.SIGKILL   # egpu-run passes the job's end through


def test_a_checkpoint_never_copies_an_allocation_freed_before_its_cut(cow_stub, tmp_path, monkeypatch):
    """app_cow churn frees a buffer and allocates another every 50 steps (~20 ms). The stop-the-world
    comparison waits 0.2 s between reading the allocation table and the cut: the buffer read there was freed
    before the cut (on a GPU its address may be another's by then), yet it was copied into the checkpoint,
    and the buffer live at the cut left out. The cut is taken again, and refused after as many tries, with
    the job running on; a checkpoint without the wait goes through."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    loop = Loop(cow_stub, tmp_path, mode="churn")
    try:
        r = egpu(["checkpoint", str(loop.pid), str(tmp_path / "stw"), "--compare-stop-the-world"], loop.env)
        assert r.returncode == 1 and r.stderr.strip() == (
            f"egpu: process {loop.pid}: the job's allocations at the cut were not those read just before, 3 "
            "times (it allocates or frees all the time): try again (nothing was saved)"), r.stdout + r.stderr
        assert not (tmp_path / "stw").exists()
        log = loop.log.read_text()
        freed, copied = (set(re.findall(pattern, log)) for pattern in (r"cuMemFree_v2 ptr=(\S+)",
                                                                         r"cuMemcpyAsync dst=\S+ src=(\S+)"))
        assert not freed & copied
        r = egpu(["checkpoint", str(loop.pid), str(tmp_path / "ckpt")], loop.env)
        assert r.returncode == 0 and ": 5 allocations" in r.stdout, r.stdout + r.stderr
    finally:
        code, out, err = loop.finish()
    assert code == 0 and "result=0" in out, err


def test_a_child_forked_in_c_runs_its_hooks_and_answers_on_its_own_socket(cow_stub, tmp_path, monkeypatch):
    """app_safety forks (C fork(), after CUDA and Python are up) while another of its threads holds the
    launch gate in a swap whose drain the stand-in holds: the child's own launches, allocations and copies
    go on (the gate, locks and rings it inherited are reset), its own control socket answers (egpu ps
    lists it), and a checkpoint of it goes through (its cut holds and drains its own gate)."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    loop = Loop(cow_stub, tmp_path, cow_stub.dir / "app_safety", "fork", sessions=2)
    try:
        parent = int(loop.log.read_text().split(" ", 1)[0])  # the first to reach the driver
        child = next(p for p in loop.pids if p != parent)
        steps = lambda: loop.log.read_text().count(f"{child} cuLaunchKernel")  # noqa: E731
        before = steps()
        deadline = time.monotonic() + 30   # a launch more: 0.3 s need not hold one on a loaded machine
        while steps() == before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert steps() > before, "the child's launches stopped"
        r = egpu(["checkpoint", str(child), str(tmp_path / "ckpt")], loop.env)
        assert r.returncode == 0 and f"checkpoint of {child}" in r.stdout, r.stdout + r.stderr
    finally:
        code, out, err = loop.finish()
    assert code == 0 and "child exit=0" in out and "swap=0" in out, out + err


def _offset_of_launches() -> int:
    """Where driver_more.c puts app_cow's global: its module's id and its declaration's place."""
    text = (MORE / "app_cow.c").read_text()
    ptx = re.search(r'PTX\[\] =\n((?:\s*".*"\n?)+);', text)[1]
    src = "".join(json.loads(s) for s in re.findall(r'"(?:[^"\\]|\\.)*"', ptx))
    return src.index(" launches[")


@pytest.mark.parametrize("damage, reason", [
    (lambda d: (d / "manifest.json").unlink(), "manifest.json missing"),
    (lambda d: (d / "alloc-000001.bin").write_bytes(b"x"), "alloc-000001.bin: 1 bytes, the manifest says 64"),
    (lambda d: d.rename(d.with_name(d.name + ".tmp")), "an interrupted checkpoint"),
])
def test_a_damaged_checkpoint_is_refused_before_the_job_starts(cow_stub, tmp_path, damage, reason):
    d = tmp_path / "ckpt"
    with snapshot.SnapshotWriter(d, pid=1, argv=["app"], cut={0: 1}) as w:
        from egpu_preload.cow.allocations import Allocation, AllocKind
        w.add_allocation(Allocation(1, 0x1000, 64, AllocKind.DEVICE), bytes(64))
        w.commit()
    damage(d)
    r = egpu(["--restore", str(d), str(cow_stub.app), "resume"], cow_stub.env(tmp_path / "log"), "run_main")
    assert r.returncode == 125 and reason in r.stderr, r.stderr
    assert not (tmp_path / "log").exists()   # the job never reached the driver


def test_a_checkpoint_of_a_job_that_allocated_nothing_is_put_back_at_the_first_launch(cow_stub, tmp_path, monkeypatch):
    """app_loop makes no allocation, only its module's globals (launches, increment): its checkpoint has
    none, and the re-run's trigger, armed at one allocation, never fired."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    app = tmp_path / "app_loop"
    subprocess.run(["gcc", "-O1", "-Wall", "-Werror", str(MORE / "app_loop.c"), "-o", str(app), "-ldl"], check=True)
    loop = Loop(cow_stub, tmp_path, app, args=(str(tmp_path / "stop"), "60"))
    ckpt = tmp_path / "ckpt"
    try:
        r = egpu(["checkpoint", str(loop.pid), str(ckpt)], loop.env)
        assert r.returncode == 0 and ": 0 allocations, 2 globals" in r.stdout, r.stdout + r.stderr
    finally:
        loop.finish()
    state = int.from_bytes((ckpt / next(g.file for g in snapshot.load(ckpt).globals if g.symbol == "launches"))
                           .read_bytes(), "little")
    (tmp_path / "stop").unlink()
    r = egpu(["--restore", str(ckpt), str(app), str(tmp_path / "stop"), "1"], loop.env, "run_main")
    assert r.returncode == 0 and f"egpu: restored {ckpt}: 0 allocations, 2 globals" in r.stderr, r.stderr
    launches, now = map(int, re.search(r"launches=(\d+) state=(\d+)", r.stdout).groups())
    assert now == state + launches > 1000 + launches, r.stdout


def test_a_restore_the_job_never_reached_is_said_at_exit(cow_stub, tmp_path):
    """A checkpoint of 10 allocations into app_cow resume, which makes 5: the trigger never fires, and the
    job ran from its start with no word of it."""
    from egpu_preload.cow.allocations import Allocation, AllocKind
    d = tmp_path / "ckpt"
    with snapshot.SnapshotWriter(d, pid=1, argv=["app"], cut={0: 1}) as w:
        w.add_allocation(Allocation(9, 0x1000, 64, AllocKind.DEVICE), bytes(64))
        w.commit()
    r = egpu(["--restore", str(d), str(cow_stub.app), "resume"], cow_stub.env(tmp_path / "log"), "run_main")
    assert r.returncode == 0 and "counter 0 result 0" in r.stdout, r.stdout + r.stderr
    assert r.stderr.strip() == (f"egpu: --restore {d} was never put back: the job made 5 allocations, the checkpoint "
                                "is put back at the first launch after 10 (a checkpoint of other arguments?); the "
                                "job ran from its start"), r.stderr


@pytest.mark.parametrize("job", ["records", "no-cuda"])
def test_a_restore_into_a_job_that_loads_no_module_is_said_at_exit(cow_stub, tmp_path, job):
    """The runtime started at the first module load, so a job that loaded none (app_cow records: 3 allocations,
    no module) or never used CUDA (/bin/true) exited 0 with no word that the checkpoint was never put back."""
    from egpu_preload.cow.allocations import Allocation, AllocKind
    d = tmp_path / "ckpt"
    with snapshot.SnapshotWriter(d, pid=1, argv=["app"], cut={0: 1}) as w:
        w.add_allocation(Allocation(9, 0x1000, 64, AllocKind.DEVICE), bytes(64))
        w.commit()
    cmd = [str(cow_stub.app), "records"] if job == "records" else ["/bin/true"]
    r = egpu(["--restore", str(d), "--restore-other-build", *cmd], cow_stub.env(tmp_path / "log"), "run_main")
    want = (f"egpu: --restore {d} was never put back: the job made 3 allocations" if job == "records" else
            f"egpu-run: --restore {d} was never put back: no process of the job started CUDA")
    assert r.returncode == 0 and r.stderr.startswith(want), r.stderr


def _one_buffer(d: Path, program: snapshot.Program | None) -> None:
    """A checkpoint of allocation #0, 64 bytes: app_cow resume's first buffer has that size."""
    from egpu_preload.cow.allocations import Allocation, AllocKind
    with snapshot.SnapshotWriter(d, pid=1, argv=["app"], cut={0: 1}, program=program) as w:
        w.add_allocation(Allocation(0, 0x1000, 64, AllocKind.DEVICE), (7).to_bytes(8, "little") * WORDS)
        w.commit()


def test_a_checkpoint_of_another_executable_is_refused_unless_asked(cow_stub, tmp_path):
    """Its allocation matches app_cow's first one by number, size and kind: only the executable tells them
    apart, and without that check its bytes went into app_cow's buffer."""
    d, env = tmp_path / "ckpt", cow_stub.env(tmp_path / "log")
    _one_buffer(d, snapshot.Program("/opt/other/app", "ab" * 32))
    r = egpu(["--restore", str(d), str(cow_stub.app), "resume"], env, "run_main")
    assert r.returncode == 1 and "buffer 0" not in r.stdout, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "egpu" in ln]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith(f"egpu: --restore refused: {d}: a checkpoint of /opt/other/app (sha256 abababababab), "
                               f"and this job runs another program, {cow_stub.app} (sha256 "), lines
    r = egpu(["--restore", str(d), "--restore-other-build", str(cow_stub.app), "resume"], env, "run_main")
    assert r.returncode == 0 and f"egpu: restored {d}: 1 allocations" in r.stderr, r.stderr
    assert "buffer 0 7\n" in r.stdout, r.stdout


def test_a_copy_of_the_executable_elsewhere_is_the_same_program(cow_stub, tmp_path):
    import hashlib
    app = tmp_path / "app_cow"
    shutil.copy2(cow_stub.app, app)
    d = tmp_path / "ckpt"
    _one_buffer(d, snapshot.Program(str(cow_stub.app), hashlib.sha256(app.read_bytes()).hexdigest()))
    r = egpu(["--restore", str(d), str(app), "resume"], cow_stub.env(tmp_path / "log"), "run_main")
    assert r.returncode == 0 and "buffer 0 7\n" in r.stdout, r.stdout + r.stderr


# ---- the hooks' ABI -----------------------------------------------------------------------------

ABI_CHECK = r"""
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cstddef>
#include <cstdio>
#include <type_traits>
namespace egpu {
#include "egpu_shim.h"
#include "egpu_cow.h"
#define X(sym, api, ver, ptsz, params) typedef CUresult sym##_t params;
EGPU_COW_HOOKS(X)
#undef X
}
template <typename T> char cls() {
    return std::is_floating_point<T>::value ? 'f' : std::is_pointer<T>::value ? 'p' : 'i';
}
template <typename R, typename... A> void sig(const char *who, const char *name, R (*)(A...)) {
    std::printf("%s %s %c%zu", who, name, cls<R>(), sizeof(R));
    ((std::printf(" %c%zu", cls<A>(), sizeof(A))), ...);
    std::printf("\n");
}
#define PFN_SEL(base, ptsz) PFN_SEL_##ptsz(base)
#define PFN_SEL_0(base) base
#define PFN_SEL_1(base) base##_ptsz
#define PFN_SEL_2(base) base##_ptds
#define FIELD(a, b, f) std::printf("field %s.%s %zu %zu\n", #b, #f, offsetof(egpu::a, f), offsetof(::b, f));
int main() {
#define X(sym, api, ver, ptsz, params) sig("ours", #sym, (egpu::sym##_t *)nullptr); \
    sig("cuda", #sym, (PFN_SEL(PFN_##api##_v##ver, ptsz))nullptr);
    EGPU_COW_HOOKS(X)
    std::printf("size 2D %zu %zu\n", sizeof(egpu::CUDA_MEMCPY2D), sizeof(::CUDA_MEMCPY2D));
    std::printf("size 3D %zu %zu\n", sizeof(egpu::CUDA_MEMCPY3D), sizeof(::CUDA_MEMCPY3D_PEER));
    FIELD(CUDA_MEMCPY2D, CUDA_MEMCPY2D, dstDevice) FIELD(CUDA_MEMCPY2D, CUDA_MEMCPY2D, Height)
    FIELD(CUDA_MEMCPY3D, CUDA_MEMCPY3D_PEER, dstDevice) FIELD(CUDA_MEMCPY3D, CUDA_MEMCPY3D_PEER, dstHeight)
    FIELD(CUDA_MEMCPY3D, CUDA_MEMCPY3D_PEER, Depth) FIELD(CUDA_MEMCPY3D, CUDA_MEMCPY3D, dstPitch)
    FIELD(CUDA_MEMCPY3D, CUDA_MEMCPY3D, srcMemoryType)
}
"""


@pytest.mark.skipif(not CUDA_H.exists() or not shutil.which("g++"), reason="needs cuda.h and g++")
def test_cow_hook_prototypes_match_cuda_h(tmp_path):
    """Every row of EGPU_COW_HOOKS has the ABI of cudaTypedefs.h's PFN_<api>_v<version>[_ptsz|_ptds] (which
    pins its version too), and the copy descriptors line up with cuda.h's."""
    (tmp_path / "abi.cpp").write_text(ABI_CHECK)
    subprocess.run(["g++", "-std=c++17", "-I", str(CUDA_H.parent), "-I", str(ROOT / "shim"), "abi.cpp", "-o", "abi"],
                   cwd=tmp_path, check=True)
    out = subprocess.run([str(tmp_path / "abi")], capture_output=True, text=True, check=True).stdout
    ours = [ln.split(" ", 1)[1] for ln in out.splitlines() if ln.startswith("ours ")]
    cuda = [ln.split(" ", 1)[1] for ln in out.splitlines() if ln.startswith("cuda ")]
    assert len(ours) == 67 and ours == cuda
    for ln in out.splitlines():
        if ln.startswith(("size ", "field ")):
            a, b = ln.split()[-2:]
            assert a == b, ln
