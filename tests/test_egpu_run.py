"""egpu-run end to end against the stand-in driver (stub_job.py): the job's exit status, maps printed
after it, probes checked before it starts, programs that do not exist, signals, options that stop at
CMD, and jobs of several processes (a shell's, multiprocessing workers)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import _cffi_backend
import pytest

from egpu_preload.runtime import dump, job
from stub_job import MORE, ROOT, egpu_run

BAD_PROBE = """#include "egpu.bpf.h"
struct {__uint(type,BPF_MAP_TYPE_HASH);__uint(max_entries,1);__type(key,__u32);__type(value,__u64);} m SEC(".maps");
SEC("kprobe/*")
int unchecked(struct egpu_ctx *ctx)
{
	__u32 k = 0;
	__u64 *v = bpf_map_lookup_elem(&m, &k);
	return *v;  /* no NULL check */
}
char LICENSE[] SEC("license") = "GPL";
"""


@pytest.mark.parametrize("status, exit_status", [("0", 0), ("3", 3), ("kill", 128 + signal.SIGTERM)])
def test_exit_status_is_the_jobs(stub_job, probe_obj, tmp_path, status, exit_status):
    r = egpu_run(["-p", str(probe_obj("count")), str(stub_job.app), "module", "2", "64", status],
                 stub_job.env(tmp_path / "log"))
    assert r.returncode == exit_status, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "app_vec module launches=2 threads=64 result=0"
    if status == "kill":  # killed before its exit handlers and before a mirror copy: egpu-run says so
        assert lines == lines[:1]
        assert r.stderr.splitlines() == ["egpu-run: no maps: the job was killed by signal 15 (SIGTERM) before "
                                         "any copy of its maps (--mirror 1: a copy every 1 s)"]
    else:
        assert lines[1:] == ["@counts: 128"]   # 2 launches x 64 threads, counted at the launch
        assert r.stderr == ""


def test_a_job_that_closes_every_descriptor_keeps_its_maps_and_its_files(stub_job, tmp_path):
    """A daemon's close of every descriptor above stderr, egpu's sockets among them, and files opened after it
    on their numbers: the exit dump failed (EBADF, or ENOTSOCK on the program's file), losing the maps, and
    closing egpu's sockets at exit would close the program's files before stdio flushed them."""
    out = tmp_path / "out.txt"
    r = egpu_run(["-p", str(ROOT / "examples" / "launch_count.bpf.c"), str(stub_job.app), "module", "3", "32",
                  "closefds"], stub_job.env(tmp_path / "log", APP_VEC_FILE=str(out)))
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert r.stdout.splitlines()[:2] == ["app_vec module launches=3 threads=32 result=0", "@launches[vecadd]: 3"]
    assert sorted(out.read_text().splitlines()) == [f"line {i}" for i in range(4)]


# A daemon that closes every descriptor above stderr once the runtime has made its first map mirror, then opens files
# of its own (on the lowest numbers free) and writes a line to each through Python's buffers, flushed at its exit.
AFTER_THE_MIRROR = """import os, sys, time
sys.path.insert(0, sys.argv[1])
import app_vec
from egpu_preload.runtime.mirror import mirror_path
app_vec.launch("module", 2, 32)
deadline = time.monotonic() + 20
while not mirror_path(os.getpid()).exists() and time.monotonic() < deadline:
    time.sleep(0.05)
os.closerange(3, 1024)
mine = [open(sys.argv[2], "a") for _ in range(20)]
for f in mine:
    f.write("mine\\n")
"""


def test_a_job_that_closes_every_descriptor_after_the_mirror_keeps_every_line_of_its_files(stub_job, probe_obj,
                                                                                         tmp_path):
    """The map mirror's segment held two descriptors (its file's and mmap's copy of it), which the job's files then
    took: the mirror's close at exit closed two of the job's files before Python flushed them, their lines lost."""
    out = tmp_path / "out.txt"
    r = egpu_run(["--mirror", "0.05", "-p", str(probe_obj("count")), sys.executable, "-c", AFTER_THE_MIRROR,
                  str(MORE), str(out)], stub_job.env(tmp_path / "log"))
    assert (r.returncode, r.stderr, r.stdout) == (0, "", "@counts: 64\n"), r.stderr
    assert out.read_text() == "mine\n" * 20


@pytest.mark.parametrize("closed", ["<&-", ">&-"])
def test_a_job_started_with_stdin_or_stdout_closed_never_reads_or_writes_egpus_socket(stub_job, tmp_path, closed):
    """CMD <&- or CMD >&-: the runtime's control socket took the closed number, so the job's reads of stdin
    waited on egpu's socket for ever and its writes to stdout filled that socket until they blocked."""
    data = tmp_path / "data"
    data.write_bytes(bytes(range(256)) * 4096)
    maps = tmp_path / "maps.txt"
    r = egpu_run(["-p", str(ROOT / "examples" / "launch_count.bpf.c"), "-o", str(maps), "sh", "-c",
                  f'timeout 20 "$0" module 3 32 cat < "$1" {closed}', str(stub_job.app), str(data)],
                 stub_job.env(tmp_path / "log"))
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert maps.read_text().splitlines()[0] == "@launches[vecadd]: 3"


CRASH = """import os, signal, sys
sys.path.insert(0, sys.argv[1])
import app_vec
app_vec.launch("module", 2, 32)
print("launched", flush=True)
os.kill(os.getpid(), int(sys.argv[2]))
"""


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGABRT, signal.SIGKILL])
def test_a_job_that_crashes_exits_as_a_shell_says(stub_job, probe_obj, tmp_path, sig):
    """A job that dies of a crash or SIGKILL once the shim's Python is up in it: egpu-run exits 128 + N, as a
    shell reports it, and says so (only SIGTERM, SIGINT and SIGHUP, which egpu-run forwards, had a test)."""
    r = egpu_run(["-p", str(probe_obj("count")), sys.executable, "-c", CRASH, str(MORE), str(int(sig))],
                 stub_job.env(tmp_path / "log"))
    assert (r.returncode, r.stdout) == (128 + sig, "launched\n"), r.stderr
    assert f"killed by signal {int(sig)} ({sig.name})" in r.stderr


