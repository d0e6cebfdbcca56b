"""Run every probe in examples/ on a program it suits, under egpu-run, and keep what it printed.

On the GPU machine (after scripts/gpu-prep.sh; the probes are the prebuilt .gpubuild/probes objects,
since that machine has no clang):

    python3 scripts/capture_examples.py OUT/examples.md

writes OUT/examples.md (each example's command and output, cut to MAX_LINES lines) and
OUT/examples.json beside it. Back where the repository is edited:

    python3 scripts/capture_examples.py --apply OUT/examples.json examples/README.md

puts each captured output in place of its section's "(output captured on the GPU: ...)" line.

Programs: bpftime's ports run on examples/vec_add.cu (as bpftime's on its vec_add), the launch probes
on a small PyTorch eager program (tests/e2e/torch_eager.py: cuBLAS kernels, no PTX), and alloc_hist on it
too, uvm_ranges on tests/e2e/uvm_oversub.cu (managed memory that migrates), memcpy_bytes and sync_wait on
tests/e2e/host_copies.cu, the rest on tests/e2e/vecadd.cu. bpftime's own files (BPFTIME: the
objects scripts/gpu-prep.sh builds with bpftime's flags into .gpubuild/bpftime) run on examples/vec_add.cu
as bpftime's run on its vec_add: built with -DLENGTH_PARAM for those naming vectorAdd(..., int), with
-DGRAPH for the cudagraph example; pytorch-test's on tests/e2e/torch_sort.py; faiss-test's and
llama-cpp-test's on their stand-ins (tests/bpftime_targets), cutlass's on bpftime's own GEMM program. Whatever runs past
DEADLINE_S is left out and says so. Names after OUT (an example's, or a bpftime file's as in BPFTIME)
capture only those.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 30
DEADLINE_S = 240
TIMEOUT_S = 60
PLACEHOLDER = re.compile(r"^\(output captured on the GPU[^)]*\)[ \t]*$", re.M)  # the line alone: its newline stays

VECADD = ("./vecadd", ["10", "1048576"])
TORCH = ("python3 tests/e2e/torch_eager.py", ["20"])
VEC_ADD = ("./vec_add", [])
VEC_ADD_N = ("./vec_add_n", [])
VEC_ADD_GRAPH = ("./vec_add_graph", [])
TORCH_SORT = ("python3 tests/e2e/torch_sort.py", [])
HOST_COPIES = ("./host_copies", [])
# example -> (program, its arguments, egpu-run options beside -p)
EXAMPLES = {
    "launch_count": (*TORCH, []),
    "kernel_duration": (*VECADD, []),
    "mem_bytes": (*VECADD, []),
    "access_trace": ("./vecadd", ["1", "4096"], ["--perfetto", "trace.json"]),
    "mem_trace_warp": ("./vecadd", ["1", "4096"], []),
    "sm_balance": (*VECADD, []),
    "hot_pages": (*VECADD, []),
    "uvm_ranges": ("./uvm_oversub", ["128", "8"], ["--perfetto", "trace.json", "--durations"]),
    "cxl_latency": (*VECADD, []),
    "stragglers": (*VECADD, []),
    "launch_latency": (*TORCH, []),
    "cuda_counter": (*VEC_ADD, []),
    "mem_trace": (*VEC_ADD, []),
    "kernelretsnoop": (*VEC_ADD, []),
    "threadhist": (*VEC_ADD, []),
    "launchlate": (*VEC_ADD, []),
    "memcpy_bytes": (*HOST_COPIES, []),
    "alloc_hist": (*TORCH, []),
    "sync_wait": (*HOST_COPIES, []),
}
LAUNCH_UPROBE = ["--uprobe", "uprobe_cuda_launch=vec_add:__cudaLaunchKernel"]   # nvcc's static cudart: inline
# bpftime's example/gpu files (as tests/fixtures/bpftime holds them) that run on a program here -> the same
BPFTIME = {
    "atomizer/atomizer": (*VEC_ADD, []),
    "cuda-counter/cuda_probe": (*VEC_ADD, []),
    "cudagraph/cuda_probe": (*VEC_ADD_GRAPH, []),
    "gpu_shared_map/gpu_shared_map": (*VEC_ADD, []),
    "host_map_test/host_map_test": (*VEC_ADD, []),
    "kernel_trace/kernel_trace": (*VEC_ADD_N, []),
    "kernelretsnoop/kernelretsnoop": (*VEC_ADD, []),
    "launchlate/launchlate": (*VEC_ADD, LAUNCH_UPROBE),
    "launchlate-kernel-gpu-shared-map/launchlate": (*VEC_ADD, LAUNCH_UPROBE),
    "mem_trace/mem_trace": (*VEC_ADD, []),
    "pytorch-test/threadhist": (*TORCH_SORT, []),
    "threadhist/threadhist": (*VEC_ADD, []),
    "threadhist-gpu-kernel-shared-map/threadhist": (*VEC_ADD, []),
    "threadscheduling/threadscheduling": (*VEC_ADD, []),
    "threadscheduling_dynamic_hook/threadscheduling": (*VEC_ADD_N, []),
    "rocm-counter/rocm_probe": (*VEC_ADD, []),   # written for HIP; its kernel name is CUDA vectorAdd's too
    "cutlass/counter/cutlass_launch_counter": ("./cutlass_gemm", ["--shape", "256x256x256", "--warmup", "2",
                                                                  "--launches", "5", "--verify"], []),
    "faiss-test/threadhist": ("./faiss_l2norm", ["10"], []),
    "llama-cpp-test/threadhist": ("./llama_rms_norm", ["10"], []),
}


def shown(lines: list[str], limit: int = MAX_LINES) -> str:
    """The first ``limit`` lines, and how many were left out."""
    if len(lines) <= limit:
        return "\n".join(lines)
    return "\n".join(lines[:limit] + [f"... ({len(lines) - limit} more lines)"])


def build(work: Path) -> dict[str, str]:
    """The compiled programs, by the name the README's commands use."""
    vec_add = ROOT / "examples/vec_add.cu"
    progs = {"./vecadd": (ROOT / "tests/e2e/vecadd.cu", []), "./vec_add": (vec_add, []),
             "./vec_add_n": (vec_add, ["-DLENGTH_PARAM"]), "./vec_add_graph": (vec_add, ["-DGRAPH"]),
             "./uvm_oversub": (ROOT / "tests/e2e/uvm_oversub.cu", []),
             "./host_copies": (ROOT / "tests/e2e/host_copies.cu", []),
             "./faiss_l2norm": (ROOT / "tests/bpftime_targets/faiss_l2norm.cu", []),
             "./llama_rms_norm": (ROOT / "tests/bpftime_targets/llama_rms_norm.cu", [])}
    # bpftime's CUTLASS GEMM, which needs CUTLASS's headers: built by scripts/gpu-prep.sh where they download
    out = {"./cutlass_gemm": str(ROOT / ".gpubuild" / "bpftime" / "cutlass_gemm")}
    for name, (src, flags) in progs.items():
        exe = work / name.removeprefix("./")
        subprocess.run(["nvcc", "-O2", "-gencode", "arch=compute_90,code=[sm_90,compute_90]", *flags, str(src),
                        "-o", str(exe)], check=True)
        out[name] = str(exe)
    for script in ("torch_eager", "torch_sort"):
        out[f"python3 tests/e2e/{script}.py"] = f"{sys.executable} {ROOT / 'tests/e2e' / script}.py"
    return out


