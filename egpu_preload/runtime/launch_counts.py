"""The host's share of the maps that programs evaluated at the launch add to (translate/launch_eval.py).

While launches count (the SASS back end's start-up generation, sass.SassBackend.counting, or the PTX back end's
modules instrumented without those programs: instrumenter.Runtime._ptx_counts), the kernels whose programs a
launch can evaluate do not run them: the shim adds each program's amounts, times the threads, warps or blocks
launched, to lanes in host memory held here (shim/interpose.c, eval_count), one block per evaluated map laid out
as the ARRAY's values, each value padded to 8 bytes. Whoever reads the maps (the exit dump and every live view:
launches.dump_states) adds these lanes to what the device holds, lane by lane modulo 2^(8 x width), as a striped
counter's rows are summed: the device's part is what the kernels that ran the programs added (modules loaded
with them in the kernel: cuLink inputs, egpu-ptxas's cubins, --in-kernel; and every kernel once a flip ended the
counting).
"""

from __future__ import annotations

from typing import Any

from egpu_preload.maps import MapsState
from egpu_preload.runtime.probes import Probe
from egpu_preload.translate.launch_eval import SCOPES


class LaunchCounts:
    """One probe object's lanes."""

    def __init__(self, ffi: Any, probe: Probe) -> None:
        self.ffi, self.probe = ffi, probe
        maps = probe.obj.maps
        self.widths = {a.map: a.width for e in probe.evaluated.values() for a in e.adds}
        self.strides = {i: -(-maps[i].value_size // 8) * 8 for i in self.widths}
        self.lanes = {i: ffi.new("unsigned long long[]", max(1, maps[i].max_entries * self.strides[i] // 8))
                      for i in self.widths}

    def adds(self, program: int) -> list[tuple[Any, int, int, int]]:
        """egpu_eval_add's fields (lane, delta, width, scope) for each lane ``program`` adds to."""
        e = self.probe.evaluated[program]
        base = {i: self.ffi.cast("char *", lanes) for i, lanes in self.lanes.items()}
        return [(base[a.map] + a.entry * self.strides[a.map] + a.offset, a.delta, a.width, SCOPES.index(e.scope))
                for a in e.adds]

    def add_into(self, state: MapsState) -> None:
        """Add the lanes to ``state``'s values (the device's, read back, or the maps as they began)."""
        for i, lanes in self.lanes.items():
            raw = bytes(self.ffi.buffer(lanes))
            if not any(raw):
                continue
            width, stride, mask = self.widths[i], self.strides[i], (1 << 8 * self.widths[i]) - 1
            for entry, value in enumerate(state[i].values):   # type: ignore[attr-defined]
                at = entry * stride
                for off in range(0, len(value) - width + 1, width):
                    host = int.from_bytes(raw[at + off:at + off + width], "little")
                    if host:
                        device = int.from_bytes(value[off:off + width], "little")
                        value[off:off + width] = ((device + host) & mask).to_bytes(width, "little")
