"""egpu's benchmark suite on the GPU machine: ``python3 bench/suite.py [OUT_DIR [PART...]]`` (default
$OUT, else the current directory) writes OUT_DIR/suite.json and OUT_DIR/suite.md; bench/plots.py draws
the JSON. PARTs are workload names and "parts" (JIT, shim per launch, hot swap); none: all. All of it
takes longer than one 10-minute device call, so run it in parts (``suite.py OUT parts vecadd stencil``,
``suite.py OUT2 gemm cupy torch_compile``, and torch_eager a few modes at a time, SUITE_MODES: its paired
rounds take about 2.5 minutes a mode); bench/combine.py makes one report of such part runs.
Needs nvcc, the shim's build tools and the probes prebuilt by scripts/gpu-prep.sh
(EGPU_PREBUILT_PROBES or .gpubuild/probes; the GPU machine has no clang); PyTorch, Triton and CuPy for
their workloads (a workload that cannot run is reported as failed, the rest go on).

Workloads (bench/workloads): vecadd, stencil and a shared-memory GEMM built by nvcc with PTX
(compute_90) and SASS; a CuPy RawKernel; a torch.compile'd model step (Triton); a stock PyTorch eager
training step (SASS only: egpu's SASS back end serves the probes there). Each program times its own
steady state (protocol in bench/workloads/kernels.cu): a warm-up unit of work, a calibration, then up to
REPS repetitions of about 100 ms (at least 3, fewer than REPS only when BUDGET_S seconds of them are used
up), so process start-up, compilation and the JIT stay out of the ratios, which compare time per unit
(a launch, a training step, a forward). One process per (workload, mode):

    plain           uninstrumented
    shim            egpu-run with no probe
    entry_exit      egpu-run -p bench/probes/entry_exit (kprobe + kretprobe counters, every thread)
    mem_count       egpu-run -p bench/probes/mem_count (a counter bumped by every global access)
    mem_trace       egpu-run --trace F -p examples/access_trace (a 72-byte record per lane's global access)
    mem_trace_warp  egpu-run --trace F -p examples/mem_trace_warp (a record per warp instruction, 72 bytes
                    when the lanes' addresses are affine: the same trace, expanded by its reader)
    torch_profiler  uninstrumented inside torch.profiler (CUPTI), PyTorch workloads only

Host-bound workloads (HOST_BOUND: the eager PyTorch step, whose processes differ by 10-20%) run in
PAIRS interleaved rounds of every mode but the full traces on the same pinned CPUs, each mode's ratio the
median of the per-round ratios to that round's plain run, with their spread (bench/paired.py); the full
traces, far above any goal a pair could move, run once (SUITE_TRACE_PAIRS=1: in every round too, for a
trace cell that rests on pairs as issue 23 asks). A cell's first round is its record (the probe check reads
it).

Also measured: the JIT cost of a 1,100-instruction kernel (bench_jit.py) and per module in the runs
above (the runtime's exit dump), the shim's cost per launch (bench_shim.py: plain and shim
round-robin, pinned), and hot-swap latency (egpu attach/swap/detach on a running job), each skipped with
its reason when it cannot run. Whatever runs past DEADLINE_S (SUITE_DEADLINE_S in the environment, to fit
a device call beside other work) is skipped and says so.

SUITE_FIXED_LAYOUT=1 in the environment runs every case's process with address-space randomization off and
PYTHONHASHSEED=0: an experiment on why processes of one host-bound program differ by 10-20% in CPU time per
step (2026-12-05d), where a layout that moves run to run (cache and TLB sets, Python's hash order) may be
the cause. Off by default: numbers taken with it compare only with numbers taken with it.
"""

from __future__ import annotations

import ctypes
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
sys.path[:0] = [str(ROOT), str(BENCH)]

import bench_jit  # noqa: E402
import bench_shim  # noqa: E402
import paired  # noqa: E402
import probe_check  # noqa: E402
import provenance  # noqa: E402
import results  # noqa: E402

