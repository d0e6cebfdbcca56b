"""Section names -> what a program attaches to (DESIGN.md 2, "Probe sections").

    kprobe[.SCOPE]/GLOB          entry        kretprobe[.SCOPE]/GLOB    exit
    egpu/mem[.SCOPE]/GLOB        mem          egpu/load[.SCOPE]/GLOB    load
    egpu/store[.SCOPE]/GLOB      store        egpu/launch/GLOB          launch
    egpu/uvm/GLOB                uvm (host; GLOB matches the counter kind: htod, gpu_page_fault, ...)

bpftime's spellings, so its probes load unchanged: ``kprobe/__memcapture`` is its memory-access probe
(every global access of every kernel: ``egpu/mem/*``); ``uprobe[/PATH:SYMBOL]`` and
``uretprobe[/PATH:SYMBOL]`` (libbpf's form; bare, bpftime names the target elsewhere) are host probes,
Attach("uprobe" | "uretprobe", "PATH:SYMBOL" or "", "host") (runtime/uprobes.py).

One rule for the scope: a ``.warp`` or ``.block`` suffix on the word right before the GLOB's ``/``
(``kprobe.warp/vec*``, ``egpu/mem.block/*``); without it the probe runs in every thread. Launch probes
run once per launch and take no scope. GLOB is everything after that ``/`` and may not be empty.
"""

from __future__ import annotations

from ..errors import ElfError
from .program import Attach

# Section prefix (before the scope suffix) -> attach kind.
KINDS: dict[str, str] = {
    "kprobe": "entry",
    "kretprobe": "exit",
    "egpu/mem": "mem",
    "egpu/load": "load",
    "egpu/store": "store",
    "egpu/launch": "launch",
    "egpu/uvm": "uvm",
}
HOST_RUN = {"launch": "launch", "uvm": "host"}  # kinds the runtime runs on the host -> their scope
SCOPES = ("warp", "block")  # besides the default, "thread"
HOST_KINDS = ("uprobe", "uretprobe")
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
        scope = HOST_RUN.get(kind, "thread")
        if rest.startswith("."):
            suffix, sep, _ = rest[1:].partition("/")
            if not sep:
                break
            if kind == "launch":
                raise ElfError(f"launch probes run once per launch and take no scope (.{suffix})", section=name)
            if kind in HOST_RUN:
                raise ElfError(f"{prefix} probes run on the host and take no scope (.{suffix})", section=name)
            if suffix not in SCOPES:
                raise ElfError(f"unknown scope .{suffix} (use .warp or .block)", section=name)
            scope, rest = suffix, rest[1 + len(suffix):]
        if not rest.startswith("/"):
            continue  # e.g. "kprobes/x": another word that merely starts like ours
        glob = rest[1:]
        if not glob:
            raise ElfError("empty kernel name pattern (use * for every kernel)", section=name)
        return Attach(kind, glob, scope)
    raise ElfError("unknown section (expected kprobe/, kretprobe/, egpu/mem/, egpu/load/, egpu/store/, "
                   "egpu/launch/, egpu/uvm/, uprobe or uretprobe, with .warp or .block before the / on GPU sections)",
                   section=name)

