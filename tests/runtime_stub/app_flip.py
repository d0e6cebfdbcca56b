"""`python3 app_flip.py SCENARIO`: vecadd's CUfunction looked up (and set up) before a stream capture, launched
twice before it and twice after it (32 threads each), as an application caches its handles; prints its result.
SCENARIO: plain; shared (64 KiB of dynamic shared memory, allowed by cuFuncSetAttribute before the capture, as
cudaFuncSetAttribute allows it); shared-after (allowed after the capture, as a kernel first used then is);
devices (a module loaded on device 0 first, where the maps go, then vecadd's loaded on device 1 and launched
there, as after cudaSetDevice(1)); enumerate (the handle from cuModuleEnumerateFunctions, which no hooked lookup
returns: the stand-in names the module's first kernel kernel_a)."""

import ctypes
import sys

PTX = (b".version 8.0\n.target sm_90\n.address_size 64\n\n"
       b".visible .entry %s(\n\t.param .u64 a,\n\t.param .u64 b,\n\t.param .u64 n\n)\n{\n\tret;\n}\n")
MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


def main() -> int:
    scenario = sys.argv[1]
    cuda = ctypes.CDLL("libcuda.so.1")
    mod, f, stream, graph = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    values = [ctypes.c_uint64(11), ctypes.c_uint64(22), ctypes.c_uint64(32), ctypes.c_uint64(0)]
    params = (ctypes.c_void_p * 4)(*[ctypes.addressof(v) for v in values])   # room for a launch id
    name = b"kernel_a" if scenario == "enumerate" else b"vecadd"
    r = cuda.cuInit(0)
    if scenario == "devices":
        first, device1 = ctypes.c_void_p(), ctypes.c_void_p()
        r |= cuda.cuModuleLoadData(ctypes.byref(first), PTX % b"vecadd")
        r |= cuda.cuDevicePrimaryCtxRetain(ctypes.byref(device1), 1) | cuda.cuCtxSetCurrent(device1)
    r |= cuda.cuModuleLoadData(ctypes.byref(mod), PTX % name)
    if scenario == "enumerate":
        found = (ctypes.c_void_p * 1)()
        r |= cuda.cuModuleEnumerateFunctions(found, 1, mod)
        f = ctypes.c_void_p(found[0])
    else:
        r |= cuda.cuModuleGetFunction(ctypes.byref(f), mod, name)
    shared = 64 * 1024 if scenario.startswith("shared") else 0
    if scenario == "shared":
        r |= cuda.cuFuncSetAttribute(f, MAX_DYNAMIC_SHARED_SIZE_BYTES, shared)
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
    print(f"app_flip {scenario} result={r}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