REPS, BUDGET_S = 10, 3.0
DEADLINE_S = int(os.environ.get("SUITE_DEADLINE_S", 480))  # the whole suite; what would start later is skipped
# Every case on the same CPUs: the host-bound PyTorch steps varied 1.4-2.2 ms between unpinned processes
# of the same program (2026-12-02), more than the shim's cost they were to show.
CASE_CPUS = 4
TIMEOUT_S = {"cuda": 60, "python": 150}
# A full trace of a 16 Mi-thread launch is 4 GB of records, and a case runs at least five launches: at 60 s
# the H200's vecadd and stencil cells ended with no repetition (2026-12-04b), which measures nothing.
TRACE_TIMEOUT_S = 240
ABORT_GRACE_S = 10.0   # after SIGABRT, for a timed-out case's stacks to be written
STACKS_S = 60.0        # for a debugger to print a timed-out case's native stacks, every process
FIXED_LAYOUT = os.environ.get("SUITE_FIXED_LAYOUT") == "1"   # the docstring's experiment
TRACE_PAIRS = os.environ.get("SUITE_TRACE_PAIRS") == "1"     # full traces in every round of a host-bound workload
ADDR_NO_RANDOMIZE = 0x0040000   # linux/personality.h
STDERR_KEPT = 40000    # of a timed-out case's stderr, native stacks included
SHIM_LAUNCHES, SHIM_RUNS = 100_000, 11
HOST_BOUND, PAIRS = frozenset({"torch_eager"}), paired.MIN_PAIRS
SWAP_CYCLES = 10
WORKLOADS = {"vecadd": "cuda", "stencil": "cuda", "gemm": "cuda",
             "cupy": "python", "torch_eager": "python", "torch_compile": "python"}
# The warp-record trace before the per-lane one: under a deadline the cheaper full trace is measured first.
PROBES = {"entry_exit": "bench/probes/entry_exit", "mem_count": "bench/probes/mem_count",
          "mem_trace_warp": "examples/mem_trace_warp", "mem_trace": "examples/access_trace"}
WITNESS = "bench/probes/launch_threads"  # beside entry_exit in its witness run (bench/probe_check.py)
SESSION_RE = re.compile(r"session kept in (\S+)")


def egpu_run() -> list[str]:
    return [sys.executable, "-c",
            f"import sys; sys.path.insert(0, {str(ROOT)!r}); import launcher; launcher.run_main()"]


def base_env(work: Path) -> dict[str, str]:
    """The environment of every case: no egpu settings from outside (EGPU_SHIM aside), our import
    path, fresh caches in ``work``, CuPy handing the driver PTX in every mode (egpu-run sets it anyway:
    the same code runs plain), one inductor compile thread (no worker pool to start), and the driver's
    JIT cache off so each instrumented load pays its JIT where the dump records it; Python's fault handler on,
    for the stacks of a case that hangs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EGPU_") or k == "EGPU_SHIM"}
    env.update(XDG_RUNTIME_DIR=str(work), PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
               CUPY_COMPILE_WITH_PTX="1", CUPY_CACHE_DIR=str(work / "cupy"),
               TORCHINDUCTOR_CACHE_DIR=str(work / "inductor"), TRITON_CACHE_DIR=str(work / "triton"),
               TORCHINDUCTOR_COMPILE_THREADS="1", CUDA_CACHE_DISABLE="1", PYTHONUNBUFFERED="1",
               PYTHONFAULTHANDLER="1")   # a case past its time prints each thread's stack (run_session)
    return env


def build_kernels(work: Path) -> Path:
    """bench/workloads/kernels.cu built into ``work`` with PTX (for egpu) and sm_90 SASS (plain runs)."""
    exe = work / "kernels"
    subprocess.run(["nvcc", "-O2", "-gencode", "arch=compute_90,code=[sm_90,compute_90]",
                    str(BENCH / "workloads" / "kernels.cu"), "-o", str(exe)], check=True)
    return exe


def workload_cmd(name: str, exe: Path, profile: bool = False) -> list[str]:
    if WORKLOADS[name] == "cuda":
        return [str(exe), name, str(REPS), str(BUDGET_S)]
    return [sys.executable, str(BENCH / "workloads" / "frameworks.py"), name, str(REPS), str(BUDGET_S),
            *(["--profile"] if profile else [])]


def modes_for(name: str) -> list[str]:
    """The workload's modes; SUITE_MODES (comma-separated) keeps only those named, to fit a device call."""
    modes = ["plain", "shim", *PROBES, *(["torch_profiler"] if name.startswith("torch") else [])]
    kept = {m.strip() for m in os.environ.get("SUITE_MODES", "").split(",") if m.strip()}
    unknown = kept - {*modes, "torch_profiler"}
    if unknown:
        raise SystemExit(f"suite.py: SUITE_MODES names no mode {', '.join(sorted(unknown))}")
    if kept and "plain" not in kept:
        raise SystemExit("suite.py: SUITE_MODES must keep plain: every ratio and probe check is against it")
    return [m for m in modes if m in kept] if kept else modes


