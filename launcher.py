"""The egpu command line: ``egpu-run`` wraps a CUDA program, ``egpu`` inspects probes and live jobs.

Every command is a thin shell over egpu_preload; an EgpuError becomes one line on stderr and exit 1,
never a traceback.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path
from collections.abc import Callable
from typing import Any, Optional

import typer

from egpu_preload.errors import EgpuError

egpu = typer.Typer(name="egpu", add_completion=False, no_args_is_help=True,
                   help="eBPF probes inside running CUDA kernels.")


def _fail(e: EgpuError) -> None:
    typer.echo(f"egpu: {e}", err=True)
    if e.detail:
        typer.echo(e.detail, err=True)
    raise typer.Exit(1)


def egpu_main() -> None:
    try:
        egpu()
    except EgpuError as e:  # commands raise; one line out, never a traceback
        typer.echo(f"egpu: {e}", err=True)
        if e.detail:
            typer.echo(e.detail, err=True)
        sys.exit(1)


@egpu.command()
def inspect(binary: Path,
            extract_ptx: Optional[Path] = typer.Option(None, "--extract-ptx", metavar="DIR",
                                                       help="write every PTX entry into DIR")) -> None:
    """List the fatbin entries of an executable, library, object or fatbin (like cuobjdump -lelf -lptx)."""
    from egpu_preload import fatbin
    try:
        try:
            data = binary.read_bytes()
        except OSError as e:
            raise EgpuError(f"cannot read ({e.strerror})", file=str(binary))
        found = fatbin.find_fatbins(data)
        for line in fatbin.listing(found):
            typer.echo(line)
        if extract_ptx is not None:
            for path in fatbin.write_ptx(found, extract_ptx, binary.name):
                typer.echo(f"wrote {path}")
    except EgpuError as e:
        _fail(e.where(file=str(binary)))


@egpu.command("compile")
def compile_cmd(source: Path,
                output: Optional[Path] = typer.Option(None, "-o", "--output", help="default: X.bpf.c -> X.bpf.o"),
                mcpu: str = typer.Option("v3", "--mcpu", help="eBPF ISA version for clang (v3, v4)")) -> None:
    """Compile a probe with clang (-O2 -g -target bpf) and egpu.bpf.h on the include path."""
    from egpu_preload.bpf.compile import compile_probe
    try:
        typer.echo(str(compile_probe(source, output, mcpu=mcpu)))
    except EgpuError as e:
        _fail(e)


@egpu.command("disasm")
def disasm_cmd(obj: Path) -> None:
    """Print each program of a probe object in llvm-objdump's syntax, after relocation."""
    from egpu_preload.bpf.disasm import object_listing
    from egpu_preload.bpf.elf import load_object
    try:
        typer.echo(object_listing(load_object(obj)))
    except EgpuError as e:
        _fail(e)


@egpu.command("verify")
def verify_cmd(obj: Path) -> None:
    """Verify each program of a probe object; a rejection prints where, why and the verifier log (exit 1).
    Then the maps the GPU keeps in rows per SM (counters only added to: translate/striping.py), and
    where launch programs run (runtime/native.py)."""
    from egpu_preload.bpf.elf import load_object
    from egpu_preload.bpf.sections import unattached
    from egpu_preload.bpf.verifier import verify
    from egpu_preload.runtime import launches, native
    from egpu_preload.translate.devmaps import layout
    from egpu_preload.translate.striping import stripe_counters
    try:
        bpf = load_object(obj)
        verified = []
        for prog in bpf.programs:
            verified.append(verify(prog.code, bpf.maps, file=str(obj), section=prog.section))
            typer.echo(f"prog {prog.name} ({prog.section}): ok, {len(verified[-1].insns)} insns")
        stripe_counters(bpf, verified)
        for m in bpf.maps:
            if m.stripe:
                rows = layout(m).spread
                typer.echo(f"map {m.name}: only added to ({m.stripe}-byte adds): {rows} row{'s' * (rows > 1)} "
                           "per SM, summed when read")
        for line in unattached(bpf.programs):
            typer.echo(line)
        launch, used, _ = launches.launch_side(bpf)
        if launch:
            why = native.refusal(launch, bpf.maps, used)
            typer.echo("launch programs: in C (the shim's interpreter)" if why is None
                       else f"launch programs: on the Python VM ({why})")
    except EgpuError as e:
        _fail(e.where(file=str(obj)))


@egpu.command("ptx")
def ptx_cmd(obj: Path) -> None:
    """Print the PTX module a probe object becomes (each program verified, then translated)."""
    from egpu_preload.bpf.elf import load_object
    from egpu_preload.bpf.verifier import verify
    from egpu_preload.translate import probe_object_ptx
    try:
        bpf = load_object(obj)
        for prog in bpf.programs:
            verify(prog.code, bpf.maps, file=str(obj), section=prog.section)
        typer.echo(probe_object_ptx(bpf), nl=False)
    except EgpuError as e:
        _fail(e.where(file=str(obj)))


