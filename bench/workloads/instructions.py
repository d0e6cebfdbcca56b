"""User-space instructions retired by this process: perf_event_open(2), inherited by every thread started
after open(), read by the process itself (no perf tool, no root: perf_event_paranoid up to 2 allows it).

What a host-bound step executes does not move with the core it lands on, its clock or its neighbours, which
move its time by 10-20% from one process to the next (bench/paired.py). So a cost of a few instructions a
launch shows here where a few hundred nanoseconds are lost in the time's spread. It does not see what
costs time without instructions (cache misses, a lock waited on in the kernel), and a synchronize that
spins counts its spin: host-bound work spins little.
"""

from __future__ import annotations

import ctypes
import os
import struct

SYS_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}
EVENTS = {"instructions": (0, 1), "task_clock": (1, 1)}   # (type, config): HARDWARE's, SOFTWARE's (ns on CPU)
ATTR_SIZE = 128   # PERF_ATTR_SIZE_VER7; the kernel takes any version it knows
INHERIT, EXCLUDE_KERNEL, EXCLUDE_HV = 1 << 1, 1 << 5, 1 << 6   # perf_event_attr's flag bits
PERF_FLAG_FD_CLOEXEC = 1 << 3


class Counter:
    """One event counted from construction on; ``read()`` its count since."""

    def __init__(self, event: str = "instructions") -> None:
        """OSError (with the reason) where the kernel or the VM gives no such counter (a VM without a
        virtual PMU has no instruction counter: ENOENT)."""
        number = SYS_PERF_EVENT_OPEN.get(os.uname().machine)
        if number is None:
            raise OSError(f"perf_event_open: no syscall number known for {os.uname().machine}")
        attr = bytearray(ATTR_SIZE)
        kind, config = EVENTS[event]
        struct.pack_into("<IIQ", attr, 0, kind, ATTR_SIZE, config)
        struct.pack_into("<Q", attr, 40, INHERIT | EXCLUDE_KERNEL | EXCLUDE_HV)   # after sample_*, read_format
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        buf = (ctypes.c_char * ATTR_SIZE).from_buffer(attr)
        fd = libc.syscall(ctypes.c_long(number), buf, ctypes.c_int(0), ctypes.c_int(-1), ctypes.c_int(-1),
                          ctypes.c_ulong(PERF_FLAG_FD_CLOEXEC))
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"perf_event_open ({event}): {os.strerror(err)}")
        self.fd = int(fd)

    def read(self) -> int:
        """The count so far: this thread's and every inherited thread's, the exited ones' included."""
        return struct.unpack("<Q", os.read(self.fd, 8))[0]
