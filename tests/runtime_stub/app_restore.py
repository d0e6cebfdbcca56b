"""A Python program whose launches restore a checkpoint (the shim's restore trigger, egpu_cow.h) while
another of its threads launches holding the GIL, as PyTorch does: run under LD_PRELOAD with the
stand-in driver (tests/test_shim.py). The restore is a stand-in too: it takes 0.5 s in Python, letting
go of the GIL and taking it back. Prints "restored" from inside the restore, then "held R" and
"released R" for the two launches once they returned."""

from __future__ import annotations

import ctypes
import threading
import time

PTX = b".version 8.0\n.target sm_90\n.address_size 64\n\n.visible .entry k(\n\t.param .u64 p\n)\n{\n\tret;\n}\n"

released = ctypes.CDLL("libcuda.so.1")   # calls let go of the GIL
held = ctypes.PyDLL("libcuda.so.1")      # calls keep it
for lib in (released, held):
    lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3

module = ctypes.c_void_p()
assert released.cuInit(0) == 0 and released.cuModuleLoadData(ctypes.byref(module), PTX) == 0  # Python attaches

from egpu_preload.runtime import hooks  # noqa: E402  (the shim's, attached by the load above)

ffi, lib = hooks.shim()


@ffi.def_extern(name="egpu_py_cow_restore")
def restore() -> None:
    time.sleep(0.5)
    print("restored", flush=True)


lib.egpu_cow_restore_at(1)
address = ctypes.c_ulonglong()
assert released.cuMemAlloc_v2(ctypes.byref(address), 64) == 0


def launch(dll: ctypes.CDLL, name: str) -> None:
    r = dll.cuLaunchKernel(0x1000, 1, 1, 1, 1, 1, 1, 0, None, None, None)
    print(f"{name} {r}\n", end="", flush=True)   # one write: the two threads' lines never interleave


first = threading.Thread(target=launch, args=(released, "released"))
first.start()
time.sleep(0.1)   # the first launch is in the restore now
launch(held, "held")
first.join()
