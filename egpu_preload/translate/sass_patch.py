"""The SASS back end's patch module: egpu probes as Compute Sanitizer patch functions.

NVIDIA's patching API (sanitizer_patching.h) calls a tool's device functions at instruction classes of
kernels that ship no PTX. ``patch_module`` makes one PTX module holding every kernel-site program of
the probe objects, each translated with ``table_param`` (its map table arrives as a parameter: the
sanitizer loads this module itself, so nobody could fill a ``.const`` table), and three entry points
with the patch ABI (``extern "C" __device__ __noinline__``, the enum result in ``.param .b32``):

    ENTER  SanitizerPatchResult f(void *userdata, uint64_t pc)                 BLOCK_ENTER (per thread)
    EXIT   SanitizerPatchResult f(void *userdata, uint64_t pc)                 BLOCK_EXIT
    MEM    SanitizerPatchResult f(void *userdata, uint64_t pc, void *ptr,     GLOBAL_MEMORY_ACCESS
                                  uint32_t size, uint32_t flags, const void *pData)

Their names end in the module text's digest (``egpu_sass_block_enter_<12 hex>``): a job patches with
one image after another as probes are attached and swapped (shim/sass.c's generations), all of them
loaded in the same context.

Each builds a ``struct egpu_ctx`` (bpf/ctx.py) in local memory, as the PTX rewriter does, and calls the
programs whose bit is set in the launch record's mask. ``userdata`` is the launch record the runtime
writes at every launch (shim/sass.c, RECORD below); NULL (a kernel no probe selects) returns at once.
ctx fields on this back end: kernel_id and launch_id as on the PTX back end; site = the SASS
instruction index, (pc - function start) / 16; addr, size as the hardware accesses them; flags from
Sanitizer_DeviceMemoryFlags (READ load, WRITE store, both or ATOMSYS atomic, so a ``red`` counts as a
store); grid and block from %nctaid and %ntid; stream the launch's, as the sanitizer reports it; args
and nargs are zero (a patch cannot see the kernel's parameters). Only the context words a program
reads are made, and a program whose reads the verifier pinned to fixed offsets takes them as
parameters (module.probe_function's ``ctx_params``), as in instrumented kernels: no local memory at all.
Scopes as in rewrite.py: warp = the lowest lane of ``activemask`` at the call, block = thread (0,0,0).

``build_image`` runs ``ptxas --compile-as-tools-patch`` once per (module text, sm) and keeps the cubin
in a cache directory (the session's), so the application's processes find it built.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..bpf import ctx as C
from ..bpf.program import Attach, BpfObject
from ..errors import TranslateError
from .emitter import DIM_REGISTERS, lit, packed_word
from .module import PTX_VERSION, SM_MIN, header, probe_function

ENTER, EXIT, MEM = "egpu_sass_block_enter", "egpu_sass_block_exit", "egpu_sass_global_access"
# Sanitizer_InstructionId values (sanitizer_patching.h) of the classes each entry point patches.
INSTRUCTION_IDS = {ENTER: 1, EXIT: 2, MEM: 3}
KINDS = {"entry": ENTER, "exit": EXIT, "mem": MEM, "load": MEM, "store": MEM}
MAX_PROGRAMS = 64   # one bit each in the record's mask


@dataclass(frozen=True)
class Record:
    """The launch record (device memory, one per launch): what the patch functions read through userdata.
    shim/sass.c writes it; its struct must match these offsets."""

    KERNEL_ID = 0    # u64 ctx.kernel_id
    LAUNCH_ID = 8    # u64 ctx.launch_id
    START = 16       # u64 the function's first instruction (sanitizerGetFunctionPcAndSize)
    MASK = 24        # u64 bit k: program k runs in this kernel
    TABLES = 32      # u64 global address of the table block (each object's map table, back to back)
    GENERATION = 40  # u64 the generation whose image patched the kernel (read by the stand-in, not here)
    STREAM = 48      # u64 ctx.stream: the launch's CUstream (the sanitizer's hStream)
    SIZE = 56


RECORD = Record()


@dataclass(frozen=True)
class PatchProgram:
    bit: int          # its bit in Record.MASK
    obj: int          # index of its object: its table starts at PatchModule.table_offsets[obj]
    program: int      # index of the program in its object
    attach: Attach
    func: str
    words: tuple[int, ...] | None = None   # the context words it takes as parameters; None: a %ctx address
    fields: frozenset[str] = C.ALL_FIELDS  # the context fields it reads (what a %ctx must hold)


@dataclass(frozen=True)
class PatchModule:
    ptx: str
    programs: tuple[PatchProgram, ...]
    table_offsets: tuple[int, ...]   # byte offset of each object's table in the table block
    entries: tuple[str, ...]         # the entry points defined (only classes some program uses), as in ptx
    image_id: int                    # names the text: several images share a context, and a module is
                                     # patched with one image's entry points, so they carry it in their names

    def instruction_classes(self) -> int:
        """Bit (1 << Sanitizer_InstructionId) per class to patch: what shim/sass.c is told."""
        return sum(1 << INSTRUCTION_IDS[_base(e)] for e in self.entries)

    def entry_names(self) -> list[str | None]:
        """The entry point by Sanitizer_InstructionId (index 0 unused): what egpu_sass_stage takes."""
        out: list[str | None] = [None] * (max(INSTRUCTION_IDS.values()) + 1)
        for e in self.entries:
            out[INSTRUCTION_IDS[_base(e)]] = e
        return out


def _base(entry: str) -> str:
    return entry.rsplit("_", 1)[0]


def has_sites(objects: list[BpfObject]) -> bool:
    """Whether any program of these objects runs at a kernel site (so a patch module would have one)."""
    return any(prog.attach.kind in KINDS for obj in objects for prog in obj.programs)


def patch_module(objects: list[BpfObject]) -> PatchModule:
    """The patch module for these (loaded, verifiable) probe objects; raises VerifierError or
    TranslateError as probe_function does, and TranslateError past MAX_PROGRAMS programs."""
    programs, funcs, offsets = [], [], []
    version, offset = PTX_VERSION, 0
    for j, obj in enumerate(objects):
        offsets.append(offset)
        offset += 8 * (len(obj.maps) + 1)
        for i, prog in enumerate(obj.programs):
            if prog.attach.kind not in KINDS:
                continue
            if len(programs) == MAX_PROGRAMS:
                raise TranslateError(f"more than {MAX_PROGRAMS} kernel-site programs for the SASS back end",
                                     file=obj.path, section=prog.section)
            pp = probe_function(prog, obj, table_param=True, ctx_params=True)
            programs.append(PatchProgram(len(programs), j, i, prog.attach, pp.name, pp.ctx_words, pp.ctx_fields))
            funcs.append(pp.func)
            version = max(version, pp.version)
    bases = tuple(e for e in (ENTER, EXIT, MEM) if any(KINDS[p.attach.kind] == e for p in programs))
    body = [_entry(e, [p for p in programs if KINDS[p.attach.kind] == e], offsets) for e in bases]
    text = header(version, SM_MIN) + "\n" + "\n".join(funcs) + "\n" + "\n".join(body)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    entries = tuple(f"{e}_{digest}" for e in bases)
    for base, entry in zip(bases, entries):   # an entry's name is used once, in its own .func line
        text = text.replace(f" {base}(", f" {entry}(", 1)
    return PatchModule(text, tuple(programs), tuple(offsets), entries, int(digest, 16))


def _entry(name: str, programs: list[PatchProgram], offsets: list[int]) -> str:
    mem = name == MEM
    params = ["%ud", "%pc"] + (["%ptr", "%size", "%flags", "%data"] if mem else [])
    types = {"%size": ".b32", "%flags": ".b32"}
    by_ctx = [p for p in programs if p.words is None]
    stored = _words_holding(frozenset().union(*(p.fields for p in by_ctx)))
    words = sorted(stored.union(*(p.words for p in programs if p.words is not None)))
    out = [f".visible .func (.param .b32 %res) {name}("
           + ", ".join(f".param {types.get(p, '.b64')} {p}" for p in params) + ")", "{",
           *([f"\t.local .align 8 .b8 __ctx[{C.SIZE}];"] if by_ctx else []),
           "\t.reg .b64 %u, %mask, %tab, %c, %t<3>;", "\t.reg .b32 %w<4>, %flags_e;", "\t.reg .pred %p<2>;",
           *(f"\t.reg .b64 %cw{w};" for w in words),
           "\tld.param.b64 %u, [%ud];", "\tsetp.eq.u64 %p0, %u, 0;", "\t@%p0 bra $Ldone;"]
    if mem:
        # Sanitizer_DeviceMemoryFlags: READ 1, WRITE 2, ATOMSYS 4, PREFETCH 8. A prefetch is no access.
        out += ["\tld.param.b32 %w0, [%flags];", "\tand.b32 %flags_e, %w0, 3;", "\tsetp.eq.u32 %p0, %flags_e, 0;",
                "\t@%p0 bra $Ldone;", "\tsetp.eq.u32 %p1, %flags_e, 3;", "\tand.b32 %w1, %w0, 4;",
                "\tsetp.ne.or.u32 %p1, %w1, 0, %p1;", f"\tselp.b32 %w1, {C.FLAG_ATOMIC}, 0, %p1;",
                "\tor.b32 %flags_e, %flags_e, %w1;"]
    out += [f"\tld.global.u64 %mask, [%u+{RECORD.MASK}];", f"\tld.global.u64 %tab, [%u+{RECORD.TABLES}];"]
    for w in words:
        out += _word(name, w)
    if by_ctx:
        out += [f"\tst.local.u64 [__ctx+{8 * w}], %cw{w};" for w in sorted(stored)]
        out.append("\tcvta.local.u64 %c, __ctx;")
    for p in programs:
        skip = f"$Lskip{p.bit}"
        out += [f"\tand.b64 %t0, %mask, {lit(1 << p.bit)};", "\tsetp.eq.u64 %p0, %t0, 0;", f"\t@%p0 bra {skip};"]
        want = {"load": C.FLAG_LOAD, "store": C.FLAG_STORE}.get(p.attach.kind)
        if want:
            out += [f"\tand.b32 %w0, %flags_e, {want};", "\tsetp.eq.u32 %p0, %w0, 0;", f"\t@%p0 bra {skip};"]
        out += _scope(p.attach.scope, skip)
        args = ["%c"] if p.words is None else [f"%cw{w}" for w in p.words]
        formal = [f"%a{k}" for k in range(len(args) + 1)]
        out += [f"\tadd.u64 %t1, %tab, {offsets[p.obj]};", "\t{", "\t\t.param .b64 %rv;",
                *(f"\t\t.param .b64 {a};" for a in formal),
                *(f"\t\tst.param.b64 [{a}], {v};" for a, v in zip(formal, [*args, "%t1"])),
                f"\t\tcall (%rv), {p.func}, ({', '.join(formal)});", "\t}", f"{skip}:"]
    out += ["$Ldone:", "\tmov.u32 %w0, 0;", "\tst.param.b32 [%res], %w0;   // SANITIZER_PATCH_SUCCESS", "\tret;",
            "}", ""]
    return "\n".join(out)


def _words_holding(fields: frozenset[str]) -> frozenset[int]:
    """The context words that hold any element of these fields."""
    return frozenset(el.offset // 8 for el in C.ELEMENTS if el.field.name in fields)


def _word(entry: str, word: int) -> list[str]:
    """PTX leaving context word ``word`` in %cw<word> at this entry point (bpf/ctx.py's layout; the
    fields this back end cannot give are 0)."""
    reg = f"%cw{word}"
    whole = {C.BY_NAME[n].offset // 8: n for n in ("kernel_id", "launch_id", "addr", "stream")}
    if word in whole:
        name = whole[word]
        if name == "addr":
            return [f"\tld.param.b64 {reg}, [%ptr];" if entry == MEM else f"\tmov.b64 {reg}, 0;"]
        at = {"kernel_id": RECORD.KERNEL_ID, "launch_id": RECORD.LAUNCH_ID, "stream": RECORD.STREAM}[name]
        return [f"\tld.global.u64 {reg}, [%u+{at}];"]
    constant, parts = 0, []   # 32-bit elements: a constant part, and values to shift in
    for el in C.ELEMENTS:
        name, shift = el.field.name, 8 * (el.offset % 8)
        if el.offset // 8 != word or el.field.size != 4:
            continue
        if name == "kind":
            constant |= _KIND[entry] << shift
        elif name in DIM_REGISTERS:
            parts.append(([f"mov.u32 %w2, {DIM_REGISTERS[name]}.{'xyz'[el.index]};"], shift))
        elif name == "site" and entry != ENTER:   # the SASS instruction index; entry: 0
            parts.append((["ld.param.b64 %t0, [%pc];", f"ld.global.u64 %t1, [%u+{RECORD.START}];",
                           "setp.lo.u64 %p0, %t0, %t1;", "@!%p0 sub.u64 %t0, %t0, %t1;", "shr.u64 %t0, %t0, 4;",
                           "cvt.u32.u64 %w2, %t0;"], shift))
        elif name == "size" and entry == MEM:
            parts.append((["ld.param.b32 %w2, [%size];"], shift))
        elif name == "flags" and entry == MEM:
            parts.append((["mov.u32 %w2, %flags_e;"], shift))
    return ["\t" + line for line in packed_word(reg, lit(constant), parts, "%w2", "%t2")]


_KIND = {ENTER: C.KIND_ENTRY, EXIT: C.KIND_EXIT, MEM: C.KIND_MEM}


def _scope(scope: str, skip: str) -> list[str]:
    """Branch to skip unless this thread is the one the scope elects (rewrite.py's rules)."""
    if scope == "warp":   # activemask: PTX ISA 9.7.13.4 (PTX 6.2)
        return ["\tactivemask.b32 %w0;", "\tmov.u32 %w1, %lanemask_lt;", "\tand.b32 %w0, %w0, %w1;",
                "\tsetp.ne.u32 %p0, %w0, 0;", f"\t@%p0 bra {skip};"]
    if scope == "block":
        return ["\tmov.u32 %w0, %tid.x;", "\tmov.u32 %w1, %tid.y;", "\tor.b32 %w0, %w0, %w1;",
                "\tmov.u32 %w1, %tid.z;", "\tor.b32 %w0, %w0, %w1;", "\tsetp.ne.u32 %p0, %w0, 0;",
                f"\t@%p0 bra {skip};"]
    return []


# ---- the image -----------------------------------------------------------------------------------

def find_ptxas() -> str | None:
    """ptxas on PATH, else under CUDA_HOME or /usr/local/cuda."""
    found = shutil.which("ptxas")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root and os.access(Path(root) / "bin/ptxas", os.X_OK):
            return str(Path(root) / "bin/ptxas")
    return None


def image_name(ptx: str, sm: int) -> str:
    return f"sass-patch-{hashlib.sha256(ptx.encode()).hexdigest()[:16]}-sm_{sm}.cubin"


def build_image(ptx: str, sm: int, cache: Path, ptxas: str | None = None) -> Path:
    """The patch cubin for ``sm`` (90 for sm_90): from the cache, else built there with
    ``ptxas --compile-as-tools-patch`` (written under a temporary name, then renamed, so concurrent
    processes never read half a file). TranslateError when ptxas is missing or refuses the text."""
    target = cache / image_name(ptx, sm)
    if target.exists():
        return target
    ptxas = ptxas or find_ptxas()
    if ptxas is None:
        raise TranslateError("ptxas not found (PATH, CUDA_HOME, /usr/local/cuda): the SASS back end needs it")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        src, out = Path(tmp) / "patch.ptx", Path(tmp) / "patch.cubin"
        src.write_text(ptx)
        proc = subprocess.run([ptxas, f"-arch=sm_{sm}", "--compile-as-tools-patch", "-o", str(out), str(src)],
                              capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            first = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[:1]
            raise TranslateError(f"ptxas --compile-as-tools-patch failed for sm_{sm}: {' '.join(first)}")
        os.replace(out, target)
    return target
