"""bpftime's pytorch-test program (`python3 torch_sort.py [N]`): stock PyTorch sorting N (default 10)
int32 keys on the GPU, the sort of a small 1-D tensor that runs ATen's
bitonicSortKVInPlace<-2, -1, 16, 16, int, long, LTOp<int, true>, unsigned> (SASS only in PyTorch's
wheels), the kernel bpftime's probe names. Checked against the CPU's sort."""

import sys

import torch

n = int(sys.argv[1]) if len(sys.argv) > 1 else 10
data = torch.randint(0, 1000, (n,), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
values, indices = torch.sort(data.cuda())
torch.cuda.synchronize()
want, _ = torch.sort(data, stable=True)
ok = torch.equal(values.cpu(), want) and torch.equal(data[indices.cpu()], want)
print(f"torch_sort: {n} keys sorted {'OK' if ok else 'WRONG'}")
sys.exit(0 if ok else 1)
