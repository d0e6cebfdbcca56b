"""Live control end to end against the stand-in driver: a job started by egpu-run with no probe
(tests/runtime_stub/app_loop.c, launching every millisecond) takes attach, swap and detach through the
egpu CLI; the stand-in's log shows which module every launch ran and what reached the driver; the
job's own __device__ state (bumped by the stand-in at every launch of the module, by a __constant__)
must come through every swap, and so must what the job writes into both while a copy serves. The
maps while the job runs (egpu maps, --mirror, --interval, --prometheus), those its launch probes fill on
the host (in C or on the Python VM) as the exit dump merges them. Plus the ways it can go wrong: a bad
probe, a pid without egpu, stale sockets, malformed and oversized control messages."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from egpu_preload.bpf import ctx as C
from egpu_preload.control import MAX_FRAME, ControlClient, ControlError, list_sessions
from stub_job import MORE, ROOT
from test_control import _raw, _reply, _req, _send_body

MODULE_LOAD = re.compile(r"cu(?:ModuleLoadData(?:Ex)?|LibraryLoadData) module=(\d+)")
LAUNCH = re.compile(r"cuLaunchKernel f=step@(\d+)k? .* params=([\d,]*)")
UNLOAD = re.compile(r"cu(?:ModuleUnload|LibraryUnload) module=(\d+)")


def egpu(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import launcher; launcher.egpu_main()", *args], env=env,
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


class Job:
    """app_loop under egpu-run with no probe, until ``finish``."""

    def __init__(self, stub_job, tmp: Path, library: bool = False, options: tuple[str, ...] = (),
                 args: tuple[str, ...] = (), **env: str) -> None:
        self.log, self.stop, self.out, self.library = tmp / "log", tmp / "stop", tmp / "job.out", library
        self.env = stub_job.env(self.log, **env)
        self.dir = tmp / "egpu"
        with self.out.open("w") as out:   # a file, which the test reads while the job runs (printed)
            self.proc = subprocess.Popen([sys.executable, "-c", "import launcher; launcher.run_main()", *options,
                                          str(stub_job.loop), str(self.stop), "600",
                                          *(["library"] if library else []), *args],
                                         env=self.env, cwd=ROOT, stdout=out, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = [s for s in list_sessions(self.dir) if s.info and str(stub_job.loop) in s.info["argv"]]
            if found and self.launches() > 10:
                self.pid = found[0].pid
                return
            time.sleep(0.05)
        self.stop.touch()   # app_loop, egpu-run's child, holds its stderr: a kill alone left communicate() its 600 s
        self.proc.kill()
        sessions = [(s.pid, s.info) for s in list_sessions(self.dir)]
        raise AssertionError(f"no session, or under 11 launches, in 60 s: {self.proc.communicate(timeout=30)}, "
                             f"sessions {sessions}, {self.launches()} launches")

    def launches(self) -> int:
        return len(LAUNCH.findall(self.log.read_text())) if self.log.exists() else 0

    def wait_launches(self, n: int = 20) -> None:
        """Let at least ``n`` more launches happen."""
        target = self.launches() + n
        deadline = time.monotonic() + 20
        while self.launches() < target and time.monotonic() < deadline:
            time.sleep(0.01)

    def printed(self, pattern: str, n: int) -> None:
        """Wait (up to 30 s) until the job printed ``n`` lines that match ``pattern``."""
        deadline = time.monotonic() + 30
        while len(re.findall(pattern, self.out.read_text(), re.M)) < n and time.monotonic() < deadline:
            time.sleep(0.05)

    def finish(self) -> tuple[int, str, str]:
        self.stop.touch()
        _, err = self.proc.communicate(timeout=30)
        return self.proc.returncode, self.out.read_text(), err

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, *exc: object) -> None:
        """A job the test left running (it failed before finish()) is stopped."""
        if self.proc.poll() is None:
            self.finish()


@pytest.fixture(params=["module"])
def job(stub_job, tmp_path, monkeypatch, request):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with Job(stub_job, tmp_path, library=request.param == "library") as j:
        yield j


@pytest.fixture
def probes(probe_obj, tmp_path) -> dict[str, Path]:
    """count.bpf.o and hash_count.bpf.o under their plain names (the names they attach as)."""
    out = {}
    for name in ("count", "hash_count"):
        out[name] = tmp_path / f"{name}.bpf.o"
        out[name].write_bytes(probe_obj(name).read_bytes())
    return out


def flip_at(line: str) -> int:
    return int(re.search(r"flip at launch (\d+)", line).group(1))


@pytest.mark.parametrize("job", ["module", "library"], indirect=True)
def test_attach_swap_detach_through_the_cli(job, probes):
    ps = egpu(["ps"], job.env)
    assert ps.returncode == 0, ps.stderr
    row = next(ln for ln in ps.stdout.splitlines() if ln.split()[0] == str(job.pid))
    assert row.split()[1] == "-" and "app_loop" in row
    untouched = egpu(["modules", str(job.pid)], job.env)
    api = "LIBRARY_LOAD_DATA" if job.library else "MODULE_LOAD_DATA"
    assert (untouched.returncode, untouched.stdout.splitlines()) == \
        (0, [f"{api} ptx: untouched", "  step: untouched (no probe matches)"])

    attach = egpu(["attach", str(job.pid), "-p", str(probes["count"])], job.env)
    assert attach.returncode == 0, attach.stderr
    assert attach.stdout.startswith(f"attached count in {job.pid}: PTX 1 modules, 1 kernels instrumented; "
                                    "SASS unchanged: ")
    # the job was started with the default --backend auto (it said "the job runs --backend ptx"): what
    # auto became, and why
    assert "SASS unchanged: --backend auto ran the job as ptx: no probe given at its start patches kernels, " \
           "and no --live-sass kept the Compute Sanitizer loaded (start the job with egpu-run --live-sass " \
           "to attach into SASS-only kernels); flip at" in attach.stdout, attach.stdout
    assert re.search(r" ms \(verify [\d.]+, maps [\d.]+, instrument [\d.]+, sass [\d.]+, flip [\d.]+, publish [\d.]+, "
                     r"unload [\d.]+, gc [\d.]+\)$", attach.stdout.strip())
    job.wait_launches()
    modules = egpu(["modules", str(job.pid)], job.env)
    assert modules.stdout.splitlines() == [f"{api} ptx: instrumented [count]", "  step: instrumented"]
    assert egpu(["ps"], job.env).stdout.count(" count ") == 1
    maps = egpu(["maps", str(job.pid)], job.env)
    assert (maps.returncode, maps.stdout) == (0, "@counts: 0\n")  # the stand-in runs no kernel
    doc = json.loads(egpu(["maps", str(job.pid), "--json"], job.env).stdout)
    assert doc["pid"] == job.pid and doc["maps"] == {"counts": {"kind": "scalar", "value": 0}}

    swap = egpu(["swap", str(job.pid), "count", str(probes["hash_count"])], job.env)
    assert swap.returncode == 0, swap.stderr
    assert swap.stderr.startswith(f"swapped count -> hash_count in {job.pid}: PTX 1 modules, 1 kernels")
    assert swap.stdout == "@counts: 0\n"   # count's final maps, as a detach prints them
    job.wait_launches()
    detach = egpu(["detach", str(job.pid)], job.env)
    assert detach.returncode == 0, detach.stderr
    assert detach.stderr.startswith(f"detached hash_count in {job.pid}: PTX 1 modules, 0 kernels")
    job.wait_launches()
    assert egpu(["modules", str(job.pid)], job.env).stdout.splitlines()[0] == f"{api} ptx: untouched"
    status, out, err = job.finish()
    assert status == 0, err

    # What the driver saw: the app's module 1, then each probe's instrumented copy (its map table
    # filled), then module 1 again; each launch of the copies carries the launch id.
    log = job.log.read_text()
    first, copy1, copy2 = (int(m) for m in MODULE_LOAD.findall(log))
    assert first == 1 and len({first, copy1, copy2}) == 3
    get_global = "cuLibraryGetGlobal" if job.library else "cuModuleGetGlobal_v2"
    assert re.search(rf"{get_global} module={copy1} name=__egpu_maps_\w+ found=1", log)
    assert re.search(rf"{get_global} module={copy2} name=__egpu_maps_\w+ found=1", log)
    runs = [(int(m), p) for m, p in LAUNCH.findall(log)]
    order = [m for i, (m, _) in enumerate(runs) if i == 0 or runs[i - 1][0] != m]
    assert order == [first, copy1, copy2, first]  # each flip once, never back and forth
    assert all(len(p.split(",")) == (2 if m != first else 1) for m, p in runs)
    assert all(int(p.split(",")[1]) == i + 1 for i, (m, p) in enumerate(runs) if m != first)  # launch ids
    # Exact windows: the flip's launch counter splits the launches.
    per_module = Counter(m for m, _ in runs)
    a, s, d = flip_at(attach.stdout), flip_at(swap.stderr), flip_at(detach.stderr)
    assert (per_module[copy1], per_module[copy2], per_module[first]) == (s - a, d - s, len(runs) - (d - a))
    # __device__ state went app -> copy1 -> copy2 -> app: 1000 + every launch.
    launches = int(re.search(r"launches=(\d+)", out).group(1))
    assert launches == len(runs) and f"state={1000 + launches} result=0" in out


def runs_and_order(log: Path) -> tuple[list[int], list[int]]:
    """The module every launch ran, and the order the modules served in (each run of launches once)."""
    runs = [int(m) for m, _ in LAUNCH.findall(log.read_text())]
    return runs, [m for i, m in enumerate(runs) if i == 0 or runs[i - 1] != m]


@pytest.mark.parametrize("library", [False, True])
def test_symbol_writes_while_a_copy_serves_reach_its_kernels_and_the_next_swap(stub_job, tmp_path, monkeypatch,
                                                                              probes, library):
    """Between the attach and a swap, while a copy serves, app_loop writes its __device__ state (5000)
    and its __constant__ increment (3) as cudaMemcpyToSymbol does: the address of its own module's
    variable, then cuMemcpyHtoD. The copy's kernels count by 3 from the next launch, the swap and the
    detach carry both on, and at the end the app reads back exactly what it wrote plus the launches since."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    write = tmp_path / "write"
    job = Job(stub_job, tmp_path, library=library, args=(f"write:{write}",))
    with job:
        assert egpu(["attach", str(job.pid), "-p", str(probes["count"])], job.env).returncode == 0
        job.wait_launches()
        trigger(write)
        job.wait_launches()
        assert egpu(["swap", str(job.pid), "count", str(probes["hash_count"])], job.env).returncode == 0
        job.wait_launches()
        assert egpu(["detach", str(job.pid)], job.env).returncode == 0
        job.wait_launches()
        status, out, err = job.finish()
    assert status == 0, err
    runs, order = runs_and_order(job.log)
    assert len(order) == 4 and order[0] == order[3]  # app, copy 1, copy 2, app
    launches = int(re.search(r"launches=(\d+)", out).group(1))
    wrote = re.search(r"^app_loop wrote=(\d) before=(\d+) increment=(\d+)$", out, re.M)
    assert wrote and wrote.group(1, 3) == ("1", "3"), out  # the __constant__ as the app wrote it
    before = int(wrote.group(2))
    assert launches == len(runs) and runs[before] == order[1]  # written while copy 1 served
    assert f"state={5000 + 3 * (launches - before)} result=0" in out


