"""The ring reader's driver calls over memory of this process (tests/stub_driver/host_memory.c), so that its
pass in C runs against a stand-in ring that producer threads write: for the reader's tests and
bench/bench_drain.py. Built with gcc once per process, loaded ABI-mode."""

from __future__ import annotations

import functools
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import cffi

from egpu_preload.runtime.driver import PASS_EVENTS, DriverError, StreamCopies

SOURCE = Path(__file__).resolve().parent / "stub_driver" / "host_memory.c"
CDEF = """
struct stub_copy { int call; unsigned long long device, n, host; };
struct stub_pending { unsigned char *dst; unsigned long long src, n; };
struct stub_memory {
    unsigned char *base;
    unsigned long long fail_lo, fail_hi;
    long long fail_after;
    int fail_result;
    struct stub_copy *log;
    unsigned long long room, logged;
    int lazy, head_first, counts;
    struct stub_pending pending[64];
    unsigned long long queued, landed;
};
struct stub_event { struct stub_memory *stream; unsigned long long upto; };
int stub_copy_out(void *dst, unsigned long long src, size_t n, void *stream);
int stub_copy_in(unsigned long long dst, const void *src, size_t n, void *stream);
int stub_wait(void *stream);
int stub_record(void *event, void *stream);
int stub_landed(void *event);
void stub_produce(struct stub_memory *m, unsigned long long addr, const long long *starts, unsigned long long n,
                  const unsigned char *data, unsigned long long ring);
"""
OUT, IN = 0, 1   # a logged copy's call


@functools.cache
def _lib() -> tuple[Any, Any]:
    out = Path(tempfile.mkdtemp(prefix="egpu-host-memory-")) / "libhost_memory.so"
    subprocess.run(["gcc", "-O2", "-Wall", "-Werror", "-shared", "-fPIC", str(SOURCE), "-o", str(out)], check=True)
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    return ffi, ffi.dlopen(str(out))


def failure(call: str, result: int) -> DriverError:
    """What the stand-in's failed call raises: driver.Driver.failure's text, the error by its number."""
    return DriverError(f"{call} failed: CUresult {result}", result)


class HostCopies:
    """The driver's copies over the bytearray ``mem`` (device address 0 is its start; it must not be resized
    while this lives), each logged where ``room`` (entries) is given. ``lazy``: the copies out land only when
    waited for, and a burst's passes get events (host_memory.c)."""

    def __init__(self, mem: bytearray, room: int = 0, lazy: bool = False) -> None:
        self.ffi, self.lib = _lib()
        self._base = self.ffi.from_buffer(mem)
        self._log = self.ffi.new("struct stub_copy[]", room) if room else self.ffi.NULL
        self.state = self.ffi.new("struct stub_memory *", {"base": self._base, "fail_after": -1, "log": self._log,
                                                             "room": room, "lazy": lazy})
        self.lazy = lazy
        self._events = self.ffi.new("struct stub_event[]", PASS_EVENTS)

    def copies(self) -> StreamCopies:
        ffi, lib = self.ffi, self.lib
        address = lambda f: int(ffi.cast("uintptr_t", f))   # noqa: E731
        calls = [address(f) for f in (lib.stub_copy_out, lib.stub_copy_in, lib.stub_wait, lib.stub_record,
                                      lib.stub_landed)]
        stream = address(self.state)
        if not self.lazy:
            return StreamCopies(*calls[:3], stream, failure)
        return StreamCopies(*calls[:3], stream, failure, *calls[3:],
                            tuple(address(self._events + k) for k in range(PASS_EVENTS)))

    def fail(self, lo: int, hi: int, result: int, after: int = 0) -> None:
        """Copies out of device addresses [lo, hi) fail with ``result``, every one after the first ``after``."""
        s = self.state
        s.fail_lo, s.fail_hi, s.fail_result, s.fail_after = lo, hi, result, after

    def log(self) -> list[tuple[int, int, int, int]]:
        """(call: OUT or IN, device address, bytes, host address) of each copy made, as far as the log holds."""
        n = min(self.state.logged, self.state.room)
        return [(c.call, c.device, c.n, c.host) for c in self._log[0:n]]

    def produce(self, addr: int, starts: Any, data: Any, ring: int) -> None:
        """The records of ``data`` (record k at [starts[k], starts[k + 1]), int64 and uint8 numpy arrays) written
        into the ring at ``addr`` (``ring`` bytes of data) by C as room appears, the GIL let go meanwhile
        (stub_produce): the GPU's producers at full speed."""
        ffi = self.ffi
        self.lib.stub_produce(self.state, addr, ffi.from_buffer("long long[]", starts), len(starts) - 1,
                              ffi.from_buffer(data), ring)

    def host(self, buf: Any) -> tuple[int, int]:
        """[start, end) of ``buf``'s memory, to tell which buffer a copy used."""
        start = int(self.ffi.cast("uintptr_t", self.ffi.from_buffer(buf)))
        return start, start + memoryview(buf).nbytes
