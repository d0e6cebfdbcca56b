"""Jobs of several ranks (torchrun) under egpu-run, against the stand-in driver: tests/runtime_stub/ranks.py
plays torchrun's agent (starts N children with RANK=r, never touches CUDA). Per-rank and summed maps at
exit (text, JSON), the agent's own process left alone, and live control addressed by rank. Plus the
pieces alone: sum_snapshots, the process tree walk and rank selection, config.rank."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egpu_preload.bpf.elf import load_object
from egpu_preload.control import SessionInfo, list_sessions
from egpu_preload.errors import EgpuError
from egpu_preload.maps import MapsState
from egpu_preload.output.combine import sum_snapshots
from egpu_preload.output.values import (Entry, Histogram, KernelId, KeyedScalars, Record, Records, Scalar, Snapshot,
                                        Trace, histogram)
from egpu_preload.runtime import config, dump, job, ranks
from stub_job import MORE, ROOT, egpu_run

EXAMPLES = ROOT / "examples"
AGENT = [sys.executable, str(MORE / "ranks.py")]
VEC = 0x1234  # a kernel id


def egpu(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import launcher; launcher.egpu_main()", *args], env=env,
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


# ---- sum_snapshots ----------------------------------------------------------------------------------

def snap(*maps, trace: tuple[str, ...] = (), names: dict | None = None) -> Snapshot:
    return Snapshot(tuple(maps), Trace(trace), names or {VEC: "_Z3vecv"})


def hist(name: str, slots: dict[int, int], scale: str = "log2", step: int = 1) -> Histogram:
    return histogram(name, scale, step, slots)


@pytest.mark.parametrize("parts, total", [
    ([Scalar("n", 2, {0: 1, 1: 1}), Scalar("n", 5)], Scalar("n", 7)),          # per-SM values dropped
    ([Scalar("s", {"a": 1, "k": KernelId(VEC), "xs": [1, 2]}),
      Scalar("s", {"a": 4, "k": KernelId(VEC), "xs": [10, 20]})],
     Scalar("s", {"a": 5, "k": KernelId(VEC), "xs": [11, 22]})),                # a kernel id is kept, not added
    ([KeyedScalars("m", (Entry(KernelId(VEC), 3), Entry(7, 1))), KeyedScalars("m", (Entry(7, 5), Entry(9, 1)))],
     KeyedScalars("m", (Entry(9, 1), Entry(KernelId(VEC), 3), Entry(7, 6)))),  # by value, as values.py orders
    ([KeyedScalars("m", (Entry({"x": 1}, {"c": 1}),)), KeyedScalars("m", (Entry({"x": 1}, {"c": 2}),))],
     KeyedScalars("m", (Entry({"x": 1}, {"c": 3}),))),                        # struct keys and values
    ([hist("hist_a", {1: 2, 2: 1}), hist("hist_a", {5: 4}), hist("hist_a", {})], hist("hist_a", {1: 2, 2: 1, 5: 4})),
    ([hist("lhist10_b", {3: 1}, "linear", 10), hist("lhist10_b", {0: 2, 3: 1}, "linear", 10)],
     hist("lhist10_b", {0: 2, 3: 2}, "linear", 10)),
    ([Records("ev", (Record(1, 3),), 2), Records("ev", (Record(2, 0), Record(3, 1)), 1)],
     Records("ev", (Record(1, 3), Record(2, 0), Record(3, 1)), 3)),            # concatenated, drops summed
])
def test_sum_of_one_map(parts, total):
    assert sum_snapshots([snap(p) for p in parts]) == (snap(total, names={VEC: "_Z3vecv"}), [])


def test_sum_keeps_map_order_and_concatenates_traces():
    a = snap(Scalar("x", 1), Scalar("y", 1), trace=("a0",), names={1: "_Z1av"})
    b = snap(Scalar("z", 3), Scalar("x", 2), trace=("b0", "b1"), names={2: "_Z1bv"})
    total, _ = sum_snapshots([a, b])
    assert [m.name for m in total.maps] == ["x", "y", "z"]
    assert total.maps[0] == Scalar("x", 3)
    assert total.trace.lines == ("a0", "b0", "b1")
    assert dict(total.kernel_names) == {1: "_Z1av", 2: "_Z1bv"}


@pytest.mark.parametrize("a, b, why", [
    (Scalar("m", 1), KeyedScalars("m", ()), "a Scalar in one process, a KeyedScalars in another"),
    (Scalar("m", 1), Scalar("m", {"n": 2}),
     'values of different types in different processes ("scalar", {"n": "scalar"})'),
    (Scalar("m", [1, 2]), Scalar("m", [1, 2, 3]),
     'values of different types in different processes (["scalar", "scalar", "scalar"], ["scalar", "scalar"])'),
    (KeyedScalars("m", (Entry(7, 1),)), KeyedScalars("m", (Entry(9, {"n": 1}),)),
     'values of different types in different processes ("scalar", {"n": "scalar"})'),
    (hist("m", {1: 1}), hist("m", {1: 1}, "linear", 10), "histograms of different scales cannot be summed"),
])
def test_a_map_that_does_not_sum_is_left_out_and_the_others_summed(a, b, why):
    """Ranks that attached different probes with a map of one name: that map is left out of the sum, with
    why (its kinds raised, losing every map of every rank; values of other types summed to the first)."""
    total, left_out = sum_snapshots([snap(a, Scalar("n", 1)), snap(b, Scalar("n", 2)), snap(a)])
    assert (total.maps, left_out) == ((Scalar("n", 3),), [f"map m: {why}"])


def test_each_rank_prints_when_the_sum_leaves_a_map_out(probe_obj):
    """Text and JSON: each rank's maps in full, then the sum of what sums and a line per map it left out."""
    count, hashed = load_object(probe_obj("count")), load_object(probe_obj("hash_count"))
    renamed = dataclasses.replace(hashed, maps=[dataclasses.replace(hashed.maps[0], name="counts")])
    dumps = [{"pid": 10 + r, "rank": r, "argv": ["train.py"], "kernels": [],
              "probes": [{"path": f"/p{r}.bpf.o", **dump.state_contents(MapsState(obj.maps))}]}
             for r, obj in enumerate((count, renamed))]
    probes = [SimpleNamespace(path=Path(f"/p{r}.bpf.o"), obj=obj) for r, obj in enumerate((count, renamed))]
    why = "not summed: map counts: a Scalar in one process, a KeyedScalars in another\n"
    assert job.render(probes, dumps, as_json=False) == (
        "pid 10 rank 0: train.py\n@counts: 0\n\n"
        f"pid 11 rank 1: train.py\n\nall ranks (sum of 2 processes):\n{why}")
    docs = [json.loads(line) for line in job.render(probes, dumps, as_json=True).splitlines()]
    assert [(d["rank"], list(d["maps"]), d.get("left_out")) for d in docs] == [
        (0, ["counts"], None), (1, ["counts"], None), ("all", [], [why[len("not summed: "):-1]])]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([("log2", 1), ("linear", 1), ("linear", 100)]),
       st.lists(st.dictionaries(st.integers(0, 40), st.integers(0, 9), max_size=6), min_size=1, max_size=4))
