"""The egpu command line: ``egpu-run`` wraps a CUDA program, ``egpu`` inspects probes and live jobs.

Every command is a thin shell over egpu_preload. What the user gets wrong is one line on stderr, never a
traceback: an EgpuError exits 1 (egpu) and a bad option or argument exits 2, as click's usage errors
do. egpu-run's own failures, bad options included, exit 125 (as env, timeout and git bisect run use
it), so they never look like the job's status, which egpu-run passes through; 126 and 127 keep their
shell meaning (CMD found but not executable, not found).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal, Optional

import typer
from typer.core import TyperCommand, TyperGroup

from egpu_preload.errors import CompileError, EgpuError
from egpu_preload.outpaths import read_input

if TYPE_CHECKING:
    from egpu_preload.bpf.program import BpfObject
    from egpu_preload.progress import Progress

# click's exception base, from wherever this typer takes click (typer 0.29 vendors it as typer._click).
ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
UsageError = typer.BadParameter.__base__
USAGE_STATUS = 2
OWN_FAILURE = 125   # egpu-run: it failed itself, the job never ran (or its status is unknown)
NO_PROGRAMS = "no programs in the object (no function in a probe section such as SEC(\"kprobe/*\"))"


class _OneLine:
    """click's command classes with every refusal as one line: ``PROG: reason`` and the status given."""

    usage_status = USAGE_STATUS   # bad options and arguments
    error_status = 1              # an EgpuError

    def main(self, args: Any = None, prog_name: Optional[str] = None, complete_var: Optional[str] = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        try:
            status = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)  # type: ignore[misc]
        except ClickException as e:
            ctx = getattr(e, "ctx", None)
            if type(e).__name__ == "NoArgsIsHelpError":   # no arguments at all: the help, as it is
                e.show()
                sys.exit(self.usage_status)
            where = ctx.command_path if ctx is not None else (prog_name or self.name)  # type: ignore[attr-defined]
            typer.echo(f"{where}: {e.format_message()} (see {where} --help)", err=True)
            sys.exit(self.usage_status if ctx is not None else self.error_status)
        except EgpuError as e:
            _echo_error(prog_name or self.name, e)   # type: ignore[attr-defined]
            sys.exit(self.error_status)
        except typer.Abort:
            sys.exit(self.error_status)
        except OSError as e:   # click says nothing of a pipe closed (EPIPE) and exits 1; a full disk was a traceback
            if not _echoing(e):
                raise
            _to_devnull(sys.stdout)
            with contextlib.suppress(OSError):
                typer.echo(f"{prog_name or self.name}: stdout: cannot write ({e.strerror or e})", err=True)
            sys.exit(self.error_status)
        sys.exit(status if isinstance(status, int) else 0)


def _echoing(e: OSError) -> bool:
    """Whether ``e`` came from writing the output (typer.echo, the innermost frame), not from a file a
    command reads or writes, whose errors are its own to name."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code is typer.echo.__code__


class _Group(_OneLine, TyperGroup):
    pass


class _RunCommand(_OneLine, TyperCommand):
    usage_status = OWN_FAILURE
    error_status = OWN_FAILURE


def _echo_error(prog: str, e: EgpuError, detail: bool = True) -> None:
    typer.echo(f"{prog}: {e}", err=True)
    if e.detail and (detail or isinstance(e, CompileError)):   # clang's own words always
        typer.echo(e.detail, err=True)


def _echo_after_job(text: str, err: bool = False, nl: bool = True) -> None:
    """egpu-run's output once the job ran. A reader that closed its pipe (egpu-run ... | head) wanted no
    more: the rest goes to /dev/null without a word, as coreutils end on SIGPIPE, and egpu-run still exits
    with the job's status, as env and timeout do (click said nothing and exited 1)."""
    try:
        typer.echo(text, err=err, nl=nl)
    except BrokenPipeError:
        _to_devnull(sys.stderr if err else sys.stdout)


def _to_devnull(stream: Any) -> None:
    """What ``stream`` (stdout or stderr, found unwritable) still buffers goes nowhere, not into a second
    error as Python flushes it at exit."""
    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())


@contextlib.contextmanager
def _done_anyway(what: Callable[[], str]) -> Iterator[None]:
    """Printing the reply of a change already made in a job: stdout full or closed (> /dev/full, | head -0)
    said only "stdout: cannot write" (a pipe closed: nothing) and exit 1, as if the change had failed, and
    the attach tried again was refused as attached already. The one line says what was done: ``what()``."""
    try:
        yield
    except OSError as e:
        _to_devnull(sys.stdout)
        raise EgpuError(f"stdout: cannot write ({e.strerror or e}): {what()}") from None


def _show_version(value: bool) -> None:
    if value:
        from egpu_preload.version import report
        typer.echo("\n".join(report()))
        raise typer.Exit(0)


_VERSION = typer.Option(False, "--version", is_eager=True, callback=_show_version,
                        help="egpu's version, the CUDA driver, GPUs and toolkit found, and the back ends usable here")

# -h as well as --help, as bpftool and bpftrace take it (click's default is --help alone); subcommands inherit it.
HELP = {"help_option_names": ["-h", "--help"]}
egpu = typer.Typer(name="egpu", cls=_Group, add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                   context_settings=HELP)


@egpu.callback()
def _egpu(version: bool = _VERSION) -> None:
    """eBPF probes inside running CUDA kernels."""


def egpu_main() -> None:
    if sys.stdout is None:   # fd 1 closed (egpu maps PID >&-): click's echo wrote nowhere, and it exited 0
        typer.echo("egpu: stdout: closed: what egpu prints would be lost (>/dev/null discards it)", err=True)
        sys.exit(1)
    egpu(prog_name="egpu")


def _path(text: str) -> Path:
    """A path argument: an empty one is refused by its option's name, not read as ``Path("")``, the current
    directory ("is a directory", or a trace written into it)."""
    if not text:
        raise typer.BadParameter("empty path")
    return Path(text)


def _glob(text: str) -> str:
    """--kernel's GLOB: an empty one (a "$K" never set) instrumented every kernel, as no --kernel does."""
    if not text:
        raise typer.BadParameter("empty glob (without --kernel every kernel is instrumented)")
    return text


def _read_ptx(path: Path) -> str:
    """A PTX module's text; EgpuError naming the file when it is not PTX (binary, empty, C++ source)."""
    from egpu_preload import fatbin
    data = read_input(path)
    kind = fatbin.image_kind(data[:4])
    if kind in (fatbin.ImageKind.FATBIN, fatbin.ImageKind.WRAPPER):
        raise EgpuError("not PTX: a fatbin (egpu inspect --extract-ptx DIR writes its PTX entries)", file=str(path))
    if kind == fatbin.ImageKind.ELF:
        raise EgpuError("not PTX: a cubin, SASS for one GPU (it has no PTX to rewrite)" if fatbin.is_cubin(data)
                        else "not PTX: an ELF file (egpu inspect lists the device code it embeds; --extract-ptx DIR "
                             "writes its PTX)", file=str(path))
    try:
        text = data.decode()
    except UnicodeDecodeError as e:
        raise EgpuError(f"not PTX: binary data (byte {e.start} is not UTF-8 text)", file=str(path)) from None
    if not re.search(r"^[\s\ufeff]*\.version\s", text, re.M):
        raise EgpuError("not PTX: no .version directive" + (" (the file is empty)" if not text.strip() else ""),
                        file=str(path))
    # ptxas refuses any, comments included; a byte-order mark before .version also hid the first kernel.
    if (m := re.search(r"[^\x00-\x7f]", text)) is not None:
        line = text.count("\n", 0, m.start()) + 1
        raise EgpuError(f"not PTX: non-ASCII character {m.group()!r} on line {line} (ptxas accepts none, not even "
                        "in comments)", file=str(path))
    return text


