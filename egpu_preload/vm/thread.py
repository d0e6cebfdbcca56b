"""The GPU thread a probe runs in, as the VM simulates it for the GPU-only helpers (502-511)."""

from __future__ import annotations

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
