"""Stock PyTorch sorting short int rows (`python3 torch_sort.py [ROWS]`): rows of 16 int32 keys, sorted
with their indices, take ATen's bitonicSortKVInPlace<-2, -1, 16, 16, int, long, LTOp<int, true>, unsigned>,
the kernel bpftime's pytorch-test probe names (SASS only in PyTorch's wheels). Checked against the CPU."""

import sys

import torch

rows = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
keys = torch.randint(-1000, 1000, (rows, 16), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
values, indices = torch.sort(keys.cuda(), dim=-1)
torch.cuda.synchronize()
want_values, _ = torch.sort(keys, dim=-1, stable=True)
ok = torch.equal(values.cpu(), want_values) and torch.equal(keys.gather(1, indices.cpu()), want_values)
print(f"torch_sort: {rows} rows of 16 sorted {'OK' if ok else 'WRONG'}")
sys.exit(0 if ok else 1)