def case_cmd(name: str, mode: str, exe: Path, probes: dict[str, Path], witness: Path | None = None) -> list[str]:
    """The case's command; with ``witness``, the launch-thread counter loaded after the mode's probe."""
    if mode in ("plain", "torch_profiler"):
        return workload_cmd(name, exe, profile=mode == "torch_profiler")
    loaded = [probes[mode]] if mode in probes else []
    trace = ["--trace", str(trace_file(exe))] if mode in probe_check.TRACED else []
    flags = [a for p in loaded + ([witness] if witness else []) for a in ("-p", str(p))]
    return [*egpu_run(), "--keep", *trace, *flags, *workload_cmd(name, exe)]


def prepare(work: Path) -> tuple[dict[str, str], Path, dict[str, Path]]:
    """The cases' environment, kernels and probes in ``work``; a stale shim built now, untimed."""
    env = base_env(work)
    exe = build_kernels(work)
    probes = {m: bench_jit.probe_object(src, bench_jit.prebuilt_dir(), work) for m, src in PROBES.items()}
    subprocess.run([*egpu_run(), "true"], env=env, cwd=ROOT, capture_output=True)
    return env, exe, probes


def case_limit(name: str, mode: str) -> float:
    """How long a case may run: a full trace drains gigabytes."""
    return TRACE_TIMEOUT_S if mode in probe_check.TRACED else TIMEOUT_S[WORKLOADS[name]]


def run_workload_case(name: str, mode: str, exe: Path, probes: dict[str, Path], env: dict[str, str],
                      timeout: float, cpus: set[int] | None, witness: Path | None = None) -> dict[str, Any]:
    """One case (run_case) in its workload's environment; a warp trace's lanes counted from its files, which
    are removed then (gigabytes: one case's at a time)."""
    # nvcc programs load eagerly: the instrumented image's JIT falls inside the load the dump times
    case_env = {**env, "CUDA_MODULE_LOADING": "EAGER"} if WORKLOADS[name] == "cuda" else env
    rec = run_case(case_cmd(name, mode, exe, probes, witness), case_env, timeout, cpus)
    files = sorted(trace_file(exe).parent.glob(trace_file(exe).stem + "*"))
    if mode == "mem_trace_warp" and "trace" in rec:
        count_lanes(rec["trace"], files)
    for f in files:
        f.unlink()
    return rec


