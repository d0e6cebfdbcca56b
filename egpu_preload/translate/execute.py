"""Running translated programs on the GPU: execute_on_gpu (vm.execute's contract), its batch form, and
the probe runner of the GPU tests and benchmarks (N threads calling a probe, maps read back)."""

from __future__ import annotations

import struct
from collections.abc import Sequence

from ..bpf.ctx import SIZE as CTX_SIZE
from ..bpf.program import BpfObject, Program
from ..errors import EgpuError
from ..maps import MapsState
from .devmaps import DeviceMaps
from .gpu import gpu
from .module import DESC_SIZE, EXEC_KERNEL, RUN_KERNEL, batch_ptx, probe_function, probe_runner_ptx

BATCH = 1024   # programs per module: bounds one JIT compilation
MEM_ALIGN = 256


def layout_memories(mems: Sequence[bytes | None]) -> tuple[list[int], int]:
    """Offsets of each memory in one buffer (MEM_ALIGN-aligned, at least 8 bytes each; None gets none)
    and the buffer's size."""
    offsets, size = [], 0
    for m in mems:
        offsets.append(size)
        if m is not None:
            size += (max(len(m), 8) + MEM_ALIGN - 1) // MEM_ALIGN * MEM_ALIGN
    return offsets, size


def execute_batch_on_gpu(cases: Sequence[tuple[bytes, bytes | None]]) -> list[tuple[int, bytes]]:
    """Run each (code, mem) as execute_on_gpu would, many programs per module and launch (thread k runs
    program k). Returns (r0, memory after the run; b"" when mem was None) per case."""
    out: list[tuple[int, bytes]] = []
    for start in range(0, len(cases), BATCH):
        out += _run_batch(cases[start:start + BATCH])
    return out


def _run_batch(cases: Sequence[tuple[bytes, bytes | None]]) -> list[tuple[int, bytes]]:
    g = gpu()
    module = g.load(batch_ptx([code for code, _ in cases]))
    mems = [mem for _, mem in cases]
    offsets, size = layout_memories(mems)
    buf = g.alloc(size) if size else 0
    descs = g.alloc(DESC_SIZE * len(cases))
    try:
        image = bytearray(size)
        table = bytearray()
        for m, off in zip(mems, offsets):
            if m is not None:
                image[off:off + len(m)] = m
            table += struct.pack("<QQQ", buf + off if m is not None else 0, len(m) if m is not None else 0, 0)
        if size:
            g.htod(buf, bytes(image))
        g.htod(descs, bytes(table))
        g.launch(g.function(module, EXEC_KERNEL), len(cases), [("u64", descs), ("u32", len(cases))], block=128)
        after = g.dtoh(buf, size) if size else b""
        results = g.dtoh(descs, DESC_SIZE * len(cases))
    finally:
        if buf:
            g.free(buf)
        g.free(descs)
        g.unload(module)
    return [(struct.unpack_from("<Q", results, DESC_SIZE * k + 16)[0],
             after[off:off + len(m)] if m is not None else b"") for k, (m, off) in enumerate(zip(mems, offsets))]


def execute_on_gpu(code: bytes, mem: bytes | None = None) -> int:
    """vm.execute's contract on the GPU: r1 = a copy of mem (0 when None), r2 = len(mem), r10 = a zeroed
    512-byte stack; returns r0 as unsigned 64-bit. Raises DecodeError/TranslateError before the GPU."""
    return execute_batch_on_gpu([(code, mem)])[0][0]


def run_probe_on_gpu(obj: BpfObject, program: Program, threads: int, ctx: bytes | None = None,
                     state: MapsState | None = None, *, calls: int = 1,
                     block: int = 256) -> tuple[list[int], MapsState]:
    """Launch ``threads`` threads that each call the probe ``calls`` times with a local copy of ``ctx``
    (struct egpu_ctx bytes, zeros by default); maps start from ``state`` (empty by default) and are read
    back into it. Returns (each thread's last r0, the state)."""
    if ctx is not None and len(ctx) != CTX_SIZE:
        raise EgpuError(f"context is {len(ctx)} bytes, struct egpu_ctx is {CTX_SIZE}")
    g = gpu()
    state = state if state is not None else MapsState(obj.maps)
    probe = probe_function(program, obj)
    module = g.load(probe_runner_ptx(probe, calls))
    maps = DeviceMaps(g, state, g.nsmid())
    ctx_dev = g.alloc(CTX_SIZE)
    r0s = g.alloc(8 * threads)
    try:
        table, size = g.global_address(module, probe.table)
        g.htod(table, maps.table()[:size])
        g.htod(ctx_dev, ctx or bytes(CTX_SIZE))
        g.launch(g.function(module, RUN_KERNEL), threads, [("u64", ctx_dev), ("u64", r0s), ("u32", threads)],
                 block=block)
        raw = g.dtoh(r0s, 8 * threads)
        maps.read_back()
    finally:
        g.free(ctx_dev)
        g.free(r0s)
        maps.free()
        g.unload(module)
    return list(struct.unpack(f"<{threads}Q", raw)), state
