"""bench/empty_patch built for a bench: ``build(work)`` makes the tool and its patch image in ``work``;
``env(built, classes)`` is what injects them, patching the classes named ("enter", "exit", "mem")."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
CUDA = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
ENTRIES = {"enter": ("EMPTY_PATCH_ENTER", "EmptyEnter"), "exit": ("EMPTY_PATCH_EXIT", "EmptyExit"),
           "mem": ("EMPTY_PATCH_MEM", "EmptyAccess")}


def build(work: Path) -> tuple[Path, Path]:
    """(tool, patch image) built with gcc and nvcc against the machine's sanitizer headers;
    CalledProcessError when either build fails."""
    san = CUDA / "compute-sanitizer"
    tool, image = work / "empty_patch.so", work / "empty_patch.fatbin"
    subprocess.run(["gcc", "-O2", "-fPIC", "-shared", f"-I{san}/include", f"-I{CUDA}/include", str(HERE / "tool.c"),
                    "-o", str(tool), f"-L{san}", "-lsanitizer-public", f"-Wl,-rpath,{san}"], check=True)
    subprocess.run(["nvcc", "-gencode", "arch=compute_90,code=sm_90", "--fatbin", "--keep-device-functions",
                    "-Xptxas", "--compile-as-tools-patch", f"-I{san}/include", str(HERE / "patches.cu"),
                    "-o", str(image)], check=True)
    return tool, image


def env(built: tuple[Path, Path], classes: tuple[str, ...]) -> dict[str, str]:
    tool, image = built
    return {"CUDA_INJECTION64_PATH": str(tool), "EMPTY_PATCH_IMAGE": str(image),
            **{ENTRIES[c][0]: ENTRIES[c][1] for c in classes}}
