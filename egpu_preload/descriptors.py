"""The descriptors egpu keeps open inside a job's process across its run (the --trace file, its spool, the control
sockets), kept apart from the program's own.

The descriptor table is the program's: a daemon closes every descriptor above stderr (a loop to the limit,
close_range) and opens its own files, which take the lowest numbers free. Had egpu's stayed where open() put them
(3, 4, ...), the program's files landed on those numbers and egpu wrote its trace into them. So egpu's descriptors
live high (``high``), where the program's files come only once it holds that many, and each remembers the file it
was made for (``Held``: st_dev, st_ino), so that egpu writes into and closes only its own: a number the program
closed, or reused, egpu lets go of unclosed, and says what it lost. A file egpu maps (``mapped``) holds no
descriptor at all. Linux only.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import mmap
import os
import resource
from typing import Any

FLOOR = 512   # egpu's descriptors from here up (or from half the soft RLIMIT_NOFILE, where that is lower)
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mmap.restype = ctypes.c_void_p
_LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
MAP_FAILED = ctypes.c_void_p(-1).value


def high(fd: int) -> int:
    """``fd`` moved to the lowest free number from FLOOR, close-on-exec, its old number closed; ``fd`` as it is
    where no number there is free (a limit of a few descriptors)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    floor = FLOOR if soft == resource.RLIM_INFINITY else min(FLOOR, soft // 2)
    if fd >= floor:
        return fd
    try:
        moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor)
    except OSError:
        return fd
    os.close(fd)
    return moved


def identity(fd: int) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the file open on ``fd``, None where none is."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def mapped(fd: int, size: int, prot: int = mmap.PROT_READ | mmap.PROT_WRITE) -> Any:
    """The file open on ``fd`` mapped shared, as a char array (``unmap`` it), which holds no descriptor: mmap.mmap
    keeps a copy of ``fd``, on the lowest number free, until it is closed. OSError where it cannot be mapped."""
    at = _LIBC.mmap(None, size, prot, mmap.MAP_SHARED, fd, 0)
    if at is None or at == MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return (ctypes.c_char * size).from_address(at)


def unmap(m: Any) -> None:
    """A mapping ``mapped`` made, gone: nothing may touch ``m`` after."""
    _LIBC.munmap(ctypes.addressof(m), len(m))


class Held:
    """One descriptor of egpu's and the file it was opened on. A file of no name (``pin``: the spool's) is freed
    when the job closes its descriptor, and a file the job makes next may get its inode number (ext4 gave the next
    one the spool's): a page of it mapped keeps it, so that no other file can pass for it."""

    def __init__(self, fd: int, pin: bool = False) -> None:
        self.fd = fd
        self.file = identity(fd)
        self._pin: Any = None
        if pin and self.file is not None:
            with contextlib.suppress(OSError):   # a filesystem that maps nothing: its inode numbers as they come
                self._pin = mapped(fd, mmap.PAGESIZE, mmap.PROT_READ)

    def ours(self) -> bool:
        """Whether the number still holds egpu's file: not closed by the program, nor reused for a file of its own."""
        return self.file is not None and identity(self.fd) == self.file

    def close(self) -> None:
        """Closed where it is still egpu's; a number the program reused is its file now, let go of unclosed."""
        if self.ours():
            os.close(self.fd)
        if self._pin is not None:
            unmap(self._pin)
        self.fd, self.file, self._pin = -1, None, None
