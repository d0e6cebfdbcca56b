"""The suite's framework workloads (bench/suite.py): ``frameworks.py WORKLOAD REPS BUDGET_S [--profile]``.

- torch_eager: a training step of a small CNN (two convolutions, pooling, two linear layers, cross
  entropy, SGD) in stock PyTorch: cuDNN, cuBLAS and PyTorch's own kernels, SASS only.
- torch_compile: an inference step of a residual MLP block (linear, GELU, linear, LayerNorm) compiled
  by torch.compile: Triton kernels (PTX through Triton's ptxas) beside cuBLAS's.
- cupy: a CuPy RawKernel (y = 2.5 x + 1 over 16 Mi floats) launched 1,000 times.

Same protocol as kernels.cu: one warm-up repetition (compilation, module loads), then REPS timed ones,
fewer once BUDGET_S seconds of timed work are used up (at least 3); a repetition is host time from its
first launch to a synchronize after its last. Prints "BENCH_WARMUP ms", "BENCH_REP ms" per repetition
as it ends, then "BENCH_DONE digest" of a result that does not depend on how many repetitions ran.
``--profile`` runs the warm-up and the timed repetitions inside torch.profiler (CPU and CUDA
activities, i.e. CUPTI), the trace never exported: what tracing the same step with PyTorch's own
profiler costs.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import time
from collections.abc import Callable


def torch_eager() -> tuple[Callable[[], None], Callable[[], str]]:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
        torch.nn.Linear(64 * 16 * 16, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 3, 32, 32, device="cuda")
    y = torch.randint(0, 10, (64,), device="cuda")
    losses: list[float] = []

    def rep() -> None:
        for _ in range(40):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        torch.cuda.synchronize()
        if not losses:  # the warm-up's: the same whatever the number of repetitions
            losses.append(float(loss))

    return rep, lambda: f"{losses[0]:.6g}"


def torch_compile() -> tuple[Callable[[], None], Callable[[], str]]:
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
    out: list[torch.Tensor] = []

    def rep() -> None:
        with torch.no_grad():
            for _ in range(250):
                y = block(x)
        torch.cuda.synchronize()
        if not out:
            out.append(y)

    return rep, lambda: hashlib.sha256(out[0].cpu().numpy().tobytes()).hexdigest()[:16]


def cupy() -> tuple[Callable[[], None], Callable[[], str]]:
    import cupy as cp

    kernel = cp.RawKernel(r"""
    extern "C" __global__ void scale(const float *x, float *y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = 2.5f * x[i] + 1.0f;
    }""", "scale")
    n = 1 << 24
    x = cp.arange(n, dtype=cp.float32) * cp.float32(1e-3)
    y = cp.empty_like(x)

    def rep() -> None:
        for _ in range(1000):
            kernel(((n + 255) // 256,), (256,), (x, y, cp.int32(n)))
        cp.cuda.Device().synchronize()

    return rep, lambda: hashlib.sha256(y.get().tobytes()).hexdigest()[:16]


WORKLOADS = {"torch_eager": torch_eager, "torch_compile": torch_compile, "cupy": cupy}


def profiled() -> contextlib.AbstractContextManager:
    from torch.profiler import ProfilerActivity, profile
    return profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workload", choices=sorted(WORKLOADS))
    ap.add_argument("reps", type=int)
    ap.add_argument("budget_s", type=float)
    ap.add_argument("--profile", action="store_true", help="inside torch.profiler (CUPTI)")
    args = ap.parse_args()
    rep, digest = WORKLOADS[args.workload]()
    with profiled() if args.profile else contextlib.nullcontext():
        t = time.perf_counter()
        rep()
        print(f"BENCH_WARMUP {(time.perf_counter() - t) * 1e3:.3f}", flush=True)
        used = 0.0
        for r in range(args.reps):
            if r >= 3 and used >= args.budget_s:
                break
            t = time.perf_counter()
            rep()
            dt = time.perf_counter() - t
            used += dt
            print(f"BENCH_REP {dt * 1e3:.3f}", flush=True)
    print(f"BENCH_DONE {digest()}", flush=True)


if __name__ == "__main__":
    main()
