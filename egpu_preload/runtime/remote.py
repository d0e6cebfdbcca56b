"""The client side of live control (``egpu ps/attach/detach/swap/maps/modules``): probes checked here
before they are sent, requests to a process's control socket (control.py), replies rendered tersely.

The process does the real work (live.py): it loads, verifies and translates the probe again itself, so
checking here only gives a clean early error without touching the job.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from egpu_preload.control import ControlClient, SessionInfo, is_stopped
from egpu_preload.errors import EgpuError
from egpu_preload.runtime.dump import other_version
from egpu_preload.runtime.live import probe_name
from egpu_preload.progress import Progress
from egpu_preload.runtime.probes import load_user_probe

TIMEOUT_S = 60.0   # an attach translates and loads every module in the target: seconds, not ms


def probe_object(path: Path, progress: Progress | None = None) -> tuple[bytes, str]:
    """(the .bpf.o bytes, the probe's default name) of a .bpf.o or .bpf.c, verified and translated here."""
    with tempfile.TemporaryDirectory(prefix="egpu-attach-") as tmp:
        probe = load_user_probe(path, Path(tmp) / (path.name.removesuffix(".c") + ".o"), progress=progress)
        try:
            return probe.path.read_bytes(), probe_name(path)
        except OSError as e:
            raise EgpuError(f"cannot read ({e.strerror})", file=str(path)) from None


def request(pid: int, cmd: str, **fields: object) -> Any:
    return ControlClient(pid, timeout=TIMEOUT_S).request(cmd, **fields)


def maps(pid: int) -> dict:
    """Process ``pid``'s "maps" reply, a dump's document; EgpuError when it is another egpu's."""
    doc = request(pid, "maps")
    why = other_version(doc)
    if why is not None:
        raise EgpuError(f"process {pid}: its maps are in a form this egpu does not read ({why}): a job "
                        "started by another version of egpu")
    return doc


# ---- renderings ----------------------------------------------------------------------------------------

def ps_lines(sessions: list[SessionInfo]) -> list[str]:
    """``PID PROBES COMMAND`` per live session (probes "-" when none, "?" when it did not answer)."""
    lines = [f"{'PID':>7}  {'PROBES':<20}  COMMAND"]
    for s in sessions:
        if s.info is None:
            why = f"stopped: kill -CONT {s.pid}" if is_stopped(s.pid) else "busy"   # stopped read as busy
            lines.append(f"{s.pid:>7}  {'?':<20}  ({why})")
            continue
        probes = ",".join(s.info.get("probes") or []) or "-"
        lines.append(f"{s.pid:>7}  {probes:<20}  {' '.join(s.info.get('argv') or [])}")
    return lines


def ps_json(sessions: list[SessionInfo]) -> str:
    return json.dumps([{"pid": s.pid, **(s.info or {})} for s in sessions])


def change_line(cmd: str, pid: int, reply: dict) -> str:
    """One line saying what an attach, detach or swap did."""
    what = {"attach": f"attached {reply.get('name')}",
            "detach": f"detached {', '.join(reply.get('names', []))}",
            "swap": f"swapped {reply.get('old')} -> {reply.get('name')}"}[cmd]
    phases = ", ".join(f"{k} {v:.1f}" for k, v in reply.get("phases_ms", {}).items())
    line = (f"{what} in {pid}: PTX {reply['modules']} modules, {reply['kernels']} kernels instrumented; "
            f"{sass_words(reply.get('sass'))}; flip at launch {reply['launches']}, {reply['seconds'] * 1000:.1f} ms")
    if phases:
        line += f" ({phases})"
    return "\n".join([line] + [f"  failed: {f}" for f in reply.get("failed", [])]
                     + uprobe_lines((reply.get("uprobes") or {}).get("attached", [])))


def uprobe_lines(attached: list[dict]) -> list[str]:
    """What an attach's uprobes cannot catch: one that found no function, and one hooked through GOT slots
    and dlsym with no call site patched (a pointer the program took before the attach is never caught)."""
    out = []
    for u in attached:
        if u.get("state") != "attached":
            out.append(f"  uprobe not attached: prog {u['prog']} at {u['target']}: {u['state']}")
        elif not u.get("inline") and not u.get("sites"):
            out.append(f"  uprobe at {u['target']} (prog {u['prog']}): no call site patched yet; it catches calls "
                       "through GOT slots and through pointers dlsym hands out from now on, not a pointer the "
                       "program took before")
    return out


def sass_words(sass: dict | None) -> str:
    """What the SASS back end runs after a flip, or why it was left as it was."""
    if not sass:
        return "SASS back end not reported"
    idle = sass["modules"] - sass["modules_patched"]
    words = (f"SASS {sass['modules_patched']} of {sass['modules']} modules patched"
             + (f" (the other {idle} {'runs' if idle == 1 else 'run'} no probe)" if idle and sass["modules_patched"]
                else ""))
    if sass.get("unchanged"):
        return (f"SASS unchanged: {sass['unchanged']}" if not sass["modules_patched"]
                else f"{words}, unchanged: {sass['unchanged']}")
    return f"{words} in {sass['patch_ms']:.1f} ms"


def modules_lines(reply: dict) -> list[str]:
    """Per module its status and probes, then per kernel its status and reason."""
    lines = []
    for m in reply["modules"]:
        probes = f" [{','.join(m['probes'])}]" if m.get("probes") else ""
        lines.append(f"{m['api']} {m['image']}: {m['status']}{probes}")
        lines += [f"  {name}: {status}" + (f" ({reason})" if reason else "") for name, status, reason in m["kernels"]]
    return lines or ["no modules loaded"]
