"""A torch.compile'd function (`python3 torch_compile.py K N`): inductor generates a Triton kernel,
compiles it with Triton's ptxas (egpu-ptxas under egpu-run) and loads the cubin; the output must stay
the same."""

import hashlib
import sys

import torch


@torch.compile
def f(x, y):
    return torch.sin(x) * 2.0 + y


k, n = int(sys.argv[1]), int(sys.argv[2])
x = torch.arange(n, device="cuda", dtype=torch.float32)
y = torch.ones(n, device="cuda", dtype=torch.float32)
for _ in range(k):
    out = f(x, y)
torch.cuda.synchronize()
print("torch.compile launches", k, "digest", hashlib.sha256(out.cpu().numpy().tobytes()).hexdigest())
