"""numba.cuda: scale(x, y) launched K times over N threads (`python3 numba_scale.py K N`, N a multiple of
256); prints a digest of the result. Numba compiles to PTX and links it with the driver (cuLink*), or
with nvJitLink where numba-cuda has it: egpu sees the PTX link inputs, or else a cubin for the SASS back
end."""

import hashlib
import sys

import numpy as np
from numba import cuda


@cuda.jit
def scale(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = np.float32(2.5) * x[i] + np.float32(1.0)


k, n = int(sys.argv[1]), int(sys.argv[2])
x = cuda.to_device(np.arange(n, dtype=np.float32))
y = cuda.device_array_like(x)
for _ in range(k):
    scale[n // 256, 256](x, y)
cuda.synchronize()
print("numba scale launches", k, "threads", n, "digest", hashlib.sha256(y.copy_to_host().tobytes()).hexdigest())
