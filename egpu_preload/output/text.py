"""bpftrace's text output for a Snapshot (bpftrace src/output/text.cpp):

    @counts: 42
    @per_kernel[vecAdd]: 7
    @launches[scale]: { launches: 2, threads: 512, last_stream: 0, last_grid: [2, 1, 1], ... }
    @hist:
    [4, 8)                12 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|

Maps are separated by blank lines; maps with nothing in them print nothing, as in bpftrace.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..translate.demangle import base_name
from .values import Address, Data, Histogram, KernelId, KeyedScalars, MapValue, Records, Scalar, Snapshot, Symbol

BAR_WIDTH = 52      # text.cpp: max_width
LABEL_WIDTH = 16    # std::setw(16) << std::left << header
COUNT_WIDTH = 8     # std::setw(8) << std::right << count
_SUFFIXES = "KMGTPE"
# A string's control characters (C0, DEL, C1) escaped: an entry (a trace record's line too) stays one line
# and sends no terminal escape sequence. Bytes that are not UTF-8 arrive already spelled \xNN (values.py).
CONTROL_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))} | {
    ord("\n"): "\\n", ord("\t"): "\\t", ord("\r"): "\\r"}
_ESCAPES = CONTROL_ESCAPES | {ord('"'): '\\"'}   # a quoted string's quotes too


def render(snap: Snapshot) -> str:
    """The whole snapshot as text, ending in a newline ("" when nothing is to be shown)."""
    blocks = [b for b in (_map(v, snap.kernel_names) for v in snap.maps) if b]
    lines = [line if line.endswith("\n") else line + "\n" for line in snap.trace.lines]
    if snap.trace.dropped:   # as a ring's drops are shown: a trace with holes says so
        lines.append(f"bpf_printk: dropped: {snap.trace.dropped} (the trace_printk ring was full)\n")
    if lines:
        blocks.append("".join(lines))
    return "\n".join(blocks)


def kernel_name(kernel_id: int, names: Mapping[int, str]) -> str:
    """A kernel id as its demangled name (its mangled name beyond the demangler, the number when unknown)."""
    mangled = names.get(kernel_id)
    if mangled is None:
        return str(int(kernel_id))
    return base_name(mangled) or mangled


def value(v: Data, names: Mapping[int, str]) -> str:
    """One decoded value: ints decimal, char arrays quoted, structs ``{ a: 1, b: 2 }``, arrays ``[1, 2]``."""
    if isinstance(v, KernelId):
        return kernel_name(v, names)
    if isinstance(v, Address):
        return hex(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, Symbol):
        return str(v)
    if isinstance(v, str):
        return '"' + v.translate(_ESCAPES) + '"'
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k}: {value(x, names)}" for k, x in v.items()) + " }" if v else "{}"
    if isinstance(v, list):
        return "[" + ", ".join(value(x, names) for x in v) + "]"
    return repr(v) if isinstance(v, float) else str(v)


def _map(v: MapValue, names: Mapping[int, str]) -> str:
    if isinstance(v, Scalar):
        return f"@{v.name}: {value(v.value, names)}\n"
    if isinstance(v, KeyedScalars):
        return "".join(f"@{v.name}[{value(e.key, names)}]: {value(e.value, names)}\n" for e in v.entries)
    if isinstance(v, Histogram):
        return f"@{v.name}:\n" + histogram(v) if v.counts else ""
    if isinstance(v, Records):
        lines = [f"@{v.name}{'' if r.cpu is None else f'[sm {r.cpu}]'}: {value(r.value, names)}\n"
                 for r in v.records]
        if v.dropped:
            lines.append(f"@{v.name}: dropped: {v.dropped}\n")
        return "".join(lines)
    raise TypeError(f"not a map value: {v!r}")


def histogram(h: Histogram) -> str:
    """Bucket rows, bars scaled to the largest bucket: ``[4, 8)   12 |@@@@   |``."""
    top = max(h.counts, default=0) or 1
    suffixed = h.scale == "log2" or h.step % 1024 == 0  # bpftrace: K/M/... on linear bounds only then
    rows = []
    for lo, hi, count in h.buckets():
        if hi == lo + 1:
            header = f"[{_label(lo, suffixed)}]"
        else:
            header = f"[{_label(lo, suffixed)}, {_label(hi, suffixed)})"
        bar = "@" * int(count / top * BAR_WIDTH)
        rows.append(f"{header:<{LABEL_WIDTH}}{count:>{COUNT_WIDTH}} |{bar:<{BAR_WIDTH}}|\n")
    return "".join(rows)


def _label(n: int, suffixed: bool) -> str:
    """``1024`` -> ``1K``, ``3145728`` -> ``3M``: the largest power of 1024 that divides n."""
    if not suffixed or n == 0:
        return str(n)
    power = 0
    while power < len(_SUFFIXES) and n % 1024 == 0:
        n //= 1024
        power += 1
    return f"{n}{_SUFFIXES[power - 1]}" if power else str(n)
