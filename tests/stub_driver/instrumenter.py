"""Test harness, not product: the instrumenter the shim tests load with EGPU_RUNTIME=instrumenter.

It exercises both ways the runtime can use the shim:
- replacement image: PTX (or the best PTX of a fatbin) comes back marked "// egpu-instrumented" with
  kernel_a taking a trailing u64 launch id, and kernel_a's handles are registered onto themselves
  with egpu_shim_register_launch_id (2 parameters, id at byte 16);
- beside: when the app looks up kernel_b, a second module is loaded through the real driver
  (egpu_shim_real) and launches of kernel_b are redirected to its kernel_b (egpu_shim_register).
EGPU_TEST_LOADS=FILE appends "API KIND REPLACEMENT_RESULT" per load there (the GPU tests read it).
EGPU_TEST_FOUND_DELAY=S makes every handle_found take S seconds first; EGPU_TEST_FOUND_FAILS=1 makes
the first one raise. EGPU_TEST_RINGS_WAIT=1 turns the shim's waits for waiting rings on. EGPU_TEST_FAIL=1 makes
module_load raise, EGPU_TEST_REFUSE=1 makes it return PTX the stand-in driver refuses: either way the original load must
proceed.
"""

from __future__ import annotations

import os
import re
import sys
import time

from egpu_preload import fatbin
from egpu_preload.fatbin import ImageKind
from egpu_preload.runtime import hooks

MARK = "\n// egpu-instrumented\n"
REFUSE = "\n// egpu-refuse\n"
LAUNCH_ID = ",\n\t.param .u64 __egpu_launch_id\n)"


def instrumented(ptx: str) -> str:
    return re.sub(r"(\.entry kernel_a\([^)]*?)\n\)", lambda m: m.group(1) + LAUNCH_ID, ptx) + MARK


class TestInstrumenter:
    def __init__(self) -> None:
        self.ffi, self.lib = hooks.shim()
        self.instrumented: set[int] = set()  # modules and libraries loaded from our replacement
        self.found_failed = False
        if os.environ.get("EGPU_TEST_RINGS_WAIT"):   # as the runtime's --trace with waiting rings
            self.lib.egpu_shim_rings_wait(self.ffi.cast("void *", 1))   # a context the stand-in has not

    def module_load(self, image: hooks.ModuleImage) -> bytes | None:
        if os.environ.get("EGPU_TEST_FAIL"):
            raise RuntimeError("test instrumenter fails on purpose")
        if image.kind == ImageKind.PTX:
            ptx = image.data.rstrip(b"\0").decode()
        elif image.kind in (ImageKind.WRAPPER, ImageKind.FATBIN):
            entry = fatbin.best_ptx(fatbin.find_fatbins(image.data), 90)
            if entry is None:
                return None
            ptx = entry.ptx()
        else:
            return None
        return (instrumented(ptx) + (REFUSE if os.environ.get("EGPU_TEST_REFUSE") else "")).encode()

    def module_loaded(self, api, call, handle, result, replacement_result, jit_log) -> None:
        if os.environ.get("EGPU_TEST_LOADS"):
            with open(os.environ["EGPU_TEST_LOADS"], "a") as f:
                f.write(f"{api} {result} {replacement_result}\n")
        if jit_log:   # the driver's log of a refused replacement (EGPU_TEST_REFUSE)
            print(f"egpu-test: {api} refused: {jit_log.splitlines()[0]}", file=sys.stderr)
        if replacement_result == 0:
            self.instrumented.add(handle)

    def handle_found(self, api, owner, name, handle) -> None:
        ffi, lib = self.ffi, self.lib
        time.sleep(float(os.environ.get("EGPU_TEST_FOUND_DELAY", "0")))  # a runtime slow to route
        if os.environ.get("EGPU_TEST_FOUND_FAILS") and not self.found_failed:
            self.found_failed = True
            raise RuntimeError("test instrumenter fails its first lookup on purpose")
        if name == "kernel_a" and owner in self.instrumented:
            lib.egpu_shim_register_launch_id(ffi.cast("void *", handle), ffi.cast("void *", handle), 2, 16)
        elif name == "kernel_b":
            load = ffi.cast("int (*)(void **, const void *)", lib.egpu_shim_real(b"cuModuleLoadData"))
            get = ffi.cast("int (*)(void **, void *, const char *)", lib.egpu_shim_real(b"cuModuleGetFunction"))
            mod, fn = ffi.new("void **"), ffi.new("void **")
            text = b"// beside\n.version 8.0\n.target sm_90\n.visible .entry kernel_b(\n.param .u64 c\n)\n{\nret;\n}\n"
            if load(mod, text) == 0 and get(fn, mod[0], b"kernel_b") == 0:
                lib.egpu_shim_register(ffi.cast("void *", handle), fn[0])

    def unloaded(self, api, handle) -> None:
        pass


hooks.register(TestInstrumenter())
