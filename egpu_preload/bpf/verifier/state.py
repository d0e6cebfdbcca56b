"""The verifier's state on one path: call frames (registers and stack) and acquired references.

Stack bytes are tracked one by one, in 8-byte slots as the kernel does: ``u`` never written, ``m``
written with data, ``s`` part of a spilled register whose abstract value the slot keeps (an aligned
store of a whole register: 8 bytes, or fewer for a scalar that fits them), so a pointer or a bounded
scalar survives a spill and fill.
"""

from __future__ import annotations

from typing import AbstractSet, Callable, NamedTuple

from ..program import MapDef
from .precision import reg_key, slot_key
from .value import (FUNC, M32, MAP_PTR, NOT_INIT, NOT_INIT_VALUE, S32_MAX, S32_MIN, SCALAR, STACK, UNKNOWN, Value,
                    bounded, contains, fits_s32, pointer, s64)

UNINIT_SLOT_BYTES = "uuuuuuuu"
SPILL_BYTES = "ssssssss"


class Slot(NamedTuple):
    bytes: str            # 8 chars, index 0 = the lowest address of the slot
    spill: Value | None   # the spilled register, held by the run of "s" bytes: all 8 for a pointer,
                          # 1, 2 or 4 aligned bytes for a scalar that fits them (32-bit code spills w regs)

    def as_data(self) -> "Slot":
        """The slot once its spill may have been overwritten: what was written stays initialized."""
        return Slot(self.bytes.replace("s", "m"), None)

    @property
    def holds_pointer(self) -> bool:
        """A spilled pointer: its bytes may be replaced whole, never in part (a part would let the
        program read the rest as a number: the kernel's "attempt to corrupt spilled pointer")."""
        return self.spill is not None and self.spill.is_pointer


class Frame:
    """One call frame. Slot k covers frame-pointer offsets [-8(k+1), -8k)."""

    __slots__ = ("regs", "stack", "callsite", "subprog")

    def __init__(self, regs: list[Value], stack: dict[int, Slot], callsite: int, subprog: int) -> None:
        self.regs = regs
        self.stack = stack
        self.callsite = callsite  # pc of the call that made this frame; -1 for the main program
        self.subprog = subprog    # index into the program's subprogram list

    def copy(self) -> "Frame":
        return Frame(list(self.regs), dict(self.stack), self.callsite, self.subprog)


class State:
    __slots__ = ("frames", "refs")

    def __init__(self, frames: list[Frame], refs: dict[int, int]) -> None:
        self.frames = frames
        self.refs = refs  # reference id -> pc of the ringbuf_reserve that acquired it

    @classmethod
    def entry(cls) -> "State":
        regs = [NOT_INIT_VALUE] * 11
        regs[1] = pointer("ctx")
        regs[10] = pointer(STACK, aux=0)
        return cls([Frame(regs, {}, -1, 0)], {})

    @property
    def top(self) -> Frame:
        return self.frames[-1]

    def copy(self) -> "State":
        return State([f.copy() for f in self.frames], dict(self.refs))

    def update_id(self, id: int, fn: Callable[[Value], Value | None]) -> None:
        """Apply ``fn`` to every register and spill carrying ``id``. A None result invalidates: the
        register becomes uninitialized, and so do the spill's bytes, so that a released pointer can
        neither be used nor read back as a number (the kernel's mark_reg_invalid, unprivileged)."""
        for f in self.frames:
            for r, v in enumerate(f.regs):
                if v.id == id:
                    f.regs[r] = fn(v) or NOT_INIT_VALUE
            for k, slot in list(f.stack.items()):
                if slot.spill is not None and slot.spill.id == id:
                    new = fn(slot.spill)
                    if new is not None:
                        f.stack[k] = slot._replace(spill=new)
                    elif slot.bytes == SPILL_BYTES:
                        del f.stack[k]
                    else:
                        f.stack[k] = Slot(slot.bytes.replace("s", "u"), None)


# ---- pruning: equality modulo id renaming, and "old covers new" ---------------------------------------

class _Ids:
    """A consistent one-to-one renaming of ids between two states (the kernel's check_ids)."""

    __slots__ = ("fwd", "back")

    def __init__(self) -> None:
        self.fwd: dict[int, int] = {}
        self.back: dict[int, int] = {}

    def same(self, old: int, new: int) -> bool:
        if old == 0 and new == 0:
            return True
        if old == 0 or new == 0:
            return False
        if self.fwd.setdefault(old, new) != new:
            return False
        return self.back.setdefault(new, old) == old


def _canon(v: Value, names: dict[int, int]) -> Value:
    if v.id:
        v = v._replace(id=names.setdefault(v.id, len(names) + 1))
    return v


