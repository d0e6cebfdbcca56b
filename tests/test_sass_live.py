"""The SASS back end's standby and live flips without a GPU: tests/sass_stub's stand-in sanitizer calls
back from the stand-in driver (module loads, launches) and logs, after each launch callback, which
block-enter patch the launch would run and the launch record it was given (`run f=.. enter=..
record=GEN:LAUNCH:MASK`).

A job of four launching threads and two modules (tests/sass_stub/app_threads_loop.c) starts under `egpu-run --backend
sass` with no probe, then is attached, swapped and detached over its control socket:
- standby: subscribed, no patch, launch callbacks off, every launch runs nothing;
- every launch between two flips runs the generation the first one committed, its patch and its record
  together (the first launch of a kernel asks Python which programs run in it; a flip stages the answers
  for the kernels known by then, so their launches after it ask nothing) (a launch never runs one generation's patch
  with another's record), and each window holds exactly the launch ids between the flips that bound it;
- a re-patch the sanitizer refuses fails the swap, and the old probe goes on running in both modules,
  whether the first module or the second was refused;
- a graph replay passes the same gate: it never runs while a flip re-patches (some modules on the old
  probe, others on the new or on none);
- a module loaded by another thread while a flip re-patches (inside a sanitizer call that waits for that
  load) neither deadlocks nor misses the new probe.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from egpu_preload.control import ControlClient, list_sessions
from egpu_preload.runtime import remote
from stub_job import ROOT
from test_durations import cupti_dir  # noqa: F401  (the stand-in libcupti)
from test_sass_runtime import STANDBY

SASS_STUB = Path(__file__).parent / "sass_stub"
PROBES = Path(__file__).parent / "probes"
RUN = re.compile(r"^\d+ run f=step2? enter=(\S+) record=(\S+)$", re.M)
STEP_RUN = re.compile(r"^\d+ run f=(step2?)\S* enter=(\S+) record=(\S+)$", re.M)
GRAPH_RUN = re.compile(r"^\d+ graph run enter=(\S*)$", re.M)
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
    def __init__(self, stub_job, stand_ins: tuple[Path, Path], tmp: Path, graph: bool = False, busy: bool = False,
                 flags: tuple[str, ...] = (), **env: str) -> None:
        """The C job of THREADS threads (``graph``: and a graph replayer), or with ``busy`` the Python one, under
        egpu-run --backend sass FLAGS."""
        sanitizer, self.app = stand_ins
        self.log, self.stop = tmp / "log", tmp / "stop"
        self.env = stub_job.env(self.log, EGPU_SANITIZER_LIB=str(sanitizer), **env)
        app = [sys.executable, str(SASS_STUB / "app_busy.py"), str(self.stop)] if busy else \
            [str(self.app), str(self.stop), str(THREADS)] + ["graph"] * graph
        self.proc = subprocess.Popen([sys.executable, "-c", "import launcher; launcher.run_main()", "--backend",
                                      "sass", *flags, *app], env=self.env, cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = [s for s in list_sessions(tmp / "egpu") if s.info and str(self.stop) in s.info["argv"]]
            if found and self.log.exists() and len(LAUNCH.findall(self.log.read_text())) > 20:
                self.client = ControlClient(found[0].pid, directory=tmp / "egpu", timeout=30)
                return
            time.sleep(0.05)
        self.stop.touch()
        raise AssertionError(f"no session: {self.proc.communicate(timeout=60)}")

    def runs(self) -> list[tuple[str, str]]:
        return RUN.findall(self.log.read_text()) if self.log.exists() else []

    def memory(self) -> list[str]:
        """The stand-in driver's device allocations and frees so far, in order."""
        return [ln.split(" ", 1)[1] for ln in self.log.read_text().splitlines()
                if " cuMemAlloc_v2" in ln or " cuMemFree_v2" in ln]

    def calls(self) -> list[str]:
        return [ln.split(" ", 1)[1] for ln in self.log.read_text().splitlines() if " sanitizer" in ln]

    def replays(self) -> list[tuple[str, ...]]:
        """What every module ran at each graph replay (a ``graph`` job)."""
        return [tuple(e.split(",")) for e in GRAPH_RUN.findall(self.log.read_text())] if self.log.exists() else []

    def wait_runs(self, n: int = 40, of: str = "runs") -> None:
        """Until ``n`` more launches (``of="replays"``: graph replays) ran, at most 20 s."""
        count = self.runs if of == "runs" else self.replays
        target = len(count()) + n
        deadline = time.monotonic() + 20
        while len(count()) < target and time.monotonic() < deadline:
            time.sleep(0.01)

    def finish(self) -> str:
        self.stop.touch()
        out, err = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, err
        return out

    def __enter__(self) -> "ThreadedJob":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None or exc[0] is not None:
            self.stop.touch()
            out, err = self.proc.communicate(timeout=60)
            if exc[0] is not None:   # what the job said, for the failure's report
                print(f"job exit {self.proc.returncode}\n{out[-2000:]}\n{err[-4000:]}")


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
        assert job.calls()[:3] == ["sanitizerSubscribe cb=1", *STANDBY]
        assert not [c for c in job.calls() if "Patch" in c or "domain=5" in c]
        assert job.runs() == []   # the launch domain is off: the stand-in never calls back
        a = job.client.request("attach", probe=probe_obj("count").read_bytes(), name="count")
        assert (a["sass"]["modules_patched"], a["sass"]["modules"]) == (2, 2), a["sass"]
        job.wait_runs()
        asked = job.client.request("modules")["sass"]["asked"]
        s = job.client.request("swap", old="count", new_probe=probe_obj("hash_count").read_bytes(),
                               new_name="hash_count")
        job.wait_runs()
        # Python was asked about each kernel at its first patched launch (by each thread that launched
        # it first at once); the swap staged the answers for both, so launches after it asked nothing
        assert 2 <= asked == job.client.request("modules")["sass"]["asked"]
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


