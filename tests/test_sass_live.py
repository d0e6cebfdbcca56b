"""The SASS back end's standby and live flips without a GPU: tests/sass_stub's stand-in sanitizer calls
back from the stand-in driver (module loads, launches) and logs, after each launch callback, which
block-enter patch the launch would run and the launch record it was given (`run f=.. enter=..
record=GEN:LAUNCH:MASK`).

A job of four launching threads and two modules (tests/sass_stub/app_threads_loop.c) starts under `egpu-run --backend
sass` with no probe, then is attached, swapped and detached over its control socket:
- standby: subscribed, no patch, launch callbacks off, every launch runs nothing;
- every launch between two flips runs the generation the first one committed, its patch and its record
  together (a launch never runs one generation's patch with another's record), and each window holds
  exactly the launch ids between the flips that bound it;
- a re-patch the sanitizer refuses fails the swap, and the old probe goes on running in both modules,
  whether the first module or the second was refused.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from egpu_preload.control import ControlClient, list_sessions
from stub_job import ROOT
from test_durations import cupti_dir  # noqa: F401  (the stand-in libcupti)

SASS_STUB = Path(__file__).parent / "sass_stub"
RUN = re.compile(r"^\d+ run f=step2? enter=(\S+) record=(\S+)$", re.M)
LAUNCH = re.compile(r"^\d+ cuLaunchKernel ", re.M)
THREADS = 4


@pytest.fixture(scope="module")
def stand_ins(stub_job, tmp_path_factory) -> tuple[Path, Path]:
    """(the stand-in sanitizer, the threaded job)."""
    d = tmp_path_factory.mktemp("sass_live")
    cc = ["gcc", "-O1", "-Wall", "-Werror"]
    subprocess.run(cc + ["-shared", "-fPIC", str(SASS_STUB / "libsanitizer_stub.c"), "-o",
                         str(d / "libsanitizer-public.so"), "-ldl"], check=True)
    subprocess.run(cc + [str(SASS_STUB / "app_threads_loop.c"), "-o", str(d / "app_threads_loop"), "-ldl",
                         "-lpthread"], check=True)
    return d / "libsanitizer-public.so", d / "app_threads_loop"


class ThreadedJob:
    def __init__(self, stub_job, stand_ins: tuple[Path, Path], tmp: Path, **env: str) -> None:
        sanitizer, self.app = stand_ins
        self.log, self.stop = tmp / "log", tmp / "stop"
        self.env = stub_job.env(self.log, EGPU_SANITIZER_LIB=str(sanitizer), **env)
        self.proc = subprocess.Popen([sys.executable, "-c", "import launcher; launcher.run_main()", "--backend",
                                      "sass", str(self.app), str(self.stop), str(THREADS)], env=self.env, cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = [s for s in list_sessions(tmp / "egpu") if s.info and str(self.app) in s.info["argv"]]
            if found and self.log.exists() and len(LAUNCH.findall(self.log.read_text())) > 20:
                self.client = ControlClient(found[0].pid, directory=tmp / "egpu", timeout=30)
                return
            time.sleep(0.05)
        self.stop.touch()
        raise AssertionError(f"no session: {self.proc.communicate(timeout=60)}")

    def runs(self) -> list[tuple[str, str]]:
        return RUN.findall(self.log.read_text()) if self.log.exists() else []

    def calls(self) -> list[str]:
        return [ln.split(" ", 1)[1] for ln in self.log.read_text().splitlines() if " sanitizer" in ln]

    def wait_runs(self, n: int = 40) -> None:
        target = len(self.runs()) + n
        deadline = time.monotonic() + 20
        while len(self.runs()) < target and time.monotonic() < deadline:
            time.sleep(0.01)

    def finish(self) -> str:
        self.stop.touch()
        out, err = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, err
        return out

    def __enter__(self) -> "ThreadedJob":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.stop.touch()
            self.proc.communicate(timeout=60)


def windows(runs: list[tuple[str, str]]) -> dict[int, tuple[set[str], set[int]]]:
    """generation -> (the entries its launches ran, their launch ids); generation 0: launches without a record."""
    out: dict[int, tuple[set[str], set[int]]] = {}
    for enter, record in runs:
        gen, launch = (0, 0) if record == "-" else map(int, record.split(":")[:2])
        entries, ids = out.setdefault(gen, (set(), set()))
        entries.add(enter)
        ids.add(launch)
    return out


def test_standby_then_attach_swap_detach_while_threads_launch(stub_job, stand_ins, probe_obj, tmp_path,
                                                             monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with ThreadedJob(stub_job, stand_ins, tmp_path) as job:
        # standby: subscribed before cuInit, nothing patched, no launch callbacks, nothing run
        assert job.calls()[:2] == ["sanitizerSubscribe cb=1", "sanitizerEnableDomain on=1 domain=3"]
        assert not [c for c in job.calls() if "Patch" in c or "domain=5" in c]
        assert job.runs() == []   # the launch domain is off: the stand-in never calls back
        a = job.client.request("attach", probe=probe_obj("count").read_bytes(), name="count")
        assert (a["sass"]["modules_patched"], a["sass"]["modules"]) == (2, 2), a["sass"]
        job.wait_runs()
        s = job.client.request("swap", old="count", new_probe=probe_obj("hash_count").read_bytes(),
                               new_name="hash_count")
        job.wait_runs()
        d = job.client.request("detach")
        assert (d["sass"]["modules_patched"], d["sass"]["modules"]) == (0, 2), d["sass"]
        time.sleep(0.1)
        out = job.finish()
    launched = int(re.search(r"launches (\d+) failed 0$", out.strip()).group(1))
    calls = job.calls()
    assert calls.count("sanitizerEnableDomain on=1 domain=5") == 1   # at the attach from standby...
    assert calls.count("sanitizerEnableDomain on=0 domain=5") == 1   # ...off again at the detach
    by_gen = windows(job.runs())
    gens = sorted(g for g in by_gen if g)
    assert len(gens) == 2, by_gen.keys()
    (enter1,), ids1 = by_gen[gens[0]]
    (enter2,), ids2 = by_gen[gens[1]]
    # one patch per generation, each its own image's entry point
    assert enter1.startswith("egpu_sass_block_enter_") and enter2.startswith("egpu_sass_block_enter_")
    assert enter1 != enter2
    # exact windows: every launch id between two flips ran that generation, and no other did
    assert ids1 == set(range(a["launches"] + 1, s["launches"] + 1))
    assert ids2 == set(range(s["launches"] + 1, d["launches"] + 1))
    # a launch called back without a record (the detach's drain window) ran no patch either
    assert by_gen.get(0, ({"-"}, set()))[0] == {"-"}


@pytest.mark.parametrize("refused", [3, 4])
def test_a_failed_repatch_leaves_the_old_probe_running(stub_job, stand_ins, probe_obj, tmp_path, monkeypatch,
                                                       refused):
    """The swap's re-patch fails at its first module (the sanitizer's third sanitizerPatchModule: the attach
    made two) or at its second, after the first was re-patched: the swap is refused with the reason, the
    modules it reached are patched again with the attached probe's image, and every launch goes on with it."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with ThreadedJob(stub_job, stand_ins, tmp_path, EGPU_STUB_SANITIZER_FAIL=f"sanitizerPatchModule:{refused}") as job:
        a = job.client.request("attach", probe=probe_obj("count").read_bytes(), name="count")
        job.wait_runs()
        from egpu_preload.errors import EgpuError
        with pytest.raises(EgpuError, match=r"SASS back end: sanitizerPatchModule failed: 7 "
                                            r"\(SANITIZER_ERROR_OUT_OF_MEMORY\); the probes before it go on running"):
            job.client.request("swap", old="count", new_probe=probe_obj("hash_count").read_bytes(),
                               new_name="hash_count")
        assert job.client.request("ping")["probes"] == ["count"]
        before = len(job.runs())
        job.wait_runs()
        after = job.runs()[before:]
        d = job.client.request("detach")
        job.finish()
    (gen,) = {int(record.split(":")[0]) for _, record in after}   # one generation, a record each
    attached = windows(job.runs())[gen]
    assert len(attached[0]) == 1   # its own image's entry point, before the failed swap and after it
    assert min(attached[1]) == a["launches"] + 1 and max(attached[1]) <= d["launches"]   # attach to detach
    assert [c for c in job.calls() if c.startswith("sanitizerPatchModule")].count("sanitizerPatchModule -> 7") == 1