def test_maps_all_empty_say_so(stub_job, probe_obj, tmp_path):
    """Empty maps print nothing (as bpftrace's): then a line on stderr says so, not silence."""
    r = egpu_run(["-p", str(probe_obj("hash_count")), str(stub_job.app), "module", "1", "32", "0"],
                 stub_job.env(tmp_path / "log"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["app_vec module launches=1 threads=32 result=0"]
    assert r.stderr == "egpu-run: every map is empty: no probe program stored anything\n"


def test_no_probe_at_all_says_so_where_maps_were_asked_for(stub_job, tmp_path):
    """egpu-run --json -o FILE CMD without -p (and nothing attached) left FILE empty, as if the probes had run
    and found nothing: a line says why. Without --json or -o (a job run for --restore, --durations or a later
    attach), no line about maps."""
    maps = tmp_path / "maps.json"
    r = egpu_run(["--json", "-o", str(maps), str(stub_job.app), "module", "1", "32", "0"],
                 stub_job.env(tmp_path / "log"))
    assert (r.returncode, r.stdout) == (0, "app_vec module launches=1 threads=32 result=0\n"), r.stderr
    assert r.stderr == ("egpu-run: no maps: no probe was given (-p PROBE) nor attached while the job ran "
                        "(egpu attach)\n")
    r = egpu_run([str(stub_job.app), "module", "1", "32", "0"], stub_job.env(tmp_path / "log2"))
    assert (r.returncode, r.stdout, r.stderr) == (0, "app_vec module launches=1 threads=32 result=0\n", "")


def test_probes_that_instrument_no_kernel_say_their_maps_were_never_laid_out(stub_job, tmp_path):
    """A kprobe naming no kernel the job loads (bpftime's funclatency, kprobe/SomeKernelName): no module was
    instrumented, so no process laid its maps out. egpu-run said every probe was detached, as if one had run."""
    from egpu_preload.bpf.compile import compile_probe
    src = tmp_path / "nomatch.bpf.c"
    src.write_text(BAD_PROBE.replace('SEC("kprobe/*")', 'SEC("kprobe/NoSuchKernel")')
                   .replace("return *v;", "return v != 0;"))
    r = egpu_run(["-p", str(compile_probe(src, tmp_path / "nomatch.bpf.o")), str(stub_job.app), "module", "1", "32",
                  "0"], stub_job.env(tmp_path / "log"))
    assert (r.returncode, r.stdout) == (0, "app_vec module launches=1 threads=32 result=0\n"), r.stderr
    assert r.stderr.splitlines()[-1] == ("egpu-run: no maps: the probes' maps were never laid out: no module the job "
                                         "loaded was instrumented for kprobe/NoSuchKernel"), r.stderr


def test_a_process_whose_cuinit_fails_says_so(stub_job, probe_obj, tmp_path):
    """A driver but no GPU (cuInit: CUDA_ERROR_NO_DEVICE): the job runs as it would, and egpu says once
    why no probe ran in it."""
    r = egpu_run(["-p", str(probe_obj("count")), str(stub_job.app), "module", "2", "64", "0"],
                 stub_job.env(tmp_path / "log", EGPU_STUB_CUINIT="100"))
    said = [ln for ln in r.stderr.splitlines() if "cuInit failed" in ln]
    assert len(said) == 1 and said[0].endswith("cuInit failed: no CUDA device (CUDA error 100): this process "
                                               "runs no probe"), r.stderr


def test_json_gives_one_document_per_process(stub_job, probe_obj, tmp_path):
    r = egpu_run(["--json", "-p", str(probe_obj("count")), str(stub_job.app), "fatbin", "1", "32", "0"],
                 stub_job.env(tmp_path / "log"))
    assert r.returncode == 0, r.stderr
    out, doc = r.stdout.splitlines()
    assert out.startswith("app_vec fatbin")
    d = json.loads(doc)
    assert d["maps"] == {"counts": {"kind": "scalar", "value": 32}}
    assert isinstance(d["pid"], int) and d["rank"] is None


def test_a_sources_global_data_maps_are_named_after_it(stub_job, tmp_path):
    """A .bpf.c's .bss/.data/.rodata maps are named as libbpf names them, from the object's name (globals.bss),
    as egpu run-on-gpu and examples/README.md name them; the session's copy 0.globals.bpf.o made them 0.bss.
    Two sources of one name keep their maps apart by the folder each was compiled into."""
    src = ROOT / "tests" / "probes" / "globals.bpf.c"
    r = egpu_run(["--json", "-p", str(src), str(stub_job.app), "module", "1", "32", "0"],
                 stub_job.env(tmp_path / "log"))
    assert r.returncode == 0, r.stderr
    assert {"globals.bss", "globals.data"} <= set(json.loads(r.stdout.splitlines()[-1])["maps"])
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "globals.bpf.c").write_text(src.read_text())
    r = egpu_run(["--json", "-p", str(src), "-p", str(tmp_path / "b" / "globals.bpf.c"), str(stub_job.app), "module",
                  "1", "32", "0"], stub_job.env(tmp_path / "log2"))
    assert r.returncode == 0, r.stderr
    maps = json.loads(r.stdout.splitlines()[-1])["maps"]
    assert {"0/globals:globals.data", "1/globals:globals.data"} <= set(maps), sorted(maps)


def test_output_file_keeps_the_maps_apart_from_the_jobs_stdout(stub_job, probe_obj, tmp_path):
    """-o FILE: the maps go there, so egpu-run --json -o FILE ... gives jq a file of JSON alone, and stdout is
    the job's own (before, the document followed the job's lines on stdout); a FILE that cannot be written
    is refused before the job starts."""
    maps = tmp_path / "maps.json"
    r = egpu_run(["--json", "-o", str(maps), "-p", str(probe_obj("count")), str(stub_job.app), "fatbin", "1", "32",
                  "0"], stub_job.env(tmp_path / "log"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("app_vec fatbin") and "maps" not in r.stdout
    assert json.loads(maps.read_text())["maps"] == {"counts": {"kind": "scalar", "value": 32}}
    missing = tmp_path / "no" / "maps.json"
    r = egpu_run(["-o", str(missing), "-p", str(probe_obj("count")), str(stub_job.app), "fatbin", "1", "32", "0"],
                 stub_job.env(tmp_path / "log"))
    assert r.returncode == 125 and r.stdout == ""
    assert r.stderr.strip() == f"egpu-run: {missing}: -o: No such file or directory"


def test_a_job_of_several_processes_prints_each(stub_job, probe_obj, tmp_path):
    app = str(stub_job.app)
    script = f"{app} module 1 32 0 && {app} library 2 64 0 && echo none"
    r = egpu_run(["-p", str(probe_obj("count")), "sh", "-c", script], stub_job.env(tmp_path / "log", RANK="5"))
    assert r.returncode == 0, r.stderr
    heads = [ln for ln in r.stdout.splitlines() if ln.startswith("pid ")]
    assert [h.split(": ", 1)[1] for h in heads] == [f"{app} module 1 32 0", f"{app} library 2 64 0"]
    assert all(" rank 5:" in h for h in heads)
    assert re.findall(r"^@counts: (\d+)$", r.stdout, re.M) == ["32", "128"]   # launches x threads, each


@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_multiprocessing_workers_are_each_instrumented(stub_job, probe_obj, tmp_path, method):
    """A parent that never touches CUDA starts 2 workers (app_workers.py); worker i launches 3 + i times,
    each launch of 32 threads counted in the probe's map by the worker's shim. Fork and forkserver workers end
    in os._exit, past atexit, and must still leave their maps."""
    log = tmp_path / "log"
    r = egpu_run(["-p", str(probe_obj("count")), sys.executable, str(MORE / "app_workers.py"), method, "2", "3"],
                 stub_job.env(log, EGPU_STUB_PROBE_COUNTS="1"))
    assert r.returncode == 0, r.stderr
    workers = dict(re.findall(r"^worker (\d) pid (\d+) result=0$", r.stdout, re.M))
    assert len(workers) == 2, r.stdout
    counts = dict(re.findall(r"^pid (\d+): .*\n@counts: (\d+)$", r.stdout, re.M))
    assert counts == {workers["0"]: "96", workers["1"]: "128"}, r.stdout
    # each loaded the module as the application gave it (its launches counted on the host) and laid out its maps
    loads = re.findall(r"^(\d+) cuModuleLoadData module=1 kind=ptx instrumented=0$", log.read_text(), re.M)
    maps = re.findall(r"^(\d+) cuMemAlloc_v2 ", log.read_text(), re.M)
    assert sorted(loads) == sorted(set(maps)) == sorted(workers.values())


FORK_AFTER_CUDA = """import os, sys, time
sys.path.insert(0, sys.argv[1])
import app_vec
app_vec.launch("module", 2, 32)
pid = os.fork()
if pid == 0:   # a worker forked after CUDA (a DataLoader's): it outlives a few mirror copies, then ends
    time.sleep(0.5)
    os._exit(0)
os.waitpid(pid, 0)
print("done", flush=True)
"""


def test_a_child_forked_after_cuda_leaves_the_parents_maps_alone(stub_job, probe_obj, tmp_path):
    """A child forked after CUDA leaves no exit dump of its own (exit_hook.py), yet its map mirror, made
    anew in it, linked into the session: once it ended, egpu-run took it for a killed process and printed
    the parent's maps a second time, under the child's pid."""
    r = egpu_run(["--mirror", "0.05", "-p", str(probe_obj("count")), sys.executable, "-c", FORK_AFTER_CUDA,
                  str(MORE)], stub_job.env(tmp_path / "log", EGPU_STUB_PROBE_COUNTS="1"))
    assert r.returncode == 0, r.stderr
    assert (r.stdout, r.stderr) == ("done\n@counts: 64\n", "")


WORKER_AFTER_CUDA = """import os, sys, time
sys.path.insert(0, sys.argv[1])
import app_vec
from egpu_preload.control import ControlClient, EgpuError
app_vec.launch("module", 2, 32)
pid = os.fork()
if pid == 0:   # a DataLoader worker: its own work, no CUDA, for a few mirror periods; then a maps request to it
    time.sleep(0.5)
    print(f"worker {os.getpid()} sum={sum(range(10))}", flush=True)
    try:
        ControlClient(os.getpid()).request("maps")
    except EgpuError as e:
        print(f"maps: {e}", flush=True)
    os._exit(0)
os.waitpid(pid, 0)
print(f"done {os.getpid()}", flush=True)
"""


def test_a_worker_forked_after_cuda_calls_no_cuda(stub_job, probe_obj, tmp_path):
    """The driver refuses every call in a child forked after cuInit (EGPU_STUB_FORK_FAILS, as the real one):
    egpu in such a worker must call none (its map mirror read the maps every period and printed the
    driver's refusal), and a control request to it says why it has no maps (asking cuInit alone)."""
    log = tmp_path / "log"
    r = egpu_run(["--mirror", "0.05", "-p", str(probe_obj("count")), sys.executable, "-c", WORKER_AFTER_CUDA,
                  str(MORE)], stub_job.env(log, EGPU_STUB_PROBE_COUNTS="1", EGPU_STUB_FORK_FAILS="1"))
    assert r.returncode == 0, r.stderr
    worker, said, done, *maps = r.stdout.splitlines()
    child, parent = re.fullmatch(r"worker (\d+) sum=45", worker)[1], re.fullmatch(r"done (\d+)", done)[1]
    assert said == (f"maps: process {child}: process {child} was forked from {parent} after CUDA started there, and "
                    "the driver refuses CUDA in it (cuInit failed: CUDA_ERROR_NOT_INITIALIZED): it has no maps, "
                    f"modules or probes of its own (egpu maps {parent} reads its parent's)")
    assert (maps, r.stderr) == (["@counts: 64"], "")
    # the request's one question to the driver, nothing before it
    assert [ln for ln in log.read_text().splitlines() if ln.split()[0] == child] == [f"{child} cuInit flags=0"]


WORKER_LOST = """import multiprocessing, os, sys, time
sys.path.insert(0, sys.argv[1])
import app_vec

def work(ready):
    app_vec.launch("module", 3, 32)
    ready.put(os.getpid())
    time.sleep(60)

if sys.argv[2] == "terminate":   # as `with multiprocessing.Pool():` ends its workers: SIGTERM
    ready = multiprocessing.get_context("fork").Queue()
    worker = multiprocessing.get_context("fork").Process(target=work, args=(ready,))
    worker.start()
    pid = ready.get()
    worker.terminate()
    worker.join()
else:   # a worker that ends in os._exit, past every exit handler
    pid = os.fork()
    if pid == 0:
        app_vec.launch("module", 3, 32)
        os._exit(0)
    os.waitpid(pid, 0)
app_vec.launch("module", 2, 32)   # the parent's own, after its worker's end: its maps are printed
print(f"worker {pid}", flush=True)
"""


@pytest.mark.parametrize("how", ["terminate", "_exit"])
def test_a_worker_that_ends_before_its_dump_is_named(stub_job, probe_obj, tmp_path, how):
    """A worker that ran probes and ended before its exit dump and any mirror copy (SIGTERMed, as Pool's
    exit ends its workers; or through os._exit): its counts are lost, and egpu-run says so, naming it
    (it printed the parent's maps alone as if they were the job's)."""
    argv = [sys.executable, "-c", WORKER_LOST, str(MORE), how]
    r = egpu_run(["--mirror", "0", "-p", str(probe_obj("count")), *argv],
                 stub_job.env(tmp_path / "log", EGPU_STUB_PROBE_COUNTS="1"))
    assert r.returncode == 0, r.stderr
    worker = re.fullmatch(r"worker (\d+)\n@counts: 64\n", r.stdout)
    assert worker, r.stdout
    # named by its command too: the parent's, which it was forked with
    assert r.stderr.splitlines() == [f"egpu-run: pid {worker[1]} ({dump.command(argv)}) ended (killed?) before its "
                                     "exit dump and before any copy of its maps: its counts are missing"]


ORPHAN = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
import app_vec
r, w = os.pipe()
if os.fork() == 0:   # a daemon of the job: it outlives the job's main process and egpu-run
    app_vec.launch("module", 3, 32)
    if float(sys.argv[2]) < 1:   # copies often: one holds its launches before the main process ends
        app_vec.mirror_copy(app_vec.mirror_copy(time.time()))
    print(f"orphan {os.getpid()}", flush=True)
    os.write(w, b"x")
    deadline = time.monotonic() + 30
    while os.path.isdir(os.environ["EGPU_SESSION"]) and time.monotonic() < deadline:
        time.sleep(0.02)
    app_vec.mirror_copy(time.time())   # a mirror copy made with the session gone (--mirror 3: its first)
    sys.exit(0)
# the main process's own launches while the orphan starts, not after (a loaded machine took the 3 s of a
# --mirror 3 copy to start a second runtime): it ends right after the orphan's launches
app_vec.launch("module", 2, 32)
os.read(r, 1)
"""


@pytest.mark.parametrize("mirror", ["0.05", "3"])
def test_a_process_still_running_when_the_job_ends_is_named(stub_job, probe_obj, tmp_path, mirror):
    """A process of the job still running when its main process ends (daemonized, orphaned): its maps as of
    its last mirror copy, said so, or where it made none, a line that its counts are missing (it was left out
    without a word); and the process, ending after egpu-run, says nothing of the session egpu-run removed
    (its exit dump and first mirror copy printed errors into the user's terminal)."""
    argv = [sys.executable, "-c", ORPHAN, str(MORE), mirror]
    r = egpu_run(["--mirror", mirror, "-p", str(probe_obj("count")), *argv],
                 stub_job.env(tmp_path / "log", EGPU_STUB_PROBE_COUNTS="1"))
    assert r.returncode == 0, r.stderr
    orphan = re.match(r"orphan (\d+)\n", r.stdout)[1]
    who = f"pid {orphan} ({dump.command(argv)})"
    [line] = r.stderr.splitlines()
    if mirror == "3":
        assert line == (f"egpu-run: {who} was still running when the job's main process ended, before any "
                        "copy of its maps: its counts are missing")
        assert r.stdout.endswith("\n@counts: 64\n")
        return
    assert re.fullmatch(rf"egpu-run: {re.escape(who)} was still running when the job's main process ended: its "
                        r"maps are as of its last copy, \d+\.\d s old", line), line
    assert r.stdout.split(f"\npid {orphan}: ")[1].endswith(f"{MORE} {mirror}\n@counts: 96\n"), r.stdout


DAEMON = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
main, late = os.getpid(), sys.argv[2] == "after egpu-run"
r, w = os.pipe()
if os.fork() == 0:   # a daemon, as one makes itself: fork, setsid, fork, the middle one exits; no CUDA yet
    os.setsid()
    if os.fork() == 0:
        print(f"daemon {os.getpid()}", flush=True)
        os.write(w, b"x")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (os.path.isdir(os.environ["EGPU_SESSION"]) if late else
                                               os.path.exists(f"/proc/{main}")):
            time.sleep(0.02)
        import app_vec
        app_vec.launch("module", 3, 32)
        if sys.argv[2] == "after main, then stays":   # until a signal: its maps as of its copy
            app_vec.mirror_copy(time.time())
            print("ready", flush=True)
            time.sleep(60)
        sys.exit(0)
    os._exit(0)
os.wait()
os.read(r, 1)
"""


@pytest.mark.parametrize("wait_all", [False, True])
def test_a_daemon_that_starts_cuda_after_the_main_process_ends(stub_job, probe_obj, tmp_path, wait_all):
    """A daemon of the job (double-forked, setsid) that starts CUDA only once the job's main process has ended:
    egpu-run names it, with what it runs on the GPU in no map (it said no process loaded CUDA code, and the
    daemon's kernels, probes and all, went nowhere); with --wait-all it waits for it, and prints its maps."""
    argv = [sys.executable, "-c", DAEMON, str(MORE), "after main" if wait_all else "after egpu-run"]
    r = egpu_run(["-p", str(probe_obj("count")), *["--wait-all"] * wait_all, *argv],
                 stub_job.env(tmp_path / "log", EGPU_STUB_PROBE_COUNTS="1"))
    assert r.returncode == 0, r.stderr
    daemon = re.match(r"daemon (\d+)\n", r.stdout)[1]
    if wait_all:
        assert r.stdout == f"daemon {daemon}\n@counts: 96\n" and r.stderr == "", (r.stdout, r.stderr)
        return
    assert r.stdout == f"daemon {daemon}\n"
    assert r.stderr.splitlines() == [
        f"egpu-run: pid {daemon} ({dump.command(argv)}) was still running when the job's main process ended, before "
        "it started CUDA: what it runs on the GPU from now on is in no map here (egpu-run --wait-all waits for it)",
        "egpu-run: no maps: no process of the job loaded CUDA code and exited normally"]


def test_egpu_run_waiting_for_a_daemon_passes_it_a_signal(stub_job, probe_obj, tmp_path):
    """egpu-run --wait-all waiting for a daemon of the job passes it the SIGTERM it gets (it stopped waiting for
    nothing): the daemon ends, and its maps are printed as of its last copy, said so."""
    argv = [sys.executable, "-c", DAEMON, str(MORE), "after main, then stays"]
    proc = subprocess.Popen([sys.executable, "-c", "import launcher; launcher.run_main()", "--wait-all", "--mirror",
                             "0.05", "-p", str(probe_obj("count")), *argv],
                            env=stub_job.env(tmp_path / "log", EGPU_STUB_PROBE_COUNTS="1"), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    daemon = re.fullmatch(r"daemon (\d+)\n", proc.stdout.readline())[1]
    assert proc.stdout.readline() == "ready\n"
    os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err   # the job's main process's status
    assert out == "@counts: 96\n"
    assert re.fullmatch(rf"egpu-run: pid {daemon} \({re.escape(dump.command(argv))}\) ended \(killed\?\) before its "
                        r"exit dump: its maps are as of its last copy, \d+\.\d s old\n", err), err


EXEC_AFTER_CUDA = """import ctypes, os, subprocess, sys, threading, time
sys.path.insert(0, sys.argv[1])
import app_vec
how = sys.argv[2]
app_vec.launch("module", 3, 32)
new = [sys.executable, os.path.join(sys.argv[1], "app_vec.py"), "module", "1", "32", "0"]
if how == "failed":   # the process goes on: its runtime too, and the next exec's dump holds all 5 launches once
    for _ in range(2):
        try:
            os.execv("/nonexistent/egpu", new)
        except OSError as e:
            print(f"exec failed: {e.strerror}", flush=True)
    app_vec.launch("module", 2, 32)
elif how == "thread":   # its other threads are alive at the exec, the kernel ends them
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
elif how == "vfork":   # subprocess's child execs after vfork: the parent's maps are not its own
    subprocess.run(["true"], check=True)
if how == "execl":   # from C, arguments as varargs
    ctypes.CDLL(None).execl(*[a.encode() for a in [sys.executable] + new], None)
else:
    os.execv(sys.executable, new)
"""


@pytest.mark.parametrize("how", ["execv", "failed", "thread", "execl", "vfork", "c-program"])
def test_an_exec_keeps_the_counts_of_the_image_it_replaces(stub_job, probe_obj, tmp_path, how):
    """A process that launched 3 kernels, then exec'd into one that launches 1: both images' counts, each under
    its own header (the replaced image's says so); exec writes no exit dump of the old image, and the new one
    wrote its own under the same pid, so only the last image's counts were printed. A C program's runtime
    runs in the shim's own interpreter."""
    cmd = ([str(stub_job.app), "module", "3", "32", "exec"] if how == "c-program" else
           [sys.executable, "-c", EXEC_AFTER_CUDA, str(MORE), how])
    r = egpu_run(["-p", str(probe_obj("count")), *cmd], stub_job.env(tmp_path / "log", EGPU_STUB_PROBE_COUNTS="1"))
    assert r.returncode == 0, r.stderr
    failed = "exec failed: No such file or directory\n" * 2 if how == "failed" else ""
    first = "app_vec module launches=3 threads=32 result=0\n" if how == "c-program" else ""
    assert r.stdout.startswith(failed + first + "app_vec module launches=1 threads=32 result=0\n"), r.stdout
    images = re.findall(r"^pid (\d+)( before exec \d)?: .*?\n@counts: (\d+)$", r.stdout, re.M | re.S)
    pid = images[0][0] if images else None
    assert images == [(pid, " before exec 1", "160" if how == "failed" else "96"), (pid, "", "32")], r.stdout
    new = f"{stub_job.app}" if how == "c-program" else f"{sys.executable} {MORE}/app_vec.py"
    assert r.stdout.split(f"pid {pid}: ")[1].startswith(f"{new} module 1 32 0\n")
    assert r.stderr == ""


EXEC_THEN_KILLED = """import os, sys, time
sys.path.insert(0, sys.argv[1])
import app_vec
if sys.argv[3:] == ["exec'd"]:   # the image the exec made: it runs probes, then dies before its exit dump
    app_vec.launch("module", 2, 32)
    if float(sys.argv[2]) > 0:   # a mirror copy that holds them, where there are copies
        app_vec.mirror_copy(app_vec.mirror_copy(time.time()))
    os.kill(os.getpid(), 9)
app_vec.launch("module", 3, 32)
os.execv(sys.executable, [sys.executable, __file__, *sys.argv[1:], "exec'd"])
"""


@pytest.mark.parametrize("mirror", ["0", "0.05"])
def test_an_image_an_exec_made_and_killed_is_named(stub_job, probe_obj, tmp_path, mirror):
    """A process that launched 3 kernels and exec'd into an image that launched 2 and was SIGKILLed: the first
    image's counts, and a line naming the killed image with its maps as of its last mirror copy, or where it made
    none, that its counts are missing (the first image's exec dump passed for the pid's: egpu-run printed 3 and
    said nothing)."""
    script = tmp_path / "exec_then_killed.py"
    script.write_text(EXEC_THEN_KILLED)
    r = egpu_run(["--mirror", mirror, "-p", str(probe_obj("count")), sys.executable, str(script), str(MORE), mirror],
                 stub_job.env(tmp_path / "log", EGPU_STUB_PROBE_COUNTS="1"))
    assert r.returncode == 128 + signal.SIGKILL, r.stderr
    [line] = r.stderr.splitlines()
    pid = re.match(r"egpu-run: pid (\d+) ", line)
    assert pid, line
    execd = "exec'd"   # the killed image, named by its own command, not the first image's
    who = f"pid {pid[1]} ({dump.command([sys.executable, str(script), str(MORE), mirror, execd])})"
    if mirror == "0":
        assert r.stdout == "@counts: 96\n"
        assert line == (f"egpu-run: {who} was ended by signal 9 (SIGKILL) before its exit dump and before any "
                        "copy of its maps: its counts are missing")
        return
    images = re.findall(r"^pid (\d+)( before exec 1)?: .*?\n@counts: (\d+)$", r.stdout, re.M | re.S)
    assert images == [(pid[1], " before exec 1", "96"), (pid[1], "", "64")], r.stdout
    assert re.fullmatch(rf"egpu-run: {re.escape(who)} was ended by signal 9 \(SIGKILL\) before its exit dump: its "
                        r"maps are as of its last copy, \d+\.\d s old", line), line


def _other_python() -> str | None:
    """A Python of another minor version than this one that runs here (on PATH, or pyenv's), or None."""
    found = [shutil.which(f"python3.{n}") for n in range(8, 20) if n != sys.version_info.minor]
    found += sorted(str(p) for p in Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")).glob(
        "versions/3.*/bin/python3"))
    for exe in filter(None, found):
        r = subprocess.run([exe, "-c", "import ctypes, sys; print(sys.version_info[1])"], capture_output=True,
                           text=True)
        if r.returncode == 0 and r.stdout.strip() != str(sys.version_info.minor):
            return exe
    return None


def test_a_python_job_of_another_version_runs_uninstrumented_and_says_why(stub_job, probe_obj, tmp_path):
    """The shim is built for egpu-run's Python; a job of another Python brings its own interpreter, which
    the shim's calls reach. cffi's start against it hung (3.12 and 3.13 under a shim of 3.11: the job
    never ended) or failed in every hook (3.10). The job runs as it would alone, and one line says why it
    runs no probe."""
    other = _other_python()
    if other is None:
        pytest.skip("no Python of another minor version here")
    r = egpu_run(["-p", str(probe_obj("count")), other, str(MORE / "app_vec.py"), "module", "2", "32", "3"],
                 stub_job.env(tmp_path / "log"), timeout=30)
    assert r.returncode == 3, r.stderr
    assert r.stdout == "app_vec module launches=2 threads=32 result=0\n"
    said = [ln for ln in r.stderr.splitlines() if ln.startswith("egpu[")]
    assert len(said) == 1 and f"the shim was built for Python 3.{sys.version_info.minor}" in said[0], r.stderr
    assert "initialization code failed" not in r.stderr


OWN_IMPORTS = """import sys
sys.path.insert(0, sys.argv[1])
import app_vec
app_vec.launch("module", 2, 32)   # the shim's Python is up from the first load on
import _cffi_backend, launcher, mine, numpy
print(numpy.__version__, launcher.WHOSE, mine.__file__, _cffi_backend.__file__, sep="\\n")
"""


@pytest.mark.parametrize("own_cffi", [False, True])
def test_a_python_job_imports_its_own_packages_not_egpus(stub_job, probe_obj, tmp_path, own_cffi):
    """A job in an environment of its own (a venv without system packages) imports its own numpy and
    launcher, though egpu's environment has them (numpy where installed; launcher.py always): egpu-run's
    import directories on its PYTHONPATH came first, so a job got egpu's numpy, or one it never had. The
    user's PYTHONPATH still comes first, the cffi backend the shim's start imports is the job's own where
    it has one (another version would break the job's cffi), and the probe runs."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "numpy").mkdir()
    (site / "numpy" / "__init__.py").write_text("__version__ = '0.0+job'\n")
    (site / "launcher.py").write_text("WHOSE = 'job'\n")
    if own_cffi:
        (site / Path(_cffi_backend.__file__).name).symlink_to(_cffi_backend.__file__)
    mine = tmp_path / "user" / "mine.py"
    mine.parent.mkdir()
    mine.write_text("")
    script = tmp_path / "job.py"   # not -c: egpu-run's directory, the job's, would come first
    script.write_text(OWN_IMPORTS)
    env = stub_job.env(tmp_path / "log", EGPU_STUB_PROBE_COUNTS="1", PYTHONPATH=str(mine.parent))
    r = egpu_run(["-p", str(probe_obj("count")), str(venv / "bin" / "python"), str(script), str(MORE)], env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["0.0+job", "job", str(mine),
                                     str(site / Path(_cffi_backend.__file__).name) if own_cffi
                                     else _cffi_backend.__file__, "@counts: 64"], r.stderr


def test_a_c_jobs_pythonpath_holds_none_of_egpus_imports(stub_job, probe_obj, tmp_path):
    """A C job's children (a shell's Python, say) get no egpu directory on their PYTHONPATH, and the
    shim's own interpreter, which starts with nothing but the base Python's path, still runs the probe."""
    env = stub_job.env(tmp_path / "log", EGPU_STUB_PROBE_COUNTS="1")
    del env["PYTHONPATH"]
    r = egpu_run(["-p", str(probe_obj("count")), "sh", "-c", 'printf "%s\\n" "$PYTHONPATH"; exec "$0" module 2 32 0',
                  str(stub_job.app)], env)
    assert r.returncode == 0, r.stderr
    path, *rest = r.stdout.splitlines()
    assert not set(path.split(os.pathsep)) & set(job.import_dirs()), path
    assert rest == ["app_vec module launches=2 threads=32 result=0", "@counts: 64"], r.stderr


OWN_ENV = """import os, subprocess, sys
app = [sys.executable, os.path.join(sys.argv[1], "app_vec.py"), "module", "3", "32", "0"]
own = {"LD_LIBRARY_PATH": os.environ["LD_LIBRARY_PATH"]}   # the stand-in driver, and nothing of egpu's
how = sys.argv[2]
if how == "env={}":   # subprocess's child (vforked) execve's, its errno back to the parent where it fails
    try:
        subprocess.run(["/nonexistent/egpu"], env=own)
    except FileNotFoundError as e:
        print(f"exec failed: {e.strerror}", flush=True)
    subprocess.run(app, env=own, check=True)
elif how == "env -i":   # env's execvp, then a C program: the shim's own interpreter needs egpu's PYTHONPATH entry
    subprocess.run(["env", "-i", *[f"{k}={v}" for k, v in own.items()], sys.argv[3], "module", "3", "32", "0"])
elif how == "posix_spawn":
    os.waitpid(os.posix_spawn(app[0], app, own), 0)
elif how == "execve":   # this very process: its next image
    os.execve(app[0], app, own)
elif how == "own LD_PRELOAD":   # the program's own preload stays, beside egpu's
    sh = ["/bin/sh", "-c", 'printf "%s\\n" "$LD_PRELOAD"; exec "$0" "$@"', *app]
    subprocess.run(sh, env={**own, "LD_PRELOAD": "libm.so.6"}, check=True)
"""


@pytest.mark.parametrize("how", ["env={}", "env -i", "posix_spawn", "execve", "own LD_PRELOAD"])
def test_a_process_execd_with_an_environment_of_its_own_runs_the_probes(stub_job, probe_obj, tmp_path, how):
    """A process the job starts with an environment of its own, which lacks egpu's (env -i, subprocess's env=,
    posix_spawn, execve, a program's own LD_PRELOAD), still runs the probes: the shim puts egpu's variables back
    (shim/process.c). It ran its kernels without probes, and egpu-run said that no process loaded CUDA code."""
    r = egpu_run(["-p", str(probe_obj("count")), sys.executable, "-c", OWN_ENV, str(MORE), how, str(stub_job.app)],
                 stub_job.env(tmp_path / "log", EGPU_STUB_PROBE_COUNTS="1"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.endswith("launches=3 threads=32 result=0\n@counts: 96\n"), (r.stdout, r.stderr)
    first = {"own LD_PRELOAD": f"{stub_job.shim} libm.so.6", "env={}": "exec failed: No such file or directory"}
    if how in first:
        assert r.stdout.splitlines()[0] == first[how]


SHELLS = r"""/* app_shells HOW DRIVER_DIR APP: takes egpu's variables out of its environment as HOW says (clearenv,
 * environ = NULL, unsetenv or setenv of LD_PRELOAD), then runs `APP module K 32 0` through system (K = 1), popen
 * (2) and wordexp's command substitution (3), taking them out again before each; each shell first prints the
 * call's name and its LD_PRELOAD. Exits 1 where a call fails or its shell does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wordexp.h>

extern char **environ;

int main(int argc, char **argv) {
    static const char *const calls[] = {"system", "popen", "wordexp"};
    int failed = argc != 4;
    for (int k = 1; k <= 3 && !failed; k++) {
        char cmd[4096], word[4200], line[4096];
        snprintf(cmd, sizeof cmd, "printf '%%s %%s\\n' %s \"$LD_PRELOAD\"; LD_LIBRARY_PATH=%s exec %s module %d 32 0",
                 calls[k - 1], argv[2], argv[3], k);
        if (!strcmp(argv[1], "clearenv")) clearenv();
        else if (!strcmp(argv[1], "environ = NULL")) environ = NULL;
        else if (!strcmp(argv[1], "unsetenv")) unsetenv("LD_PRELOAD");
        else setenv("LD_PRELOAD", "libm.so.6", 1);
        fflush(stdout);
        if (k == 1) {
            failed = system(cmd) != 0;
        } else if (k == 2) {
            FILE *f = popen(cmd, "r");
            while (f && fgets(line, sizeof line, f)) fputs(line, stdout);
            failed = !f || pclose(f) != 0;
        } else {
            wordexp_t w;
            snprintf(word, sizeof word, "\"$(%s)\"", cmd);
            failed = wordexp(word, &w, 0) || w.we_wordc != 1;
            if (!failed) printf("%s\n", w.we_wordv[0]);
            if (!failed) wordfree(&w);
        }
    }
    return failed;
}
"""


@pytest.mark.parametrize("how", ["clearenv", "environ = NULL", "unsetenv", "setenv"])
def test_a_shell_started_by_system_popen_or_wordexp_runs_the_probes(stub_job, probe_obj, tmp_path, how):
    """A C program that empties its environment (clearenv, environ = NULL) or takes the shim out of its LD_PRELOAD
    (unsetenv, setenv of its own), then runs a command through system, popen or wordexp: glibc spawns their shell
    with environ by a call of its own, past the posix_spawn hook, and the command ran its kernels without probes,
    egpu-run saying nothing of it. The shim puts egpu's variables back into the environment first
    (shim/process.c); the program's own LD_PRELOAD stays, after the shim."""
    src, app = tmp_path / "app_shells.c", tmp_path / "app_shells"
    src.write_text(SHELLS)
    subprocess.run(["gcc", "-O1", "-Wall", "-Werror", str(src), "-o", str(app)], check=True)
    r = egpu_run(["-p", str(probe_obj("count")), str(app), how, str(stub_job.driver_dir), str(stub_job.app)],
                 stub_job.env(tmp_path / "log", EGPU_STUB_PROBE_COUNTS="1"))
    preload = f"{stub_job.shim} libm.so.6" if how == "setenv" else str(stub_job.shim)
    ran = [line for k, call in enumerate(["system", "popen", "wordexp"], 1)
           for line in (f"{call} {preload}", f"app_vec module launches={k} threads=32 result=0")]
    assert (r.returncode, r.stdout.splitlines()[:6]) == (0, ran), (r.stdout, r.stderr)
    counts = re.findall(r"^pid \d+: \S+ module (\d) 32 0\n@counts: (\d+)$", r.stdout, re.M)
    # count's kprobe is counted at the launch: 32 threads a launch, 1, 2 and 3 launches
    assert sorted(counts) == [("1", "32"), ("2", "64"), ("3", "96")], (r.stdout, r.stderr)


def test_egpu_run_inside_a_job_of_egpu_run_refuses(stub_job, probe_obj, tmp_path):
    """A job that runs egpu-run itself: the inner one would replace the outer one's settings in its job, so the
    outer probes never reached those processes and the outer one said no process loaded CUDA code. The inner
    one refuses in one line, naming the outer one, with egpu-run's own status; the outer job goes on."""
    inner = f"{sys.executable} -c 'import launcher; launcher.run_main()'"
    script = f"{inner} -p {probe_obj('count')} {stub_job.app} module 1 32 0; echo inner=$?; echo outer=$PPID"
    r = egpu_run(["-p", str(probe_obj("count")), "sh", "-c", script], stub_job.env(tmp_path / "log"))
    assert r.returncode == 0, r.stderr
    outer = re.fullmatch(r"inner=125\nouter=(\d+)\n", r.stdout)
    assert outer, r.stdout
    assert r.stderr.splitlines()[0] == (
        f"egpu-run: already inside the job of egpu-run (pid {outer[1]}), whose probes would not reach this job: give "
        "every probe to one egpu-run (-p PROBE, repeatable) (see egpu-run --help)"), r.stderr


def test_a_stale_egpu_run_pid_refuses_nothing(stub_job, probe_obj, tmp_path):
    """A daemon the job started outlives egpu-run with EGPU_RUN_PID in its environment, and that pid is soon
    another process's: an egpu-run it starts is inside no job (its session is gone) and runs."""
    env = stub_job.env(tmp_path / "log", EGPU_STUB_PROBE_COUNTS="1", EGPU_RUN_PID=str(os.getpid()),
                       EGPU_SESSION=str(tmp_path / "gone"))
    r = egpu_run(["-p", str(probe_obj("count")), str(stub_job.app), "module", "2", "32", "0"], env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "@counts: 64", r.stdout


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing.bpf.o", "missing.bpf.o: cannot read (No such file or directory)"),
    (lambda d: (d / "junk.bpf.o").write_bytes(b"not an ELF") and d / "junk.bpf.o", "junk.bpf.o: "),
    # named by the user's source and line (BTF line info), not by the session's compiled copy
    (lambda d: (d / "bad.bpf.c").write_text(BAD_PROBE) and d / "bad.bpf.c", "/bad.bpf.c:8:kprobe/*:7: "),
    (lambda d: (d / "broken.bpf.c").write_text("int f( {\n") and d / "broken.bpf.c", "broken.bpf.c: clang failed"),
])
def test_a_bad_probe_stops_before_the_job(stub_job, tmp_path, make, message):
    probe = make(tmp_path)
    log = tmp_path / "log"
    r = egpu_run(["-p", str(probe), str(stub_job.app), "module", "1", "32", "0"], stub_job.env(log))
    assert r.returncode == 125   # egpu-run's own status, never one a job could be taken to have
    assert r.stdout == ""
    first, *rest = r.stderr.splitlines()
    assert first.startswith("egpu-run: ") and message in first
    if "clang" in message:   # clang's diagnostics follow, as clang prints them
        assert "broken.bpf.c:1:" in rest[0] and "error:" in rest[0]
    else:
        assert rest == []
    assert not log.exists()  # the job never reached the driver: it never started


def test_verbose_shows_the_verifier_log_with_source_lines(stub_job, tmp_path):
    (tmp_path / "bad.bpf.c").write_text(BAD_PROBE)
    r = egpu_run(["-v", "-p", str(tmp_path / "bad.bpf.c"), str(stub_job.app), "module", "1", "32", "0"],
                 stub_job.env(tmp_path / "log"))
    assert r.returncode == 125
    log = r.stderr.splitlines()
    at = log.index(f"; return *v;  /* no NULL check */ @ {tmp_path}/bad.bpf.c:8")   # as the kernel's log shows it
    assert log[at + 1] == "7: r0 = *(u64 *)(r0 + 0x0)"


def test_a_probe_source_is_compiled_for_the_job(stub_job, tmp_path):
    r = egpu_run(["-p", str(ROOT / "tests" / "probes" / "count.bpf.c"), str(stub_job.app), "module", "1", "32", "0"],
                 stub_job.env(tmp_path / "log"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1:] == ["@counts: 32"]


@pytest.mark.parametrize("cmd, status, message", [
    (["no-such-program-egpu"], 127, "egpu-run: no-such-program-egpu: command not found"),
    (["./no/such/file"], 127, "egpu-run: ./no/such/file: no such file"),
    (["/tmp"], 126, "egpu-run: /tmp: is a directory"),   # as bash says it; it said permission denied
    (["./tests/runtime_stub/app_loop.c"], 126, "egpu-run: ./tests/runtime_stub/app_loop.c: permission denied"),
    (["./tests/runtime_stub/no_shebang.sh"], 126,
     "egpu-run: ./tests/runtime_stub/no_shebang.sh: exec format error (not a program for this machine, "
     "or a script without a #! line)"),
])
def test_a_program_that_cannot_run(stub_job, probe_obj, tmp_path, cmd, status, message):
    r = egpu_run(["-p", str(probe_obj("count")), *cmd], stub_job.env(tmp_path / "log"))
    assert (r.returncode, r.stderr.splitlines()) == (status, [message])


def test_a_program_whose_interpreter_is_missing_says_which(stub_job, probe_obj, tmp_path):
    """A script whose #! names no file: exec's ENOENT read "no such file or directory" of a file that is there
    (bash: "cannot execute: required file not found"); the status stays bash's 127."""
    script = tmp_path / "script.sh"
    script.write_text("#!/no/such/interp -x\necho hi\n")
    script.chmod(0o755)
    r = egpu_run(["-p", str(probe_obj("count")), str(script)], stub_job.env(tmp_path / "log"))
    assert (r.returncode, r.stderr.splitlines()) == (
        127, [f"egpu-run: {script}: cannot execute: its interpreter /no/such/interp not found"])


def test_options_stop_at_the_command(stub_job, probe_obj, tmp_path):
    r = egpu_run(["-p", str(probe_obj("count")), "sh", "-c", 'printf "%s|" "$@"', "sh", "-p", "x", "--json", "-v"],
                 stub_job.env(tmp_path / "log"))
    assert r.returncode == 0, r.stderr
    assert r.stdout == "-p|x|--json|-v|"
    assert r.stderr == "egpu-run: no maps: no process of the job loaded CUDA code and exited normally\n"


@pytest.mark.parametrize("status", [0, 3])
def test_a_closed_stdout_keeps_the_jobs_status(stub_job, probe_obj, tmp_path, status):
    """egpu-run ... | head: the reader is gone before the maps are printed. Nothing is said (no traceback,
    as coreutils end silently on SIGPIPE) and the status is still the job's (click exited 1)."""
    r, w = os.pipe()
    os.close(r)   # the job's own output goes elsewhere: only egpu-run's maps meet the closed pipe
    try:
        proc = subprocess.run([sys.executable, "-c", "import launcher; launcher.run_main()", "-p",
                               str(probe_obj("count")), "sh", "-c", f'"$0" module 1 32 {status} >/dev/null',
                               str(stub_job.app)], env=stub_job.env(tmp_path / "log"), cwd=ROOT, stdout=w,
                              stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(w)
    assert (proc.returncode, proc.stderr) == (status, "")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("to", ["-o", "stdout"])
@pytest.mark.parametrize("interval", [False, True])
def test_maps_that_cannot_be_written_keep_the_jobs_status(stub_job, probe_obj, tmp_path, to, interval):
    """A full disk under -o FILE or stdout: one line, and the status is still the job's. It was a traceback
    and exit 1; under --interval the job ran on, unwaited, its session removed under it."""
    app = [str(stub_job.loop), str(tmp_path / "stop"), "1"] if interval else [str(stub_job.app), "module", "1", "32",
                                                                                "3"]
    args = ["-p", str(probe_obj("count")), *(["--interval", "0.1"] if interval else []),
            *(["-o", "/dev/full"] if to == "-o" else []), "sh", "-c", '"$@" >/dev/null', "sh", *app]
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-c", "import launcher; launcher.run_main()", *args],
                              env=stub_job.env(tmp_path / "log"), cwd=ROOT, stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=60)
    assert (proc.returncode, proc.stderr.splitlines()) == (
        0 if interval else 3, [f"egpu-run: {'/dev/full' if to == '-o' else 'stdout'}: cannot write the maps "
                               "(No space left on device)"])


def test_sigterm_reaches_the_job(stub_job, probe_obj, tmp_path):
    started = tmp_path / "started"
    env = stub_job.env(tmp_path / "log", EGPU_STUB_PROBE_COUNTS="1", EGPU_RUN_PID=str(os.getpid()),
                       EGPU_SESSION=str(tmp_path / "gone"))
    proc = subprocess.Popen([sys.executable, "-c", "import launcher; launcher.run_main()",
                             "-p", str(probe_obj("count")), "sh", "-c", f"touch {started}; exec sleep 30"],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 128 + signal.SIGTERM, err


@pytest.mark.parametrize("stdin", ["inherited", "closed"])
def test_sigint_stops_a_c_program(stub_job, probe_obj, tmp_path, stdin):
    """Ctrl-C (SIGINT, forwarded: no terminal here) ends a C program under egpu-run as it would end it
    alone: the shim's Python must not take SIGINT for a KeyboardInterrupt (it did, and app_loop ran on).
    With stdin closed (egpu-run ... <&-), asking whether a terminal had sent it was a traceback, the job
    left running."""
    def child() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if stdin == "closed":
            os.close(0)

    stop = tmp_path / "stop"
    proc = subprocess.Popen([sys.executable, "-c", "import launcher; launcher.run_main()",
                             "-p", str(probe_obj("count")), str(stub_job.loop), str(stop), "60"],
                            env=stub_job.env(tmp_path / "log"), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=child)
    assert proc.stdout.readline() == "ready\n"
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=20)
    finally:
        stop.touch()
    assert proc.returncode == 128 + signal.SIGINT, (out, err)
    assert "KeyboardInterrupt" not in err and "Traceback" not in err, err


def mirrored(directory: Path) -> str:
    """The maps (text) in the map mirrors of the processes whose sessions are in ``directory``, as their
    last copies hold them; none while no copy is there."""
    from egpu_preload.errors import EgpuError
    from egpu_preload.runtime.mirror import read_segment
    docs = []
    for path in directory.glob("*.maps"):
        try:
            docs.append(read_segment(path)[0])
        except EgpuError:   # no document yet, or the process just ended
            continue
    return job.render([], docs, False)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_killed_job_prints_its_last_mirror_copy(stub_job, probe_obj, tmp_path, sig):
    """A job killed by a signal leaves no exit dump: egpu-run prints the maps of its last map mirror copy
    and says so, with the signal (it said no process had loaded CUDA code), and exits 128 + N still."""
    stop = tmp_path / "stop"
    proc = subprocess.Popen([sys.executable, "-c", "import launcher; launcher.run_main()", "--mirror", "0.05",
                             "-p", str(probe_obj("count")), str(stub_job.loop), str(stop), "60"],
                            env=stub_job.env(tmp_path / "log", EGPU_STUB_PROBE_COUNTS="1"), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout.readline() == "ready\n"
    deadline = time.monotonic() + 30   # a copy that counted launches: 0.5 s need not hold one on a loaded machine
    while not re.search(r"^@counts: [1-9]", mirrored(tmp_path / "egpu"), re.M) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, sig)
    try:
        out, err = proc.communicate(timeout=20)
    finally:
        stop.touch()
    assert proc.returncode == 128 + sig, (out, err)
    [line] = err.splitlines()
    who = re.escape(dump.command([str(stub_job.loop), str(stop), "60"]))
    assert re.fullmatch(rf"egpu-run: pid \d+ \({who}\) was ended by signal {int(sig)} \({sig.name}\) before its exit "
                        r"dump: its maps are as of its last copy, \d+\.\d s old", line), line
    counts = re.fullmatch(r"@counts: (\d+)\n", out)
    assert counts and int(counts[1]) > 0, out
    assert not list((tmp_path / "egpu").glob("*.maps"))   # the dead process's segment read and removed


def test_a_probe_path_with_colons_spaces_and_a_newline_reaches_the_job(stub_job, probe_obj, tmp_path):
    """EGPU_PROBES was os.pathsep-separated: a ':' split the path and the job ran with no probe."""
    where = tmp_path / "a:b c\nd"
    where.mkdir()
    probe = where / "x:y.bpf.o"
    shutil.copy(probe_obj("count"), probe)
    r = egpu_run(["-p", str(probe), str(stub_job.app), "module", "1", "32", "0"], stub_job.env(tmp_path / "log"))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.splitlines()[1:] == ["@counts: 32"]


@pytest.mark.parametrize("how", ["other owner", "symlink"])
def test_a_squatted_session_directory_still_runs_the_job(stub_job, probe_obj, tmp_path, how):
    """Another user's /tmp/egpu-<uid> (here $XDG_RUNTIME_DIR/egpu) made first: the job runs anyway, its
    session in a private directory of ours, and egpu-run says so in one line."""
    if how == "other owner" and os.geteuid() != 0:
        pytest.skip("chown needs root")
    squat, tmp = tmp_path / "egpu", tmp_path / "tmp"
    tmp.mkdir()
    if how == "symlink":
        (tmp_path / "theirs").mkdir()
        squat.symlink_to(tmp_path / "theirs")
    else:
        squat.mkdir(mode=0o777)
        squat.chmod(0o777)
        os.chown(squat, 65534, 65534)
    r = egpu_run(["-p", str(probe_obj("count")), str(stub_job.app), "module", "1", "32", "0"],
                 stub_job.env(tmp_path / "log", TMPDIR=str(tmp)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1:] == ["@counts: 32"]
    [line] = r.stderr.splitlines()
    fallback = re.fullmatch(rf"egpu: {squat}: .*: using ({tmp}/egpu-{os.getuid()}-\w+) instead", line)
    assert fallback, line
    assert os.stat(fallback[1]).st_mode & 0o777 == 0o700 and list(squat.iterdir()) == []


def test_a_runtime_dir_that_is_a_file_still_runs_the_job(stub_job, probe_obj, tmp_path):
    """$XDG_RUNTIME_DIR a file: egpu-run's mkdir there was a traceback (exit 1) and the job never ran; now
    the session goes to a private fallback, one line says so, and the job's status passes through."""
    (tmp_path / "tmp").mkdir()
    runtime = tmp_path / "file"
    runtime.write_text("")
    r = egpu_run(["-p", str(probe_obj("count")), str(stub_job.app), "module", "1", "32", "3"],
                 stub_job.env(tmp_path / "log", TMPDIR=str(tmp_path / "tmp"), XDG_RUNTIME_DIR=str(runtime)))
    assert r.returncode == 3, r.stderr
    assert r.stdout.splitlines()[1:] == ["@counts: 32"]
    [line] = r.stderr.splitlines()
    assert re.fullmatch(rf"egpu: {runtime}/egpu: cannot create it \(Not a directory\): using "
                        rf"{tmp_path}/tmp/egpu-{os.getuid()}-\w+ instead", line), line


# A part of the runtime that fails as it starts, after the exit hook, the control socket and its thread.
MIRROR_FAILS = """import sys
sys.path.insert(0, sys.argv[1])
from egpu_preload.runtime import mirror
def refuse(*args):
    raise RuntimeError("no mirror here")
mirror.start = refuse
import app_vec
app_vec.launch("module", 2, 32)
print("ran", flush=True)
sys.exit(3)
"""


@pytest.mark.parametrize("how, why", [("ulimit", "too many open files (RLIMIT_NOFILE 6)"),
                                      ("part", "RuntimeError: no mirror here")])
def test_a_runtime_that_cannot_start_says_why_in_one_line_and_the_job_runs_without_it(stub_job, probe_obj, tmp_path,
                                                                                      how, why):
    """A start that failed partway (ulimit -n 6: out of descriptors; any part of it raising) was a traceback from
    the control thread, a reason that named none ("No usable temporary directory"), and at exit "exit dump failed:
    AttributeError: ... 'cow'" from the hook registered before the failure. One line names the reason, nothing of
    the runtime is left running, and the job runs as it would, its exit status its own."""
    job = (["sh", "-c", 'ulimit -n 6 && exec "$0" "$@"', str(stub_job.app), "module", "2", "64", "3"] if how == "ulimit"
           else [sys.executable, "-c", MIRROR_FAILS, str(MORE)])
    r = egpu_run(["-p", str(probe_obj("count")), *job], stub_job.env(tmp_path / "log"))
    assert r.returncode == 3, r.stderr
    assert r.stdout == ("app_vec module launches=2 threads=64 result=0\n" if how == "ulimit" else "ran\n")
    pid, cmd = re.search(r"egpu-run: pid (\d+) \((.*)\) ran without probes", r.stderr).groups()
    assert r.stderr.splitlines() == [f"egpu: cannot start: {why}; the program runs without probes",
                                     f"egpu-run: pid {pid} ({cmd}) ran without probes: egpu could not start in it "
                                     f"({why})"]
    assert cmd.startswith("app_vec module 2 64 3" if how == "ulimit" else "python")
    assert not list((tmp_path / "egpu").glob("*.sock")), "the control socket of a runtime that never started"


def test_a_working_directory_removed_under_the_shell_is_refused(stub_job, probe_obj, tmp_path):
    """rm -rf build && mkdir build, the shell still in the old build/: the job's runtime failed to start there
    and the job ran without probes ("no process of the job loaded CUDA code"); --trace FILE was a traceback."""
    gone = tmp_path / "gone"
    gone.mkdir()

    def child() -> None:
        os.chdir(gone)
        os.rmdir(gone)

    r = subprocess.run([sys.executable, "-c", "import launcher; launcher.run_main()", "-p", str(probe_obj("count")),
                        str(stub_job.app), "module", "1", "32", "0"], env=stub_job.env(tmp_path / "log"),
                       capture_output=True, text=True, timeout=60, preexec_fn=child)
    assert (r.returncode, r.stdout) == (125, "")
    assert r.stderr == ("egpu-run: the current directory no longer exists (removed after the shell entered it): "
                        "cd into one that does\n")


def test_kernels_on_a_second_device_never_read_the_maps_of_the_first(stub_job, probe_obj, tmp_path):
    """The maps live in device 0's context (the first instrumented load's). app_vec devices then makes device 1
    current (cudaSetDevice(1)) and launches there the library's kernel (its copy in device 1's context: a
    table the runtime never filled) and a module's loaded there: neither may reach device 0's memory, which
    on a GPU without peer access is an illegal address that kills the job."""
    log = tmp_path / "log"
    r = egpu_run(["-p", str(probe_obj("count")), str(stub_job.app), "devices", "3", "32", "0"],
                 stub_job.env(log, EGPU_STUB_PROBE_COUNTS="1"))
    assert r.returncode == 0, r.stderr
    assert "app_vec devices launches=3 threads=32 result=0" in r.stdout
    assert "probe fault" not in log.read_text()
    assert "@counts: 96" in r.stdout, r.stdout   # device 0's 3 launches x 32 threads, counted
    # the module loaded on device 1 ran without probes, and the maps do not pass for the whole job's
    assert re.search(r"^egpu-run: pid \d+: 1 load in another context than the maps' \(another GPU's\): their "
                     r"kernels ran without probes$", r.stderr, re.M), r.stderr