def count_lanes(trace: dict[str, Any], files: list[Path]) -> None:
    """Into a mem_trace_warp case's ``trace``: the lanes its files' warp records stand for (the rows egpu
    trace expands them to), or why they do not stand for the job's records: a file not closed, records
    that are none, or a count other than the one the job reported delivered."""
    import pyarrow.compute as pc

    from egpu_preload.output import tracefile, warp_records
    lanes = records = 0
    try:
        for f in files:
            read = tracefile.read(f, {})
            if not read.complete:
                raise ValueError(f"{f.name} was not closed")
            names = read.rows.column("map").cast("string")
            for m, t in read.record_types.items():
                if t == warp_records.RECORD_TYPE:
                    rows = read.rows.filter(pc.equal(names, m))
                    lanes, records = lanes + warp_records.lane_count(rows), records + rows.num_rows
    except Exception as e:  # noqa: BLE001  (pyarrow's, egpu's and memory errors alike: the cell fails, not the suite)
        trace["lanes_error"] = f"{type(e).__name__}: {e}"
        return
    if records != trace["records"]:
        trace["lanes_error"] = f"the files hold {records:,} warp records, the job reported {trace['records']:,}"
        return
    trace["lanes"] = lanes


def trace_file(exe: Path) -> Path:
    """Where a mem_trace case writes its trace (beside the kernels; each case's is removed after it): an
    Arrow IPC file, the form the writer keeps up with best (bench_trace.py times both)."""
    return exe.parent / "trace.arrow"


def exit_on_term() -> None:
    """SIGTERM (``timeout`` on a bench) as SystemExit, so that run_case kills the case it waits for: its
    own session outlives the bench otherwise, and took CPUs and the GPU from the next bench (an H200 call
    of 2026-12-04b measured a uprobe at 181 ns beside one, 70-91 ns without)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def run_session(cmd: list[str], env: dict[str, str], timeout: float, cpus: set[int] | None = None
                ) -> tuple[subprocess.CompletedProcess[str], float, bool]:
    """Run ``cmd`` in a session of its own (killed whole on timeout: egpu-run's job too, and whenever this
    bench stops: exit_on_term), on ``cpus`` when given; (what it did, its wall time, whether it timed out).
    Past ``timeout`` the session gets SIGABRT first, on which Python processes with PYTHONFAULTHANDLER set
    print every thread's stack (where a hung job waits: its threads, egpu's ring reader among them), then,
    ABORT_GRACE_S later, SIGKILL; no core file is written (a CUDA process's would be gigabytes)."""
    t = time.perf_counter()
    personality = ctypes.CDLL(None, use_errno=True).personality if FIXED_LAYOUT else None   # looked up before fork
    if FIXED_LAYOUT:
        env = {**env, "PYTHONHASHSEED": "0"}

    def start() -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if cpus:
            os.sched_setaffinity(0, cpus)
        if personality is not None and personality(ADDR_NO_RANDOMIZE) == -1:   # inherited by exec and children
            raise OSError(ctypes.get_errno(), "personality(ADDR_NO_RANDOMIZE) refused: SUITE_FIXED_LAYOUT cannot hold")
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=start)
    timed_out = False
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stacks = native_stacks(proc.pid)
        os.killpg(proc.pid, signal.SIGABRT)
        try:
            stdout, stderr = proc.communicate(timeout=ABORT_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
        stderr += stacks
        timed_out = True
    except BaseException:   # the bench itself stopped (terminated: a call's timeout): its case stops too
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr), time.perf_counter() - t, timed_out


def native_stacks(session: int) -> str:
    """Every thread's native stack in the processes of ``session`` that hold the CUDA driver (all of them
    where none does), as a debugger prints them ("" with none on the PATH): where Python's stacks end in C
    (a driver call that never returns), these go on into the driver. cuda-gdb is the one the GPU machine has
    (no gdb there); attached, it stops the process a moment. STACKS_S for them all."""
    debugger = shutil.which("cuda-gdb") or shutil.which("gdb")
    if debugger is None:
        return ""
    pids = session_pids(session)
    cuda = [pid for pid in pids if maps_cuda(pid)]
    deadline, out = time.monotonic() + STACKS_S, []
    for pid in cuda or pids:
        left = deadline - time.monotonic()
        if left < 1:
            out.append(f"\n== native stacks of pid {pid}: no time left ==")
            continue
        try:
            r = subprocess.run([debugger, "-nx", "-batch", "-p", str(pid), "-ex", "thread apply all bt 30"],
                               capture_output=True, text=True, timeout=left)
            text, why = r.stdout, r.stderr
        except subprocess.TimeoutExpired as e:   # its output so far comes as bytes, text=True or not
            text, why = (e.stdout or b"").decode(errors="replace"), f"the debugger ran past {left:.0f} s"
        frames = [line for line in text.splitlines() if line.startswith(("Thread ", "#"))]
        out.append(f"\n== native stacks of pid {pid} ({Path(debugger).name}) ==\n" +
                   "\n".join(frames or why.strip().splitlines()[-5:]))
    return "".join(out)


