"""The eBPF verifier: proves a probe safe to run inside a GPU kernel, or says why not.

In the spirit of the Linux verifier and PREVAIL: a static pass over the control flow (cfg.py), then
abstract interpretation of every path (checks.py does each instruction), path-sensitive like the
kernel. States are remembered at jump targets; a state covered by one already explored to the end
is pruned (where that exploration read no scalar's bounds, any scalar covers it: precision.py), one
equal to a state still on the current path is an infinite loop, and a budget of
processed instructions bounds everything else ("program too complex"), like the kernel's 1M, and so
does a cap on branches waiting to be explored, like the kernel's 8192 (a loop that leaves a branch
behind each round is refused in thousands of rounds, not a million instructions).

Unlike Linux, programs of bpftime's DIRECTLY_RUN section (kprobe/__directly_run: run as a CUDA kernel of
their own, not in a user's kernel) may loop without a bound the exploration finds, such as bpftime's GEMM
over K read from a map. At the header of a loop without bpf-to-bpf calls (cfg.run_time_loops), a round
whose state the previous round's covers ends its path: that round's exploration covers the rest, so every
access stays checked, and the loop's backward jumps are budgeted: each taken counts against LOOP_BUDGET a
run, and the one past it ends the program as helper 507 does (r0 = 0; the VM and the translated code do
it alike). From WIDEN_AFTER rounds on, a round that differs from the previous one only in scalars goes on
with them widened (state.widen) so that a later round is covered; a loop whose pointers move, or that
meets another refusal, is explored and refused as anywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from ...errors import DecodeError, ElfError, VerifierError
from .. import isa
from ..ctx import EGPU_CTX, Layout, layout_for
from ..decode import Insn, decode
from ..disasm import disasm_insn
from ..program import MapDef
from ..sections import DIRECTLY_RUN, parse_section
from . import cfg as cfg_mod
from .cfg import Cfg, Reject
from .checks import STEP, Env, no_leaked_refs
from .precision import Step, back, everything
from .state import State, covers, fmt_state, imprecise, key, widen

MAX_INSNS = 1_000_000
MAX_PENDING = 8192  # the kernel's BPF_COMPLEXITY_LIMIT_JMP_SEQ: branches waiting to be explored
MAX_COMBINED_STACK = 512
# A DIRECTLY_RUN program's loop (cfg.run_time_loops) is explored round by round as any other for its first
# WIDEN_AFTER rounds, so that a short loop stays exact (and unbudgeted); from then on each round's scalars are
# widened until a round is covered, its backward jumps then counted against LOOP_BUDGET at run time. Each exact
# round costs its instructions, and a branch left behind, as in the kernel: 64 rounds of a probe's loop body
# are thousands of instructions, far from MAX_INSNS and MAX_PENDING.
WIDEN_AFTER = 64
LOOP_BUDGET = 1 << 20  # backward jumps of budgeted loops a run takes; the next ends it as helper 507 (exit) does
# An explored state compared for coverage (exact repeats use a dict) is dropped once its misses pass
# _MISSES * (hits + 1), as the kernel's is_state_visited drops one (3 there, 64 at the points it forces): a state
# that covers stays however old, and in a loop the states that cover later rounds are old ones (the 16 newest
# alone left a 40-round min/max loop too complex: tests/verifier_cases.py, min_max_over_a_map).
_MISSES = 64
_LOG_TAIL = 24      # instructions of the failing path shown in the log


@dataclass(frozen=True)
class VerifiedProgram:
    """A program the verifier accepted, with what it proved that the translator can use. Instructions
    no path reaches (the verifier does not reject dead code) have no entries."""

    insns: tuple[Insn, ...]
    regions: Mapping[int, str]         # pc of a load/store/atomic -> stack | ctx | map_value | ringbuf_mem,
                                       # or "mixed" when paths differ (never with ctx)
    maps: Mapping[int, int | None]     # pc of a map lddw or of a helper call taking a map -> map index
                                       # (None: the call site sees different maps on different paths)
    subprogs: tuple[int, ...]          # entry pc of each function, the main program first
    stack_depth: tuple[int, ...]       # bytes of stack each function uses, in subprogs order
    processed: int                     # instructions the analysis went through
    reached: frozenset[int]            # pc of every instruction some path executes
    consts: Mapping[int, int]          # pc -> a value the same on every path: an atomic add's operand, or a
                                       # map helper's key (*r2) when it is known stack bytes of at most 8
    arg_align: Mapping[tuple[int, int], int]  # (pc of a helper call, register) -> the alignment (1, 2, 4
                                              # or 8) every path proves for that pointer argument
    arg_stack: Mapping[tuple[int, int], int]  # (pc of a helper call, register) -> the pointer argument's
                                              # offset from r10 when every path passes that slot of the
                                              # caller's own frame
    ctx_reads: frozenset[int]          # byte offsets of struct egpu_ctx some load reads (helpers taking
                                       # ctx, perf_event_output, read none of it)
    ctx_at: Mapping[int, int | None]   # pc of a ctx load -> the byte offset it reads (None: paths reach it
                                       # with different offsets)
    value_uses: Mapping[int, frozenset[str]]  # map index -> how the program touches the map's values:
                                              # "add4"/"add8" (atomic add, old value not fetched), "read",
                                              # "write", "atomic" (any other), "helper" (a helper reads or
                                              # writes them, or takes the map for anything but a lookup or
                                              # an update with BPF_NOEXIST, which changes no array slot),
                                              # "address" (the address itself is used: printed, subtracted)
    budgeted: frozenset[int] = frozenset()    # pc of each backward jump counted against LOOP_BUDGET: the
                                              # loops of a DIRECTLY_RUN program the verifier cannot bound
    callbacks: Mapping[int, int] = field(default_factory=dict)   # pc of a bpf_loop call -> its callback's pc
    map_choices: Mapping[int, frozenset[int]] = field(default_factory=dict)   # pc of a helper call whose paths
                                                                               # pass different maps -> those maps


def budget_note(v: VerifiedProgram) -> str:
    """What `egpu verify` says of a program whose loops are budgeted (VerifiedProgram.budgeted)."""
    by_pc = {i.pc: i for i in v.insns}
    heads = sorted({by_pc[pc].jump_target() for pc in v.budgeted})
    where = ", ".join(map(str, heads))
    s = "s" * (len(heads) > 1)
    return (f"loop{s} at insn{s} {where} bounded at run time: {LOOP_BUDGET} backward jumps "
            f"a run (at {', '.join(map(str, sorted(v.budgeted)))}), and the next ends it as bpf_cuda_exit (507) "
            "does, r0 = 0")


class _Visit:
    """A state remembered at a prune point; ``pending`` counts the paths from it still being explored;
    ``nth``: at a loop header, how many earlier visits of it the path made in this invocation; ``steps``: the
    instructions from the parent's pc to this one, while paths below may still trace a value back through
    them; ``precise``: the registers and slots (precision.py) some check below read, complete once none is
    pending."""

    __slots__ = ("parent", "pending", "state", "pc", "depth", "nth", "steps", "precise", "loose", "hits", "misses")

    def __init__(self, parent: "_Visit | None", state: State, pc: int, nth: int, steps: list[Step]) -> None:
        self.parent = parent
        self.pending = 1
        self.state: State | None = state
        self.pc = pc
        self.depth = len(state.frames)
        self.nth = nth
        self.steps: list[Step] | None = steps
        self.precise: set[int] = set()
        self.loose: frozenset[int] | None = None   # state.imprecise, once finished
        self.hits = self.misses = 0   # paths this finished state covered, and did not, at its pc


def _rounds_apart(visit: _Visit | None, same: _Visit, calls: frozenset[int]) -> bool:
    """Whether the path from ``same`` down to ``visit`` went back from a bpf_loop callback to its call: the same
    state come back in a later round, whose count the helper bounds, not a loop (Linux tells the rounds apart by
    callback_unroll_depth). The path then ends there, as one covered: the rounds after it are those after ``same``."""
    crossed = False
    while visit is not None and visit is not same:
        crossed = crossed or (visit.pc in calls and visit.depth < same.depth)
        visit = visit.parent
    return visit is same and crossed


def _finish(visit: _Visit | None, explored: dict[int, list[_Visit]]) -> None:
    """A path ended: each visit on it with no path left below is explored, and may cover later ones at its pc."""
    while visit is not None:
        visit.pending -= 1
        if visit.pending:
            return
        visit.steps = None
        explored.setdefault(visit.pc, []).append(visit)
        visit = visit.parent


def _traced(trace: tuple | None, pc: int) -> tuple:
    """The path's last instructions for the log: a shared linked list (pc, previous, length),
    cut back to _LOG_TAIL nodes now and then so a long path does not keep all of its history."""
    length = trace[2] + 1 if trace is not None else 1
    if length > 2 * _LOG_TAIL:
        pcs = []
        while trace is not None and len(pcs) < _LOG_TAIL:
            pcs.append(trace[0])
            trace = trace[1]
        trace = None
        for n, old in enumerate(reversed(pcs), 1):
            trace = (old, trace, n)
        length = len(pcs) + 1
    return pc, trace, length


def _live(cfg: Cfg, st: State, pc: int) -> list[int]:
    """Live registers per frame: at pc for the callee, after its call for every caller (minus r0); at the call
    for a callback's caller, which runs the call again after each round (bpf_loop's r1-r4 stay live)."""
    masks = [cfg.live[f.callsite] if f.callsite in cfg.loop_calls else cfg.live[f.callsite + 1] & ~1
             for f in st.frames[1:]]
    return masks + [cfg.live[pc]]


def _context(section: str | None) -> Layout:
    """The context a program of ``section`` receives (ctx.layout_for its kind); struct egpu_ctx for none."""
    try:
        return layout_for(parse_section(section).kind) if section is not None else EGPU_CTX
    except ElfError:
        return EGPU_CTX


def verify(code: bytes, maps: list[MapDef], *, file: str | None = None, section: str | None = None,
           max_insns: int = MAX_INSNS, layout: Layout | None = None) -> VerifiedProgram:
    """Verify one program (subprograms appended, map references resolved as program.py describes), its
    context reads against ``layout``: by default the struct ``section``'s kind gets (ctx.layout_for).
    Raises VerifierError ("17: <insn>: <what> (<check>)", with the state log as detail) or DecodeError.

    A program of a DIRECTLY_RUN section may loop without a bound the exploration finds (module docstring):
    when the search that widens such loops refuses it after widening one, the precise search has the last
    word, so that such a section accepts whatever any other would."""
    try:
        insns = decode(code)
    except DecodeError as e:
        raise e.where(file=file, section=section) from None
    try:
        cfg = cfg_mod.build(insns, maps)
    except Reject as r:
        raise _error(r, None, insns, maps, None, file, section) from None
    context = layout if layout is not None else _context(section)
    loops = cfg_mod.run_time_loops(cfg) if section == DIRECTLY_RUN else {}
    search = _Search(cfg, Env(cfg, maps, context), loops, max_insns)
    try:
        search.run(file, section)
    except VerifierError as refused:
        if not search.widened and not search.budgeted:
            raise
        search = _Search(cfg, Env(cfg, maps, context), {}, max_insns)
        try:
            search.run(file, section)
        except VerifierError:
            raise refused from None
    env = search.env
    depths = tuple(env.depth)
    try:
        _check_combined_stack(cfg, depths, env.callbacks)
    except Reject as r:
        raise _error(r, None, insns, maps, None, file, section) from None
    consts = {pc: v for pc, v in env.consts.items() if v is not None}
    map_refs = MappingProxyType({pc: next(iter(c)) if len(c) == 1 else None for pc, c in env.map_choices.items()})
    return VerifiedProgram(tuple(insns), MappingProxyType(dict(env.regions)), map_refs,
                           cfg.subprogs, depths, search.processed, frozenset(search.reached),
                           MappingProxyType(consts), MappingProxyType(dict(env.arg_align)),
                           MappingProxyType({k: v for k, v in env.arg_stack.items() if v is not None}),
                           frozenset(env.ctx_reads), MappingProxyType(dict(env.ctx_at)),
                           MappingProxyType({m: frozenset(u) for m, u in env.value_uses.items()}),
                           frozenset(search.budgeted), MappingProxyType(dict(env.callbacks)),
                           MappingProxyType({pc: frozenset(c) for pc, c in env.map_choices.items() if len(c) > 1}))


class _Search:
    """One exploration of every path (depth first), pruned at the prune points; ``loops``
    (cfg.run_time_loops) are the loop headers where rounds may be widened and a round the header's state on
    the current path covers ends the path, its loop's backward jumps then budgeted."""

    def __init__(self, cfg: Cfg, env: Env, loops: Mapping[int, frozenset[int]], max_insns: int) -> None:
        self.cfg = cfg
        self.env = env
        self.loops = loops
        self.max_insns = max_insns
        self.seen: dict[int, dict[tuple, _Visit]] = {}
        self.explored: dict[int, list[_Visit]] = {}   # pc -> its visits explored to the end, in that order
        self.widened: dict[int, list[_Visit]] = {}   # loop header -> its visits with widened states, all kept
        self.budgeted: set[int] = set()
        self.processed = 0
        self.reached: set[int] = set()

    def run(self, file: str | None, section: str | None) -> None:
        cfg, env = self.cfg, self.env
        work: list[tuple[State, int, _Visit | None, tuple | None, list[Step]]] = \
            [(State.entry(), 0, None, None, [])]  # DFS
        while work:
            st, pc, visit, trace, steps = work.pop()
            try:
                while True:
                    depth = len(st.frames)
                    if pc in cfg.prune:
                        live = _live(cfg, st, pc)
                        wide, nth, again = False, 0, False
                        if pc in self.loops:
                            st, wide, nth = self._round(st, pc, visit, live)
                        elif pc in cfg.loop_calls:
                            st, again = self._again(st, pc, visit, live)
                        if st is None:   # covered by a round whose reads are not all known yet: it needs all
                            self._trace_back(visit, steps, pc, depth, everything(depth))
                            _finish(visit, self.explored)
                            break
                        k = key(st, live)
                        same = self.seen.setdefault(pc, {}).get(k)
                        if same is not None:
                            if same.pending and not again and not _rounds_apart(visit, same, cfg.loop_calls):
                                raise Reject("infinite loop detected: the same state comes back here (loop)")
                            self._trace_back(visit, steps, pc, depth, everything(depth) if same.pending else
                                             same.precise)
                            _finish(visit, self.explored)
                            break
                        old = self._covering(pc, st, live)
                        if old is not None:   # what old's exploration read, this path's values must be within
                            self._trace_back(visit, steps, pc, depth, old.precise)
                            _finish(visit, self.explored)
                            break
                        visit = _Visit(visit, st.copy(), pc, nth, steps)
                        steps = []
                        self.seen[pc][k] = visit
                        if wide:
                            self.widened.setdefault(pc, []).append(visit)
                    self.processed += 1
                    if self.processed > self.max_insns:
                        raise Reject(f"program too complex: processed {self.max_insns} instructions without "
                                     "finishing (instruction budget)")
                    insn = cfg.at[pc]
                    self.reached.add(pc)
                    trace = _traced(trace, pc)
                    env.touched, env.linked = None, frozenset()
                    succ = STEP[insn.kind](env, st, insn)
                    if env.wants:
                        self._trace_back(visit, steps, pc, depth, set(env.wants))
                        env.wants.clear()
                    steps.append(Step(pc, depth, env.touched, env.linked))
                    if not succ:
                        _finish(visit, self.explored)
                        break
                    for other, other_pc in succ[1:]:
                        if visit is not None:
                            visit.pending += 1
                        work.append((other, other_pc, visit, trace, list(steps)))
                    if len(work) > MAX_PENDING:  # a long loop: each round leaves a branch behind
                        raise Reject(f"the sequence of {len(work)} jumps is too complex: more than {MAX_PENDING} "
                                     "branches wait to be explored (jump sequence)")
                    st, pc = succ[0]
            except Reject as r:
                raise _error(r, pc, list(cfg.insns), env.maps, (st, trace), file, section) from None

    def _covering(self, pc: int, st: State, live: list[int]) -> _Visit | None:
        """The newest state explored at ``pc`` that covers ``st``, counted as a hit, those tried before it as
        misses; the states that miss far more than they cover are dropped (a loop header's stay in memory: _round
        and _again compare rounds along the path; elsewhere only exact repeats are looked up from then on)."""
        done = self.explored.get(pc, [])
        found = None
        for old in reversed(done):
            if old.loose is None:
                old.loose = imprecise(old.state, old.precise)
            if covers(old.state, st, live, old.loose):
                old.hits += 1
                found = old
                break
            old.misses += 1
        if any(old.misses > _MISSES * (old.hits + 1) for old in done):
            keep = []
            for old in done:
                if old.misses <= _MISSES * (old.hits + 1):
                    keep.append(old)
                elif pc not in self.loops and pc not in self.cfg.loop_calls:
                    old.state = None
            done[:] = keep
        return found

    def _trace_back(self, visit: _Visit | None, steps: list[Step], pc: int, depth: int, need: set[int]) -> None:
        """Mark ``need``, the registers and slots read at ``pc`` (``depth`` frames), precise back along the path:
        in every remembered state above it, as what they were there, until none is left or a state has them all
        (the kernel's mark_chain_precision)."""
        nxt = (pc, depth)
        while True:
            for step in reversed(steps):
                need = back(self.cfg, step, nxt, need)
                if not need:
                    return
                nxt = (step.pc, step.depth)
            if visit is None or need <= visit.precise:
                return
            visit.precise |= need
            steps, visit = visit.steps, visit.parent

    def _again(self, st: State, pc: int, visit: _Visit | None, live: list[int]) -> tuple[State | None, bool]:
        """A path at a bpf_loop call, and whether a round of its callback brought it back (the path's last visit
        at this depth or above is this call's own). Then None where that visit's state covers it: its
        exploration, every further round included, covers this one; else the state widened against it (the
        scalars a round changed made unknown, as Linux's widen_imprecise_scalars) so that the rounds converge."""
        while visit is not None and visit.depth > len(st.frames):
            visit = visit.parent
        if visit is None or visit.pc != pc or visit.depth != len(st.frames):
            return st, False
        if covers(visit.state, st, live):
            return None, True
        return widen(visit.state, st, live) or st, True

    def _round(self, st: State, pc: int, visit: _Visit | None,
               live: list[int]) -> tuple[State | None, bool, int]:
        """A path at a loop header: (None, ...) where it ends there, covered by the state the previous round
        of this invocation of the function brought (the loop runs on as that round's exploration went, until
        the budget stops it) or by a widened state explored to the end; else the state to go on with, whether
        it was widened (from WIDEN_AFTER rounds on: cfg.run_time_loops' loops only) and which round it is."""
        while visit is not None and visit.depth >= len(st.frames):   # a caller's visit: another invocation
            if visit.pc == pc and visit.depth == len(st.frames):
                break
            visit = visit.parent
        else:
            visit = None
        if visit is not None and covers(visit.state, st, live):
            # the budget may end the program at this loop's jumps, as bpf_exit does: nothing may stay reserved
            no_leaked_refs(st, " before a loop bounded at run time, whose budget may end the program there,")
            self.budgeted |= self.loops[pc]
            return None, False, 0
        if any(not w.pending and covers(w.state, st, live) for w in self.widened.get(pc, ())):
            return None, False, 0
        if visit is None:
            return st, False, 0
        if visit.nth + 1 >= WIDEN_AFTER:
            wide = widen(visit.state, st, live)
            if wide is not None:
                return wide, True, visit.nth + 1
        return st, False, visit.nth + 1


