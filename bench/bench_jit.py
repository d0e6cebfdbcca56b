"""What instrumenting one kernel costs before it runs: probe translation, PTX rewrite and the driver's
JIT, for tests/cuda/big_unrolled.cu (a straight-line kernel of about 1,100 PTX instructions).

Usage (on the GPU machine): ``python3 bench/bench_jit.py OUT.json``; bench/suite.py calls ``measure``.

- translate: load, verify and translate the probe object (runtime/probes.load_probe), once per process.
- rewrite: instrument the kernel's PTX with it (translate/rewrite.instrument), once per module.
- driver: cuModuleLoadData + cuModuleGetFunction of the instrumented PTX, in a child process with the
  driver's JIT cache off (CUDA_CACHE_DISABLE=1) and eager loading, so every load compiles; the same for
  the original PTX is the JIT the program pays anyway. Median of REPS loads.

Goal: translate + rewrite + driver (instrumented) under 100 ms.
"""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNEL = ROOT / "tests" / "cuda" / "big_unrolled.cu"
PROBES = ("bench/probes/entry_exit", "bench/probes/mem_count", "examples/access_trace")
REPS = 5
GOAL_MS = 100.0


def probe_object(source: str, prebuilt: Path | None, out: Path) -> Path:
    """NAME.v3.bpf.o from scripts/gpu-prep.sh (the GPU machine has no clang), else compiled here."""
    name = Path(source).name
    if prebuilt is not None and (prebuilt / f"{name}.v3.bpf.o").is_file():
        return prebuilt / f"{name}.v3.bpf.o"
    from egpu_preload.bpf.compile import compile_probe
    return compile_probe(ROOT / f"{source}.bpf.c", out / f"{name}.bpf.o")


def prebuilt_dir() -> Path | None:
    d = os.environ.get("EGPU_PREBUILT_PROBES") or str(ROOT / ".gpubuild" / "probes")
    return Path(d) if Path(d).is_dir() else None


def kernel_instructions(text: str) -> dict[str, int]:
    from egpu_preload.translate import ptx
    return {k.name: sum(isinstance(s, ptx.Instruction) for s in k.statements()) for k in ptx.parse(text).kernels()}


def driver_load_ms(paths: list[Path], kernel: str, reps: int) -> list[list[float]]:
    """Per PTX file, ``reps`` timed loads (JIT included), measured in a child with the JIT cache off."""
    env = {**os.environ, "CUDA_CACHE_DISABLE": "1", "CUDA_MODULE_LOADING": "EAGER"}
    done = subprocess.run([sys.executable, __file__, "--load", kernel, str(reps), *map(str, paths)],
                          env=env, capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise RuntimeError(f"driver load child: exit {done.returncode}: {done.stderr[-1500:]}")
    return json.loads(done.stdout.splitlines()[-1])


def _load_child(kernel: str, reps: int, paths: list[str]) -> None:
    cu = ctypes.CDLL("libcuda.so.1")

    def ok(r: int, what: str) -> None:
        if r:
            raise SystemExit(f"{what}: CUDA error {r}")

    ok(cu.cuInit(0), "cuInit")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    ok(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    out = []
    for path in paths:
        image = Path(path).read_bytes() + b"\0"
        times = []
        for _ in range(reps):
            mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
            t = time.perf_counter()
            ok(cu.cuModuleLoadData(ctypes.byref(mod), image), f"cuModuleLoadData {path}")
            ok(cu.cuModuleGetFunction(ctypes.byref(fn), mod, kernel.encode()), "cuModuleGetFunction")
            times.append((time.perf_counter() - t) * 1e3)
            ok(cu.cuModuleUnload(mod), "cuModuleUnload")
        out.append(times)
    print(json.dumps(out))


def measure(work: Path) -> dict:
    """The JIT cost of big_unrolled with each of the suite's probes; see the module docstring."""
    from egpu_preload.runtime.probes import load_probe
    from egpu_preload.translate.rewrite import instrument

    ptx_path = work / "big_unrolled.ptx"
    subprocess.run(["nvcc", "-ptx", "-arch=sm_90", str(KERNEL), "-o", str(ptx_path)], check=True)
    text = ptx_path.read_text()
    (kernel, insns), = kernel_instructions(text).items()
    rows, files = [], [ptx_path]
    for source in PROBES:
        obj = probe_object(source, prebuilt_dir(), work)
        t = time.perf_counter()
        probe = load_probe(obj)
        translate_ms = (time.perf_counter() - t) * 1e3
        t = time.perf_counter()
        res = instrument(text, list(probe.specs))
        rewrite_ms = (time.perf_counter() - t) * 1e3
        out = work / f"big_unrolled.{Path(source).name}.ptx"
        out.write_text(res.text)
        files.append(out)
        rows.append({"probe": Path(source).name, "translate_ms": translate_ms, "rewrite_ms": rewrite_ms,
                     "instructions_after": sum(kernel_instructions(res.text).values())})
    loads = driver_load_ms(files, kernel, REPS)
    original = statistics.median(loads[0])
    for row, times in zip(rows, loads[1:]):
        row["driver_ms"] = statistics.median(times)
        row["driver_runs_ms"] = times
        row["total_ms"] = row["translate_ms"] + row["rewrite_ms"] + row["driver_ms"]
    return {"kernel": kernel, "instructions": insns, "driver_original_ms": original,
            "driver_original_runs_ms": loads[0], "probes": rows, "goal_ms": GOAL_MS}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--load":
        _load_child(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
        return
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory() as tmp:
        doc = measure(Path(tmp))
    for row in doc["probes"]:
        print(f"{row['probe']:>12}: translate {row['translate_ms']:7.1f} ms  rewrite {row['rewrite_ms']:7.1f} ms  "
              f"driver {row['driver_ms']:7.1f} ms (original {doc['driver_original_ms']:.1f})  "
              f"total {row['total_ms']:7.1f} ms")
    Path(sys.argv[1]).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
