"""Helper calls inlined as PTX: arguments in r1-r5, result in r0, semantics of vm/calls.py and maps.py.

Map parameters (sizes, entries, layout) are baked into the code; the map's region comes from the
module's map table (devmaps.py documents the layout and the lock-free hash protocol). Nothing here
waits on the host but a ring made to wait (MapLayout.wait: egpu-run --on-full wait, where a reader
drains it while kernels run); other rings drop (and count) when full, and the only other spin is an
inserter waiting for another thread to finish writing a key it claimed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from ..bpf import program as prog
from ..bpf.decode import Insn
from ..bpf.helpers import BPF_EXIST, BPF_F_CURRENT_CPU, BPF_NOEXIST, BPF_RB_FLAGS, HELPERS, TASK_COMM_LEN
from ..maps import E2BIG, EAGAIN, EEXIST, EINVAL, ENOENT, ENOSPC
from . import devmaps
from ..output import warp_records as wr
from .devmaps import BUSY, DELETED, EMPTY, FULL, HEADER, REC_BUSY, REC_DISCARD, REC_READY, REC_WRAP, MapLayout
from .emitter import Addr, FuncGen, lit


def emit_helper(g: FuncGen, insn: Insn) -> None:
    helper = HELPERS.get(insn.imm)
    if helper is None:
        raise g.fail(insn, f"unknown helper {insn.imm}")
    emit = _EMIT.get(helper.name)
    if emit is None:   # a host program's alone (queue, stack and bloom filter maps'): the loader refuses it first
        raise g.fail(insn, f"{helper.name} has no GPU form: host programs only")
    choices = sorted(g.verified.map_choices.get(insn.pc, ())) if g.verified is not None else []
    if not choices:
        emit(g, insn)
        return
    # Paths pass different maps (Linux's poisoned map pointer, which calls the map's own ops): the call is
    # emitted once per map, chosen by comparing the map argument with each map's table entry.
    arg, done = g.reg(helper.args.index("map") + 1), g.label()

    def emit_for(index: int) -> None:
        g.call_map = index
        emit(g, insn)
        g.call_map = None

    for index in choices[:-1]:
        entry, other, skip = g.t64(), g.pred(), g.label()
        g.table_entry(entry, index)
        g.emit(f"setp.ne.u64 {other}, {arg}, {entry};")
        g.emit(f"@{other} bra {skip};")
        emit_for(index)
        g.emit(f"bra {done};")
        g.place(skip)
    emit_for(choices[-1])
    g.place(done)


# ---- small pieces --------------------------------------------------------------------------------

def _set_r0(g: FuncGen, value: int | str) -> None:
    g.emit(f"mov.b64 {g.reg(0)}, {lit(value) if isinstance(value, int) else value};")


def _special(g: FuncGen, sreg: str) -> str:
    w = g.t32()
    g.emit(f"mov.u32 {w}, {sreg};")
    t = g.t64()
    g.emit(f"cvt.u64.u32 {t}, {w};")
    return t


def _map(g: FuncGen, insn: Insn, reg: int = 1) -> tuple[int, prog.MapDef, MapLayout]:
    index = g.map_index(insn, reg)
    m = g.map_def(insn, index)
    return index, m, devmaps.layout(m)


def _pieces(n: int, align: int) -> list[tuple[int, int]]:
    """(offset, size) accesses covering n bytes, none wider than align, each naturally aligned."""
    out, i = [], 0
    while i < n:
        p = next(p for p in (8, 4, 2, 1) if p <= align and p <= n - i and i % p == 0)
        out.append((i, p))
        i += p
    return out


def _load_chunks(g: FuncGen, insn: Insn, reg: int, n: int) -> list[str]:
    """n bytes at the helper argument r<reg>, as little-endian u64 registers (the last one zero padded)."""
    src = g.arg(insn, reg, 1)
    regs = [g.t64() for _ in range((n + 7) // 8)]

    def fill(al: int) -> None:
        for c, r in enumerate(regs):
            first = True
            for off, p in _pieces(min(8, n - 8 * c), al):
                t = r if first else g.t64()
                g.emit(f"ld{src.space}.u{8 * p} {t}, {src.at(8 * c + off)};")
                if not first:
                    g.emit(f"shl.b64 {t}, {t}, {8 * off};")
                    g.emit(f"or.b64 {r}, {r}, {t};")
                first = False

    _by_alignment(g, src, g.arg_align(insn, reg), fill)
    return regs


def _by_alignment(g: FuncGen, src: Addr, align: int | None, body: Callable[[int], None]) -> None:
    """body(align) when it is known, else body(8) when src is 8-byte aligned at run time, else body(1)."""
    if align is not None:
        body(align)
    else:
        g.either(g.misaligned(src.base, 8), lambda: body(8), lambda: body(1))


def _copy_const(g: FuncGen, dst: str, insn: Insn, reg: int, n: int) -> None:
    """Copy n bytes from the helper argument r<reg> to 8-aligned generic dst."""
    src = g.arg(insn, reg, 1)

    def body(al: int) -> None:
        for off, p in _pieces(n, al):
            t = g.t64()
            g.emit(f"ld{src.space}.u{8 * p} {t}, {src.at(off)};")
            g.emit(f"st.u{8 * p} [{dst}+{off}], {t};")

    _by_alignment(g, src, g.arg_align(insn, reg), body)


def _copy_var(g: FuncGen, dst: str, src: str, n: str) -> None:
    """Copy n (a register) bytes from generic src to 8-aligned generic dst, a byte at a time."""
    i = g.t64()
    g.emit(f"mov.b64 {i}, 0;")
    loop, done = g.label(), g.label()
    p = g.pred()
    g.place(loop)
    g.emit(f"setp.ge.u64 {p}, {i}, {n};")
    g.emit(f"@{p} bra {done};")
    s, d, b = g.t64(), g.t64(), g.t32()
    g.emit(f"add.u64 {s}, {src}, {i};")
    g.emit(f"add.u64 {d}, {dst}, {i};")
    g.emit(f"ld.u8 {b}, [{s}];")
    g.emit(f"st.u8 [{d}], {b};")
    g.emit(f"add.u64 {i}, {i}, 1;")
    g.emit(f"bra {loop};")
    g.place(done)


def _ret(g: FuncGen, done: str, value: int) -> str:
    """A label that sets r0 = value and jumps to done; emitted later by _succeed."""
    lab = g.label()
    g.pending.append((lab, value, done))
    return lab


def _succeed(g: FuncGen, done: str) -> None:
    """r0 = 0 and on to done; then the early returns taken by _ret, which join at done too."""
    _set_r0(g, 0)
    g.emit(f"bra {done};")
    for lab, value, join in g.pending:
        g.place(lab)
        _set_r0(g, value)
        g.emit(f"bra {join};")
    g.pending.clear()
    g.place(done)


def _branch(g: FuncGen, cond: str, a: str, b: str | int, target: str, ty: str = "u64") -> None:
    p = g.pred()
    g.emit(f"setp.{cond}.{ty} {p}, {a}, {lit(b) if isinstance(b, int) else b};")
    g.emit(f"@{p} bra {target};")


# ---- arrays ----------------------------------------------------------------------------------

def _array_slot(g: FuncGen, insn: Insn, index: int, m: prog.MapDef, lay: MapLayout,
                miss: str) -> str:
    """The address of the value for the u32 key at r2 in this thread's copy, or a jump to miss."""
    base = g.map_base(index)
    known = g.const(insn.pc)
    slot = g.t64()
    if lay.threads:
        thread_row(g, base, lay, miss)
    elif lay.kind == "percpu_array":
        sm_row(g, base, lay)
    if known is not None:  # constant key: folded to an address
        if known >= m.max_entries:
            g.emit(f"bra {miss};")
            return slot
        g.emit(f"add.u64 {slot}, {base}, {HEADER + known * lay.stride};")
        return slot
    idx = g.t64()
    g.load(idx, g.arg(insn, 2, 4), 4)
    _branch(g, "ge", idx, m.max_entries, miss)
    g.emit(f"mad.lo.u64 {slot}, {idx}, {lay.stride}, {base};")
    g.emit(f"add.u64 {slot}, {slot}, {HEADER};")
    return slot