@pytest.fixture(scope="module")
def step_cubins(tmp_path_factory) -> str:
    """APP_CUBINS for the threaded job: nvcc's cubins of step and of step2, one kernel each."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    d = tmp_path_factory.mktemp("cubins")
    for name in ("step", "step2"):
        (d / f"{name}.cu").write_text(f'extern "C" __global__ void {name}() {{}}\n')
        subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-o", str(d / f"{name}.cubin"), str(d / f"{name}.cu")],
                       check=True)
    return f"{d / 'step.cubin'}:{d / 'step2.cubin'}"


def test_a_live_probe_on_one_kernel_patches_its_module_only(stub_job, stand_ins, step_cubins, probe_obj, tmp_path,
                                                            monkeypatch):
    """From standby, a probe on step2 patches step2's module and leaves step's as it is (its launches run no
    patch), and the reply says so; a swap to a probe on every kernel patches both; one to a probe on no
    loaded kernel unpatches both and turns the launch callbacks off."""
    from egpu_preload.bpf.compile import compile_probe
    src = tmp_path / "one.bpf.c"
    src.write_text((PROBES / "count.bpf.c").read_text().replace('SEC("kprobe/*")', 'SEC("kprobe/step2")'))
    one = compile_probe(src, tmp_path / "one.bpf.o")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with ThreadedJob(stub_job, stand_ins, tmp_path, APP_CUBINS=step_cubins) as job:
        a = job.client.request("attach", probe=one.read_bytes(), name="one")
        at_attach = len(STEP_RUN.findall(job.log.read_text()))
        assert (a["sass"]["modules_patched"], a["sass"]["modules"]) == (1, 2), a["sass"]
        assert "SASS 1 of 2 modules patched (the other 1 runs no probe)" in remote.sass_words(a["sass"])
        job.wait_runs()
        s = job.client.request("swap", old="one", new_probe=probe_obj("count").read_bytes(), new_name="count")
        assert (s["sass"]["modules_patched"], s["sass"]["modules"]) == (2, 2), s["sass"]
        job.wait_runs()
        src.write_text(src.read_text().replace('SEC("kprobe/step2")', 'SEC("kprobe/not_loaded")'))
        none = compile_probe(src, tmp_path / "none.bpf.o")
        n = job.client.request("swap", old="count", new_probe=none.read_bytes(), new_name="none")
        assert (n["sass"]["modules_patched"], n["sass"]["modules"]) == (0, 2), n["sass"]
        out = job.finish()
    # nothing patched after the last swap: no launch callbacks for the job to pay
    assert job.calls()[-1] == "sanitizerEnableDomain on=0 domain=5", job.calls()[-3:]
    assert re.search(r"launches \d+ failed 0$", out, re.M)
    runs = STEP_RUN.findall(job.log.read_text())
    patched = lambda window: {f: {e.startswith("egpu_sass_block_enter_") for g, e, _ in window if g == f}
                              for f in ("step", "step2")}
    # the log is in about launch order: around the swap's first record, the threads' launches may interleave
    swapped = next(i for i, (_, _, rec) in enumerate(runs) if rec.startswith(f"{s['sass']['generation']}:"))
    assert patched(runs[at_attach:swapped - THREADS]) == {"step": {False}, "step2": {True}}
    done = max(i for i, (_, e, _) in enumerate(runs) if e != "-")
    assert patched(runs[swapped + THREADS:done - THREADS]) == {"step": {True}, "step2": {True}}


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
        made = len(job.memory())
        with pytest.raises(EgpuError, match=r"SASS back end: sanitizerPatchModule failed: 7 "
                                            r"\(SANITIZER_ERROR_OUT_OF_MEMORY\); the probes before it go on running"):
            job.client.request("swap", old="count", new_probe=probe_obj("hash_count").read_bytes(),
                               new_name="hash_count")
        # every region the refused swap made (hash_count's maps, the flip's copies) was freed again
        swap_allocs = [c for c in job.memory()[made:] if c.startswith("cuMemAlloc_v2")]
        assert swap_allocs and len(swap_allocs) == sum(c.startswith("cuMemFree_v2") for c in job.memory()[made:])
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
def cupti_apps(stand_ins, tmp_path_factory) -> tuple[Path, Path, Path, Path]:
    """(the stand-in libcupti, the job that dlopens it, the job linked with it, a profiler library linked
    with it, for the job to dlopen locally)."""
    d = tmp_path_factory.mktemp("cupti")
    cc = ["gcc", "-O1", "-Wall", "-Werror"]
    subprocess.run(cc + ["-shared", "-fPIC", str(SASS_STUB / "libcupti_stub.c"), "-o", str(d / "libcupti.so"), "-ldl"],
                   check=True)
    subprocess.run(cc + [str(SASS_STUB / "app_cupti.c"), "-o", str(d / "app_cupti"), "-ldl"], check=True)
    subprocess.run(cc + ["-DLINKED", str(SASS_STUB / "app_cupti.c"), "-o", str(d / "app_cupti_linked"), "-ldl",
                         f"-L{d}", "-lcupti", f"-Wl,-rpath,{d}"], check=True)
    subprocess.run(cc + ["-shared", "-fPIC", str(SASS_STUB / "profiler_lib.c"), "-o", str(d / "libprofiler.so"),
                         f"-L{d}", "-lcupti", f"-Wl,-rpath,{d}"], check=True)
    return d / "libcupti.so", d / "app_cupti", d / "app_cupti_linked", d / "libprofiler.so"


CUPTI_CALLERS = {"dlsym": lambda c: [str(c[1]), str(c[0])], "linked": lambda c: [str(c[2])],
                 "library": lambda c: [str(c[1]), str(c[3]), "start"]}


@pytest.mark.parametrize("caller", CUPTI_CALLERS)
@pytest.mark.parametrize("probe", [None, "count"], ids=["standby", "patching"])
def test_cupti_gets_the_tool_slot_from_standby(stub_job, stand_ins, cupti_apps, probe_obj, tmp_path, caller, probe):
    """CUPTI and the sanitizer share the driver's one tool slot (on the H200 a job in standby broke
    --durations and torch.profiler). In standby the sanitizer gives it up at the job's first CUPTI call,
    reached through dlsym, a link to libcupti or a library dlopened locally that links it; while a
    generation patches, it keeps it and CUPTI fails as it would have, the job running on either way."""
    env = stub_job.env(tmp_path / "log", EGPU_SANITIZER_LIB=str(stand_ins[0]))
    args = ["--backend", "sass", *(["-p", str(probe_obj(probe))] if probe else []), *CUPTI_CALLERS[caller](cupti_apps)]
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


@pytest.mark.parametrize("caller", CUPTI_CALLERS)
def test_cupti_callers_reach_their_own_libcupti_outside_standby(stub_job, stand_ins, cupti_apps, tmp_path, caller):
    """A job not in standby (the default) leaves CUPTI alone: a caller of any kind reaches the libcupti it
    loaded, one dlopened locally as a library's dependency too (on the H200, torch.profiler saw no kernel
    while the shim looked for kineto's libcupti in the global scope only)."""
    env = stub_job.env(tmp_path / "log", EGPU_SANITIZER_LIB=str(stand_ins[0]))
    r = subprocess.run([sys.executable, "-c", "import launcher; launcher.run_main()",
                        *CUPTI_CALLERS[caller](cupti_apps)], env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert "cupti register=0 enable=0 launch=0" in r.stdout, r.stdout


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


def test_a_graph_replay_waits_for_a_flip(stub_job, stand_ins, probe_obj, tmp_path, monkeypatch):
    """Re-patching takes 20 ms a module while a thread replays a graph every 200 us: every replay finds
    both modules on one generation's patch (or both unpatched), never one old and one new."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with ThreadedJob(stub_job, stand_ins, tmp_path, graph=True, EGPU_STUB_SANITIZER_DELAY_US="20000") as job:
        job.client.request("attach", probe=probe_obj("count").read_bytes(), name="count")
        job.wait_runs(20, of="replays")
        job.client.request("swap", old="count", new_probe=probe_obj("hash_count").read_bytes(), new_name="hash_count")
        job.wait_runs(20, of="replays")
        job.client.request("detach")
        job.wait_runs(20, of="replays")
        job.finish()
    replays = job.replays()
    mixed = [r for r in replays if len(set(r)) > 1]
    assert not mixed, f"{len(mixed)} of {len(replays)} replays ran mid-flip: {mixed[:3]}"
    patched = {r[0] for r in replays if r[0].startswith("egpu_sass_block_enter_")}
    assert len(patched) == 2 and len(replays[-1]) == 2   # both probes replayed, in both modules



def test_a_module_loaded_during_a_flip(stub_job, stand_ins, probe_obj, tmp_path, monkeypatch):
    """The swap's first re-patch (the sanitizer's third sanitizerPatchModule) waits for a module load on
    another thread, as the real sanitizer may wait for a driver lock that load holds: the load's callback
    must not wait for the flip in turn. The late module runs the new probe once the swap replies."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with ThreadedJob(stub_job, stand_ins, tmp_path, EGPU_STUB_SANITIZER_LOAD_IN="3") as job:
        job.client.request("attach", probe=probe_obj("count").read_bytes(), name="count")
        job.wait_runs()
        s = job.client.request("swap", old="count", new_probe=probe_obj("hash_count").read_bytes(),
                               new_name="hash_count")
        job.wait_runs()
        job.client.request("detach")
        job.finish()
    calls = job.calls()
    assert not [c for c in calls if "deadlock" in c], calls
    assert (s["sass"]["modules_patched"], s["sass"]["modules"]) == (3, 3), s["sass"]
    swap_entry = {e for e, r in job.runs() if r != "-"} - {job.runs()[0][0]}
    patched = [c.split("name=")[1] for c in calls if c.startswith("sanitizerPatchInstructions id=1")]
    assert len(swap_entry) == 1 and patched.count(swap_entry.pop()) == 3   # the late module too