def probe_path(name: str, work: Path) -> Path:
    if name in BPFTIME:   # built by gpu-prep.sh with bpftime's flags and headers, as bpftime_build names them
        return ROOT / ".gpubuild" / "bpftime" / f"{name.replace('/', '_')}.bpf.o"
    prebuilt = Path(os.environ.get("EGPU_PREBUILT_PROBES") or ROOT / ".gpubuild" / "probes") / f"{name}.v3.bpf.o"
    if prebuilt.is_file():
        return prebuilt
    sys.path.insert(0, str(ROOT))
    from egpu_preload.bpf.compile import compile_probe
    return compile_probe(ROOT / "examples" / f"{name}.bpf.c", work / f"{name}.bpf.o")


def capture(name: str, program: str, args: list[str], options: list[str], progs: dict[str, str], work: Path,
            env: dict[str, str], supported: str, timeout: float) -> dict:
    options = [o if o != "trace.json" else str(work / "trace.json") for o in options]
    if options and options[0] not in supported:  # an option this egpu-run lacks: run without it
        options = []
    probe = [] if name == "durations" else ["-p", str(probe_path(name, work))]
    shown_probe = [] if name == "durations" else ["-p", f"{name}.bpf.o" if name in BPFTIME
                                                  else f"examples/{name}.bpf.c"]
    cmd = [sys.executable, "-c", "import launcher; launcher.run_main()", *probe, *options,
           *progs[program].split(), *args]
    display = " ".join(["egpu-run", *shown_probe,
                        *[o if not o.endswith("trace.json") else "trace.json" for o in options], program, *args])
    return run_captured(name, display, cmd, work, env, timeout)


