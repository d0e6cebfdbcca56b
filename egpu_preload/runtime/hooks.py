"""Entry points libegpu_shim.so calls on module loads and handle lookups (egpu_shim.h, part 1).

The shim calls them on the application's thread, before or after (never inside) the driver call, so
they must be short and must not raise into C: an exception is reported on stderr and the original
call proceeds unchanged. Without a registered instrumenter every hook answers "no change". Once the
interpreter is finalizing the shim calls none of them (attach's first atexit handler tells it so):
loads, lookups and unloads then go straight to the driver.

The runtime registers one instrumenter (``register``). The module that does so is named by the
EGPU_RUNTIME environment variable (set by the launcher, the only place it is set); attach() imports it
once Python is up in the application.
"""

from __future__ import annotations

import atexit
import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any, Protocol

from egpu_preload import fatbin
from egpu_preload.errors import FatbinError
from egpu_preload.fatbin import ImageKind

RUNTIME_ENV = "EGPU_RUNTIME"


@dataclass(frozen=True)
class ModuleImage:
    """One module/library load or PTX link input, as the application passed it."""
    api: str             # egpu_api name without the prefix: MODULE_LOAD_DATA, LIBRARY_LOAD_DATA, ...
    call: int            # matches the module_loaded() that follows
    kind: ImageKind
    data: bytes          # the image (a wrapper's: the fatbin it points to; a file load's: the file)
    path: str | None     # file loads (cuModuleLoad, cuLibraryLoadFromFile, cuLinkAddFile)


class Instrumenter(Protocol):
    def module_load(self, image: ModuleImage) -> bytes | None:
        """A replacement image (PTX text, cubin or fatbin) for the driver to load instead, or None."""
    def module_loaded(self, api: str, call: int, handle: int, result: int,
                      replacement_result: int, jit_log: str) -> None:
        """The load finished: result and handle are the app's; replacement_result is -1 if no
        replacement was offered, else the driver's result for it (an error: the original loaded), and
        jit_log the driver's error log for it ("" if none: egpu_shim.h)."""
    def handle_found(self, api: str, owner: int, name: str | None, handle: int) -> None:
        """A function, kernel, module, link state or cubin was handed to the app (egpu_shim.h)."""
    def unloaded(self, api: str, handle: int) -> None:
        """A module or library is gone: unregister its functions before the driver reuses handles."""
    def eval_handle(self, handle: int) -> None:
        """A handle's first launch while launches count evaluated programs (egpu_shim.h)."""
    def end_counting(self, why: str) -> None:
        """``why`` is about to make a graph: patch what launches counted (egpu_shim.h)."""
    def sass_kernel(self, module: int, name: str, generation: int) -> tuple[int, int]:
        """(program mask, kernel id) of a SASS-patched kernel under a generation of patches (egpu_sass.h);
        inside the driver's launch."""
    def exec_image(self, failed: bool) -> None:
        """The process is about to exec (its image's dump, as no exit handler runs), or ``failed``: its exec
        failed and it goes on (that dump withdrawn)."""


_instrumenter: Instrumenter | None = None
_keep: dict[int, Any] = {}  # call -> replacement buffer, alive until the driver has read it
# library -> its replacement buffer: a load with CU_LIBRARY_BINARY_IS_PRESERVED (cudart may pass it) lets the
# driver read the image "at any point until cuLibraryUnload()" (lazy loading into each context).
_preserved: dict[int, Any] = {}
_shim: tuple[Any, Any] | None = None


def shim() -> tuple[Any, Any]:
    """(ffi, lib) of the loaded libegpu_shim.so: lib has the C API of egpu_shim.h part 2."""
    if _shim is None:
        raise RuntimeError("egpu: not running inside libegpu_shim.so")
    return _shim


def register(instrumenter: Instrumenter | None) -> None:
    """Install the instrumenter every later hook consults (None: back to "no change")."""
    global _instrumenter
    _instrumenter = instrumenter


