"""On the GPU: each corpus kernel run as compiled and as instrumented (counting probes in all three
scopes) must leave bit-identical memory, and the counts must be those its access pattern implies.

Run by the lead: ``python3 -m pytest -m gpu tests/test_rewrite_gpu.py`` (nvcc and a GPU needed).
Counts are per scope from ``ptx_corpus.stats_probe``: entry, exit, loads, stores, atomics, the sums of
load and store addresses, the bytes accessed, and the context's kernel id, launch id, args[0], nargs;
with the context passed both ways (in words, as translated probes take it, and by address).
"""

from __future__ import annotations

import ctypes
import random
import struct
from dataclasses import dataclass, field
from typing import Callable

import pytest

import ptx_corpus
from egpu_preload.bpf import ctx as C
from egpu_preload.translate.rewrite import instrument

pytestmark = pytest.mark.gpu
MASK = (1 << 64) - 1
LAUNCH_ID = 7
SLOTS = ("entry", "exit", "mem", "loads", "stores", "load_addr", "store_addr", "bytes", "launch_id",
         "kernel_id", "arg0", "nargs", "atomics")


@dataclass
class Case:
    """One kernel run. ``buffers`` are the initial device buffers; ``args`` reference them as
    ("buf", i) or give scalars as ("i32"|"u32"|"f32", v); ``expect(ptrs, bufs)`` gives thread-scope
    counts (a subset of SLOTS; loads/stores/atomics/addr sums exact)."""

    module: str
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    buffers: list[bytes]
    args: list[tuple[str, object]]
    expect: Callable[[list[int], list[bytes]], dict[str, int]]
    constants: dict[str, bytes] = field(default_factory=dict)

    @property
    def threads(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2] * self.block[0] * self.block[1] * self.block[2]

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]


def _f32(values) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def _i32(values) -> bytes:
    return struct.pack(f"<{len(values)}i", *values)


def _ints(n: int, lo: int, hi: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(lo, hi) for _ in range(n)]


def _mem(loads=(), stores=(), atomics=()) -> dict[str, int]:
    """Counts from lists of (address, size): an atomic is a load and a store as well."""
    lds, sts = list(loads) + list(atomics), list(stores) + list(atomics)
    return {"loads": len(lds), "stores": len(sts), "atomics": len(atomics),
            "load_addr": sum(a for a, _ in lds) & MASK, "store_addr": sum(a for a, _ in sts) & MASK,
            "bytes": sum(s for _, s in list(loads) + list(stores) + list(atomics))}


N = 1000
IN_I = _ints(N, -3, 9, 1)