def _probe_object(path: Path) -> "BpfObject":
    """A .bpf.o with at least one program, or a .bpf.c compiled first as egpu-run compiles one (clang's
    warnings on stderr; the object into a folder removed at exit): the commands take what egpu-run takes."""
    from egpu_preload.bpf.elf import load_object
    from egpu_preload.bpf.lineinfo import located
    obj = path
    if path.name.endswith(".c"):
        from egpu_preload.bpf.compile import compile_probe
        folder = tempfile.TemporaryDirectory(prefix="egpu-compile-")
        _COMPILED.append(folder)
        obj = compile_probe(path, Path(folder.name) / f"{path.name.removesuffix('.c')}.o",
                            warn=lambda text: typer.echo(text, err=True))
    try:
        bpf = load_object(obj)
    except EgpuError as e:   # named as the user named it, never the compiled copy
        raise located(e, b"", str(path)) from None
    if not bpf.programs:
        raise EgpuError(NO_PROGRAMS, file=str(path))
    return bpf


_COMPILED: list[tempfile.TemporaryDirectory] = []   # the objects _probe_object compiled, kept until exit


def _verified(path: Path, bpf: "BpfObject") -> list:
    """Each program of ``bpf`` (``path``'s, as the user named it) verified; a refusal names the source line
    when the object has line info."""
    from egpu_preload.runtime.probes import verify_each
    try:
        return verify_each(bpf, str(path))
    except EgpuError as e:
        raise _named(e, path, bpf) from None


def _named(e: EgpuError, path: Path, bpf: "BpfObject") -> EgpuError:
    """``e``, raised on ``bpf`` (``path``'s object, or the copy compiled from it), named as the user named it:
    by the source line where the object's line info has it, never by the compiled copy, which is gone at exit."""
    from egpu_preload.bpf.lineinfo import located
    return located(e, read_input(Path(bpf.path)), str(path))


@egpu.command()
def inspect(binary: Path = typer.Argument(..., metavar="BINARY", parser=_path,
                                          help="an executable, library, object, static archive (.a) or fatbin"),
            extract_ptx: Optional[Path] = typer.Option(None, "--extract-ptx", metavar="DIR", parser=_path,
                                                       help="write every PTX entry into DIR")) -> None:
    """List the fatbin entries of a binary (like cuobjdump -lelf -lptx)."""
    from egpu_preload import fatbin
    from egpu_preload.outpaths import check_output_dir
    if extract_ptx is not None:
        check_output_dir(extract_ptx)
    data = read_input(binary)
    try:
        found = fatbin.find_in_file(data)
    except EgpuError as e:
        raise e.where(file=str(binary))
    if not any(fatbins for _, fatbins in found):
        raise EgpuError("no CUDA device code (no fatbin in it)", file=str(binary))
    for member, fatbins in found:
        if member:
            typer.echo(f"{member}:")
        for line in fatbin.listing(fatbins):
            typer.echo(f"  {line}" if member else line)
    if extract_ptx is not None:
        try:
            for member, fatbins in found:
                stem = f"{binary.name}.{member}" if member else binary.name
                for path in fatbin.write_ptx(fatbins, extract_ptx, stem):
                    typer.echo(f"wrote {path}")
        except OSError as e:
            raise EgpuError(f"cannot write ({e.strerror})", file=e.filename or str(extract_ptx)) from None
        except EgpuError as e:   # an entry whose PTX does not decode: only here is it read
            raise e.where(file=str(binary))


@egpu.command("compile")
def compile_cmd(ctx: typer.Context,
                source: Optional[Path] = typer.Argument(None, metavar="X.bpf.c", parser=_path, show_default=False),
                output: Optional[Path] = typer.Option(None, "-o", "--output", metavar="FILE", parser=_path,
                                                      help="default: X.bpf.c -> X.bpf.o"),
                mcpu: Literal["v3", "v4"] = typer.Option("v3", "--mcpu", metavar="v3|v4",
                                                         help="eBPF ISA version for clang"),
                include: list[Path] = typer.Option([], "-I", "--include", metavar="DIR", parser=_path,
                                                   help="add DIR to the include path (a vmlinux.h's, say); "
                                                        "repeatable"),
                cflags: bool = typer.Option(False, "--cflags",
                                            help="print the clang flags a probe needs here (with --mcpu's "
                                                 "ISA and the -I directories), for a build of your own "
                                                 "(clang $(egpu compile --cflags) -c X.bpf.c), and exit")
                ) -> None:
    """Compile a probe with clang (-O2 -g -target bpf) and egpu.bpf.h on the include path; clang's warnings
    go to stderr as clang prints them. An object egpu cannot load, or without programs, is refused (exit 1)
    and removed."""
    from egpu_preload.bpf.compile import clang_flags, compile_probe
    if cflags:   # it exited first, and --mcpu v4 and -I DIR printed flags without them
        if source is not None or output is not None:
            raise UsageError("--cflags compiles nothing: it takes no X.bpf.c and no -o", ctx=ctx)
        import shlex
        typer.echo(shlex.join(clang_flags(mcpu, include)))
        return
    if source is None:
        raise UsageError("Missing argument 'X.bpf.c'.", ctx=ctx)
    from egpu_preload.bpf.elf import load_object
    out = compile_probe(source, output, mcpu=mcpu, warn=lambda text: typer.echo(text, err=True), include=include)
    try:
        if not load_object(out).programs:   # egpu-run would refuse it: say so now
            raise EgpuError(NO_PROGRAMS, file=str(source))
    except EgpuError:   # left behind, it looked built to make, and only egpu-run refused it, later
        out.unlink(missing_ok=True)
        raise
    typer.echo(str(out))


@egpu.command("disasm")
def disasm_cmd(obj: Path = typer.Argument(..., metavar="PROBE", parser=_path, help="a .bpf.o or .bpf.c")) -> None:
    """Print each program of a probe object in llvm-objdump's syntax, after relocation."""
    from egpu_preload.bpf.disasm import object_listing
    typer.echo(object_listing(_probe_object(obj)))


