"""eBPF -> PTX: verified programs become PTX functions that instrumented kernels call (probe_function),
and self-contained modules that run programs on the GPU exactly as the reference VM does
(program_to_ptx, execute_on_gpu, execute_batch_on_gpu, run_probe_on_gpu).

Modules: emitter (a function under construction), codegen
(one handler per instruction kind), helpers_ptx (helpers inlined), devmaps (maps in device memory),
module (whole PTX texts), gpu (driver calls), execute (running on the GPU).
"""

from .execute import execute_batch_on_gpu, execute_on_gpu, run_probe_on_gpu
from .module import ProbePtx, probe_function, probe_object_ptx, program_to_ptx

__all__ = ["ProbePtx", "execute_batch_on_gpu", "execute_on_gpu", "probe_function", "probe_object_ptx",
           "program_to_ptx", "run_probe_on_gpu"]
