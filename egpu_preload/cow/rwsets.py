"""Which buffers each kernel of a PTX module reads and writes, found by dataflow from its parameters.

A register's value is described by its origins, a set of:

- ``("p", param, offset)``  the pointer stored at byte ``offset`` of kernel parameter ``param``
  (``ld.param.u64 %rd, [p+8]`` gives ``("p", "p", 8)``);
- ``("a", param, offset)``  the address of a parameter itself (``mov.b64 %rd, p``; offset None when
  not a constant);
- ``("s", symbol)``         the address of a module or function variable, space not yet known;
- ``("g", symbol)``         a module ``.global`` variable's address in the global window;
- ``("x",)``                an address in shared, local, const or param space (not a buffer);
- ``("?",)``                a 64-bit value loaded from memory, or packed from halves that carry no
  origin (a pointer shuffled across the warp, or loaded as ``v2.u32``): possibly any pointer.

Origins flow through mov, cvta, cvt, add/sub, the addend of mad, and/or/xor/not, selp/slct and min/max;
every other instruction (mul, shl, shr, shfl, ...) produces a plain number. The analysis is
flow-insensitive (each register gets the union over all its definitions), iterated to a fixpoint, so
loops need no special case. It stays sound without tracking numbers: an address whose origins are empty
(a pointer that went through mul or shl, an integer parameter) or hold ``("?",)`` makes the kernel
``unknown``. The unsound corners are a pointer difference scaled and added to another pointer
(``p + (q - p) * 1``), which no compiler emits for ordinary C++, and a pointer rebuilt from its halves
by shl and or rather than by mov (mov packing halves without origins gives ``("?",)``).

``.func`` bodies are analysed once each with their own parameters as origins and applied at every call
(the caller's ``st.param`` of each argument slot gives its origins); recursion, indirect calls and
calls to functions without a body (other than vprintf/__assertfail/malloc/free) make the caller unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from egpu_preload.bpf import ctx as C
from egpu_preload.errors import PtxError
from egpu_preload.translate import ptx
from egpu_preload.translate.rewrite import _ADDR as ADDRESS   # the rewriter's [base+offset] form
from egpu_preload.translate.rewrite import unseen_access   # wmma, bulk copies
from egpu_preload.translate.rewrite import memory_access

Origin = tuple
Origins = frozenset
EMPTY: Origins = frozenset()
UNKNOWN: Origin = ("?",)
OTHER_SPACE: Origin = ("x",)

# Instructions whose result may carry a pointer: every source operand's origins flow to it.
_PROPAGATE = {"mov", "cvta", "cvt", "add", "sub", "addc", "subc", "and", "or", "xor", "not", "selp",
              "slct", "min", "max"}
_SELECT = {"mov", "cvt", "selp", "slct", "min", "max"}   # the result is one of the operands
# Instructions that reach global memory in ways memory_access does not model (texture and surface
# handles, bulk/tensor copies, multimem, tensormap edits): their buffers cannot be named.
_OPAQUE = {"tex", "tld4", "txq", "suld", "sust", "sured", "suq", "multimem", "tensormap"}
# Functions without a body that touch no application buffer through their arguments.
_HARMLESS_EXTERNS = {"vprintf", "__assertfail", "malloc", "free"}
_WIDEN = 8   # more distinct constant offsets than this into one parameter: offset unknown


@dataclass
class KernelRW:
    """What one function reads and writes, in terms of its own parameters."""

    name: str
    params: tuple[ptx.Param, ...]
    access: dict[tuple[str, int], str] = field(default_factory=dict)   # (param, offset) -> r|w|rw
    globals: dict[str, str] = field(default_factory=dict)              # module .global symbol -> r|w|rw
    unknown: list[str] = field(default_factory=list)                   # why the sets are incomplete

    @property
    def exact(self) -> bool:
        """True when every global or generic access was attributed to a parameter or a variable."""
        return not self.unknown

    def _add(self, table: dict, key: object, mode: str) -> None:
        table[key] = mode_union(table.get(key, ""), mode)

    def _flag(self, reason: str) -> None:
        if reason not in self.unknown:
            self.unknown.append(reason)


def mode_union(a: str, b: str) -> str:
    """"r" | "w" -> "rw": access modes combined."""
    return "".join(c for c in "rw" if c in a or c in b)


def analyse(module: ptx.Module | str) -> dict[str, KernelRW]:
    """Read and write sets of every kernel of a module, by kernel name."""
    mod = ptx.parse(module) if isinstance(module, str) else module
    return _Analysis(mod).kernels()


class _Analysis:
    def __init__(self, mod: ptx.Module) -> None:
        self.mod = mod
        self.funcs = {f.name: f for f in mod.functions if f.body_open is not None}
        self.declared = {f.name for f in mod.functions}
        self.spaces = _module_spaces(mod)
        self.summaries: dict[str, KernelRW] = {}
        self.active: set[str] = set()

    def kernels(self) -> dict[str, KernelRW]:
        return {f.name: self.summary(f) for f in self.mod.kernels()}

    def summary(self, fn: ptx.Function) -> KernelRW:
        if fn.name not in self.summaries:
            self.active.add(fn.name)
            try:
                self.summaries[fn.name] = _Function(self, fn).run()
            finally:
                self.active.discard(fn.name)
        return self.summaries[fn.name]


class _Function:
    """The fixpoint over one function body, then one recording pass."""

    def __init__(self, analysis: _Analysis, fn: ptx.Function) -> None:
        self.an, self.fn = analysis, fn
        self.params = {p.name: p.size for p in fn.params or ()}
        self.spaces = dict(analysis.spaces)
        self.regs: dict[str, Origins] = {}
        self.out = KernelRW(fn.name, fn.params or ())
        self.pending: dict[tuple[str, int], Origins] = {}   # call argument slots stored so far

    def run(self) -> KernelRW:
        if self.fn.params is None:
            self.out._flag("parameter list not understood")
            return self.out
        try:
            stmts = self.fn.statements()
        except PtxError as e:
            self.out._flag(f"body not understood: {e.reason}")
            return self.out
        for st in stmts:
            if isinstance(st, ptx.Directive):
                _declare(self.spaces, st.name, st.text)
        insns = [st for st in stmts if isinstance(st, ptx.Instruction)]
        changed = True
        while changed:
            changed = False
            for ins in insns:
                changed |= self.define(ins)
        for ins in insns:
            try:
                self.record(ins)
            except PtxError as e:
                self.out._flag(f"{ins.opcode}: {e.reason}")
        return self.out

    # ---- values ----

    def value(self, operand: str) -> Origins:
        """Origins of one source operand: a register, an immediate or a symbol (+offset)."""
        operand = operand.strip()
        if operand.startswith("{"):
            return frozenset().union(*(self.value(o) for o in _vector(operand)))
        if operand.startswith("%"):
            return self.regs.get(operand, EMPTY)
        name, _, off = operand.partition("+")
        name = name.strip()
        if not name or not (name[0].isalpha() or name[0] in "_$"):
            return EMPTY   # an immediate
        if name in self.params:
            return frozenset({("a", name, _offset(off))})
        return frozenset({("s", name)})

    def define(self, ins: ptx.Instruction) -> bool:
        """Add what this instruction gives its destination registers; True if anything grew."""
        op, ops = ins.op, ins.operands
        if not ops or op in ("st", "red", "call", "cp", "bra", "ret", "exit", "bar", "prefetch"):
            return False
        dests = _vector(ops[0])
        if op in ("ld", "ldu"):
            vals = self.loaded(ins)
        elif op == "atom":
            vals = [frozenset({UNKNOWN}) if _is_pointer_type(ins.parts) else EMPTY] * len(dests)
        elif op == "mad":
            vals = [self.value(ops[3]) if len(ops) > 3 else EMPTY] * len(dests)
        elif op == "cvta":
            vals = [self.cvta(ins.parts, self.value(ops[1]) if len(ops) > 1 else EMPTY)] * len(dests)
        elif _is_float(ins.parts) or op not in _PROPAGATE:
            return False
        elif op == "add" and len(ops) == 3:
            vals = [self.add(self.value(ops[1]), self.value(ops[2]), ops[1], ops[2])] * len(dests)
        else:   # mov.b64 %rd, {%r1, %r2} packs, mov.b64 {%r1, %r2}, %rd unpacks: origins go along
            src = frozenset().union(*(self.value(o) for o in ops[1:]))
            if op == "mov" and not src and any(o.strip().startswith("{") for o in ops):
                # halves without origins (a shfl'd pointer, one loaded as v2.u32 or b128) may rebuild any pointer
                src = frozenset({UNKNOWN})
            if op not in _SELECT:   # sub, and, ...: a parameter address's offset is no longer known
                src = frozenset(("a", o[1], None) if o[0] == "a" else o for o in src)
            vals = [src] * len(dests)
        grew = False
        for reg, val in zip(dests, vals):
            if reg.startswith("%") and val:
                old = self.regs.get(reg, EMPTY)
                new = _widen(old | val)
                if new != old:
                    self.regs[reg] = new
                    grew = True
        return grew

    def add(self, a: Origins, b: Origins, ta: str, tb: str) -> Origins:
        """a + b, keeping a parameter address's offset exact when the other side is a constant."""
        out = set()
        for mine, other in ((a, tb), (b, ta)):
            k = _constant(other)
            for o in mine:
                if o[0] == "a":
                    out.add(("a", o[1], o[2] + k if k is not None and o[2] is not None else None))
                else:
                    out.add(o)
        return frozenset(out)

    def cvta(self, parts: list[str], src: Origins) -> Origins:
        """cvta[.to].space: a symbol's address becomes a global-window or other-space address."""
        space = next((p for p in parts if p in ("global", "shared", "local", "const", "param")), "")
        out = set()
        for o in src:
            if o[0] == "s":
                out.add(("g", o[1]) if space == "global" else OTHER_SPACE)
            else:
                out.add(o)
        return frozenset(out)

    def loaded(self, ins: ptx.Instruction) -> list[Origins]:
        """What ld/ldu gives each destination: a parameter's pointer when loading from a parameter's
        address, a possible pointer ("?") for any other 64-bit integer load, else a number."""
        dests = _vector(ins.operands[0])
        if not _is_pointer_type(ins.parts):
            return [EMPTY] * len(dests)
        m = ADDRESS.match(ins.operands[1]) if len(ins.operands) > 1 else None
        if m is None:
            return [frozenset({UNKNOWN})] * len(dests)
        base, disp = self.value(m.group("base")), _offset(m.group("off") or "")
        out = []
        for i in range(len(dests)):
            val = set()
            for o in base:
                off = o[2] + disp + 8 * i if o[0] == "a" and o[2] is not None else None
                if off is not None and 0 <= off <= self.params[o[1]] - 8:
                    val.add(("p", o[1], off))
                else:
                    val.add(UNKNOWN)
            out.append(frozenset(val or {UNKNOWN}))
        return out

    # ---- accesses ----

    def record(self, ins: ptx.Instruction) -> None:
        op, parts = ins.op, ins.parts
        if op == "st" and "param" in parts:
            self.store_argument(ins)
            return
        if op == "call":
            self.call(ins)
            self.pending.clear()
            return
        if op in _OPAQUE:
            self.out._flag(f"{ins.opcode}: memory through a texture, surface or tensor handle")
            return
        acc = memory_access(ins)
        if acc is None:
            unmodelled = op in ("cp", "st", "red", "ld", "atom", "discard") and "global" in parts \
                and "prefetch" not in parts
            if unmodelled or unseen_access(ins.opcode):   # wmma.store: a generic one writes a buffer too
                self.out._flag(f"{ins.opcode}: a global access form not modelled")
            return
        mode = "rw" if acc.flags & C.FLAG_ATOMIC else "r" if acc.flags & C.FLAG_LOAD else "w"
        m = ADDRESS.match(acc.operand)
        if m is None:
            self.out._flag(f"{ins.opcode}: address {acc.operand} not understood")
            return
        self.access(self.value(m.group("base")), mode, ins.opcode)

    def access(self, origins: Origins, mode: str, what: str) -> None:
        """A global or generic access through an address with these origins."""
        if not origins:
            self.out._flag(f"{what}: address not derived from a pointer parameter")
        for o in origins:
            kind = o[0]
            if kind == "p":
                self.out._add(self.out.access, (o[1], o[2]), mode)
            elif kind == "g" or (kind == "s" and self.spaces.get(o[1]) == "global"):
                self.out._add(self.out.globals, o[1], mode)
            elif kind == "?":
                self.out._flag(f"{what}: address loaded from memory or rebuilt from 32-bit halves")
            elif kind == "s" and self.spaces.get(o[1]) is None:
                self.out._flag(f"{what}: address of unknown symbol {o[1]}")
            # "a", "x" and symbols of other spaces: not application buffers

    def store_argument(self, ins: ptx.Instruction) -> None:
        """st.param [slot+off], value: remember the origins of a call argument."""
        ops = ins.operands
        m = ADDRESS.match(ops[0]) if ops else None
        if m is None or m.group("base") in self.params or len(ops) < 2:
            return
        size = _element_size(ins.parts)
        off = _offset(m.group("off") or "") or 0
        for i, src in enumerate(_vector(ops[1])):
            key = (m.group("base"), off + i * size)
            self.pending[key] = self.pending.get(key, EMPTY) | self.value(src)

    def call(self, ins: ptx.Instruction) -> None:
        callee, args = ptx.call_target(ins.operands)
        if callee is None or callee.startswith("%"):
            self.out._flag(f"indirect call through {callee}")
            return
        fn = self.an.funcs.get(callee)
        if fn is None:
            if callee not in _HARMLESS_EXTERNS:
                self.out._flag(f"call to {callee}, whose body is not in the module")
            return
        if callee in self.an.active:
            self.out._flag(f"recursive call to {callee}")
            return
        sub = self.an.summary(fn)
        for reason in sub.unknown:
            self.out._flag(f"in {callee}: {reason}")
        for sym, mode in sub.globals.items():
            self.out._add(self.out.globals, sym, mode)
        names = [p.name for p in sub.params]
        for (pname, off), mode in sub.access.items():
            i = names.index(pname)
            slot = self.pending.get((args[i], off)) if i < len(args) else None
            if slot is None:
                self.out._flag(f"call to {callee}: argument {pname}+{off} not traced")
            else:
                self.access(slot, mode, f"call to {callee}")