def _check_combined_stack(cfg: Cfg, depths: tuple[int, ...], callbacks: Mapping[int, int]) -> None:
    """The deepest call chain's frames together fit 512 bytes; frames round up to 32 like the kernel's. A
    callback's frame lies below the function taking its address (as in Linux) and the one calling bpf_loop with
    it. A refusal names the main program's call (or callback address) that starts that chain and each frame's
    size."""
    memo: dict[int, tuple[int, tuple[int, ...]]] = {}
    callees = [dict(c) for c in cfg.callees]
    for pc, callback in callbacks.items():
        callees[cfg.subprog_of[pc]].setdefault(cfg.subprog_of[callback], pc)

    def frame(s: int) -> int:
        return (max(depths[s], 1) + 31) // 32 * 32

    def chain(s: int) -> tuple[int, tuple[int, ...]]:  # (bytes, the subprograms) of the deepest chain from s
        if s not in memo:
            below = max((chain(c) for c in callees[s]), default=(0, ()))
            memo[s] = (frame(s) + below[0], (s, *below[1]))
        return memo[s]

    total, subs = chain(0)
    if total > MAX_COMBINED_STACK:
        call = callees[0][subs[1]]
        frames = ", ".join(f"{frame(s)} at pc {cfg.subprogs[s]}" for s in subs)
        raise Reject(f"combined stack size of {len(subs)} calls is {total} ({frames}), more than "
                     f"{MAX_COMBINED_STACK} (stack size)", pc=call)


def _error(r: Reject, pc: int | None, insns: list[Insn], maps: list[MapDef],
           path: tuple[State, tuple | None] | None, file: str | None, section: str | None) -> VerifierError:
    at = r.pc if r.pc is not None else pc if pc is not None else 0
    by_pc = {i.pc: i for i in insns}
    insn = by_pc.get(at)
    reason = f"{disasm_insn(insn)}: {r.reason}" if insn is not None else r.reason
    detail = None
    if path is not None:
        st, trace = path
        lines: list[str] = []
        while trace is not None and len(lines) < _LOG_TAIL:
            lines.append(f"{trace[0]}: {disasm_insn(by_pc[trace[0]])}")
            trace = trace[1]
        lines.reverse()
        if not lines or not lines[-1].startswith(f"{at}: "):
            lines.append(f"{at}: {disasm_insn(insn)}" if insn is not None else f"{at}:")
        lines.append(f"state at {at}:")
        lines.append(fmt_state(st, maps))
        lines.append(f"{at}: {reason}")
        detail = "\n".join(lines)
    return VerifierError(reason, file=file, section=section, insn=at, detail=detail)