def key(state: State, live: list[int]) -> tuple:
    """A hashable picture of the state (live registers only) with ids renamed in order of appearance,
    so two states that differ only in id numbering get the same key."""
    names: dict[int, int] = {}
    out: list = []
    for f, mask in zip(state.frames, live):
        out.append(f.callsite)
        out.append(tuple(_canon(v, names) if mask >> r & 1 else None for r, v in enumerate(f.regs)))
        out.append(tuple((k, s.bytes, _canon(s.spill, names) if s.spill is not None else None)
                         for k, s in sorted(f.stack.items())))
    out.append(tuple(sorted((names.setdefault(i, len(names) + 1), pc) for i, pc in state.refs.items())))
    return tuple(out)


def _covers(old: Value, new: Value, ids: _Ids) -> bool:
    if old.kind == NOT_INIT:
        return True  # the old path never read it, or it would have been rejected
    if old.kind != new.kind or not contains(old, new):
        return False
    if old.kind == SCALAR:  # a link only narrows: an old value of its own covers a linked one
        return old.id == 0 or (ids.same(old.id, new.id) and old.off == new.off and old.aux == new.aux)
    if old.off != new.off or old.aux != new.aux:
        return False
    return old.kind in (MAP_PTR, STACK, "ctx", "map_value") or ids.same(old.id, new.id)


def covers(old: State, new: State, live: list[int], loose: AbstractSet[int] = frozenset()) -> bool:
    """Whether every concrete state of ``new`` is one of ``old``'s (so ``old``'s safe exploration
    covers ``new``). ``live`` is the live-register mask per frame; ``loose``: old's scalars (precision.py
    keys, ``imprecise``) any scalar stands for."""
    if len(old.frames) != len(new.frames) or len(old.refs) != len(new.refs):
        return False
    ids = _Ids()
    for i, (fo, fn, mask) in enumerate(zip(old.frames, new.frames, live)):
        if fo.callsite != fn.callsite:
            return False
        for r in range(11):
            if not mask >> r & 1:
                continue
            if reg_key(i, r) in loose:
                if fn.regs[r].kind != SCALAR:
                    return False
            elif not _covers(fo.regs[r], fn.regs[r], ids):
                return False
        for k, so in fo.stack.items():
            if not _slot_covers(so.as_data() if slot_key(i, k) in loose else so, fn.stack.get(k), ids):
                return False
    for o in sorted(old.refs):  # references no register points to any more pair up in order
        n = ids.fwd.get(o) or next((n for n in sorted(new.refs) if n not in ids.back), 0)
        if n not in new.refs or not ids.same(o, n):
            return False
    return True


def keyed_values(state: State) -> list[tuple[int, Value]]:
    """Every register and spilled value of ``state``, each with its key (precision.py)."""
    values = [(reg_key(n, r), v) for n, f in enumerate(state.frames) for r, v in enumerate(f.regs)]
    return values + [(slot_key(n, k), s.spill) for n, f in enumerate(state.frames) for k, s in f.stack.items()
                     if s.spill is not None]


def imprecise(old: State, precise: AbstractSet[int]) -> frozenset[int]:
    """The keys of old's scalars, in registers or spilled, outside ``precise`` (those whose bounds old's
    exploration read) and linked to none in it: a branch on a linked one narrows that one too."""
    values = keyed_values(old)
    linked = {v.id for key, v in values if v.id and key in precise}
    return frozenset(key for key, v in values if v.kind == SCALAR and key not in precise and v.id not in linked)


def _slot_covers(old: Slot, new: Slot | None, ids: _Ids) -> bool:
    new_bytes = new.bytes if new is not None else UNINIT_SLOT_BYTES
    if old.spill is not None:
        same_run = new is not None and new.spill is not None and new.bytes.replace("m", "u") == \
            old.bytes.replace("m", "u")
        if same_run and not _covers(old.spill, new.spill, ids):
            return False
        # otherwise only an unknown 8-byte scalar spill reads like plain data
        if not same_run and not (old.spill == UNKNOWN and old.bytes == SPILL_BYTES):
            return False
    pointer_bytes = new is not None and new.spill is not None and new.spill.kind != SCALAR
    for bo, bn in zip(old.bytes, new_bytes):
        if bo != "u" and (bn == "u" or (bn == "s" and pointer_bytes and bo != "s")):
            return False
    return True


# ---- widening: a loop header's state once its rounds stop mattering ---------------------------------------

def widen(old: State, new: State, live: list[int]) -> State | None:
    """``new`` with every scalar (register live at the header, or spilled) that differs from ``old``, the
    state a previous round brought to the same header, made what any later round could hold: unknown within
    32 bits when both values are, else unknown (what stays equal is kept). Stack bytes one round wrote and
    the other did not become unwritten. None when the two differ otherwise: a pointer's kind or offset, a
    register one round set and the other not, a frame, a reference; such a loop is explored round by round."""
    if len(old.frames) != len(new.frames) or old.refs != new.refs:
        return None
    out = new.copy()
    for fo, fn, mask in zip(old.frames, out.frames, live):
        if fo.callsite != fn.callsite:
            return None
        for r in range(11):
            if mask >> r & 1:
                v = _wider(fo.regs[r], fn.regs[r])
                if v is None:
                    return None
                fn.regs[r] = v
        for k in fo.stack.keys() | fn.stack.keys():
            slot = _wider_slot(fo.stack.get(k, _UNWRITTEN), fn.stack.get(k, _UNWRITTEN))
            if slot is None:
                return None
            if slot == _UNWRITTEN:
                fn.stack.pop(k, None)
            else:
                fn.stack[k] = slot
    return out


