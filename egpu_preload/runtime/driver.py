"""The CUDA driver calls the in-process runtime makes, straight to libcuda.

Entry points come from egpu_shim_real (the driver's own symbols, never a hook), so the runtime's calls
neither reach its own hooks nor depend on a binding (cuda-python) being importable in the application.
Every CUresult is checked: a failure is a DriverError naming the call and the driver's error (a refused load: and
the first lines of the JIT's error log).
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from egpu_preload.errors import EgpuError

CUDA_SUCCESS = 0
CUDA_ERROR_NOT_FOUND = 500
CU_STREAM_NON_BLOCKING = 1   # no implicit ordering with the legacy default stream (cuda.h CUstream_flags)
CU_EVENT_DISABLE_TIMING = 2   # cuda.h CUevent_flags
CU_STREAM_CAPTURE_MODE_RELAXED = 2   # cuda.h CUstreamCaptureMode
# CUdevice_attribute values (cuda.h)
ATTR_SM_COUNT = 16
ATTR_CC_MAJOR = 75
ATTR_CC_MINOR = 76
# CUjit_option values (cuda.h): the JIT's error log and its size, in bytes of room in, bytes written out
CU_JIT_ERROR_LOG_BUFFER = 5
CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6
JIT_LOG_BYTES = 4096   # room for the error log of an image the driver refuses, as the shim has (interpose.c)
JIT_OPTIONS = 32       # of the application's JIT options, at most this many are kept for a module's copies
JIT_LOG_LINES, JIT_LOG_CHARS = 3, 500   # of a refused image's log, what its reason carries

# symbol -> C type; the _v2 symbols are the 64-bit-pointer ABI cuda.h's macros select.
SIGNATURES = {
    "cuGetErrorName": "int (*)(int, const char **)",
    "cuInit": "int (*)(unsigned int)",
    "cuCtxGetCurrent": "int (*)(void **)",
    "cuCtxGetDevice": "int (*)(int *)",
    "cuCtxPushCurrent_v2": "int (*)(void *)",
    "cuCtxPopCurrent_v2": "int (*)(void **)",
    "cuCtxSynchronize": "int (*)(void)",
    "cuDeviceGet": "int (*)(int *, int)",
    "cuDeviceGetAttribute": "int (*)(int *, int, int)",
    "cuDevicePrimaryCtxRetain": "int (*)(void **, int)",
    "cuDevicePrimaryCtxRelease_v2": "int (*)(int)",
    "cuMemAlloc_v2": "int (*)(unsigned long long *, size_t)",
    "cuMemGetInfo_v2": "int (*)(size_t *, size_t *)",
    "cuMemFree_v2": "int (*)(unsigned long long)",
    "cuMemcpyHtoD_v2": "int (*)(unsigned long long, const void *, size_t)",
    "cuMemcpyDtoH_v2": "int (*)(void *, unsigned long long, size_t)",
    "cuMemcpyHtoDAsync_v2": "int (*)(unsigned long long, const void *, size_t, void *)",
    "cuMemcpyDtoHAsync_v2": "int (*)(void *, unsigned long long, size_t, void *)",
    "cuMemHostAlloc": "int (*)(void **, size_t, unsigned int)",
    "cuMemFreeHost": "int (*)(void *)",
    "cuStreamCreate": "int (*)(void **, unsigned int)",
    "cuEventCreate": "int (*)(void **, unsigned int)",
    "cuEventRecord": "int (*)(void *, void *)",
    "cuEventSynchronize": "int (*)(void *)",
    "cuStreamDestroy_v2": "int (*)(void *)",
    "cuStreamSynchronize": "int (*)(void *)",
    "cuThreadExchangeStreamCaptureMode": "int (*)(int *)",
    "cuModuleGetGlobal_v2": "int (*)(unsigned long long *, size_t *, void *, const char *)",
    "cuLibraryGetGlobal": "int (*)(unsigned long long *, size_t *, void *, const char *)",
    "cuModuleLoadDataEx": "int (*)(void **, const void *, unsigned int, int *, void **)",
    "cuModuleGetFunction": "int (*)(void **, void *, const char *)",
    "cuModuleGetFunctionCount": "int (*)(unsigned int *, void *)",
    "cuModuleEnumerateFunctions": "int (*)(void **, unsigned int, void *)",
    "cuFuncGetName": "int (*)(const char **, void *)",
    "cuLibraryGetKernelCount": "int (*)(unsigned int *, void *)",
    "cuLibraryEnumerateKernels": "int (*)(void **, unsigned int, void *)",
    "cuKernelGetName": "int (*)(const char **, void *)",
    "cuLaunchKernel": "int (*)(void *, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, "
                      "unsigned int, unsigned int, void *, void **, void **)",
    "cuLibraryLoadData": "int (*)(void **, const void *, int *, void **, unsigned int, int *, void **, unsigned int)",
    "cuLibraryGetKernel": "int (*)(void **, void *, const char *)",
    "cuModuleUnload": "int (*)(void *)",
    "cuLibraryUnload": "int (*)(void *)",
}


class DriverError(EgpuError):
    """A driver call the runtime made failed (result: the CUresult)."""

    def __init__(self, reason: str, result: int) -> None:
        super().__init__(reason)
        self.result = result


def jit_refusal(cause: str, log: str) -> str:
    """Why the driver refused an image, on one line: ``cause`` and the first lines of the JIT's error log
    (ptxas's: "ptxas application ptx input, line 12; error : ..."), whitespace runs made one."""
    lines = [" ".join(ln.split()) for ln in log.splitlines() if ln.strip()][:JIT_LOG_LINES]
    head = " | ".join(lines)
    head = head if len(head) <= JIT_LOG_CHARS else head[:JIT_LOG_CHARS - 3] + "..."
    return cause + (f": {head}" if head else "")


# The driver calls a pass of the ring reader makes in C (shim/drain.c egpu_ring_pass), in the order of its
# failed index: copy out, copy in, wait for the stream, record an event, wait for one.
PASS_CALLS = ("cuMemcpyDtoHAsync_v2", "cuMemcpyHtoDAsync_v2", "cuStreamSynchronize", "cuEventRecord",
              "cuEventSynchronize")
PASS_EVENTS = 8   # shim/egpu_drain.h EGPU_PIECES: the pieces a burst's pass copies what it walks in


@dataclass(frozen=True)
class StreamCopies:
    """What C code that copies on its own needs of the driver: the addresses of the PASS_CALLS functions, the
    stream they copy on, and ``failure``, which makes what to raise for one that failed: (its name, CUresult);
    for a burst's passes (shim/egpu_drain.h), events their copies land by (none: each copy made whole)."""

    copy_out: int
    copy_in: int
    wait: int
    stream: int
    failure: Callable[[str, int], Exception]
    record: int = 0
    landed: int = 0
    events: tuple[int, ...] = ()


class Driver:
    """The driver functions of SIGNATURES, bound through the shim's (ffi, lib)."""

    def __init__(self, ffi: Any, lib: Any) -> None:
        self.ffi = ffi
        self._lib = lib
        self._fns: dict[str, Any] = {}

    def _fn(self, symbol: str) -> Any:
        fn = self._fns.get(symbol)
        if fn is None:
            ptr = self._lib.egpu_shim_real(symbol.encode())
            if ptr == self.ffi.NULL:
                raise DriverError(f"the driver has no {symbol}", CUDA_ERROR_NOT_FOUND)
            fn = self._fns[symbol] = self.ffi.cast(SIGNATURES[symbol], ptr)
        return fn

    def call(self, symbol: str, *args: Any) -> None:
        r = self._fn(symbol)(*args)
        if r != CUDA_SUCCESS:
            raise self.failure(symbol, r)

    def failure(self, symbol: str, result: int) -> DriverError:
        """What a failed call of ``symbol`` raises."""
        return DriverError(f"{symbol} failed: {self.error_name(result)}", result)

    def error_name(self, result: int) -> str:
        name = self.ffi.new("const char **")
        try:
            if self._fn("cuGetErrorName")(result, name) == CUDA_SUCCESS and name[0] != self.ffi.NULL:
                return self.ffi.string(name[0]).decode()
        except DriverError:
            pass
        return f"CUresult {result}"

    # ---- contexts and devices ------------------------------------------------------------------
    def device(self) -> int:
        """The current context's device; device 0 when no context is current."""
        ctx, dev = self.ffi.new("void **"), self.ffi.new("int *")
        self.call("cuCtxGetCurrent", ctx)
        if ctx[0] == self.ffi.NULL:
            return 0
        self.call("cuCtxGetDevice", dev)
        return dev[0]

    def context(self) -> int | None:
        """The calling thread's current context; None when none is."""
        ctx = self.ffi.new("void **")
        self.call("cuCtxGetCurrent", ctx)
        return int(self.ffi.cast("uintptr_t", ctx[0])) or None

    def maps_context(self) -> int:
        """Where the maps go: the calling thread's context, else the device's primary context, which
        cudart will use too (cuLibraryLoadData may run before any context is current). A primary
        context gets one more reference, ours, so that it outlives cudart's own release at exit."""
        ctx, primary = self.ffi.new("void **"), self.ffi.new("void **")
        dev = self.device()
        self.call("cuCtxGetCurrent", ctx)
        self.call("cuDevicePrimaryCtxRetain", primary, dev)
        if ctx[0] == self.ffi.NULL:
            ctx[0] = primary[0]
        elif primary[0] != ctx[0]:  # a context the application made: leave the primary one alone
            self.call("cuDevicePrimaryCtxRelease_v2", dev)
        return int(self.ffi.cast("uintptr_t", ctx[0]))

    @contextmanager
    def current(self, context: int) -> Iterator[None]:
        """``context`` current on this thread for the block; the application's own is back after it."""
        self.call("cuCtxPushCurrent_v2", self.ffi.cast("void *", context))
        try:
            yield
        finally:
            self.call("cuCtxPopCurrent_v2", self.ffi.new("void **"))

    @contextmanager
    def capture_relaxed(self) -> Iterator[None]:
        """This thread may allocate and copy for the block while an application stream captures a graph.

        Under CUDA's lazy loading a module loads at its kernel's first launch, which may be a launch
        being captured; in a thread of the default (global) capture mode, cuMemAlloc then fails and
        invalidates the application's capture (seen on the H200). Relaxed mode lifts that for this
        thread only; a driver without the call (before CUDA 10.1) has no captures to conflict with."""
        mode = self.ffi.new("int *", CU_STREAM_CAPTURE_MODE_RELAXED)
        try:
            self.call("cuThreadExchangeStreamCaptureMode", mode)
        except DriverError:
            yield
            return
        try:
            yield
        finally:
            self.call("cuThreadExchangeStreamCaptureMode", mode)

    def attribute(self, attr: int, device: int) -> int:
        out = self.ffi.new("int *")
        self.call("cuDeviceGetAttribute", out, attr, device)
        return out[0]

    def synchronize(self) -> None:
        self.call("cuCtxSynchronize")

    # ---- memory ----------------------------------------------------------------------------------
    def free_memory(self) -> int | None:
        """Bytes of device memory free in the current context's device; None when the driver cannot say."""
        free, total = self.ffi.new("size_t *"), self.ffi.new("size_t *")
        try:
            self.call("cuMemGetInfo_v2", free, total)
        except DriverError:
            return None
        return int(free[0])

    def alloc(self, size: int) -> int:
        p = self.ffi.new("unsigned long long *")
        self.call("cuMemAlloc_v2", p, max(size, 8))
        return int(p[0])

    def free(self, ptr: int) -> None:
        self.call("cuMemFree_v2", ptr)

    def host_alloc(self, size: int) -> memoryview:
        """``size`` bytes of page-locked host memory, not zeroed: the copy engine reads and writes it
        directly, where a copy from or to pageable memory goes through the driver's own bounce buffer."""
        p = self.ffi.new("void **")
        self.call("cuMemHostAlloc", p, max(size, 8), 0)
        return memoryview(self.ffi.buffer(self.ffi.cast("char *", p[0]), size))

    def host_free(self, buf: memoryview) -> None:
        """Free what host_alloc returned; nothing may use ``buf`` after."""
        self.call("cuMemFreeHost", self.ffi.from_buffer(buf))

    def htod(self, ptr: int, data: bytes) -> None:
        if data:
            self.call("cuMemcpyHtoD_v2", ptr, self.ffi.from_buffer(data), len(data))

    def dtoh(self, ptr: int, size: int) -> bytes:
        if not size:
            return b""
        buf = self.ffi.new("char[]", size)
        self.call("cuMemcpyDtoH_v2", buf, ptr, size)
        return self.ffi.buffer(buf, size)[:]

    def global_address(self, owner: int, name: str, library: bool) -> int | None:
        """A module's or library's global in the current context; None if it has none of that name."""
        found = self.global_symbol(owner, name, library)
        return found[0] if found else None

    def global_symbol(self, owner: int, name: str, library: bool) -> tuple[int, int] | None:
        """(address, size) of a module's or library's global in the current context; None if absent."""
        p, size = self.ffi.new("unsigned long long *"), self.ffi.new("size_t *")
        symbol = "cuLibraryGetGlobal" if library else "cuModuleGetGlobal_v2"
        try:
            self.call(symbol, p, size, self.ffi.cast("void *", owner), name.encode())
        except DriverError as e:
            if e.result == CUDA_ERROR_NOT_FOUND:
                return None
            raise
        return int(p[0]), int(size[0])

    # ---- a stream of our own, for reading maps while the application runs ---------------------------
    def stream(self) -> int:
        """A new non-blocking stream in the current context: work on it waits for no application stream
        and no application stream waits for it."""
        out = self.ffi.new("void **")
        self.call("cuStreamCreate", out, CU_STREAM_NON_BLOCKING)
        return int(self.ffi.cast("uintptr_t", out[0]))

    def destroy_stream(self, stream: int) -> None:
        self.call("cuStreamDestroy_v2", self.ffi.cast("void *", stream))

    def dtoh_on(self, stream: int, ptr: int, size: int) -> bytes:
        """Copy out on ``stream`` and wait for that stream only. Both driver calls are made in one call into
        the shim (egpu_copy_out), so the GIL is let go once."""
        if not size:
            return b""
        out = bytearray(size)
        failed = self.ffi.new("int *")
        calls = ("cuMemcpyDtoHAsync_v2", "cuStreamSynchronize")
        r = self._lib.egpu_copy_out(*(self.ffi.cast("void *", self._fn(c)) for c in calls), self.ffi.from_buffer(out),
                                    ptr, size, self.ffi.cast("void *", stream), failed)
        if r != CUDA_SUCCESS:
            raise self.failure(calls[failed[0]], r)
        return bytes(out)

    def stream_copies(self, stream: int, events: tuple[int, ...] = ()) -> StreamCopies:
        """The PASS_CALLS functions on ``stream``, for C that copies on its own (the ring reader's pass); a burst's
        copies landing by ``events`` (where given)."""
        copy_out, copy_in, wait, *landing = (int(self.ffi.cast("uintptr_t", self._fn(c)))
                                             for c in PASS_CALLS[:3 + 2 * bool(events)])
        record, landed = landing or (0, 0)
        return StreamCopies(copy_out, copy_in, wait, stream, self.failure, record, landed, events)

    def events(self, n: int) -> tuple[int, ...]:
        """``n`` events of the current context that keep no time (a copy's landing is all they mark)."""
        out = self.ffi.new("void **")
        made = []
        for _ in range(n):
            self.call("cuEventCreate", out, CU_EVENT_DISABLE_TIMING)
            made.append(int(self.ffi.cast("uintptr_t", out[0])))
        return tuple(made)

    def htod_on(self, stream: int, ptr: int, data: bytes | memoryview) -> None:
        """Copy in on ``stream`` and wait for that stream only (copies on one stream land in order)."""
        if data:
            s = self.ffi.cast("void *", stream)
            self.call("cuMemcpyHtoDAsync_v2", ptr, self.ffi.from_buffer(data), len(data), s)
            self.call("cuStreamSynchronize", s)

    # ---- loading the original beside an instrumented image ------------------------------------------
    # Each waits for the maps' context first while rings wait (egpu_shim_idle): the driver holds the ring
    # reader's copies up while it loads code beside a kernel that waits for the reader.
    def load(self, image: bytes, library: bool, jit: tuple[tuple[int, int], ...] = ()) -> int:
        """A module or library of ``image``, JIT-compiled with the options ``jit`` (load_jit's: a copy gets those
        of the application's load); one the driver refuses raises a DriverError that carries the first lines of
        the JIT's error log (asked for as the shim asks for a replacement's)."""
        self._lib.egpu_shim_idle()
        out = self.ffi.new("void **")
        data = self.ffi.from_buffer(image)
        log = self.ffi.new("char[]", JIT_LOG_BYTES)
        options = self.ffi.new("int[]", [CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                                         *(o for o, _ in jit)])
        values = self.ffi.new("void *[]", [log, self.ffi.cast("void *", JIT_LOG_BYTES),
                                           *(self.ffi.cast("void *", v) for _, v in jit)])
        if library:
            N = self.ffi.NULL
            symbol = "cuLibraryLoadData"
            r = self._fn(symbol)(out, data, options, values, len(options), N, N, 0)
        else:
            symbol = "cuModuleLoadDataEx"   # cuModuleLoadData(m, i) is cuModuleLoadDataEx(m, i, 0, NULL, NULL)
            r = self._fn(symbol)(out, data, len(options), options, values)
        if r != CUDA_SUCCESS:
            written = min(int(self.ffi.cast("uintptr_t", values[1])), JIT_LOG_BYTES)   # the size option's output
            text = self.ffi.string(log, written).decode(errors="replace")
            raise DriverError(jit_refusal(f"{symbol} failed: {self.error_name(r)}", text), r)
        return int(self.ffi.cast("uintptr_t", out[0]))

    def load_jit(self) -> tuple[tuple[int, int], ...]:
        """(option, value) of the JIT options that take a number the application gave the load this thread is in
        (egpu_shim_load_jit; none outside a load)."""
        options, values = self.ffi.new("int[]", JIT_OPTIONS), self.ffi.new("unsigned long long[]", JIT_OPTIONS)
        n = self._lib.egpu_shim_load_jit(options, values, JIT_OPTIONS)
        return tuple((options[i], values[i]) for i in range(n))

    def unload(self, handle: int, library: bool) -> None:
        """Unload a module or library load() made (in the context current when it was loaded)."""
        self._lib.egpu_shim_idle()
        self.call("cuLibraryUnload" if library else "cuModuleUnload", self.ffi.cast("void *", handle))

    def function(self, owner: int, name: str, library: bool) -> int:
        self._lib.egpu_shim_idle()
        out = self.ffi.new("void **")
        self.call("cuLibraryGetKernel" if library else "cuModuleGetFunction", out,
                  self.ffi.cast("void *", owner), name.encode())
        if library:   # what the application set on a CUfunction reaches it through its function (interpose.c)
            self._lib.egpu_shim_kernel_handle(out[0])
        else:
            self._lib.egpu_shim_found(out[0])
        return int(self.ffi.cast("uintptr_t", out[0]))

    def functions_of(self, owner: int, library: bool) -> list[tuple[int, str]]:
        """(handle, kernel name) of every function of a module (a library: every CUkernel), as the driver enumerates
        them (partly loaded: nothing loads). Raises DriverError, as a driver before CUDA 12.4 does (no
        cuModuleEnumerateFunctions, cuLibraryEnumerateKernels)."""
        count_of, enumerate_, name_of = (("cuLibraryGetKernelCount", "cuLibraryEnumerateKernels", "cuKernelGetName")
                                         if library else
                                         ("cuModuleGetFunctionCount", "cuModuleEnumerateFunctions", "cuFuncGetName"))
        count = self.ffi.new("unsigned int *")
        self.call(count_of, count, self.ffi.cast("void *", owner))
        handles = self.ffi.new("void *[]", max(1, count[0]))
        self.call(enumerate_, handles, count[0], self.ffi.cast("void *", owner))
        name = self.ffi.new("const char **")
        out = []
        for h in handles[0:count[0]]:
            self.call(name_of, name, h)
            out.append((int(self.ffi.cast("uintptr_t", h)), self.ffi.string(name[0]).decode()))
        return out


GLOBALTIMER_WINDOW_NS = 50_000   # globaltimer_offset's uncertainty above which it launches again
# One thread stores %globaltimer (PTX ISA: a 64-bit ns timer, sm_30+) where its parameter points.
GLOBALTIMER_PTX = b"""\
.version 6.0
.target sm_50
.address_size 64
.visible .entry egpu_globaltimer(.param .u64 out)
{
	.reg .b64 %rd<3>;
	ld.param.u64 %rd1, [out];
	cvta.to.global.u64 %rd1, %rd1;
	mov.u64 %rd2, %globaltimer;
	st.global.u64 [%rd1], %rd2;
	ret;
}
\0"""


class ContextMemory:
    """Device memory of one context (alloc, free, htod, dtoh for DeviceMaps; read, write for mapsync),
    every copy on a stream of our own, made at once (the context current) so that every thread of the
    runtime uses the same one: a legacy-stream copy would wait for the application's blocking streams,
    and fails and breaks the capture while one of them captures a graph."""

    def __init__(self, driver: Driver, context: int) -> None:
        self.driver, self.context = driver, context
        self.stream = driver.stream()
        self._entered = threading.local()   # .on: this thread is inside entered()
        self._events: tuple[int, ...] | None = None   # copies(): those a burst's copies land by

    def close(self) -> None:
        """Destroy the stream (the context current); for memory whose maps could not be made."""
        self.driver.destroy_stream(self.stream)

    def alloc(self, size: int) -> int:
        return self.driver.alloc(size)

    def free(self, ptr: int) -> None:
        self.driver.free(ptr)

    def htod(self, ptr: int, data: bytes | memoryview) -> None:
        self.driver.htod_on(self.stream, ptr, data)

    def dtoh(self, ptr: int, size: int) -> bytes:
        return self.driver.dtoh_on(self.stream, ptr, size)

    @contextmanager
    def _from_any_thread(self) -> Iterator[None]:
        """The context made current and capture mode relaxed for the block, on whatever thread it runs."""
        if getattr(self._entered, "on", False):
            yield
            return
        with self.driver.current(self.context), self.driver.capture_relaxed():
            yield

    @contextmanager
    def entered(self) -> Iterator[None]:
        """The context current and capture mode relaxed on this thread for the block, once: the copies
        inside skip their own four driver calls around each (the ring reader's thread, for its run)."""
        with self._from_any_thread():
            was, self._entered.on = getattr(self._entered, "on", False), True
            try:
                yield
            finally:
                self._entered.on = was

    def read(self, addr: int, n: int) -> bytes:
        """dtoh from any thread."""
        with self._from_any_thread():
            return self.dtoh(addr, n)

    def copies(self) -> StreamCopies:
        """The driver's copies on this memory's stream, for C that copies on its own (the ring reader's pass),
        inside entered(): the context current, capture mode relaxed. With them events a burst's copies land by, made
        at the first call and shared by every reader: the passes run one at a time, on the drain's thread (a driver
        with no events: none, the copies made whole)."""
        if self._events is None:
            with self._from_any_thread():
                try:
                    self._events = self.driver.events(PASS_EVENTS)
                except DriverError:
                    self._events = ()
        return self.driver.stream_copies(self.stream, self._events)

    def write(self, addr: int, data: bytes | memoryview) -> None:
        """htod from any thread; from memory pinned() returned, the copy engine reads it directly."""
        with self._from_any_thread():
            self.htod(addr, data)

    def pinned(self, size: int) -> memoryview:
        """Page-locked host memory, which the copy engine reads and writes directly (the ring reader's
        copies), from any thread; freed by unpin()."""
        with self._from_any_thread():
            return self.driver.host_alloc(size)

    def unpin(self, buf: memoryview) -> None:
        with self._from_any_thread():
            self.driver.host_free(buf)

    def globaltimer_offset(self, tries: int = 5, most: int = 50) -> tuple[int, int] | None:
        """(%globaltimer - CLOCK_REALTIME, the uncertainty) in ns: a one-thread kernel reads the GPU's clock
        between two host reads, the tightest of ``tries``, or of up to ``most`` while none was within
        GLOBALTIMER_WINDOW_NS (other processes' kernels on the GPU may start it milliseconds late, and leave
        the offset that uncertain); None when the kernel stored nothing (a driver that runs no kernels). The
        driver keeps %globaltimer near the Unix epoch, not on it: 1.19 ms ahead on the H200 of 2026-12-01,
        which launch probes' enqueue times must not carry."""
        with self._from_any_thread():
            module = self.driver.load(GLOBALTIMER_PTX, library=False)
            try:
                out = self.alloc(8)
                try:
                    return self._read_globaltimer(module, out, tries, most)
                finally:
                    self.free(out)
            finally:
                self.driver.unload(module, library=False)

    def _read_globaltimer(self, module: int, out: int, tries: int, most: int) -> tuple[int, int] | None:
        best = None
        self.htod(out, bytes(8))
        ffi = self.driver.ffi
        fn = ffi.cast("void *", self.driver.function(module, "egpu_globaltimer", library=False))
        arg = ffi.new("unsigned long long *", out)
        params = ffi.new("void *[1]", [arg])
        stream = ffi.cast("void *", self.stream)
        for n in range(most):
            if n >= tries and best is not None and best[1] <= GLOBALTIMER_WINDOW_NS:
                break
            before = time.clock_gettime_ns(time.CLOCK_REALTIME)
            self.driver.call("cuLaunchKernel", fn, 1, 1, 1, 1, 1, 1, 0, stream, params, ffi.NULL)
            self.driver.call("cuStreamSynchronize", stream)
            after = time.clock_gettime_ns(time.CLOCK_REALTIME)
            (gpu,) = struct.unpack("<Q", self.dtoh(out, 8))
            if not gpu:
                break
            if best is None or after - before < 2 * best[1]:
                best = (gpu - (before + after) // 2, (after - before + 1) // 2)
        return best