@egpu.command("verify")
def verify_cmd(obj: Path = typer.Argument(..., metavar="PROBE", parser=_path, help="a .bpf.o or .bpf.c")) -> None:
    """Verify each program of a probe object; a refusal prints where (the source line when the object has
    line info), why and the verifier log (exit 1). Then the loops of directly-run programs bounded at run
    time, the maps the GPU keeps in rows per SM (counters only ever added to) and where its host programs
    run (the shim's C interpreter or the Python VM)."""
    from egpu_preload.bpf.sections import API_KINDS, HOST_KINDS
    from egpu_preload.bpf.verifier import budget_note
    from egpu_preload.runtime import native, uprobes
    from egpu_preload.runtime.probes import host_only_refusal
    from egpu_preload.translate.devmaps import layout
    from egpu_preload.translate.striping import stripe_counters
    from egpu_preload.translate.rewrite import probe_specs
    bpf = _probe_object(obj)
    verified = _verified(obj, bpf)
    try:   # what egpu-run refuses after the verifier, egpu verify refuses too: "ok" promises the probe loads
        host_only_refusal(bpf)
        probe_specs(bpf, verified)
    except EgpuError as e:
        raise _named(e, obj, bpf) from None
    for prog, v in zip(bpf.programs, verified):
        typer.echo(f"prog {prog.name} ({prog.section}): ok, {len(v.insns)} insns")
        if v.budgeted:
            typer.echo(f"prog {prog.name} ({prog.section}): {budget_note(v)}")
    try:
        stripe_counters(bpf, verified)
        for m in bpf.maps:
            if m.stripe:
                rows = layout(m).spread
                typer.echo(f"map {m.name}: only added to ({m.stripe}-byte adds): {rows} row{'s' * (rows > 1)} "
                           "per SM, summed when read")
        host, used, _ = native.host_side(bpf)
        why = native.refusal(host, bpf.maps, used) if host else None
        for prog in uprobes.host_programs(bpf):
            on = prog.attach.glob or f"the function egpu-run --uprobe {prog.name}=PATH:SYMBOL names"
            typer.echo(f"prog {prog.name} ({prog.section}): host uprobe on {on}" if why is None else
                       f"prog {prog.name} ({prog.section}): not attached: uprobes run in C only, and {why}")
        others = [p for p in host if p.attach.kind not in HOST_KINDS and p.attach.kind not in API_KINDS]
        if others:
            what = "launch programs" if all(p.attach.kind == "launch" for p in others) else "host programs"
            typer.echo(f"{what}: in C (the shim's interpreter)" if why is None
                       else f"{what}: on the Python VM ({why})")
        if any(p.attach.kind in API_KINDS for p in host):
            api_why = native.api_refusal(bpf)
            if api_why is not None:
                raise EgpuError(api_why)
            typer.echo("host-API programs: in C, in the hooks")
    except EgpuError as e:
        raise _named(e, obj, bpf) from None


@egpu.command("ptx")
def ptx_cmd(obj: Path = typer.Argument(..., metavar="PROBE", parser=_path, help="a .bpf.o or .bpf.c")) -> None:
    """Print the PTX module a probe object becomes (each program verified, then translated)."""
    from egpu_preload.runtime.probes import host_only_refusal
    from egpu_preload.translate import probe_object_ptx
    bpf = _probe_object(obj)
    _verified(obj, bpf)
    try:
        host_only_refusal(bpf)
        typer.echo(probe_object_ptx(bpf), nl=False)
    except EgpuError as e:
        raise _named(e, obj, bpf) from None