def test_histograms_sum_slot_by_slot(kind, parts):
    """Slots survive building a Histogram and reading it back, and a sum is the sum of each slot."""
    scale, step = kind
    hists = [hist("hist_h", p, scale, step) for p in parts]
    for h, p in zip(hists, parts):
        assert h.slots() == {k: v for k, v in p.items() if v}
    want: dict[int, int] = {}
    for p in parts:
        for k, v in p.items():
            want[k] = want.get(k, 0) + v
    assert sum_snapshots([snap(h) for h in hists])[0].maps == (hist("hist_h", want, scale, step),)


# ---- ranks: the process tree and who is addressed ----------------------------------------------------

def test_json_of_several_processes_is_a_document_a_line(probe_obj):
    """--json over several processes (each rank, then the sum; -o FILE, egpu maps --all) is NDJSON: no
    blank line between documents, which a reader taking a line at a time cannot parse."""
    obj = load_object(probe_obj("count"))
    dumps = [{"pid": 10 + r, "rank": r, "argv": ["train.py"], "kernels": [],
              "probes": [{"path": str(obj.path), **dump.state_contents(MapsState(obj.maps))}]} for r in (0, 1)]
    out = job.render([], dumps, as_json=True)
    assert [json.loads(line)["rank"] for line in out.splitlines()] == [0, 1, "all"]
    assert out.endswith("}\n")


