"""Helper functions a probe may call: ids, names and argument/return types, one table for all consumers.

Standard ids follow linux/bpf.h; 502-511 follow bpftime's GPU attach so its probes run unchanged; egpu's
own helpers start at 1000.
Argument types (read by the verifier; the VM and translator dispatch on ``name``):

- ``map``        a map reference (lddw of a map)
- ``key``        readable memory of the map's key_size (stack or map value)
- ``value``      readable memory of the map's value_size (bytes never written pass, as in a ``record``, but
  in a bloom filter's, which is hashed as a key is)
- ``value_out``  writable memory of the map's value_size, which the helper fills in
- ``mem``        readable memory whose size is the next argument (``size``, a bounded scalar)
- ``mem_out``    writable memory whose size is the next argument, which the helper fills in (Linux's
  ARG_PTR_TO_UNINIT_MEM: it need not be initialized before)
- ``record``     readable memory whose size is the next argument, copied out as it is: bytes never written
  (a record struct's padding) pass, as Linux's privileged programs (allow_uninit_stack) pass them; they mean
  nothing to the record's fields, where in a key or a value they would change what the map holds
- ``size``       the size of the preceding ``mem``, ``mem_out`` or ``record``
- ``const_size`` a scalar known at verification time (ringbuf_reserve)
- ``u64_out``    writable 8 bytes (stack or map value) the helper fills in
- ``ctx``        the probe's context pointer (r1 on entry) or NULL
- ``ringbuf_mem`` a record returned by ringbuf_reserve, which this call releases
- ``anything``   any scalar
- ``func``       a static function's address (lddw of a function, Linux's PTR_TO_FUNC): a callback
- ``callback_ctx`` what the callback gets in r2: a pointer to the stack or a map value, or a scalar (NULL)

Return types: ``int``, ``void``, ``map_value_or_null``, ``ringbuf_mem_or_null``, ``size_or_errno`` (at most
the ``size`` argument, or -errno: a string read's bytes, its NUL included; Linux's do_refine_retval_range).
Nothing here may wait on the host (DESIGN.md 2).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Helper:
    id: int
    name: str
    args: tuple[str, ...]
    ret: str
    gpu_only: bool = False  # meaningful only inside a kernel; the VM simulates a thread
    in_process: bool = False  # reads the application's memory: only programs run in its threads, in C, may call it


HELPERS: dict[int, Helper] = {h.id: h for h in (
    Helper(1, "map_lookup_elem", ("map", "key"), "map_value_or_null"),
    Helper(2, "map_update_elem", ("map", "key", "value", "anything"), "int"),
    Helper(3, "map_delete_elem", ("map", "key"), "int"),
    # QUEUE, STACK and BLOOM_FILTER maps (host programs only), as kernel/bpf/queue_stack_maps.c and
    # bloom_filter.c: push (flags BPF_EXIST: a full queue or stack drops its oldest element; a bloom filter
    # takes BPF_ANY only) adds a value; pop takes the next (queue: oldest, stack: newest), peek copies it, both
    # -ENOENT with zeros when empty; peek on a bloom filter is 0 when the value may be there, -ENOENT if not.
    Helper(87, "map_push_elem", ("map", "value", "anything"), "int"),
    Helper(88, "map_pop_elem", ("map", "value_out"), "int"),
    Helper(89, "map_peek_elem", ("map", "value_out"), "int"),
    Helper(5, "ktime_get_ns", (), "int"),
    # Linux's other clocks. On the GPU and the VM, the one ktime_get_ns reads there (%globaltimer); on the host
    # (shim/launchvm.c) CLOCK_BOOTTIME and CLOCK_MONOTONIC_COARSE, moved by what moves ktime_get_ns's
    # CLOCK_MONOTONIC onto the launch probes' clock, so that boot ns >= ktime ns and coarse ns is within a
    # tick of it, as in Linux. A launch record's run, whose ktime is the record's time: that time, plus
    # BOOTTIME - MONOTONIC at the call for boot ns. bpf_jiffies64 is left out: a process cannot read jiffies,
    # nor the kernel's HZ that would make them from a clock.
    Helper(125, "ktime_get_boot_ns", (), "int"),
    Helper(160, "ktime_get_coarse_ns", (), "int"),
    # The NUMA node of the CPU that runs the program: on the host getcpu(2)'s (shim/launchvm.c); 0 on the GPU
    # and the VM, as a machine of one node gives (an SM is no CPU of any host node).
    Helper(42, "get_numa_node_id", (), "int"),
    Helper(6, "trace_printk", ("mem", "size", "anything", "anything", "anything"), "int"),
    # A pseudo-random u32 for sampling (`if (bpf_get_prandom_u32() % 100) return 0;`), never for secrets, as
    # Linux's. Each thread draws from its own generator, so none waits on another: in C splitmix64 on a state of
    # the calling thread (shim/launchvm.c), on the VM Python's random; on the GPU, which keeps no state between
    # calls, splitmix64's finalizer of %clock64 mixed with where the thread runs (SM, warp slot, lane: unique
    # among the threads running at one cycle; translate/helpers_ptx.py).
    Helper(7, "get_prandom_u32", (), "int"),
    Helper(8, "get_smp_processor_id", (), "int"),
    # The application's process: tgid << 32 | its main thread's id (= tgid). On the GPU no host thread
    # runs the probe, so every caller sees that value (the GPU reads it where devmaps.PID_TGID says). A host
    # uprobe or host-API probe runs in the thread that called: tgid << 32 | that thread's id, as in Linux
    # (shim/launchvm.c).
    Helper(14, "get_current_pid_tgid", (), "int"),
    # gid << 32 | uid, the real ids (Linux's current_uid_gid) of the thread that called a host uprobe or
    # host-API probe (shim/launchvm.c); elsewhere, the GPU included, of the process, the GPU's as they were
    # when its maps were laid out (devmaps.UID_GID).
    Helper(15, "get_current_uid_gid", (), "int"),
    # (buf, size): a thread's name (comm), NUL-terminated, truncated to size, the rest zeroed; 0. As for
    # pid_tgid, a host uprobe or host-API probe, in the thread that called, gets that thread's name (read
    # at its first run there: a name it takes later is not seen); launch probes (run later, on the
    # runtime's thread), the VM and the GPU get the main thread's, the GPU's read when its maps were laid
    # out (devmaps.COMM).
    Helper(16, "get_current_comm", ("mem_out", "size"), "int"),
    # (dst, size, src): the application's memory at src, read in the thread that called a uprobe or host-API
    # program (shim/launchvm.c); an address it has not mapped gives -EFAULT and a zeroed dst, as in Linux. The
    # _str forms copy up to a NUL or size - 1 bytes, then a NUL, and return the length with it. bpf_probe_read
    # and its _str form read a user address as x86's do (the process has no kernel memory to read).
    Helper(4, "probe_read", ("mem_out", "size", "anything"), "int", in_process=True),
    Helper(45, "probe_read_str", ("mem_out", "size", "anything"), "size_or_errno", in_process=True),
    Helper(112, "probe_read_user", ("mem_out", "size", "anything"), "int", in_process=True),
    Helper(114, "probe_read_user_str", ("mem_out", "size", "anything"), "size_or_errno", in_process=True),
    Helper(25, "perf_event_output", ("ctx", "map", "anything", "record", "size"), "int"),
    # bpf_loop(nr_loops, callback, callback_ctx, flags), Linux's (kernel/bpf/bpf_iter.c): callback(index,
    # callback_ctx) for index 0, 1, ... below nr_loops (its low 32 bits, at most MAX_LOOPS, else -E2BIG and no
    # call; flags other than 0: -EINVAL) until it returns 1; r0 = the calls made. The verifier checks the
    # callback once per path as a function of its own (r1 the index, r2 the ctx) that returns 0 or 1.
    Helper(181, "loop", ("anything", "func", "callback_ctx", "anything"), "int"),
    Helper(130, "ringbuf_output", ("map", "record", "size", "anything"), "int"),
    Helper(131, "ringbuf_reserve", ("map", "const_size", "anything"), "ringbuf_mem_or_null"),
    Helper(132, "ringbuf_submit", ("ringbuf_mem", "anything"), "void"),
    Helper(133, "ringbuf_discard", ("ringbuf_mem", "anything"), "void"),
    Helper(502, "get_globaltimer", (), "int", gpu_only=True),
    Helper(503, "get_block_idx", ("u64_out", "u64_out", "u64_out"), "int", gpu_only=True),
    Helper(504, "get_block_dim", ("u64_out", "u64_out", "u64_out"), "int", gpu_only=True),
    Helper(505, "get_thread_idx", ("u64_out", "u64_out", "u64_out"), "int", gpu_only=True),
    Helper(506, "membar", (), "int", gpu_only=True),
    # bpftime's "exit": here it ends the probe (returns 0 to the kernel), never the kernel's thread,
    # because killing a thread would change what the user's kernel computes.
    Helper(507, "exit", (), "void", gpu_only=True),
    Helper(508, "get_grid_dim", ("u64_out", "u64_out", "u64_out"), "int", gpu_only=True),
    Helper(509, "get_sm_id", (), "int", gpu_only=True),
    Helper(510, "get_warp_id", (), "int", gpu_only=True),
    Helper(511, "get_lane_id", (), "int", gpu_only=True),
    # (ringbuf, addr, kernel_id, launch_id, site << 32 | flags << 16 | size): the lanes making one access
    # together write one struct egpu_warp_mem (egpu.bpf.h, output/warp_records.py); r0 = 0.
    Helper(1000, "egpu_warp_mem_record", ("map", "anything", "anything", "anything", "anything"), "int",
           gpu_only=True),
)}

BY_NAME: dict[str, Helper] = {h.name: h for h in HELPERS.values()}
LOOP = BY_NAME["loop"].id   # bpf_loop, which calls a function of the program: every consumer runs it apart

TASK_COMM_LEN = 16   # linux/sched.h: a comm's bytes, its NUL included
MAX_LOOPS = 1 << 23  # bpf_loop's BPF_MAX_LOOPS (kernel/bpf/bpf_iter.c)

# Update flags of map_update_elem (linux/bpf.h).
BPF_ANY, BPF_NOEXIST, BPF_EXIST = 0, 1, 2
# Flags of ringbuf/perf output: index mask for perf_event_output's current-CPU selector.
BPF_F_CURRENT_CPU = 0xFFFFFFFF
BPF_RB_FLAGS = 3   # BPF_RB_NO_WAKEUP | BPF_RB_FORCE_WAKEUP: what bpf_ringbuf_output takes (ringbuf.c)

# A conversion of a bpf_trace_printk format as Linux takes it (kernel/bpf/helpers.c bpf_bprintf_prepare):
# flags, width, l or ll, then d i u x X c s p, where %pK and %px print the pointer as %p does; h, hh and z
# are taken too, as clang emits them for short types. Linux refuses anything else (%f, a precision, %pB).
PRINTK_CONVERSION = re.compile(r"%([-0+ #]*)(\d*)(hh|h|ll|l|z)?([diuxXcs%]|p[Kx]|p(?![0-9A-Za-z]))")
_PRINTK_WRITTEN = re.compile(r"%[-0+ #.\d]*[A-Za-z]*\d?")   # what a conversion the grammar refuses spans
_PRINTK_ARGS = 3


def main_comm() -> bytes:
    """The process's main thread's name, TASK_COMM_LEN bytes zero padded: get_current_comm where no
    application thread runs the probe (/proc/self/comm is the thread group leader's). Read once a process,
    as the shim's C engine reads it (a launch probe calling it at every launch opened the file each time)."""
    pid = os.getpid()
    if _comm[0] != pid:
        try:
            with open("/proc/self/comm", "rb") as f:
                name = f.read().rstrip(b"\n")
        except OSError:
            name = b""
        _comm[:] = [pid, name[:TASK_COMM_LEN - 1].ljust(TASK_COMM_LEN, b"\0")]
    return _comm[1]


_comm: list = [0, b""]   # (pid, name): main_comm's, read again in a forked child


def uid_gid() -> int:
    """get_current_uid_gid where no application thread runs the probe: the process's real gid << 32 | uid."""
    return os.getgid() << 32 | os.getuid()


def comm_bytes(comm: bytes, size: int) -> bytes:
    """What get_current_comm writes into a buffer of ``size`` bytes (Linux's strscpy_pad): the name
    truncated to leave its NUL, the rest zeroed."""
    name = comm.split(b"\0", 1)[0][:max(size - 1, 0)]
    return name.ljust(size, b"\0")


def printk_refusal(fmt: str) -> str | None:
    """Why the host cannot print a trace_printk format as Linux would (it gets the arguments as numbers),
    or None when it can."""
    pos, count = 0, 0
    while (at := fmt.find("%", pos)) >= 0:
        m = PRINTK_CONVERSION.match(fmt, at)
        written = m.group() if m else _PRINTK_WRITTEN.match(fmt, at).group()
        if (m and m.group(4) == "s") or (not m and written.endswith("s")):
            return f"{written} (a string) is not supported: the host formats numbers only (print characters with %c)"
        if not m:
            return (f"{written} is not supported: Linux takes %d %i %u %x %X (with l or ll), %c, %p, %pK, %px "
                    "and %%")
        count += m.group(4) != "%"
        pos = m.end()
    if count > _PRINTK_ARGS:
        return f"{count} conversions: bpf_trace_printk takes three arguments"
    return None
