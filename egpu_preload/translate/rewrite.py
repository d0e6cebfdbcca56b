"""Splice probe calls into the kernels of a PTX module without changing what the kernels compute.

``instrument(module_ptx, probes)`` returns the new module text and, per kernel, whether it was
instrumented, left untouched (no glob matched, or no site for the probes that did) or failed (the
reason; that kernel is then byte-identical to the input). Cost is linear in the module's size: one
pass over the top level, one over the body of each matching kernel, one join.

What an instrumented kernel looks like
--------------------------------------
- Its parameter list gains a trailing ``.param .u64 __egpu_launch_id`` (the launch contract below); a
  kernel whose parameters leave no room for it in the parameter space fails.
- The module gains the probes' definitions and their map tables (``.const``, module.table_decl); when the
  module's own ``__constant__`` data leaves them no room in the 64 KB a module may have, every kernel fails.
- The context (``struct egpu_ctx``, bpf/ctx.py) holds kernel_id (FNV-1a of the mangled name),
  launch_id, args (the first 8 parameters, each zero-extended; an aggregate gives its first 8/4/2/1
  bytes as its alignment allows), nargs, and per site: site, addr, size, flags, kind; the launch-only
  fields (grid, block, stream) are zero. A probe takes it one of two ways (ProbeSpec.ctx_words):
  - in words (translated probes, whenever the verifier saw each ctx load at one offset): the site
    computes each 8-byte word the probe reads into ``%__egpu_c<w>`` (constants folded into one
    literal) and passes them as ``.param .b64`` arguments, so nothing goes through local memory and,
    in the kernel's own copy of the probe (below), a word every site of the kernel passes alike folds
    (a kernel that only stores: the probe's ``ctx->flags & STORE``);
  - by address (``.func (.param .b64 %ret) NAME(.param .b64 %ctx)``): a ``.local`` context is
    declared after the kernel's own declarations, its per-kernel fields stored once at entry and its
    site fields at each site, only those some probe of the kernel reads (ProbeSpec.ctx_fields, from the
    verifier); ``%__egpu_ctxp`` holds its generic address. When no such probe reads a field there is
    no context and the calls pass ctx.NO_ADDRESS.
- The sites' ``%__egpu_*`` registers are declared once, after the kernel's own declarations (sites do
  not nest; a kernel that already mentions ``__egpu`` is refused, so nothing clashes with its names).
  Each site is one ``{ }`` scope that declares its ``.param`` slots, computes the context its probes
  read and calls each probe. site is the index of the instruction among the kernel's instructions
  (entry: 0; the closing brace: one past the last).
- Sites: entry; before every ``ret``/``exit`` and at the body's closing brace where a thread can reach
  it (_reaches_end); before every ``ld``/``ldu``/``st``/``atom``/``red`` on ``.global`` or generic
  addresses and every ``cp.async.{ca,cg}`` from global memory. ctx.addr is the generic address
  (``.global`` addresses go through ``cvta.global``); size is the vector width times the type's size
  (cp.async: its cp-size); flags: ld/ldu/cp.async load, st store, atom load|store|atomic, red
  store|atomic. ``egpu/load`` probes see sites with the load flag, ``egpu/store`` those with the store
  flag. Accesses inside non-kernel ``.func``s are not sites (no context there; the status of a kernel counts
  those of the functions it calls, through calls but not pointers), nor are ``wmma.load``/
  ``wmma.store``, bulk copies on global memory (a fragment's addresses, a size in a register),
  ``multimem`` loads, stores and reductions, and texture and surface fetches, loads, stores and reductions
  (``tex``, ``tld4``, ``suld``, ``sust``, ``sured``: a handle and coordinates, no address): the kernel's status
  counts those, an untouched kernel's too.
- A guarded site (``@%p st...``, ``@%p ret``) is preceded by ``@!%p bra`` around the probe scope, so
  the probe runs exactly when the instruction does.
- Scopes: thread: every thread that reaches the site. warp: the lowest lane of ``activemask`` at the
  site (after the guard), so under divergence each group of lanes that reaches the site together
  elects one. block: thread (0,0,0) of the block, when it reaches the site (for exit: when that thread
  exits, whether or not other threads still run).
- Each site keeps its lanes grouped as they arrived (``activemask`` at its start, ``bar.warp.sync``
  with that mask at its end), so code after it that reads the active mask behaves as without egpu.
  A leader's guarded call is followed by a ``bar.warp.sync`` of its own: without it (H200,
  2026-12-01, scripts/diag_coalesced.py) ``cg::coalesced_threads()`` later in ``cg_coalesced``
  (tests/cuda/coop_groups.cu) saw warp 0's lane 0 (the block leader) apart from its 10 peers, sizes
  1 and 10 instead of 11, although the site's closing barrier had the whole mask; guarding the call by
  a branch instead of a predicate changed nothing.
- ``.version``/``.target`` are raised only to what the probes and sites need (PTX 6.2 for
  ``activemask``). A module below sm_70 that runs ``shfl`` or ``vote`` without ``.sync`` at PTX 6.4 or
  above cannot take a raise to sm_70 (ptxas refuses those there): every kernel fails.
- Load cost: ptxas, as the driver runs it on a module (whole program), does not inline the probe calls
  but compiles a copy of each called ``.func`` for every kernel that calls it (``$k1$__egpu_...`` in
  the cubin), so its time grows as instrumented kernels x probe code (100 small kernels with
  examples/mem_bytes: 1.3 s against 0.14 s; ``ptxas -c`` compiles the probe once: 0.31 s). Hence
  helpers_ptx.py keeps each helper's code, its loops above all, small.
- A kernel that runs ``setmaxnreg``, in its body or in a ``.func`` it calls (directly, through other ``.func``s,
  or indirectly: then any ``.func`` of the module counts) gets each probe's body inlined at its sites, one
  scope each (PTX scopes the body's registers and labels; the sites share one ``.local`` stack, declared with
  the kernel's), not a call: after ``setmaxnreg.dec`` ptxas 13.0 cannot allocate a call to a hash-map probe
  (C7600 "Register allocation failed with register count of '232'" for examples/mem_bytes, more than 60 s for
  a kernel with loops) but assembles the inlined body (0.05 s and 0.37 s). A probe whose text is not one
  ``.func`` without calls fails such a kernel.

Launch contract (what the shim must do)
---------------------------------------
The launch id is an extra trailing kernel parameter, so it is exact per launch with no shared state.
For every kernel reported ``instrumented``, the shim, when it launches the instrumented function in
place of the original, appends one 64-bit value, the process-wide launch counter (the same number
``egpu/launch`` probes see), to the application's parameters:
- ``kernelParams`` form: pass a new array of n+1 pointers, the last pointing at the u64.
- ``extra`` form (``CU_LAUNCH_PARAM_BUFFER_POINTER``): copy the buffer and write the u64 at
  ``KernelStatus.launch_param_offset`` (the parameter layout rounded up to 8), with the new size.
Kernels reported ``untouched`` or ``failed`` are launched unchanged, with the original parameters.
"""

from __future__ import annotations

import collections
import functools
import gc
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from egpu_preload.bpf import ctx as C
from egpu_preload.bpf.program import Attach, BpfObject
from egpu_preload.bpf.verifier import VerifiedProgram, verify
from egpu_preload.errors import PtxError
from egpu_preload.translate import ptx
from egpu_preload.translate.demangle import matches
from egpu_preload.translate.emitter import DIM_REGISTERS, packed_word
from egpu_preload.translate.striping import stripe_counters