def _load_constant(g: FuncGen, dst: str, base: str, off: int) -> None:
    """dst = the u32 at base + off, a count the host wrote and nothing on the GPU changes, through the
    read-only cache: every warp reads it, and the line it shares with counters or the ring's head must
    not queue those reads at one L2 slice."""
    t = g.t64()
    g.emit(f"cvta.to.global.u64 {t}, {base};")
    g.emit(f"ld.global.nc.u32 {dst}, [{t}+{off}];")


def sm_row(g: FuncGen, base: str, lay: MapLayout) -> None:
    """base (a percpu_array region, or a per-CPU hash's rows, in a register of its own) += the offset of this
    SM's row, or of the row of this warp's slot among the SM's ``spread`` rows (a striped ARRAY)."""
    row, nrows = _special(g, "%smid"), g.t64()
    if lay.spread > 1:
        slot = _special(g, "%warpid")
        g.emit(f"and.b64 {slot}, {slot}, {lay.spread - 1};")
        g.emit(f"shl.b64 {row}, {row}, {lay.spread.bit_length() - 1};")
        g.emit(f"or.b64 {row}, {row}, {slot};")
    _load_constant(g, nrows, base, lay.ncpu_off)
    g.emit(f"sub.u64 {nrows}, {nrows}, 1;")
    g.emit(f"min.u64 {row}, {row}, {nrows};")  # defensive: the host sizes the rows from %nsmid
    g.emit(f"mul.lo.u64 {row}, {row}, {lay.cpu_stride};")
    g.emit(f"add.u64 {base}, {base}, {row};")


def thread_row(g: FuncGen, base: str, lay: MapLayout, miss: str) -> None:
    """base (a per-thread array's region) += the offset of this thread's array, or a jump to miss for a
    thread past the region's arrays. The index is bpftime's getGlobalThreadId: x + y * width + z * width
    * height, each axis ctaid * ntid + tid, width and height the grid's extent in threads."""
    axis = []
    for a in "xyz":
        t = _special(g, f"%ctaid.{a}")
        g.emit(f"mad.lo.u64 {t}, {t}, {_special(g, f'%ntid.{a}')}, {_special(g, f'%tid.{a}')};")
        axis.append(t)
    x, y, z = axis
    width, height = _special(g, "%nctaid.x"), _special(g, "%nctaid.y")
    g.emit(f"mul.lo.u64 {width}, {width}, {_special(g, '%ntid.x')};")
    g.emit(f"mul.lo.u64 {height}, {height}, {_special(g, '%ntid.y')};")
    g.emit(f"mad.lo.u64 {z}, {z}, {height}, {y};")
    g.emit(f"mad.lo.u64 {z}, {z}, {width}, {x};")
    _branch(g, "ge", z, lay.threads, miss)
    g.emit(f"mad.lo.u64 {base}, {z}, {lay.cpu_stride}, {base};")


# ---- hash maps -------------------------------------------------------------------------------

def _hash_start(g: FuncGen, insn: Insn, index: int, lay: MapLayout) -> tuple[str, list[str], str, str, str]:
    """Load the key at r2, hash it; returns (region base, key registers, bucket index, probe count,
    loop label placed here)."""
    base = g.map_base(index)
    keys = _load_chunks(g, insn, 2, lay.key_size)
    h, t = g.t64(), g.t64()
    g.emit(f"mov.b64 {h}, {lit(devmaps.HASH_SEED)};")
    for k in keys:
        g.emit(f"xor.b64 {h}, {h}, {k};")
        g.emit(f"mul.lo.u64 {h}, {h}, {lit(devmaps.HASH_MUL)};")
        g.emit(f"shr.u64 {t}, {h}, 33;")
        g.emit(f"xor.b64 {h}, {h}, {t};")
    g.emit(f"and.b64 {h}, {h}, {lay.entries - 1};")
    n = g.t64()
    g.emit(f"mov.b64 {n}, 0;")
    return base, keys, h, n, g.label()


def _slot_of(g: FuncGen, base: str, idx: str, lay: MapLayout) -> tuple[str, str]:
    """(slot address, its state loaded with acquire ordering)."""
    slot = g.t64()
    g.emit(f"mad.lo.u64 {slot}, {idx}, {lay.stride}, {base};")
    g.emit(f"add.u64 {slot}, {slot}, {HEADER};")
    s = g.t32()
    g.emit(f"ld.acquire.gpu.u32 {s}, [{slot}];")
    return slot, s


def _key_differs(g: FuncGen, slot: str, keys: list[str], lay: MapLayout, target: str) -> None:
    for c, k in enumerate(keys):
        t = g.t64()
        g.emit(f"ld.u64 {t}, [{slot}+{lay.key_off + 8 * c}];")
        _branch(g, "ne", t, k, target, "b64")


def _advance(g: FuncGen, idx: str, n: str, lay: MapLayout, loop: str) -> None:
    g.emit(f"add.u64 {idx}, {idx}, 1;")
    g.emit(f"and.b64 {idx}, {idx}, {lay.entries - 1};")
    g.emit(f"add.u64 {n}, {n}, 1;")
    _branch(g, "lt", n, lay.entries, loop)


def _touch(g: FuncGen, slot: str, lay: MapLayout) -> None:
    if lay.lru:
        t = g.t64()
        g.emit(f"mov.u64 {t}, %globaltimer;")
        g.emit(f"st.relaxed.gpu.u64 [{slot}+8], {t};")


def _find(g: FuncGen, insn: Insn, index: int, lay: MapLayout, nxt: str, miss: str) -> tuple[str, str, str, str, str]:
    """Probe for the key at r2 from its home bucket: fall through at its FULL slot, go to miss where it is
    absent or deleted, to nxt for the next slot. Returns (region base, bucket, probe count, loop label,
    slot address)."""
    base, keys, idx, n, loop = _hash_start(g, insn, index, lay)
    g.place(loop)
    slot, s = _slot_of(g, base, idx, lay)
    _branch(g, "eq", s, EMPTY, miss, "u32")
    _branch(g, "eq", s, BUSY, nxt, "u32")   # being inserted: if it is our key, it is not there yet
    _key_differs(g, slot, keys, lay, nxt)
    _branch(g, "ne", s, FULL, miss, "u32")  # our key's tombstone
    return base, idx, n, loop, slot


def _value(g: FuncGen, base: str, idx: str, slot: str, lay: MapLayout, v: str | None = None) -> str:
    """v (a new register when None) = the address of the value of the key in bucket idx (at slot): in the
    slot, or a per-CPU hash's in this SM's row."""
    v = v or g.t64()
    if not lay.percpu:
        g.emit(f"add.u64 {v}, {slot}, {lay.val_off};")
        return v
    g.emit(f"mov.b64 {v}, {base};")
    sm_row(g, v, lay)
    g.emit(f"mad.lo.u64 {v}, {idx}, {devmaps.round8(lay.value_size)}, {v};")
    g.emit(f"add.u64 {v}, {v}, {lay.rows_off};")
    return v


def _zero_rows(g: FuncGen, base: str, idx: str, lay: MapLayout) -> None:
    """Zero the value of bucket idx in every SM's row of a per-CPU hash (the u32 at ncpu_off counts them)."""
    v, end, ncpu = g.t64(), g.t64(), g.t64()
    _load_constant(g, ncpu, base, lay.ncpu_off)
    g.emit(f"mad.lo.u64 {v}, {idx}, {devmaps.round8(lay.value_size)}, {base};")
    g.emit(f"add.u64 {v}, {v}, {lay.rows_off};")
    g.emit(f"mad.lo.u64 {end}, {ncpu}, {lay.cpu_stride}, {v};")
    loop, done = g.label(), g.label()
    g.place(loop)
    g.emit('.pragma "nounroll";')
    _branch(g, "ge", v, end, done)
    for off in range(0, devmaps.round8(lay.value_size), 8):
        g.emit(f"st.u64 [{v}+{off}], 0;")
    g.emit(f"add.u64 {v}, {v}, {lay.cpu_stride};")
    g.emit(f"bra {loop};")
    g.place(done)


def _hash_lookup(g: FuncGen, insn: Insn, index: int, lay: MapLayout) -> None:
    nxt, miss, done = g.label(), g.label(), g.label()
    base, idx, n, loop, slot = _find(g, insn, index, lay, nxt, miss)
    _touch(g, slot, lay)
    _value(g, base, idx, slot, lay, g.reg(0))
    g.emit(f"bra {done};")
    g.place(nxt)
    _advance(g, idx, n, lay, loop)
    g.place(miss)
    _set_r0(g, 0)
    g.place(done)


