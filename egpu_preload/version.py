"""``egpu --version``: what a bug report needs first. egpu's version, the CUDA driver and toolkit found,
the GPUs, clang, and which back ends can work here, each with the reason when one cannot.

Nothing here initialises CUDA: the driver is asked only cuDriverGetVersion (legal before cuInit) and
the GPUs come from nvidia-smi, so the report is safe on a machine without a GPU or driver.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from egpu_preload import __version__

DRIVER_LIBRARY = "libcuda.so.1"


@dataclass(frozen=True)
class Driver:
    path: str         # the library the loader found
    cuda: str         # the CUDA version it implements, "13.0"


def cuda_driver() -> Driver | None:
    """The CUDA driver library this process would load, or None when there is none."""
    try:
        lib = ctypes.CDLL(DRIVER_LIBRARY)
        version = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(version)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return Driver(_loaded_path(DRIVER_LIBRARY) or DRIVER_LIBRARY,
                  f"{version.value // 1000}.{version.value % 1000 // 10}")


def _loaded_path(soname: str) -> str | None:
    """Where the dynamic loader found ``soname`` (``libx.so.1``, maybe a link to libx.so.1.2.3) in this
    process, from /proc/self/maps."""
    stem = "/" + soname.split(".so")[0] + ".so"
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return None
    return next((line.split(None, 5)[-1] for line in maps if stem in line), None)


def _first_line(cmd: list[str], pattern: str) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(pattern, out)
    return m.group(1) if m else None


def report() -> list[str]:
    """The lines of ``--version``."""
    from egpu_preload.bpf.compile import CLANGS, find_clang
    from egpu_preload.errors import EgpuError
    from egpu_preload.runtime.sass import sanitizer_library, visible_sms
    from egpu_preload.translate.sass_patch import find_ptxas

    lines = [f"egpu {__version__} (Python {sys.version.split()[0]}, {Path(__file__).parent})"]
    driver = cuda_driver()
    lines.append(f"CUDA driver: {driver.cuda} ({driver.path})" if driver else
                 f"CUDA driver: none ({DRIVER_LIBRARY} not found): no CUDA program can run here")
    sms = visible_sms()
    lines.append("GPUs: " + (", ".join(f"sm_{sm}" for sm in sms) if sms else
                             "none listed by nvidia-smi" if shutil.which("nvidia-smi") else "unknown (no nvidia-smi)"))
    ptxas = find_ptxas()
    toolkit = _first_line([ptxas, "--version"], r"release ([\d.]+, V[\d.]+)") if ptxas else None
    lines.append(f"CUDA toolkit: ptxas {toolkit} ({ptxas})" if ptxas else
                 "CUDA toolkit: no ptxas (PATH, CUDA_HOME, /usr/local/cuda)")
    try:
        clang = find_clang()
        version = _first_line([clang, "--version"], r"version (\S+)")
        lines.append(f"clang: {version} ({clang})")
    except EgpuError:
        lines.append(f"clang: none ({', '.join(CLANGS)} not on PATH): .bpf.c probes cannot be compiled, .bpf.o can run")
    sanitizer = sanitizer_library()
    why_not_ptx = None if driver else "no CUDA driver"
    why_not_sass = why_not_ptx or (None if sanitizer and Path(sanitizer).exists() else
                                   "no compute-sanitizer/libsanitizer-public.so under CUDA_HOME or /usr/local/cuda "
                                   "(EGPU_SANITIZER_LIB names one)") or (None if ptxas else "no ptxas")
    lines.append("PTX back end: " + ("usable (kernels that ship PTX; the driver JITs them)" if why_not_ptx is None
                                     else f"not usable ({why_not_ptx})"))
    lines.append("SASS back end: " + (f"usable ({sanitizer})" if why_not_sass is None
                                      else f"not usable ({why_not_sass})"))
    return lines
