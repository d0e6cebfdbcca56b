"""Section names -> what a program attaches to (DESIGN.md 2, "Probe sections").

    kprobe[.SCOPE]/GLOB          entry        kretprobe[.SCOPE]/GLOB    exit
    egpu/mem[.SCOPE]/GLOB        mem          egpu/load[.SCOPE]/GLOB    load
    egpu/store[.SCOPE]/GLOB      store        egpu/launch/GLOB          launch
    egpu/uvm/GLOB                uvm (host; GLOB matches the counter kind: htod, gpu_page_fault, ...)
    egpu/memcpy/GLOB             memcpy       egpu/memset/GLOB          memset
    egpu/alloc/GLOB              alloc        egpu/free/GLOB            free
    egpu/sync/GLOB               sync

The host-API sections (``API_KINDS``) run on the host, in C, after each call of a driver API whose name
the GLOB matches: the API's name (``cuMemcpyHtoDAsync``) or the exported symbol the program called
(``cuMemcpyHtoDAsync_v2_ptsz``), so ``egpu/memcpy/cuMemcpyHtoDAsync*`` takes every variant of it. Each
section's programs receive the context bpf/ctx.py's ``layout_for`` names for its kind.

bpftime's spellings, so its probes load unchanged: ``kprobe/__memcapture`` is its memory-access probe
(every global access of every kernel: ``egpu/mem/*``); ``uprobe[/PATH:SYMBOL]`` and
``uretprobe[/PATH:SYMBOL]`` (libbpf's form; bare, bpftime names the target elsewhere) are host probes,
Attach("uprobe" | "uretprobe", "PATH:SYMBOL" or "", "host") (runtime/uprobes.py). libbpf's other spellings
of a uprobe load as it loads them: ``uprobe/SYMBOL`` (no binary: libbpf leaves its attach to the program's
loader, as sslsniff's does) is a bare one, and the sleepable ``uprobe.s`` and ``uretprobe.s`` are uprobes.
Sections of programs that run inside the Linux kernel (tracepoints, fentry, XDP, ...) or at a USDT point
are refused saying so (``LINUX_ONLY``).

One rule for the scope: a ``.warp`` or ``.block`` suffix on the word right before the GLOB's ``/``
(``kprobe.warp/vec*``, ``egpu/mem.block/*``); without it the probe runs in every thread. Host sections
(``HOST_RUN``: launch, uvm and host-API probes, run once per launch, record or call) take no scope. GLOB
is everything after that ``/`` and may not be empty.
"""

from __future__ import annotations

import re

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
    "egpu/memcpy": "memcpy",
    "egpu/memset": "memset",
    "egpu/alloc": "alloc",
    "egpu/free": "free",
    "egpu/sync": "sync",
}
API_KINDS = ("memcpy", "memset", "alloc", "free", "sync")  # host-API sections: run in C in the shim's hooks
# Kinds the runtime runs on the host, once per launch, record or call -> their scope; they take no suffix.
HOST_RUN: dict[str, str] = {"launch": "launch", "uvm": "host", **{k: "api" for k in API_KINDS}}
SCOPES = ("warp", "block")  # besides the default, "thread"
HOST_KINDS = ("uprobe", "uretprobe")
# Kinds that see a job only when the runtime starts with CUDA, before any module load (config.EARLY_START).
EARLY_KINDS = API_KINDS + ("uvm",)
# Every kind whose programs run on the object's host copy of the maps (its host side, runtime/native.py).
HOST_SIDE = frozenset(HOST_RUN) | frozenset(HOST_KINDS)
_ADDRESS = re.compile(r"0[xX][0-9a-fA-F]+|[0-9]+")   # libbpf's older PATH:ADDRESS
MEMCAPTURE = "kprobe/__memcapture"  # bpftime's section for a probe at every memory access
# bpftime's section for a program run as a CUDA kernel of its own (bpftimetool run-on-cuda), not in a user's
# kernel: the verifier lets its loops run on to a budget (bpf/verifier)
DIRECTLY_RUN = "kprobe/__directly_run"
SLEEPABLE = ".s"                    # libbpf's uprobe.s, uretprobe.s: may sleep, which a hook's program may anyway
# libbpf's section words (its section_defs, the word before any / or .) of programs that run inside the Linux
# kernel -> what they attach to there. egpu's kprobe/ is a GPU kernel's entry, bpftime's spelling.
LINUX_ONLY = {
    **dict.fromkeys(("tracepoint", "tp", "raw_tracepoint", "raw_tp", "tp_btf"), "a tracepoint"),
    **dict.fromkeys(("fentry", "fexit", "fmod_ret", "ksyscall", "kretsyscall"), "a kernel function or system call"),
    **dict.fromkeys(("xdp", "tc", "tcx", "classifier", "action", "socket", "sk_skb", "sk_msg", "sk_lookup",
                     "sk_reuseport", "sockops", "flow_dissector", "netfilter", "netkit") + tuple(
                        f"lwt_{w}" for w in ("in", "out", "xmit", "seg6local")), "network traffic"),
    **dict.fromkeys(("cgroup", "cgroup_skb"), "a cgroup"),
    "lsm": "an LSM hook", "perf_event": "a perf event", "iter": "a kernel iterator", "struct_ops": "kernel struct_ops",
    "syscall": "the bpf() system call", "lirc_mode2": "an infrared receiver",
}