def test_parent_reads_stat_past_an_odd_command_name(tmp_path):
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "stat").write_text("42 (a) b) (c) S 17 42 42 0 -1 4194560\n")
    assert ranks.parent(42, tmp_path) == 17
    assert ranks.parent(43, tmp_path) is None  # gone
    import os
    assert ranks.parent(os.getpid()) == os.getppid()


# a tree: 1 <- 10 (egpu-run) <- 11 (agent) <- 20, 21, 22 (ranks 0..2); 21 <- 30 (rank 1's worker);
# 1 <- 50 (another job, rank 0)
TREE = {10: 1, 11: 10, 20: 11, 21: 11, 22: 11, 30: 21, 50: 1}


def sessions(**ranks_by_pid: int | None) -> list[SessionInfo]:
    return [SessionInfo(int(p[1:]), Path(f"/x/{p[1:]}.sock"), {"rank": r}) for p, r in ranks_by_pid.items()]


JOB = sessions(p20=0, p21=1, p22=2, p30=1, p50=0)


@pytest.mark.parametrize("root, rank, every, want", [
    (10, 1, False, [ranks.Target(21, 1)]),             # rank 1 itself, not its worker 30
    (11, 0, False, [ranks.Target(20, 0)]),             # the agent's pid works as well; 50 is another job's
    (10, None, True, [ranks.Target(20, 0), ranks.Target(21, 1), ranks.Target(30, 1), ranks.Target(22, 2)]),
    (21, None, True, [ranks.Target(21, 1), ranks.Target(30, 1)]),
    (30, 1, False, [ranks.Target(30, 1)]),             # below the root, no ancestor of its rank
    (99, None, False, [ranks.Target(99)]),             # neither: the pid as given, nothing listed
    (20, None, False, [ranks.Target(20)]),             # a session of its own: itself
    (21, None, False, [ranks.Target(21)]),             # itself, not its worker below
    (30, None, False, [ranks.Target(30)]),
    (50, None, False, [ranks.Target(50)]),
    (10, None, False, "refused"),                      # egpu-run's pid over several: refused below
    (1, None, False, [ranks.Target(1)]),               # any other ancestor: itself (its request fails)
    (11, None, False, [ranks.Target(11)]),             # torchrun's agent, not an egpu-run: itself
])
def test_select(root, rank, every, want):
    egpu_run = {10}.__contains__   # pid 10 is the egpu-run
    if want == "refused":
        with pytest.raises(EgpuError, match=re.escape("no egpu session in process 10, but in 4 processes below it "
                                                      "(20, 21, 30, 22): give one of them, --rank R or --all")):
            ranks.select(root, rank, every, JOB, TREE.get, egpu_run)
        return
    assert ranks.select(root, rank, every, JOB, TREE.get, egpu_run) == want


def test_egpu_run_pid_addresses_its_only_process():
    """egpu attach $! (egpu-run's pid, which has no session): the one process of its job that has one; the
    same from pid 1 or a shell above it addresses nothing but itself (egpu detach 1 --all would have
    reached every job the user runs)."""
    tree = {10: 1, 11: 10}
    assert ranks.select(10, None, False, sessions(p11=None), tree.get, {10}.__contains__) == [ranks.Target(11)]
    assert ranks.select(1, None, False, sessions(p11=None), tree.get, {10}.__contains__) == [ranks.Target(1)]