def _credit(g: FuncGen, base: str, m: prog.MapDef, lay: MapLayout, idx: str, fail: str) -> None:
    """Count one more live entry, or undo and jump to fail when the map is full (LRU: evict first)."""
    c = g.t32()
    again = g.label()
    tries = g.t32()
    g.emit(f"mov.u32 {tries}, 0;")
    g.place(again)
    g.emit(f"atom.add.u32 {c}, [{base}], 1;")
    ok = g.label()
    _branch(g, "lt", c, m.max_entries, ok, "u32")
    g.emit(f"red.add.u32 [{base}], 0xFFFFFFFF;")
    if lay.lru:
        _branch(g, "ge", tries, 2, fail, "u32")
        g.emit(f"add.u32 {tries}, {tries}, 1;")
        _evict(g, base, idx, lay)
        g.emit(f"bra {again};")
    else:
        g.emit(f"bra {fail};")
    g.place(ok)


def _evict(g: FuncGen, base: str, home: str, lay: MapLayout) -> None:
    """Turn the least recently used FULL slot of LRU_WINDOW buckets from home into a tombstone."""
    best, best_t, j = g.t64(), g.t64(), g.t64()
    g.emit(f"mov.b64 {best}, 0;")
    g.emit(f"mov.b64 {best_t}, {lit(-1)};")
    g.emit(f"mov.b64 {j}, 0;")
    loop, skip, pick = g.label(), g.label(), g.label()
    g.place(loop)
    # Kept rolled (PTX ISA: .pragma "nounroll" in the loop's header block). Unrolled it was a quarter of
    # ptxas's time for an LRU probe, paid again for every kernel; each pass waits on its ld.acquire anyway.
    g.emit('.pragma "nounroll";')
    b = g.t64()
    g.emit(f"add.u64 {b}, {home}, {j};")
    g.emit(f"and.b64 {b}, {b}, {lay.entries - 1};")
    slot, s = _slot_of(g, base, b, lay)
    _branch(g, "ne", s, FULL, skip, "u32")
    t = g.t64()
    g.emit(f"ld.relaxed.gpu.u64 {t}, [{slot}+8];")
    _branch(g, "ge", t, best_t, skip)
    g.emit(f"mov.b64 {best_t}, {t};")
    g.emit(f"mov.b64 {best}, {slot};")
    g.place(skip)
    g.emit(f"add.u64 {j}, {j}, 1;")
    _branch(g, "lt", j, min(devmaps.LRU_WINDOW, lay.entries), loop)
    _branch(g, "eq", best, 0, pick)
    old = g.t32()
    g.emit(f"atom.cas.b32 {old}, [{best}], {FULL}, {DELETED};")
    _branch(g, "ne", old, FULL, pick, "u32")
    g.emit(f"red.add.u32 [{base}], 0xFFFFFFFF;")
    g.place(pick)


def _hash_update(g: FuncGen, insn: Insn, index: int, m: prog.MapDef, lay: MapLayout) -> None:
    flags = g.reg(4)
    done = g.label()
    _branch(g, "gt", flags, BPF_EXIST, _ret(g, done, -EINVAL))
    base, keys, idx, n, loop = _hash_start(g, insn, index, lay)
    nxt, free, found = g.label(), g.label(), g.label()
    full_ret, noent_ret, exist_ret = _ret(g, done, -E2BIG), _ret(g, done, -ENOENT), _ret(g, done, -EEXIST)
    g.place(loop)
    slot, s = _slot_of(g, base, idx, lay)
    _branch(g, "eq", s, EMPTY, free, "u32")
    busy = g.label()
    _branch(g, "ne", s, BUSY, busy, "u32")
    g.emit("nanosleep.u32 32;")  # another thread is writing this slot's key; it waits on nothing
    g.emit(f"bra {loop};")
    g.place(busy)
    _key_differs(g, slot, keys, lay, nxt)
    _branch(g, "eq", s, DELETED, free, "u32")
    g.emit(f"bra {found};")
    g.place(nxt)
    _advance(g, idx, n, lay, loop)
    g.emit(f"bra {full_ret};")

    # One claim for both free states, expecting the state s it read (EMPTY or DELETED) and putting it back
    # on failure: a copy per state doubled the credit (LRU: eviction) loops, which ptxas compiles again
    # for every kernel that calls the probe (whole-program mode clones each .func per kernel).
    g.place(free)
    _branch(g, "eq", flags, BPF_EXIST, noent_ret)
    old = g.t32()
    g.emit(f"atom.cas.b32 {old}, [{slot}], {s}, {BUSY};")
    _branch(g, "ne", old, s, loop, "u32")
    undo, ok = g.label(), g.label()
    _credit(g, base, m, lay, idx, undo)
    g.emit(f"bra {ok};")
    g.place(undo)
    g.emit(f"st.release.gpu.u32 [{slot}], {s};")
    g.emit(f"bra {full_ret};")
    g.place(ok)
    publish = g.label()
    revive = g.label() if lay.percpu else publish
    # a tombstone of our key keeps the key (a per-CPU hash: and every SM's old value, zeroed here)
    _branch(g, "ne", s, EMPTY, revive, "u32")
    for c, k in enumerate(keys):
        g.emit(f"st.u64 [{slot}+{lay.key_off + 8 * c}], {k};")
    if lay.percpu:
        g.emit(f"bra {publish};")
        g.place(revive)
        _zero_rows(g, base, idx, lay)
    g.place(publish)
    _write_value(g, insn, base, idx, slot, lay)
    g.emit(f"st.release.gpu.u32 [{slot}], {FULL};")
    _set_r0(g, 0)
    g.emit(f"bra {done};")
    g.place(found)
    _branch(g, "eq", flags, BPF_NOEXIST, exist_ret)
    _write_value(g, insn, base, idx, slot, lay)
    _succeed(g, done)


def _write_value(g: FuncGen, insn: Insn, base: str, idx: str, slot: str, lay: MapLayout) -> None:
    _copy_const(g, _value(g, base, idx, slot, lay), insn, 3, lay.value_size)
    _touch(g, slot, lay)


def _hash_delete(g: FuncGen, insn: Insn, index: int, lay: MapLayout) -> None:
    nxt, miss, done = g.label(), g.label(), g.label()
    base, idx, n, loop, slot = _find(g, insn, index, lay, nxt, miss)
    old = g.t32()
    g.emit(f"atom.cas.b32 {old}, [{slot}], {FULL}, {DELETED};")
    _branch(g, "ne", old, FULL, loop, "u32")
    g.emit(f"red.add.u32 [{base}], 0xFFFFFFFF;")
    _set_r0(g, 0)
    g.emit(f"bra {done};")
    g.place(nxt)
    _advance(g, idx, n, lay, loop)
    g.place(miss)
    _set_r0(g, -ENOENT)
    g.place(done)


# ---- the map helpers -------------------------------------------------------------------------

def map_lookup_elem(g: FuncGen, insn: Insn) -> None:
    """r0 = &value for *r2 in map r1, or NULL."""
    index, m, lay = _map(g, insn)
    if lay.kind == "hash":
        _hash_lookup(g, insn, index, lay)
        return
    if lay.kind == "ringbuf":
        raise g.fail(insn, f"map {m.name} has no lookup")
    miss, done = g.label(), g.label()
    slot = _array_slot(g, insn, index, m, lay, miss)
    _set_r0(g, slot)
    g.emit(f"bra {done};")
    g.place(miss)
    _set_r0(g, 0)
    g.place(done)


def map_update_elem(g: FuncGen, insn: Insn) -> None:
    """r0 = update(map r1, key *r2, value *r3, flags r4): 0 or -errno as maps.py returns them."""
    index, m, lay = _map(g, insn)
    if m.readonly:
        _set_r0(g, -EINVAL)
        return
    if lay.kind == "hash":
        _hash_update(g, insn, index, m, lay)
        return
    if lay.kind == "ringbuf":
        raise g.fail(insn, f"map {m.name} has no update")
    done = g.label()
    flags = g.reg(4)
    _branch(g, "gt", flags, BPF_EXIST, _ret(g, done, -EINVAL))
    slot = _array_slot(g, insn, index, m, lay, _ret(g, done, -E2BIG))
    _branch(g, "eq", flags, BPF_NOEXIST, _ret(g, done, -EEXIST))
    _copy_const(g, slot, insn, 3, m.value_size)
    _succeed(g, done)


