"""The client side of checkpoint and restore (``egpu checkpoint/restore``, ``egpu-run --restore``):
directories checked here before a job is touched, requests to its control socket, one-line replies."""

from __future__ import annotations

from pathlib import Path

from egpu_preload.control import ControlClient
from egpu_preload.cow.snapshot import load

TIMEOUT_S = 600.0   # a checkpoint writes and hashes every byte of device memory: minutes for a big job


def checked(directory: Path) -> Path:
    """``directory`` as an absolute path, once snapshot.load found it complete and intact."""
    load(directory)
    return directory.resolve()


def checkpoint(pid: int, directory: Path, stop_the_world: bool = False) -> dict:
    """The job's reply: counts, timings and ``not_saved`` (what the snapshot leaves out, live.not_saved)."""
    fields = {"dir": str(directory.resolve()), **({"stop_the_world": True} if stop_the_world else {})}
    return ControlClient(pid, timeout=TIMEOUT_S).request("checkpoint", **fields)


def checkpoint_line(pid: int, r: dict) -> str:
    line = (f"checkpoint of {pid} in {r['dir']}: {r['allocations']} allocations, {r['globals']} globals, "
            f"{r['bytes']} bytes; cut at launch {r['launches_at_cut']} on {r['cut_streams']} streams; "
            f"copied in {r['copy_ms']:.1f} ms ({r['hook_copies']} by the job's own launches, "
            f"{r['copier_copies']} in the background); job stalled {r['stall_ns'] / 1e6:.3f} ms in copy-on-write "
            f"hooks (longest {r['stall_max_ns'] / 1e6:.3f} ms), cut held launches and copies "
            f"{r['cut_hold_ns'] / 1e6:.3f} ms")
    if "stw_ms" in r:
        line += f"; the same copy stopping the job: {r['stw_ms']:.1f} ms"
    return line + left_out(r.get("not_saved") or {})


def left_out(not_saved: dict) -> str:
    """The reply's tail naming what the snapshot lacks (live.not_saved), or nothing when it has it all."""
    parts = [f"{row['modules']} modules without PTX (their globals)" if "modules" in row else
             f"{row['bytes']} bytes in {row['allocations']} {kind} allocations" for kind, row in not_saved.items()]
    return f"; partial, not saved: {', '.join(parts)}" if parts else ""


def restore(pid: int, directory: Path) -> dict:
    """The job's reply: what was written back, and how long its launches were held."""
    client = ControlClient(pid, timeout=TIMEOUT_S)   # first: a job that exits during the check is said to
    path = checked(directory)                        # have exited then (checked reads every byte)
    return client.request("restore", dir=str(path))


def restore_line(pid: int, r: dict) -> str:
    return (f"restored {r['dir']} into {pid}: {r['allocations']} allocations, {r['globals']} globals, "
            f"{r['bytes']} bytes; launches held {r['held_ms']:.1f} ms")
