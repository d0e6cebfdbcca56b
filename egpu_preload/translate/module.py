"""Whole PTX texts: a probe's ``.func`` for the instrumentation, and self-contained modules that run
programs for execute_on_gpu, its batch form and the probe runner of the GPU tests."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..bpf.ctx import ALL_FIELDS, SIZE as CTX_SIZE, fields_at, words_at
from ..bpf.decode import decode
from ..bpf.program import BpfObject, Program
from ..bpf.sections import HOST_SIDE
from ..bpf.verifier import VerifiedProgram, verify
from ..errors import EgpuError, TranslateError, VerifierError
from .codegen import generate_func
from .emitter import Target
from .striping import stripe_counters

# match.sync, ld.acquire / st.release (PTX 6.0), activemask (6.2), nanosleep (6.3); all sm_70+.
PTX_VERSION = (6, 3)
SM_MIN = 70
EXEC_PARAMS = ["%mem", "%len"]   # execute_on_gpu: r1 = memory, r2 = its length
PROBE_PARAMS = ["%ctx"]          # probes: r1 = struct egpu_ctx


@dataclass(frozen=True)
class ProbePtx:
    """One program as PTX to paste into a module (see probe_function)."""

    name: str                 # the .func to call
    func: str                 # its definition
    globals: tuple[str, ...]  # module-level declarations it needs (the map table); paste each once per module
    table: str                # the map table symbol: len(obj.maps) + 1 device addresses (devmaps.py)
    version: tuple[int, int] = PTX_VERSION
    sm: int = SM_MIN
    ctx_fields: frozenset[str] = ALL_FIELDS   # the struct egpu_ctx fields it reads (bpf/ctx.py names)
    ctx_words: tuple[int, ...] | None = None  # its parameters: these context words; None: %ctx, an address

    def text(self) -> str:
        return "\n".join(self.globals) + "\n" + self.func


def header(version: tuple[int, int] = PTX_VERSION, sm: int = SM_MIN) -> str:
    return f".version {version[0]}.{version[1]}\n.target sm_{sm}\n.address_size 64\n"


def _ident(s: str) -> str:
    """A PTX identifier's characters for a C name, one to one: names that differ only in characters PTX lacks
    (C takes $ and UTF-8) must not become one function. Each such character is $<hex>$; $ itself is one."""
    return re.sub(r"[^A-Za-z0-9_]", lambda m: f"${ord(m[0]):x}$", s)


def object_tag(obj: BpfObject) -> str:
    """A stable tag for an object's module-level names: FNV-1a 32 of its path and program names."""
    h = 0x811C9DC5
    for b in (obj.path + "|" + "|".join(p.name for p in obj.programs)).encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return f"{h:08x}"


def table_symbol(tag: str) -> str:
    return f"__egpu_maps_{tag}"


def table_decl(tag: str, nmaps: int) -> str:
    return f".visible .const .align 8 .u64 {table_symbol(tag)}[{nmaps + 1}];"


def probe_function(program: Program, obj: BpfObject, tag: str | None = None,
                   verified: VerifiedProgram | None = None, table_param: bool = False,
                   ctx_params: bool = False) -> ProbePtx:
    """Verify (unless ``verified`` is the verifier's result for it) and translate one program of a
    loaded object into a PTX function; raises VerifierError for a program the verifier refuses.

    Signature: ``.func (.param .b64 %ret) __egpu_<tag>_<program>(.param .b64 %ctx)`` where ``%ctx`` is
    the generic address of a ``struct egpu_ctx`` (bpf/ctx.py, usually in the caller's local memory) and
    ``%ret`` receives r0. The probe reaches its maps through the ``.const`` table
    ``__egpu_maps_<tag>`` (``len(obj.maps) + 1`` u64 device addresses: the maps, then the trace ring;
    filled by the runtime after loading the module, see devmaps.py). ``tag`` (default: object_tag) makes
    the names unique per probe object; every program of one object shares its table. The code needs
    ``.version 6.3`` and ``.target sm_70`` or newer, ``.address_size 64``.

    ``table_param`` (the SASS back end, sass_patch.py): no ``.const`` table; the function takes the table's
    global address as a second parameter, ``(.param .b64 %ctx, .param .b64 %maps)``, and ``globals`` is empty.

    ``ctx_params`` (instrumented kernels): the context in registers where it can be, so that a site
    stores nothing to local memory and the constants every site of a kernel passes fold into that
    kernel's copy of the probe (ptxas compiles one per calling kernel). The function then takes
    ``(.param .b64 %cw<w>, ...)``, one per 8-byte context word the program reads (ProbePtx.ctx_words,
    ascending), and r1 is ctx.NO_ADDRESS. That holds when the verifier saw every context load at one
    offset on all paths; otherwise the %ctx form is used.
    """
    tag = tag or object_tag(obj)
    name = f"__egpu_{tag}_{_ident(program.name)}"
    if verified is None:
        verified = verify(program.code, obj.maps, file=obj.path, section=program.section)
    words = words_at(verified.ctx_reads) if ctx_params and None not in verified.ctx_at.values() else None
    target = Target(tag, tuple(obj.maps), table_symbol(tag), table_param, words)
    try:
        func = generate_func(list(verified.insns), target, name, [] if words is not None else PROBE_PARAMS,
                             verified)
    except EgpuError as e:
        raise e.where(file=obj.path, section=program.section)
    return ProbePtx(name, func, () if table_param else (table_decl(tag, len(obj.maps)),), table_symbol(tag),
                    ctx_fields=fields_at(verified.ctx_reads), ctx_words=words)