def map_delete_elem(g: FuncGen, insn: Insn) -> None:
    """r0 = delete(map r1, key *r2); arrays cannot delete (-EINVAL)."""
    index, m, lay = _map(g, insn)
    if lay.kind == "hash":
        _hash_delete(g, insn, index, lay)
    elif lay.kind == "ringbuf":
        raise g.fail(insn, f"map {m.name} has no delete")
    else:
        _set_r0(g, -EINVAL)


# ---- ring buffers ----------------------------------------------------------------------------

class Reserved(NamedTuple):
    """A record _reserve took: its header's address, and what _commit needs (this SM's line of the ring, the
    record's bytes with header and padding)."""

    rec: str
    line: str
    total: str


def _reserve(g: FuncGen, base: str, lay: MapLayout, size: str, fail: str, busy: int = REC_BUSY) -> Reserved:
    """Reserve a record of size (register) data bytes, its flags ``busy``, or jump to fail after counting a drop.
    A record that crosses the end of the data marks where it ends at the data's start (devmaps.py: REC_WRAP).

    Lanes reserving the same number of bytes in the same ring at once (match.sync: a probe's fixed-size
    event, from every lane of a warp) take their records with one atomic on each of the ring's
    counters for the group, made by its lowest lane, which hands the others the outcome (shfl.sync):
    the ring's header is one line that every producer's atomics queue on. A group gets as many records
    as there is room for, to its lowest lanes. Lanes asking for different sizes reserve one by one (PTX ISA:
    match.sync, shfl.sync; sm_70+). A record at least as large as one this SM was refused before is
    refused at once, counted on the SM's line (devmaps.py): a full ring takes no credit."""
    total = _record_bytes(g, size)
    mask, peers, same = g.t32(), g.t32(), g.t32()
    alike = g.pred()
    g.emit(f"activemask.b32 {mask};")
    g.emit(f"match.any.sync.b64 {peers}, {base}, {mask};")
    g.emit(f"match.all.sync.b64 {same}|{alike}, {total}, {peers};")
    group = group_rank(g, peers)
    line, one, placed, pos = _ring_line(g, base, lay), g.label(), g.label(), g.t64()
    if lay.wait:
        g.emit(f"@!{alike} bra {one};")
        _reserve_group_wait(g, base, lay, total, group, pos, line, fail, peers)
        g.emit(f"bra {placed};")
        g.place(one)
        _reserve_one_wait(g, base, lay, total, pos, line, fail)
        g.place(placed)
    else:
        full, refused = g.t64(), g.pred()
        g.emit(f"ld.volatile.u64 {full}, [{line}];")
        # Predicated, not branched to: a branch here doubles what ptxas spends on each inlined copy.
        g.emit(f"setp.ge.u64 {refused}, {total}, {full};")
        g.emit(f"@!{alike} bra {one};")
        _reserve_group(g, base, lay, total, peers, group, pos, line, fail, refused)
        g.emit(f"bra {placed};")
        g.place(one)
        _reserve_one(g, base, lay, total, pos, line, fail, refused)
        g.place(placed)
    if lay.capacity & (lay.capacity - 1):
        g.emit(f"rem.u64 {pos}, {pos}, {lay.capacity};")
    else:
        g.emit(f"and.b64 {pos}, {pos}, {lay.capacity - 1};")
    rec, past, cross = g.t64(), g.t64(), g.pred()
    g.emit(f"add.u64 {past}, {pos}, {total};")
    g.emit(f"setp.gt.u64 {cross}, {past}, {lay.capacity};")
    g.emit(f"sub.u64 {past}, {past}, {lay.capacity};")
    g.emit(f"or.b64 {past}, {past}, {lit(REC_WRAP << 32)};")
    g.emit(f"@{cross} st.u64 [{base}+{HEADER}], {past};")
    g.emit(f"add.u64 {rec}, {base}, {pos};")
    g.emit(f"add.u64 {rec}, {rec}, {HEADER};")
    g.emit(f"st.u32 [{rec}], {size};")
    g.emit(f"st.u32 [{rec}+4], {busy};")
    return Reserved(rec, line, total)


def _record_bytes(g: FuncGen, size: str) -> str:
    """A register holding the ring bytes of a record of ``size`` (u64 register) data bytes: its 8-byte header and
    the data rounded up to 8."""
    total = g.t64()
    g.emit(f"add.u64 {total}, {size}, 15;")
    g.emit(f"and.b64 {total}, {total}, {lit(-8)};")
    return total


def _commit(g: FuncGen, r: Reserved, guard: str = "") -> None:
    """Count a published record's bytes on its SM's line, after its flag (a release: whoever reads the count
    then reads the record whole): the lines summed to head tell the reader that no record below it is still
    being written (devmaps.py: COMMITTED)."""
    g.emit(f"{guard}red.release.sys.add.u64 [{r.line}+{devmaps.COMMITTED}], {r.total};")


def _ring_line(g: FuncGen, base: str, lay: MapLayout) -> str:
    """The address of this SM's line of a ring (its full mark, its drops)."""
    line, last = _special(g, "%smid"), g.t64()
    _load_constant(g, last, base, devmaps.RING_NCPU)
    g.emit(f"sub.u64 {last}, {last}, 1;")
    g.emit(f"min.u64 {line}, {line}, {last};")  # defensive: the host sizes the lines from %nsmid
    g.emit(f"mad.lo.u64 {line}, {line}, {devmaps.LINE}, {base};")
    g.emit(f"add.u64 {line}, {line}, {lay.lines_off};")
    return line


def _reserve_one(g: FuncGen, base: str, lay: MapLayout, total: str, pos: str, line: str, fail: str,
                 refused: str) -> None:
    """pos = the ring position of this lane's record of ``total`` bytes, or a counted drop and fail:
    credit taken on ``reserved`` and given back when the reader has not made room (the SM's line notes
    the size refused); ``refused``: this SM was refused as much before, so no credit is asked."""
    r, c, e = g.t64(), g.t64(), g.t64()
    g.emit(f"@!{refused} atom.add.u64 {r}, [{base}+8], {total};")
    g.emit(f"@!{refused} ld.volatile.u64 {c}, [{base}+16];")
    g.emit(f"add.u64 {e}, {r}, {total};")
    g.emit(f"sub.u64 {e}, {e}, {c};")
    g.emit(f"@{refused} mov.b64 {e}, {lay.capacity + 1};")
    ok = g.label()
    _branch(g, "le", e, lay.capacity, ok)
    neg = g.t64()
    g.emit(f"neg.s64 {neg}, {total};")
    _refuse(g, base, line, neg, "1", total, "", f"@!{refused} ")
    g.emit(f"bra {fail};")
    g.place(ok)
    g.emit(f"atom.add.u64 {pos}, [{base}], {total};")


def _refuse(g: FuncGen, base: str, line: str, credit: str, count: str, total: str, dropped: str,
            took: str) -> None:
    """Count ``count`` drops on the SM's line (guard ``dropped``); where credit was taken (guard ``took``),
    give back ``credit`` (negative) on the ring's ``reserved`` and mark the line refused for records of
    ``total`` bytes and more."""
    g.emit(f"{took}red.add.u64 [{base}+8], {credit};")
    g.emit(f"{dropped}red.add.u64 [{line}+8], {count};")
    g.emit(f"{took}red.min.u64 [{line}], {total};")


