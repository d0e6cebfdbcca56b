"""The runtime's exit: the dump made once, in the process that made it, while CUDA is still up."""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
from collections.abc import Callable
from typing import Any


class ExitHook:
    """Runs ``fn`` once at exit, in this process only (not in a forked child), while CUDA is still up.

    Python programs: Python's atexit, which runs before the interpreter and the CUDA libraries tear
    down. A multiprocessing worker started by fork or forkserver ends in os._exit, past atexit: its
    process's _bootstrap runs multiprocessing's exit finalizers first, so the hook is one of those too
    (where multiprocessing is loaded; a spawned worker runs both, the first one dumps). Other programs
    (Python embedded by the shim, never finalized): C's exit handlers, which run last registered first,
    so ``arm`` registers again whenever more CUDA work may have registered its own teardown (cudart
    registers at its initialization, before our first hook), and ``rearm_if_loaded`` whenever Python
    loaded modules: an extension (pyarrow, and pandas under its first write) registers its teardown as
    it loads, and the dump's last trace rows need it still up (the H200's vecadd crashed in write_table)."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        self.pid = os.getpid()
        self.done = False
        self._callback: Any = None
        self._modules = 0   # len(sys.modules) at the last arm
        if sys.orig_argv:  # empty when Python was started by an embedding library
            atexit.register(self.run)
            workers = sys.modules.get("multiprocessing.util")
            if workers is not None:
                workers.Finalize(None, self.run, exitpriority=0)
        else:
            self._callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _: self.run())
            self._cxa_atexit = ctypes.CDLL(None)["__cxa_atexit"]
            self._cxa_atexit.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
            self.arm()

    def arm(self) -> None:
        if self._callback is not None:
            self._modules = len(sys.modules)
            self._cxa_atexit(ctypes.cast(self._callback, ctypes.c_void_p), None, None)

    def rearm_if_loaded(self) -> None:
        if self._callback is not None and len(sys.modules) != self._modules:
            self.arm()

    def run(self) -> None:
        if self.done or os.getpid() != self.pid:
            return
        self.done = True
        try:
            self.fn()
        except Exception as e:  # never a traceback in the application's exit
            print(f"egpu: exit dump failed: {type(e).__name__}: {e}", file=sys.stderr)
