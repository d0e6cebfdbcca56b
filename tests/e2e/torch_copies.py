"""PyTorch's own copies: .to("cuda") of a pageable and of a pinned tensor, .cpu() of a device one.
Prints EXPECT lines (direction, bytes, count) for tests/test_hostapi_gpu.py."""
import torch

n = (1 << 20) + 5
x = torch.arange(n, dtype=torch.float32)
d = x.to("cuda")                                   # pageable host -> device
p = torch.arange(n, dtype=torch.float32).pin_memory()
e = p.to("cuda", non_blocking=True)                # pinned host -> device, async
back = (d + e).cpu()                               # device -> pageable host
torch.cuda.synchronize()
assert back[7].item() == 14.0
print(f"EXPECT H2D {4 * n} 2")
print(f"EXPECT D2H {4 * n} 1")