def maps_cuda(pid: int) -> bool:
    try:
        return "libcuda.so" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def session_pids(session: int) -> list[int]:
    """The processes whose session id is ``session`` (/proc/PID/stat's sixth field)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == session:
                pids.append(int(d.name))
    return sorted(pids)


def run_case(cmd: list[str], env: dict[str, str], timeout: float, cpus: set[int] | None = None) -> dict[str, Any]:
    """Run one case (run_session), parse what it printed, and read the runtime's dumps when egpu-run kept a
    session."""
    done, wall_s, timed_out = run_session(cmd, env, timeout, cpus)
    stdout, stderr, status = done.stdout, done.stderr, "timeout" if timed_out else "ok"
    rec: dict[str, Any] = {"status": status, "wall_s": wall_s, **results.parse_output(stdout)}
    if status == "ok" and (done.returncode or rec["digest"] is None):
        rec["status"] = "failed"
    if rec["status"] != "ok":
        rec["error"] = f"exit {done.returncode}: " + (stderr.strip().splitlines() or [""])[-1][-300:]
    if timed_out:   # the threads' stacks at SIGABRT (run_session), with what the job said before
        rec["stderr_tail"] = stderr[-STDERR_KEPT:]
    m = SESSION_RE.search(stderr)
    if m:
        rec.update(dump_facts(Path(m.group(1))))
        shutil.rmtree(m.group(1), ignore_errors=True)
    return rec


def dump_facts(session: Path) -> dict[str, Any]:
    """From the job's exit dumps: probe load time, per-module rewrite and driver times, ring records."""
    from egpu_preload.runtime import dump
    try:
        docs = dump.read_all(session)
    except Exception as e:  # a dump we cannot read must not lose the timings
        return {"dump_error": str(e)}
    return facts_from_dumps(docs)