def read_image(ffi: Any, address: int, size: int, path: str | None, api: str, call: int) -> ModuleImage:
    """Copy the image the application passed out of its memory, however it is given."""
    if not address:  # a file load: the driver will read the file, so may we
        try:
            data = open(path, "rb").read() if path else b""
        except OSError:
            data = b""
        return ModuleImage(api, call, fatbin.image_kind(data[:4096]), data, path)
    ptr = ffi.cast("const char *", address)
    if size:
        data = ffi.buffer(ptr, size)[:]
        return ModuleImage(api, call, fatbin.image_kind(data[:4096]), data, path)
    # Binary images announce themselves in 4 bytes; anything else is read as NUL-terminated text.
    kind = fatbin.image_kind(ffi.buffer(ptr, 4)[:])
    if kind == ImageKind.WRAPPER:
        _, fatbin_address, _ = fatbin.parse_wrapper(ffi.buffer(ptr, fatbin.WRAPPER.size)[:])
        fptr = ffi.cast("const char *", fatbin_address)
        data = ffi.buffer(fptr, fatbin.fatbin_extent(ffi.buffer(fptr, fatbin.HEADER.size)[:]))[:]
    elif kind == ImageKind.FATBIN:
        data = ffi.buffer(ptr, fatbin.fatbin_extent(ffi.buffer(ptr, fatbin.HEADER.size)[:]))[:]
    elif kind == ImageKind.ELF:
        data = ffi.buffer(ptr, fatbin.elf_extent(ffi.buffer(ptr, 64)[:]))[:]
    else:
        data = ffi.string(ptr)
        kind = fatbin.image_kind(data[:4096])
    return ModuleImage(api, call, kind, data, path)


SASS_UNKNOWN = (1 << 64) - 1   # egpu_py_sass_kernel's "no answer" (shim/egpu_sass.h)


def _report(exc_type: type, exc: BaseException, tb: Any) -> None:
    """cffi's onerror: one line, and the hook returns its "no change" default."""
    print(f"egpu: hook failed, the original call proceeds: {exc_type.__name__}: {exc}", file=sys.stderr)


def _leave_sigint_alone() -> None:
    """A program that is not Python keeps its own Ctrl-C. Python's signal module, once imported (and the
    runtime imports it), puts a handler raising KeyboardInterrupt on SIGINT wherever SIGINT was SIG_DFL,
    even in an interpreter started without signal handlers, as the shim's is: the KeyboardInterrupt then
    surfaced in the runtime's next hook ("Exception ignored") and the C program never stopped. Imported
    here, before anything else can, and put back to SIG_DFL (a handler of the program's own, or SIG_IGN,
    the module leaves as it is)."""
    import signal
    if sys.orig_argv:   # Python's own program: its KeyboardInterrupt is its own
        return
    try:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
    except ValueError:   # not the interpreter's main thread: nothing else can be done from Python
        pass