def _reserve_group(g: FuncGen, base: str, lay: MapLayout, total: str, peers: str, group: tuple[str, str, str],
                   pos: str, line: str, fail: str, refused: str) -> None:
    """_reserve_one for the group of lanes in ``peers`` (``group``: group_rank's), each reserving ``total``
    bytes: the lowest lane
    takes credit for all of them, keeps what the reader has made room for (the first k lanes by rank,
    so a group larger than the ring still gets its share), gives back and counts as dropped the rest,
    and takes the positions of the k; branch-free until every lane knows k, so the group stays
    converged for shfl.sync. A lowest lane ``refused`` takes no credit: k = 0."""
    rank, n, lead = group
    span, r, c, room, k, miss, n64 = (g.t64() for _ in range(7))
    asks, open_ = g.pred(), g.pred()
    g.emit(f"not.pred {open_}, {refused};")
    g.emit(f"and.pred {asks}, {lead}, {open_};")   # the lowest lane asks for credit
    g.emit(f"cvt.u64.u32 {n64}, {n};")
    g.emit(f"mul.lo.u64 {span}, {n64}, {total};")
    g.emit(f"mov.b64 {k}, 0;")
    g.emit(f"mov.b64 {miss}, 0;")
    g.emit(f"@{asks} atom.add.u64 {r}, [{base}+8], {span};")
    g.emit(f"@{asks} ld.volatile.u64 {c}, [{base}+16];")
    g.emit(f"@{asks} sub.s64 {room}, {c}, {r};")     # capacity - (credit others hold unread)
    g.emit(f"@{asks} add.s64 {room}, {room}, {lay.capacity};")
    g.emit(f"@{asks} max.s64 {room}, {room}, 0;")
    g.emit(f"@{asks} div.u64 {k}, {room}, {total};")
    g.emit(f"@{asks} min.u64 {k}, {k}, {n64};")
    g.emit(f"@{lead} sub.u64 {miss}, {n64}, {k};")
    some, gives, refund = g.pred(), g.pred(), g.t64()
    g.emit(f"setp.ne.u64 {some}, {miss}, 0;")
    g.emit(f"and.pred {gives}, {some}, {asks};")
    g.emit(f"@{gives} mul.lo.u64 {refund}, {miss}, {total};")
    g.emit(f"@{gives} neg.s64 {refund}, {refund};")
    _refuse(g, base, line, refund, miss, total, f"@{some} ", f"@{gives} ")
    kept, got = g.pred(), g.t64()
    g.emit(f"setp.ne.u64 {kept}, {k}, 0;")
    g.emit(f"mov.b64 {pos}, 0;")
    g.emit(f"@{kept} mul.lo.u64 {got}, {k}, {total};")
    g.emit(f"@{kept} atom.add.u64 {pos}, [{base}], {got};")
    leader, k32 = group_leader(g, peers), g.t32()
    g.emit(f"cvt.u32.u64 {k32}, {k};")
    from_leader(g, k32, 32, leader, peers)
    from_leader(g, pos, 64, leader, peers)
    _branch(g, "ge", rank, k32, fail, "u32")
    mine = g.t64()
    g.emit(f"cvt.u64.u32 {mine}, {rank};")
    g.emit(f"mad.lo.u64 {pos}, {mine}, {total}, {pos};")


STALLED = (1 << 64) - 1   # the position a group's lowest lane hands on when its reader stalled


def _wait_for_room(g: FuncGen, base: str, lay: MapLayout, end: str, stalled: str) -> None:
    """Spin until the credit that ends at ``end`` fits: end - consumed <= capacity. ``consumed`` is
    written by the host (the reader), so the load is ld.acquire.sys: the reader cleared the bytes it
    consumed before moving it, and this producer's record is written after. nanosleep leaves the SM to
    the warps that hold records the reader waits for. A reader that has not moved ``consumed`` for
    devmaps.WAIT_STALL_NS (stuck: the driver holding its copies, a probe waiting for its own unsubmitted
    record) ends the wait at ``stalled``, where the caller gives its credit back and counts its drops:
    the kernel then ends, instead of never."""
    spin, room = g.label(), g.label()
    c, seen, since, left = g.t64(), g.t64(), g.t64(), g.t64()
    moved = g.pred()
    g.emit(f"ld.acquire.sys.u64 {seen}, [{base}+16];")
    g.emit(f"mov.u64 {since}, %globaltimer;")
    g.emit(f"mov.u64 {c}, {seen};")
    g.place(spin)
    g.emit(f"sub.u64 {left}, {end}, {c};")
    _branch(g, "le", left, lay.capacity, room)
    g.emit("nanosleep.u32 256;")
    g.emit(f"ld.acquire.sys.u64 {c}, [{base}+16];")
    g.emit(f"setp.ne.u64 {moved}, {c}, {seen};")
    g.emit(f"mov.u64 {left}, %globaltimer;")
    g.emit(f"@{moved} mov.u64 {since}, {left};")
    g.emit(f"mov.u64 {seen}, {c};")
    g.emit(f"sub.u64 {left}, {left}, {since};")
    _branch(g, "gt", left, devmaps.WAIT_STALL_NS, stalled)
    g.emit(f"bra {spin};")
    g.place(room)


def _reserve_one_wait(g: FuncGen, base: str, lay: MapLayout, total: str, pos: str, line: str,
                      fail: str) -> None:
    """pos = the ring position of this lane's record of ``total`` bytes, waiting for the reader to make
    room; a record larger than the ring is a counted drop (no credit taken) and fail, as is one whose
    reader stalled (its credit given back)."""
    fits, stalled, placed = g.label(), g.label(), g.label()
    _branch(g, "le", total, lay.capacity, fits)
    g.emit(f"red.add.u64 [{line}+8], 1;")
    g.emit(f"bra {fail};")
    g.place(fits)
    end = g.t64()
    g.emit(f"atom.add.u64 {end}, [{base}+8], {total};")
    g.emit(f"add.u64 {end}, {end}, {total};")
    _wait_for_room(g, base, lay, end, stalled)
    g.emit(f"atom.add.u64 {pos}, [{base}], {total};")
    g.emit(f"bra {placed};")
    g.place(stalled)
    neg = g.t64()
    g.emit(f"neg.s64 {neg}, {total};")
    g.emit(f"red.add.u64 [{base}+8], {neg};")
    g.emit(f"red.add.u64 [{line}+8], 1;")
    g.emit(f"bra {fail};")
    g.place(placed)


def _reserve_group_wait(g: FuncGen, base: str, lay: MapLayout, total: str, group: tuple[str, str, str],
                        pos: str, line: str, fail: str, peers: str) -> None:
    """_reserve_one_wait for the group of lanes in ``peers``, each reserving ``total`` bytes: every lane
    computes k = min(n, capacity // total), the records the ring can ever hold at once; the lowest lane
    counts the other n - k as dropped, takes credit for k, waits for room and takes their positions,
    which it hands to the others. Credit is given back only when the reader stalled (_wait_for_room):
    the k are dropped then, and every lane learns it from the position the lowest hands on (all ones)."""
    rank, n, lead = group
    k, n64, span, miss = g.t64(), g.t64(), g.t64(), g.t64()
    g.emit(f"cvt.u64.u32 {n64}, {n};")
    g.emit(f"div.u64 {k}, {lay.capacity}, {total};")
    g.emit(f"min.u64 {k}, {k}, {n64};")
    g.emit(f"mul.lo.u64 {span}, {k}, {total};")
    g.emit(f"sub.u64 {miss}, {n64}, {k};")
    some, asks = g.pred(), g.pred()
    g.emit(f"setp.ne.u64 {some}, {miss}, 0;")
    g.emit(f"and.pred {some}, {some}, {lead};")
    g.emit(f"@{some} red.add.u64 [{line}+8], {miss};")
    g.emit(f"setp.ne.u64 {asks}, {k}, 0;")
    g.emit(f"and.pred {asks}, {asks}, {lead};")
    g.emit(f"mov.b64 {pos}, 0;")
    taken, stalled = g.label(), g.label()
    g.emit(f"@!{asks} bra {taken};")
    end = g.t64()
    g.emit(f"atom.add.u64 {end}, [{base}+8], {span};")
    g.emit(f"add.u64 {end}, {end}, {span};")
    _wait_for_room(g, base, lay, end, stalled)
    g.emit(f"atom.add.u64 {pos}, [{base}], {span};")
    g.emit(f"bra {taken};")
    g.place(stalled)
    refund = g.t64()
    g.emit(f"neg.s64 {refund}, {span};")
    g.emit(f"red.add.u64 [{base}+8], {refund};")
    g.emit(f"red.add.u64 [{line}+8], {k};")
    g.emit(f"mov.b64 {pos}, {lit(STALLED)};")
    g.place(taken)
    leader = group_leader(g, peers)
    from_leader(g, pos, 64, leader, peers)
    _branch(g, "eq", pos, STALLED, fail)
    mine = g.t64()
    g.emit(f"cvt.u64.u32 {mine}, {rank};")
    _branch(g, "ge", mine, k, fail)
    g.emit(f"mad.lo.u64 {pos}, {mine}, {total}, {pos};")