def run_captured(name: str, display: str, cmd: list[str], work: Path, env: dict[str, str], timeout: float) -> dict:
    """Run ``cmd`` in ``work``: the capture of its output and status, shown as the command ``display``, with
    ``work``'s paths made relative as a user's would be."""
    t = time.perf_counter()
    try:
        done = subprocess.run(cmd, env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout)
        text, status = done.stdout, f"exit {done.returncode}"
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        status = f"timeout after {timeout:.0f} s"
    lines = [ln.replace(str(work) + "/", "") for ln in text.rstrip().splitlines()]
    return {"name": name, "command": display, "status": status, "seconds": round(time.perf_counter() - t, 1),
            "lines": len(lines), "output": shown(lines)}


def replay_uvm(work: Path, out_dir: Path, env: dict[str, str]) -> dict:
    """examples/uvm_lru.py on uvm_ranges' --perfetto trace: the LRU and LFU hit rates (the paper's
    cooperative-caching question) and their plot, hit_rate.png beside OUT."""
    plot = ["--plot", "hit_rate.png"] if importlib.util.find_spec("matplotlib") else []   # the plot needs it
    shown_cmd = " ".join(["python3 examples/uvm_lru.py trace.json --range 2M --sizes 8,16,24,32", *plot])
    cmd = [sys.executable, str(ROOT / "examples" / "uvm_lru.py"), str(work / "trace.json"), "--range", "2M",
           "--sizes", "8,16,24,32", *plot[:1], *[str(out_dir / p) for p in plot[1:]]]
    return run_captured("uvm_lru", shown_cmd, cmd, work, env, TIMEOUT_S)


def markdown(captures: list[dict]) -> str:
    out = ["# examples/ output captured on the GPU", ""]
    for c in captures:
        out += [f"## {c['name']}", "", f"{c['status']}, {c['seconds']} s", "", "```", f"$ {c['command']}", c["output"],
                "```", ""]
    return "\n".join(out)


def apply(readme: str, captures: list[dict]) -> str:
    """The README with each example's placeholder (the first after its heading) replaced by its output."""
    for c in captures:
        heading = re.search(rf"^#+ {re.escape(c['name'])}\.bpf\.c\s*$", readme, re.M)
        if heading is None:
            continue
        nxt = re.search(r"^#", readme[heading.end():], re.M)
        end = heading.end() + (nxt.start() if nxt else len(readme) - heading.end())
        m = PLACEHOLDER.search(readme, heading.end(), end)
        if m is None:
            continue
        block = f"```\n$ {c['command']}\n{c['output']}\n```"
        lead = "Output on the GPU:\n\n"   # unless the section says it before its placeholder
        lead = "" if readme[:m.start()].endswith(lead) else lead
        readme = readme[:m.start()] + lead + block + readme[m.end():]
    return readme


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--apply":
        captures = json.loads(Path(sys.argv[2]).read_text())
        readme = Path(sys.argv[3])
        readme.write_text(apply(readme.read_text(), captures))
        return
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        raise SystemExit(__doc__)
    out, wanted = Path(sys.argv[1]), set(sys.argv[2:])
    unknown = wanted - {*EXAMPLES, *BPFTIME, "durations"}
    if unknown:
        raise SystemExit(f"capture_examples.py: no example named {', '.join(sorted(unknown))}")
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    captures = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("EGPU_") or k in ("EGPU_SHIM", "EGPU_PREBUILT_PROBES")}
        env.update(XDG_RUNTIME_DIR=str(work), PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
        progs = build(work)
        egpu_run = [sys.executable, "-c", "import launcher; launcher.run_main()"]
        supported = subprocess.run([*egpu_run, "--help"], env=env, cwd=ROOT, capture_output=True, text=True).stdout
        subprocess.run([*egpu_run, "true"], env=env, cwd=ROOT, capture_output=True)  # builds a stale shim first
        jobs = [(n, *spec) for n, spec in {**EXAMPLES, **BPFTIME}.items()] + [("durations", *TORCH, ["--durations"])]
        jobs = [j for j in jobs if not wanted or j[0] in wanted]
        for name, program, args, options in jobs:
            left = DEADLINE_S - (time.monotonic() - start)
            if left < 10:
                captures.append({"name": name, "command": "", "status": "not run (time budget)", "seconds": 0,
                                 "lines": 0, "output": ""})
                continue
            (work / "trace.json").unlink(missing_ok=True)   # uvm_lru replays this run's trace, no other's
            done = [capture(name, program, args, options, progs, work, env, supported, min(TIMEOUT_S, left))]
            if name == "uvm_ranges" and (work / "trace.json").is_file():
                done.append(replay_uvm(work, out.parent, env))
            for c in done:
                print(f"{c['name']:>16}: {c['status']}, {c['lines']} lines, {c['seconds']} s", flush=True)
            captures += done
    out.write_text(markdown(captures))
    out.with_suffix(".json").write_text(json.dumps(captures, indent=1) + "\n")


if __name__ == "__main__":
    main()