@egpu.command("rewrite")
def rewrite_cmd(ptx_in: Path = typer.Argument(..., metavar="IN.ptx"),
                probes: list[Path] = typer.Option(..., "-p", "--probe", help="a .bpf.o (repeatable)"),
                output: Optional[Path] = typer.Option(None, "-o", "--output", help="default: stdout")) -> None:
    """Instrument the kernels of a PTX module with probes; per-kernel status goes to stderr."""
    from egpu_preload.bpf.elf import load_object
    from egpu_preload.bpf.verifier import verify
    from egpu_preload.translate.rewrite import instrument, probe_specs
    try:
        specs = []
        for obj in probes:
            bpf = load_object(obj)
            for prog in bpf.programs:
                verify(prog.code, bpf.maps, file=str(obj), section=prog.section)
            specs += probe_specs(bpf)
        res = instrument(ptx_in.read_text(), specs)
    except EgpuError as e:
        _fail(e.where(file=str(ptx_in)))
    except OSError as e:
        _fail(EgpuError(e.strerror or str(e), file=e.filename))
    for k in res.kernels:
        typer.echo(f"{k.name}: {k.status}" + (f" ({k.calls} calls)" if k.calls else "")
                   + (f": {k.reason}" if k.status == "failed" else ""), err=True)
    if output:
        output.write_text(res.text)
    else:
        typer.echo(res.text, nl=False)


# ---- live control of running jobs (egpu_preload/runtime/live.py in the job, remote.py here) ----

@egpu.command("ps")
def ps_cmd(as_json: bool = typer.Option(False, "--json", help="one JSON list")) -> None:
    """List the processes with an egpu session (stale sockets are removed)."""
    from egpu_preload.control import list_sessions
    from egpu_preload.runtime import remote
    try:
        sessions = list_sessions()
    except EgpuError as e:
        _fail(e)
    typer.echo(remote.ps_json(sessions) if as_json else "\n".join(remote.ps_lines(sessions)))


_RANK = typer.Option(None, "--rank", metavar="R",
                     help="PID is the job's (egpu-run's, torchrun's): address its process of rank R")
_ALL = typer.Option(False, "--all", help="PID is the job's: address every process of it")


def _each(pid: int, rank: Optional[int], every: bool, fn: Callable[[int], Any]) -> tuple[list[tuple[Any, Any]], bool]:
    """fn(pid) in each process addressed (runtime/ranks.py), all at once: ((target, reply) of those that
    answered, whether any failed); each failure is one line on stderr."""
    from egpu_preload.runtime import ranks
    try:
        results = ranks.fan_out(ranks.select(pid, rank, every), fn)
    except EgpuError as e:
        _fail(e)
    for _, r in results:
        if isinstance(r, EgpuError):
            typer.echo(f"egpu: {r}", err=True)
    done = [(t, r) for t, r in results if not isinstance(r, EgpuError)]
    return done, len(done) < len(results)


def _rank_prefix(target: Any) -> str:
    return "" if target.rank is None else f"rank {target.rank}: "


def _maps_doc(target: Any, reply: dict) -> dict:
    """A detach's or swap's final maps as a dump-like document of the process it came from."""
    return {**reply, "pid": target.pid, "rank": target.rank, "probes": reply["final"], "kernels": reply["kernel_names"]}


@egpu.command("attach")
def attach_cmd(pid: int, probe: Path = typer.Option(..., "-p", "--probe", help="a .bpf.o or .bpf.c"),
               name: Optional[str] = typer.Option(None, "--name", help="default: the file name without .bpf.o"),
               rank: Optional[int] = _RANK, every: bool = _ALL) -> None:
    """Attach a probe to a running job: verified here, then loaded, translated and spliced in there."""
    from egpu_preload.runtime import remote
    try:
        data, default = remote.probe_object(probe)
    except EgpuError as e:
        _fail(e)
    done, failed = _each(pid, rank, every, lambda p: remote.request(p, "attach", probe=data, name=name or default))
    for t, reply in done:
        typer.echo(_rank_prefix(t) + remote.change_line("attach", t.pid, reply))
    raise typer.Exit(int(failed))