def _vector(operand: str) -> list[str]:
    operand = operand.strip()
    if operand.startswith("{") and operand.endswith("}"):
        return [o.strip() for o in operand[1:-1].split(",") if o.strip()]
    return [operand.split("|")[0].strip()]   # setp's "p|q" pair: the second is a predicate anyway


def _offset(text: str) -> int | None:
    text = text.strip()
    if not text:
        return 0
    try:
        return int(text, 0)
    except ValueError:
        return None


def _constant(operand: str) -> int | None:
    operand = operand.strip()
    if operand[:1].isdigit() or operand[:1] == "-":
        return _offset(operand)
    return None


def _types(parts: list[str]) -> list[str]:
    return [q for q in parts[1:] if q in ptx.TYPE_SIZES]


def _is_float(parts: list[str]) -> bool:
    """A floating-point result (the first type of cvt is the destination's)."""
    types = _types(parts)
    return bool(types) and types[0].startswith(("f", "bf", "tf", "e"))


def _is_pointer_type(parts: list[str]) -> bool:
    """A 64-bit integer (or untyped) access: what a pointer is loaded as."""
    types = _types(parts)
    return bool(types) and types[-1] in ("u64", "s64", "b64")


def _element_size(parts: list[str]) -> int:
    types = _types(parts)
    return ptx.TYPE_SIZES[types[-1]] if types else 0