def group_rank(g: FuncGen, peers: str) -> tuple[str, str, str]:
    """(this lane's rank among the lanes of ``peers``, their number, a predicate: this is the lowest)."""
    below, rank, n = g.t32(), g.t32(), g.t32()
    g.emit(f"mov.u32 {below}, %lanemask_lt;")
    g.emit(f"and.b32 {below}, {below}, {peers};")
    g.emit(f"popc.b32 {rank}, {below};")
    g.emit(f"popc.b32 {n}, {peers};")
    lead = g.pred()
    g.emit(f"setp.eq.u32 {lead}, {below}, 0;")
    return rank, n, lead


def group_leader(g: FuncGen, peers: str) -> str:
    """The lane number of the lowest lane in the mask ``peers``."""
    low, leader = g.t32(), g.t32()
    g.emit(f"neg.s32 {low}, {peers};")
    g.emit(f"and.b32 {low}, {low}, {peers};")
    g.emit(f"bfind.u32 {leader}, {low};")
    return leader


def from_leader(g: FuncGen, reg: str, width: int, leader: str, peers: str) -> None:
    """reg (of ``width`` bits) := its value in lane ``leader``, for every lane of ``peers`` (shfl.sync)."""
    if width == 32:
        g.emit(f"shfl.sync.idx.b32 {reg}, {reg}, {leader}, 31, {peers};")
        return
    lo, hi = g.t32(), g.t32()
    g.emit(f"mov.b64 {{{lo}, {hi}}}, {reg};")
    g.emit(f"shfl.sync.idx.b32 {lo}, {lo}, {leader}, 31, {peers};")
    g.emit(f"shfl.sync.idx.b32 {hi}, {hi}, {leader}, 31, {peers};")
    g.emit(f"mov.b64 {reg}, {{{lo}, {hi}}};")


def _publish(g: FuncGen, rec: str, flag: int, tag: str | None = None) -> None:
    """Release the record: its bytes are visible to the host before the flag is (st.release.sys)."""
    if tag is None:
        g.emit(f"st.release.sys.u32 [{rec}+4], {flag};")
        return
    f = g.t32()
    g.emit(f"cvt.u32.u64 {f}, {tag};")
    g.emit(f"shl.b32 {f}, {f}, 8;")
    g.emit(f"or.b32 {f}, {f}, {flag};")
    g.emit(f"st.release.sys.u32 [{rec}+4], {f};")


def _output(g: FuncGen, base: str, lay: MapLayout, data: str, size: str, fail: str,
            tag: str | None = None) -> None:
    r = _reserve(g, base, lay, size, fail)
    dst = g.t64()
    g.emit(f"add.u64 {dst}, {r.rec}, 8;")
    _copy_var(g, dst, data, size)
    _publish(g, r.rec, REC_READY, tag)
    _commit(g, r)


def ringbuf_output(g: FuncGen, insn: Insn) -> None:
    """r0 = 0, -EINVAL for flags (r4) beyond the wakeup ones, or -EAGAIN when the ring is full (the drop
    is counted)."""
    index, m, lay = _map(g, insn)
    done = g.label()
    _branch(g, "gt", g.reg(4), BPF_RB_FLAGS, _ret(g, done, -EINVAL))
    _output(g, g.map_base(index), lay, g.reg(2), g.reg(3), _ret(g, done, -EAGAIN))
    _succeed(g, done)


def ringbuf_reserve(g: FuncGen, insn: Insn) -> None:
    """r0 = a record of r2 bytes, or NULL when the ring is full or flags (r3) are not 0."""
    index, m, lay = _map(g, insn)
    done, null = g.label(), g.label()
    _branch(g, "ne", g.reg(3), 0, null)
    # BUSY, and the ring's index in the map table, which its submit or discard reads back (_reserved_line)
    rec = _reserve(g, g.map_base(index), lay, g.reg(2), null, REC_BUSY | index << 8).rec
    g.emit(f"add.u64 {g.reg(0)}, {rec}, 8;")
    g.emit(f"bra {done};")
    g.place(null)
    _set_r0(g, 0)
    g.place(done)


def _release(flag: int) -> Callable[[FuncGen, Insn], None]:
    def release(g: FuncGen, insn: Insn) -> None:
        rec = g.t64()
        g.emit(f"sub.u64 {rec}, {g.reg(1)}, 8;")
        line, total = _reserved_line(g, insn, rec)
        _publish(g, rec, flag)
        _commit(g, Reserved(rec, line, total))
        _set_r0(g, 0)
    return release


def _reserved_line(g: FuncGen, insn: Insn, rec: str) -> tuple[str, str]:
    """(this SM's line of the ring that the ringbuf_reserve record at ``rec`` is in, the record's bytes with
    header and padding), read back from its header before the flag is written over: the verifier proves the
    record came from a ringbuf_reserve of this program, so from one of its RINGBUF maps; where it has several, the
    one whose index the reserve wrote above BUSY."""
    size, size64 = g.t32(), g.t64()
    g.emit(f"ld.u32 {size}, [{rec}];")
    g.emit(f"cvt.u64.u32 {size64}, {size};")
    total = _record_bytes(g, size64)
    rings = [k for k, m in enumerate(g.target.maps) if m.type == prog.MAP_RINGBUF]
    if not rings:   # only an unverified program gets here
        raise g.fail(insn, "a record to release, but no RINGBUF map it could come from")
    lines = [_ring_line(g, g.map_base(k), devmaps.layout(g.target.maps[k])) for k in rings]
    if len(lines) == 1:
        return lines[0], total
    tag, line, which = g.t32(), g.t64(), g.pred()
    g.emit(f"ld.u32 {tag}, [{rec}+4];")
    g.emit(f"shr.u32 {tag}, {tag}, 8;")
    g.emit(f"mov.b64 {line}, {lines[0]};")   # never a wild address, whatever the tag
    for k, at in zip(rings[1:], lines[1:]):
        g.emit(f"setp.eq.u32 {which}, {tag}, {k};")
        g.emit(f"@{which} mov.b64 {line}, {at};")
    return line, total


def perf_event_output(g: FuncGen, insn: Insn) -> None:
    """(ctx, map, flags, data, size): one ring per map whose records carry the SM id; r0 = 0, -EINVAL
    for flags beyond the CPU index, -ENOSPC when full (counted as a drop)."""
    index, m, lay = _map(g, insn, reg=2)
    if m.type != prog.MAP_PERF_EVENT_ARRAY:
        raise g.fail(insn, f"perf_event_output on map {m.name}, which is not a perf event array")
    done = g.label()
    _branch(g, "gt", g.reg(3), BPF_F_CURRENT_CPU, _ret(g, done, -EINVAL))
    _output(g, g.map_base(index), lay, g.reg(4), g.reg(5), _ret(g, done, -ENOSPC), _special(g, "%smid"))
    _succeed(g, done)


def trace_printk(g: FuncGen, insn: Insn) -> None:
    """(fmt, size, a1, a2, a3) -> a record in the module's trace ring, formatted by the host; r0 = 0."""
    if g.target.table is None:
        raise g.fail(insn, "trace_printk needs the trace ring (not available in execute_on_gpu)")
    lay = devmaps.trace_layout()
    base = g.map_base(len(g.target.maps))
    done = g.label()
    size = g.t64()
    g.emit(f"add.u64 {size}, {g.reg(2)}, 24;")
    r = _reserve(g, base, lay, size, done)
    for k, reg in enumerate((3, 4, 5)):
        g.emit(f"st.u64 [{r.rec}+{8 + 8 * k}], {g.reg(reg)};")
    dst = g.t64()
    g.emit(f"add.u64 {dst}, {r.rec}, 32;")
    _copy_var(g, dst, g.reg(1), g.reg(2))
    _publish(g, r.rec, REC_READY, _special(g, "%smid"))
    _commit(g, r)
    g.place(done)
    _set_r0(g, 0)


# ---- warp memory records ---------------------------------------------------------------------