@egpu.command("detach")
def detach_cmd(pid: int, probe: Optional[str] = typer.Argument(None, help="its name (default: every probe)"),
               as_json: bool = typer.Option(False, "--json", help="the final maps as JSON"),
               rank: Optional[int] = _RANK, every: bool = _ALL) -> None:
    """Detach one probe (or all) from a running job and print its final maps (per rank, and summed)."""
    from egpu_preload.runtime import job, remote
    done, failed = _each(pid, rank, every, lambda p: remote.request(p, "detach", **({"name": probe} if probe else {})))
    for t, reply in done:
        typer.echo(_rank_prefix(t) + remote.change_line("detach", t.pid, reply), err=True)
    try:
        typer.echo(job.render([], [_maps_doc(t, r) for t, r in done], as_json), nl=False)
    except EgpuError as e:
        _fail(e)
    raise typer.Exit(int(failed))


@egpu.command("swap")
def swap_cmd(pid: int, old: str = typer.Argument(..., help="the attached probe's name"),
             new: Path = typer.Argument(..., help="the new probe, a .bpf.o or .bpf.c"),
             rank: Optional[int] = _RANK, every: bool = _ALL) -> None:
    """Replace an attached probe with another in one step: every launch runs one of them."""
    from egpu_preload.runtime import remote
    try:
        data, name = remote.probe_object(new)
    except EgpuError as e:
        _fail(e)
    done, failed = _each(pid, rank, every, lambda p: remote.request(p, "swap", old=old, new_probe=data, new_name=name))
    for t, reply in done:
        typer.echo(_rank_prefix(t) + remote.change_line("swap", t.pid, reply))
    raise typer.Exit(int(failed))


@egpu.command("maps")
def maps_cmd(pid: int, as_json: bool = typer.Option(False, "--json", help="one JSON document"),
             rank: Optional[int] = _RANK, every: bool = _ALL,
             from_mirror: bool = typer.Option(False, "--mirror", help="read the copy the job keeps in shared "
                                              "memory (asks the job nothing; as of its last copy)")) -> None:
    """Print the maps of the probes attached to a running job (read without stopping it); of several
    ranks: each, then their sum."""
    from egpu_preload.runtime import job, mirror, remote
    read = (lambda p: mirror.read_mirror(p)[0]) if from_mirror else (lambda p: remote.request(p, "maps"))
    done, failed = _each(pid, rank, every, read)
    for t, doc in done:
        if not doc["probes"]:
            typer.echo(f"egpu: no probe is attached to {t.pid}", err=True)
    try:
        typer.echo(job.render([], [doc for _, doc in done], as_json), nl=False)
    except EgpuError as e:
        _fail(e)
    raise typer.Exit(int(failed))


@egpu.command("modules")
def modules_cmd(pid: int, as_json: bool = typer.Option(False, "--json", help="one JSON document")) -> None:
    """Every module a running job loaded and each kernel: instrumented, SASS only, failed (why), untouched."""
    import json
    from egpu_preload.runtime import remote
    try:
        reply = remote.request(pid, "modules")
    except EgpuError as e:
        _fail(e)
    typer.echo(json.dumps(reply) if as_json else "\n".join(remote.modules_lines(reply)))


# ---- checkpoint and restore (egpu_preload/cow/: live.py and restore.py in the job, remote.py here) ----

@egpu.command("checkpoint")
def checkpoint_cmd(pid: int, directory: Path = typer.Argument(..., metavar="DIR", help="must not exist yet"),
                   stop_the_world: bool = typer.Option(False, "--compare-stop-the-world",
                                                       help="then copy the same bytes with the job stopped "
                                                            "and report how long that held it")) -> None:
    """Snapshot a running job's device memory and module globals into DIR while it keeps running."""
    from egpu_preload.cow import remote
    try:
        typer.echo(remote.checkpoint(pid, directory, stop_the_world))
    except EgpuError as e:
        _fail(e)


@egpu.command("restore")
def restore_cmd(pid: int, directory: Path = typer.Argument(..., metavar="DIR")) -> None:
    """Roll a running job back to a checkpoint (its streams drained, then every allocation written back)."""
    from egpu_preload.cow import remote
    try:
        typer.echo(remote.restore(pid, directory))
    except EgpuError as e:
        _fail(e)


egpu_run = typer.Typer(name="egpu-run", add_completion=False, no_args_is_help=True)