def test_egpu_run_pid_whose_job_has_no_session_is_named_an_egpu_run():
    """egpu maps $! while the job has no session (egpu-run sleep 100, or a CUDA program not started yet):
    "no egpu session in process 10" named the egpu-run alone, as if it were the job."""
    with pytest.raises(EgpuError, match=re.escape("no egpu session in process 10 (egpu-run) or below it: no process "
                                                  "of its job has started egpu's runtime (yet)")):
        ranks.select(10, None, False, sessions(p50=0), TREE.get, {10}.__contains__)


def test_runs_egpu_run_reads_the_command_line(tmp_path, monkeypatch):
    for pid, argv in ((10, [sys.executable, "/usr/bin/egpu-run", "-p", "x.bpf.o", "./app"]),
                      (11, [sys.executable, "-c", "import launcher; launcher.run_main()", "./app"]),
                      (12, ["/bin/bash"]), (13, ["torchrun", "--nproc-per-node", "2", "egpu-run.py"])):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    monkeypatch.setattr(ranks, "PROC", tmp_path)
    assert [p for p in (10, 11, 12, 13, 14) if ranks.runs_egpu_run(p)] == [10, 11]


@pytest.mark.parametrize("root, rank, every, message", [
    (10, 7, False, "no process of job 10 has rank 7 (ranks: 0, 1, 2)"),
    (60, None, True, "no egpu session in process 60 or below it"),
])
def test_select_refuses(root, rank, every, message):
    with pytest.raises(EgpuError, match=re.escape(message)):
        ranks.select(root, rank, every, JOB, TREE.get)


def test_fan_out_keeps_order_and_errors():
    def fn(pid: int) -> int:
        if pid == 2:
            raise EgpuError("no")
        time.sleep(0.05 if pid == 1 else 0)
        return pid * 10
    out = ranks.fan_out([ranks.Target(1, 0), ranks.Target(2, 1), ranks.Target(3, 2)], fn)
    assert [(t.pid, r if isinstance(r, int) else str(r)) for t, r in out] == [(1, 10), (2, "no"), (3, 30)]



def test_fan_out_raises_what_is_not_an_egpu_error():
    """An exception other than EgpuError in any process's call reaches the caller, as the thread pool's
    map gave it: on daemon threads it was printed by the thread and its process's reply read as None."""
    def fn(pid: int) -> int:
        if pid == 2:
            raise ValueError("bad reply")
        return pid
    with pytest.raises(ValueError, match="bad reply"):
        ranks.fan_out([ranks.Target(1, 0), ranks.Target(2, 1)], fn)

@pytest.mark.parametrize("env, want", [
    ({"RANK": "3", "LOCAL_RANK": "1"}, 3), ({"LOCAL_RANK": "1"}, 1), ({"RANK": "x"}, None), ({}, None),
    ({"RANK": "", "LOCAL_RANK": "0"}, 0),
])
def test_rank_from_the_environment(env, want):
    assert config.rank(env) == want


# ---- whole jobs on the stand-in --------------------------------------------------------------------

def rank_job(stub_job, tmp_path, *options: str) -> subprocess.CompletedProcess:
    """egpu-run OPTIONS -p launch_count agent 3 app_vec: rank r launches r + 1 times with 100 (r + 1) threads
    (4, 7 and 10 blocks of 32)."""
    return egpu_run([*options, "-p", str(EXAMPLES / "launch_count.bpf.c"), *AGENT, "3",
                     str(stub_job.app), "module", "{k}", "{k}00", "0"], stub_job.env(tmp_path / "log"))


def sections(stdout: str) -> dict[str, list[str]]:
    """Header line -> the lines under it (headers: "pid ..." and "all ranks ...")."""
    out: dict[str, list[str]] = {}
    head = None
    for line in stdout.splitlines():
        if line.startswith(("pid ", "all ranks ")):
            head = line
            out[head] = []
        elif head is not None and line and not line.startswith(("app_vec ", "agent ", "rank ")):
            out[head].append(line)
    return out


def hist_rows(rows: dict[str, int]) -> list[str]:
    top = max(rows.values())
    return [f"{b:<16}{n:>8} |{'@' * int(n / top * 52):<52}|" for b, n in rows.items()]


