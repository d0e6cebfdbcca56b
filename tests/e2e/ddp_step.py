"""A tiny deterministic DDP training run for torchrun (`torchrun --standalone --nproc_per_node=2 ddp_step.py
OUT [PAUSE]`): gloo, every rank on cuda:0, model and data on the GPU, STEPS SGD steps. Each rank writes
OUT/rank<R>.json: its losses, its final weights, and the CUDA kernels torch.profiler saw it launch (the
whole run, from before the first CUDA call to after the last). With PAUSE, each rank writes
OUT/paused<R> after the first step and waits (at most 60 s) for the file PAUSE: the moment a test attaches
or swaps probes mid-run."""

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS; read at handle creation

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

STEPS = 4


def kernels(trace: Path) -> list[str]:
    """The GPU kernels of a Chrome trace torch.profiler exported, in launch order."""
    events = json.loads(trace.read_text())["traceEvents"]
    return [e["name"] for e in sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])]


def main() -> None:
    out = Path(sys.argv[1])
    pause = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.use_deterministic_algorithms(True)
    prof = profile(activities=[ProfilerActivity.CUDA])
    prof.start()
    torch.manual_seed(0)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    dev = torch.device("cuda:0")
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(dev),
                device_ids=[0])
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator(device=dev).manual_seed(100 + rank)  # each rank its own data
    x = torch.randn(128, 32, device=dev, generator=gen)
    y = torch.randn(128, 1, device=dev, generator=gen)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step == 0 and pause is not None:
            (out / f"paused{rank}").touch()
            deadline = time.monotonic() + 60
            while not pause.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
    weights = [p.detach().cpu().flatten().tolist() for p in model.parameters()]
    torch.cuda.synchronize()
    prof.stop()
    trace = out / f"trace{rank}.json"
    prof.export_chrome_trace(str(trace))
    (out / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "losses": losses, "weights": weights,
                                                      "kernels": kernels(trace)}))
    dist.destroy_process_group()
    print(f"rank {rank} losses {losses}", flush=True)


if __name__ == "__main__":
    main()