@egpu_run.command(context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})
def run_cmd(cmd: list[str] = typer.Argument(..., metavar="CMD [ARGS]...", help="the job to run"),
            probes: list[Path] = typer.Option([], "-p", "--probe", help="a .bpf.o or .bpf.c (repeatable)"),
            kernel: Optional[str] = typer.Option(None, "--kernel", metavar="GLOB",
                                                 help="instrument only kernels this glob matches"),
            as_json: bool = typer.Option(False, "--json", help="maps as one JSON document per process"),
            per_rank: bool = typer.Option(False, "--per-rank", help="the maps of each process only (no sum)"),
            summed: bool = typer.Option(False, "--sum", help="the maps summed over the processes only "
                                                             "(default: each, and the sum when there are ranks)"),
            verbose: bool = typer.Option(False, "-v", "--verbose",
                                         help="report every module and kernel; keep the session directory"),
            keep: bool = typer.Option(False, "--keep", help="keep the session directory (dumps, compiled probes)"),
            durations: bool = typer.Option(False, "--durations",
                                           help="time every kernel (CUPTI): count, total, mean, histogram"),
            perfetto: Optional[Path] = typer.Option(None, "--perfetto", metavar="FILE",
                                                    help="write launches, kernel durations and ring-buffer "
                                                         "records with a ts field as a trace for ui.perfetto.dev"),
            backend: str = typer.Option("auto", "--backend", metavar="auto|ptx|sass",
                                        help="ptx: rewrite PTX; sass: patch SASS (Compute Sanitizer); "
                                             "auto: PTX where a module has it, SASS otherwise"),
            interval: Optional[float] = typer.Option(None, "--interval", metavar="S", min=0.05,
                                                     help="also print the maps every S seconds while the job runs"),
            launch_vm: str = typer.Option("c", "--launch-vm", metavar="c|python",
                                          help="where launch probes run: c (the shim's interpreter, for "
                                               "probes it takes) or python (the reference VM, slower)"),
            mirror: float = typer.Option(1.0, "--mirror", metavar="S", min=0,
                                         help="copy the maps into shared memory every S seconds, where "
                                              "egpu maps PID --mirror reads them; 0: never"),
            prometheus: Optional[int] = typer.Option(None, "--prometheus", metavar="PORT",
                                                     help="serve the maps for Prometheus on PORT while the job runs "
                                                          "(needs egpu[prometheus])"),
            restore: Optional[Path] = typer.Option(None, "--restore", metavar="DIR",
                                                   help="put checkpoint DIR back once the job has remade its "
                                                        "allocations (egpu checkpoint)")) -> None:
    """Run CMD with probes spliced into its kernels; print the maps at exit and exit with CMD's status."""
    from egpu_preload.bpf.sections import unattached
    from egpu_preload.runtime import config, dump, job, sass, watch
    session = None
    try:
        try:
            if launch_vm not in config.LAUNCH_VMS:
                raise EgpuError(f"--launch-vm {launch_vm}: expected one of {', '.join(config.LAUNCH_VMS)}")
            session = job.session_dir()
            loaded = job.prepare_probes(probes, session)
            for line in (line for p in loaded for line in unattached(p.obj.programs)):
                typer.echo(f"egpu-run: {line}", err=True)
            if perfetto is not None:
                from egpu_preload.runtime import job_trace
                job_trace.check_writable(perfetto)
            cfg = config.Config(tuple(p.path for p in loaded), session, kernel, int(verbose),
                                durations or perfetto is not None, backend=backend, timeline=perfetto is not None,
                                mirror=mirror, launch_vm=launch_vm)
            cfg, sass_notes = sass.for_job(cfg, loaded)
            if restore is not None:  # refused here, before the job starts, when incomplete or corrupt
                from egpu_preload.cow import remote
                cfg = dataclasses.replace(cfg, restore=remote.checked(restore))
            for line in sass_notes:
                typer.echo(line, err=True)
            every = None
            if prometheus is not None:
                watch.serve_prometheus(prometheus, session)
            if interval is not None:
                every = (interval, lambda: typer.echo(watch.interval_output(session, as_json), nl=False))
            status = job.run_job(cmd, cfg, job.find_shim(), every)
        except job.ProgramError as e:
            typer.echo(f"egpu-run: {e}", err=True)
            raise typer.Exit(e.exit_status)
        except EgpuError as e:  # the job never started
            typer.echo(f"egpu-run: {e}", err=True)
            if e.detail and verbose:
                typer.echo(e.detail, err=True)
            raise typer.Exit(1)
        try:
            view = {(False, False): "auto", (True, False): "per-rank", (False, True): "sum"}.get((per_rank, summed),
                                                                                              "both")
            maps, notes = job.report(loaded, session, as_json, verbose, view, durations)
        except EgpuError as e:  # the job ran: its status still goes out
            maps, notes = "", [f"egpu-run: {e}"]
        if perfetto is not None:
            try:
                slices = job_trace.write(loaded, dump.read_all(session), perfetto)
                notes.append(f"egpu-run: {slices} kernel launches traced in {perfetto}")
            except EgpuError as e:
                notes.append(f"egpu-run: {e}")
        for line in notes:
            typer.echo(line, err=True)
        typer.echo(maps, nl=False)
    finally:
        if session is not None and (keep or verbose):
            typer.echo(f"egpu-run: session kept in {session}", err=True)
        elif session is not None:
            shutil.rmtree(session, ignore_errors=True)
    raise typer.Exit(status)


def run_main() -> None:
    egpu_run()


if __name__ == "__main__":
    egpu_main()