def probe_object_ptx(obj: BpfObject, tag: str | None = None) -> str:
    """Every program of an object in one module text (what ``egpu ptx`` prints), as instrumented
    kernels call them (the context in words where it can be); the programs the host runs (launch, uvm, host-API
    and uprobe programs: bpf/sections.py HOST_SIDE), which never run on a GPU, left out."""
    tag = tag or object_tag(obj)
    stripe_counters(obj)
    funcs = [probe_function(p, obj, tag, ctx_params=True) for p in obj.programs
             if p.attach.kind not in HOST_SIDE]
    return header() + "\n" + table_decl(tag, len(obj.maps)) + "\n\n" + "\n".join(f.func for f in funcs)


# ---- execute_on_gpu modules --------------------------------------------------------------------

EXEC_KERNEL = "egpu_exec"
DESC_SIZE = 24  # per program: u64 memory address, u64 length, u64 r0 (out)


def _exec_func(code: bytes, name: str) -> str:
    """vm.execute's contract covers programs the verifier refuses (writes through r1, misaligned
    accesses, bounded recursion): those are translated without its facts, the others with them."""
    try:
        verified: VerifiedProgram | None = verify(code, [])
    except VerifierError:
        verified = None
    insns = list(verified.insns) if verified is not None else decode(code)
    return generate_func(insns, Target("exec"), name, EXEC_PARAMS, verified)


def _call(func: str, args: list[str], ret: str) -> list[str]:
    params = [f"\t\t.param .b64 %a{k};" for k in range(len(args))]
    stores = [f"\t\tst.param.b64 [%a{k}], {a};" for k, a in enumerate(args)]
    return ["\t{", "\t\t.param .b64 %rv;", *params, *stores,
            f"\t\tcall.uni (%rv), {func}, ({', '.join(f'%a{k}' for k in range(len(args)))});",
            f"\t\tld.param.b64 {ret}, [%rv];", "\t}"]


def _grid_index(q_regs: int) -> list[str]:
    """A runner's registers (%i, %q<q_regs>, %stop) and its opening: %i0 = the thread's global index in a
    grid of any shape, x fastest ((z * height + y) * width + x, bpftime's; a 1-D launch's is its x
    index); threads at or past the parameter n go to $Ldone."""
    lines = ["\t.reg .b32 %i<7>;", f"\t.reg .b64 %q<{q_regs}>;", "\t.reg .pred %stop;"]
    for k, axis in enumerate("xyz"):   # %i<k>: the coordinate across the grid; %i5, %i6: width, height
        lines += [f"\tmov.u32 %i3, %ctaid.{axis};", f"\tmov.u32 %i4, %ntid.{axis};", f"\tmov.u32 %i{k}, %tid.{axis};",
                  f"\tmad.lo.u32 %i{k}, %i3, %i4, %i{k};"]
        if axis != "z":
            lines += [f"\tmov.u32 %i3, %nctaid.{axis};", f"\tmul.lo.u32 %i{5 + k}, %i3, %i4;"]
    return lines + ["\tmad.lo.u32 %i2, %i2, %i6, %i1;", "\tmad.lo.u32 %i0, %i2, %i5, %i0;",
                    "\tld.param.u32 %i3, [%n];", "\tsetp.ge.u32 %stop, %i0, %i3;", "\t@%stop bra $Ldone;"]


