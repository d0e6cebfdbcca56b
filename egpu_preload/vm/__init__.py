"""The reference eBPF VM: ``execute(code, mem)`` for ISA tests, ``Vm(code, maps, state).run(ctx, thread)``
for probes. Modules: machine (the interpreter), memory (the address space), calls (helpers), thread
(the simulated GPU thread), warps (lanes that run one warp instruction together)."""

from .machine import DEFAULT_BUDGET, Vm, execute, run_with_mem
from .thread import ThreadSim

__all__ = ["DEFAULT_BUDGET", "ThreadSim", "Vm", "execute", "run_with_mem"]
