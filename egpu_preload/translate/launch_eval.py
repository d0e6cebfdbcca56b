"""Kernel-site programs whose whole effect follows from the launch: evaluated by the host at the launch
instead of run by every thread.

The suite's entry/exit counter adds a constant to a constant slot of an ARRAY in every thread and does
nothing else, so a launch of grid x block threads adds grid x block times that constant, and nothing
needs to run in the kernel. On the SASS back end that matters most: the Compute Sanitizer's patch
mechanism alone costs 5x on a PyTorch step whatever the patch does (docs/bench/why.md), and a kernel whose
every program is evaluated here is not patched at all. On the PTX back end such a kernel is left as the
application gave it, and its threads skip the counter's atomics.

A program qualifies when every path does the same thing whatever thread runs it (the verifier's facts,
for every path of every function):
- it is an entry or exit probe (kprobe, kretprobe, any scope);
- it reads no context field, loops on no budget, and calls no helper but map lookups whose map and key
  are the same on every path (so every lookup finds the same slot);
- it touches map values only with atomic adds that do not fetch the old value, in ARRAYs (global data
  included) that are not read-only;
- no program of its object that is not evaluated touches those maps (a reader or a writer on the GPU,
  a launch or host program on the host copy), and every evaluated add to a map has one width, so the
  host's counts and the device's values add lane by lane, modulo 2^(8 x width).
Such a program then adds the same amounts to the same lanes on every run, found by running it once on
the reference VM from the maps' initial values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..bpf.ctx import SIZE as CTX_SIZE
from ..bpf.helpers import HELPERS
from ..bpf.isa import CALL_HELPER, CALL_LOCAL
from ..bpf.program import MAP_ARRAY, BpfObject, MapDef
from ..bpf.verifier import VerifiedProgram
from ..errors import EgpuError
from ..maps import MapsState
from ..vm import Vm

KINDS = ("entry", "exit")
SCOPES = ("thread", "warp", "block")      # egpu_eval_add.scope, in this order
_LOOKUP = next(h.id for h in HELPERS.values() if h.name == "map_lookup_elem")
_ADDS = {"add4": 4, "add8": 8}


@dataclass(frozen=True)
class Add:
    """What one run adds to one lane of a map value."""
    map: int       # index into the object's maps
    entry: int     # the ARRAY's index
    offset: int    # the lane's byte offset in the value
    width: int     # 4 or 8
    delta: int     # modulo 2^(8 * width)


@dataclass(frozen=True)
class Evaluated:
    """A program evaluated at the launch: each run adds ``adds``; a launch runs it once per thread, warp or
    block (``scope``)."""
    program: int             # index into the object's programs
    scope: str
    adds: tuple[Add, ...]


def evaluated(obj: BpfObject, verified: Sequence[VerifiedProgram]) -> dict[int, Evaluated]:
    """The object's programs that qualify, by program index (``verified``: the verifier's result for each
    of ``obj.programs``, in order)."""
    touched = [_touched(v, len(obj.maps)) for v in verified]
    chosen = {i for i, (p, v) in enumerate(zip(obj.programs, verified, strict=True))
              if p.attach.kind in KINDS and _alone(v, obj.maps, touched[i])}
    while True:   # a map another program touches keeps every program that touches it in the kernel
        shared = set().union(*(touched[i] for i in range(len(verified)) if i not in chosen))
        widths: dict[int, set[int]] = {}
        for i in chosen:
            for index, uses in verified[i].value_uses.items():
                widths.setdefault(index, set()).update(_ADDS[u] for u in uses)
        shared |= {index for index, w in widths.items() if len(w) > 1}
        kept = {i for i in chosen if not touched[i] & shared}
        if kept == chosen:
            break
        chosen = kept
    out = {}
    for i in sorted(chosen):
        adds = _run(obj, i, verified[i])
        if adds is not None:
            out[i] = Evaluated(i, obj.programs[i].attach.scope, adds)
    return out


def _touched(v: VerifiedProgram, nmaps: int) -> set[int]:
    """The maps a program may touch (all of them where a call site's map differs by path)."""
    refs = set(v.maps.values()) | set(v.value_uses)
    return set(range(nmaps)) if None in refs else refs   # type: ignore[arg-type]


def _alone(v: VerifiedProgram, maps: Sequence[MapDef], touched: set[int]) -> bool:
    """Whether every run of the program does the same, whoever runs it (the module docstring's list);
    ``touched``: the maps it may touch (_touched)."""
    if v.ctx_reads or v.budgeted or v.callbacks:
        return False
    for insn in v.insns:
        if insn.pc not in v.reached or insn.kind != "call" or insn.src == CALL_LOCAL:
            continue
        if insn.src != CALL_HELPER or insn.imm != _LOOKUP or insn.pc not in v.consts or v.maps.get(insn.pc) is None:
            return False
    for index in touched:
        m = maps[index]
        if m.type != MAP_ARRAY or m.readonly or not v.value_uses.get(index, frozenset()) <= set(_ADDS):
            return False
    return True


def _run(obj: BpfObject, program: int, v: VerifiedProgram) -> tuple[Add, ...] | None:
    """What one run adds, lane by lane (None: the VM refused the run, which the verifier's facts say it
    cannot; the program then runs in the kernel)."""
    state = MapsState(obj.maps)
    widths = {i: _ADDS[u] for i, uses in v.value_uses.items() for u in uses}
    before = {i: [bytes(b) for b in state[i].values] for i in widths}   # type: ignore[attr-defined]
    try:
        Vm(obj.programs[program].code, obj.maps, state).run(bytes(CTX_SIZE))
    except EgpuError:   # VmError among them
        return None
    adds = []
    for i, width in sorted(widths.items()):
        for entry, (old, new) in enumerate(zip(before[i], state[i].values)):   # type: ignore[attr-defined]
            for off in range(0, len(new) - width + 1, width):
                delta = (int.from_bytes(new[off:off + width], "little")
                         - int.from_bytes(old[off:off + width], "little")) % (1 << 8 * width)
                if delta:
                    adds.append(Add(i, entry, off, width, delta))
    return tuple(adds)
