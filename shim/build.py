"""Build libegpu_shim.so with cffi's embedding API: `python3 shim/build.py [OUT_DIR]` (default build/).

egpu_shim.h is the interface, with egpu_sass.h for the SASS back end (sass.c): part 1 of each goes
to embedding_api() (implemented in Python by egpu_preload/runtime/hooks.py), part 2 to cdef() (the C
API the runtime calls), and set_source() includes both headers before interpose.c and sass.c. cffi
starts Python on the first call of a part-1 function, never when the library is loaded.
"""

from __future__ import annotations

import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

import cffi

SHIM = Path(__file__).resolve().parent
ROOT = SHIM.parent
PART1 = "/* ---- part 1: implemented in Python (embedding_api) ---- */"
PART2 = "/* ---- part 2: C API for the runtime (cdef) ---- */"
PART3 = "/* ---- part 3: C only ---- */"

# Runs once, in the process being instrumented, on the first hook that needs Python (cffi has imported
# _cffi_backend by then: egpu_preload/runtime/pythonpath). egpu-run's import directories go after the job's
# own, so that a Python job keeps its packages; first in an interpreter the shim started itself (a program
# that is not Python: no command line, sys.orig_argv empty), where only egpu's code runs and the base
# Python's site-packages must not stand in for egpu's environment. The source root is the fallback for a
# checkout that is not installed.
INIT = f"""
import os
import sys
dirs = [d for d in os.environ.get("EGPU_IMPORT_DIRS", "").split(os.pathsep) if d and d not in sys.path]
where = len(sys.path) if sys.orig_argv else 0
sys.path[where:where] = dirs
try:
    from egpu_preload.runtime import hooks
except ImportError:
    sys.path.append({str(ROOT)!r})
    from egpu_preload.runtime import hooks
from _egpu_shim import ffi, lib
hooks.attach(ffi, lib)
"""


HEADERS = ("egpu_shim.h", "egpu_sass.h", "egpu_cow.h", "egpu_launchvm.h", "egpu_uprobe.h", "egpu_hostapi.h",
           "egpu_drain.h")
SOURCES = ("interpose.c", "sass.c", "cupti.c", "cow.c", "launchvm.c", "hostapi.c", "process.c", "uprobe.c",
           "drain.c")


def header_parts() -> tuple[str, str]:
    """(embedding_api declarations, cdef declarations) cut out of the headers."""
    api, cdef = "", ""
    for name in HEADERS:
        text = (SHIM / name).read_text()
        api += text[text.index(PART1) + len(PART1):text.index(PART2)]
        cdef += text[text.index(PART2) + len(PART2):text.index(PART3)]
    return api, cdef


def build(out_dir: Path) -> Path:
    """Compile the shim into out_dir; returns the library's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    api, cdef = header_parts()
    ffi = cffi.FFI()
    ffi.embedding_api(api)
    ffi.cdef(cdef)
    libdir = sysconfig.get_config_var("LIBDIR")
    ffi.set_source("_egpu_shim", "".join(f'#include "{h}"\n' for h in HEADERS),
                   sources=[str(SHIM / s) for s in SOURCES], include_dirs=[str(SHIM)],
                   libraries=["dl", "pthread"],
                   extra_compile_args=["-O2", "-std=gnu11", "-fvisibility=hidden", "-Wall",
                                       "-Wno-unused-function"],
                   # find this Python's libpython from processes that do not have it on their path
                   extra_link_args=[f"-Wl,-rpath,{libdir}"] if libdir else [])
    ffi.embedding_init_code(INIT)
    with tempfile.TemporaryDirectory() as tmp:
        built = Path(ffi.compile(tmpdir=tmp, target="libegpu_shim.*", verbose=False))
        target = out_dir / built.name
        built.replace(target)
    return target


def load(lib: Path) -> tuple[Any, Any]:
    """(ffi, lib) of the built shim at ``lib``, its C API (part 2) loaded ABI-mode into this process (tests,
    benchmarks): no hook is called, so its Python never starts."""
    ffi = cffi.FFI()
    ffi.cdef(header_parts()[1])
    return ffi, ffi.dlopen(str(lib))


if __name__ == "__main__":
    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "build"))
