"""`python3 app_flip.py SCENARIO`: vecadd's CUfunction looked up (and set up) before a stream capture, launched
twice before it and twice after it (32 threads each), as an application caches its handles; prints its result.
SCENARIO: plain; shared (64 KiB of dynamic shared memory, allowed by cuFuncSetAttribute before the capture, as
cudaFuncSetAttribute allows it); shared-after (allowed after the capture, as a kernel first used then is);
shared-kernel (the PTX loaded as a library, its CUkernel allowed it by cuKernelSetAttribute and launched);
shared-function (the PTX loaded as a library, the function cuKernelGetFunction gives allowed it by
cuFuncSetAttribute and launched);
devices (a module loaded on device 0 first, where the maps go, then vecadd's loaded on device 1 and launched
there, as after cudaSetDevice(1)); enumerate (the handle from cuModuleEnumerateFunctions, which no hooked lookup
returns: the stand-in names the module's first kernel kernel_a); enumerate-library (the CUkernel from
cuLibraryEnumerateKernels, the PTX loaded as a library); state (the module keeps __device__ state that the
stand-in bumps at every launch by its __constant__ increment: the application sets the increment to 3 before the
capture, as cudaMemcpyToSymbol does, and reads the state back at the end: state=N); registers (the module loaded
with a JIT option, CU_JIT_MAX_REGISTERS 32, as an application does so that its blocks of 1024 threads fit)."""

import ctypes
import sys

PTX = (b".version 8.0\n.target sm_90\n.address_size 64\n\n%s"
       b".visible .entry %s(\n\t.param .u64 a,\n\t.param .u64 b,\n\t.param .u64 n\n)\n{\n\tret;\n}\n")
STATE = b".visible .global .u64 launches[1];\n.visible .const .u64 increment[1];\n\n"
MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
MAX_REGISTERS = 0   # CU_JIT_MAX_REGISTERS


def symbol(cuda: ctypes.CDLL, mod: ctypes.c_void_p, name: bytes, value: ctypes.c_uint64, write: bool) -> int:
    """A module variable written or read through its address, as cudaMemcpyToSymbol and cudaMemcpyFromSymbol do."""
    address, size = ctypes.c_uint64(), ctypes.c_size_t()
    r = cuda.cuModuleGetGlobal_v2(ctypes.byref(address), ctypes.byref(size), mod, name)
    if write:
        return r | cuda.cuMemcpyHtoD_v2(address, ctypes.byref(value), 8)
    return r | cuda.cuMemcpyDtoH_v2(ctypes.byref(value), address, 8)


def main() -> int:
    scenario = sys.argv[1]
    cuda = ctypes.CDLL("libcuda.so.1")
    mod, f, stream, graph = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    values = [ctypes.c_uint64(11), ctypes.c_uint64(22), ctypes.c_uint64(32), ctypes.c_uint64(0)]
    params = (ctypes.c_void_p * 4)(*[ctypes.addressof(v) for v in values])   # room for a launch id
    name = b"kernel_a" if scenario.startswith("enumerate") else b"vecadd"
    r = cuda.cuInit(0)
    if scenario == "devices":
        first, device1 = ctypes.c_void_p(), ctypes.c_void_p()
        r |= cuda.cuModuleLoadData(ctypes.byref(first), PTX % (b"", b"vecadd"))
        r |= cuda.cuDevicePrimaryCtxRetain(ctypes.byref(device1), 1) | cuda.cuCtxSetCurrent(device1)
    image = PTX % (STATE if scenario == "state" else b"", name)
    library = scenario in ("enumerate-library", "shared-kernel", "shared-function")
    if library:
        r |= cuda.cuLibraryLoadData(ctypes.byref(mod), image, None, None, 0, None, None, 0)
    elif scenario == "registers":   # compiled for at most 32 registers a thread (CU_JIT_MAX_REGISTERS)
        options, values = (ctypes.c_int * 1)(MAX_REGISTERS), (ctypes.c_void_p * 1)(32)
        r |= cuda.cuModuleLoadDataEx(ctypes.byref(mod), image, 1, options, values)
    else:
        r |= cuda.cuModuleLoadData(ctypes.byref(mod), image)
    if scenario.startswith("enumerate"):
        found = (ctypes.c_void_p * 1)()
        r |= (cuda.cuLibraryEnumerateKernels if library else cuda.cuModuleEnumerateFunctions)(found, 1, mod)
        f = ctypes.c_void_p(found[0])
    elif library:
        r |= cuda.cuLibraryGetKernel(ctypes.byref(f), mod, name)
        if scenario == "shared-function":
            r |= cuda.cuKernelGetFunction(ctypes.byref(f), f)
    else:
        r |= cuda.cuModuleGetFunction(ctypes.byref(f), mod, name)
    shared = 64 * 1024 if scenario.startswith("shared") else 0
    if scenario in ("shared", "shared-function"):
        r |= cuda.cuFuncSetAttribute(f, MAX_DYNAMIC_SHARED_SIZE_BYTES, shared)
    if scenario == "shared-kernel":
        r |= cuda.cuKernelSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, shared, f, 0)
    if scenario == "state":
        r |= symbol(cuda, mod, b"increment", ctypes.c_uint64(3), write=True)
    for _ in range(2):
        r |= cuda.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0 if scenario == "shared-after" else shared, None, params,
                                 None)
    r |= cuda.cuStreamCreate(ctypes.byref(stream), 0) | cuda.cuStreamBeginCapture_v2(stream, 0)
    r |= cuda.cuStreamEndCapture(stream, ctypes.byref(graph))
    if scenario == "shared-after":
        r |= cuda.cuFuncSetAttribute(f, MAX_DYNAMIC_SHARED_SIZE_BYTES, shared)
    for _ in range(2):
        r |= cuda.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, shared, None, params, None)
    r |= cuda.cuCtxSynchronize()
    state = ctypes.c_uint64()
    if scenario == "state":
        r |= symbol(cuda, mod, b"launches", state, write=False)
    print(f"app_flip {scenario} result={r}" + (f" state={state.value}" if scenario == "state" else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
