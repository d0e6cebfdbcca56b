"""What PyTorch's caching allocator does when it warms up, as fast as the host can: allocations of
many sizes that each reach cudaMalloc (PYTORCH_NO_CUDA_MEMORY_CACHING=1 is set by the caller, so every
free reaches cudaFree too). Prints one JSON line: ns per allocate + free pair, and the pairs made.

    python3 alloc_churn.py PAIRS"""
import json
import random
import sys
import time

import torch

pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
rng = random.Random(0)
sizes = [rng.choice((256, 4096, 65536, 1 << 20, 3 << 20)) + 512 * rng.randrange(64) for _ in range(pairs)]
torch.empty(1, device="cuda")   # the context, outside the timing
torch.cuda.synchronize()
t0 = time.perf_counter_ns()
live = []
for i, n in enumerate(sizes):
    live.append(torch.empty(n, dtype=torch.uint8, device="cuda"))
    if len(live) > 64:          # a working set of 64 tensors, freed oldest first
        live.pop(0)
live.clear()
torch.cuda.synchronize()
print(json.dumps({"mode": "churn", "pair_ns": (time.perf_counter_ns() - t0) / pairs, "pairs": pairs}))