def facts_from_dumps(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per module its load's timings, the ring records kept and dropped, the shim's counters summed
    over the processes (python_calls against launches says whether a hook went into Python often), the
    SASS back end's counters summed the same way (with the states seen), and the probes' array maps (what
    probe_check reads)."""
    modules, records, drops, streamed, paces = [], 0, 0, False, []
    stats: dict[str, int] = {}
    sass: dict[str, Any] = {"states": []}
    for d in docs:
        if d.get("trace"):   # egpu-run --trace: what reached the file, and what the probes dropped
            streamed = True
            records += d["trace"]["records"]
            drops += d["trace"]["dropped"]
            if "drain" in d["trace"]:   # where each process's drain spent its time (streaming.pace)
                paces.append(d["trace"]["drain"])
        for name, n in d.get("stats", {}).items():
            stats[name] = stats.get(name, 0) + n
        for name, v in (d.get("sass") or {}).items():
            if name == "state":
                sass["states"].append(v)
            elif isinstance(v, int):
                sass[name] = sass.get(name, 0) + v
        probes_ms = d.get("timing", {}).get("probes_ms")
        for m in d.get("modules", []):
            timing = m.get("timing") or {}
            if timing:
                modules.append({"image": m.get("image", "?"), "status": m.get("status", "?"), "probes_ms": probes_ms,
                                "kernels": sum(k[1] == "instrumented" for k in m.get("kernels", [])), **timing})
        for p in d.get("probes", []) if not d.get("trace") else []:
            for storage in p.get("maps", []):
                if "records" in storage and "drops" in storage:
                    records += len(storage["records"])
                    drops += storage["drops"]
    return {"modules": modules, "trace": {"records": records, "drops": drops, "streamed": streamed,
                                          **({"drain": paces} if paces else {})},
            "shim_stats": stats, "sass": sass, "counts": probe_check.counts_from_dumps(docs)}


def hot_swap(work: Path, env: dict[str, str], probes: dict[str, Path], seconds: float) -> dict[str, Any]:
    """attach / swap / detach cycles on tests/e2e/swap_loop.cu running under egpu-run with no probe, as
    many as fit in ``seconds`` up to SWAP_CYCLES."""
    until = time.monotonic() + seconds
    from egpu_preload.control import ControlClient, list_sessions

    exe = work / "swap_loop"
    subprocess.run(["nvcc", "-O2", "-arch=sm_90", str(ROOT / "tests/e2e/swap_loop.cu"), "-o", str(exe)], check=True)
    stop = work / "swap_stop"
    job = subprocess.Popen([*egpu_run(), str(exe), "10000000", "50", str(stop)], env=env, cwd=ROOT,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        client = None
        while client is None and time.monotonic() < until and job.poll() is None:
            for s in list_sessions(work / "egpu"):
                if s.info and str(exe) in s.info.get("argv", []) and s.info.get("launches", 0) > 0:
                    client = ControlClient(s.pid, directory=work / "egpu", timeout=60)
            time.sleep(0.05)
        if client is None:
            return {"skipped": f"no session of the running job (status {job.poll()})"}
        return swap_latency(client, probes["entry_exit"].read_bytes(), probes["mem_count"].read_bytes(), until)
    finally:
        stop.touch()
        try:
            job.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()


def swap_latency(client: Any, a: bytes, b: bytes, until: float) -> dict[str, Any]:
    """Up to SWAP_CYCLES cycles of attach a, swap a for b, detach b (at least one, more while before
    ``until``): the flip time the job reports and the round trip seen here, in ms."""
    flip: dict[str, list[float]] = {"attach": [], "swap": [], "detach": []}
    trip: dict[str, list[float]] = {"attach": [], "swap": [], "detach": []}
    for _ in range(SWAP_CYCLES):
        if time.monotonic() > until and flip["detach"]:
            break
        for cmd, fields in (("attach", {"probe": a, "name": "a"}),
                            ("swap", {"old": "a", "new_probe": b, "new_name": "b"}),
                            ("detach", {"name": "b"})):
            t = time.perf_counter()
            reply = client.request(cmd, **fields)
            trip[cmd].append((time.perf_counter() - t) * 1e3)
            flip[cmd].append(reply["seconds"] * 1e3)
    return {"cycles": len(flip["detach"]), "flip_ms": {c: spread(v) for c, v in flip.items()},
            "round_trip_ms": {c: spread(v) for c, v in trip.items()}}


def spread(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "max": max(values), "runs": values}


def guarded(what: str, fn, *args) -> dict[str, Any]:
    """A part of the suite that may be unable to run here: its result, or why it was skipped."""
    try:
        return fn(*args)
    except Exception as e:  # the report says why; the other parts still run
        return {"skipped": f"{what}: {type(e).__name__}: {str(e).strip()[-400:]}"}


def meta() -> dict[str, Any]:
    """Where and what ran: bench/provenance.py's stamp (commit and dirty state of the files here, GPU,
    driver, time, log) and the suite's settings."""
    return {**provenance.stamp(), "reps": REPS, "budget_s": BUDGET_S, "fixed_layout": FIXED_LAYOUT,
            "trace_pairs": TRACE_PAIRS}


