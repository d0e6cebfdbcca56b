"""CuPy RawKernel: scale(x, y, n) launched K times over N threads (`python3 cupy_scale.py K N`); prints
a digest of the result. With CUPY_COMPILE_WITH_PTX=1 (egpu-run sets it) CuPy hands the driver PTX."""

import hashlib
import sys

import cupy as cp

SRC = r"""
extern "C" __global__ void scale(const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.5f * x[i] + 1.0f;
}
"""

k, n = int(sys.argv[1]), int(sys.argv[2])
kernel = cp.RawKernel(SRC, "scale")
x = cp.arange(n, dtype=cp.float32)
y = cp.empty_like(x)
for _ in range(k):
    kernel(((n + 255) // 256,), (256,), (x, y, cp.int32(n)))
cp.cuda.Device().synchronize()
print("cupy scale launches", k, "threads", n, "digest", hashlib.sha256(y.get().tobytes()).hexdigest())