def _wider(old: Value, new: Value) -> Value | None:
    if old.kind != new.kind:
        return None
    if new.kind != SCALAR:   # not initialized in either, or the same pointer (its id aside)
        same = (old.off, old.aux, old.var) == (new.off, new.aux, new.var)
        return new if same else None
    if old.var == new.var:
        return new
    if old.umax <= M32 and new.umax <= M32:
        return bounded(0, M32)
    if fits_s32(old) and fits_s32(new):
        return bounded(smin=S32_MIN, smax=S32_MAX)
    return UNKNOWN


_UNWRITTEN = Slot(UNINIT_SLOT_BYTES, None)


def _wider_slot(old: Slot, new: Slot) -> Slot | None:
    """A slot holding what either round left there; None where both spilled pointers that differ. A pointer
    one round spilled and the other did not leaves bytes no later read may use."""
    if old.spill is not None and new.spill is not None and old.bytes == new.bytes:
        spill = _wider(old.spill, new.spill)
        return None if spill is None else new._replace(spill=spill)
    if old.holds_pointer or new.holds_pointer:
        return _UNWRITTEN
    return Slot("".join(a if a == b else "u" if "u" in (a, b) else "m"
                        for a, b in zip(old.as_data().bytes, new.as_data().bytes)), None)


# ---- the log --------------------------------------------------------------------------------------------

def fmt_value(v: Value, maps: list[MapDef]) -> str:
    def var() -> str:
        if v.is_const:
            return "" if v.tv == 0 else f",var={s64(v.tv)}"
        return f",smin={v.smin},smax={v.smax}"

    def name() -> str:
        return maps[v.aux].name if 0 <= v.aux < len(maps) else f"#{v.aux}"

    if v.kind == SCALAR:
        if v.is_const:
            return str(s64(v.tv))
        parts = [f"{k}={getattr(v, k)}" for k, d in (("umin", 0), ("umax", UNKNOWN.umax), ("smin", UNKNOWN.smin),
                                                     ("smax", UNKNOWN.smax)) if getattr(v, k) != d]
        if v.tm != UNKNOWN.tm and v.tm:
            parts.append(f"var_off=(0x{v.tv:x}; 0x{v.tm:x})")
        if v.umax > M32:   # the low half's bounds, where the 64-bit ones do not give them
            parts += [f"{k}={getattr(v, k)}" for k, d in (("u32min", 0), ("u32max", M32)) if getattr(v, k) != d]
        if not fits_s32(v):   # the low half's signed bounds, likewise
            parts += [f"{k}={getattr(v, k)}" for k, d in (("s32min", S32_MIN), ("s32max", S32_MAX))
                      if getattr(v, k) != d]
        if v.id:
            parts.append(f"id={v.id}" + (f"{v.off:+d}" if v.off else "") + ("(w32)" if v.aux else ""))
        return f"scalar({','.join(parts)})"
    if v.kind == STACK:
        return f"fp{v.off}" + (f"(frame={v.aux}{var()})" if v.aux or not v.is_const else "")
    if v.kind == MAP_PTR:
        return f"map_ptr({name()})"
    if v.kind == FUNC:
        return f"func(pc={v.aux})"
    if v.kind == "ctx":
        return f"ctx(off={v.off}{var()})"
    ident = f"id={v.id}," if v.id else ""
    if v.kind.startswith("map_value"):
        vs = maps[v.aux].value_size if 0 <= v.aux < len(maps) else 0
        return f"{v.kind}({ident}map={name()},off={v.off},vs={vs}{var()})"
    return f"{v.kind}({ident}off={v.off},size={v.aux}{var()})"


def fmt_state(state: State, maps: list[MapDef]) -> str:
    lines = []
    for n, f in enumerate(state.frames):
        parts = [f"R{r}={fmt_value(v, maps)}" for r, v in enumerate(f.regs) if v.kind != NOT_INIT]
        for k, slot in sorted(f.stack.items()):
            shown = slot.bytes[::-1]  # highest address first, as the kernel prints slots
            if slot.spill is not None:
                spill = fmt_value(slot.spill, maps)
                shown = spill if slot.bytes == SPILL_BYTES else f"{shown}({spill})"
            parts.append(f"fp{-8 * (k + 1)}={shown}")
        lines.append(f"frame{n}: " + " ".join(parts))
    if state.refs:
        lines.append("refs: " + " ".join(f"id={i} (acquired at {pc})" for i, pc in sorted(state.refs.items())))
    return "\n".join(lines)
