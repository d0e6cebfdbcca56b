"""cuda-python driver calls behind execute_on_gpu and the probe runner: one context on device 0,
modules from PTX, device memory, launches. Every CUresult is checked; a failure is an EgpuError naming
the call and the CUDA error."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence

from ..errors import EgpuError

PARAM_TYPES = {"u64": ctypes.c_uint64, "u32": ctypes.c_uint32}


class GpuError(EgpuError):
    """A CUDA driver call failed."""


def _driver():
    from cuda.bindings import driver  # imported on first use: no CUDA work at import
    return driver


def check(ret, what: str):
    """Unpack a cuda-python result tuple ``(CUresult, *values)``; raise GpuError unless CUDA_SUCCESS."""
    d = _driver()
    err, *rest = ret if isinstance(ret, tuple) else (ret,)
    if err != d.CUresult.CUDA_SUCCESS:
        e2, name = d.cuGetErrorName(err)
        label = name.decode() if e2 == d.CUresult.CUDA_SUCCESS and name else str(err)
        raise GpuError(f"{what} failed: {label}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


def pack_params(args: Sequence[tuple[str, int]]) -> tuple[list, int]:
    """Kernel parameters for cuLaunchKernel: ``[("u64", ptr), ("u32", n)]`` -> (objects to keep alive
    until the launch returns, the address of the void*[] array pointing at each value)."""
    values = [PARAM_TYPES[kind](v) for kind, v in args]
    array = (ctypes.c_void_p * max(len(values), 1))(*[ctypes.addressof(v) for v in values])
    return [values, array], ctypes.addressof(array)


class Gpu:
    """Device 0's primary context, made current on the calling thread."""

    def __init__(self, ordinal: int = 0) -> None:
        d = _driver()
        check(d.cuInit(0), "cuInit")
        self.device = check(d.cuDeviceGet(ordinal), "cuDeviceGet")
        self.context = check(d.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
        self.make_current()
        attr = d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
        self.sm_count = check(d.cuDeviceGetAttribute(attr, self.device), "cuDeviceGetAttribute")
        self._nsmid: int | None = None

    def make_current(self) -> None:
        check(_driver().cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    # ---- modules and launches ------------------------------------------------------------------
    def load(self, ptx: str):
        """A CUmodule JIT-compiled by the driver from PTX text."""
        self.make_current()
        return check(_driver().cuModuleLoadData(ptx.encode() + b"\0"), "cuModuleLoadData")

    def unload(self, module) -> None:
        check(_driver().cuModuleUnload(module), "cuModuleUnload")

    def function(self, module, name: str):
        return check(_driver().cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name})")

    def global_address(self, module, name: str) -> tuple[int, int]:
        ptr, size = check(_driver().cuModuleGetGlobal(module, name.encode()), f"cuModuleGetGlobal({name})")
        return int(ptr), int(size)

    def launch(self, func, threads: int, args: Sequence[tuple[str, int]], block: int = 256) -> None:
        """Launch ``threads`` threads (1-D) and wait for them."""
        block = max(1, min(block, threads))
        self.launch_grid(func, ((threads + block - 1) // block, 1, 1), (block, 1, 1), args)

    def launch_grid(self, func, grid: Sequence[int], block: Sequence[int], args: Sequence[tuple[str, int]]) -> None:
        """Launch ``grid`` (x, y, z) blocks of ``block`` (x, y, z) threads and wait for them."""
        keep, params = pack_params(args)
        check(_driver().cuLaunchKernel(func, *grid, *block, 0, 0, params, 0), "cuLaunchKernel")
        self.sync()
        del keep

    def sync(self) -> None:
        check(_driver().cuCtxSynchronize(), "cuCtxSynchronize (kernel execution)")

    # ---- memory ----------------------------------------------------------------------------------
    def alloc(self, size: int) -> int:
        return int(check(_driver().cuMemAlloc(max(size, 8)), "cuMemAlloc"))

    def free(self, ptr: int) -> None:
        check(_driver().cuMemFree(ptr), "cuMemFree")

    def htod(self, ptr: int, data: bytes) -> None:
        if data:
            buf = ctypes.create_string_buffer(bytes(data), len(data))
            check(_driver().cuMemcpyHtoD(ptr, ctypes.addressof(buf), len(data)), "cuMemcpyHtoD")

    def dtoh(self, ptr: int, size: int) -> bytes:
        if size == 0:
            return b""
        buf = ctypes.create_string_buffer(size)
        check(_driver().cuMemcpyDtoH(ctypes.addressof(buf), ptr, size), "cuMemcpyDtoH")
        return buf.raw

    def nsmid(self) -> int:
        """%nsmid: how many SM ids %smid ranges over (may exceed the SM count); measured once."""
        if self._nsmid is None:
            ptx = (".version 6.3\n.target sm_70\n.address_size 64\n"
                   ".visible .entry egpu_nsmid(.param .u64 out)\n{\n\t.reg .b32 %n;\n\t.reg .b64 %o;\n"
                   "\tmov.u32 %n, %nsmid;\n\tld.param.u64 %o, [out];\n\tst.global.u32 [%o], %n;\n\tret;\n}\n")
            module = self.load(ptx)
            out = self.alloc(4)
            try:
                self.launch(self.function(module, "egpu_nsmid"), 1, [("u64", out)])
                self._nsmid = max(int.from_bytes(self.dtoh(out, 4), "little"), self.sm_count)
            finally:
                self.free(out)
                self.unload(module)
        return self._nsmid


@functools.cache
def gpu() -> Gpu:
    """The process's Gpu, created on first use."""
    return Gpu()
