"""Running translated programs on the GPU: execute_on_gpu (vm.execute's contract), its batch form, and
the probe runner of the GPU tests and benchmarks (N threads calling a probe, maps read back)."""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

from ..bpf.ctx import SIZE as CTX_SIZE
from ..bpf.program import BpfObject, Program
from ..errors import EgpuError
from ..maps import MapsState
from .devmaps import DeviceMaps
from .gpu import gpu
from .module import DESC_SIZE, EXEC_KERNEL, RUN_KERNEL, batch_ptx, probe_function, probe_runner_ptx
from .striping import stripe_counters

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


class ProbeLaunch:
    """A probe loaded for repeated launches (the GPU tests and benchmarks, egpu run-on-gpu): its runner
    module, its maps in device memory (striped as the runtime stripes them) and one context; ``close``
    frees everything. ``state``: the maps' contents at load, a MapsState of ``obj.maps`` as
    stripe_counters(obj) leaves them (empty maps by default)."""

    def __init__(self, obj: BpfObject, program: Program, ctx: bytes | None = None, *, calls: int = 1,
                 state: MapsState | None = None) -> None:
        if ctx is not None and len(ctx) != CTX_SIZE:
            raise EgpuError(f"context is {len(ctx)} bytes, struct egpu_ctx is {CTX_SIZE}")
        self.gpu = g = gpu()
        stripe_counters(obj)
        self.state = state if state is not None else MapsState(obj.maps)
        probe = probe_function(program, obj, ctx_params=True)   # as the rewriter calls it
        self.module = g.load(probe_runner_ptx(probe, calls))
        self.maps: DeviceMaps | None = None
        self.ctx = self.r0s = 0
        try:
            self.maps = DeviceMaps(g, self.state, g.nsmid())
            table, size = g.global_address(self.module, probe.table)
            g.htod(table, self.maps.table()[:size])
            self.ctx = g.alloc(CTX_SIZE)
            g.htod(self.ctx, ctx or bytes(CTX_SIZE))
            self.func = g.function(self.module, RUN_KERNEL)
        except Exception:
            self.close()
            raise

    def launch(self, threads: int, *, block: int = 256, keep_r0: bool = False) -> list[int]:
        """Run ``threads`` threads to completion; their r0 values when keep_r0."""
        g = self.gpu
        r0s = g.alloc(8 * threads) if keep_r0 else 0
        try:
            g.launch(self.func, threads, [("u64", self.ctx), ("u64", r0s), ("u32", threads)], block=block)
            return list(struct.unpack(f"<{threads}Q", g.dtoh(r0s, 8 * threads))) if keep_r0 else []
        finally:
            if r0s:
                g.free(r0s)

    def launch_grid(self, grid: tuple[int, int, int], block: tuple[int, int, int]) -> None:
        """Run one launch of ``grid`` blocks of ``block`` threads (x, y, z) to completion, every thread
        calling the probe; what the probe reads of its thread (helpers 503-505, 508) is this launch's."""
        threads = math.prod(grid) * math.prod(block)
        self.gpu.launch_grid(self.func, grid, block, [("u64", self.ctx), ("u64", 0), ("u32", threads)])

    def reset_maps(self) -> None:
        """Maps back to their contents at load time."""
        if self.maps is None:
            raise EgpuError("the probe launch is closed")
        self.maps.reset()

    def read_back(self) -> MapsState:
        """Copy the maps out of the device into the state."""
        if self.maps is None:
            raise EgpuError("the probe launch is closed")
        return self.maps.read_back()

    def close(self) -> None:
        if self.maps is not None:
            self.maps.free()
            self.maps = None
        if self.ctx:
            self.gpu.free(self.ctx)
            self.ctx = 0
        if self.module is not None:
            self.gpu.unload(self.module)
            self.module = None


def run_probe_on_gpu(obj: BpfObject, program: Program, threads: int, ctx: bytes | None = None, *,
                     calls: int = 1, block: int = 256) -> tuple[list[int], MapsState]:
    """Launch ``threads`` threads that each call the probe ``calls`` times with a local copy of ``ctx``
    (struct egpu_ctx bytes, zeros by default); maps start empty and are read back. Returns (each
    thread's last r0, the maps)."""
    run = ProbeLaunch(obj, program, ctx, calls=calls)
    try:
        r0s = run.launch(threads, block=block, keep_r0=True)
        return r0s, run.read_back()
    finally:
        run.close()


def run_grid_on_gpu(obj: BpfObject, program: Program, grid: tuple[int, int, int], block: tuple[int, int, int], *,
                    launches: int = 1, state: MapsState | None = None) -> MapsState:
    """Run the probe as a kernel of its own (egpu run-on-gpu): ``launches`` launches of ``grid`` blocks of
    ``block`` threads, each thread calling it once with a zeroed context, the maps starting as ``state``
    (ProbeLaunch's); returns the maps and trace lines read back after the last launch."""
    run = ProbeLaunch(obj, program, state=state)
    try:
        for _ in range(launches):
            run.launch_grid(grid, block)
        return run.read_back()
    finally:
        run.close()