LAUNCH_PARAM = "__egpu_launch_id"
# A device-side launch (dynamic parallelism): CUDA 13's __cudaCDP2LaunchDeviceV2, earlier cudaLaunchDevice[V2].
DEVICE_LAUNCH = re.compile(r"\b(?:__cudaCDP2|cuda)LaunchDevice(?:V2)?\b")
# Any launch from the device: DEVICE_LAUNCH's, its parameter buffer, or a graph launched by a kernel (shim/sass.c
# launches_on_device looks for the same names in a cubin).
ON_DEVICE = re.compile(r"LaunchDevice|GetParameterBuffer|GraphLaunch")
UNSET_LAUNCH_ID = ("this module launches kernels from the device: a kernel so launched reads an undefined "
                   "ctx->launch_id (the parameter buffer leaves it unset)")
PARAM_SPACE, PARAM_SPACE_LARGE = 4352, 32764   # bytes of kernel parameters ptxas takes (_check_param_space)
CONST_BANK = 65536   # bytes of .const data per module ptxas 13.0 takes ("too much global constant data")
PREFIX = "__egpu"
# PTX 6.2 introduced activemask (PTX ISA 9.7.13.4), which every site uses to regroup its lanes.
SITE_VERSION = (6, 2)
MEM_KINDS = {"mem": 0, "load": C.FLAG_LOAD, "store": C.FLAG_STORE}
_SPACES = ("global", "shared", "local", "param", "const", "tex")
# [reg], [reg+imm], [var+imm], [imm]; a negative offset is written +-imm (PTX ISA 6.4.1.4), imm any integer
# literal (ptx.integer).
_ADDR = re.compile(r"\[\s*(?P<base>[$%\w.]+)\s*(?:\+\s*(?P<off>-?\w+))?\s*\]$")
_MEMORY_OPS = {"ld": C.FLAG_LOAD, "ldu": C.FLAG_LOAD, "st": C.FLAG_STORE,
               "atom": C.FLAG_LOAD | C.FLAG_STORE | C.FLAG_ATOMIC, "red": C.FLAG_STORE | C.FLAG_ATOMIC,
               "cp": C.FLAG_LOAD}   # cp.async.{ca,cg}: checked in memory_access