def test_a_change_reports_its_phases_in_a_gil_busy_job(stub_job, stand_ins, probe_obj, tmp_path, monkeypatch):
    """A Python job that holds the GIL between launches, as a PyTorch eager step does: the replies say where
    each change spent its time (the GPU test keeps them), and an attach of a probe set seen before finds
    its patch image built (no ptxas)."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    count = probe_obj("count").read_bytes()
    with ThreadedJob(stub_job, stand_ins, tmp_path, busy=True) as job:
        replies = []
        for _ in range(2):
            replies.append(job.client.request("attach", probe=count, name="count"))
            replies.append(job.client.request("detach"))
        out = job.finish()
    assert re.search(r"app_busy launches \d+ failed 0", out), out
    first, again = replies[0], replies[2]
    for r in (first, again):
        assert set(r["phases_ms"]) == {"verify", "maps", "instrument", "sass", "flip", "publish", "unload", "gc"}
        assert set(r["sass"]["phases_ms"]) == {"translate", "image", "stage"}
        assert {"patch_ms", "drain_ms", "asked"} <= set(r["sass"]), r["sass"]
    assert again["sass"]["phases_ms"]["image"] < first["sass"]["phases_ms"]["image"] / 10   # cached
    assert replies[1]["sass"]["modules_patched"] == 0   # standby again
