"""Two stock PyTorch eager kernels with a known access pattern (SASS only: the wheels ship no PTX), for
the SASS back end's memory counter: x + y loads 8 and stores 4 bytes per element, a strided copy loads
and stores 4. Prints EXPECT lines with those totals and HASH lines of the results."""
import hashlib

import torch

n = (1 << 20) + 3
g = torch.Generator(device="cpu").manual_seed(0)
x = torch.randn(n, generator=g).to("cuda")   # host-to-device copies: no kernel
y = torch.randn(n, generator=g).to("cuda")
z = torch.empty((n + 1) // 2, device="cuda")
s = x + y
z.copy_(x[::2])   # strided: an ATen copy kernel (a contiguous copy_ is a cudaMemcpy)
torch.cuda.synchronize()
print(f"EXPECT ldbytes={8 * n} stbytes={4 * n}")
print(f"EXPECT ldbytes={4 * z.numel()} stbytes={4 * z.numel()}")
for name, t in (("add", s), ("copy", z)):
    print(f"HASH {name}={hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest()[:16]}")