_DECLS = (".reg", ".local", ".shared", ".param", ".const", ".global")
_SITE_FIELDS = ("site", "size", "flags", "kind")   # and addr: stored at each site, the rest at entry
_ZERO_FIELDS = ("pad", "stream")  # zero in kernels (a kernel does not know its stream)
# Context word -> the (field, bit shift, mask) of each field element in it.
_WORD_FIELDS: dict[int, list[tuple[str, int, int]]] = {w: [] for w in range(C.WORDS)}
for _el in C.ELEMENTS:
    _WORD_FIELDS[_el.offset // 8].append((_el.field.name, 8 * (_el.offset % 8), (1 << 8 * _el.field.size) - 1))


@dataclass(frozen=True)
class ProbeSpec:
    """One translated probe as the rewriter needs it."""

    attach: Attach             # kind entry|exit|mem|load|store, glob, scope thread|warp|block
    func: str                  # name of ``.func (.param .b64 %ret) NAME(.param .b64 %ctx)``
    ptx: str = ""              # its definition, pasted after the header
    version: tuple[int, int] = (0, 0)   # lowest .version the text needs
    target: int = 0            # lowest sm_XX the text needs
    globals: tuple[str, ...] = ()       # module-level declarations, pasted once per module before any ptx
    ctx_fields: frozenset[str] = C.ALL_FIELDS   # the struct egpu_ctx fields it reads: only those are stored
    ctx_words: tuple[int, ...] | None = None    # takes these context words as parameters, not %ctx
    program: int = -1          # its index in the object's programs (-1: made by hand, in tests)


@dataclass(frozen=True)
class KernelStatus:
    name: str
    status: str                # instrumented | untouched | failed
    reason: str = ""
    calls: int = 0             # probe calls inserted
    launch_param_offset: int | None = None  # byte offset of __egpu_launch_id in the parameter buffer
    nparams: int = 0           # the kernel's own parameters (__egpu_launch_id comes after them)


@dataclass
class RewriteResult:
    text: str
    kernels: list[KernelStatus]
    seconds: dict[str, float] = field(default_factory=dict)   # parse, rewrite, render

    def status(self, name: str) -> KernelStatus:
        return next(k for k in self.kernels if k.name == name)


def probe_specs(obj: BpfObject, verified: Sequence[VerifiedProgram] | None = None) -> list[ProbeSpec]:
    """The kernel-site programs of a loaded object, translated (launch probes are not spliced into
    kernels, so they are left out), after its counters are striped (striping.py). ``verified``: the
    verifier's result for each of ``obj.programs``, in order (verified here when not given)."""
    from egpu_preload.translate import probe_function   # the translator imports this package
    if verified is None:
        verified = [verify(p.code, obj.maps, file=obj.path, section=p.section) for p in obj.programs]
    stripe_counters(obj, verified)
    specs = []
    for i, (prog, v) in enumerate(zip(obj.programs, verified, strict=True)):
        if prog.attach.kind in ("entry", "exit") or prog.attach.kind in MEM_KINDS:
            pp = probe_function(prog, obj, verified=v, ctx_params=True)
            specs.append(ProbeSpec(prog.attach, pp.name, pp.func, pp.version, pp.sm, pp.globals, pp.ctx_fields,
                                   pp.ctx_words, i))
    return specs


def launches_on_device(module_ptx: str) -> bool:
    """Whether a module's kernels may launch work from the device, which no launch hook sees."""
    return ON_DEVICE.search(module_ptx) is not None


def instrument(module_ptx: str, probes: list[ProbeSpec], only: str | None = None,
               link_input: bool = False) -> RewriteResult:
    """Instrument every kernel a probe's glob matches (and ``only``, when given, too: egpu-run
    --kernel); others stay byte-identical. ``link_input``: the module is one of several PTX inputs of a
    cuLink, so the probes' module-level declarations are .weak (each input carries them; the linker
    keeps one) instead of .visible."""
    with _collector_paused():
        return _instrument(module_ptx, probes, only, link_input)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic collector off for the block: a large module makes hundreds of thousands of objects
    that all live to the end, and the collector would scan them again and again (15% of a 100k-line
    rewrite, measured on the CI machine)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _instrument(module_ptx: str, probes: list[ProbeSpec], only: str | None, link_input: bool) -> RewriteResult:
    t0 = time.perf_counter()
    mod = ptx.parse(module_ptx)
    t1 = time.perf_counter()
    edits: list[ptx.Edit] = []
    statuses, used = [], []
    device_launches = DEVICE_LAUNCH.search(module_ptx) is not None
    declared = mod.declared()
    calls_of = _Calls(mod)
    for fn in mod.kernels():
        if only is not None and not matches(only, fn.name):
            statuses.append(KernelStatus(fn.name, "untouched", f"not selected by {only}"))
            continue
        mine = [p for p in probes if matches(p.attach.glob, fn.name)]
        if not mine:
            statuses.append(KernelStatus(fn.name, "untouched", "no probe matches"))
            continue
        clash = sorted(set().union(*(_declares(p) for p in mine)) & declared)
        if clash:   # pasting the probes' definitions would define these twice (egpu's own output, say)
            statuses.append(KernelStatus(fn.name, "failed", f"the module already declares {', '.join(clash)}, "
                                                            f"which the probes define (instrumented before?)"))
            continue
        try:
            kernel = _Kernel(fn, mine, calls_of.sets_maxnreg(fn))
            kernel_edits, calls = kernel.edits()
            kernel.unseen.update(calls_of.unseen(kernel.callees))
            if calls:
                _check_param_space(fn.params, mod.version)
        except PtxError as e:
            statuses.append(KernelStatus(fn.name, "failed", e.reason))
            continue
        if not calls:
            notes = ["no sites for the matching probes"] + [_unseen_note(kernel.unseen)] * bool(kernel.unseen)
            statuses.append(KernelStatus(fn.name, "untouched", "; ".join(notes)))
            continue
        edits += kernel_edits
        used += [p for p in mine if p not in used]
        unset = device_launches and any("launch_id" in p.ctx_fields for p in mine)
        notes = [UNSET_LAUNCH_ID] * unset + [_unseen_note(kernel.unseen)] * bool(kernel.unseen)
        statuses.append(KernelStatus(fn.name, "instrumented", "; ".join(notes), calls=calls,
                                     launch_param_offset=_launch_param_offset(fn.params),
                                     nparams=len(fn.params)))
    if used and (full := _const_bank_full(mod, used)):   # the probes' map tables do not fit: no kernel can have them
        statuses = [replace(k, status="failed", reason=full, calls=0, launch_param_offset=None)
                    if k.status == "instrumented" else k for k in statuses]
        edits, used = [], []
    if used and (legacy := _legacy_warp_ops(mod, used)):   # the .target raise would break the module
        statuses = [replace(k, status="failed", reason=legacy, calls=0, launch_param_offset=None)
                    if k.status == "instrumented" else k for k in statuses]
        edits, used = [], []
    if used:
        edits += _module_edits(mod, used, link_input)
    t2 = time.perf_counter()
    text = mod.render(edits)
    t3 = time.perf_counter()
    return RewriteResult(text, statuses, {"parse": t1 - t0, "rewrite": t2 - t1, "render": t3 - t2})


@functools.lru_cache(maxsize=256)   # bounded: a long session swaps probes in and out
def _declares(probe: ProbeSpec) -> frozenset[str]:
    """The module-level names a probe's text declares."""
    return frozenset(ptx.parse("\n".join([*probe.globals, probe.ptx])).declared())


def _launch_param_offset(params: tuple[ptx.Param, ...]) -> int:
    off = 0
    for p in params:
        off = -(-off // p.align) * p.align + p.size
    return -(-off // 8) * 8


def _check_param_space(params: tuple[ptx.Param, ...], version: tuple[int, int] | None) -> None:
    """PtxError when the launch id does not fit in the kernel's parameter space: ptxas 13.0 allows 4352
    bytes before PTX ISA 8.1 and 32764 from 8.1 on (CUDA 12.1's large kernel parameters)."""
    version = version or (0, 0)
    limit = PARAM_SPACE_LARGE if version >= (8, 1) else PARAM_SPACE
    end = _launch_param_offset(params) + 8
    if end > limit:
        raise PtxError(f"no room for the launch id parameter: it would end at byte {end}, past the {limit} "
                       f"bytes of kernel parameters PTX {'.'.join(map(str, version))} allows")


def _const_bank_full(mod: ptx.Module, used: list[ProbeSpec]) -> str:
    """Why the probes' map tables (``.const``, module.table_decl) do not fit beside the module's own
    ``__constant__`` data in the constant bank, or "" when they do; ptxas would refuse the module."""
    tables = ptx.parse("\n".join(dict.fromkeys(g.strip() for p in used for g in p.globals))).const_bytes()
    if not tables or mod.const_bytes(tables) <= CONST_BANK:   # _module_edits puts the tables first
        return ""
    return (f"no room for the probes' map tables ({tables} bytes) in the {CONST_BANK} bytes of constant data a "
            f"module may have: its own __constant__ data takes {mod.const_bytes()}")


def _raised_header(mod: ptx.Module, used: list[ProbeSpec]) -> tuple[tuple[int, int] | None, int | None]:
    """The .version and the sm_XX .target the probes raise the module's to, None for each left as it is."""
    need_v = max([p.version for p in used] + [SITE_VERSION])
    need_t = max(p.target for p in used)
    m = re.fullmatch(r"sm_(\d+)[a-z]?", mod.target or "")
    return (need_v if mod.version_span and mod.version and need_v > mod.version else None,
            need_t if mod.target_span and m and need_t > int(m.group(1)) else None)


# shfl and vote without .sync (PTX ISA: shfl, vote; deprecated since 6.0): "not supported on .target sm_70 and
# higher from PTX ISA version 6.4" (ptxas 13.0), though taken below sm_70 at any version.
_UNSYNCED_WARP_OP = re.compile(r"\b(?:shfl\.(?:up|down|bfly|idx)|vote\.(?:any|all|uni|ballot))\b")


def _legacy_warp_ops(mod: ptx.Module, used: list[ProbeSpec]) -> str:
    """Why the module cannot take the .target the probes raise it to (sm_70 or above), or "": it runs shfl or
    vote without .sync at PTX 6.4 or above (CUDA 11's __shfl_down for sm_52, say), which ptxas then refuses."""
    version, target = _raised_header(mod, used)
    if target is None or target < 70 or max(version or (0, 0), mod.version or (0, 0)) < (6, 4):
        return ""
    m = _UNSYNCED_WARP_OP.search(ptx.blank_comments(mod.text))
    if m is None:
        return ""
    return (f"the probes need .target sm_{target}, where ptxas refuses this module's {m.group()} without .sync "
            f"(PTX 6.4 on: none on sm_70 and above); its .target is {mod.target}")


def _module_edits(mod: ptx.Module, used: list[ProbeSpec], weak: bool) -> list[ptx.Edit]:
    """Probe definitions after the header, and .version/.target raised where the probes need it."""
    edits = []
    # Declarations come from module.table_decl: one line starting with its linkage (PTX ISA 5.4.3).
    decls = [g.strip() for p in used for g in p.globals]
    if weak:
        decls = [".weak " + d.removeprefix(".visible ") for d in decls]
    texts = list(dict.fromkeys(decls + [p.ptx.strip() for p in used]))
    texts = [t for t in texts if t]
    if texts:
        edits.append(ptx.Edit(mod.header_end, mod.header_end, "\n\n" + "\n\n".join(texts) + "\n"))
    version, target = _raised_header(mod, used)
    if version:
        edits.append(ptx.Edit(*mod.version_span, f"{version[0]}.{version[1]}"))
    if target:
        edits.append(ptx.Edit(*mod.target_span, f"sm_{target}"))
    return edits


def _ctx_store(field_name: str, value: str) -> str:
    return f"mov.u32 %{PREFIX}_w, {value};\n\tst.local.u32 [{PREFIX}_ctx+{C.BY_NAME[field_name].offset}], %{PREFIX}_w;"


_MARK = "\0"   # around the name of a site's value in a plan's text (_Kernel._plan)
# The registers sites use, declared once per kernel (sites do not nest); each site's .param slots are
# declared in its own scope ({ }), as call arguments are.
_REGS = "\n\t".join([f".reg .b64 \t%{PREFIX}_a, %{PREFIX}_t;", f".reg .b32 \t%{PREFIX}_w, %{PREFIX}_v, %{PREFIX}_m;",
                     f".reg .b16 \t%{PREFIX}_h;", f".reg .pred \t%{PREFIX}_q;"])


class _Kernel:
    """Edits for one kernel; raises PtxError (kernel left alone) on anything it cannot handle.

    A site computes only the context some probe of it reads (measured on the H200, vecadd with 16 Mi
    threads: a full context at every thread's entry and site made empty entry+exit probes cost 10.5x the
    uninstrumented launch). The lanes that arrive together leave together (activemask ...
    bar.warp.sync): a probe may diverge inside (a hash-map insert), and code after the site that reads
    the active mask (cooperative groups' coalesced_threads) must see the grouping it would have seen
    without egpu. Seen on the H200: without it, cg::coalesced_threads() after a site formed different
    groups and changed the kernel's output."""

    def __init__(self, fn: ptx.Function, probes: list[ProbeSpec], inline: bool) -> None:
        if fn.params is None or fn.params_end is None:   # the context words below read the parameters
            raise PtxError("kernel signature does not parse")
        self.fn, self.text = fn, fn.text
        self.entry = [p for p in probes if p.attach.kind == "entry"]
        self.exit = [p for p in probes if p.attach.kind == "exit"]
        self.mem = [p for p in probes if p.attach.kind in MEM_KINDS]
        # Which memory probes see an access with given flags: mem all, load/store by flag.
        self.mem_by_flags = {f: [p for p in self.mem if p.attach.kind == "mem" or f & MEM_KINDS[p.attach.kind]]
                             for f in range(8)}
        self.forms: dict[tuple[int, int, int, int], _Form] = {}   # by id() of a probe list above, kind, size, flags
        # The fields of the local-memory context: every matching probe that takes %ctx counts, even one
        # without a site here (fields are stored or not per kernel).
        self.reads = frozenset().union(*(p.ctx_fields for p in probes if p.ctx_words is None))
        self.ctxp = f"%{PREFIX}_ctxp" if self.reads else str(C.NO_ADDRESS)
        # The context words some probe takes, and those the same at every site (computed at entry).
        self.words = sorted({w for p in probes for w in p.ctx_words or ()})
        self.kernel_words = {w: v for w in self.words if (v := self._kernel_word(w)) is not None}
        self.labels = 0
        self.inline = inline   # each probe's body at its sites, not a call (_Calls)
        self.stack = 0         # bytes of the .local stack the inlined bodies share (_inline_parts)
        self.unseen: collections.Counter[str] = collections.Counter()   # unseen_access's, with memory probes
        self.callees: set[str] = set()   # the targets of the kernel's calls, with memory probes

    def edits(self) -> tuple[list[ptx.Edit], int]:
        """The kernel's edits (its body with the sites spliced in, as one edit: a site each would make a
        large module's edits costly to build, sort and apply; the launch parameter) and its calls."""
        fn, text = self.fn, self.text
        if _RESERVED.search(text, fn.start, fn.end):
            raise PtxError(f"kernel already uses the reserved prefix {PREFIX}")
        out: list[str] = []   # the body's text and what goes in it by turns
        pos = start = fn.body_open + 1
        prologue = None       # its place in out: before the first statement that is not a declaration
        calls = index = 0
        regs = _Registers()
        Instruction, Directive = ptx.Instruction, ptx.Directive
        stmts = fn.statements()
        for st in stmts:
            if prologue is None and not (type(st) is Directive and st.depth == 1 and st.name in _DECLS):
                out += (text[pos:st.start], "")
                pos, prologue = st.start, len(out) - 1
            if type(st) is not Instruction:
                regs.see(st)
                continue
            index += 1
            op, site = st.op, ""
            if op == "ret" or op == "exit":
                if self.exit:
                    site = self._site(st, index, C.KIND_EXIT, None, self.exit, regs)
                    calls += len(self.exit)
            elif op in _MEMORY_OPS and self.mem:
                acc = memory_access(st)
                probes = self.mem_by_flags[acc.flags] if acc else None
                if probes:
                    site = self._site(st, index, C.KIND_MEM, acc, probes, regs)
                    calls += len(probes)
            if site:
                out += (text[pos:st.start], site)
                pos = st.start
            elif self.mem and op in _UNSEEN_OPS and (unseen := unseen_access(st.opcode)):
                self.unseen[unseen] += 1
            elif self.mem and op == "call":
                self.callees.add(ptx.call_target(st.operands)[0] or "%")
        if prologue is None:   # nothing but declarations: the prologue ends the body
            out += (text[pos:fn.end - 1], "")
            pos, prologue = fn.end - 1, len(out) - 1
        if self.exit and _reaches_end(stmts):   # a thread leaves at the closing brace as at a ret
            out += (text[pos:fn.end - 1], self._site(None, index + 1, C.KIND_EXIT, None, self.exit, regs))
            pos = fn.end - 1
            calls += len(self.exit)
        if not calls and not self.entry:
            return [], 0
        entry = self._site(None, 0, C.KIND_ENTRY, None, self.entry, regs) if self.entry else ""
        calls += len(self.entry)
        out[prologue] = self._prologue() + entry   # after every site: the stack inlined probes share
        return [ptx.Edit(start, pos, "".join(out)), self._launch_param()], calls

    def _launch_param(self) -> ptx.Edit:
        fn = self.fn
        head = ptx.blank_comments(self.text[fn.start:fn.params_end])
        last = fn.start + len(head.rstrip())   # after the last parameter (or the '('), not in a comment after it
        sep = "" if not fn.params else ","
        return ptx.Edit(last, last, f"{sep}\n\t.param .u64 {LAUNCH_PARAM}")

    def _prologue(self) -> str:
        """The sites' registers, then the context's per-kernel part: the local-memory context (its
        fields the probes taking %ctx read) and the per-kernel words held in registers."""
        lines = [_REGS] + [f".local .align 8 .b8 \t{_STACK}[{self.stack}];"] * bool(self.stack)
        computed = [w for w in self.words if self.kernel_words.get(w) == f"%{PREFIX}_c{w}"]
        lines += [f".reg .b64 \t%{PREFIX}_c{w};" for w in computed]
        if self.reads:
            lines += [f".local .align 8 .b8 \t{PREFIX}_ctx[{C.SIZE}];", f".reg .b64 \t%{PREFIX}_ctxp;",
                      f"mov.u64 %{PREFIX}_t, {PREFIX}_ctx;", f"cvta.local.u64 %{PREFIX}_ctxp, %{PREFIX}_t;"]
            lines += self._context_stores()
        for w in computed:
            lines += self._word_code(w)
        return "\n\t".join(lines) + "\n\t"

    def _context_stores(self) -> list[str]:
        params = self.fn.params[:C.MAX_ARGS]
        F = C.BY_NAME
        reads = self.reads
        lines = []
        if "kernel_id" in reads:
            lines += [f"mov.u64 %{PREFIX}_t, {C.kernel_id(self.fn.name)};",
                      f"st.local.u64 [{PREFIX}_ctx+{F['kernel_id'].offset}], %{PREFIX}_t;"]
        if "launch_id" in reads:
            lines += [f"ld.param.u64 %{PREFIX}_t, [{LAUNCH_PARAM}];",
                      f"st.local.u64 [{PREFIX}_ctx+{F['launch_id'].offset}], %{PREFIX}_t;"]
        if "args" in reads:
            for i in range(C.MAX_ARGS):
                if i < len(params):
                    lines += _load_param(params[i])
                elif i == len(params):
                    lines.append(f"mov.u64 %{PREFIX}_t, 0;")
                lines.append(f"st.local.u64 [{PREFIX}_ctx+{F['args'].offset + 8 * i}], %{PREFIX}_t;")
        if "nargs" in reads:
            lines += [f"mov.u32 %{PREFIX}_w, {len(params)};",
                      f"st.local.u32 [{PREFIX}_ctx+{F['nargs'].offset}], %{PREFIX}_w;"]
        for name, special in DIM_REGISTERS.items():
            if name in reads:
                lines += [line for e, axis in enumerate("xyz") for line in (
                    f"mov.u32 %{PREFIX}_w, {special}.{axis};",
                    f"st.local.u32 [{PREFIX}_ctx+{F[name].offset + 4 * e}], %{PREFIX}_w;")]
        zero = [F[name] for name in _ZERO_FIELDS if name in reads]
        if zero:
            lines += [f"mov.u32 %{PREFIX}_w, 0;", f"mov.u64 %{PREFIX}_t, 0;"]
        for fld in zero:
            reg = f"%{PREFIX}_t" if fld.size == 8 else f"%{PREFIX}_w"
            lines += [f"st.local.u{8 * fld.size} [{PREFIX}_ctx+{fld.offset + fld.size * e}], {reg};"
                      for e in range(fld.count)]
        return lines

    def _kernel_word(self, word: int) -> str | None:
        """The operand holding context word ``word`` at every site of the kernel: a literal, or the
        register %__egpu_c<word> the prologue fills (_word_code); %__egpu_a for the address, computed
        at each site. None for the words a site's own values make (site, size, flags, kind)."""
        names = {name for name, _, _ in _WORD_FIELDS[word]}
        if "addr" in names:
            return f"%{PREFIX}_a"
        if names & set(_SITE_FIELDS):
            return None
        if "launch_id" in names or names & set(DIM_REGISTERS):
            return f"%{PREFIX}_c{word}"
        if "args" in names:
            return f"%{PREFIX}_c{word}" if word - C.BY_NAME["args"].offset // 8 < len(self.fn.params) else "0"
        values = {"kernel_id": C.kernel_id(self.fn.name), "nargs": min(len(self.fn.params), C.MAX_ARGS)}
        return str(_pack(word, values))   # stream is 0 in kernels

    def _word_code(self, word: int) -> list[str]:
        """PTX filling %__egpu_c<word> with a per-kernel word: the launch id, launch dimensions (with
        nargs beside grid.x), or a kernel parameter."""
        reg = f"%{PREFIX}_c{word}"
        if word == C.BY_NAME["launch_id"].offset // 8:
            return [f"ld.param.u64 {reg}, [{LAUNCH_PARAM}];"]
        dims = [el for el in C.ELEMENTS if el.offset // 8 == word and el.field.name in DIM_REGISTERS]
        if dims:
            return packed_word(reg, str(_pack(word, {"nargs": min(len(self.fn.params), C.MAX_ARGS)})),
                               [([f"mov.u32 %{PREFIX}_w, {DIM_REGISTERS[el.field.name]}.{'xyz'[el.index]};"],
                                 8 * (el.offset % 8)) for el in dims], f"%{PREFIX}_w", f"%{PREFIX}_t")
        return _load_param(self.fn.params[word - C.BY_NAME["args"].offset // 8]) + [f"mov.b64 {reg}, %{PREFIX}_t;"]

    def _site(self, ins: ptx.Instruction | None, index: int, kind: int, acc: "Access | None",
              probes: list[ProbeSpec], regs: "_Registers") -> str:
        size, flags = (acc.size, acc.flags) if acc else (0, 0)
        key = (id(probes), kind, size, flags)   # one list per attach kind and flags, kept by the kernel
        form = self.forms.get(key)
        if form is None:
            form = self.forms[key] = self._form(probes, kind, size, flags)
        address = (self._address(index, acc, regs) if acc else f"mov.u64 %{PREFIX}_a, 0;") if form.address else ""
        block = form.render(index, address)
        if ins is None or ins.pred is None:
            return block
        # Run the probes exactly when the guarded instruction runs: branch around them otherwise.
        self.labels += 1
        skip = f"${PREFIX}_skip{self.labels}"
        neg = ins.pred[1:] if ins.pred.startswith("!") else "!" + ins.pred
        return f"@{neg} bra \t{skip};\n\t{block[:-1]}{skip}:\n\t"

    def _form(self, probes: list[ProbeSpec], kind: int, size: int, flags: int) -> "_Form":
        """The sites with these probes and values: the plan with the values filled in but for the site's
        index, its address and the context words holding the index."""
        values = {"size": str(size), "flags": str(flags), "kind": str(kind)}
        fields = {"site": 0, "addr": 1}   # a value's field number in the template (_Form)
        index_words = []
        pieces = self._plan(probes).split(_MARK)   # text and value names by turns
        for word in dict.fromkeys(pieces[1::2]):
            if word in values or word in fields:
                continue
            bits, shift, mask = _site_bits(int(word), size, flags, kind)
            if mask:   # the context word holds the index: a field of its own
                index_words.append((bits, shift, mask))
                fields[word] = 1 + len(index_words)
            else:
                values[word] = str(bits)
        refs, chunks = [], [pieces[0]]
        for k in range(1, len(pieces), 2):
            if pieces[k] in values:
                chunks[-1] += values[pieces[k]] + pieces[k + 1]
            else:
                refs.append(fields[pieces[k]])
                chunks.append(pieces[k + 1])
        return _Form(_renderer(refs, chunks, index_words), 1 in refs)

    def _plan(self, probes: list[ProbeSpec]) -> str:
        """What every site of this kernel with these probes says, with the names of the values that differ
        between sites (site, addr, size, flags, kind and the context words made of them) between _MARKs."""
        reads = frozenset().union(*(p.ctx_fields for p in probes if p.ctx_words is None))
        words = sorted({w for p in probes for w in p.ctx_words or ()})
        # Each word's operand in the stores before a call: per kernel, or the site's value.
        operands = {w: self.kernel_words.get(w) or f"{_MARK}{w}{_MARK}" for w in words}
        if self.inline:
            self.stack = max([self.stack] + [_inline_parts(p).stack for p in probes])
        slots = [] if self.inline else [f"{PREFIX}_arg"] * any(p.ctx_words is None for p in probes) \
            + [f"{PREFIX}_ret"] + [f"{PREFIX}_cw{w}" for w in words]
        lines = [f"{{ // egpu site {_MARK}site{_MARK}"] + [f".param .b64 {s};" for s in slots] \
            + [f"activemask.b32 %{PREFIX}_m;"]
        if "addr" in reads or C.BY_NAME["addr"].offset // 8 in words:
            lines.append(f"{_MARK}addr{_MARK}")
        lines += [_ctx_store(name, f"{_MARK}{name}{_MARK}") for name in _SITE_FIELDS if name in reads]
        if "addr" in reads:
            lines.append(f"st.local.u64 [{PREFIX}_ctx+{C.BY_NAME['addr'].offset}], %{PREFIX}_a;")
        lines += [_calls(probes, self.ctxp, operands, self.inline), f"bar.warp.sync %{PREFIX}_m;", "}\n\t"]
        return "\n\t".join(lines)

    def _address(self, index: int, acc: "Access", regs: "_Registers") -> str:
        """PTX leaving the generic effective address of the access in %__egpu_a."""
        shape = _address_shape(acc.operand)
        if shape is None:
            raise PtxError(f"site {index}: unsupported address operand {acc.operand}")
        base, off = shape
        width = regs.width(base)
        if base[0] == "%" or width:
            if width != 64:
                raise PtxError(f"site {index}: address register {base} is not a declared 64-bit register")
            move = "b64"
        elif base[0].isdigit() or acc.space == "global":
            move = "u64"
        else:
            raise PtxError(f"site {index}: generic access through variable {base}")
        return _address_code(move, base, off, acc.space)


_NO_FALL_THROUGH = frozenset({"ret", "exit", "bra", "brx", "trap"})


def _reaches_end(stmts: list[ptx.Stmt]) -> bool:
    """Whether a thread can reach a body's closing brace (ptxas takes a kernel without a final ret): the
    last instruction goes on to the next one, or a branch targets a label after it (not nvcc -G's
    ``$L__func_end0``, named only by debug information)."""
    labels = set()
    for st in reversed(stmts):
        if type(st) is ptx.Label:
            labels.add(st.name)
        elif type(st) is ptx.Instruction:
            if st.pred is not None or st.op not in _NO_FALL_THROUGH:
                return True
            break
    else:
        return True
    if not labels:
        return False
    for st in stmts:
        if type(st) is ptx.Instruction and st.op in ("bra", "brx"):
            targets = st.operands
        elif type(st) is ptx.Directive and st.name == ".branchtargets":   # brx.idx's list of labels
            targets = st.text.replace(",", " ").split()
        else:
            continue
        if labels.intersection(targets):
            return True
    return False


# Kernels repeat their address operands (a module's unrolled loops, each kernel's parameters): both
# caches hold a module's worth.
@functools.lru_cache(maxsize=1 << 14)
def _address_shape(operand: str) -> tuple[str, str | None] | None:
    """The base and the offset (None without) of an address operand; None for another shape."""
    m = _ADDR.match(operand)
    return m.group("base", "off") if m else None


@functools.lru_cache(maxsize=1 << 14)
def _address_code(move: str, base: str, off: str | None, space: str) -> str:
    text = f"mov.{move} %{PREFIX}_a, {base};"
    if off:
        text += f"\n\tadd.s64 %{PREFIX}_a, %{PREFIX}_a, {ptx.integer(off)};"
    if space == "global":
        text += f"\n\tcvta.global.u64 %{PREFIX}_a, %{PREFIX}_a;"
    return text


def _site_bits(word: int, size: int, flags: int, kind: int) -> tuple[int, int, int]:
    """A site's context word ``word`` but for the site's index: (the bits of size, flags and kind; the
    index's shift and mask in the word, mask 0 where it has none)."""
    shift, mask = next(((s, m) for name, s, m in _WORD_FIELDS[word] if name == "site"), (0, 0))
    return _pack(word, {"size": size, "flags": flags, "kind": kind}), shift, mask


def _pack(word: int, values: dict[str, int]) -> int:
    """Context word ``word`` made of the given field values (absent fields 0), little-endian."""
    v = 0
    for name, shift, mask in _WORD_FIELDS[word]:
        v |= (values.get(name, 0) & mask) << shift
    return v


class _Form(NamedTuple):
    """The sites of a kernel with one set of probes and values."""

    render: Callable[[int, str], str]   # (the site's index, its address code) -> the site's text
    address: bool                       # a probe reads the address (%__egpu_a)


def _renderer(refs: list[int], chunks: list[str],
              index_words: list[tuple[int, int, int]]) -> Callable[[int, str], str]:
    """A function joining the constant ``chunks`` and the fields ``refs`` between them (0: the index, 1: the
    address code, 2 on: the context words holding the index, from _site_bits) in one f-string: a module's
    tens of thousands of sites are rendered without parsing a template or building argument lists."""
    return _render_maker(tuple(refs), tuple(index_words))(*chunks)


@functools.lru_cache(maxsize=256)
def _render_maker(refs: tuple[int, ...], index_words: tuple[tuple[int, int, int], ...]) -> Callable[..., Callable]:
    """What makes _renderer's function from its chunks, compiled once per shape: kernels repeat their site shapes,
    and compiling one per kernel took a third of the rewrite of a module of 600 small kernels."""
    def field(r: int) -> str:
        if r < 2:
            return "{i}" if r == 0 else "{a}"
        bits, shift, mask = index_words[r - 2]
        return f"{{{bits} | (i & {mask}) << {shift}}}"
    body = "".join(f"{{c{k}}}{field(r)}" for k, r in enumerate(refs)) + f"{{c{len(refs)}}}"
    names = [f"c{k}" for k in range(len(refs) + 1)]
    consts = ", ".join(f"{c}={c}" for c in names)
    return eval(f'lambda {", ".join(names)}: lambda i, a, {consts}: f"{body}"', {})  # noqa: S307


def _calls(probes: list[ProbeSpec], ctxp: str, words: dict[int, str], inline: bool = False) -> str:
    """The calls of one site, thread scope first, each other scope behind its leader predicate; each
    passes ``ctxp``, the context's generic address (or ctx.NO_ADDRESS), or its context words
    (``words``: each one's operand). ``inline``: each probe's body in a scope of its own instead of a call."""
    p, lines = PREFIX, []
    for scope in ("thread", "warp", "block"):
        group = [pr for pr in probes if pr.attach.scope == scope]
        if not group:
            continue
        guard = ""
        if scope != "thread":
            lines += _leader(scope)
            guard = f"@%{p}_q "
        # An argument .param is consumed by its call (ptxas may reuse its storage inside the callee,
        # seen on sm_90 as a garbage ctx in the second call), so each call gets its own store.
        for pr in group:
            if inline:
                actual = [ctxp] if pr.ctx_words is None else [words[w] for w in pr.ctx_words]
                lines.append(_inlined(pr, actual, bool(guard)))
                continue
            if pr.ctx_words is None:
                lines += [f"st.param.b64 [{p}_arg], {ctxp};", f"{guard}call ({p}_ret), {pr.func}, ({p}_arg);"]
                continue
            lines += [f"st.param.b64 [{p}_cw{w}], {words[w]};" for w in pr.ctx_words]
            args = ", ".join(f"{p}_cw{w}" for w in pr.ctx_words)
            lines.append(f"{guard}call ({p}_ret), {pr.func}, ({args});")
        if guard:  # the leader rejoins its lanes here: the site's closing barrier alone did not do it
            lines.append(f"bar.warp.sync %{p}_m;")
    return "\n\t".join(lines)


def _inlined(probe: ProbeSpec, actual: list[str], guarded: bool) -> str:
    """The probe's body as one scope (PTX scopes its registers and labels), its parameters ``actual``, its
    rets jumping to the scope's end; ``guarded``: only the leader (%__egpu_q) runs it. Raises PtxError for a
    probe that calls a function (none is translated so today)."""
    formal, lines, _ = _inline_parts(probe)
    args = dict(zip(formal, actual, strict=True))
    body = [f"\tmov.b64 {line[0]}, {args[line[1]]};" if type(line) is tuple else line for line in lines]
    skip = [f"\t@!%{PREFIX}_q bra ${PREFIX}_end;"] * guarded
    return "\n".join(["{", *skip, *body, f"${PREFIX}_end:", "}"])


class _Inline(NamedTuple):
    formal: list[str]                        # the parameters' names
    lines: list[str | tuple[str, str]]       # the body; a (register, formal) pair for a parameter load
    stack: int                               # bytes of its .local stack, which the body reaches as _STACK


@functools.lru_cache(maxsize=256)
def _inline_parts(probe: ProbeSpec) -> _Inline:
    """A probe's body for _inlined: no result store, rets as branches to the end, and its .local stack (the
    emitter's __stack) declared once per kernel (_STACK, as large as the largest) instead of in each scope:
    ptxas gives each scope's .local its own place in the frame, so that a probe with a 472-byte stack inlined
    at 6 sites took a 2832-byte frame (the local memory the driver reserves for each resident thread)."""
    m = _PROBE_FUNC.search(probe.ptx.rstrip())   # the text's first .func, its body up to the text's last brace
    if m is None or ".func" in m.group("body") or _CALL.search(m.group("body")):
        raise PtxError(f"{probe.func} cannot be inlined after setmaxnreg (one .func without calls is needed)")
    formal = [a.split()[-1] for a in m.group("params").split(",") if a.strip()]
    body = m.group("body")
    decl = _STACK_DECL.search(body)
    if decl is not None:
        body = _STACK_NAME.sub(_STACK, body[:decl.start()] + body[decl.end():])
    lines: list[str | tuple[str, str]] = []
    for line in body.split("\n"):
        if (ld := _PARAM_LOAD.fullmatch(line.strip())) and ld.group(2) in formal:
            lines.append((ld.group(1), ld.group(2)))
        elif line.strip() and not _RESULT_STORE.fullmatch(line.strip()):
            lines.append(_RET.sub(rf"\1bra ${PREFIX}_end;", line))
    return _Inline(formal, lines, int(decl.group(1)) if decl else 0)


_PROBE_FUNC = re.compile(r"\.func \(\.param \.b64 %ret\) (?P<name>[\w$]+)\((?P<params>[^)]*)\)\s*\{\n(?P<body>.*)\n\}$",
                         re.S)
_CALL = re.compile(r"^\s*(?:@!?%\w+\s+)?call\b", re.M)
_PARAM_LOAD = re.compile(r"ld\.param\.b64 (%\w+), \[(%\w+)\];")
_RESULT_STORE = re.compile(r"st\.param\.b64 \[%ret\], %\w+;")
_RET = re.compile(r"^(\s*(?:@!?%\w+\s+)?)ret;$", re.M)
_STACK = f"{PREFIX}_stack"
_RESERVED = re.compile(rf"(?<![A-Za-z0-9_]){PREFIX}")   # a name of egpu's (%__egpu_q, $__egpu_end), not x__egpu
_STACK_DECL = re.compile(r"^\s*\.local \.align 8 \.b8 __stack\[(\d+)\];$", re.M)   # emitter.FuncGen.declarations
_STACK_NAME = re.compile(r"(?<![\w$%])__stack\b")


def _leader(scope: str) -> list[str]:
    """%__egpu_q := this thread is the scope's leader (PTX ISA: %lanemask_eq, %tid)."""
    p = PREFIX
    # warp: the lowest lane of the mask the site began with (%__egpu_m), not of a fresh activemask: a
    # thread-scope probe called before may have diverged, and lanes not yet back together would each
    # elect a leader of their own.
    if scope == "warp":
        return [f"neg.s32 %{p}_v, %{p}_m;", f"and.b32 %{p}_w, %{p}_m, %{p}_v;",
                f"mov.u32 %{p}_v, %lanemask_eq;", f"setp.eq.u32 %{p}_q, %{p}_w, %{p}_v;"]
    return [f"mov.u32 %{p}_w, %tid.x;", f"mov.u32 %{p}_v, %tid.y;", f"or.b32 %{p}_w, %{p}_w, %{p}_v;",
            f"mov.u32 %{p}_v, %tid.z;", f"or.b32 %{p}_w, %{p}_w, %{p}_v;",
            f"setp.eq.u32 %{p}_q, %{p}_w, 0;"]


def _load_param(par: ptx.Param) -> list[str]:
    """ld.param of one kernel parameter into %__egpu_t, zero-extended."""
    p = PREFIX
    width = max(w for w in (8, 4, 2, 1) if w <= par.size and w <= par.align)
    if width >= 8:
        return [f"ld.param.b64 %{p}_t, [{par.name}];"]
    if width >= 4:
        return [f"ld.param.b32 %{p}_w, [{par.name}];", f"cvt.u64.u32 %{p}_t, %{p}_w;"]
    kind = "b16" if width == 2 else "u8"
    return [f"ld.param.{kind} %{p}_h, [{par.name}];", f"cvt.u64.u16 %{p}_t, %{p}_h;"]


class Access(NamedTuple):   # a tuple: one is made per memory site
    flags: int         # C.FLAG_*
    space: str         # "global" or "" (generic)
    operand: str       # the address operand, "[%rd1+16]"
    size: int          # bytes


def memory_access(ins: ptx.Instruction) -> Access | None:
    """The global or generic memory access an instruction makes, or None (other spaces, non-memory)."""
    kind = _opcode_access(ins.opcode)
    if kind is None:
        return None
    flags, space, size = kind
    if ins.op == "cp":   # cp.async [dst], [src], cp-size{, src-size}: the global side is src
        addrs, operands = _BRACKETS.findall(ins.args), ins.operands
        if len(addrs) < 2 or len(operands) < 3:
            raise PtxError(f"{ins.opcode} with operands {ins.args!r}")
        return Access(flags, space, addrs[1], ptx.integer(operands[2]))
    first = _BRACKETS.search(ins.args)
    if first is None:
        raise PtxError(f"{ins.opcode} without an address operand")
    return Access(flags, space, first.group(), size)


_BRACKETS = re.compile(r"\[[^\]]*\]")


@functools.lru_cache(maxsize=4096)
def _opcode_access(opcode: str) -> tuple[int, str, int] | None:
    """(flags, space, size) for an opcode that accesses global or generic memory (size 0: cp.async,
    whose size is an operand); None for any other opcode. Cached: kernels repeat few opcodes."""
    parts = opcode.split(".")
    flags = _MEMORY_OPS.get(parts[0])
    if flags is None:
        return None
    if "" in parts:
        raise PtxError(f"{opcode}: an empty part in the opcode")
    if parts[0] == "st" and parts[1:2] == ["bulk"]:   # zeroes shared memory, generic address or not (PTX ISA 8.6)
        return None
    spaces = {q.split("::")[0] for q in parts[1:]} & set(_SPACES)
    if parts[0] == "cp":
        ok = len(parts) > 2 and parts[1] == "async" and parts[2] in ("ca", "cg") and "global" in spaces
        return (flags, "global", 0) if ok else None
    if spaces - {"global"}:
        return None
    types = [q for q in parts[1:] if q in ptx.TYPE_SIZES]
    if not types:
        raise PtxError(f"{opcode}: no access type")
    vec = next((int(q[1:]) for q in parts[1:] if q[0] == "v" and q[1:].isdigit()), 1)
    return flags, "global" if spaces else "", vec * ptx.TYPE_SIZES[types[-1]]


# Texture and surface instructions (PTX ISA 9.7.10, 9.7.11) read or write global memory through a handle.
_HANDLE_ACCESSES = frozenset({"tex", "tld4", "suld", "sust", "sured"})
_UNSEEN_OPS = frozenset({"wmma", "cp", "multimem"}) | _HANDLE_ACCESSES
_MULTIMEM_ACCESSES = ("ld_reduce", "st", "red")   # multimem.*: global memory of every GPU of a multicast group


@functools.lru_cache(maxsize=1024)
def unseen_access(opcode: str) -> str | None:
    """The name of a global or generic memory access that is no site (its addresses are a matrix fragment's,
    a bulk copy's size is a register, a multimem address stands for one on each GPU of the group, a texture or
    surface access names a handle), for the kernel's status to say so; None for any other opcode."""
    parts = opcode.split(".")
    if parts[0] in _HANDLE_ACCESSES:
        return parts[0]
    if parts[0] == "multimem" and len(parts) > 1 and parts[1] in _MULTIMEM_ACCESSES:
        return f"multimem.{parts[1]}"
    if parts[0] == "wmma" and len(parts) > 1 and parts[1] in ("load", "store") and "shared" not in parts:
        return f"wmma.{parts[1]}"
    spaces = {q.split("::")[0] for q in parts}
    if parts[0] == "cp" and "bulk" in parts and "global" in spaces and "prefetch" not in parts:
        end = parts.index("bulk") + 1
        return ".".join(parts[:end + (parts[end:end + 1] == ["tensor"])])
    return None


class _Calls:
    """What the ``.func``s a kernel calls do, directly or through others, each body read once per module:
    - setmaxnreg, there or in the kernel's own body (warp-specialized Hopper kernels), leaves a warp fewer
      registers than at entry; ptxas cannot allocate a call to a hash-map probe there (C7600, or minutes with
      loops), but assembles its body inlined. One in a called .func (a __noinline__ device function, a
      library's) counts: ptxas compiles the caller's probe calls with the registers the callee leaves, and a
      call through a register may reach any .func of the module.
    - Global or generic memory accesses in them have no sites (a function has no context), so the kernel's
      status counts them as unseen (a -G build calls every __device__ function; recursion and __noinline__
      too); a call through a register is not followed there.
    A .func declared without a body here (another module's) is not followed: ptxas 13.0 ignores setmaxnreg
    across compilation units (C7504), and its accesses are not in this text."""

    def __init__(self, mod: ptx.Module) -> None:
        self.maxnreg = "setmaxnreg" in mod.text   # only then is a kernel's call graph read for it
        self.funcs = {f.name: f for f in mod.functions if f.kind == "func" and f.body_open is not None}
        self.read: dict[str, _Body] = {}

    def sets_maxnreg(self, kernel: ptx.Function) -> bool:
        return self.maxnreg and any(self._body(f).sets_maxnreg for f in self._reached([kernel], indirect=True))

    def unseen(self, callees: Iterable[str]) -> collections.Counter[str]:
        """``in NAME`` -> the accesses of each .func reached from a kernel's calls to ``callees`` (its walk over
        its sites collects them: the kernel's body is not walked again here)."""
        start = [self.funcs[n] for n in sorted(callees) if n in self.funcs]
        return collections.Counter({f"in {f.name}": n for f in self._reached(start, indirect=False)
                                    if (n := self._body(f).accesses)})

    def _reached(self, start: list[ptx.Function], indirect: bool) -> list[ptx.Function]:
        """``start``, then each .func of the module their calls reach."""
        out, seen, todo = [], {f.name for f in start}, list(start)
        while todo:
            fn = todo.pop()
            out.append(fn)
            body = self._body(fn)
            names = body.callees | set(self.funcs) if indirect and body.indirect else body.callees
            todo += [self.funcs[n] for n in sorted(names - seen)]
            seen |= names
        return out

    def _body(self, fn: ptx.Function) -> "_Body":
        if fn.name not in self.read:
            self.read[fn.name] = _Body.of(fn, self.funcs.keys())
        return self.read[fn.name]


class _Body(NamedTuple):
    sets_maxnreg: bool
    accesses: int             # global or generic memory accesses
    callees: frozenset[str]   # the module's .funcs it calls by name
    indirect: bool            # whether it calls through a register

    @classmethod
    def of(cls, fn: ptx.Function, funcs: Iterable[str]) -> "_Body":
        try:
            stmts = fn.statements()
        except PtxError:   # a body the parser does not take: read as the text says, its calls not followed
            return cls("setmaxnreg" in fn.text[fn.start:fn.end], 0, frozenset(), False)
        sets, accesses, callees, indirect = False, 0, set(), False
        for st in stmts:
            if type(st) is not ptx.Instruction:
                continue
            if st.op == "setmaxnreg":
                sets = True
            elif st.op == "call":
                target = ptx.call_target(st.operands)[0] or "%"
                indirect |= target[0] == "%"
                callees.add(target)
            elif st.op in _MEMORY_OPS or st.op in _UNSEEN_OPS:
                try:
                    accesses += _opcode_access(st.opcode) is not None or unseen_access(st.opcode) is not None
                except PtxError:   # an opcode the rewriter could not place in a kernel: an access still
                    accesses += 1
        return cls(sets, accesses, frozenset(callees & set(funcs)), indirect)


_UNSEEN_NAMED = 6   # kinds named in a status; a -G kernel may call dozens of functions with long mangled names


def _unseen_note(unseen: collections.Counter[str]) -> str:
    n = sum(unseen.values())
    items = sorted(unseen.items())
    what = ", ".join(f"{name} x{count}" for name, count in items[:_UNSEEN_NAMED])
    if len(items) > _UNSEEN_NAMED:
        what += f", {len(items) - _UNSEEN_NAMED} more"
    return f"{n} global memory access{'es' if n > 1 else ''} that memory probes do not see ({what})"


class _Registers:
    """Widths of the registers declared so far, by scope (``.reg .b64 %rd<11>;``, ``.reg .u32 a, b;``)."""

    def __init__(self) -> None:
        self.scopes: list[dict[str, tuple[int, int]]] = [{}]   # name or "stem<>" -> (width, count of a range)
        self._known: dict[str, int | None] = {}   # width's answers since the declarations last changed

    def see(self, st: ptx.Stmt) -> None:
        if isinstance(st, ptx.Open):
            self.scopes.append({})
        elif isinstance(st, ptx.Close):
            if len(self.scopes) > 1:
                self.scopes.pop()
                self._known.clear()
        elif isinstance(st, ptx.Directive) and st.name == ".reg":
            self._known.clear()
            words = st.text.replace(",", " ").split()
            types = [w[1:] for w in words[1:] if w.startswith(".") and w[1:] in ptx.TYPE_SIZES]
            if not types:
                return
            width = 8 * ptx.TYPE_SIZES[types[0]]
            for w in words[1:]:
                if not w.startswith("."):
                    name, _, count = w.partition("<")   # %rd<11> declares %rd0..%rd10 (PTX ISA 5.1.4)
                    count = count.rstrip(">")
                    self.scopes[-1][name + ("<>" if _ else "")] = (width, int(count) if count.isdigit() else 0)

    def width(self, reg: str) -> int | None:
        known = self._known.get(reg, False)
        if known is not False:
            return known
        known = self._known[reg] = self._width(reg)
        return known

    def _width(self, reg: str) -> int | None:
        stem = reg.rstrip("0123456789")
        for scope in reversed(self.scopes):
            if reg in scope:
                return scope[reg][0]
            declared = scope.get(stem + "<>") if stem != reg else None
            if declared is not None and int(reg[len(stem):]) < declared[1]:   # a range hides only its own
                return declared[0]
        return None
