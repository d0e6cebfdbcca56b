"""Capture real PTX from Triton, numba and CuPy/NVRTC into a directory, for tests/fixtures/ptx/.

Run on the GPU machine: ``python3 scripts/capture_ptx.py OUTDIR [FRAMEWORK...]`` (all of them when none
is named; numba needs no GPU). Each framework is tried on its own; a missing or broken one is reported
and skipped. Every captured file is checked to start a PTX module
and to round-trip through egpu's parser. Prints one line per capture and a summary.
"""

from __future__ import annotations

import glob
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def triton_ptx() -> dict[str, str]:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask=mask)

    @triton.jit
    def softmax_kernel(out, inp, stride, ncols, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        x = tl.load(inp + row * stride + cols, mask=cols < ncols, other=-float("inf"))
        x = x - tl.max(x, axis=0)
        e = tl.exp(x)
        tl.store(out + row * stride + cols, e / tl.sum(e, axis=0), mask=cols < ncols)

    @triton.jit
    def matmul_kernel(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        pm, pn = tl.program_id(0), tl.program_id(1)
        rm = pm * BM + tl.arange(0, BM)
        rn = pn * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K, BK):
            x = tl.load(a + rm[:, None] * K + (k + rk)[None, :])
            y = tl.load(b + (k + rk)[:, None] * N + rn[None, :])
            acc += tl.dot(x, y)
        tl.store(c + rm[:, None] * N + rn[None, :], acc)

    out = {}
    x = torch.rand(4096, device="cuda")
    k = add_kernel[(4,)](x, x, torch.empty_like(x), 4096, BLOCK=1024)
    out["triton_add"] = k.asm["ptx"]
    m = torch.rand(64, 100, device="cuda")
    k = softmax_kernel[(64,)](torch.empty_like(m), m, 100, 100, BLOCK=128)
    out["triton_softmax"] = k.asm["ptx"]
    a = torch.rand(128, 128, device="cuda", dtype=torch.float16)
    k = matmul_kernel[(2, 2)](a, a, torch.empty(128, 128, device="cuda"), 128, 128, 128, BM=64, BN=64, BK=32)
    out["triton_matmul"] = k.asm["ptx"]
    return out


def numba_ptx() -> dict[str, str]:
    """numba-cuda's PTX for cc 9.0: compile_ptx needs libNVVM (found under CUDA_HOME or on the library
    path) and NVRTC (for its list of archs), not a GPU, so this one runs on CI machines too."""
    from importlib.metadata import version

    from numba import cuda, float32, int32
    from numba.cuda.cuda_paths import get_cuda_paths
    from numba.cuda.cudadrv.nvvm import NVVM

    def saxpy(a, x, y, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = a * x[i] + y[i]

    def block_sum(x, out):
        s = cuda.shared.array(128, float32)
        t = cuda.threadIdx.x
        i = cuda.grid(1)
        s[t] = x[i] if i < x.size else 0
        cuda.syncthreads()
        w = 64
        while w > 0:
            if t < w:
                s[t] += s[t + w]
            cuda.syncthreads()
            w //= 2
        if t == 0:
            cuda.atomic.add(out, 0, s[0])

    def histogram(x, lo, hi, bins):
        for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
            b = int32((x[i] - lo) / (hi - lo) * bins.size)
            if 0 <= b < bins.size:
                cuda.atomic.add(bins, b, 1)

    kernels = {"numba_saxpy": (saxpy, (float32, float32[:], float32[:], float32[:])),
               "numba_block_sum": (block_sum, (float32[:], float32[:])),
               "numba_histogram": (histogram, (float32[:], float32, float32, int32[:]))}
    nvvm = "libNVVM {}.{} ({})".format(*NVVM().get_version(), get_cuda_paths()["nvvm"].info)
    out = {}
    for stem, (fn, sig) in kernels.items():
        ptx, _ = cuda.compile_ptx(fn, sig, cc=(9, 0))
        out[stem] = (f"// numba-cuda {version('numba-cuda')}, numba {version('numba')}, {nvvm}: "
                     f"cuda.compile_ptx({fn.__name__}, cc=(9, 0)) by `scripts/capture_ptx.py OUTDIR numba`\n{ptx}")
    return out


CUPY_SRC = r"""
extern "C" __global__ void cupy_scale(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
"""


def cupy_ptx() -> dict[str, str]:
    """CuPy's own kernels (elementwise, reduction) as PTX via CUPY_COMPILE_WITH_PTX, from its cache
    directory, and a RawKernel source compiled by NVRTC."""
    cache = tempfile.mkdtemp(prefix="cupy-cache-")
    os.environ["CUPY_COMPILE_WITH_PTX"] = "1"
    os.environ["CUPY_CACHE_DIR"] = cache
    import cupy

    x = cupy.arange(4096, dtype=cupy.float32)
    cupy.ElementwiseKernel("float32 x, float32 y", "float32 z", "z = x * y + 1", "egpu_fma")(x, x)
    (x * 2).sum()
    cupy.RawKernel(CUPY_SRC, "cupy_scale")((4,), (1024,), (x, cupy.empty_like(x), cupy.float32(2), cupy.int32(4096)))
    cupy.cuda.Device().synchronize()
    out = {}
    for n, path in enumerate(sorted(glob.glob(os.path.join(cache, "**", "*"), recursive=True))):
        if os.path.isfile(path):
            data = open(path, "rb").read()
            start = data.find(b".version")
            if start >= 0:
                end = data.find(b"\0", start)
                out[f"cupy_{n}"] = data[start:end if end > 0 else len(data)].decode()
    return out


def nvrtc_ptx() -> dict[str, str]:
    from cuda.bindings import nvrtc

    def ok(result):
        err, *rest = result
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"nvrtc: {err}")
        return rest[0] if rest else None

    prog = ok(nvrtc.nvrtcCreateProgram(CUPY_SRC.encode(), b"scale.cu", 0, [], []))
    ok(nvrtc.nvrtcCompileProgram(prog, 2, [b"--gpu-architecture=compute_90", b"-lineinfo"]))
    size = ok(nvrtc.nvrtcGetPTXSize(prog))
    buf = b" " * size
    ok(nvrtc.nvrtcGetPTX(prog, buf))
    return {"nvrtc_scale": buf.rstrip(b"\0").decode()}


FRAMEWORKS: dict[str, Callable[[], dict[str, str]]] = {
    "triton": triton_ptx, "numba": numba_ptx, "cupy": cupy_ptx, "nvrtc": nvrtc_ptx}


def main(outdir: Path, names: list[str]) -> int:
    from egpu_preload.translate import ptx

    outdir.mkdir(parents=True, exist_ok=True)
    captured = []
    for name in names:
        capture = FRAMEWORKS[name]
        try:
            texts = capture()
        except Exception as e:  # each framework on its own: report and go on
            print(f"{name}: not captured: {type(e).__name__}: {e}")
            traceback.print_exc(limit=2)
            continue
        for stem, text in texts.items():
            if not text.lstrip().startswith(("//", ".version")):
                print(f"{name}: {stem}: not PTX, skipped")
                continue
            roundtrip = ptx.parse(text).render([]) == text
            (outdir / f"{stem}.ptx").write_text(text)
            captured.append(stem)
            print(f"{name}: {stem}.ptx {len(text.splitlines())} lines, round-trip {'ok' if roundtrip else 'FAILED'}")
    print(f"captured {len(captured)}: {' '.join(captured)}")
    return 0 if captured else 1


if __name__ == "__main__":
    if len(sys.argv) < 2 or not set(sys.argv[2:]) <= FRAMEWORKS.keys():
        print(f"usage: capture_ptx.py OUTDIR [{'|'.join(FRAMEWORKS)}]...", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(Path(sys.argv[1]), sys.argv[2:] or list(FRAMEWORKS)))
