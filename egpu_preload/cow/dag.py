"""The order of the application's GPU work: launches, memcpys and memsets as a DAG.

Each operation gets a process-wide ``seq`` in the order the host issued it. Edges say which earlier
operations it must come after: the previous one on its stream (stream order), an explicit wait
(cuStreamWaitEvent: ``after``), and buffer dependencies: read-after-write (a read after the last
writer), write-after-read (a write after every reader since the last write) and write-after-write.
Buffers are any hashable names: allocations.Allocation objects and ("global", module, symbol) keys.
An operation with ``everything`` set (a kernel whose accesses the analysis cannot bound) reads and
writes every buffer.

A cut is one position per stream: ``{stream: seq of the last operation included}`` (streams absent:
nothing included). It is consistent when every operation inside has all its predecessors inside, so
the state "after exactly the operations in the cut" exists in some execution. Because every edge runs
from a lower seq to a higher one, the frontier (everything issued so far) is always consistent; a
checkpoint records events on every stream at that point.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Iterable

from egpu_preload.errors import CowError

Cut = dict[int, int]


@dataclass(frozen=True)
class Op:
    seq: int
    stream: int
    kind: str                      # "launch" | "memcpy" | "memset" | ...
    reads: frozenset
    writes: frozenset
    name: str = ""                 # kernel name, for people reading a trace
    everything: bool = False       # reads and writes every buffer

    def writes_anything(self) -> bool:
        return self.everything or bool(self.writes)


@dataclass(frozen=True)
class Edge:
    src: int
    dst: int
    why: str                       # "stream" | "wait" | "raw" | "war" | "waw"


def included(cut: Cut, op: Op) -> bool:
    return op.seq <= cut.get(op.stream, -1)


class Dag:
    def __init__(self) -> None:
        self.ops: dict[int, Op] = {}
        self.preds: dict[int, set[Edge]] = {}
        self._next = 0
        self._stream_last: dict[int, int] = {}
        self._writer: dict[Hashable, int] = {}            # buffer -> last writer
        self._readers: dict[Hashable, set[int]] = {}      # buffer -> readers since that write
        self._all: int | None = None                      # last "everything" operation

    def add(self, stream: int, kind: str, reads: Iterable[Hashable] = (), writes: Iterable[Hashable] = (),
            name: str = "", everything: bool = False, after: Iterable[int] = ()) -> Op:
        """Append an operation issued now on ``stream``; ``after``: seqs it waits for besides."""
        op = Op(self._next, stream, kind, frozenset(reads), frozenset(writes), name, everything)
        self._next += 1
        edges: set[Edge] = set()

        def edge(src: int | None, why: str) -> None:
            if src is not None and src != op.seq:
                edges.add(Edge(src, op.seq, why))

        edge(self._stream_last.get(stream), "stream")
        for s in after:
            if s >= op.seq:
                raise CowError(f"operation {op.seq} cannot wait for later operation {s}")
            edge(s, "wait")
        if everything:
            for w in self._writer.values():
                edge(w, "raw")
            for rs in self._readers.values():
                for r in rs:
                    edge(r, "war")
            edge(self._all, "waw")
            self._writer.clear()
            self._readers.clear()
            self._all = op.seq
        else:
            for b in op.reads:
                edge(self._last_writer(b), "raw")
            for b in op.writes:
                for r in self._readers.get(b, ()):
                    edge(r, "war")
                edge(self._last_writer(b), "waw")
            for b in op.reads - op.writes:
                self._readers.setdefault(b, set()).add(op.seq)
            for b in op.writes:
                self._writer[b] = op.seq
                self._readers.pop(b, None)
        self.ops[op.seq] = op
        self.preds[op.seq] = edges
        self._stream_last[stream] = op.seq
        return op

    def _last_writer(self, buffer: Hashable) -> int | None:
        w = self._writer.get(buffer)
        if self._all is None:
            return w
        return self._all if w is None else max(w, self._all)

    def frontier(self) -> Cut:
        """The cut holding every operation issued so far (always consistent)."""
        return dict(self._stream_last)

    def is_consistent(self, cut: Cut) -> bool:
        return all(included(cut, self.ops[e.src]) for op in self.ops.values() if included(cut, op)
                   for e in self.preds[op.seq] if e.src in self.ops)

    def consistent_cut(self, wanted: Cut) -> Cut:
        """The largest consistent cut at or below ``wanted`` on every stream."""
        cut = dict(wanted)
        order = sorted(self.ops)
        previous: dict[int, int] = {}      # seq -> the seq before it on its stream (-1: none)
        last: dict[int, int] = {}
        for s in order:
            previous[s] = last.get(self.ops[s].stream, -1)
            last[self.ops[s].stream] = s
        changed = True
        while changed:
            changed = False
            for s in order:
                op = self.ops[s]
                if included(cut, op) and any(e.src in self.ops and not included(cut, self.ops[e.src])
                                             for e in self.preds[s]):
                    cut[op.stream] = previous[s]
                    changed = True
        return cut

    def writers_since(self, cut: Cut) -> list[Op]:
        """Operations outside the cut that write a buffer, in issue order: before each runs, the
        buffers it writes must have been copied for a snapshot at ``cut``."""
        return [op for op in sorted(self.ops.values(), key=lambda o: o.seq)
                if not included(cut, op) and op.writes_anything()]

    def forget(self, cut: Cut) -> None:
        """Drop operations inside a cut no one will ask about again (the DAG stays small in long runs);
        the buffer bookkeeping keeps working on their seqs."""
        for seq in [s for s, op in self.ops.items() if included(cut, op)]:
            del self.ops[seq], self.preds[seq]
