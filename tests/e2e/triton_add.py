"""A Triton kernel (`python3 triton_add.py K N`): Triton hands the driver a cubin, so under egpu-run its
kernels are SASS only until Triton's ptxas is wrapped; the output must stay the same."""

import hashlib
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 3.0 * tl.load(y_ptr + offs, mask=mask), mask=mask)


k, n = int(sys.argv[1]), int(sys.argv[2])
x = torch.arange(n, device="cuda", dtype=torch.float32)
y = torch.ones(n, device="cuda", dtype=torch.float32)
out = torch.empty_like(x)
for _ in range(k):
    add[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
torch.cuda.synchronize()
print("triton add launches", k, "digest", hashlib.sha256(out.cpu().numpy().tobytes()).hexdigest())