def _integer(text: str) -> int:
    """A number as int() reads it (typer's own int took "0.0" as 0: see _pid)."""
    try:
        return int(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not an integer") from None


def _dim3(text: Optional[str]) -> Optional[tuple[int, int, int]]:
    """--grid's and --block's X[,Y[,Z]]: the axes left out are 1."""
    if text is None:
        return None
    parts = text.split(",")
    if len(parts) > 3 or not all(p.strip().isdigit() for p in parts):
        raise typer.BadParameter(f"{text!r} is not X[,Y[,Z]] (whole numbers)")
    x, y, z = [int(p) for p in parts] + [1] * (3 - len(parts))
    return x, y, z


@egpu.command("run-on-gpu", no_args_is_help=True)
def run_on_gpu_cmd(ctx: typer.Context,
                   obj: Path = typer.Argument(..., metavar="PROBE", parser=_path, help="a .bpf.o or .bpf.c"),
                   name: str = typer.Argument(..., metavar="PROG", help="the program (its function's name)"),
                   numbers: Optional[list[int]] = typer.Argument(
                       None, metavar="[COUNT [GX GY GZ BX BY BZ]]", parser=_integer, show_default=False,
                       help="bpftimetool run-on-cuda's numbers: launches (default 1), then grid and block"),
                   grid: Optional[str] = typer.Option(None, "--grid", metavar="X[,Y,Z]", callback=_dim3,
                                                      help="blocks in the grid (default 1)"),
                   block: Optional[str] = typer.Option(None, "--block", metavar="X[,Y,Z]", callback=_dim3,
                                                       help="threads in a block (default 1)"),
                   maps_file: Optional[Path] = typer.Option(None, "--maps", metavar="FILE", parser=_path,
                                                            help="fill the maps first from FILE, a document as "
                                                                 "--json and egpu maps --json print it"),
                   on_vm: bool = typer.Option(False, "--vm", help="run on egpu's reference VM, not the GPU (one "
                                                                  "thread at a time; needs no GPU)"),
                   as_json: bool = typer.Option(False, "--json", help="the maps as one JSON document")) -> None:
    """Run one GPU program as a kernel of its own, as bpftimetool run-on-cuda runs bpftime's
    kprobe/__directly_run programs: verified, translated, launched COUNT times over the grid (every thread
    calls it with a zeroed context and reads its own indices), then the maps and bpf_printk lines printed.
    bpftime's spelling, egpu run-on-cuda, is taken too."""
    from egpu_preload.bpf.ctx import SIZE as CTX_SIZE
    from egpu_preload.bpf.sections import HOST_SIDE
    from egpu_preload.maps import MapsState
    from egpu_preload.output import json as json_out
    from egpu_preload.output import text as text_out
    from egpu_preload.output.values import snapshot
    from egpu_preload.runtime.probes import host_only_refusal
    from egpu_preload.translate.devmaps import NoRow
    from egpu_preload.translate.striping import stripe_counters
    from egpu_preload.vm.thread import launch_refusal
    numbers = numbers or []
    if len(numbers) not in (0, 1, 7):
        raise UsageError(f"{len(numbers)} numbers after PROG: COUNT, or COUNT and GX GY GZ BX BY BZ", ctx=ctx)
    if len(numbers) == 7 and (grid or block):
        raise UsageError("the grid and block are given twice: as numbers and as --grid/--block", ctx=ctx)
    launches = numbers[0] if numbers else 1
    if launches < 1:
        raise UsageError(f"COUNT is {launches}: launch at least once", ctx=ctx)
    grid = tuple(numbers[1:4]) if numbers[1:] else grid or (1, 1, 1)
    block = tuple(numbers[4:7]) if numbers[1:] else block or (1, 1, 1)
    why = launch_refusal(grid, block)
    if why is not None:
        raise UsageError(why, ctx=ctx)
    doc = None
    if maps_file is not None:
        try:
            doc = json_out.read(read_input(maps_file).decode("utf-8", "replace"))
        except EgpuError as e:
            raise UsageError(f"--maps {maps_file}: {e.reason}", ctx=ctx) from None
    bpf = _probe_object(obj)
    program = next((p for p in bpf.programs if p.name == name), None)
    if program is None:
        raise EgpuError(f"no program named {name} (its programs: {', '.join(p.name for p in bpf.programs)})",
                        file=str(obj))
    if program.attach.kind in HOST_SIDE or program.attach.scope != "thread":
        what = (f"a host program ({program.attach.kind}: egpu-run runs it on the host)"
                if program.attach.kind in HOST_SIDE else
                f"a {program.attach.scope} probe (one thread of each {program.attach.scope} at a kernel's sites)")
        raise EgpuError(f"prog {name} ({program.section}): {what}; run-on-gpu runs a program in every thread",
                        file=str(obj))
    one = dataclasses.replace(bpf, programs=[program])   # the others are neither verified nor run
    (verified,) = _verified(obj, one)
    try:   # the GPU keeps no QUEUE, STACK or BLOOM_FILTER map: --vm runs no program the GPU refuses
        host_only_refusal(one)
    except EgpuError as e:
        raise _named(e, obj, one) from None
    stripe_counters(one, [verified])
    state = MapsState(one.maps)
    if doc is not None:
        try:
            json_out.fill(state, one, doc)
        except EgpuError as e:
            raise UsageError(f"--maps {maps_file}: {e.reason}", ctx=ctx) from None
    if not on_vm:
        from egpu_preload.version import cuda_driver
        if cuda_driver() is None:
            raise EgpuError("no CUDA driver (libcuda.so.1 not found): --vm runs the program on egpu's reference "
                            "VM instead")
    try:
        if on_vm:
            from egpu_preload.vm import Vm
            Vm(program.code, one.maps, state, compiled=True, budgeted=verified.budgeted).run_grid(
                grid, block, bytes(CTX_SIZE), launches)
        else:
            from egpu_preload.translate.execute import run_grid_on_gpu
            state = run_grid_on_gpu(one, program, grid, block, launches=launches, state=state)
    except NoRow as e:   # the values came from --maps: a document of a GPU with more SMs
        raise UsageError(f"--maps {maps_file}: {e.reason}", ctx=ctx) from None
    except EgpuError as e:
        raise _named(e.where(section=program.section), obj, one) from None
    if state.loops_cut:   # each such run ended as helper 507 ends one: its maps hold what it did up to there
        from egpu_preload.bpf.verifier import LOOP_BUDGET
        typer.echo(f"egpu: {state.loops_cut} run{'s' * (state.loops_cut > 1)} of {name} cut by the loop budget "
                   f"({LOOP_BUDGET} backward jumps a run)", err=True)
    snap = snapshot(state, one)
    if as_json:
        typer.echo(json_out.render(snap, time=time.time(), pid=os.getpid()), nl=False)
        return
    out = text_out.render(snap)
    if not out:   # bpftrace's way prints nothing: say so, as egpu maps does
        typer.echo(f"egpu: every map is empty and {name} printed nothing", err=True)
    typer.echo(out, nl=False)


# bpftimetool's spelling of the same command, for bpftime's READMEs typed as they are
egpu.command("run-on-cuda", no_args_is_help=True, hidden=True)(run_on_gpu_cmd)


def _field_values(conditions: list[str]) -> list[str]:
    """--where's FIELD=VALUE, its form checked as --limit's number is (a usage error, exit 2; it exited 1,
    as a trace it could not read); which fields there are, the trace file says."""
    for cond in conditions:
        field, eq, _ = cond.partition("=")
        if not field or not eq:
            raise typer.BadParameter(f"{cond!r} is not FIELD=VALUE")
    return conditions


@egpu.command("trace")
def trace_cmd(ctx: typer.Context,
              path: Path = typer.Argument(..., metavar="FILE", parser=_path, help="a trace egpu-run --trace wrote"),
              conditions: list[str] = typer.Option([], "--where", metavar="FIELD=VALUE", callback=_field_values,
                                                    help="only records where FIELD is VALUE (repeatable: all hold)"),
              limit: Optional[int] = typer.Option(None, "--limit", metavar="N", min=0, help="the first N records"),
              as_json: bool = typer.Option(False, "--json", help="one JSON object per record"),
              perfetto: Optional[Path] = typer.Option(None, "--perfetto", metavar="OUT", parser=_path,
                                                      help="records with a ts field as a trace for ui.perfetto.dev"),
              parquet: Optional[Path] = typer.Option(None, "--parquet", metavar="OUT", parser=_path,
                                                     help="the records as a Parquet trace file (from an .arrow one: "
                                                          "smaller, read by more tools)")) -> None:
    """Print a trace file's records (one line each, in each map's order), filtered, or convert them."""
    from egpu_preload.output import tracefile
    outputs = [o for o, given in (("--json", as_json), ("--perfetto", perfetto), ("--parquet", parquet)) if given]
    if len(outputs) > 1:   # one output each run: the others were silently ignored
        raise UsageError(f"{' and '.join(outputs)} exclude each other: one output at a time", ctx=ctx)
    _no_overwrite({"--perfetto": perfetto, "--parquet": parquet}, {path: "the trace file it reads"})
    trace = tracefile.read(path, {} if parquet is not None else tracefile.EXPANDERS)   # converted as recorded
    table = tracefile.where(trace.rows, conditions, str(path))   # a refusal before any note: its one line
    if not trace.complete:
        typer.echo(f"egpu: {path}: its job never closed the trace (died?): {trace.rows.num_rows} records read, "
                   "the probes' dropped counts unknown", err=True)
    elif not trace.rows.num_rows:   # printing nothing looked like a filter that matched nothing
        maps = ", ".join(f"@{m}" for m in sorted({*trace.dropped, *trace.record_types}))
        typer.echo(f"egpu: {path} holds no records" + (f" (a trace of {maps})" if maps else ""), err=True)
    if parquet is not None:
        table = table if limit is None else table.slice(0, limit)
        try:
            tracefile.to_parquet(tracefile.Trace(table, trace.record_types, trace.dropped, trace.complete),
                                 parquet)
        except OSError as e:
            raise EgpuError(f"cannot write: {e.strerror or e}", file=str(parquet)) from None
        typer.echo(f"egpu: {table.num_rows} records in {parquet}", err=True)
        return
    rows = tracefile.rows(table, limit)
    if perfetto is not None:
        n = tracefile.to_perfetto(rows, perfetto, str(path))
        typer.echo(f"egpu: {n} records with a ts in {perfetto}", err=True)
    else:
        render = tracefile.json_line if as_json else tracefile.text_line
        for r in rows:
            typer.echo(render(r))
    # on stderr whatever the output: a trace with holes answers questions wrongly without saying so
    for name, n in sorted(trace.dropped.items()):
        if n:
            typer.echo(f"@{name}: {n} records dropped by the probes (the ring was full)", err=True)


# Why a kernel a memory probe matched may still have no site (docs/sass-backend.md): the PTX back end
# sees the kernel's own ld/st/atom/red/cp.async on global or generic addresses only.
NO_SITE_HINT = ("memory probes see ld/st/atom/red/cp.async of global or generic addresses in the kernel's "
                "own body: not wmma/mma fragments, not accesses inside device functions it calls (as under "
                "nvcc -G); --backend sass reaches those")


@egpu.command("rewrite")
def rewrite_cmd(ptx_in: Path = typer.Argument(..., metavar="IN.ptx", parser=_path),
                probes: list[Path] = typer.Option(..., "-p", "--probe", metavar="PROBE", parser=_path,
                                                  help="a .bpf.o or .bpf.c (repeatable)"),
                output: Optional[Path] = typer.Option(None, "-o", "--output", metavar="FILE", parser=_path,
                                                      help="default: stdout")) -> None:
    """Instrument the kernels of a PTX module with probes; per-kernel status (and why a kernel is left
    alone) goes to stderr. A kernel the rewriter cannot handle fails the command (exit 1, nothing written)."""
    from egpu_preload.outpaths import check_output_file
    from egpu_preload.runtime.probes import load_user_probe
    from egpu_preload.translate.rewrite import instrument
    if output is not None:
        check_output_file(output)
    text = _read_ptx(ptx_in)
    _each_once(probes)
    _no_overwrite({"-o": output}, dict.fromkeys(probes, "a probe given with -p"))   # IN.ptx itself: in place
    specs = []
    with tempfile.TemporaryDirectory(prefix="egpu-rewrite-") as tmp:
        for i, p in enumerate(probes):
            mine = load_user_probe(p, Path(tmp) / f"{i}.{p.name.removesuffix('.c')}.o", progress=_notes()).specs
            if not mine:   # else every kernel reads "no probe matches", as if a glob were wrong
                typer.echo(f"egpu: {p}: no kernel-site program to splice (launch, uprobe and host-API programs "
                           "run on the host, under egpu-run)", err=True)
            specs += mine
    try:
        res = instrument(text, specs)
    except EgpuError as e:
        raise e.where(file=str(ptx_in))
    for k in res.kernels:
        why = k.reason + (f" ({NO_SITE_HINT})" if k.reason.startswith("no sites") else "")
        typer.echo(f"{k.name}: {k.status}" + (f" ({k.calls} calls)" if k.calls else "") + (f": {why}" if why else ""),
                   err=True)
    failed = [k for k in res.kernels if k.status == "failed"]
    if failed:
        raise EgpuError(f"{len(failed)} of {len(res.kernels)} kernels could not be rewritten (first: "
                        f"{failed[0].name}: {failed[0].reason}); nothing written", file=str(ptx_in))
    if not res.kernels:
        raise EgpuError("no kernels in the module (no .entry)", file=str(ptx_in))
    if output is None:
        typer.echo(res.text, nl=False)
        return
    try:
        output.write_text(res.text)
    except OSError as e:
        raise EgpuError(f"cannot write ({e.strerror})", file=str(output)) from None


def _each_once(probes: list[Path]) -> None:
    """EgpuError for a probe named twice: each -p attaches a copy, so its programs would run twice."""
    seen: set[Path] = set()
    for p in probes:
        if p.resolve() in seen:
            raise EgpuError("given twice (-p): its programs would run twice", file=str(p))
        seen.add(p.resolve())


def _no_overwrite(outputs: dict[str, Optional[Path]], inputs: dict[Path, str]) -> None:
    """EgpuError for an output (option: path) that is an input (path: what it is) or another output:
    egpu-run --trace unlinks its FILE before the job and --perfetto writes over its FILE after it, so a probe
    named there was lost (the job ran without it), and of two outputs in one file only the last was left."""
    taken = {p.resolve(): f"{what}: it would be overwritten" for p, what in inputs.items()}
    for option, path in outputs.items():
        if path is None:
            continue
        if path.resolve() in taken:
            raise EgpuError(f"{option} names {taken[path.resolve()]}", file=str(path))
        taken[path.resolve()] = f"the {option} file too: one would overwrite the other"


def _notes(steps: bool = False, prefix: str = "egpu") -> "Progress":
    """A Progress for the command's stderr: clang's warnings always, long steps when ``steps``."""
    from egpu_preload.progress import Progress
    return Progress(prefix, steps=steps)


# ---- live control of running jobs (egpu_preload/runtime/live.py in the job, remote.py here) ----

@egpu.command("ps")
def ps_cmd(as_json: bool = typer.Option(False, "--json", help="one JSON list")) -> None:
    """List the processes with an egpu session (stale sockets are removed)."""
    from egpu_preload.control import list_sessions
    from egpu_preload.runtime import remote
    sessions = list_sessions()
    typer.echo(remote.ps_json(sessions) if as_json else "\n".join(remote.ps_lines(sessions)))


def _pid(text: str) -> int:
    """A process id as int() reads it: typer's own int also took "0.0" as process 0 (found by
    tests/test_cli_fuzz.py). Zero and below are no process's: -5 was looked up ("no egpu session in
    process -5", exit 1) as if one could have a session."""
    try:
        pid = int(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a process id") from None
    if pid <= 0:
        raise typer.BadParameter(f"{text!r} is not a process id (a positive number)")
    return pid


_PID = typer.Argument(..., metavar="PID", parser=_pid, help="a process with an egpu session (egpu ps), or its job's")
_RANK = typer.Option(None, "--rank", metavar="R",
                     help="PID is the job's (egpu-run's, torchrun's): address its process of rank R")
_ALL = typer.Option(False, "--all", help="PID is the job's: address every process of it")


def _one(pid: int) -> int:
    """The process a single-process command addresses: PID, or the one process of egpu-run PID's job."""
    from egpu_preload.runtime import ranks
    return ranks.select(pid)[0].pid


@contextlib.contextmanager
def _interruptible(cmd: str, pids: list[int], asked: Optional[set[int]] = None) -> Iterator[None]:
    """Ctrl-C while jobs work on ``cmd``: egpu stops waiting, they do not, so it says what may still happen
    in each process ``asked`` (default: all) and exits 130 as a shell's interrupted command does (typer's
    own exit said nothing)."""
    try:
        yield
    except KeyboardInterrupt:
        asked = set(pids) if asked is None else asked
        sent, unsent = [p for p in pids if p in asked], [p for p in pids if p not in asked]
        if unsent:
            typer.echo(f"egpu: interrupted before the {cmd} was asked of {', '.join(map(str, unsent))}: nothing "
                       "changed there", err=True)
        if sent:
            after = "" if cmd in ("maps", "modules") else f": the {cmd} may still complete there"
            if cmd in ("attach", "detach", "swap"):
                after += " (egpu ps lists the probes attached)"
            typer.echo(f"egpu: interrupted while waiting for {', '.join(map(str, sent))}{after}", err=True)
        raise typer.Exit(130) from None


def _each(pid: int, rank: Optional[int], every: bool, cmd: str, fn: Callable[[int], Any],
          asked: Optional[set[int]] = None) -> tuple[list[tuple[Any, Any]], bool]:
    """fn(pid) in each process addressed (runtime/ranks.py), all at once: ((target, reply) of those that
    answered, whether any failed); each failure is one line on stderr. ``asked``: see _interruptible."""
    from egpu_preload.runtime import ranks
    if rank is not None and every:   # a usage error, as --per-rank with --sum (it exited 1, as a job's failure)
        raise UsageError("--rank and --all exclude each other: --rank R addresses one process, --all every one")
    targets = ranks.select(pid, rank, every)
    with _interruptible(cmd, [t.pid for t in targets], asked):
        results = ranks.fan_out(targets, fn)
    for _, r in results:
        if isinstance(r, EgpuError):
            typer.echo(f"egpu: {r}", err=True)
    done = [(t, r) for t, r in results if not isinstance(r, EgpuError)]
    return done, len(done) < len(results)


_VERBOSE = typer.Option(False, "-v", "--verbose", help="with a refused probe, the verifier's log")


def _checked_probe(path: Path, progress: "Progress", verbose: bool) -> tuple[bytes, str]:
    """remote.probe_object; a refusal keeps its verifier log only when ``verbose`` (clang's words always)."""
    from egpu_preload.runtime import remote
    try:
        return remote.probe_object(path, progress)
    except EgpuError as e:
        if not verbose and not isinstance(e, CompileError):
            e.detail = None
        raise


def _name_for(probe: Path, name: Optional[str]) -> str:
    """The name a probe attaches as: ``name`` (--name), else its file name's; checked here, before clang
    and the verifier run, as the job checks it (a file name with a space or non-ASCII letters makes none)."""
    from egpu_preload.runtime.live import NAME_RULE, name_ok, probe_name
    if name is not None:
        if not name_ok(name):
            raise typer.BadParameter(f"bad probe name {name!r}: {NAME_RULE}", param_hint="'--name'")
        return name
    default = probe_name(probe)
    if not name_ok(default):
        raise EgpuError(f"its file name makes no probe name ({default!r}; a name is {NAME_RULE}): "
                        "give one with --name NAME", file=str(probe))
    return default


def _rank_prefix(target: Any) -> str:
    return "" if target.rank is None else f"rank {target.rank}: "


def _maps_doc(target: Any, reply: dict) -> dict:
    """A detach's or swap's final maps as a dump-like document of the process it came from."""
    return {**reply, "pid": target.pid, "rank": target.rank, "probes": reply["final"], "kernels": reply["kernel_names"]}


def _final_maps(cmd: str, done: list[tuple[Any, Any]], as_json: bool) -> None:
    """What a detach or swap changed (stderr), then the final maps of the probes it removed; maps all empty
    print nothing (bpftrace's way), so a line on stderr says so, as egpu maps and egpu-run say it."""
    from egpu_preload.runtime import job, remote
    for t, reply in done:
        typer.echo(_rank_prefix(t) + remote.change_line(cmd, t.pid, reply), err=True)
        if not as_json and not job.render([], [_maps_doc(t, reply)], False):
            removed = ", ".join(reply["names"] if cmd == "detach" else [reply["old"]])
            typer.echo(f"egpu: {_rank_prefix(t)}every map of {removed} was empty", err=True)
    typer.echo(job.render([], [_maps_doc(t, r) for t, r in done], as_json), nl=False)


@egpu.command("attach")
def attach_cmd(pid: int = _PID, probe: Path = typer.Option(..., "-p", "--probe", metavar="PROBE", parser=_path,
                                                           help="a .bpf.o or .bpf.c"),
               name: Optional[str] = typer.Option(None, "--name", metavar="NAME",
                                                  help="default: the file name without .bpf.o"),
               as_json: bool = typer.Option(False, "--json", help="each process's reply as one JSON document"),
               rank: Optional[int] = _RANK, every: bool = _ALL, verbose: bool = _VERBOSE) -> None:
    """Attach a probe to a running job: verified here, then loaded, translated and spliced in there. A step
    that takes more than a second says what it waits for."""
    from egpu_preload.runtime import remote
    progress = _notes(steps=True)
    name = _name_for(probe, name)
    data, _ = _checked_probe(probe, progress, verbose)

    asked: set[int] = set()

    def attach(p: int) -> Any:
        loaded = len(remote.request(p, "modules")["modules"])
        with progress.step(f"waiting for {p}: translating {probe.name} and JIT-compiling {loaded} "
                           f"module{'s' * (loaded != 1)} with it"):
            asked.add(p)
            return remote.request(p, "attach", probe=data, name=name)
    done, failed = _each(pid, rank, every, "attach", attach, asked)
    with _done_anyway(lambda: f"{name} was attached to {', '.join(str(t.pid) for t, _ in done)} all the same "
                              "(egpu ps lists the probes attached)"):
        for t, reply in done:
            typer.echo(json.dumps({"pid": t.pid, "rank": t.rank, **reply}) if as_json
                       else _rank_prefix(t) + remote.change_line("attach", t.pid, reply))
    raise typer.Exit(int(failed))


@egpu.command("detach")
def detach_cmd(pid: int = _PID, probe: Optional[str] = typer.Argument(None, metavar="PROBE",
                                                                help="its name (default: every probe)"),
               as_json: bool = typer.Option(False, "--json", help="the final maps as JSON"),
               rank: Optional[int] = _RANK, every: bool = _ALL) -> None:
    """Detach one probe (or all) from a running job and print its final maps (per rank, and summed)."""
    from egpu_preload.runtime import remote
    done, failed = _each(pid, rank, every, "detach",
                         lambda p: remote.request(p, "detach", **({"name": probe} if probe else {})))
    _final_maps("detach", done, as_json)
    raise typer.Exit(int(failed))


@egpu.command("swap")
def swap_cmd(pid: int = _PID, old: str = typer.Argument(..., metavar="OLD", help="the attached probe's name"),
             new: Path = typer.Argument(..., metavar="NEW", parser=_path, help="the new probe, a .bpf.o or .bpf.c"),
             name: Optional[str] = typer.Option(None, "--name", metavar="NAME",
                                                help="NEW's name (default: the file name without .bpf.o)"),
             as_json: bool = typer.Option(False, "--json", help="OLD's final maps as JSON"),
             rank: Optional[int] = _RANK, every: bool = _ALL, verbose: bool = _VERBOSE) -> None:
    """Replace an attached probe with another in one step: every launch runs one of them. Prints OLD's final
    maps, as detach does (the line saying what changed goes to stderr)."""
    from egpu_preload.runtime import remote
    name = _name_for(new, name)
    try:
        data, _ = _checked_probe(new, _notes(steps=True), verbose)
    except EgpuError as e:   # the reason, and that the job is as it was, in its one line
        e.reason += f"; nothing was changed in {pid}: what was attached runs on"
        raise
    done, failed = _each(pid, rank, every, "swap",
                         lambda p: remote.request(p, "swap", old=old, new_probe=data, new_name=name))
    _final_maps("swap", done, as_json)
    raise typer.Exit(int(failed))


@egpu.command("maps")
def maps_cmd(pid: int = _PID, as_json: bool = typer.Option(False, "--json", help="one JSON document"),
             rank: Optional[int] = _RANK, every: bool = _ALL,
             from_mirror: bool = typer.Option(False, "--mirror", help="read the copy the job keeps in shared "
                                              "memory (asks the job nothing; as of its last copy)")) -> None:
    """Print the maps of the probes attached to a running job (read without stopping it); of several
    ranks: each, then their sum."""
    from egpu_preload.runtime import job, mirror, remote
    read = (lambda p: mirror.read_mirror(p)[0]) if from_mirror else remote.maps
    done, failed = _each(pid, rank, every, "maps", read)
    out = job.render([], [doc for _, doc in done], as_json)
    for t, doc in done:
        if not doc["probes"]:
            typer.echo(f"egpu: no probe is attached to {t.pid}", err=True)
            if as_json:   # still one document per process, as --json promises: its maps none
                from egpu_preload.output import json as json_out
                from egpu_preload.output.values import Snapshot, Trace
                out += json_out.render(Snapshot((), Trace(())), time=time.time(), pid=t.pid, rank=t.rank)
        elif not as_json and not job.render([], [doc], False):   # bpftrace's way: empty maps print nothing
            typer.echo(f"egpu: every map of the probes attached to {t.pid} is empty", err=True)
    typer.echo(out, nl=False)
    raise typer.Exit(int(failed))


@egpu.command("modules")
def modules_cmd(pid: int = _PID, as_json: bool = typer.Option(False, "--json", help="one JSON document")) -> None:
    """Every module a running job loaded and each kernel: instrumented, SASS only, failed (why), untouched."""
    from egpu_preload.runtime import remote
    target = _one(pid)
    with _interruptible("modules", [target]):
        reply = remote.request(target, "modules")
    typer.echo(json.dumps(reply) if as_json else "\n".join(remote.modules_lines(reply)))


# ---- checkpoint and restore (egpu_preload/cow/: live.py and restore.py in the job, remote.py here) ----

@egpu.command("checkpoint")
def checkpoint_cmd(pid: int = _PID, directory: Path = typer.Argument(..., metavar="DIR", parser=_path,
                                                                      help="must not exist yet"),
                   stop_the_world: bool = typer.Option(False, "--compare-stop-the-world",
                                                       help="then copy the same bytes with the job stopped "
                                                            "and report how long that held it"),
                   as_json: bool = typer.Option(False, "--json", help="the reply as one JSON document")) -> None:
    """Snapshot a running job's device memory and module globals into DIR while it keeps running. The
    reply says what it left out (pinned host memory, modules without PTX): such a snapshot is partial."""
    from egpu_preload.cow import remote
    target = _one(pid)
    with _interruptible("checkpoint", [target]):
        reply = remote.checkpoint(target, directory, stop_the_world)
    with _done_anyway(lambda: f"the checkpoint of {target} in {reply['dir']} was made all the same"):
        typer.echo(json.dumps(reply) if as_json else remote.checkpoint_line(target, reply))


@egpu.command("restore")
def restore_cmd(pid: int = _PID, directory: Path = typer.Argument(..., metavar="DIR", parser=_path),
                as_json: bool = typer.Option(False, "--json", help="the reply as one JSON document")) -> None:
    """Roll a running job back to a checkpoint (its streams drained, then every allocation written back)."""
    from egpu_preload.cow import remote
    target = _one(pid)
    with _interruptible("restore", [target]):
        reply = remote.restore(target, directory)
    with _done_anyway(lambda: f"{target} was restored from {reply['dir']} all the same"):
        typer.echo(json.dumps(reply) if as_json else remote.restore_line(target, reply))


egpu_run = typer.Typer(name="egpu-run", add_completion=False, no_args_is_help=True, rich_markup_mode=None)
Backend = Literal["auto", "ptx", "sass"]   # runtime/sass.py BACKENDS
LaunchVm = Literal["c", "python"]          # runtime/config.py LAUNCH_VMS
OnFull = Literal["drop", "wait"]           # runtime/config.py ON_FULLS


# CMD and its arguments are what is left after egpu-run's options (ctx.args): options stop at CMD, and an
# unknown option before it is refused, not run as the command.
@egpu_run.command("egpu-run", cls=_RunCommand, no_args_is_help=True, options_metavar="[OPTIONS] CMD [ARGS]...",
                  context_settings={**HELP, "allow_interspersed_args": False, "allow_extra_args": True})
def run_cmd(ctx: typer.Context,
            probes: list[Path] = typer.Option([], "-p", "--probe", metavar="PROBE", parser=_path,
                                              help="a .bpf.o or .bpf.c (repeatable)"),
            kernel: Optional[str] = typer.Option(None, "--kernel", metavar="GLOB", parser=_glob,
                                                 help="instrument only kernels this glob matches"),
            as_json: bool = typer.Option(False, "--json", help="maps as one JSON document per process"),
            output: Optional[Path] = typer.Option(None, "-o", "--output", metavar="FILE", parser=_path,
                                                  help="write the maps (and --interval's) to FILE, not to stdout, "
                                                       "which CMD writes too: egpu-run --json -o m.json CMD, then "
                                                       "jq . m.json"),
            per_rank: bool = typer.Option(False, "--per-rank", help="the maps of each process only (no sum)"),
            summed: bool = typer.Option(False, "--sum", help="the maps summed over the processes only "
                                                             "(default: each, and the sum when there are ranks)"),
            verbose: bool = typer.Option(False, "-v", "--verbose",
                                         help="report every module and kernel, say what a step longer than a "
                                              "second waits for, print a refused probe's verifier log; keep "
                                              "the session directory"),
            keep: bool = typer.Option(False, "--keep", help="keep the session directory (dumps, compiled probes)"),
            durations: bool = typer.Option(False, "--durations",
                                           help="time every kernel, copy and set (CUPTI): count, total, mean, "
                                                "histogram; bytes and bandwidth of copies; unified-memory "
                                                "faults and migrations"),
            perfetto: Optional[Path] = typer.Option(None, "--perfetto", metavar="FILE", parser=_path,
                                                    help="write launches, copies, syncs, unified-memory "
                                                         "migrations and ring-buffer records with a ts field as a "
                                                         "trace for ui.perfetto.dev"),
            backend: Backend = typer.Option("auto", "--backend", metavar="auto|ptx|sass",
                                            help="ptx: rewrite PTX; sass: patch SASS (Compute Sanitizer); "
                                                 "auto: PTX where a module has it, SASS otherwise"),
            live_sass: bool = typer.Option(False, "--live-sass",
                                           help="keep the Compute Sanitizer subscribed from the start, so that "
                                                "egpu attach reaches SASS-only kernels (PyTorch's); CUPTI "
                                                "(torch.profiler, --durations) cannot share the process with it"),
            in_kernel: bool = typer.Option(False, "--in-kernel",
                                           help="run every kernel probe inside the kernel, even a counter the "
                                                "launch alone gives (counted by egpu at the launch otherwise)"),
            interval: Optional[float] = typer.Option(None, "--interval", metavar="S", min=0.05,
                                                     help="also print the maps every S seconds while the job runs"),
            uprobe: list[str] = typer.Option([], "--uprobe", metavar="PROG=PATH:SYMBOL",
                                             help="where a bare SEC(\"uprobe\") or SEC(\"uretprobe\") program PROG "
                                                  "attaches: function SYMBOL of the executable or library PATH"),
            launch_vm: LaunchVm = typer.Option("c", "--launch-vm", metavar="c|python",
                                               help="where launch probes run: c (the shim's interpreter, for "
                                                    "probes it takes) or python (the reference VM, slower)"),
            mirror: float = typer.Option(1.0, "--mirror", metavar="S", min=0,
                                         help="copy the maps into shared memory every S seconds, where "
                                              "egpu maps PID --mirror reads them; 0: never"),
            prometheus: Optional[int] = typer.Option(None, "--prometheus", metavar="PORT", min=1, max=65535,
                                                     help="serve the maps for Prometheus on PORT while the job runs "
                                                          "(needs egpu[prometheus])"),
            restore: Optional[Path] = typer.Option(None, "--restore", metavar="DIR", parser=_path,
                                                   help="put checkpoint DIR back once the job has remade its "
                                                        "allocations (egpu checkpoint)"),
            other_build: bool = typer.Option(False, "--restore-other-build",
                                             help="--restore DIR into another executable than the one it was "
                                                  "taken of (a rebuild known to allocate the same way); the "
                                                  "allocations are still matched"),
            trace: Optional[Path] = typer.Option(None, "--trace", metavar="FILE", parser=_path,
                                                 help="write every ring and perf buffer record to FILE as the job "
                                                      "runs: Parquet, or Arrow IPC (written faster) when FILE ends "
                                                      "in .arrow or .feather; read by egpu trace, pyarrow, pandas, "
                                                      "polars or DuckDB; needs egpu[trace]"),
            on_full: Optional[OnFull] = typer.Option(None, "--on-full", metavar="drop|wait",
                                                     help="a record meeting a full ring: drop it (counted) or wait "
                                                          "for room (needs --trace; its default there; a reader "
                                                          "that takes nothing for 10 s ends the wait, counted)"),
            wait_all: bool = typer.Option(False, "--wait-all",
                                          help="once CMD ends, wait for every process of the job still running "
                                               "(a daemon it started), so that its maps are in the report too"),
            version: bool = _VERSION) -> None:
    """Run CMD with probes spliced into its kernels; print the maps at exit and exit with CMD's status.

    Exit status: CMD's (128 + N when signal N ended it); 127 when CMD is not found and 126 when it cannot
    be executed, as a shell says; 125 when egpu-run itself fails (a bad option, a probe it refuses), so
    that no status of egpu-run's own can be taken for the job's."""
    from egpu_preload.bpf.sections import EARLY_KINDS
    from egpu_preload.runtime import config, dump, job, sass, uprobes, watch
    from egpu_preload.version import cuda_driver
    cmd = ctx.args
    if not cmd:
        raise UsageError("Missing CMD, the program to run.", ctx=ctx)
    outer = job.enclosing_run(os.environ)
    if outer is not None:   # its settings would replace the outer one's in this job: neither would see all of it
        raise UsageError(f"already inside the job of egpu-run (pid {outer}), whose probes would not reach this job: "
                         "give every probe to one egpu-run (-p PROBE, repeatable)", ctx=ctx)
    if per_rank and summed:   # each says "only": together they printed the maps twice, unlabelled
        raise UsageError("--per-rank and --sum exclude each other (neither: each process, and the sum "
                         "when there are ranks)", ctx=ctx)
    progress = _notes(steps=verbose, prefix="egpu-run")
    session = maps_file = None
    maps_lost = False

    def put_maps(text: str) -> None:
        """The maps (at exit, or --interval's while the job runs) to -o FILE or stdout. One that cannot take
        them (a full disk) is said once and written no more: the job runs on and its status still goes out
        (an OSError here left it running unwaited, its session removed under it, and exited 1)."""
        nonlocal maps_lost
        if maps_lost:
            return
        try:
            if maps_file is None:
                _echo_after_job(text, nl=False)
            else:
                maps_file.write(text)
                maps_file.flush()
        except OSError as e:
            maps_lost = True
            if maps_file is None:   # what stdout still buffers goes nowhere, not into a second error at exit
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            _echo_after_job(f"egpu-run: {output if output is not None else 'stdout'}: cannot write the maps "
                            f"({e.strerror or e})", err=True)

    try:
        try:
            try:
                os.getcwd()
            except FileNotFoundError:   # the job's runtime could not start there: a job run without probes
                raise EgpuError("the current directory no longer exists (removed after the shell entered it): "
                                "cd into one that does") from None
            if on_full == "wait" and trace is None:
                raise EgpuError("--on-full wait needs --trace FILE: only its reader makes room while kernels run")
            on_full = on_full or ("wait" if trace is not None else "drop")
            _each_once(probes)
            _no_overwrite({"--trace": trace, "--perfetto": perfetto, "-o": output},
                          dict.fromkeys(probes, "a probe given with -p"))
            session = job.session_dir()
            # the SASS back end's patch image is built here from these translations: waiting ones too
            loaded = job.prepare_probes(probes, session, progress, wait=on_full == "wait")
            targets = uprobes.parse_options(uprobe)
            uprobes.check_targets([p.obj for p in loaded], targets)
            if perfetto is not None:
                from egpu_preload.runtime import job_trace
                job_trace.check_writable(perfetto)
            if trace is not None:
                from egpu_preload.output import tracefile
                trace = tracefile.prepare(trace)
            timed = durations or perfetto is not None   # CUPTI: from the job's first CUDA call
            cfg = config.Config(tuple(p.path for p in loaded), session, kernel, int(verbose), timed,
                                backend=backend, timeline=perfetto is not None,
                                mirror=mirror, launch_vm=launch_vm, trace=trace, on_full=on_full, uprobes=targets,
                                early_start=timed or any(
                                    p.attach.kind in EARLY_KINDS for pr in loaded for p in pr.obj.programs),
                                in_kernel=in_kernel)
            with progress.step("building the SASS back end's patch image (ptxas)"):
                cfg, sass_notes = sass.for_job(cfg, loaded, standby=live_sass)
            if other_build and restore is None:
                raise EgpuError("--restore-other-build needs --restore DIR")
            if restore is not None:  # refused here, before the job starts, when incomplete or corrupt
                from egpu_preload.cow import remote
                # armed at the job's first CUDA call, so that a job loading no module still puts it back or says why
                cfg = dataclasses.replace(cfg, restore=remote.checked(restore), restore_other_build=other_build,
                                          early_start=True)
            if cuda_driver() is None:
                sass_notes.append("egpu-run: no CUDA driver (libcuda.so.1 not found): the job cannot load "
                                  "CUDA code, so nothing will be instrumented (egpu-run --version)")
            for line in sass_notes:
                typer.echo(line, err=True)
            if output is not None:   # opened before the job starts: a FILE it cannot write is refused first
                try:
                    maps_file = open(output, "w", encoding="utf-8")
                except OSError as e:
                    raise EgpuError(f"-o: {e.strerror}", file=str(output)) from None
            every = None
            if prometheus is not None:
                watch.serve_prometheus(prometheus, session)
            if interval is not None:
                every = (interval, lambda: put_maps(watch.interval_output(session, as_json)))
            status = job.run_job(cmd, cfg, job.find_shim(), every, wait_all)
        except job.ProgramError as e:
            typer.echo(f"egpu-run: {e}", err=True)
            raise typer.Exit(e.exit_status)
        except EgpuError as e:  # the job never started
            _echo_error("egpu-run", e, detail=verbose)
            raise typer.Exit(OWN_FAILURE)
        try:
            view = "per-rank" if per_rank else "sum" if summed else "auto"
            maps, notes = job.report(loaded, session, as_json, verbose, view, durations,
                                     traced=trace is not None, status=status, mirror_s=mirror,
                                     maps_asked=as_json or maps_file is not None)
        except EgpuError as e:  # the job ran: its status still goes out
            maps, notes = "", [f"egpu-run: {e}"]
        if perfetto is not None:
            try:
                slices = job_trace.write(loaded, dump.read_all(session), perfetto)
                notes.append(f"egpu-run: {slices} kernel launches traced in {perfetto}")
            except EgpuError as e:
                notes.append(f"egpu-run: {e}")
        if trace is not None:
            from egpu_preload.runtime import streaming
            try:
                dumps = dump.read_all(session)
                notes += streaming.notes(dumps) + streaming.unclosed(trace, dumps, dump.started(session))
            except EgpuError as e:
                notes.append(f"egpu-run: {e}")
        if restore is not None and not dump.started(session, dump.RESTORING):
            notes.append(f"egpu-run: --restore {restore} was never put back: no process of the job started CUDA")
        for line in notes:
            _echo_after_job(line, err=True)
        put_maps(maps)
    finally:
        if maps_file is not None:
            with contextlib.suppress(OSError):   # a write it refused was said already
                maps_file.close()
        if session is not None and (keep or verbose):
            _echo_after_job(f"egpu-run: session kept in {session}", err=True)
        elif session is not None:
            shutil.rmtree(session, ignore_errors=True)
    raise typer.Exit(status)


def run_main() -> None:
    egpu_run(prog_name="egpu-run")


if __name__ == "__main__":
    egpu_main()
