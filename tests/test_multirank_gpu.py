"""torchrun under egpu-run on the GPU (run by the lead: `python3 -m pytest -m gpu tests/test_multirank_gpu.py`).

One GPU: two ranks share cuda:0 with the gloo backend (tests/e2e/ddp_step.py). The NCCL run (two GPUs)
is not here. The job runs twice, plainly and under `egpu-run -p launch_count` (launch probes: PyTorch's
kernels are SASS only), paused after its first step while `egpu attach --all` and `egpu swap --all`
change the probes of both ranks:
- every rank's launch count from egpu equals the kernels torch.profiler listed for that rank (in total,
  and kernel by kernel where egpu knows the kernel's name), and the "all" sum is their sum;
- losses and final weights are identical to the plain run;
- only the ranks run the runtime: torchrun's agent (no CUDA) has no session and leaves no dump.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from egpu_preload.control import list_sessions
from egpu_preload.runtime import dump, ranks
from egpu_preload.runtime.live import probe_name
from stub_job import ROOT
from test_e2e_gpu import E2E, env_for, shim, split  # noqa: F401  (fixtures)

pytestmark = pytest.mark.gpu

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


def egpu(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import launcher; launcher.egpu_main()", *args], env=env,
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def results(out: Path) -> dict[int, dict]:
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)}


def demangled(names: list[str]) -> list[str]:
    """Mangled kernel names as torch.profiler spells them (c++filt and kineto both use the Itanium
    demangler); names that are not mangled stay."""
    if not shutil.which("c++filt"):
        return names
    done = subprocess.run(["c++filt"], input="\n".join(names) + "\n", capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def launches_by_name(doc: dict) -> tuple[int, Counter]:
    """(all launches, launches per demangled name of the kernels egpu could name) of a rank's document."""
    entries = doc["maps"]["launches"]["entries"]
    named = [(doc["kernels"][str(e["key"])], e["value"]) for e in entries if str(e["key"]) in doc["kernels"]]
    return sum(e["value"] for e in entries), Counter(dict(zip(demangled([n for n, _ in named]), (c for _, c in named))))


def wait_for(what: str, ok, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_ddp_two_ranks_on_one_gpu(shim, probe_obj, tmp_path):  # noqa: F811
    if subprocess.run([sys.executable, "-c", "import torch.distributed.run"], capture_output=True).returncode:
        pytest.skip("PyTorch is not installed")
    env = env_for(shim, tmp_path)
    script = str(E2E / "ddp_step.py")

    plain_out = tmp_path / "plain"
    plain_out.mkdir()
    plain = subprocess.run([*TORCHRUN, script, str(plain_out)], env=env, capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0, plain.stderr[-4000:]

    out, go = tmp_path / "probed", tmp_path / "go"
    out.mkdir()
    job = subprocess.Popen([sys.executable, "-c", "import launcher; launcher.run_main()", "--json", "--keep",
                            "-p", str(probe_obj("launch_count")), *TORCHRUN, script, str(out), str(go)],
                           env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for("both ranks to pause",
                 lambda: all((out / f"paused{r}").exists() for r in (0, 1)) or job.poll() is not None)
        assert job.poll() is None, job.communicate()
        sessions = list_sessions(tmp_path / "egpu")
        found = ranks.job_targets(job.pid, sessions)
        assert sorted(t.rank for t, _ in found) == [0, 1], sessions
        agents = {ranks.parent(t.pid) for t, _ in found}
        assert len(agents) == 1 and not {s.pid for s in sessions} & agents  # torchrun's agent runs no runtime

        count, hashed = probe_obj("count"), probe_obj("hash_count")
        attach = egpu(["attach", "--all", str(job.pid), "-p", str(count)], env)
        assert attach.returncode == 0, attach.stderr
        assert [ln.split(":")[0] for ln in attach.stdout.splitlines()] == ["rank 0", "rank 1"], attach.stdout
        swap = egpu(["swap", "--all", str(job.pid), probe_name(count), str(hashed)], env)
        assert swap.returncode == 0, swap.stderr
        assert [ln.split(":")[0] for ln in swap.stderr.splitlines()] == ["rank 0", "rank 1"], swap.stderr
        print(attach.stdout, swap.stderr, swap.stdout, sep="")
        modules = egpu(["modules", str(found[0][0].pid)], env)
        print("\n".join(modules.stdout.splitlines()[:20]))
        ps = {s.info["rank"]: s.info["probes"] for s in list_sessions(tmp_path / "egpu") if s.info and s.pid in
              {t.pid for t, _ in found}}
        assert ps == {r: [probe_name(probe_obj("launch_count")), probe_name(hashed)] for r in (0, 1)}, ps
    finally:
        go.touch()
        stdout, stderr = job.communicate(timeout=120)
    assert job.returncode == 0, stderr[-4000:]

    # only the ranks wrote dumps
    session = Path(re.search(r"session kept in (\S+)", stderr).group(1))
    assert sorted(d["rank"] for d in dump.read_all(session)) == [0, 1]

    docs = {d["rank"]: d for d in split(stdout)[1]}
    assert set(docs) == {0, 1, "all"}, stdout[-2000:]
    mine, theirs = results(out), results(plain_out)
    totals = {}
    for r in (0, 1):
        assert mine[r]["losses"] == theirs[r]["losses"] and mine[r]["weights"] == theirs[r]["weights"]
        total, named = launches_by_name(docs[r])
        profiled = Counter(mine[r]["kernels"])
        both = {n for n in named if n in profiled}
        print(f"rank {r}: egpu {total} launches, torch.profiler {sum(profiled.values())} kernels; "
              f"{sum(named[n] for n in both)} matched by name over {len(both)} kernels")
        for n in sorted(set(named) ^ set(profiled)):
            print(f"  only in {'egpu' if n in named else 'torch.profiler'}: {named[n] or profiled[n]} x {n}")
        assert total == sum(profiled.values())
        assert {n: named[n] for n in both} == {n: profiled[n] for n in both}
        assert sum(named[n] for n in both) * 2 >= total  # most launches matched by name, not totals alone
        totals[r] = total
    assert launches_by_name(docs["all"])[0] == totals[0] + totals[1]
    assert mine[0]["losses"] != mine[1]["losses"]  # the ranks had different data: two real ranks