@pytest.fixture(scope="module")
def cupti_apps(stand_ins, tmp_path_factory) -> tuple[Path, Path, Path]:
    """(the stand-in libcupti, the job that dlopens it, the job linked with it)."""
    d = tmp_path_factory.mktemp("cupti")
    cc = ["gcc", "-O1", "-Wall", "-Werror"]
    subprocess.run(cc + ["-shared", "-fPIC", str(SASS_STUB / "libcupti_stub.c"), "-o", str(d / "libcupti.so"), "-ldl"],
                   check=True)
    subprocess.run(cc + [str(SASS_STUB / "app_cupti.c"), "-o", str(d / "app_cupti"), "-ldl"], check=True)
    subprocess.run(cc + ["-DLINKED", str(SASS_STUB / "app_cupti.c"), "-o", str(d / "app_cupti_linked"), "-ldl",
                         f"-L{d}", "-lcupti", f"-Wl,-rpath,{d}"], check=True)
    return d / "libcupti.so", d / "app_cupti", d / "app_cupti_linked"


@pytest.mark.parametrize("linked", [False, True], ids=["dlsym", "linked"])
@pytest.mark.parametrize("probe", [None, "count"], ids=["standby", "patching"])
def test_cupti_gets_the_tool_slot_from_standby(stub_job, stand_ins, cupti_apps, probe_obj, tmp_path, linked, probe):
    """CUPTI and the sanitizer share the driver's one tool slot (on the H200 a job in standby broke
    --durations and torch.profiler). In standby the sanitizer gives it up at the job's first CUPTI call,
    reached through dlsym or a link to libcupti; while a generation patches, it keeps it and CUPTI fails
    as it would have, the job running on either way."""
    cupti, app, app_linked = cupti_apps
    env = stub_job.env(tmp_path / "log", EGPU_SANITIZER_LIB=str(stand_ins[0]))
    args = ["--backend", "sass", *(["-p", str(probe_obj(probe))] if probe else []),
            *([str(app_linked)] if linked else [str(app), str(cupti)])]
    r = subprocess.run([sys.executable, "-c", "import launcher; launcher.run_main()", *args], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    calls = [ln.split(" ", 1)[1] for ln in (tmp_path / "log").read_text().splitlines() if " sanitizer" in ln]
    if probe is None:
        assert "cupti register=0 enable=0 launch=0" in r.stdout, r.stdout
        assert calls[-1] == "sanitizerUnsubscribe sub=1", calls
    else:
        assert "cupti register=39 enable=39 launch=0" in r.stdout, r.stdout
        assert "sanitizerUnsubscribe sub=1" not in calls and any(c.startswith("sanitizerPatchModule") for c in calls)


@pytest.mark.parametrize("probe", [None, "count"], ids=["no-kernel-probe", "kernel-probe"])
def test_durations_take_the_slot_unless_start_up_probes_patch(stub_job, stand_ins, cupti_dir, probe_obj, tmp_path,
                                                              probe):
    """egpu-run's own CUPTI (--durations) starts inside a hook, where the shim's CUPTI wrappers pass
    through, so the runtime gives up standby's slot itself, unless the start-up probes have kernel-site
    programs for the SASS back end to patch: those keep it (and --durations says why it timed nothing)."""
    log = tmp_path / "log"
    env = stub_job.env(log, EGPU_SANITIZER_LIB=str(stand_ins[0]), EGPU_STUB_CUPTI="vecadd:1500")
    env["LD_LIBRARY_PATH"] = f"{cupti_dir}:{env['LD_LIBRARY_PATH']}"
    args = ["--backend", "sass", "--durations", *(["-p", str(probe_obj(probe))] if probe else [])]
    r = subprocess.run([sys.executable, "-c", "import launcher; launcher.run_main()", *args, str(stub_job.app),
                        "cubin", "1", "64", "0"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    calls = [ln.split(" ", 1)[1] for ln in log.read_text().splitlines() if " sanitizer" in ln]
    assert ("sanitizerUnsubscribe sub=1" in calls) == (probe is None), calls