def test_each_rank_then_the_sum(stub_job, tmp_path):
    r = rank_job(stub_job, tmp_path, "--keep")
    assert r.returncode == 0, r.stderr
    pids = {int(m[0]): int(m[1]) for m in re.findall(r"^rank (\d) pid (\d+)$", r.stdout, re.M)}
    agent = int(re.search(r"^agent (\d+)$", r.stdout, re.M).group(1))
    got = sections(r.stdout)
    app = f"{stub_job.app} module"
    assert got == {
        f"pid {pids[0]} rank 0: {app} 1 100 0": ["@launches[vecadd]: 1", "@hist_grid_blocks:",
                                                  *hist_rows({"[4, 8)": 1})],
        f"pid {pids[1]} rank 1: {app} 2 200 0": ["@launches[vecadd]: 2", "@hist_grid_blocks:",
                                                  *hist_rows({"[4, 8)": 2})],
        f"pid {pids[2]} rank 2: {app} 3 300 0": ["@launches[vecadd]: 3", "@hist_grid_blocks:",
                                                  *hist_rows({"[8, 16)": 3})],
        "all ranks (sum of 3 processes):": ["@launches[vecadd]: 6", "@hist_grid_blocks:",
                                            *hist_rows({"[4, 8)": 3, "[8, 16)": 3})],
    }
    # the agent never touched CUDA: no runtime in it, so no dump (one per rank)
    session = Path(re.search(r"session kept in (\S+)", r.stderr).group(1))
    assert sorted(int(p.stem) for p in session.glob("*.msgpack")) == sorted(pids.values())
    assert agent not in pids.values()


@pytest.mark.parametrize("option, heads", [
    ("--per-rank", ["pid", "pid", "pid"]),
    ("--sum", ["all ranks"]),
])
def test_per_rank_or_sum_alone(stub_job, tmp_path, option, heads):
    r = rank_job(stub_job, tmp_path, option)
    assert r.returncode == 0, r.stderr
    assert [h.split(" ")[0] if h.startswith("pid") else "all ranks" for h in sections(r.stdout)] == heads
    if option == "--sum":
        assert sections(r.stdout)["all ranks (sum of 3 processes):"][0] == "@launches[vecadd]: 6"


def test_json_labels_each_rank_and_the_sum(stub_job, tmp_path):
    r = rank_job(stub_job, tmp_path, "--json")
    assert r.returncode == 0, r.stderr
    docs = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert [d["rank"] for d in docs] == [0, 1, 2, "all"]
    assert [isinstance(d["pid"], int) for d in docs] == [True, True, True, False]
    launches = [[e["value"] for e in d["maps"]["launches"]["entries"]] for d in docs]
    assert launches == [[1], [2], [3], [6]]
    assert {d["kernels"][str(d["maps"]["launches"]["entries"][0]["key"])] for d in docs} == {"vecadd"}
    assert docs[-1]["maps"]["hist_grid_blocks"]["buckets"] == [{"lo": 4, "hi": 8, "count": 3},
                                                              {"lo": 8, "hi": 16, "count": 3}]


def test_one_process_with_ranks_unset_prints_no_sum(stub_job, tmp_path):
    """A plain job: no rank, no sum section (its maps alone, as before)."""
    r = egpu_run(["-p", str(EXAMPLES / "launch_count.bpf.c"), str(stub_job.app), "module", "2", "64", "0"],
                 stub_job.env(tmp_path / "log"))
    assert r.returncode == 0, r.stderr
    assert "all ranks" not in r.stdout and "@launches[vecadd]: 2" in r.stdout