def _hold_standard_fds() -> None:
    """A program started with stdin, stdout or stderr closed (CMD <&-, >&-): the runtime's first descriptors,
    its control socket or a --trace file, took the closed number, so the program's reads of stdin waited on
    egpu's socket for ever and its writes to stdout went into it until they blocked. /dev/null holds each
    closed one, as glibc does for a setuid program; not inherited, so a program the job execs starts as it did."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)   # the lowest free number: fd, as those below it are open


def attach(ffi: Any, lib: Any) -> None:
    """Bind the shim's Python entry points (called once by the shim's init code), then import the
    runtime module that registers the instrumenter."""
    global _shim
    _shim = (ffi, lib)
    _hold_standard_fds()
    _leave_sigint_alone()
    # First: atexit runs last registered first, so this runs after every handler the runtime registers
    # (the exit dump). Past it no hook calls in: C exit handlers run after the interpreter is finalized.
    atexit.register(lib.egpu_shim_python_gone)
    # A fork that os.fork makes does the interpreter's part itself: the shim's fork handlers, which do it
    # for a fork() from C, leave it alone then (shim/process.c).
    os.register_at_fork(before=lib.egpu_shim_python_forking)

    def api_name(api: int) -> str:
        return ffi.string(ffi.cast("enum egpu_api", api)).removeprefix("EGPU_API_")

    def text(p: Any) -> str | None:
        return ffi.string(p).decode(errors="replace") if p != ffi.NULL else None

    def addr(p: Any) -> int:
        return int(ffi.cast("uintptr_t", p))

    @ffi.def_extern(onerror=_report)
    def egpu_py_start():
        """The first host-API hook asks for the runtime: attach (this function's caller) started it."""

    @ffi.def_extern(onerror=_report)
    def egpu_py_module_load(api, call, image, size, path, out_size):
        if _instrumenter is None:
            return ffi.NULL
        try:
            img = read_image(ffi, addr(image), size, text(path), api_name(api), call)
        except FatbinError as e:  # not an image we understand: the driver decides
            print(f"egpu: {api_name(api)}: {e}", file=sys.stderr)
            return ffi.NULL
        repl = _instrumenter.module_load(img)
        if repl is None:
            return ffi.NULL
        if img.kind == ImageKind.PTX or fatbin.image_kind(repl[:64]) == ImageKind.PTX:
            repl = repl.rstrip(b"\0") + b"\0"  # PTX goes to the driver NUL-terminated
        buf = ffi.new("char[]", repl)
        _keep[call] = buf
        out_size[0] = len(repl)
        return buf

    @ffi.def_extern(onerror=_report)
    def egpu_py_module_loaded(api, call, handle, result, replacement_result, jit_log):
        buf = _keep.pop(call, None)
        if buf is not None and replacement_result == 0 and api_name(api).startswith("LIBRARY_"):
            _preserved[addr(handle)] = buf
        if _instrumenter is not None:
            _instrumenter.module_loaded(api_name(api), call, addr(handle), result, replacement_result,
                                        text(jit_log) or "")

    @ffi.def_extern(onerror=_report)
    def egpu_py_handle_found(api, owner, name, handle):
        if _instrumenter is not None:
            _instrumenter.handle_found(api_name(api), addr(owner), text(name), addr(handle))
        return 1   # handled: raising returns 0, so the next lookup asks again

    @ffi.def_extern(onerror=_report)
    def egpu_py_unloaded(api, handle):
        _preserved.pop(addr(handle), None)
        if _instrumenter is not None:
            _instrumenter.unloaded(api_name(api), addr(handle))

    @ffi.def_extern(error=SASS_UNKNOWN, onerror=_report)   # a failure is no answer, not "no program"
    def egpu_py_sass_kernel(module, name, generation, kernel_id_out):
        if _instrumenter is None:
            return SASS_UNKNOWN
        mask, kernel_id_out[0] = _instrumenter.sass_kernel(addr(module), text(name) or "", int(generation))
        return mask

    @ffi.def_extern(error=1, onerror=_report)   # a failure: the handle's launches add nothing
    def egpu_py_eval_handle(handle):
        if _instrumenter is None:
            return 1
        _instrumenter.eval_handle(addr(handle))
        return 0

    @ffi.def_extern(onerror=_report)
    def egpu_py_eval_end(why):
        if _instrumenter is not None:
            _instrumenter.end_counting(text(why) or "")

    @ffi.def_extern(onerror=_report)
    def egpu_py_exec(phase):
        if _instrumenter is not None:
            _instrumenter.exec_image(phase == lib.EGPU_EXEC_FAILED)

    runtime = os.environ.get(RUNTIME_ENV)
    if runtime:
        try:
            importlib.import_module(runtime)
        except Exception as e:  # the app runs on uninstrumented
            print(f"egpu: cannot load runtime {runtime}: {type(e).__name__}: {e}", file=sys.stderr)