def test_swap_and_detach_reply_with_the_maps_as_the_flip_left_them(stub_job, tmp_path, monkeypatch, probes):
    """count swapped for count: the same map, so the new probe takes its region over and goes on counting
    there. The stand-in adds 1 to it at every launch of an instrumented copy (EGPU_STUB_PROBE_COUNTS):
    the swap's final counts are exactly the launches the old copy ran (not those the new one ran before
    the reply was read), the detach's those of both copies."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    job = Job(stub_job, tmp_path, EGPU_STUB_PROBE_COUNTS="1")
    with job:
        client = ControlClient(job.pid, directory=job.dir, timeout=30)
        obj = probes["count"].read_bytes()
        counts = []
        for _ in range(5):
            client.request("attach", probe=obj, name="a")
            job.wait_launches(5)
            swap = client.request("swap", old="a", new_probe=obj, new_name="b")
            job.wait_launches(5)
            detach = client.request("detach")
            counts.append([int.from_bytes(r["final"][0]["maps"][0]["values"][0], "little") for r in (swap, detach)])
            # where a flip's time goes, in the reply: a probe loaded for swap, none for detach; the
            # interpreter's collections (gc) overlap the others
            phases = {"instrument", "sass", "flip", "publish", "unload", "gc"}
            assert set(swap["phases_ms"]) == {"verify", "maps"} | phases
            assert set(detach["phases_ms"]) == phases
            for r in (swap, detach):
                assert all(v >= 0 for v in r["phases_ms"].values())
                assert sum(v for k, v in r["phases_ms"].items() if k != "gc") <= 1e3 * r["seconds"] + 0.01
                # the new probes run from the flip on: before the publish and unload that end the reply
                phases = r["phases_ms"]
                after = phases["publish"] + phases["unload"]
                assert phases["flip"] <= r["to_flip_ms"] <= 1e3 * r["seconds"] - after + 0.01
        status, _, err = job.finish()
    assert status == 0, err
    runs = [int(m) for m, _ in LAUNCH.findall(job.log.read_text())]
    first = runs[0]
    copies = [m for i, m in enumerate(runs) if m != first and runs[i - 1] != m]  # a, b, a, b, ... in order
    per_copy = Counter(runs)
    assert len(copies) == 10 and len(set(copies)) == 10
    assert counts == [[per_copy[a], per_copy[a] + per_copy[b]] for a, b in zip(copies[::2], copies[1::2])]


class Log:
    """The stand-in's log of a finished job: where each module was loaded and unloaded, every launch."""

    def __init__(self, path: Path) -> None:
        self.lines = [ln.split(" ", 1)[1] for ln in path.read_text().splitlines()]  # without the pid
        self.loads = self._find(MODULE_LOAD)
        self.unloads = self._find(UNLOAD)
        self.launches = self._find(LAUNCH)

    def _find(self, pattern: re.Pattern) -> list[tuple[int, int]]:
        """(line, module) of every line ``pattern`` matches."""
        return [(i, int(m.group(1))) for i, ln in enumerate(self.lines) if (m := pattern.search(ln))]

    def order(self) -> list[int]:
        """The modules in the order they served (each run of launches once)."""
        runs = [m for _, m in self.launches]
        return [m for i, m in enumerate(runs) if i == 0 or runs[i - 1] != m]

    def held(self) -> int:
        """Device allocations not freed (the stand-in logs each allocation's size, each free's pointer)."""
        return sum(1 for ln in self.lines if re.match(r"cuMemAlloc_v2 size=\d+$", ln)) - \
            sum(1 for ln in self.lines if ln.startswith("cuMemFree_v2 "))

    def events(self) -> list[str]:
        """"load M" and "unload M", in the order the driver saw them."""
        return [e for _, e in sorted([(i, f"load {m}") for i, m in self.loads] +
                                     [(i, f"unload {m}") for i, m in self.unloads])]



def trigger(path: Path) -> None:
    """Create ``path`` and wait (up to 20 s) until app_loop made PATH.done: the action it triggers is done."""
    path.touch()
    deadline = time.monotonic() + 20
    while not path.with_name(f"{path.name}.done").exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def cycle(job: Job, steps: list[tuple[str | Path, dict]]) -> tuple[list[dict], str]:
    """Send each (command, fields) to the job, letting it launch between them; a Path instead of a
    command is created, and waited for until app_loop made PATH.done. The replies and the job's output
    once finished (it must exit 0)."""
    client = ControlClient(job.pid, directory=job.dir, timeout=30)
    with job:
        replies = []
        for cmd, fields in steps:
            if isinstance(cmd, Path):
                trigger(cmd)
            else:
                replies.append(client.request(cmd, **fields))
            job.wait_launches(10)
        status, out, err = job.finish()
    assert status == 0, err
    return replies, out


def assert_state_carried(out: str, log: Log) -> None:
    """Every launch the job made ran once, on some image, and its __device__ state came through."""
    launches = int(re.search(r"launches=(\d+)", out).group(1))
    assert launches == len(log.launches) and f"state={1000 + launches} result=0" in out


@pytest.mark.parametrize("library", [False, True])
def test_retired_copies_are_unloaded_right_after_their_last_flip(stub_job, tmp_path, monkeypatch, probes, library):
    """attach, detach, attach (the same object: a new probe, the same PTX), swap, detach: the flip that takes the
    launches off a copy made with a probe no longer attached unloads it (cuModuleUnload or
    cuLibraryUnload, once each), in the request that retired it, after its last launch; the job runs
    on as it would have: each copy ran exactly its window of launches, the state carried on."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    images = tmp_path / "images"
    images.mkdir()
    job = Job(stub_job, tmp_path, library=library, EGPU_STUB_IMAGES=str(images))
    count, hash_count = probes["count"].read_bytes(), probes["hash_count"].read_bytes()
    replies, out = cycle(job, [("attach", {"probe": count, "name": "a"}), ("detach", {}),
                               ("attach", {"probe": count, "name": "a"}),
                               ("swap", {"old": "a", "new_probe": hash_count, "new_name": "b"}), ("detach", {})])
    log = Log(job.log)
    first, c1, c2, c3 = [m for _, m in log.loads]
    assert first == 1 and len({c1, c2, c3}) == 3
    # the object attached again makes the same PTX: the driver's JIT cache has its code
    ptx = {m: (images / f"module-{m}.ptx").read_text() for m in (c1, c2, c3)}
    assert ptx[c1] == ptx[c2] != ptx[c3]
    # a swap loads the new copy before its flip, then unloads the old one
    assert log.events() == ["load 1", f"load {c1}", f"unload {c1}", f"load {c2}", f"load {c3}", f"unload {c2}",
                            f"unload {c3}"]
    for at, m in log.unloads:
        assert max(i for i, n in log.launches if n == m) < at  # never while it served
    unload = "cuLibraryUnload" if library else "cuModuleUnload"
    assert all(log.lines[i].split()[0] == unload for i, _ in log.unloads)
    assert [r["unloaded"] for r in replies] == [0, 1, 0, 1, 1]
    assert log.order() == [first, c1, first, c2, c3, first]
    a1, d1, a2, s, d2 = (r["launches"] for r in replies)
    per_module = Counter(m for _, m in log.launches)
    assert [per_module[c] for c in (c1, c2, c3)] == [d1 - a1, s - a2, d2 - s]
    assert_state_carried(out, log)


def test_changes_free_the_regions_of_the_probes_they_retire(stub_job, tmp_path, monkeypatch, probes):
    """Attach and detach, attach and swap (to a probe that takes the map over, then to one that takes
    nothing), again and again: every region a probe's maps (and trace ring) took and every copy a flip
    made of them is freed once the change that retired it is done, but what the probe attached now holds
    (they were kept until exit: 2 MB of trace ring and a host copy of it per attach)."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    job = Job(stub_job, tmp_path)
    count, hash_count = probes["count"].read_bytes(), probes["hash_count"].read_bytes()
    steps = [("attach", {"probe": count, "name": "a"}), ("detach", {}),
             ("attach", {"probe": count, "name": "a"}), ("swap", {"old": "a", "new_probe": count, "new_name": "b"}),
             ("swap", {"old": "b", "new_probe": hash_count, "new_name": "c"})]
    with job:
        client = ControlClient(job.pid, directory=job.dir, timeout=30)
        for _ in range(3):
            for cmd, fields in steps:
                client.request(cmd, **fields)
            assert Log(job.log).held() == 2   # c's map and trace ring
            client.request("detach")
            assert Log(job.log).held() == 0
        status, out, err = job.finish()
    assert status == 0, err
    assert_state_carried(out, Log(job.log))


