"""Output paths checked before the work that fills them, so a bad ``-o`` is one line up front instead of
an OSError after minutes of compiling or rewriting."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import EgpuError


def check_output_file(path: Path) -> None:
    """EgpuError naming ``path`` unless a file can be written there (created, or an existing file replaced)."""
    if path.is_dir():
        raise EgpuError("is a directory (expected an output file)", file=str(path))
    _check_writable_dir(path.parent, path)
    if path.exists() and not os.access(path, os.W_OK):
        raise EgpuError("cannot write (permission denied)", file=str(path))


def check_output_dir(path: Path) -> None:
    """EgpuError naming ``path`` unless it is a directory, or one can be made there."""
    if path.exists():
        if not path.is_dir():
            raise EgpuError("exists and is not a directory", file=str(path))
        if not os.access(path, os.W_OK | os.X_OK):
            raise EgpuError("cannot write (permission denied)", file=str(path))
        return
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    _check_writable_dir(parent, path)


def _check_writable_dir(directory: Path, path: Path) -> None:
    if not directory.exists():
        raise EgpuError(f"cannot write: no directory {directory}", file=str(path))
    if not directory.is_dir():
        raise EgpuError(f"cannot write: {directory} is not a directory", file=str(path))
    if not os.access(directory, os.W_OK | os.X_OK):
        raise EgpuError(f"cannot write in {directory} (permission denied)", file=str(path))