def egpu_warp_mem_record(g: FuncGen, insn: Insn) -> None:
    """(ring, addr, kernel_id, launch_id, site << 32 | flags << 16 | size): the lanes here with the same
    site, flags and size (match.any.sync) write one struct egpu_warp_mem, reserved, filled and published
    by the lowest of them, each lane writing its own tail entry; r0 = 0 (a ring without room counts a
    drop). The form is output/warp_records.warp_record's: stride from the second-lowest lane (div.s64),
    then vote.all over the group for "my address is base + stride * (lane - leader)" and for "my offset
    from base fits in s32" (PTX ISA: match.sync, vote.sync, shfl.sync; sm_70+)."""
    index, m, lay = _map(g, insn)
    addr, key = g.reg(2), g.reg(5)
    mask, peers = g.t32(), g.t32()
    g.emit(f"activemask.b32 {mask};")
    g.emit(f"match.any.sync.b64 {peers}, {key}, {mask};")
    rank, n, lead = group_rank(g, peers)
    leader = group_leader(g, peers)
    base = g.t64()
    g.emit(f"mov.b64 {base}, {addr};")
    from_leader(g, base, 64, leader, peers)
    rest, lone = g.t32(), g.pred()
    g.emit(f"sub.u32 {rest}, {peers}, 1;")
    g.emit(f"and.b32 {rest}, {rest}, {peers};")              # the group without its leader
    g.emit(f"setp.eq.u32 {lone}, {rest}, 0;")
    g.emit(f"selp.b32 {rest}, {peers}, {rest}, {lone};")     # a lone lane is its own second
    second = group_leader(g, rest)
    d, d2, k, k64, stride = g.t64(), g.t64(), g.t32(), g.t64(), g.t64()
    g.emit(f"sub.s64 {d}, {addr}, {base};")
    g.emit(f"mov.b64 {d2}, {d};")
    from_leader(g, d2, 64, second, peers)
    g.emit(f"sub.u32 {k}, {second}, {leader};")
    g.emit(f"max.u32 {k}, {k}, 1;")
    g.emit(f"cvt.u64.u32 {k64}, {k};")
    g.emit(f"div.s64 {stride}, {d2}, {k64};")
    rel, expect, on_line, affine = g.t64(), g.t64(), g.pred(), g.pred()
    lane = _special(g, "%laneid")
    g.emit(f"cvt.u64.u32 {rel}, {leader};")
    g.emit(f"sub.s64 {rel}, {lane}, {rel};")
    g.emit(f"mad.lo.s64 {expect}, {stride}, {rel}, {base};")
    g.emit(f"setp.eq.u64 {on_line}, {expect}, {addr};")
    g.emit(f"vote.sync.all.pred {affine}, {on_line}, {peers};")
    d32, back, fit, fits = g.t32(), g.t64(), g.pred(), g.pred()
    g.emit(f"cvt.u32.u64 {d32}, {d};")
    g.emit(f"cvt.s64.s32 {back}, {d32};")
    g.emit(f"setp.eq.s64 {fit}, {back}, {d};")
    g.emit(f"vote.sync.all.pred {fits}, {fit}, {peers};")
    n64, tail, t8, size, form = g.t64(), g.t64(), g.t64(), g.t64(), g.t32()
    g.emit(f"cvt.u64.u32 {n64}, {n};")
    g.emit(f"shl.b64 {t8}, {n64}, 3;")                       # ADDRS: 8 bytes a lane
    g.emit(f"shl.b64 {tail}, {n64}, 2;")                     # OFFSETS: 4 bytes a lane, padded to 8
    g.emit(f"add.u64 {tail}, {tail}, 7;")
    g.emit(f"and.b64 {tail}, {tail}, {lit(-8)};")
    g.emit(f"selp.b64 {tail}, {tail}, {t8}, {fits};")
    g.emit(f"selp.b64 {tail}, 0, {tail}, {affine};")
    g.emit(f"add.u64 {size}, {tail}, {wr.HEADER.size};")
    g.emit(f"selp.b32 {form}, {wr.FORM_OFFSETS}, {wr.FORM_ADDRS}, {fits};")
    g.emit(f"selp.b32 {form}, {wr.FORM_AFFINE}, {form}, {affine};")
    g.emit(f"selp.b64 {stride}, {stride}, 0, {affine};")
    rec, reserved = g.t64(), g.label()
    g.emit(f"mov.b64 {rec}, 0;")
    g.emit(f"@!{lead} bra {reserved};")
    got = _reserve(g, g.map_base(index), lay, size, reserved)
    g.emit(f"mov.b64 {rec}, {got.rec};")
    g.place(reserved)
    from_leader(g, rec, 64, leader, peers)                   # every lane of the group waits for it here
    done, none = g.label(), g.pred()
    g.emit(f"setp.eq.u64 {none}, {rec}, 0;")
    g.emit(f"@{none} bra {done};")
    data = g.t64()
    g.emit(f"add.u64 {data}, {rec}, 8;")
    _warp_tail(g, data, rank, d32, addr, affine, fits)
    header = g.label()
    g.emit(f"@!{lead} bra {header};")
    _warp_header(g, data, base, stride, peers, key, form)
    g.place(header)
    # bar.warp.sync orders the lanes' tail stores before the leader's release (PTX ISA: bar.warp.sync
    # "guarantees memory ordering among threads participating in barrier").
    g.emit(f"bar.warp.sync {peers};")
    g.emit(f"@{lead} st.release.sys.u32 [{rec}+4], {REC_READY};")
    _commit(g, got, f"@{lead} ")
    g.place(done)
    _set_r0(g, 0)


def _warp_tail(g: FuncGen, data: str, rank: str, d32: str, addr: str, affine: str, fits: str) -> None:
    """This lane's tail entry, at its rank among the group: its s32 offset (OFFSETS) or address (ADDRS)."""
    narrow, wide, slot, r64 = g.pred(), g.pred(), g.t64(), g.t64()
    g.emit(f"not.pred {wide}, {fits};")
    g.emit(f"and.pred {narrow}, {fits}, !{affine};")
    g.emit(f"and.pred {wide}, {wide}, !{affine};")
    g.emit(f"cvt.u64.u32 {r64}, {rank};")
    g.emit(f"@{narrow} mad.lo.u64 {slot}, {r64}, 4, {data};")
    g.emit(f"@{wide} mad.lo.u64 {slot}, {r64}, 8, {data};")
    g.emit(f"@{narrow} st.u32 [{slot}+{wr.HEADER.size}], {d32};")
    g.emit(f"@{wide} st.u64 [{slot}+{wr.HEADER.size}], {addr};")


def _warp_header(g: FuncGen, data: str, base: str, stride: str, peers: str, key: str, form: str) -> None:
    """The leader's stores of struct egpu_warp_mem's fields (warp_records.OFFSET)."""
    at = wr.OFFSET
    ts, site, warp = g.t64(), g.t64(), g.t64()
    g.emit(f"mov.u64 {ts}, %globaltimer;")
    for name, value in (("ts", ts), ("base", base), ("kernel_id", g.reg(3)), ("launch_id", g.reg(4)),
                        ("stride", stride)):
        g.emit(f"st.u64 [{data}+{at[name]}], {value};")
    g.emit(f"shr.u64 {site}, {key}, 32;")
    g.emit(f"st.u32 [{data}+{at['site']}], {site};")
    g.emit(f"st.u32 [{data}+{at['mask']}], {peers};")
    for k, axis in enumerate("xyz"):
        g.emit(f"st.u32 [{data}+{at['block'] + 4 * k}], {_special(g, f'%ctaid.{axis}')};")
    for k, axis in enumerate("xy"):
        g.emit(f"st.u16 [{data}+{at['block_dim'] + 2 * k}], {_special(g, f'%ntid.{axis}')};")
    x, y, z = (_special(g, f"%tid.{a}") for a in "xyz")
    g.emit(f"mad.lo.u64 {z}, {z}, {_special(g, '%ntid.y')}, {y};")
    g.emit(f"mad.lo.u64 {z}, {z}, {_special(g, '%ntid.x')}, {x};")
    g.emit(f"shr.u64 {warp}, {z}, 5;")
    g.emit(f"st.u16 [{data}+{at['warp']}], {warp};")
    g.emit(f"st.u16 [{data}+{at['sm']}], {_special(g, '%smid')};")
    g.emit(f"st.u16 [{data}+{at['size']}], {key};")
    flags = g.t64()
    g.emit(f"shr.u64 {flags}, {key}, 16;")
    g.emit(f"st.u8 [{data}+{at['flags']}], {flags};")
    g.emit(f"st.u8 [{data}+{at['form']}], {form};")