def batch_ptx(codes: list[bytes]) -> str:
    """One module running program k in global thread k: ``egpu_exec(.param .u64 descs, .param .u32 n)``
    where descs points to n DESC_SIZE-byte descriptors; each thread stores its r0 in its descriptor.
    Dispatch is one indexed branch (brx.idx) to a direct call, so ptxas sees every callee's stack."""
    if not codes:
        raise TranslateError("no programs to run")
    funcs = []
    for k, code in enumerate(codes):
        try:
            funcs.append(_exec_func(code, f"egpu_prog{k}"))
        except EgpuError as e:
            raise e.where(section=f"program {k}") if len(codes) > 1 else e
    body = [
        f".visible .entry {EXEC_KERNEL}(.param .u64 %descs, .param .u32 %n)",
        "{",
        *_grid_index(5),
        "\tld.param.u64 %q0, [%descs];",
        f"\tmad.wide.u32 %q0, %i0, {DESC_SIZE}, %q0;",
        "\tld.u64 %q1, [%q0];",
        "\tld.u64 %q2, [%q0+8];",
        f"$Ltargets: .branchtargets {', '.join(f'$Lp{k}' for k in range(len(codes)))};",
        "\tbrx.idx %i0, $Ltargets;",
    ]
    for k in range(len(codes)):
        body.append(f"$Lp{k}:")
        body += _call(f"egpu_prog{k}", ["%q1", "%q2"], "%q3")
        body.append("\tbra $Lstore;")
    body += ["$Lstore:", "\tst.u64 [%q0+16], %q3;", "$Ldone:", "\tret;", "}", ""]
    return header() + "\n" + "\n".join(funcs) + "\n" + "\n".join(body)


def entries_ptx(codes: list[bytes]) -> str:
    """The programs of batch_ptx with one ``.entry egpu_exec<k>(.param .u64 desc)`` each instead of one
    dispatching kernel, so that ``ptxas -v`` reports registers and stack per program."""
    funcs = [_exec_func(code, f"egpu_prog{k}") for k, code in enumerate(codes)]
    entries = []
    for k in range(len(codes)):
        entries += [f".visible .entry {EXEC_KERNEL}{k}(.param .u64 %desc)", "{", "\t.reg .b64 %q<4>;",
                    "\tld.param.u64 %q0, [%desc];", "\tld.u64 %q1, [%q0];", "\tld.u64 %q2, [%q0+8];",
                    *_call(f"egpu_prog{k}", ["%q1", "%q2"], "%q3"), "\tst.u64 [%q0+16], %q3;", "\tret;", "}", ""]
    return header() + "\n" + "\n".join(funcs) + "\n" + "\n".join(entries)


def program_to_ptx(code: bytes) -> str:
    """The self-contained module execute_on_gpu loads: ``egpu_exec`` runs the program in thread 0 with
    r1 = the memory, r2 = its length (descriptor layout of batch_ptx)."""
    return batch_ptx([code])


# ---- the probe runner of the GPU tests and benchmarks -----------------------------------------

RUN_KERNEL = "egpu_probe_run"


def probe_runner_ptx(probe: ProbePtx, calls: int = 1, kernel: str = RUN_KERNEL) -> str:
    """``egpu_probe_run(.param .u64 ctx, .param .u64 r0s, .param .u32 n)``: global threads 0..n-1 (of a
    grid of any shape, _grid_index) each pass the CTX_SIZE-byte context at ctx as instrumented kernels do
    (the words the probe takes, or a copy in local memory), call the probe ``calls`` times (0: the same
    kernel without the probe, the benchmarks' baseline) and store the last r0 at r0s[i] (when r0s is not
    0)."""
    words = probe.ctx_words
    body = [
        f".visible .entry {kernel}(.param .u64 %src, .param .u64 %r0s, .param .u32 %n)",
        "{",
        *_grid_index(6),
        "\tld.param.u64 %q0, [%src];",
    ]
    if words is None:
        body.insert(2, f"\t.local .align 8 .b8 ctxbuf[{CTX_SIZE}];")
        for w in range(CTX_SIZE // 8):
            body += [f"\tld.u64 %q1, [%q0+{8 * w}];", f"\tst.local.u64 [ctxbuf+{8 * w}], %q1;"]
        body.append("\tcvta.local.u64 %q2, ctxbuf;")
        args = ["%q2"]
    else:
        body.insert(2, f"\t.reg .b64 %cv<{max(len(words), 1)}>;")
        body += [f"\tld.u64 %cv{k}, [%q0+{8 * w}];" for k, w in enumerate(words)]
        args = [f"%cv{k}" for k in range(len(words))]
    body.append("\tmov.b64 %q3, 0;")
    for _ in range(calls):
        body += _call(probe.name, args, "%q3")
    body += ["\tld.param.u64 %q4, [%r0s];", "\tsetp.eq.u64 %stop, %q4, 0;", "\t@%stop bra $Ldone;",
             "\tmad.wide.u32 %q4, %i0, 8, %q4;", "\tst.u64 [%q4], %q3;", "$Ldone:", "\tret;", "}", ""]
    return header(probe.version, probe.sm) + "\n" + probe.text() + "\n" + "\n".join(body)
