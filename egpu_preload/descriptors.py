"""The descriptors egpu keeps open inside a job's process across its run (the --trace file, its spool, the control
sockets), kept apart from the program's own.

The descriptor table is the program's: a daemon closes every descriptor above stderr (a loop to the limit,
close_range) and opens its own files, which take the lowest numbers free. Had egpu's stayed where open() put them
(3, 4, ...), the program's files landed on those numbers and egpu wrote its trace into them. So egpu's descriptors
live high (``high``), where the program's files come only once it holds that many, and each remembers the file it
was made for (``Held``: st_dev, st_ino), so that egpu writes into and closes only its own: a number the program
closed, or reused, egpu lets go of unclosed, and says what it lost. Linux only.
"""

from __future__ import annotations

import fcntl
import os
import resource

FLOOR = 512   # egpu's descriptors from here up (or from half the soft RLIMIT_NOFILE, where that is lower)


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


class Held:
    """One descriptor of egpu's and the file it was opened on."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.file = identity(fd)

    def ours(self) -> bool:
        """Whether the number still holds egpu's file: not closed by the program, nor reused for a file of its own."""
        return self.file is not None and identity(self.fd) == self.file

    def close(self) -> None:
        """Closed where it is still egpu's; a number the program reused is its file now, let go of unclosed."""
        if self.ours():
            os.close(self.fd)
        self.fd, self.file = -1, None