# ---- GPU and time helpers --------------------------------------------------------------------

def _timer(g: FuncGen, insn: Insn) -> None:
    g.emit(f"mov.u64 {g.reg(0)}, %globaltimer;")


def _reg_helper(sreg: str) -> Callable[[FuncGen, Insn], None]:
    def emit(g: FuncGen, insn: Insn) -> None:
        _set_r0(g, _special(g, sreg))
    return emit


def _dim3(sreg: str) -> Callable[[FuncGen, Insn], None]:
    def emit(g: FuncGen, insn: Insn) -> None:
        for reg, axis in zip((1, 2, 3), "xyz"):
            g.store(_special(g, f"{sreg}.{axis}"), g.arg(insn, reg, 8), 8)
        _set_r0(g, 0)
    return emit


def _warp_id(g: FuncGen, insn: Insn) -> None:
    """The warp's index in its block: the linear thread index / 32 (stable, unlike %warpid)."""
    x, y, z = (_special(g, f"%tid.{a}") for a in "xyz")
    nx, ny = _special(g, "%ntid.x"), _special(g, "%ntid.y")
    g.emit(f"mad.lo.u64 {z}, {z}, {ny}, {y};")
    g.emit(f"mad.lo.u64 {z}, {z}, {nx}, {x};")
    g.emit(f"shr.u64 {g.reg(0)}, {z}, 5;")


def _trace_header(g: FuncGen, insn: Insn, name: str) -> str:
    """The trace ring's global address, whose header holds what the host wrote of its process (devmaps.TGID,
    UID_GID, COMM): read there, not baked in, so the code is the same in every process (egpu-run prebuilds
    it)."""
    if g.target.table is None:
        raise g.fail(insn, f"{name} needs the trace ring (not available in execute_on_gpu)")
    t = g.t64()
    g.emit(f"cvta.to.global.u64 {t}, {g.map_base(len(g.target.maps))};")
    return t


_GOLDEN, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB   # splitmix64's


def _prandom_u32(g: FuncGen, insn: Insn) -> None:
    """A u32 from no state (bpf/helpers.py): splitmix64's finalizer of %clock64 xor the thread's place, SM << 11 |
    warp slot << 5 | lane, times the golden ratio. The place tells apart the threads that read one cycle (the
    slot is a warp's while it runs; clock64 counts apart on each SM); a thread's clock moves on between its
    calls. Its high half is returned, the better mixed."""
    where, z, t = _special(g, "%smid"), g.t64(), g.t64()
    for sreg, shift in (("%warpid", 6), ("%laneid", 5)):
        g.emit(f"shl.b64 {where}, {where}, {shift};")
        g.emit(f"or.b64 {where}, {where}, {_special(g, sreg)};")
    g.emit(f"mov.u64 {z}, %clock64;")
    g.emit(f"mul.lo.u64 {where}, {where}, {lit(_GOLDEN)};")
    g.emit(f"xor.b64 {z}, {z}, {where};")
    for shift, mul in ((30, _MIX1), (27, _MIX2)):
        g.emit(f"shr.u64 {t}, {z}, {shift};")
        g.emit(f"xor.b64 {z}, {z}, {t};")
        g.emit(f"mul.lo.u64 {z}, {z}, {lit(mul)};")
    g.emit(f"shr.u64 {t}, {z}, 31;")
    g.emit(f"xor.b64 {z}, {z}, {t};")
    g.emit(f"shr.u64 {g.reg(0)}, {z}, 32;")


def _pid_tgid(g: FuncGen, insn: Insn) -> None:
    """The application's pid_tgid, tgid << 32 | tgid, from the tgid the header holds once."""
    t, tgid = _trace_header(g, insn, "get_current_pid_tgid"), g.t32()
    g.emit(f"ld.global.nc.u32 {tgid}, [{t}+{devmaps.TGID}];")
    g.emit(f"mov.b64 {g.reg(0)}, {{{tgid}, {tgid}}};")


def _uid_gid(g: FuncGen, insn: Insn) -> None:
    """The application's gid << 32 | uid, as the header holds it."""
    t = _trace_header(g, insn, "get_current_uid_gid")
    g.emit(f"ld.global.nc.u64 {g.reg(0)}, [{t}+{devmaps.UID_GID}];")


def _comm(g: FuncGen, insn: Insn) -> None:
    """(buf, size): the name the host wrote into the trace ring's header (devmaps.COMM) as Linux's
    strscpy_pad copies it: its first size - 1 bytes at most, then zeros to the buffer's end; r0 = 0."""
    src, dst, i, n = _trace_header(g, insn, "get_current_comm"), g.t64(), g.t64(), g.t64()
    g.emit(f"add.u64 {src}, {src}, {devmaps.COMM};")
    g.emit(f"mov.b64 {dst}, {g.reg(1)};")
    g.emit(f"add.u64 {n}, {g.reg(1)}, {g.reg(2)};")
    g.emit(f"sub.u64 {i}, {g.reg(2)}, 1;")   # bytes of the name: size 0 copies none (the loop does not run)
    g.emit(f"min.u64 {i}, {i}, {TASK_COMM_LEN};")
    g.emit(f"add.u64 {i}, {i}, {src};")        # where the name's bytes end
    loop, done = g.label(), g.label()
    p, named, b = g.pred(), g.pred(), g.t32()
    g.place(loop)
    g.emit(f"setp.ge.u64 {p}, {dst}, {n};")
    g.emit(f"@{p} bra {done};")
    g.emit(f"mov.b32 {b}, 0;")
    g.emit(f"setp.lt.u64 {named}, {src}, {i};")
    g.emit(f"@{named} ld.global.nc.u8 {b}, [{src}];")
    g.emit(f"st.u8 [{dst}], {b};")
    g.emit(f"add.u64 {src}, {src}, 1;")
    g.emit(f"add.u64 {dst}, {dst}, 1;")
    g.emit(f"bra {loop};")
    g.place(done)
    _set_r0(g, 0)


def _membar(g: FuncGen, insn: Insn) -> None:
    g.emit("membar.gl;")
    _set_r0(g, 0)


def count_loop_cut(g: FuncGen) -> None:
    """A run whose budgeted loops took LOOP_BUDGET rounds, counted on this SM's line of the trace ring, as its
    drops are (devmaps.LOOPS_CUT). Only probe modules have budgeted loops, and a trace ring: execute_on_gpu's
    programs are verified without a section, so none of theirs is budgeted."""
    line = _ring_line(g, g.map_base(len(g.target.maps)), devmaps.trace_layout())
    g.emit(f"red.add.u64 [{line}+{devmaps.LOOPS_CUT}], 1;")


def _exit(g: FuncGen, insn: Insn) -> None:
    """bpftime's exit: the probe returns 0; the kernel's thread goes on (helpers.py)."""
    _set_r0(g, 0)
    g.emit("bra $Lexit;")


_EMIT: dict[str, Callable[[FuncGen, Insn], None]] = {
    "map_lookup_elem": map_lookup_elem, "map_update_elem": map_update_elem, "map_delete_elem": map_delete_elem,
    "ktime_get_ns": _timer, "trace_printk": trace_printk, "get_prandom_u32": _prandom_u32,
    "ktime_get_boot_ns": _timer, "ktime_get_coarse_ns": _timer,
    "get_numa_node_id": lambda g, insn: _set_r0(g, 0),   # bpf/helpers.py: no SM is on a host node
    "get_smp_processor_id": _reg_helper("%smid"),
    "perf_event_output": perf_event_output, "ringbuf_output": ringbuf_output,
    "ringbuf_reserve": ringbuf_reserve, "ringbuf_submit": _release(REC_READY),
    "ringbuf_discard": _release(REC_DISCARD), "get_globaltimer": _timer, "get_block_idx": _dim3("%ctaid"),
    "get_block_dim": _dim3("%ntid"), "get_thread_idx": _dim3("%tid"), "membar": _membar, "exit": _exit,
    "get_grid_dim": _dim3("%nctaid"), "get_sm_id": _reg_helper("%smid"), "get_warp_id": _warp_id,
    "get_lane_id": _reg_helper("%laneid"), "get_current_pid_tgid": _pid_tgid,
    "get_current_uid_gid": _uid_gid, "get_current_comm": _comm,
    "egpu_warp_mem_record": egpu_warp_mem_record,
}