def test_the_original_loaded_beside_stays_for_the_next_detach(stub_job, tmp_path, monkeypatch, probes):
    """A probe loaded at start, detached: the original PTX loaded beside (a copy with no probe) serves.
    A probe attached and detached again: its copy goes, the original copy serves again, never unloaded."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    # --in-kernel: the count probe in the kernel, so the application's module is replaced (not counted at the launch)
    job = Job(stub_job, tmp_path, options=("--in-kernel", "-p", str(probes["count"])))
    hash_count = probes["hash_count"].read_bytes()
    replies, out = cycle(job, [("detach", {}), ("attach", {"probe": hash_count, "name": "h"}), ("detach", {}),
                               ("attach", {"probe": hash_count, "name": "h"}), ("detach", {})])
    log = Log(job.log)
    assert log.events() == ["load 1", "load 2", "load 3", "unload 3", "load 4", "unload 4"]
    assert log.order() == [1, 2, 3, 2, 4, 2]
    assert [r["unloaded"] for r in replies] == [0, 0, 1, 0, 1]
    launches = int(re.search(r"launches=(\d+)", out).group(1))
    assert launches == len(log.launches) and "result=0" in out


@pytest.mark.parametrize("how", ["graph", "capture"])
def test_a_copy_that_escaped_the_hooks_stays_loaded(stub_job, tmp_path, monkeypatch, probes, how):
    """While the first copy serves, app_loop gives `step` to a graph kernel node (graph:), or captures a
    launch of it on a stream (capture:): the graph holds that copy's function and may launch it at any
    time, so the detach keeps it loaded. The next copy, used by plain launches only, goes at its detach."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    trigger = tmp_path / how
    job = Job(stub_job, tmp_path, args=(f"{how}:{trigger}",))
    count = probes["count"].read_bytes()
    replies, out = cycle(job, [("attach", {"probe": count, "name": "a"}), (trigger, {}), ("detach", {}),
                               ("attach", {"probe": count, "name": "a"}), ("detach", {})])
    log = Log(job.log)
    first, escaped, plain = [m for _, m in log.loads]
    assert log.order() == [first, escaped, first, plain, first]
    assert log.events() == ["load 1", f"load {escaped}", f"load {plain}", f"unload {plain}"]
    assert [r["unloaded"] for r in replies] == [0, 0, 0, 1]
    assert log.held() == 2   # the escaped copy's map table names the first probe's map and trace ring
    if how == "graph":
        assert any(ln.startswith(f"cuGraphAddKernelNode_v2 f=step@{escaped} ") for ln in log.lines)
    else:  # the launch between the begin and the end ran the copy
        begin = log.lines.index("cuStreamBeginCapture_v2 stream=0x5 mode=0")
        end = log.lines.index("cuStreamEndCapture stream=0x5")
        assert [m for i, m in log.launches if begin < i < end] == [escaped]
        assert "stream=0x5" in log.lines[next(i for i, _ in log.launches if begin < i)]
    assert_state_carried(out, log)


def test_no_flip_while_the_application_captures_a_graph(stub_job, tmp_path, monkeypatch, probes):
    """While app_loop holds a stream capture open (hold:), an attach cannot flip: draining the context would
    be refused and would fail the application's capture (the stand-in does both, as the driver). The shim
    refuses before touching anything, the reply says why, and the capture ends well; once it has ended,
    the same attach flips."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    hold = tmp_path / "hold"
    job = Job(stub_job, tmp_path, args=(f"hold:{hold}",))
    count = probes["count"].read_bytes()
    client = ControlClient(job.pid, directory=job.dir, timeout=30)
    with job:
        job.wait_launches(5)
        trigger(hold)
        with pytest.raises(ControlError, match="the application is capturing a CUDA graph"):
            client.request("attach", probe=count, name="a")
        trigger(hold.with_name("hold.end"))
        assert client.request("attach", probe=count, name="a")["failed"] == []
        job.wait_launches(10)
        status, out, err = job.finish()
    assert status == 0, err
    assert "refused" not in Path(job.log).read_text()   # no call of the flip reached the driver mid-capture
    assert_state_carried(out, Log(job.log))


def test_a_flip_whose_drain_never_ends_gives_up_with_the_reason(stub_job, tmp_path, monkeypatch, probes):
    """While the job's work never finishes (stall:, a kernel that never ends), an attach flips nothing: the
    shim gives up at its hold limit, the reply says why, and the job's launches went on meanwhile; once the
    work finishes, the same attach flips and the state came through every launch."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    stall = tmp_path / "stall"
    job = Job(stub_job, tmp_path, args=(f"stall:{stall}",))
    count = probes["count"].read_bytes()
    client = ControlClient(job.pid, directory=job.dir, timeout=30)
    with job:
        trigger(stall)
        with pytest.raises(ControlError,
                           match=r"did not finish within 0.5 s of holding its launches .*nothing changed"):
            client.request("attach", probe=count, name="a")
        job.wait_launches(10)   # never held for good
        trigger(stall.with_name("stall.end"))
        assert client.request("attach", probe=count, name="a")["failed"] == []
        job.wait_launches(10)
        status, out, err = job.finish()
    assert status == 0, err
    assert_state_carried(out, Log(job.log))


def test_a_probe_attached_again_is_not_verified_again(probes, tmp_path, monkeypatch):
    """The same object under the same name: loaded, verified and translated once (while among the last
    VERIFIED_KEPT), yet a probe object of its own each time, since copies and maps go by identity."""
    from types import SimpleNamespace

    from egpu_preload.runtime import live
    loads = []
    real = live.load_probe
    monkeypatch.setattr(live, "load_probe", lambda path: loads.append(path) or real(path))
    control = live.Live(SimpleNamespace(probes=[], cfg=SimpleNamespace(session=tmp_path)))
    data = probes["count"].read_bytes()
    first, again = control._load(data, "a"), control._load(data, "a")
    assert first is not again and first == again and first.specs is again.specs and len(loads) == 1
    assert control._load(data, "b").table != first.table and len(loads) == 2   # another name: its own symbols
    for i in range(live.VERIFIED_KEPT):
        control._load(data, f"n{i}")
    reloaded = control._load(data, "a")   # "a" had gone out: loaded again, under the same names
    assert (reloaded.path, reloaded.table) == (first.path, first.table) and len(loads) == 3 + live.VERIFIED_KEPT


def test_a_bad_probe_is_refused_and_the_job_runs_on(job, tmp_path):
    bad = tmp_path / "bad.bpf.o"
    bad.write_bytes(b"\x7fELF not really")
    r = egpu(["attach", str(job.pid), "-p", str(bad)], job.env)
    assert r.returncode == 1 and r.stderr.startswith("egpu: ") and str(bad) in r.stderr
    assert len(r.stderr.splitlines()) == 1
    # Sent anyway (skipping the local check): the process refuses it the same way.
    with pytest.raises(Exception, match="bad.bpf.o"):
        ControlClient(job.pid, directory=job.dir).request("attach", probe=bad.read_bytes(), name="bad")
    with pytest.raises(Exception, match="bad probe name"):
        ControlClient(job.pid, directory=job.dir).request("attach", probe=b"", name="../x")
    job.wait_launches()
    assert egpu(["modules", str(job.pid)], job.env).stdout.splitlines()[0] == "MODULE_LOAD_DATA ptx: untouched"
    status, out, _ = job.finish()
    launches = int(re.search(r"launches=(\d+)", out).group(1))
    assert status == 0 and f"state={1000 + launches}" in out