def rounds_of(name: str) -> list[list[str]]:
    """The modes each round of a workload runs: every mode once, host-bound ones PAIRS rounds of every
    mode but the full traces (the first round runs those too)."""
    modes = modes_for(name)
    if name not in HOST_BOUND:
        return [modes]
    later = modes if TRACE_PAIRS else [m for m in modes if m not in probe_check.TRACED]
    return [modes] + [later] * (PAIRS - 1)


def round_ms(rec: dict[str, Any]) -> float | None:
    """A host-bound case's share of its round's pair: its median unit, None for a lost process or a trace that
    dropped records (it timed less work than the others)."""
    kept = rec["status"] == "ok" and rec["unit_ms"] and not rec.get("trace", {}).get("drops")
    return statistics.median(rec["unit_ms"]) if kept else None


def selected(argv: list[str]) -> tuple[list[str], bool]:
    """The workloads and whether the parts (JIT, shim, hot swap) run, from the command line's PARTs."""
    unknown = [a for a in argv if a != "parts" and a not in WORKLOADS]
    if unknown:
        raise SystemExit(f"suite.py: unknown part {unknown[0]!r} (workloads: {', '.join(WORKLOADS)}, or parts)")
    if not argv:
        return list(WORKLOADS), True
    return [w for w in WORKLOADS if w in argv], "parts" in argv


def main() -> None:
    exit_on_term()
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "."))
    workloads, parts = selected(sys.argv[2:])
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    left = lambda: DEADLINE_S - (time.monotonic() - start)  # noqa: E731
    doc: dict[str, Any] = {"meta": meta(), "notes": []}
    not_run = {"skipped": "not selected on the command line"}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env, exe, probes = prepare(work)
        witness = bench_jit.probe_object(WITNESS, bench_jit.prebuilt_dir(), work)
        print("suite: JIT cost", flush=True)
        doc["jit"] = guarded("bench_jit", bench_jit.measure, work) if parts else not_run
        print("suite: shim per launch", flush=True)
        doc["shim"] = (guarded("bench_shim", bench_shim.measure, work, SHIM_LAUNCHES, SHIM_RUNS, ("plain", "shim"))
                       if parts else not_run)
        print("suite: hot swap", flush=True)
        doc["hot_swap"] = guarded("hot swap", hot_swap, work, env, probes, 20.0) if parts else not_run
        cases: dict[str, dict[str, dict[str, Any]]] = {}
        cpus = bench_shim.pick_cpus(CASE_CPUS)
        doc["meta"]["cpus"] = sorted(cpus or ())
        for name in workloads:
            cases[name] = {}
            for i, modes in enumerate(rounds_of(name)):
                for mode in modes:
                    if left() < 30:
                        cases[name].setdefault(mode, {"status": "skipped (time budget)", "reps": [], "unit_ms": []})
                        continue
                    rec = run_workload_case(name, mode, exe, probes, env, min(case_limit(name, mode), left()), cpus)
                    if i == 0 and mode == "entry_exit" and rec["status"] == "ok" and left() > 30:
                        rec["check_run"] = run_workload_case(name, mode, exe, probes, env,
                                                             min(case_limit(name, mode), left()), cpus, witness)
                    first = cases[name].setdefault(mode, rec)
                    if name in HOST_BOUND:
                        first.setdefault("rounds_ms", []).append(round_ms(rec))
                    print(f"suite: {name:>13} {mode:>14} round {i}: {rec['status']:>7} {len(rec['unit_ms']):2d} reps "
                          f"median {statistics.median(rec['unit_ms']) * 1e3 if rec['unit_ms'] else float('nan'):10.1f}"
                          " us/unit "
                          f"({rec['wall_s']:.1f} s)" + (f"  {rec.get('error', '')}" if rec["status"] != "ok" else ""),
                          flush=True)
        doc["cases"] = cases
    results.complete(doc)
    doc["meta"]["total_s"] = round(time.monotonic() - start)
    print(results.publish(doc, out_dir))


if __name__ == "__main__":
    main()
