"""The suite's framework workloads (bench/suite.py): ``frameworks.py WORKLOAD REPS BUDGET_S [--profile]``.

- torch_eager: a training step of a small CNN (two convolutions, pooling, two linear layers, cross
  entropy, SGD) in stock PyTorch: cuDNN, cuBLAS and PyTorch's own kernels, SASS only. Unit: one step.
- torch_gpu: a GPU-bound training step of a larger CNN (three convolutions over 64x64 images, batch 256),
  for bench/bench_sass.py (issue 17's probe costs are goals on a GPU-bound step). Unit: one step.
- torch_compile: an inference step of a residual MLP block (linear, GELU, linear, LayerNorm) compiled
  by torch.compile: Triton kernels (PTX through Triton's ptxas) beside cuBLAS's. Unit: one forward.
- cupy: a CuPy RawKernel (y = 2.5 x + 1 over 16 Mi floats). Unit: one launch.

The protocol of kernels.cu: a warm-up unit (compilation, module loads, the JIT), calibration (1, 2, 4, ...
units until they take 10 ms) sizing a repetition at TARGET_MS, then REPS repetitions, fewer once
BUDGET_S seconds of them are used up (at least 3), each timed from its first launch to a synchronize
after its last. Prints "BENCH_WARMUP ms", "BENCH_REP ms units" per repetition as it ends, "BENCH_UNITS n"
(every unit the process ran), then "BENCH_DONE digest" of the warm-up's result (the same in every mode).
``--profile`` runs everything inside torch.profiler (CPU and CUDA activities, i.e. CUPTI), the trace never exported:
what tracing the same step with PyTorch's own profiler costs. ``--count EVENT[,EVENT...]`` (instructions.py's:
instructions, task_clock) counts the first of them the machine gives over every thread the workload starts: it prints
"BENCH_COUNT_EVENT name" once and "BENCH_COUNT n" after each repetition's line (n: the event over that
repetition), or "BENCH_COUNT_UNAVAILABLE why" once when none can be counted.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import math
import time
from collections.abc import Callable

import instructions

Workload = tuple[Callable[[], None], Callable[[], None], Callable[[], str]]  # unit, synchronize, digest


def _training(model: "torch.nn.Module", x: "torch.Tensor", y: "torch.Tensor") -> Workload:
    """One SGD step of ``model`` on (x, y) with cross entropy; the digest is the warm-up's loss."""
    import torch
    import torch.nn.functional as F

    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    first: list[float] = []

    def step() -> None:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if not first:  # the warm-up's loss: the same whatever follows
            first.append(float(loss))

    return step, torch.cuda.synchronize, lambda: f"{first[0]:.6g}"


def torch_eager() -> Workload:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
        torch.nn.Linear(64 * 16 * 16, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).cuda()
    return _training(model, torch.randn(64, 3, 32, 32, device="cuda"), torch.randint(0, 10, (64,), device="cuda"))


def torch_gpu() -> Workload:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(64, 128, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(128, 128, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
        torch.nn.Linear(128 * 16 * 16, 10)).cuda()
    return _training(model, torch.randn(256, 3, 64, 64, device="cuda"),
                     torch.randint(0, 10, (256,), device="cuda"))


def torch_compile() -> Workload:
    import torch

    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up, self.down = torch.nn.Linear(256, 256), torch.nn.Linear(256, 256)
            self.norm = torch.nn.LayerNorm(256)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))

    block = torch.compile(Block().cuda().eval())
    x = torch.randn(16384, 256, device="cuda")
    first: list[torch.Tensor] = []

    def forward() -> None:
        with torch.no_grad():
            y = block(x)
        if not first:
            first.append(y)

    return forward, torch.cuda.synchronize, lambda: hashlib.sha256(first[0].cpu().numpy().tobytes()).hexdigest()[:16]


def cupy() -> Workload:
    import cupy as cp

    kernel = cp.RawKernel(r"""
    extern "C" __global__ void scale(const float *x, float *y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = 2.5f * x[i] + 1.0f;
    }""", "scale")
    n = 1 << 24
    x = cp.arange(n, dtype=cp.float32) * cp.float32(1e-3)
    y = cp.empty_like(x)
    args = (x, y, cp.int32(n))

    def launch() -> None:
        kernel(((n + 255) // 256,), (256,), args)

    return launch, cp.cuda.Device().synchronize, lambda: hashlib.sha256(y.get().tobytes()).hexdigest()[:16]


WORKLOADS = {"torch_eager": torch_eager, "torch_gpu": torch_gpu, "torch_compile": torch_compile, "cupy": cupy}


def profiled() -> contextlib.AbstractContextManager:
    from torch.profiler import ProfilerActivity, profile
    return profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])


def timed(unit: Callable[[], None], sync: Callable[[], None], units: int) -> float:
    """ms for ``units`` units, from the first launch to the synchronize after the last."""
    t = time.perf_counter()
    for _ in range(units):
        unit()
    sync()
    return (time.perf_counter() - t) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workload", choices=sorted(WORKLOADS))
    ap.add_argument("reps", type=int)
    ap.add_argument("budget_s", type=float)
    ap.add_argument("target_ms", type=float, nargs="?", default=100.0)
    ap.add_argument("--profile", action="store_true", help="inside torch.profiler (CUPTI)")
    ap.add_argument("--count", metavar="EVENT[,EVENT...]", help="the first of these events the machine gives, "
                    f"counted over each repetition ({', '.join(instructions.EVENTS)})")
    args = ap.parse_args()
    counter, refused = None, []
    for event in args.count.split(",") if args.count else []:
        try:   # before the workload starts its threads: only those started after are counted
            counter = instructions.Counter(event)
        except (OSError, KeyError) as e:
            refused.append(str(e) if isinstance(e, OSError) else f"no event {event}")
            continue
        print(f"BENCH_COUNT_EVENT {event}", flush=True)
        break
    if args.count and counter is None:
        print(f"BENCH_COUNT_UNAVAILABLE {'; '.join(refused)}", flush=True)
    unit, sync, digest = WORKLOADS[args.workload]()
    with profiled() if args.profile else contextlib.nullcontext():
        print(f"BENCH_WARMUP {timed(unit, sync, 1):.3f}", flush=True)
        k, total = 1, 1
        t = timed(unit, sync, k)
        while t < 10.0:
            total += k
            k *= 2
            t = timed(unit, sync, k)
        total += k
        units = max(1, math.ceil(args.target_ms / (t / k)))
        used = 0.0
        for r in range(args.reps):
            if r >= 3 and used >= args.budget_s * 1e3:
                break
            before = counter.read() if counter else 0
            ms = timed(unit, sync, units)
            used += ms
            total += units
            print(f"BENCH_REP {ms:.3f} {units}", flush=True)
            if counter:
                print(f"BENCH_COUNT {counter.read() - before}", flush=True)
    print(f"BENCH_UNITS {total}\nBENCH_DONE {digest()}", flush=True)


if __name__ == "__main__":
    main()