@pytest.mark.parametrize("library", [False, True])
@pytest.mark.parametrize("refuse", [False, True])
def test_a_copy_the_driver_refuses_is_reported_with_its_jit_log(stub_job, tmp_path, monkeypatch, probes, library,
                                                                 refuse):
    """A live attach loads its copy with the JIT's error log asked for (Driver.load). Refused (the stand-in's JIT
    refuses the copy's launch id parameter with a ptxas log), the attach's failed line names the log's first
    lines, as a module refused at start-up is reported, and the job runs on uninstrumented; loaded, as before."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    env = {"EGPU_STUB_REFUSE": "__egpu_launch_id"} if refuse else {}
    with Job(stub_job, tmp_path, library=library, **env) as job:
        attach = egpu(["attach", str(job.pid), "-p", str(probes["count"])], job.env)
        assert attach.returncode == 0, attach.stderr
        job.wait_launches()
        modules = egpu(["modules", str(job.pid)], job.env).stdout.splitlines()
        status, out, err = job.finish()
    assert status == 0, err
    api, load = ("LIBRARY_LOAD_DATA", "cuLibraryLoadData") if library else ("MODULE_LOAD_DATA", "cuModuleLoadDataEx")
    loads = re.findall(r"^\d+ (cu(?:ModuleLoadData(?:Ex)?|LibraryLoadData) .*)$", job.log.read_text(), re.M)
    # the application's load, then the copy's, with the error log and its size asked for (options 5, 6)
    copy = f"{load} refused jit=5,6" if refuse else f"{load} module=2 kind=ptx instrumented=0 jit=5,6"
    assert loads == [f"{load.removesuffix('Ex')} module=1 kind=ptx instrumented=0", copy], loads
    failed = [ln for ln in attach.stdout.splitlines() if ln.startswith("  failed: ")]
    if refuse:
        why = (f"  failed: {api} ptx: {load} failed: CUDA_ERROR_STUB: ptxas application ptx input, line {{}}; error : "
               "stand-in refuses '__egpu_launch_id' | ptxas fatal : Ptx assembly aborted due to errors")
        assert len(failed) == 1 and re.fullmatch(re.escape(why).replace(r"\{\}", r"\d+"), failed[0]), attach.stdout
        assert modules[0] == f"{api} ptx: untouched", modules
    else:
        assert failed == [] and modules == [f"{api} ptx: instrumented [count]", "  step: instrumented"], modules


@pytest.mark.parametrize("args, message", [
    (["detach", "{pid}", "nope"], "no probe named nope is attached (attached: none)"),
    (["swap", "{pid}", "nope", "{probe}"], "no probe named nope is attached"),
    (["detach", "{pid}"], "no probe is attached"),
])
def test_refused_requests(job, probe_obj, args, message):
    r = egpu([a.format(pid=job.pid, probe=probe_obj("count")) for a in args], job.env)
    assert r.returncode == 1 and message in r.stderr and len(r.stderr.splitlines()) == 1


def test_a_swap_to_a_probe_that_does_not_compile_says_nothing_changed(job, probes, tmp_path):
    """clang's error, then that the job is as it was (a helper's sweep: the reason alone left it unsaid)."""
    assert egpu(["attach", str(job.pid), "-p", str(probes["count"])], job.env).returncode == 0
    bad = tmp_path / "bad.bpf.c"
    bad.write_text("this is not C\n")
    r = egpu(["swap", str(job.pid), "count", str(bad)], job.env)
    assert r.returncode == 1 and r.stdout == ""
    assert f"; nothing was changed in {job.pid}: what was attached runs on" in r.stderr.splitlines()[0], r.stderr
    assert egpu(["maps", str(job.pid)], job.env).stdout == "@counts: 0\n"
    job.finish()


@pytest.mark.parametrize("job", ["module"], indirect=True)
def test_maps_that_show_nothing_say_so(job, probes):
    """egpu maps with no probe: --json still gives the process's document (its maps none), never an
    empty stdout; with probes whose maps are all empty (no kernel ran them in the stand-in): a line says
    so, where the text itself shows nothing."""
    r = egpu(["maps", str(job.pid), "--json"], job.env)
    doc = json.loads(r.stdout)
    assert (r.returncode, doc["pid"], doc["maps"]) == (0, job.pid, {})
    assert r.stderr == f"egpu: no probe is attached to {job.pid}\n"
    assert egpu(["attach", str(job.pid), "-p", str(probes["hash_count"])], job.env).returncode == 0
    r = egpu(["maps", str(job.pid)], job.env)
    assert (r.returncode, r.stdout) == (0, "")
    assert r.stderr == f"egpu: every map of the probes attached to {job.pid} is empty\n"
    assert json.loads(egpu(["maps", str(job.pid), "--json"], job.env).stdout)["maps"] == {
        "per_kernel": {"kind": "map", "entries": []}}
    job.finish()


@pytest.mark.parametrize("job", ["module"], indirect=True)
def test_final_maps_that_show_nothing_say_so(job, probes):
    """detach and swap print the final maps of the probe they remove: all empty, they printed nothing and
    said nothing of it (egpu maps and egpu-run say so)."""
    assert egpu(["attach", str(job.pid), "-p", str(probes["hash_count"])], job.env).returncode == 0
    r = egpu(["swap", str(job.pid), "hash_count", str(probes["count"])], job.env)
    assert (r.returncode, r.stdout) == (0, ""), r.stderr
    assert r.stderr.splitlines()[1:] == ["egpu: every map of hash_count was empty"], r.stderr
    r = egpu(["detach", str(job.pid)], job.env)
    assert (r.returncode, r.stdout) == (0, "@counts: 0\n") and len(r.stderr.splitlines()) == 1, r.stderr
    job.finish()


@pytest.mark.parametrize("cmd", [["maps"], ["modules"], ["detach"], ["attach", "-p", "PROBE"]])
def test_a_pid_without_egpu(stub_job, probe_obj, tmp_path, cmd):
    env = stub_job.env(tmp_path / "log")
    args = [cmd[0], str(os.getpid())] + [str(probe_obj("count")) if a == "PROBE" else a for a in cmd[1:]]
    r = egpu(args, env)
    assert (r.returncode, r.stderr) == (1, f"egpu: no egpu session in process {os.getpid()}\n")



@pytest.mark.parametrize("job", ["module"], indirect=True)
def test_an_attach_whose_reply_cannot_be_printed_says_it_was_made(job, probes):
    """egpu attach > /dev/full said only "stdout: cannot write" (into a pipe closed, | head -0: nothing) and
    exited 1, as if the attach had failed: tried again, it was refused as attached already."""
    said = f": count was attached to {job.pid} all the same (egpu ps lists the probes attached)\n"
    args = [sys.executable, "-c", "import launcher; launcher.egpu_main()", "attach", str(job.pid), "-p",
            str(probes["count"])]
    with open("/dev/full", "w") as full:
        r = subprocess.run(args, env=job.env, cwd=ROOT, stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert (r.returncode, r.stderr) == (1, "egpu: stdout: cannot write (No space left on device)" + said)
    assert egpu(["detach", str(job.pid)], job.env).returncode == 0
    p = subprocess.Popen(args, env=job.env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.close()   # the reader gone before the reply comes
    assert (p.wait(timeout=60), p.stderr.read()) == (1, "egpu: stdout: cannot write (Broken pipe)" + said)
    assert egpu(["maps", str(job.pid)], job.env).stdout == "@counts: 0\n"
    status, out, _ = job.finish()
    assert status == 0 and "result=0" in out



@pytest.mark.parametrize("reply, version", [({"version": 99, "probes": "?"}, "99"), ({}, "None"), ([1], "None")])
def test_maps_of_a_job_of_another_egpu_are_refused_in_one_line(monkeypatch, reply, version):
    """egpu maps on a job started by another egpu version (its runtime's reply another document): a
    traceback (KeyError, TypeError) as it was rendered, or its maps misread."""
    from typer.testing import CliRunner
    from egpu_preload.control import ControlClient
    from egpu_preload.runtime.dump import VERSION
    from launcher import egpu as cli
    monkeypatch.setattr(ControlClient, "request", lambda self, cmd, **fields: reply)
    r = CliRunner().invoke(cli, ["maps", "7"])
    assert (r.exit_code, r.stdout) == (1, ""), r.output
    assert r.stderr == (f"egpu: process 7: its maps are in a form this egpu does not read (document version {version}, "
                        f"not {VERSION}): a job started by another version of egpu\n")


def test_ps_removes_stale_sockets(stub_job, tmp_path):
    env = stub_job.env(tmp_path / "log")
    d = tmp_path / "egpu"
    d.mkdir(mode=0o700)
    dead = subprocess.Popen(["true"])
    dead.wait()
    for pid in (dead.pid, os.getpid()):  # a process gone; a live one nobody listens for
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(d / f"{pid}.sock"))
    r = egpu(["ps"], env)
    assert (r.returncode, r.stdout.splitlines()) == (0, [f"{'PID':>7}  {'PROBES':<20}  COMMAND"])
    assert list(d.glob("*.sock")) == []


def test_malformed_and_oversized_messages_leave_the_job_alone(job):
    path = job.dir / f"{job.pid}.sock"
    with _raw(path) as s:
        _send_body(s, b"\xc1")
        assert "malformed message" in _reply(s)["error"]
        _send_body(s, _req("swap", old="a", new_probe="text", new_name="b"))
        assert "field new_probe must be bytes" in _reply(s)["error"]
        _send_body(s, _req("ping", rid=5))
        assert _reply(s)["result"]["pid"] == job.pid
    with _raw(path) as s:
        s.sendall((MAX_FRAME + 1).to_bytes(4, "big"))
        assert "exceeds the 16 MiB limit" in _reply(s)["error"]
    assert ControlClient(job.pid, directory=job.dir).request("ping")["probes"] == []
    status, out, _ = job.finish()
    assert status == 0 and "result=0" in out


def test_a_probe_loaded_at_start_is_detached_and_another_attached(stub_job, tmp_path, monkeypatch, probes):
    """The app's own module is the instrumented one: detaching loads the original beside and sends
    launches there, attaching another loads a third copy. (The app's own module keeps the state as of
    the first flip: live.py, module state, says why; not checked here.)"""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    # --in-kernel: the count probe in the kernel, so the application's module is replaced (not counted at the launch)
    job = Job(stub_job, tmp_path, options=("--in-kernel", "--json", "-p", str(probes["count"])))
    modules = egpu(["modules", str(job.pid)], job.env).stdout.splitlines()
    assert modules[0] == "MODULE_LOAD_DATA ptx: instrumented [count]"
    detach = egpu(["detach", str(job.pid), "count"], job.env)
    assert detach.returncode == 0 and detach.stdout == "@counts: 0\n", detach.stderr
    job.wait_launches()
    attach = egpu(["attach", str(job.pid), "-p", str(probes["hash_count"])], job.env)
    assert attach.returncode == 0, attach.stderr
    job.wait_launches()
    status, out, err = job.finish()
    assert status == 0, err
    runs = [(int(m), p) for m, p in LAUNCH.findall(job.log.read_text())]
    order = [m for i, (m, _) in enumerate(runs) if i == 0 or runs[i - 1][0] != m]
    assert order == [1, 2, 3]
    assert {len(p.split(",")) for m, p in runs if m == 2} == {1}   # the original: no launch id
    assert {len(p.split(",")) for m, p in runs if m != 2} == {2}
    assert "result=0" in out
    assert json.loads(out.splitlines()[-1])["maps"] == {"per_kernel": {"kind": "map", "entries": []}}  # attached last


def test_a_job_whose_every_probe_was_detached_says_so_at_exit(stub_job, tmp_path, monkeypatch, probes):
    """No maps at exit because egpu detach took every probe off (and printed their final maps): said so, not
    that no module was instrumented (the detached probe's was)."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    job = Job(stub_job, tmp_path, options=("-p", str(probes["count"])))
    detach = egpu(["detach", str(job.pid), "count"], job.env)
    # every launch before the flip counted, 32 threads each
    assert detach.returncode == 0 and detach.stdout == f"@counts: {32 * flip_at(detach.stderr)}\n", detach.stderr
    status, out, err = job.finish()
    assert status == 0 and "@counts" not in out, err
    assert err.splitlines()[-1] == ("egpu-run: no maps: every probe was detached before the job ended (egpu detach "
                                    "printed their final maps)"), err


def test_a_job_started_without_probes_whose_attached_probe_was_detached_says_so_at_exit(stub_job, tmp_path,
                                                                                       monkeypatch, probes):
    """egpu-run --json CMD, then egpu attach and egpu detach: no maps at exit because the attached probe was
    detached, not because none was given nor attached, as egpu-run said."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    job = Job(stub_job, tmp_path, options=("--json",))
    assert egpu(["attach", str(job.pid), "-p", str(probes["count"])], job.env).returncode == 0
    job.wait_launches()
    assert egpu(["detach", str(job.pid), "count"], job.env).returncode == 0
    status, out, err = job.finish()
    assert status == 0 and "counts" not in out, err
    assert err.splitlines()[-1] == ("egpu-run: no maps: every probe was detached before the job ended (egpu detach "
                                    "printed their final maps)"), err


@pytest.mark.parametrize("as_json", [False, True])
def test_interval_prints_the_maps_while_the_job_runs(stub_job, tmp_path, monkeypatch, probes, as_json):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    job = Job(stub_job, tmp_path, options=("--interval", "0.2", *(["--json"] if as_json else []),
                                           "-p", str(probes["count"])))
    job.printed(r"^\{" if as_json else r"^@counts: \d+$", 2)   # two intervals (1 s need not hold them when loaded)
    status, out, err = job.finish()
    assert status == 0, err
    if as_json:
        docs = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
        counts = [d["maps"]["counts"]["value"] for d in docs]
        assert [d["maps"] for d in docs] == [{"counts": {"kind": "scalar", "value": c}} for c in counts]
        assert {d["pid"] for d in docs} == {job.pid}
    else:
        counts = [int(c) for c in re.findall(r"^@counts: (\d+)$", out, re.M)]
    # every interval, then at exit: counts that only grow, by launches of 32 threads, to the job's every launch
    assert len(counts) >= 3 and counts == sorted(counts) and all(c % 32 == 0 for c in counts), counts
    assert counts[-1] == 32 * int(re.search(r"launches=(\d+)", out)[1]), out


LAUNCH_PROBE = ROOT / "tests" / "probes" / "launch.bpf.c"   # one map, filled by a launch program (on the host)
STEP_LAUNCHES = re.compile(r"^@launches\[step\]: \{ launches: (\d+),", re.M)


def step_launches(doc: dict) -> int:
    """launch.bpf.c's count of step's launches in a maps document (--json)."""
    (entry,) = doc["maps"]["launches"]["entries"]
    return entry["value"]["launches"]


@pytest.mark.parametrize("vm", ["c", "python"])
def test_maps_host_programs_fill_are_read_while_the_job_runs(stub_job, tmp_path, monkeypatch, probe_obj, probes, vm):
    """launch.bpf.c's map is the host's (its launch program runs in C, or on the Python VM), and no module
    makes device maps for it: egpu maps (text, --json) and --mirror show it as egpu-run's exit does, and it
    counts on. An attach of an object with launch programs is refused (live.py, Limits) and changes
    nothing; an attach of a GPU probe makes the device maps, and the host's copy still shows over the
    launch probe's empty device one."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with Job(stub_job, tmp_path, options=("--launch-vm", vm, "--mirror", "0.05", "-p", str(LAUNCH_PROBE))) as job:
        pid = str(job.pid)
        text = egpu(["maps", pid], job.env)
        assert text.returncode == 0 and STEP_LAUNCHES.search(text.stdout), text
        first = int(STEP_LAUNCHES.search(text.stdout).group(1))
        job.wait_launches()
        r = egpu(["maps", pid, "--json"], job.env)
        assert r.returncode == 0, r.stderr
        running = step_launches(json.loads(r.stdout))
        assert running > first > 0
        time.sleep(0.2)
        r = egpu(["maps", pid, "--mirror", "--json"], job.env)
        assert r.returncode == 0, r.stderr
        assert step_launches(json.loads(r.stdout)) >= running
        refused = egpu(["attach", pid, "-p", str(probe_obj("launch")), "--name", "again"], job.env)
        assert refused.returncode == 1 and "again: launch programs (egpu/launch/...) cannot be attached to a " \
                                          "running job yet" in refused.stderr, refused
        assert egpu(["attach", pid, "-p", str(probes["count"])], job.env).returncode == 0
        job.wait_launches()
        text = egpu(["maps", pid], job.env)
        assert text.returncode == 0 and "@counts: 0" in text.stdout, text
        later = int(STEP_LAUNCHES.search(text.stdout).group(1))
        assert later > running
        status, out, err = job.finish()
    assert status == 0, err
    assert int(STEP_LAUNCHES.search(out).group(1)) >= later


def test_maps_host_api_programs_fill_are_read_while_the_job_runs(stub_job, tmp_path, monkeypatch):
    """host_calls.bpf.c on app_loop: its host-API programs (app_loop's two copies to its symbols, before it
    launches) and its launch program keep one set of host maps in C, which egpu maps shows as the exit
    dump does, API ids by the symbols they hash."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with Job(stub_job, tmp_path, options=("-p", str(ROOT / "tests" / "host_probes" / "host_calls.bpf.c"))) as job:
        text = egpu(["maps", str(job.pid)], job.env)
        assert text.returncode == 0, text.stderr
        assert re.search(r"^@calls\[cuMemcpyHtoD_v2\]: \{ count: 2, bytes: 16,", text.stdout, re.M), text.stdout
        assert "@events[1]: 2\n" in text.stdout and re.search(r"^@events\[0\]: [1-9]", text.stdout, re.M)
        status, out, err = job.finish()
    assert status == 0, err
    assert re.search(r"^@calls\[cuMemcpyHtoD_v2\]: \{ count: 2,", out, re.M)


@pytest.mark.parametrize("vm", ["c", "python"])
def test_maps_host_and_gpu_programs_share_are_read_as_at_exit(stub_job, tmp_path, monkeypatch, vm):
    """live_mix.bpf.c: counts, which its launch and GPU programs share, is read from the device copy ([0] the
    GPU's, [1] the launch program's, pushed there), by_kernel, its launch program's alone, from the host
    copy, as the exit dump merges them; so are the final maps of its detach."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    probe = ROOT / "tests" / "launch_probes" / "live_mix.bpf.c"
    with Job(stub_job, tmp_path, options=("--launch-vm", vm, "-p", str(probe)), EGPU_STUB_PROBE_COUNTS="1") as job:
        job.wait_launches()

        def maps(r: subprocess.CompletedProcess) -> tuple[list[int], dict[int, int]]:
            assert r.returncode == 0, r.stderr
            doc = json.loads(r.stdout)["maps"]
            return ([e["value"] for e in doc["counts"]["entries"]],
                    {e["key"]: e["value"] for e in doc["by_kernel"]["entries"]})

        (gpu, host), by_kernel = maps(egpu(["maps", str(job.pid), "--json"], job.env))
        assert gpu > 0 and host > 0 and list(by_kernel.values()) == [by_kernel[C.kernel_id("step")]] and \
            by_kernel[C.kernel_id("step")] >= host, (gpu, host, by_kernel)
        text = egpu(["maps", str(job.pid)], job.env).stdout
        assert re.search(r"^@by_kernel\[step\]: [1-9]", text, re.M) and re.search(r"^@counts\[1\]: [1-9]", text, re.M)
        (gpu_final, host_final), final = maps(egpu(["detach", str(job.pid), "--json"], job.env))
        assert gpu_final >= gpu and host_final >= host and final[C.kernel_id("step")] >= by_kernel[C.kernel_id("step")]
        status, _, err = job.finish()
    assert status == 0, err


@pytest.mark.parametrize("vm", ["c", "python"])
@pytest.mark.parametrize("as_json", [False, True])
def test_interval_prints_the_maps_host_programs_fill(stub_job, tmp_path, monkeypatch, as_json, vm):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    job = Job(stub_job, tmp_path, options=("--interval", "0.2", "--launch-vm", vm, *(["--json"] if as_json else []),
                                           "-p", str(LAUNCH_PROBE)))
    job.printed(r"^\{" if as_json else STEP_LAUNCHES.pattern, 2)   # two intervals, as above
    status, out, err = job.finish()
    assert status == 0, err
    if as_json:   # an interval may come before step's first launch: its map is empty then, as bpftrace's is
        docs = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
        counts = [step_launches(d) if d["maps"]["launches"]["entries"] else 0 for d in docs]
    else:
        counts = [int(n) for n in STEP_LAUNCHES.findall(out)]
    assert len(counts) >= 3 and counts == sorted(counts) and counts[-1] > 0, out   # every interval, then at exit


def test_prometheus_without_its_package_is_a_clear_error(stub_job, probes, tmp_path):
    shadow = tmp_path / "shadow" / "prometheus_client"  # the package made missing, installed or not
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no prometheus_client here')\n")
    r = subprocess.run([sys.executable, "-c", "import launcher; launcher.run_main()", "--prometheus", "9999",
                        "-p", str(probes["count"]), "true"],
                       env=stub_job.env(tmp_path / "log", PYTHONPATH=f"{shadow.parent}{os.pathsep}{ROOT}"),
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert (r.returncode, r.stderr) == (125, "egpu-run: --prometheus needs the prometheus_client package "
                                           "(pip install 'egpu[prometheus]')\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_prometheus_scrapes_every_process_while_the_job_runs(stub_job, tmp_path, probes):
    """Two ranks (ranks.py, a torchrun stand-in) launch 1 and 2 times (the shim counts each launch's 32 threads
    in the probe's map), then wait: a scrape has one series per process, labelled
    with its pid and rank, holding its count. Then the job's status comes out as egpu-run's."""
    from prometheus_client.parser import text_string_to_metric_families
    out, stop, port = tmp_path / "out", tmp_path / "stop", free_port()
    cmd = [sys.executable, "-c", "import launcher; launcher.run_main()", "--prometheus", str(port),
           "-p", str(probes["count"]), sys.executable, str(MORE / "ranks.py"), "2",
           sys.executable, str(MORE / "app_vec.py"), "module", "{k}", "32", "3", f"wait:{stop}"]
    with out.open("w") as f:
        proc = subprocess.Popen(cmd, env=stub_job.env(tmp_path / "log", EGPU_STUB_PROBE_COUNTS="1"), cwd=ROOT,
                                stdout=f, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while out.read_text().count("app_vec module") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        ranks = dict(re.findall(r"^rank (\d) pid (\d+)$", out.read_text(), re.M))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as page:
            families = {f.name: f for f in text_string_to_metric_families(page.read().decode())}
    finally:
        stop.touch()
        _, err = proc.communicate(timeout=30)
    assert len(ranks) == 2 and families["egpu_counts"].type == "gauge"
    samples = sorted(families["egpu_counts"].samples, key=lambda s: s.labels["rank"])
    assert [(s.labels, s.value) for s in samples] == [({"pid": ranks[r], "rank": r}, 32.0 * (int(r) + 1))
                                                      for r in "01"]
    assert proc.returncode == 3, err
    assert out.read_text().count("@counts: ") == 3  # each rank and their sum, at exit


def test_prometheus_scrapes_the_maps_host_programs_fill(stub_job, tmp_path):
    """launch.bpf.c's map (the host's) in a scrape while the job runs: its fields, one series each."""
    from prometheus_client.parser import text_string_to_metric_families
    port = free_port()
    job = Job(stub_job, tmp_path, options=("--prometheus", str(port), "-p", str(LAUNCH_PROBE)))
    try:
        job.wait_launches()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as page:
            families = {f.name: f for f in text_string_to_metric_families(page.read().decode())}
    finally:
        status, _, err = job.finish()
    assert status == 0, err
    values = {s.labels["field"]: s.value for s in families["egpu_launches"].samples if s.labels["key"] == "step"}
    assert values["launches"] > 0 and values["last_block[0]"] == 32, values


def test_prometheus_series_one_per_map_entry(probes):
    """What a scrape exports for a maps document: one gauge series per entry, labelled pid and rank
    (kernel ids shown by name)."""
    from egpu_preload.bpf.ctx import kernel_id
    from egpu_preload.runtime.watch import series
    kid = kernel_id("_Z4stepPy")
    doc = {"pid": 7, "rank": 1, "kernels": [[kid, "_Z4stepPy"]], "probes": [
        {"path": str(probes["count"]), "maps": [{"values": [(42).to_bytes(8, "little")]}], "trace": [],
         "trace_dropped": 0},
        {"path": str(probes["hash_count"]),
         "maps": [{"entries": [[kid.to_bytes(8, "little"), (3).to_bytes(8, "little")]]}],
         "trace": [], "trace_dropped": 0}]}
    assert list(series(doc)) == [("egpu_counts", {"pid": "7", "rank": "1"}, 42.0),
                                 ("egpu_per_kernel", {"pid": "7", "rank": "1", "key": "step"}, 3.0)]


def test_prometheus_keys_that_print_alike_are_labelled_by_their_mangled_names(probes):
    """Kernels that print alike (overloads, a template's instantiations: PyTorch's elementwise kernels) are
    keys of one map: each keeps a series of its own, its key label the mangled name (both were "step": one
    series twice, a scrape Prometheus rejects); a key that prints apart keeps its printed name."""
    from egpu_preload.bpf.ctx import kernel_id
    from egpu_preload.runtime.watch import series
    names = ["_Z4stepPy", "_Z4stepPf", "_Z4initv"]
    entries = [[kernel_id(n).to_bytes(8, "little"), (i + 1).to_bytes(8, "little")] for i, n in enumerate(names)]
    doc = {"pid": 7, "rank": None, "kernels": [[kernel_id(n), n] for n in names], "probes": [
        {"path": str(probes["hash_count"]), "maps": [{"entries": entries}], "trace": [], "trace_dropped": 0}]}
    assert sorted((labels["key"], v) for _, labels, v in series(doc)) == [
        ("_Z4stepPf", 2.0), ("_Z4stepPy", 1.0), ("init", 3.0)]


def test_prometheus_names_each_metric_once_when_processes_label_it_differently(monkeypatch):
    """A map of one name that is a scalar in one process and a keyed map in another (ranks that attached
    different probes): one family, HELP and TYPE once, both series (it was two families of one name)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from egpu_preload.runtime import watch
    rows = {1: [("egpu_n", {"pid": "1", "rank": "0"}, 4.0)],
            2: [("egpu_n", {"pid": "2", "rank": "1", "key": "step"}, 5.0)]}
    monkeypatch.setattr(watch, "job_maps", lambda session: [{"pid": 1}, {"pid": 2}])
    monkeypatch.setattr(watch, "series", lambda doc: iter(rows[doc["pid"]]))
    registry = CollectorRegistry()
    registry.register(watch.JobCollector(Path("/session")))
    page = generate_latest(registry).decode()
    assert (page.count("# HELP egpu_n "), page.count("# TYPE egpu_n "), page.count("egpu_n{")) == (1, 1, 2), page
    [family] = text_string_to_metric_families(page)
    assert [(s.labels, s.value) for s in family.samples] == [({"pid": "1", "rank": "0"}, 4.0),
                                                            ({"pid": "2", "rank": "1", "key": "step"}, 5.0)]


def test_a_change_starts_no_collection():
    """attach, swap and detach start no collection; the application's setting comes back after, even when
    the change fails (the GIL's handoff is control.prompt_gil's: test_control)."""
    import gc

    from egpu_preload.runtime.live import no_collection

    seen = []

    def handler(fields: dict) -> dict:
        seen.append(gc.isenabled())
        if fields.get("fail"):
            raise ControlError("refused")
        return {}

    assert gc.isenabled()
    no_collection(handler)({})
    with pytest.raises(ControlError):
        no_collection(handler)({"fail": True})
    assert seen == [False, False] and gc.isenabled()


@pytest.mark.parametrize("reader", ["maps", "mirrored"])
def test_maps_are_decoded_outside_the_lock_a_change_takes(tmp_path, monkeypatch, reader):
    """`egpu maps` and the mirror copy the regions under Live.lock (a change frees them) but decode them
    after letting it go: a change never waits for a large map's decoding."""
    import contextlib
    import threading
    from types import SimpleNamespace

    from egpu_preload.runtime import live
    rt = SimpleNamespace(probes=[], maps=[], context=1, drainer=None, cfg=SimpleNamespace(session=tmp_path),
                         driver=SimpleNamespace(capture_relaxed=contextlib.nullcontext))
    control = live.Live(rt)
    free_while_decoding = []

    def take_and_give_back():
        free_while_decoding.append(control.lock.acquire(timeout=5))
        if free_while_decoding[-1]:
            control.lock.release()

    def decode(probes, fetched, host):
        other = threading.Thread(target=take_and_give_back)   # a change on the control thread
        other.start()
        other.join()
        return []

    monkeypatch.setattr(control, "_fetch", lambda probes: [[b""]])
    monkeypatch.setattr(control, "_decode", decode)
    monkeypatch.setattr(control, "_document", lambda probes: {"probes": probes})
    assert (control.maps({}) if reader == "maps" else control.mirrored()) == {"probes": []}
    assert free_while_decoding == [True]


def test_an_attach_whose_maps_the_gpu_cannot_hold_is_refused_and_the_job_goes_on(stub_job, tmp_path, monkeypatch):
    """A HASH of 2^26 entries needs 3.2 GB of device memory (and as much host memory to build): with 1 GB
    free (the stand-in's cuMemGetInfo) the attach is refused, naming the map, before anything is made,
    and the job runs on (a 12.9 GB map built on the host got the job killed by the kernel's OOM killer)."""
    from egpu_preload.bpf.compile import compile_probe
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    src = tmp_path / "huge.bpf.c"
    src.write_text((ROOT / "tests" / "probes" / "hash_count.bpf.c").read_text()
                   .replace("__uint(max_entries, 1024);", "__uint(max_entries, 1 << 26);"))
    obj = compile_probe(src, tmp_path / "huge.bpf.o")
    with Job(stub_job, tmp_path, EGPU_STUB_FREE_MB="1024") as job:
        r = egpu(["attach", str(job.pid), "-p", str(obj)], job.env)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "map per_kernel (67,108,864 entries) needs 3.2 GB of device memory, the maps 3.2 GB: the GPU has " \
               "1.1 GB free" in r.stderr, r.stderr
        before = job.launches()
        job.wait_launches()
        assert job.launches() > before and job.proc.poll() is None
        code, _, err = job.finish()
        assert code == 0, err


@pytest.mark.parametrize("job", ["module"], indirect=True)
def test_single_process_commands_take_egpu_runs_pid(job):
    """egpu modules (as checkpoint and restore) address the one process of egpu-run PID's job, as attach and
    maps do: the PID help says "or its job's"; they refused egpu-run's pid."""
    by_job = egpu(["modules", str(job.proc.pid)], job.env)
    assert by_job.returncode == 0, by_job.stderr
    assert by_job.stdout == egpu(["modules", str(job.pid)], job.env).stdout
    job.finish()


@pytest.mark.parametrize("job", ["module"], indirect=True)
def test_maps_whose_name_two_probes_share_are_labelled_by_probe(job, probes, tmp_path):
    """count and a copy of it attached as count2 both have @counts: printed twice unlabelled, and one JSON
    key, one was lost. A name two probes share is PROBE:MAP in text and JSON; others stay as they are."""
    (tmp_path / "count2.bpf.o").write_bytes(probes["count"].read_bytes())
    for obj in (probes["count"], tmp_path / "count2.bpf.o", probes["hash_count"]):
        assert egpu(["attach", str(job.pid), "-p", str(obj)], job.env).returncode == 0
    text = egpu(["maps", str(job.pid)], job.env)
    assert [ln for ln in text.stdout.splitlines() if ln] == ["@count:counts: 0", "@count2:counts: 0"], text.stdout
    doc = json.loads(egpu(["maps", str(job.pid), "--json"], job.env).stdout)
    assert sorted(doc["maps"]) == ["count2:counts", "count:counts", "per_kernel"]
    job.finish()


@pytest.mark.parametrize("job", ["module"], indirect=True)
def test_attach_json_is_the_reply(job, probes):
    """egpu attach --json: one JSON document a process, its reply (what the line says, as numbers)."""
    r = egpu(["attach", str(job.pid), "-p", str(probes["count"]), "--json"], job.env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["pid"], doc["rank"], doc["name"], doc["modules"], doc["kernels"]) == (job.pid, None, "count", 1, 1)
    assert doc["launches"] > 0 and doc["seconds"] > 0 and "flip" in doc["phases_ms"]
    job.finish()


def test_check_room_counts_the_device_and_the_host():
    """devmaps.check_room: the device's free memory against every region; the host's available memory,
    half of it, against the images and an ARRAY's own copy; None (the driver or /proc cannot say) passes."""
    from egpu_preload.bpf.program import MAP_ARRAY, MAP_HASH, MapDef
    from egpu_preload.errors import EgpuError
    from egpu_preload.translate import devmaps
    arr = MapDef("big", MAP_ARRAY, 4, 8, 1 << 20, 0)
    need = devmaps.layout(arr).region_size(132) + devmaps.trace_layout().region_size(132)
    devmaps.check_room([arr], 132, need, None)
    with pytest.raises(EgpuError, match=r"map big \(1,048,576 entries\) needs 8\.4 MB of device memory"):
        devmaps.check_room([arr], 132, need - 1, None)
    host = need + (1 << 20) * (8 + 64)
    devmaps.check_room([arr], 132, None, 2 * host)
    with pytest.raises(EgpuError, match="the host has .* available, and egpu takes at most half"):
        devmaps.check_room([arr], 132, None, 2 * host - 2)
    devmaps.check_room([MapDef("h", MAP_HASH, 8, 8, 1 << 30, 0)], 132, None, None)


def test_attach_says_which_uprobes_found_no_function(job, probes, tmp_path):
    """An object whose every program is a uprobe and none found its function runs nothing: the attach
    exits 1 saying why, as bpftool's failed attach does, and leaves no probe behind (its name is free,
    the job's other probes run on); a swap to it exits 1 with the old probe put back; one of whose uprobes
    one is hooked attaches."""
    from egpu_preload.bpf.compile import compile_probe
    body = ('#include "egpu.bpf.h"\n'
            'struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 1); __type(key, __u32);\n'
            '         __type(value, __u64); } calls SEC(".maps");\n'
            'static int hit(void) { __u32 k = 0; __u64 *n = bpf_map_lookup_elem(&calls, &k);\n'
            '                       if (n) __sync_fetch_and_add(n, 1); return 0; }\n'
            'SEC("uprobe/libcuda.so.1:no_such_function_xyz") int up(void *ctx) { return hit(); }\n'
            'SEC("uprobe/libcuda.so.1:no_such_function_abc") int up2(void *ctx) { return hit(); }\n')
    (tmp_path / "none.bpf.c").write_text(body + 'char LICENSE[] SEC("license") = "GPL";\n')
    (tmp_path / "one.bpf.c").write_text(body + 'SEC("uprobe/libcuda.so.1:cuLaunchKernel") int up3(void *ctx) '
                                        '{ return hit(); }\nchar LICENSE[] SEC("license") = "GPL";\n')
    assert egpu(["attach", str(job.pid), "-p", str(probes["count"])], job.env).returncode == 0
    before = len(job.log.read_text())
    r = egpu(["attach", str(job.pid), "-p", str(compile_probe(tmp_path / "none.bpf.c", tmp_path / "u.bpf.o"))],
             job.env)
    assert r.returncode == 1 and not r.stdout, (r.stdout, r.stderr)
    # every region it made is freed: its maps, and the copies the flip that took it off made of them
    during = job.log.read_text()[before:]
    assert during.count("cuMemAlloc_v2 size=") == during.count("cuMemFree_v2 ptr=") > 0, during
    assert ("u: nothing of it can run, so it was not attached: prog up at libcuda.so.1:no_such_function_xyz: no "
            "such function in it; prog up2 at libcuda.so.1:no_such_function_abc: no such function in it"
            in r.stderr), r.stderr
    ps = json.loads(egpu(["ps", "--json"], job.env).stdout)
    assert [s["probes"] for s in ps if s["pid"] == job.pid] == [["count"]], ps
    # a swap to it likewise: count is put back by a second flip, and serves the module again
    before = len(job.log.read_text())
    r = egpu(["swap", str(job.pid), "count", str(tmp_path / "u.bpf.o")], job.env)
    assert r.returncode == 1 and not r.stdout, (r.stdout, r.stderr)
    assert re.search(r"u: nothing of it can run, so count was put back \(count ran nothing for the [\d.]+ ms "
                     r"between the two flips\): prog up at libcuda.so.1:no_such_function_xyz: no such function",
                     r.stderr), r.stderr
    during = job.log.read_text()[before:]
    assert during.count("cuMemAlloc_v2 size=") == during.count("cuMemFree_v2 ptr=") > 0, during
    assert len(MODULE_LOAD.findall(during)) == 1, during   # count's copy again (the first flip served the original)
    ps = json.loads(egpu(["ps", "--json"], job.env).stdout)
    assert [s["probes"] for s in ps if s["pid"] == job.pid] == [["count"]], ps
    job.wait_launches()
    modules = egpu(["modules", str(job.pid)], job.env).stdout.splitlines()
    assert modules[0].endswith("ptx: instrumented [count]"), modules
    r = egpu(["attach", str(job.pid), "-p", str(compile_probe(tmp_path / "one.bpf.c", tmp_path / "u.bpf.o"))],
             job.env)
    assert r.returncode == 0 and r.stdout.startswith(f"attached u in {job.pid}"), r.stderr
    assert "uprobe not attached: prog up2 at libcuda.so.1:no_such_function_abc" in r.stdout, r.stdout
    job.finish()


def test_attach_says_a_uprobe_has_no_call_site_patched(job, tmp_path):
    """app_loop looked cuLaunchKernel up with dlsym before the attach: a uprobe on it is hooked (GOT slots
    and later dlsym answers) but no call site is patched, so its calls are never caught; the reply had
    sites 0 and the line said only 'attached' (a helper's sweep)."""
    from egpu_preload.bpf.compile import compile_probe
    src = tmp_path / "up_launch.bpf.c"
    src.write_text('#include "egpu.bpf.h"\n'
                   'struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 1); __type(key, __u32);\n'
                   '         __type(value, __u64); } calls SEC(".maps");\n'
                   'SEC("uprobe/libcuda.so.1:cuLaunchKernel")\n'
                   'int up(void *ctx) { __u32 k = 0; __u64 *n = bpf_map_lookup_elem(&calls, &k);\n'
                   '                    if (n) __sync_fetch_and_add(n, 1); return 0; }\n'
                   'char LICENSE[] SEC("license") = "GPL";\n')
    r = egpu(["attach", str(job.pid), "-p", str(compile_probe(src, tmp_path / "up_launch.bpf.o"))], job.env)
    assert r.returncode == 0, r.stderr
    assert ("uprobe at libcuda.so.1:cuLaunchKernel (prog up): no call site patched yet; it catches calls through "
            "GOT slots and through pointers dlsym hands out from now on, not a pointer the program took before"
            in r.stdout), r.stdout
    job.finish()


def test_a_file_name_that_makes_no_probe_name_asks_for_name(job, probes, tmp_path):
    """A probe on a path with a space or non-ASCII letters in its file name: egpu-run takes it; attach and
    swap say before clang and the verifier run that its name needs --name (the job refused it after, as
    'bad probe name' of a name the user never gave), and take it with one."""
    odd = tmp_path / "sp ace" / "cöunt x.bpf.o"
    odd.parent.mkdir()
    odd.write_bytes(probes["count"].read_bytes())
    for args in (["attach", str(job.pid), "-p", str(odd)], ["swap", str(job.pid), "count", str(odd)]):
        r = egpu(args, job.env)
        assert r.returncode == 1 and "give one with --name NAME" in r.stderr and str(odd) in r.stderr, r.stderr
    r = egpu(["attach", str(job.pid), "-p", str(odd), "--name", "a b"], job.env)
    assert r.returncode == 2 and "bad probe name 'a b'" in r.stderr, r.stderr
    assert egpu(["attach", str(job.pid), "-p", str(odd), "--name", "cx"], job.env).returncode == 0
    r = egpu(["swap", str(job.pid), "cx", str(odd), "--name", "cy"], job.env)
    assert r.returncode == 0 and r.stderr.startswith(f"swapped cx -> cy in {job.pid}"), r.stderr
    job.finish()


def test_maps_before_the_job_loaded_a_module_are_empty_and_make_nothing(probe_obj, tmp_path, monkeypatch):
    """egpu maps before the job loaded a module (no device maps, no host programs): each attached probe
    with its maps as they begin, and no device maps made for the read (the mirror writes nothing yet)."""
    from types import SimpleNamespace

    from egpu_preload.maps import MapsState
    from egpu_preload.runtime import dump, live
    from egpu_preload.runtime.probes import load_probe
    probe = load_probe(probe_obj("count"))
    rt = SimpleNamespace(probes=[probe], maps=[], context=None, drainer=None, cfg=SimpleNamespace(session=tmp_path),
                         launch_counts={})
    control = live.Live(rt)
    monkeypatch.setattr(control, "_document", lambda probes: {"probes": probes})
    assert control.maps({})["probes"] == [{"name": "count.v3", "path": str(probe.path),
                                          **dump.state_contents(MapsState(probe.obj.maps))}]
    assert control.mirrored() is None and (rt.context, rt.maps) == (None, [])


def second_flip_fails(control: Any, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Live._change stood in for: the first flip serves its probes, the second fails as a capture that began
    meanwhile makes it; the probe names of each flip asked for, in the list returned."""
    from egpu_preload.runtime import live
    flips: list[list[str]] = []

    def change(new, asked):
        flips.append([n for n, _, _ in new])
        if len(flips) == 2:
            raise ControlError(f"{live.CAPTURING}; nothing changed, try again once it has ended")
        control.names, control.rt.probes[:] = [n for n, _, _ in new], [p for _, p, _ in new]
        return {"phases_ms": {}, "to_flip_ms": 1.0}, live.Snapshot([])

    monkeypatch.setattr(control, "_change", change)
    return flips


def test_an_idle_attach_whose_take_back_fails_says_it_stays(tmp_path, monkeypatch):
    """An attach of only uprobes, none hooked, is taken off by a second flip; when that flip fails (a capture
    began meanwhile, a hold timed out) the probe stays attached, running nothing: the reply says so, not the
    flip's own 'nothing changed' (the attach changed the job, and attaching it again is refused by name)."""
    from types import SimpleNamespace

    from egpu_preload.runtime import live
    up = SimpleNamespace(attach=SimpleNamespace(kind="uprobe"))
    probe = SimpleNamespace(obj=SimpleNamespace(programs=[up], maps=[]))
    rt = SimpleNamespace(probes=[], maps=[], context=None, drainer=None, cfg=SimpleNamespace(session=tmp_path))
    control = live.Live(rt)
    flips = second_flip_fails(control, monkeypatch)
    monkeypatch.setattr(control, "_load", lambda data, name: probe)
    monkeypatch.setattr(control, "_new_maps", lambda p, old: object())
    monkeypatch.setattr(control.host, "attach", lambda *a, **k: {"attached": [
        {"prog": "up", "target": "libx.so:f", "state": "no such function in it"}], "refused": []})
    monkeypatch.setattr(control.host, "detach", lambda name: {})
    with pytest.raises(ControlError) as e:
        control.attach({"name": "u", "probe": b""})
    assert flips == [["u"], []] and control.names == ["u"]
    assert str(e.value).startswith("u: nothing of it can run (prog up at libx.so:f: no such function in it), and "
                                   "taking it off again failed: the application is capturing"), e.value
    assert str(e.value).endswith("; it stays attached, running nothing (egpu detach takes it off)"), e.value


def test_an_attach_whose_uprobes_cannot_be_hooked_says_it_stands(tmp_path, monkeypatch):
    """The uprobes are hooked after the flip: when hooking fails (a driver error seeding the shared maps,
    say), the probe's GPU programs already run, so the reply says it is attached and how to take it off; it
    said only the error, and `egpu ps` then listed a probe the user was told had failed."""
    from types import SimpleNamespace

    from egpu_preload.errors import EgpuError
    from egpu_preload.runtime import live
    probe = SimpleNamespace(obj=SimpleNamespace(programs=[], maps=[]))
    rt = SimpleNamespace(probes=[], maps=[], context=None, drainer=None, cfg=SimpleNamespace(session=tmp_path))
    control = live.Live(rt)

    def change(new, asked):
        control.names = [n for n, _, _ in new]
        return {"phases_ms": {}}, None

    def hook(*a, **k):
        raise EgpuError("cuMemcpyDtoH_v2 failed: CUDA_ERROR_ILLEGAL_ADDRESS")

    monkeypatch.setattr(control, "_load", lambda data, name: probe)
    monkeypatch.setattr(control, "_new_maps", lambda p, old: object())
    monkeypatch.setattr(control, "_change", change)
    monkeypatch.setattr(control.host, "attach", hook)
    with pytest.raises(ControlError) as e:
        control.attach({"name": "u", "probe": b""})
    assert str(e.value) == ("u: attached, but its uprobes could not be hooked: cuMemcpyDtoH_v2 failed: "
                            "CUDA_ERROR_ILLEGAL_ADDRESS; its other programs run (egpu detach takes it off)")
    assert control.names == ["u"]


def test_a_swap_whose_put_back_fails_says_the_new_probe_stays(tmp_path, monkeypatch):
    """A swap to only uprobes, none hooked, flips the old probe back; when that second flip fails the new
    probe stays, running nothing, and the reply says so rather than the flip's own 'nothing changed'."""
    from types import SimpleNamespace

    from egpu_preload.runtime import live
    up = SimpleNamespace(attach=SimpleNamespace(kind="uprobe"))
    new = SimpleNamespace(obj=SimpleNamespace(programs=[up], maps=[]))
    old = SimpleNamespace(obj=SimpleNamespace(programs=[], maps=[]), path=tmp_path / "c.bpf.o")
    rt = SimpleNamespace(probes=[old], maps=[object()], context=None, drainer=None, uprobes=None,
                         cfg=SimpleNamespace(session=tmp_path))
    control = live.Live(rt)
    flips = second_flip_fails(control, monkeypatch)
    monkeypatch.setattr(control, "_load", lambda data, name: new)
    monkeypatch.setattr(control, "_context", lambda: 0)
    monkeypatch.setattr(control, "_new_maps", lambda p, o: object())
    monkeypatch.setattr(control, "_free", lambda *snapshots: None)
    monkeypatch.setattr(control.host, "attach", lambda *a, **k: {"attached": [
        {"prog": "up", "target": "libx.so:f", "state": "no such function in it"}], "refused": []})
    with pytest.raises(ControlError) as e:
        control.swap({"old": "c", "new_name": "u", "new_probe": b""})
    assert flips == [["u"], ["c"]] and control.names == ["u"]
    assert str(e.value).startswith("u: nothing of it can run, and putting c back failed: the application is "
                                   "capturing"), e.value
    assert str(e.value).endswith("; u stays attached, running nothing (egpu swap or detach takes it off)"), e.value


def test_a_detach_whose_flip_fails_runs_the_live_uprobes_again_as_they_were(tmp_path, monkeypatch):
    """A detach pauses the probe's live uprobes before its flip; when the flip fails (a capture, a hold that
    timed out) the probe stays attached, so they run again, still hooked, maps as they were (they once stayed
    off while the reply said nothing changed; then they were hooked again from maps read back, which lost a
    bloom filter's values and counted the return of a call made across the change without its entry)."""
    from types import SimpleNamespace

    from egpu_preload.runtime import live, uprobes
    probe, maps = SimpleNamespace(path=tmp_path / "u.bpf.o"), object()
    rt = SimpleNamespace(probes=[probe], maps=[maps], context=1, drainer=None, cfg=SimpleNamespace(session=None))
    control = live.Live(rt)
    control.names = ["u"]
    paused = []
    hooks = SimpleNamespace(pause=lambda p, on: paused.append((p, on)), detach=lambda: paused.append("unhooked"))
    control.host.attached["u"] = uprobes.Live(probe, None, hooks)

    def change(new, asked):
        raise ControlError(f"{live.CAPTURING}; nothing changed, try again once it has ended")

    monkeypatch.setattr(control, "_context", lambda: 1)
    monkeypatch.setattr(control, "_change", change)
    with pytest.raises(ControlError, match="nothing changed"):
        control.detach({"name": "u"})
    assert paused == [(probe, True), (probe, False)] and control.names == ["u"]
    assert list(control.host.attached) == ["u"] and not control.host.paused


def test_a_change_whose_sass_staging_fails_frees_the_snapshot(tmp_path, monkeypatch):
    """_change stages the copies of the leaving probes' regions (its Snapshot) before the SASS generation;
    when that staging is refused ("nothing changed") the copies were never freed: each such detach or swap
    lost the leaving probes' map regions' worth of device memory."""
    import contextlib
    from types import SimpleNamespace

    from egpu_preload.runtime import live
    allocated: set[int] = set()

    def alloc(size):
        allocated.add(len(allocated) + 100)
        return len(allocated) + 99

    memory = SimpleNamespace(alloc=alloc, free=allocated.remove)
    probe = SimpleNamespace(path=tmp_path / "u.bpf.o")
    maps = SimpleNamespace(addrs=[1, 2], layouts=[SimpleNamespace(region_size=lambda n: 64)] * 2, ncpu=1)
    rt = SimpleNamespace(probes=[probe], maps=[maps], context=1, drainer=None, uprobes=None, modules={},
                         functions={}, memory=memory, cfg=SimpleNamespace(session=None),
                         driver=SimpleNamespace(current=lambda ctx: contextlib.nullcontext()))
    control = live.Live(rt)

    def refused(new):
        raise ControlError("SASS back end: no room; nothing changed")

    monkeypatch.setattr(control, "_context", lambda: 1)
    monkeypatch.setattr(control, "_stage_sass", refused)
    with pytest.raises(ControlError, match="nothing changed"):
        control.detach({"name": "u"})
    assert control.names == ["u"] and not allocated, allocated


def connected(pid: int) -> bool:
    """Whether process ``pid`` has a socket open (egpu's to a job, once its request is under way)."""
    fds = Path(f"/proc/{pid}/fd")
    try:
        return any(os.readlink(fds / fd).startswith("socket:") for fd in os.listdir(fds))
    except OSError:   # it ended, or closed an fd while listed
        return False


def test_ctrl_c_while_a_job_works_says_what_may_still_happen(job, probes):
    """Ctrl-C while egpu waits for a job (here: the job stopped, so no reply comes) exits 130, as a shell's
    interrupted command does, saying what may still happen there (typer's exit said nothing): an attach
    stopped at its first question (the job's modules) was never asked, and nothing changes; a detach that
    was sent completes once the job goes on."""
    def interrupted(*args: str) -> str:
        os.kill(job.pid, signal.SIGSTOP)
        try:
            p = subprocess.Popen([sys.executable, "-c", "import launcher; launcher.egpu_main()", *args],
                                 env=job.env, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            # its socket to the job open: the request is under way (a Ctrl-C while egpu still starts, which
            # took over 3 s on a loaded machine, exits 130 saying nothing)
            deadline = time.monotonic() + 30
            while not connected(p.pid) and p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            p.send_signal(signal.SIGINT)
            out, err = p.communicate(timeout=30)
        finally:
            os.kill(job.pid, signal.SIGCONT)
        assert p.returncode == 130 and not out, (p.returncode, out, err)
        return err.strip().splitlines()[-1]

    def attached() -> list[str]:
        return [s.get("probes") for s in json.loads(egpu(["ps", "--json"], job.env).stdout) if s["pid"] == job.pid][0]

    assert interrupted("attach", str(job.pid), "-p", str(probes["count"])) == (
        f"egpu: interrupted before the attach was asked of {job.pid}: nothing changed there")
    job.wait_launches()
    assert attached() == []
    assert egpu(["attach", str(job.pid), "-p", str(probes["count"])], job.env).returncode == 0
    assert interrupted("detach", str(job.pid)) == (f"egpu: interrupted while waiting for {job.pid}: the detach "
                                                   "may still complete there (egpu ps lists the probes attached)")
    deadline = time.monotonic() + 30
    while attached() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert attached() == []
    job.finish()