def _widen(origins: Origins) -> Origins:
    """Bound the parameter-address offsets one register can collect (loops adding constants): past
    _WIDEN offsets, or once one is unknown, the register holds "somewhere in that parameter"."""
    counts: dict[str, int] = {}
    for o in origins:
        if o[0] == "a":
            counts[o[1]] = counts.get(o[1], 0) + (_WIDEN + 1 if o[2] is None else 1)
    wide = {n for n, k in counts.items() if k > _WIDEN}
    if not wide:
        return origins
    return frozenset({o for o in origins if not (o[0] == "a" and o[1] in wide)}
                     | {("a", n, None) for n in wide})


_SPACE_NAMES = (".global", ".shared", ".const", ".local")


def _declare(spaces: dict[str, str], directive: str, text: str) -> None:
    """Note the state space of a variable declaration (``.global .align 4 .b8 g[16] = {...};``)."""
    words = text.split("=")[0].replace(";", " ").split()
    kinds = [w for w in words if w in _SPACE_NAMES]
    if directive not in _SPACE_NAMES + (".visible", ".extern", ".weak", ".common") or not kinds:
        return
    names = [w for w in words if not w.startswith(".") and not w.isdigit()]
    if names:
        spaces[names[-1].split("[")[0].split("<")[0]] = kinds[0][1:]


def _module_spaces(mod: ptx.Module) -> dict[str, str]:
    """State space of every module-level variable."""
    spans = {(f.start, f.end) for f in mod.functions}
    spaces: dict[str, str] = {}
    for start, end in mod.items:
        if (start, end) not in spans:
            text = mod.text[start:end]
            _declare(spaces, text.split(None, 1)[0] if text.strip() else "", text)
    return spaces