def host_target_refusal(target: str) -> str | None:
    """Why a uprobe's PATH:SYMBOL names no function egpu can hook, or None. libbpf also takes SYMBOL+OFFSET
    (and once took an address): a hook takes over a function at its entry (its GOT slots, dlsym's answer,
    or a 5-byte jump over its first instructions, shim/egpu_uprobe.h), and a jump inside a function could
    cover the target of one of its branches, which no check short of its whole control flow rules out."""
    symbol = target.rpartition(":")[2]
    if "+" in symbol:
        return (f"{target!r}: offsets into a function are not supported (a hook takes over a function at its "
                "entry; a jump stored inside it could cover a branch target)")
    if _ADDRESS.fullmatch(symbol):
        return f"{target!r}: an address is not supported: name the function (a hook finds it by its symbol)"
    return None


def parse_section(name: str) -> Attach:
    """``kprobe.warp/vec*`` -> Attach("entry", "vec*", "warp"); ElfError naming the section otherwise."""
    if name == MEMCAPTURE:
        return Attach("mem", "*", "thread")
    word, sep, target = name.partition("/")
    if word.removesuffix(SLEEPABLE) in HOST_KINDS:
        word = word.removesuffix(SLEEPABLE)
    if word in HOST_KINDS:
        if sep and ":" not in target:   # a function and no binary: its target comes from egpu-run --uprobe
            return Attach(word, "", "host")
        if sep and (why := host_target_refusal(target)):
            raise ElfError(f"{word} target {why}", section=name)
        return Attach(word, target, "host")
    linux = word.partition(".")[0]
    if linux in LINUX_ONLY:
        raise ElfError(f"a Linux kernel program (on {LINUX_ONLY[linux]}): egpu runs probes in GPU kernels and in "
                       "the CUDA process's functions (uprobe/PATH:SYMBOL), not in the Linux kernel", section=name)
    if linux == "usdt":
        raise ElfError("USDT probes are not supported: a USDT point lies inside a function, and a uprobe hooks a "
                       "function at its entry (put a uprobe/PATH:SYMBOL on the function instead)", section=name)
    for prefix, kind in KINDS.items():
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix):]
        scope = HOST_RUN.get(kind, "thread")
        if rest.startswith("."):
            suffix, sep, _ = rest[1:].partition("/")
            if not sep:
                break
            if kind in HOST_RUN:
                raise ElfError(f"{prefix} probes run on the host and take no scope (.{suffix})", section=name)
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
                   "egpu/launch/, egpu/uvm/, egpu/memcpy/, egpu/memset/, egpu/alloc/, egpu/free/, egpu/sync/, uprobe "
                   "or uretprobe, with .warp or .block before the / on GPU sections)",
                   section=name)

