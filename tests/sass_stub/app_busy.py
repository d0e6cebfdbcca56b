"""A job that keeps the GIL busy, as a host-bound PyTorch eager loop does (tests/test_sass_live.py):
`python3 app_busy.py STOP` loads two PTX modules (kernels `step`, `step2`) through ctypes, then until the
file STOP exists runs about 2 ms of pure Python between launches of each; then prints
"app_busy launches N failed F"."""

import ctypes
import os
import sys

PTX = ".version 8.0\n.target sm_90\n.address_size 64\n\n.visible .entry {}()\n{{\n\tret;\n}}\n"


def main() -> int:
    stop = sys.argv[1]
    cuda = ctypes.CDLL("libcuda.so.1")
    functions = []
    if cuda.cuInit(0):
        return 4
    for name in ("step", "step2"):
        mod, f = ctypes.c_void_p(), ctypes.c_void_p()
        if cuda.cuModuleLoadData(ctypes.byref(mod), PTX.format(name).encode()) or \
                cuda.cuModuleGetFunction(ctypes.byref(f), mod, name.encode()):
            return 4
        functions.append(f)
    launches = failed = 0
    while not os.path.exists(stop):
        sum(i * i for i in range(20000))   # the step's Python: the GIL held, as the interpreter runs it
        for f in functions:
            r = cuda.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, None, None, None)
            launches, failed = launches + (r == 0), failed + (r != 0)
    print(f"app_busy launches {launches} failed {failed}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
