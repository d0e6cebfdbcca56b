"""Random programs the verifier accepts, built from structure rather than from random bytes (almost all of
which the decoder refuses): the differential tests run each on every executor (test_vm_compile.py: the
interpreter, the compiled VM and shim/launchvm.c; test_translate.py: the PTX translation through ptxas).

A program is assembler text: a prologue reading context fields and setting every register, then
statements drawn at random: 32- and 64-bit ALU of every operation on edge values (division and modulo
by zero, shifts by registers, signed forms, INT_MIN / -1), moves, sign-extending moves and loads (cpu
v4), byte swaps, stack spills and fills, atomics of every kind, if/else, loops bounded by a counter in
a callee-saved register, calls to subprograms taking scalars or a pointer into the caller's frame, map
lookups with their NULL check and the value read, written and updated atomically, map updates with
every flag and deletes, global data, and variable-offset stack accesses. Each function ends by folding
every scalar register and its stack into r0, so what the stack held is in the result.

The generator tracks which registers hold scalars so that what it writes reads only initialized ones
(a call leaves r1-r5 unreadable; a loop's body sets again what its first round left unreadable, so its
second round reads only what the verifier knows). ``programs`` keeps what the verifier accepts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from egpu_preload.bpf.asm import assemble
from egpu_preload.bpf.program import MAP_ARRAY, MAP_HASH, MAP_LRU_HASH, MAP_PERCPU_ARRAY, MapDef
from egpu_preload.bpf.verifier import verify
from egpu_preload.errors import VerifierError

# 0 and 2 small enough that lookups miss and updates find them full; 3 is global data (map_value[3]);
# 4 per SM (the VM's SM 0, the C engine's one copy).
MAPS = (
    MapDef("h", MAP_HASH, 4, 16, 3),
    MapDef("a", MAP_ARRAY, 4, 16, 4),
    MapDef("l", MAP_LRU_HASH, 4, 16, 2),
    MapDef(".bss", MAP_ARRAY, 4, 32, 1),
    MapDef("p", MAP_PERCPU_ARRAY, 4, 16, 3),
)
_KEYED = (0, 1, 2, 4)

_ALU = ["+=", "-=", "*=", "/=", "s/=", "%=", "s%=", "|=", "&=", "^=", "<<=", ">>=", "s>>="]
_SHIFTS = ("<<=", ">>=", "s>>=")
_JMP = ["==", "!=", ">", ">=", "<", "<=", "&", "s>", "s>=", "s<", "s<="]
_EDGE_IMMS = [0, 1, -1, 2, -2, 7, 31, 32, 63, -(1 << 31), (1 << 31) - 1, 0x7F, 0xFF, 0x8000]
_EDGE_U64 = [0, 1, (1 << 64) - 1, 1 << 63, (1 << 63) - 1, 0xFFFFFFFF, 1 << 32, 0x80000000, 0xFFFFFFFF80000000]
_CTX_U64 = (0, 8, 16, 40, 48, 56, 136)   # kernel_id, launch_id, addr, args[0..2], stream
_CTX_U32 = (24, 28, 32, 104, 108, 120)   # site, size, flags, nargs, grid.x, block.x
_DATA_SLOTS = 8                          # r10 - 8 .. r10 - 64: each function's data, written first
_KEY, _VALUE = 72, 88                    # r10 - 72: a map key (u32); r10 - 88: a 16-byte map value
_SUM = 96                                # r10 - 96: the sum of ALU results, so that those overwritten count
_CALLEE_SAVED = (6, 7, 8, 9)


@dataclass
class _Fn:
    """One function being written: its lines, which registers hold scalars (or a pointer into the
    caller's frame: ``ptrs``) and which it must not write (loop counters, a value pointer in use)."""

    name: str
    index: int
    lines: list[str] = field(default_factory=list)
    scalars: set[int] = field(default_factory=set)
    ptrs: set[int] = field(default_factory=set)
    fixed: set[int] = field(default_factory=set)


class _Gen:
    """Writes one program: main, then the subprograms, each function's statements from ``statement``."""

    def __init__(self, rng: random.Random, nsubs: int) -> None:
        self.rng = rng
        self.labels = 0
        # each subprogram's arguments: "s" a scalar, "p" a pointer to one of the caller's data slots
        self.subs = [[rng.choice("ssp") for _ in range(rng.randint(0, 4))] for _ in range(nsubs)]

    # ---- helpers ------------------------------------------------------------------------------------

    def label(self) -> str:
        self.labels += 1
        return f"L{self.labels}"

    def imm(self) -> int:
        r = self.rng
        return r.choice(_EDGE_IMMS) if r.random() < 0.6 else r.randint(-(1 << 31), (1 << 31) - 1)

    def scalar(self, f: _Fn) -> int:
        if not f.scalars:
            self.const(f, self.writable(f))
        return self.rng.choice(sorted(f.scalars))

    def writable(self, f: _Fn) -> int:
        return self.rng.choice([r for r in range(10) if r not in f.fixed])

    def set_scalar(self, f: _Fn, reg: int) -> None:
        f.scalars.add(reg)
        f.ptrs.discard(reg)

    def const(self, f: _Fn, reg: int) -> None:
        r = self.rng
        v = r.choice(_EDGE_U64) if r.random() < 0.5 else r.getrandbits(r.choice((8, 32, 64)))
        f.lines.append(f"r{reg} = {v} ll" if r.random() < 0.5 or v >= 1 << 31 else f"r{reg} = {v}")
        self.set_scalar(f, reg)

    def call_clobbers(self, f: _Fn) -> None:
        f.scalars -= {1, 2, 3, 4, 5}
        f.ptrs -= {1, 2, 3, 4, 5}
        f.scalars.add(0)

    def restore(self, f: _Fn, scalars: set[int]) -> None:
        """Set again, to constants, the registers of ``scalars`` that no longer hold one."""
        for reg in sorted(scalars - f.scalars):
            self.const(f, reg)

    # ---- statements ---------------------------------------------------------------------------------

    def alu(self, f: _Fn) -> None:
        r = self.rng
        op, w = r.choice(_ALU), r.choice("rw")
        dst = self.writable(f)
        if dst not in f.scalars:
            self.const(f, dst)
        if r.random() < (0.7 if op in _SHIFTS else 0.5):   # shifts by registers: counts past the width
            rhs = f"{w}{self.scalar(f)}"
        elif op in _SHIFTS:
            rhs = str(r.randrange(32 if w == "w" else 64))
        else:
            rhs = str(self.imm())
        f.lines.append(f"{w}{dst} {op} {rhs}")
        self.record(f, dst)

    def record(self, f: _Fn, reg: int) -> None:
        """Most results are added to the sum at r10 - _SUM: a result overwritten later still counts."""
        if self.rng.random() < 0.7:
            f.lines.append(f"lock *(u64 *)(r10 - {_SUM}) += r{reg}")

    def unary(self, f: _Fn) -> None:
        r = self.rng
        src, dst = self.scalar(f), self.writable(f)
        kind = r.choice(("mov", "movimm", "movsx", "neg", "end"))
        w = r.choice("rw")
        if kind in ("neg", "end") and dst not in f.scalars:
            self.const(f, dst)
        if kind == "mov":
            f.lines.append(f"{w}{dst} = {w}{src}")
        elif kind == "movimm":
            f.lines.append(f"{w}{dst} = {self.imm()}")
        elif kind == "movsx":
            f.lines.append(f"{w}{dst} = (s{r.choice((8, 16) if w == 'w' else (8, 16, 32))}){w}{src}")
        elif kind == "neg":
            f.lines.append(f"{w}{dst} = -{w}{dst}")
        else:
            f.lines.append(f"r{dst} = {r.choice(('le', 'be', 'bswap'))}{r.choice((16, 32, 64))} r{dst}")
        self.set_scalar(f, dst)
        self.record(f, dst)

    def _piece(self, base: str, at: int) -> tuple[int, str]:
        """A random aligned piece of the 8 bytes at base - at: (size, address text)."""
        size = self.rng.choice((1, 2, 4, 8))
        off = self.rng.randrange(0, 8, size)
        return size, f"r10 - {at - off}" if base == "r10" else f"{base} + {off}"

    def memory(self, f: _Fn, base: str, at: int = 0) -> None:
        """A load, store or atomic on the 8 bytes at base - at (r10) or base + 0 (a pointer register)."""
        r = self.rng
        what = r.random()
        size, addr = self._piece(base, at)
        if what < 0.3:
            dst = self.writable(f)
            sign = "s" if size < 8 and r.random() < 0.4 else "u"
            w = "w" if sign == "u" and size == 4 and r.random() < 0.5 else "r"
            f.lines.append(f"{w}{dst} = *({sign}{8 * size} *)({addr})")
            self.set_scalar(f, dst)
        elif what < 0.6:
            rhs = f"r{self.scalar(f)}" if r.random() < 0.7 else str(r.randint(-300, 300))
            f.lines.append(f"*(u{8 * size} *)({addr}) = {rhs}")
        else:
            self.atomic(f, base, at)

    def atomic(self, f: _Fn, base: str, at: int) -> None:
        r = self.rng
        bits = r.choice((32, 64))
        off = 4 * r.randrange(2) if bits == 32 else 0
        addr = f"{base} - {at - off}" if base == "r10" else f"{base} + {off}"
        src = r.choice([x for x in f.scalars if x not in f.fixed and x != 0] or [None])
        if src is None:
            return
        w = "w" if bits == 32 else "r"
        op = r.choice(("add", "or", "and", "xor", "fadd", "for", "fand", "fxor", "xchg", "cmpxchg"))
        if op == "cmpxchg":
            if 0 in f.fixed:
                return
            if 0 not in f.scalars:
                self.const(f, 0)
            f.lines.append(f"{w}0 = cmpxchg{'32' if bits == 32 else ''}_{bits}({addr}, {w}0, {w}{src})")
        elif op == "xchg":
            f.lines.append(f"{w}{src} = xchg{'32' if bits == 32 else ''}_{bits}({addr}, {w}{src})")
        elif op.startswith("f"):
            f.lines.append(f"{w}{src} = atomic_fetch_{op[1:]}((u{bits} *)({addr}), {w}{src})")
        else:
            sym = {"add": "+=", "or": "|=", "and": "&=", "xor": "^="}[op]
            f.lines.append(f"lock *(u{bits} *)({addr}) {sym} {w}{src}")

    def stack(self, f: _Fn) -> None:
        self.memory(f, "r10", 8 * self.rng.randint(1, _DATA_SLOTS))

    def variable_stack(self, f: _Fn) -> None:
        """A load or store at a data slot the verifier knows only as a range: r10 - 64 + (x & 7) * 8."""
        r = self.rng
        free = [x for x in range(10) if x not in f.fixed]
        if len(free) < 2:
            return
        idx, ptr = r.sample(free, 2)
        f.lines += [f"r{idx} = r{self.scalar(f)}", f"r{idx} &= 7", f"r{idx} <<= 3",
                    f"r{ptr} = r10", f"r{ptr} += -{8 * _DATA_SLOTS}", f"r{ptr} += r{idx}"]
        self.set_scalar(f, idx)
        f.scalars.discard(ptr)
        f.ptrs.discard(ptr)
        if r.random() < 0.5:
            dst = r.choice([x for x in free if x != ptr])
            f.lines.append(f"r{dst} = *(u64 *)(r{ptr} + 0)")
            self.set_scalar(f, dst)
        else:
            f.lines.append(f"*(u64 *)(r{ptr} + 0) = r{self.scalar(f)}")

    def branch(self, f: _Fn, depth: int) -> None:
        r = self.rng
        w = r.choice("rw")
        rhs = f"{w}{self.scalar(f)}" if r.random() < 0.4 else str(self.imm())
        other, end = self.label(), self.label()
        f.lines.append(f"if {w}{self.scalar(f)} {r.choice(_JMP)} {rhs} goto {other}")
        before = set(f.scalars), set(f.ptrs)
        self.block(f, depth + 1, r.randint(1, 4))
        taken = set(f.scalars), set(f.ptrs)
        f.scalars, f.ptrs = set(before[0]), set(before[1])
        if r.random() < 0.6:
            f.lines.append(f"{r.choice(('goto', 'goto', 'gotol'))} {end}")
            f.lines.append(f"{other}:")
            self.block(f, depth + 1, r.randint(1, 4))
            f.lines.append(f"{end}:")
        else:
            f.lines.append(f"{other}:")
        f.scalars &= taken[0]
        f.ptrs &= taken[1]

    def loop(self, f: _Fn, depth: int) -> None:
        r = self.rng
        free = [x for x in _CALLEE_SAVED if x not in f.fixed]
        if not free:
            return
        c, n, top = r.choice(free), r.randint(1, 4), self.label()
        down = r.random() < 0.5
        f.lines.append(f"r{c} = {n if down else 0}")
        f.lines.append(f"{top}:")
        f.fixed.add(c)
        f.scalars.add(c)
        f.ptrs = set()   # a second round would find what the first overwrote: no pointer arguments in loops
        before = set(f.scalars)
        self.block(f, depth + 1, r.randint(1, 4))
        self.restore(f, before)
        f.fixed.discard(c)
        if down:
            f.lines += [f"r{c} += -1", f"if r{c} != 0 goto {top}"]
        else:
            w = r.choice("rw")
            f.lines += [f"{w}{c} += 1", f"if {w}{c} {r.choice(('<', 's<', '!='))} {n} goto {top}"]

    def call(self, f: _Fn) -> None:
        callees = range(f.index + 1, len(self.subs))
        if not callees or any(a in f.fixed for a in range(1, 6)):
            return
        k = self.rng.choice(callees)
        for a, kind in enumerate(self.subs[k], start=1):
            if kind == "p":
                f.lines += [f"r{a} = r10", f"r{a} += -{8 * self.rng.randint(1, _DATA_SLOTS)}"]
                f.scalars.discard(a)
                f.ptrs.discard(a)
            else:
                f.lines.append(f"r{a} = r{self.scalar(f)}" if self.rng.random() < 0.7 else f"r{a} = {self.imm()}")
                self.set_scalar(f, a)
        f.lines.append(f"call local sub{k}")
        self.call_clobbers(f)

    def key(self, f: _Fn) -> None:
        """The u32 at r10 - _KEY: a constant, or a register's low bits (keys 0-7: hits, misses, evictions)."""
        r = self.rng
        if r.random() < 0.5:
            f.lines.append(f"*(u32 *)(r10 - {_KEY}) = {r.randint(0, 5)}")
            return
        f.lines += [f"w0 = w{self.scalar(f)}", "w0 &= 7", f"*(u32 *)(r10 - {_KEY}) = w0"]
        self.set_scalar(f, 0)

    def map_access(self, f: _Fn) -> None:
        """A lookup, its NULL check, then reads, writes and atomics on the value through a callee-saved
        register; or an update (any flag, rarely a bad one) or a delete, its result kept."""
        r = self.rng
        free = [x for x in _CALLEE_SAVED if x not in f.fixed]
        if not free or any(a in f.fixed for a in range(6)):
            return
        m = r.choice(_KEYED)
        self.key(f)
        what = r.random()
        if what < 0.6:
            p, skip = r.choice(free), self.label()
            f.lines += ["r2 = r10", f"r2 += -{_KEY}", f"r1 = map[{m}] ll", "call map_lookup_elem"]
            self.call_clobbers(f)
            f.scalars.discard(0)
            missed = set(f.scalars) - {p}   # what the NULL path leaves
            f.lines += [f"if r0 == 0 goto {skip}", f"r{p} = r0"]
            f.fixed.add(p)
            f.scalars.discard(p)
            self.const(f, 0)   # r0 held the pointer too
            for _ in range(r.randint(1, 4)):
                if r.random() < 0.2:
                    self.alu(f)
                elif r.random() < 0.15:
                    self._value_variable(f, p)
                elif r.random() < 0.5:
                    self.memory(f, f"r{p}", 0)
                else:
                    self._value_piece(f, p)
            f.fixed.discard(p)
            f.lines.append(f"{skip}:")
            f.scalars &= missed
            f.ptrs -= {0, p}
            return
        if what < 0.85:
            for k in range(2):
                f.lines.append(f"*(u64 *)(r10 - {_VALUE - 8 * k}) = r{self.scalar(f)}")
            flags = r.choice((0, 0, 1, 2, 2, 3))
            f.lines += ["r2 = r10", f"r2 += -{_KEY}", "r3 = r10", f"r3 += -{_VALUE}", f"r4 = {flags}",
                        f"r1 = map[{m}] ll", "call map_update_elem"]
        else:
            f.lines += ["r2 = r10", f"r2 += -{_KEY}", f"r1 = map[{m}] ll", "call map_delete_elem"]
        self.call_clobbers(f)

    def aliased_update(self, f: _Fn) -> None:
        """An update whose key and value lie in map values: the key in global data, the value the one a
        lookup of the array (or global data itself) found, so an update may overwrite its own operands."""
        r = self.rng
        if any(a in f.fixed for a in range(6)):
            return
        m, skip = r.choice(_KEYED), self.label()
        f.lines += ["r1 = map_value[3] + 0 ll", f"*(u32 *)(r1 + 0) = {r.randint(0, 4)}"]
        if r.random() < 0.5:
            f.lines += ["r3 = map_value[3] + 8 ll"]
        else:
            f.lines += ["r2 = map_value[3] + 0 ll", "r1 = map[1] ll", "call map_lookup_elem",
                        f"if r0 == 0 goto {skip}", "r3 = r0"]
        f.lines += ["r2 = map_value[3] + 0 ll", f"r4 = {r.choice((0, 1, 2))}", f"r1 = map[{r.choice((1, m))}] ll",
                    "call map_update_elem", f"{skip}:"]
        self.call_clobbers(f)
        f.scalars.discard(0)

    def early_exit(self, f: _Fn) -> None:
        """r0 = a scalar, then exit (or helper 507, which ends the program with r0 = 0)."""
        if self.rng.random() < 0.2:
            f.lines.append("call 507")
            return
        f.lines += [f"r0 = r{self.scalar(f)}", "exit"]

    def _value_variable(self, f: _Fn, p: int) -> None:
        """memory() at the value's first or second 8 bytes, chosen by a register's bit the verifier does
        not know: a variable offset into the value."""
        free = [x for x in range(1, 10) if x not in f.fixed]
        q, i = self.rng.sample(free, 2)
        f.lines += [f"r{i} = r{self.scalar(f)}", f"r{i} &= 8", f"r{q} = r{p}", f"r{q} += r{i}"]
        self.set_scalar(f, i)
        f.scalars.discard(q)
        f.ptrs.discard(q)
        f.fixed.add(q)
        self.memory(f, f"r{q}", 0)
        f.fixed.discard(q)

    def _value_piece(self, f: _Fn, p: int) -> None:
        """memory() on the value's second 8 bytes."""
        f.lines.append(f"r{p} += 8")
        self.memory(f, f"r{p}", 0)
        f.lines.append(f"r{p} += -8")

    def global_data(self, f: _Fn) -> None:
        free = [x for x in range(1, 10) if x not in f.fixed]
        p = self.rng.choice(free)
        f.lines.append(f"r{p} = map_value[3] + {8 * self.rng.randrange(4)} ll")
        f.ptrs.add(p)
        f.scalars.discard(p)
        f.fixed.add(p)
        self.memory(f, f"r{p}", 0)
        f.fixed.discard(p)
        f.ptrs.discard(p)

    def through_pointer(self, f: _Fn) -> None:
        """A callee's access to the caller's slot its pointer argument names."""
        p = self.rng.choice(sorted(f.ptrs))
        f.fixed.add(p)
        self.memory(f, f"r{p}", 0)
        f.fixed.discard(p)

    def statement(self, f: _Fn, depth: int) -> None:
        r = self.rng
        kinds = [(self.alu, 5), (self.unary, 3), (self.stack, 4), (self.variable_stack, 1), (self.global_data, 1),
                 (self.map_access, 2), (self.aliased_update, 0.5), (self.call, 2)]
        if f.ptrs:
            kinds.append((self.through_pointer, 3))
        if depth < 2:
            kinds += [(lambda g: self.branch(g, depth), 2), (lambda g: self.loop(g, depth), 2)]
        if depth > 0:
            kinds.append((self.early_exit, 0.3))
        fn = r.choices([k for k, _ in kinds], [w for _, w in kinds])[0]
        fn(f)

    def block(self, f: _Fn, depth: int, n: int) -> None:
        for _ in range(n):
            self.statement(f, depth)

    # ---- functions ----------------------------------------------------------------------------------

    def fold(self, f: _Fn) -> None:
        """r0 = a fold of every scalar register and every data slot, then exit."""
        regs = sorted(f.scalars - {0})
        if 0 not in f.scalars:
            f.lines.append("r0 = 0")
        tmp = next(x for x in range(1, 10) if x not in f.ptrs)
        for reg in regs:
            f.lines += ["r0 *= 31", f"r0 ^= r{reg}"]
        for at in [8 * k for k in range(1, _DATA_SLOTS + 1)] + [_SUM]:
            f.lines += [f"r{tmp} = *(u64 *)(r10 - {at})", "r0 *= 31", f"r0 += r{tmp}"]
        f.lines.append("exit")

    def function(self, index: int) -> list[str]:
        r = self.rng
        if index < 0:
            f = _Fn("main", -1)
            for _ in range(r.randint(1, 3)):
                dst, at = r.randint(2, 9), r.choice(_CTX_U64 + _CTX_U32)
                f.lines.append(f"r{dst} = *(u{64 if at in _CTX_U64 else 32} *)(r1 + {at})")
                f.scalars.add(dst)
            for reg in range(10):
                if reg not in f.scalars:
                    self.const(f, reg)
        else:
            f = _Fn(f"sub{index}", index)
            for a, kind in enumerate(self.subs[index], start=1):
                (f.ptrs if kind == "p" else f.scalars).add(a)
            for reg in (0, 6):
                self.const(f, reg)
        for k in range(1, _DATA_SLOTS + 1):
            f.lines.append(f"*(u64 *)(r10 - {8 * k}) = r{self.scalar(f)}")
        f.lines.append(f"*(u64 *)(r10 - {_SUM}) = 0")
        self.block(f, 0, r.randint(3, 12) if index < 0 else r.randint(1, 6))
        self.fold(f)
        return [f"{f.name}:", *f.lines]

    def program(self) -> str:
        lines = self.function(-1)
        for k in range(len(self.subs)):
            lines += self.function(k)
        return "\n".join(lines)


def program_text(rng: random.Random) -> str:
    """One random program (main, then 0-3 subprograms each called only by those before it)."""
    return _Gen(rng, rng.randint(0, 3)).program()


def programs(seed: int, count: int) -> list[str]:
    """``count`` programs of ``program_text`` that the verifier accepts (with MAPS), in order. The generator
    means every program to be accepted: more than ``count`` refused fails, naming the reasons (the
    verifier refusing what it should take, or the generator writing what it should not)."""
    rng = random.Random(seed)
    out: list[str] = []
    refused: dict[str, int] = {}
    while len(out) < count:
        text = program_text(rng)
        try:
            verify(assemble(text), list(MAPS))
        except VerifierError as e:
            reason = e.reason.split(":", 2)[-1].split("(")[0].strip()
            refused[reason] = refused.get(reason, 0) + 1
            if sum(refused.values()) > count:
                raise AssertionError(f"the verifier refused {sum(refused.values())} programs: {refused}") from None
            continue
        out.append(text)
    return out
