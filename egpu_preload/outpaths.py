"""Output paths checked before the work that fills them, so a bad ``-o`` is one line up front instead of
an OSError after minutes of compiling or rewriting; and input files read whole, refused by name."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import EgpuError


def read_input(path: Path, error: type[EgpuError] = EgpuError) -> bytes:
    """The bytes of an input file, or ``error`` naming it: a directory, a device (/dev/zero never ends,
    and the read held memory until the machine ran out), a file that cannot be read. Pipes are read."""
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISDIR(mode):
            raise error("is a directory", file=str(path))
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            raise error("is a device, not a file", file=str(path))
        return Path(path).read_bytes()
    except OSError as e:
        raise error(f"cannot read ({e.strerror})", file=str(path)) from None


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


def create_new(path: Path) -> bool:
    """``path`` made here, empty, unless it exists (O_EXCL: of processes racing for one name, one gets it);
    whether it was made. Other OSErrors are the caller's."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    return True
