"""app_vec.c as a Python program (ctypes reaches the driver through dlsym): `python3 app_vec.py MODE K N
STATUS [late | wait:FILE]`. Its exit dump comes from Python's atexit, not C's. With `late`, C's exit handlers
unload the module and free memory after the interpreter is finalized, as cuDNN's static destructors do in
a PyTorch program. With `wait:FILE` it waits for FILE to exist before it exits (its maps read while it
runs)."""

import ctypes
import os
import signal
import sys
import time

PTX = (b".version 8.0\n.target sm_90\n.address_size 64\n\n"
       b".visible .entry vecadd(\n\t.param .u64 a,\n\t.param .u64 b,\n\t.param .u64 n\n)\n{\n"
       b"\t.reg .b64 %rd<4>;\n\tld.param.u64 %rd1, [a];\n\tld.global.u64 %rd2, [%rd1];\n"
       b"\tst.global.u64 [%rd1], %rd2;\n\tret;\n}\n")


def at_exit(fn, arg) -> None:
    """fn(arg) from C's exit(), which runs after Py_FinalizeEx: a driver entry point (the shim's hook,
    as dlsym handed it out) called straight from C, never through Python."""
    libc = ctypes.CDLL(None)
    libc.__cxa_atexit.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    libc.__cxa_atexit(ctypes.cast(fn, ctypes.c_void_p), ctypes.c_void_p(arg.value), None)


def launch(mode: str, k: int, n: int) -> tuple[ctypes.CDLL, ctypes.c_void_p, int]:
    """Load the module (``library``: as a library) and launch vecadd ``k`` times over ``n`` threads:
    the driver, the module and the OR of every result."""
    cuda = ctypes.CDLL("libcuda.so.1")
    mod, f = ctypes.c_void_p(), ctypes.c_void_p()
    r = cuda.cuInit(0)
    if mode == "library":
        r |= cuda.cuLibraryLoadData(ctypes.byref(mod), PTX, None, None, 0, None, None, 0)
        r |= cuda.cuLibraryGetKernel(ctypes.byref(f), mod, b"vecadd")
    else:
        r |= cuda.cuModuleLoadData(ctypes.byref(mod), PTX)
        r |= cuda.cuModuleGetFunction(ctypes.byref(f), mod, b"vecadd")
    values = [ctypes.c_uint64(11), ctypes.c_uint64(22), ctypes.c_uint64(n)]
    params = (ctypes.c_void_p * 3)(*[ctypes.addressof(v) for v in values])
    for _ in range(k):
        r |= cuda.cuLaunchKernel(f, (n + 31) // 32, 1, 1, 32, 1, 1, 0, None, params, None)
    return cuda, mod, r | cuda.cuCtxSynchronize()


def mirror_copy(since: float) -> float:
    """When this process's map mirror (runtime/mirror.py) was first written after ``since`` (time.time()),
    waiting up to 30 s for it: the copy after that one read the maps wholly after ``since``. How a job
    knows its launches are in the mirror, on however loaded a machine."""
    from egpu_preload.errors import EgpuError
    from egpu_preload.runtime.mirror import read_mirror
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            when = read_mirror(os.getpid())[1]
        except EgpuError:   # no copy yet
            when = 0.0
        if when > since:
            return when
        time.sleep(0.01)
    raise TimeoutError(f"no map mirror copy of process {os.getpid()} in 30 s")


def main() -> int:
    mode, k, n, status = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    cuda, mod, r = launch(mode, k, n)
    print(f"app_vec {mode} launches={k} threads={n} result={r}", flush=True)
    if sys.argv[5:] == ["late"]:
        at_exit(cuda.cuLibraryUnload if mode == "library" else cuda.cuModuleUnload, mod)
        ptr = ctypes.c_uint64()
        cuda.cuMemAlloc_v2(ctypes.byref(ptr), 64)
        at_exit(cuda.cuMemFree_v2, ptr)
    elif sys.argv[5:6] and sys.argv[5].startswith("wait:"):
        deadline = time.monotonic() + 60
        while not os.path.exists(sys.argv[5][5:]) and time.monotonic() < deadline:
            time.sleep(0.02)
    if status == "kill":
        os.kill(os.getpid(), signal.SIGTERM)
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