class RankJob:
    """egpu-run -p launch_count agent 3 app_loop: three ranks launching every millisecond until STOP."""

    def __init__(self, stub_job, tmp: Path) -> None:
        from egpu_preload.bpf.compile import compile_probe
        self.stop, self.dir = tmp / "stop", tmp / "egpu"
        self.env = stub_job.env(tmp / "log")
        probe = compile_probe(EXAMPLES / "launch_count.bpf.c", tmp / "launch_count.bpf.o")
        self.proc = subprocess.Popen([sys.executable, "-c", "import launcher; launcher.run_main()",
                                      "-p", str(probe), *AGENT, "3",
                                      str(stub_job.loop), str(self.stop), "600"],
                                     env=self.env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = {s.info["rank"]: s.pid for s in list_sessions(self.dir)
                     if s.info and str(stub_job.loop) in s.info["argv"]}
            if len(found) == 3:
                self.ranks = found
                return
            time.sleep(0.05)
        self.proc.kill()
        raise AssertionError(f"not three sessions: {self.proc.communicate()}")

    def probes(self) -> dict[int, list[str]]:
        return {s.info["rank"]: s.info["probes"] for s in list_sessions(self.dir) if s.pid in self.ranks.values()}

    def finish(self) -> tuple[int, str, str]:
        self.stop.touch()
        out, err = self.proc.communicate(timeout=30)
        return self.proc.returncode, out, err


def test_live_control_by_rank(stub_job, tmp_path, monkeypatch, probe_obj):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    count = tmp_path / "count.bpf.o"
    count.write_bytes(probe_obj("count").read_bytes())
    hashed = tmp_path / "hash_count.bpf.o"
    hashed.write_bytes(probe_obj("hash_count").read_bytes())
    job = RankJob(stub_job, tmp_path)
    try:
        root, by_rank = str(job.proc.pid), job.ranks
        assert job.probes() == {0: ["launch_count"], 1: ["launch_count"], 2: ["launch_count"]}

        a = egpu(["attach", "--rank", "1", root, "-p", str(count)], job.env)
        assert a.returncode == 0, a.stderr
        assert a.stdout.startswith(f"rank 1: attached count in {by_rank[1]}: PTX 1 modules, 1 kernels instrumented")
        assert job.probes() == {0: ["launch_count"], 1: ["launch_count", "count"], 2: ["launch_count"]}

        s = egpu(["swap", "--all", root, "launch_count", str(hashed)], job.env)
        assert s.returncode == 0, s.stderr
        assert [ln.split(":")[0] for ln in s.stderr.splitlines()] == ["rank 0", "rank 1", "rank 2"]
        assert all(f"swapped launch_count -> hash_count in {by_rank[r]}" in ln
                   for r, ln in enumerate(s.stderr.splitlines()))
        # launch_count's final maps, per rank and summed, as a detach --all prints them (a reply without
        # the process's argv made that a KeyError)
        assert [h.split(":")[0] for h in sections(s.stdout)] == [
            f"pid {by_rank[0]} rank 0", f"pid {by_rank[1]} rank 1", f"pid {by_rank[2]} rank 2",
            "all ranks (sum of 3 processes)"], s.stdout
        assert job.probes() == {0: ["hash_count"], 1: ["hash_count", "count"], 2: ["hash_count"]}

        m = egpu(["maps", "--all", root], job.env)
        assert m.returncode == 0, m.stderr
        assert [h.split(":")[0] for h in sections(m.stdout)] == [
            f"pid {by_rank[0]} rank 0", f"pid {by_rank[1]} rank 1", f"pid {by_rank[2]} rank 2",
            "all ranks (sum of 3 processes)"]
        assert sections(m.stdout)["all ranks (sum of 3 processes):"] == ["@counts: 0"]

        agent = str(ranks.parent(by_rank[0]))  # torchrun's pid addresses the job as well
        d = egpu(["detach", "--rank", "1", agent, "count"], job.env)
        assert d.returncode == 0, d.stderr
        assert d.stderr.startswith(f"rank 1: detached count in {by_rank[1]}")
        assert d.stdout == "@counts: 0\n"

        bad = egpu(["attach", "--rank", "7", root, "-p", str(count)], job.env)
        assert (bad.returncode, bad.stderr) == (1, f"egpu: no process of job {root} has rank 7 (ranks: 0, 1, 2)\n")
        assert job.probes() == {0: ["hash_count"], 1: ["hash_count"], 2: ["hash_count"]}
    finally:
        status, out, err = job.finish()
    assert status == 0, err
    assert out.count("result=0") == 3
    assert "all ranks (sum of 3 processes):" in out, err
