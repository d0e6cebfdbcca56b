"""Stock PyTorch eager (`python3 torch_eager.py K`): cuBLAS and PyTorch's own kernels, all SASS only."""

import sys

import torch

k = int(sys.argv[1])
a = torch.randn(512, 512, device="cuda")
for _ in range(k):
    a = torch.relu(a @ a) / 512.0
torch.cuda.synchronize()
print("torch eager launches", k, "sum", float(a.sum()))