def _cases() -> list[Case]:
    small = [float(v) for v in _ints(4096, 0, 7, 2)]
    return [
        Case("vector_add.sm_90", "vector_add", (8, 1, 1), (128, 1, 1),
             [_f32(small[:N]), _f32(small[N:2 * N]), bytes(4 * N)],
             [("buf", 0), ("buf", 1), ("buf", 2), ("i32", N)],
             lambda p, b: _mem(loads=[(p[0] + 4 * i, 4) for i in range(N)] + [(p[1] + 4 * i, 4) for i in range(N)],
                               stores=[(p[2] + 4 * i, 4) for i in range(N)])),
        Case("stencil.sm_90", "stencil3", (8, 1, 1), (128, 1, 1), [_f32(small[:N]), bytes(4 * N)],
             [("buf", 0), ("buf", 1), ("i32", N)],
             lambda p, b: _mem(loads=[(p[0] + 4 * j, 4) for i in range(1, N - 1) for j in (i - 1, i, i + 1)],
                               stores=[(p[1] + 4 * i, 4) for i in range(1, N - 1)])),
        Case("reduction.sm_90", "reduce_sum", (9, 1, 1), (256, 1, 1), [_f32(small[:2148]), bytes(4)],
             [("buf", 0), ("buf", 1), ("i32", 2148)],
             lambda p, b: _mem(loads=[(p[0] + 4 * i, 4) for i in range(2148)], atomics=[(p[1], 4)] * 9)),
        Case("gemm_tiled.sm_90", "gemm_tiled", (2, 2, 1), (16, 16, 1),
             [_f32(small[:1024]), _f32(small[1024:2048]), bytes(4096)],
             [("buf", 0), ("buf", 1), ("buf", 2), ("i32", 32)], lambda p, b: _gemm(p)),
        Case("atomics.sm_90", "histogram", (8, 1, 1), (128, 1, 1),
             [_i32([v & 0xFFFF for v in _ints(N, 0, 1 << 20, 3)]), bytes(64), bytes(8)],
             [("buf", 0), ("buf", 1), ("i32", 16), ("i32", N), ("buf", 2)], _histogram),
        Case("coop_groups.sm_90", "cg_tile_sum", (8, 1, 1), (128, 1, 1), [_i32(IN_I), bytes(4 * 32)],
             [("buf", 0), ("buf", 1), ("i32", N)],
             lambda p, b: _mem(loads=[(p[0] + 4 * i, 4) for i in range(N)],
                               stores=[(p[1] + 4 * w, 4) for w in range(32)])),
        Case("coop_groups.sm_90", "cg_coalesced", (8, 1, 1), (128, 1, 1), [bytes(4 * N)],
             [("buf", 0), ("i32", N)],
             lambda p, b: _mem(stores=[(p[0] + 4 * i, 4) for i in range(N) if i % 3 == 0])),
        Case("templates.sm_90", "_Z5scaleIfLi1EEvPT_S0_i", (8, 1, 1), (128, 1, 1), [_f32(small[:N])],
             [("buf", 0), ("f32", 3.0), ("i32", N)],
             lambda p, b: _mem(loads=[(p[0] + 4 * i, 4) for i in range(N)],
                               stores=[(p[0] + 4 * i, 4) for i in range(N)])),
        Case("templates.sm_90", "_Z5scaleIhLi3EEvPT_S0_i", (8, 1, 1), (128, 1, 1), [bytes(range(250)) * 4],
             [("buf", 0), ("u32", 3), ("i32", N)],
             lambda p, b: _mem(loads=[(p[0] + i, 1) for i in range(N)], stores=[(p[0] + i, 1) for i in range(N)])),
        # The accesses are in __noinline__ functions, which are not sites: the kernel itself has none.
        Case("device_calls.sm_90", "device_calls", (8, 1, 1), (128, 1, 1), [_f32(small[:N]), bytes(4 * N)],
             [("buf", 0), ("buf", 1), ("i32", N)], lambda p, b: _mem()),
        Case("early_return.sm_90", "early_return", (8, 1, 1), (128, 1, 1), [_i32(IN_I), bytes(4 * N)],
             [("buf", 0), ("buf", 1), ("i32", N)],
             lambda p, b: _mem(loads=[(p[0] + 4 * i, 4) for i in range(N)],
                               stores=[(p[1] + 4 * i, 4) for i in range(N) if IN_I[i] != 0])),
        Case("predicated_store.sm_90", "predicated_store", (8, 1, 1), (128, 1, 1), [_i32(IN_I), bytes(4 * N)],
             [("buf", 0), ("buf", 1), ("i32", N)],
             lambda p, b: _mem(loads=[(p[0] + 4 * i, 4) for i in range(N)],
                               stores=[(p[1] + 4 * i, 4) for i in range(N) if IN_I[i] & 1])),
        Case("vector_loads.sm_90", "add_float4", (2, 1, 1), (128, 1, 1),
             [_f32(small[:N]), _f32(small[N:2 * N]), bytes(4 * N)],
             [("buf", 0), ("buf", 1), ("buf", 2), ("i32", N // 4)],
             lambda p, b: _mem(loads=[(p[k] + 16 * i, 16) for k in (0, 1) for i in range(N // 4)],
                               stores=[(p[2] + 16 * i, 16) for i in range(N // 4)])),
        Case("vector_loads.sm_90", "add_half2", (4, 1, 1), (128, 1, 1),
             [bytes(range(256)) * 8, bytes(range(255, -1, -1)) * 8, bytes(4 * 500)],
             [("buf", 0), ("buf", 1), ("buf", 2), ("i32", 500)],
             lambda p, b: _mem(loads=[(p[k] + 4 * i, 4) for k in (0, 1) for i in range(500)],
                               stores=[(p[2] + 4 * i, 4) for i in range(500)])),
        Case("cp_async.sm_90", "cp_async_copy", (2, 1, 1), (128, 1, 1), [_f32(small[:N]), bytes(4 * N)],
             [("buf", 0), ("buf", 1), ("i32", N // 4)],
             lambda p, b: _mem(loads=[(p[0] + 16 * i, 16) for i in range(N // 4)],
                               stores=[(p[1] + 16 * i, 16) for i in range(N // 4)])),
        Case("big_unrolled.sm_90", "big_unrolled", (4, 1, 1), (128, 1, 1), [_f32(small), bytes(4 * 4096)],
             [("buf", 0), ("buf", 1), ("i32", 4096)],
             lambda p, b: _mem(loads=[(p[0] + 4 * (8 * t + o + k), 4) for t in range(504)
                                      for o in range(8) for k in range(64)],
                               stores=[(p[1] + 4 * (8 * t + o), 4) for t in range(504) for o in range(8)]),
             constants={"coeff": _f32([float(k % 5) for k in range(64)])}),
        # setmaxnreg, in the kernel or in the .funcs it calls: the probes' bodies inlined at each site (rewrite.py)
        *[Case("warp_specialized.sm_90a", kernel, (8, 1, 1), (256, 1, 1), [_f32(small[:N]), bytes(8 * N)],
               [("buf", 0), ("buf", 1), ("i32", N)],
               lambda p, b: _mem(loads=[(p[0] + 4 * i, 4) for i in range(N)] * 2,
                                 stores=[(p[1] + 4 * i, 4) for i in range(2 * N)]))
          for kernel in ("warp_specialized", "warp_specialized_calls")],
    ]


class MemoryChanged(AssertionError):
    """The instrumented kernel left other memory than the original (its counts were right)."""


def _first_difference(got: list[bytes], want: list[bytes]) -> str:
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            at = next(k for k in range(min(len(g), len(w))) if g[k] != w[k])
            return f"buffer {i}, byte {at}: {g[at:at + 8].hex()} instead of {w[at:at + 8].hex()}"
    return "buffer sizes differ"


def _gemm(p: list[int]) -> dict[str, int]:
    n, loads, stores = 32, [], []
    for by in range(2):
        for bx in range(2):
            for ty in range(16):
                for tx in range(16):
                    row, col = by * 16 + ty, bx * 16 + tx
                    for k0 in range(0, n, 16):
                        loads += [(p[0] + 4 * (row * n + k0 + tx), 4), (p[1] + 4 * ((k0 + ty) * n + col), 4)]
                    stores.append((p[2] + 4 * (row * n + col), 4))
    return _mem(loads=loads, stores=stores)


def _histogram(p: list[int], bufs: list[bytes]) -> dict[str, int]:
    values = struct.unpack(f"<{N}i", bufs[0])
    return _mem(loads=[(p[0] + 4 * i, 4) for i in range(N)],
                atomics=[a for v in values for a in ((p[1] + 4 * (v % 16), 4), (p[2], 4), (p[2] + 4, 4))])


class Gpu:
    """The few driver calls these tests need (cuda-python's driver module)."""

    def __init__(self) -> None:
        from cuda.bindings import driver
        self.cu = driver
        self.ok(driver.cuInit(0))
        dev = self.ok(driver.cuDeviceGet(0))
        self.ctx = self.ok(driver.cuDevicePrimaryCtxRetain(dev))
        self.ok(driver.cuCtxSetCurrent(self.ctx))

    def ok(self, result):
        err, *rest = result if isinstance(result, tuple) else (result,)
        if err != self.cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"CUDA error {err}")
        return rest[0] if len(rest) == 1 else rest

    def load(self, ptx_text: str):
        return self.ok(self.cu.cuModuleLoadData(ptx_text.encode() + b"\0"))

    def global_(self, module, name: str) -> tuple[int, int]:
        ptr, size = self.ok(self.cu.cuModuleGetGlobal(module, name.encode()))
        return int(ptr), size

    def alloc(self, data: bytes) -> int:
        ptr = int(self.ok(self.cu.cuMemAlloc(max(len(data), 1))))
        self.ok(self.cu.cuMemcpyHtoD(ptr, data, len(data)))
        return ptr

    def read(self, ptr: int, size: int) -> bytes:
        out = bytearray(size)
        self.ok(self.cu.cuMemcpyDtoH(out, ptr, size))
        return bytes(out)

    def write(self, ptr: int, data: bytes) -> None:
        self.ok(self.cu.cuMemcpyHtoD(ptr, data, len(data)))

    def launch(self, module, case: Case, ptrs: list[int], launch_id: int | None) -> None:
        values = []
        for kind, v in case.args:
            if kind == "buf":
                values.append(ctypes.c_uint64(ptrs[v]))
            else:
                values.append({"i32": ctypes.c_int32, "u32": ctypes.c_uint32, "f32": ctypes.c_float}[kind](v))
        if launch_id is not None:   # the launch contract: a trailing u64 (rewrite.py)
            values.append(ctypes.c_uint64(launch_id))
        params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        fn = self.ok(self.cu.cuModuleGetFunction(module, case.kernel.encode()))
        self.ok(self.cu.cuLaunchKernel(fn, *case.grid, *case.block, 0, 0, ctypes.addressof(params), 0))
        self.ok(self.cu.cuCtxSynchronize())


@pytest.fixture(scope="module")
def gpu() -> Gpu:
    return Gpu()


def _run(gpu: Gpu, text: str, case: Case, launch_id: int | None):
    module = gpu.load(text)
    for name, data in case.constants.items():
        gpu.write(gpu.global_(module, name)[0], data)
    ptrs = [gpu.alloc(b) for b in case.buffers]
    gpu.launch(module, case, ptrs, launch_id)
    out = [gpu.read(p, len(b)) for p, b in zip(ptrs, case.buffers)]
    stats = {}
    if launch_id is not None:
        for scope in ptx_corpus.SCOPES:
            ptr, size = gpu.global_(module, f"__egpu_test_stats_{scope}")
            stats[scope] = dict(zip(SLOTS, struct.unpack("<16Q", gpu.read(ptr, size))))
    for p in ptrs:
        gpu.ok(gpu.cu.cuMemFree(p))
    gpu.ok(gpu.cu.cuModuleUnload(module))
    return ptrs, out, stats


@pytest.mark.parametrize("abi", ptx_corpus.ABIS)
@pytest.mark.parametrize("case", _cases(), ids=lambda c: c.kernel)
def test_instrumented_kernel_computes_the_same_and_counts_exactly(gpu, case, abi):
    text = ptx_corpus.build()[case.module]
    res = instrument(text, ptx_corpus.stats_probes(glob=case.kernel, abi=abi))
    assert res.status(case.kernel).status == "instrumented", res.kernels
    _, want, _ = _run(gpu, text, case, None)
    ptrs, got, stats = _run(gpu, res.text, case, LAUNCH_ID)
    warps = case.threads // 32
    t, w, b = stats["thread"], stats["warp"], stats["block"]
    assert (t["entry"], t["exit"]) == (case.threads, case.threads)
    assert (w["entry"], b["entry"], b["exit"]) == (warps, case.blocks, case.blocks)
    # Lanes may leave at different ret/exit instructions (or not reconverge before one): each group
    # that exits together elects a leader, so a warp counts at least once.
    assert warps <= w["exit"] <= case.threads
    expected = case.expect(ptrs, case.buffers)
    assert {k: t[k] for k in expected} == expected
    assert t["mem"] == t["loads"] + t["stores"] - t["atomics"]
    nparams = len(case.args)
    first = ptrs[case.args[0][1]] if case.args[0][0] == "buf" else None
    for s in (t, w, b):
        assert (s["launch_id"], s["kernel_id"], s["nargs"]) == (LAUNCH_ID, C.kernel_id(case.kernel), nparams)
        if first is not None:
            assert s["arg0"] == first
    # Each warp / block leader sees a subset of what all threads see.
    for k in ("loads", "stores", "atomics"):
        assert b[k] <= w[k] <= t[k]
    if got != want:
        raise MemoryChanged(f"instrumented kernel changed memory: {_first_difference(got, want)}")
