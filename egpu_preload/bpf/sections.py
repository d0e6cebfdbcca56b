"""Section names -> what a program attaches to (DESIGN.md 2, "Probe sections").

    kprobe[.SCOPE]/GLOB          entry        kretprobe[.SCOPE]/GLOB    exit
    egpu/mem[.SCOPE]/GLOB        mem          egpu/load[.SCOPE]/GLOB    load
    egpu/store[.SCOPE]/GLOB      store        egpu/launch/GLOB          launch
    egpu/memcpy/GLOB             memcpy       egpu/memset/GLOB          memset
    egpu/alloc/GLOB              alloc        egpu/free/GLOB            free
    egpu/sync/GLOB               sync

The host-API sections (``API_KINDS``) run on the host, in C, after each call of a driver API whose name
the GLOB matches: the API's name (``cuMemcpyHtoDAsync``) or the exported symbol the program called
(``cuMemcpyHtoDAsync_v2_ptsz``), so ``egpu/memcpy/cuMemcpyHtoDAsync*`` takes every variant of it. They
receive ``struct egpu_host_ctx`` (bpf/ctx.py HOST), GPU and launch sections ``struct egpu_ctx``.

bpftime's spellings, so its probes load unchanged: ``kprobe/__memcapture`` is its memory-access probe
(every global access of every kernel: ``egpu/mem/*``); ``uprobe[/PATH:SYMBOL]`` and
``uretprobe[/PATH:SYMBOL]`` (libbpf's form; bare, bpftime names the target elsewhere) are host probes,
Attach("uprobe" | "uretprobe", "PATH:SYMBOL" or "", "host"): egpu loads and verifies them but attaches
nothing yet (``unattached``).

One rule for the scope: a ``.warp`` or ``.block`` suffix on the word right before the GLOB's ``/``
(``kprobe.warp/vec*``, ``egpu/mem.block/*``); without it the probe runs in every thread. Launch probes
run once per launch and take no scope. GLOB is everything after that ``/`` and may not be empty.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import ElfError
from .program import Attach, Program

# Section prefix (before the scope suffix) -> attach kind.
KINDS: dict[str, str] = {
    "kprobe": "entry",
    "kretprobe": "exit",
    "egpu/mem": "mem",
    "egpu/load": "load",
    "egpu/store": "store",
    "egpu/launch": "launch",
    "egpu/memcpy": "memcpy",
    "egpu/memset": "memset",
    "egpu/alloc": "alloc",
    "egpu/free": "free",
    "egpu/sync": "sync",
}
SCOPES = ("warp", "block")  # besides the default, "thread"
HOST_KINDS = ("uprobe", "uretprobe")
API_KINDS = ("memcpy", "memset", "alloc", "free", "sync")  # ctx.HOST_API_KINDS
ONCE_PER_CALL = ("launch",) + API_KINDS  # sections that take no scope: they run once per launch or call
MEMCAPTURE = "kprobe/__memcapture"  # bpftime's section for a probe at every memory access


def parse_section(name: str) -> Attach:
    """``kprobe.warp/vec*`` -> Attach("entry", "vec*", "warp"); ElfError naming the section otherwise."""
    if name == MEMCAPTURE:
        return Attach("mem", "*", "thread")
    word, sep, target = name.partition("/")
    if word in HOST_KINDS:
        if sep and ":" not in target:
            raise ElfError(f"{word} target {target!r} is not PATH:SYMBOL", section=name)
        return Attach(word, target, "host")
    for prefix, kind in KINDS.items():
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix):]
        scope = "launch" if kind == "launch" else "api" if kind in API_KINDS else "thread"
        if rest.startswith("."):
            suffix, sep, _ = rest[1:].partition("/")
            if not sep:
                break
            if kind in ONCE_PER_CALL:
                what = "launch probes run once per launch" if kind == "launch" else f"{kind} probes run once per call"
                raise ElfError(f"{what} and take no scope (.{suffix})", section=name)
            if suffix not in SCOPES:
                raise ElfError(f"unknown scope .{suffix} (use .warp or .block)", section=name)
            scope, rest = suffix, rest[1 + len(suffix):]
        if not rest.startswith("/"):
            continue  # e.g. "kprobes/x": another word that merely starts like ours
        glob = rest[1:]
        if not glob:
            what = "driver API" if kind in API_KINDS else "kernel"
            raise ElfError(f"empty {what} name pattern (use * for every {what})", section=name)
        return Attach(kind, glob, scope)
    raise ElfError("unknown section (expected kprobe/, kretprobe/, egpu/mem/, egpu/load/, egpu/store/, "
                   "egpu/launch/, egpu/memcpy/, egpu/memset/, egpu/alloc/, egpu/free/, egpu/sync/, uprobe or "
                   "uretprobe, with .warp or .block before the / on GPU sections)",
                   section=name)


def unattached(programs: Iterable[Program]) -> list[str]:
    """One line for each host probe among ``programs``: egpu runs none yet."""
    return [f"prog {p.name} ({p.section}): not attached: egpu has no host uprobes yet" for p in programs
            if p.attach.kind in HOST_KINDS]
