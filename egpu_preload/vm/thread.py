"""The GPU thread a probe runs in, as the VM simulates it for the GPU-only helpers (502-511); the threads of a
whole launch (grid_threads) and CUDA's limits on one."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

Dim3 = tuple[int, int, int]


@dataclass
class ThreadSim:
    """threadIdx/blockIdx/blockDim/gridDim, the SM (also the "cpu" of per-cpu maps), %warpid, %laneid.

    ``globaltimer`` is what ktime_get_ns and get_globaltimer return; each read then advances it by
    ``tick`` ns, so probes that time things see deterministic durations.
    """

    thread_idx: Dim3 = (0, 0, 0)
    block_idx: Dim3 = (0, 0, 0)
    block_dim: Dim3 = (1, 1, 1)
    grid_dim: Dim3 = (1, 1, 1)
    smid: int = 0
    warp: int = 0
    lane: int = 0
    globaltimer: int = 0
    tick: int = 0

    @property
    def global_index(self) -> int:
        """The thread's index in the grid, x fastest (bpftime's getGlobalThreadId)."""
        x, y, z = (b * d + t for b, d, t in zip(self.block_idx, self.block_dim, self.thread_idx))
        width, height = self.grid_dim[0] * self.block_dim[0], self.grid_dim[1] * self.block_dim[1]
        return (z * height + y) * width + x

    def read_timer(self) -> int:
        now = self.globaltimer
        self.globaltimer += self.tick
        return now


# CUDA's launch limits (CUDA C++ Programming Guide, "Compute Capabilities", table 21 for 7.0 and later):
# gridDim.x < 2^31, gridDim.y and z <= 65535; blockDim.x and y <= 1024, z <= 64, x*y*z <= 1024.
GRID_MAX = (2**31 - 1, 65535, 65535)
BLOCK_MAX = (1024, 1024, 64)
BLOCK_THREADS_MAX = 1024
# egpu's probe runner (translate/module.py) numbers the grid's threads in 32 bits.
GRID_THREADS_MAX = 2**32 - 1


def launch_refusal(grid: Dim3, block: Dim3) -> str | None:
    """Why the GPU would refuse a launch of ``grid`` blocks of ``block`` threads (or egpu's runner cannot
    number its threads), else None; the VM refuses it for the same reason."""
    for what, dims, top in (("grid", grid, GRID_MAX), ("block", block, BLOCK_MAX)):
        for axis, n, most in zip("xyz", dims, top):
            if not 1 <= n <= most:
                return f"{what} {axis} is {n}: CUDA takes 1 to {most}"
    if block[0] * block[1] * block[2] > BLOCK_THREADS_MAX:
        return f"a block of {block[0]}x{block[1]}x{block[2]} threads: CUDA takes at most {BLOCK_THREADS_MAX}"
    total = grid[0] * grid[1] * grid[2] * block[0] * block[1] * block[2]
    if total > GRID_THREADS_MAX:
        return f"{total} threads: egpu's runner numbers at most {GRID_THREADS_MAX}"
    return None


def grid_threads(grid: Dim3, block: Dim3, globaltimer: int = 0) -> Iterator[ThreadSim]:
    """Every thread of a launch of ``grid`` blocks of ``block`` threads, block by block, x fastest in
    each; warp and lane by the thread's linear index in its block, as the GPU forms warps. Every block on
    SM 0: the VM runs one thread at a time."""
    for bz, by, bx in itertools.product(*(range(n) for n in reversed(grid))):
        for tz, ty, tx in itertools.product(*(range(n) for n in reversed(block))):
            linear = (tz * block[1] + ty) * block[0] + tx
            yield ThreadSim(thread_idx=(tx, ty, tz), block_idx=(bx, by, bz), block_dim=block, grid_dim=grid,
                            warp=linear // 32, lane=linear % 32, globaltimer=globaltimer)
