"""The egpu command line: ``egpu-run`` wraps a CUDA program, ``egpu`` inspects probes and live jobs.

Every command is a thin shell over egpu_preload; an EgpuError becomes one line on stderr and exit 1,
never a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

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


def run_main() -> None:
    typer.echo("egpu-run: not built yet", err=True)
    sys.exit(2)


if __name__ == "__main__":
    egpu_main()
