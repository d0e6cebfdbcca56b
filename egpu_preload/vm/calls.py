"""The helpers of bpf/helpers.py as the VM runs them: arguments in r1-r5, result in r0.

Each handler returns True when the probe ends there (helper 507, ``exit``). Map semantics live in
maps.py; this module only moves bytes between VM memory and those containers.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..bpf.helpers import BPF_F_CURRENT_CPU, BPF_RB_FLAGS, BY_NAME, comm_bytes, main_comm, uid_gid
from ..errors import VmError
from ..maps import (EINVAL, BloomStorage, MapStorage, PerfStorage, PerthreadArrayStorage, QueueStorage, RingbufStorage,
                    TraceRecord)
from ..output.warp_records import WARP, Instruction
from .memory import MASK64
from .thread import ThreadSim

if TYPE_CHECKING:
    from .machine import Run


def _storage(run: "Run", reg: int, helper: str) -> MapStorage:
    return run.vm.state[run.map_index(run.regs[reg], helper, reg)]


def _cpu(run: "Run", storage: MapStorage) -> int:
    """Whose copy of a map the thread sees: its SM's (per-cpu maps), its own (bpftime's per-thread array)."""
    return run.thread.global_index if isinstance(storage, PerthreadArrayStorage) else run.thread.smid


def map_value_address(run: "Run", index: int, key: bytes = b"\0\0\0\0") -> int:
    """The address of a map's value, mapped into VM memory (0 when the key is absent)."""
    storage = run.vm.state[index]
    value = storage.lookup(key, _cpu(run, storage))
    if value is None:
        return 0
    return run.mem.address_of(storage.mapdef.name, value, not storage.mapdef.readonly)


def _set(run: "Run", value: int) -> bool:
    run.regs[0] = value & MASK64
    return False


def map_lookup_elem(run: "Run") -> bool:
    storage = _storage(run, 1, "map_lookup_elem")
    key = run.mem.read(run.regs[2], storage.mapdef.key_size)
    return _set(run, map_value_address(run, run.map_index(run.regs[1], "r1"), key))


def map_update_elem(run: "Run") -> bool:
    storage = _storage(run, 1, "map_update_elem")
    key = run.mem.read(run.regs[2], storage.mapdef.key_size)
    value = run.mem.read(run.regs[3], storage.mapdef.value_size)
    if storage.mapdef.readonly:
        return _set(run, -EINVAL)
    return _set(run, storage.update(key, value, run.regs[4], _cpu(run, storage)))


def map_delete_elem(run: "Run") -> bool:
    storage = _storage(run, 1, "map_delete_elem")
    return _set(run, storage.delete(run.mem.read(run.regs[2], storage.mapdef.key_size)))


def map_push_elem(run: "Run") -> bool:
    """(map, value, flags): a queue's or stack's push, a bloom filter's add (maps.py)."""
    storage = _storage(run, 1, "map_push_elem")
    if not isinstance(storage, (QueueStorage, BloomStorage)):
        raise VmError(f"map_push_elem on map {storage.mapdef.name}, which is no queue, stack or bloom filter")
    return _set(run, storage.push(run.mem.read(run.regs[2], storage.mapdef.value_size), run.regs[3]))


def _take(pop: bool) -> Callable[["Run"], bool]:
    """map_pop_elem and map_peek_elem (map, value): the next value of a queue or stack into value (zeros and
    -ENOENT when empty); peek on a bloom filter tests the value there."""
    helper = "map_pop_elem" if pop else "map_peek_elem"

    def take(run: "Run") -> bool:
        storage = _storage(run, 1, helper)
        if isinstance(storage, BloomStorage) and not pop:
            return _set(run, storage.test(run.mem.read(run.regs[2], storage.mapdef.value_size)))
        if not isinstance(storage, QueueStorage):
            raise VmError(f"{helper} on map {storage.mapdef.name}, which is no queue or stack")
        err, value = storage.take(False)
        run.mem.write(run.regs[2], value)   # before the pop: a write that faults takes nothing
        if pop and not err:
            storage.take(True)
        return _set(run, err)
    return take


def trace_printk(run: "Run") -> bool:
    """Records the format and arguments; the host formats them, so the GPU's result (0) is returned."""
    r = run.regs
    run.vm.state.trace.append(TraceRecord(run.mem.read(r[1], r[2]), (r[3], r[4], r[5]), run.thread.smid))
    return _set(run, 0)


def get_current_comm(run: "Run") -> bool:
    """(buf, size): the main thread's name (bpf/helpers.py: no application thread runs the VM's probe)."""
    buf, size = run.regs[1], run.regs[2]
    if size:   # its last byte first: a size past the buffer's region faults before that many bytes are made
        run.mem.store(buf + size - 1, 1, 0)
    run.mem.write(buf, comm_bytes(main_comm(), size))
    return _set(run, 0)


def probe_read_user(run: "Run") -> bool:
    """Helpers 4, 45, 112 and 114 read the application's memory, which only its own threads' programs may
    (the verifier's rule), and those run in C (shim/launchvm.c), never here."""
    raise VmError("bpf_probe_read_user and its kin run in the shim's C engine only (uprobes, host-API programs)")


def perf_event_output(run: "Run") -> bool:
    """(ctx, map, flags, data, size): flags select the CPU; only its index bits may be set."""
    r = run.regs
    storage = _storage(run, 2, "perf_event_output")
    if not isinstance(storage, PerfStorage):
        raise VmError(f"perf_event_output on map {storage.mapdef.name}, which is not a perf event array")
    if r[3] & ~BPF_F_CURRENT_CPU:
        return _set(run, -EINVAL)
    return _set(run, storage.output(run.thread.smid, run.mem.read(r[4], r[5])))


def _ringbuf(run: "Run", helper: str) -> RingbufStorage:
    storage = _storage(run, 1, helper)
    if not isinstance(storage, RingbufStorage):
        raise VmError(f"{helper} on map {storage.mapdef.name}, which is not a ringbuf")
    return storage


def ringbuf_output(run: "Run") -> bool:
    """(map, data, size, flags): flags beyond the wakeup ones get -EINVAL and no record (ringbuf.c)."""
    storage = _ringbuf(run, "ringbuf_output")
    if run.regs[4] & ~BPF_RB_FLAGS:
        return _set(run, -EINVAL)
    return _set(run, storage.output(run.mem.read(run.regs[2], run.regs[3])))


def ringbuf_reserve(run: "Run") -> bool:
    storage = _ringbuf(run, "ringbuf_reserve")
    if run.regs[3]:  # ringbuf.c: reserve takes no flags
        return _set(run, 0)
    buf = storage.reserve(run.regs[2])
    if buf is None:
        return _set(run, 0)
    addr = run.mem.add(f"ringbuf {storage.mapdef.name} record", buf, writable=True)
    run.reservations[addr] = (storage, buf)
    return _set(run, addr)


def egpu_warp_mem_record(run: "Run") -> bool:
    """(ring, addr, kernel_id, launch_id, site << 32 | flags << 16 | size): this lane joins its warp's
    record (vm/warps.py says which lanes the VM takes to run together); r0 = 0."""
    r, t = run.regs, run.thread
    ring = _ringbuf(run, "egpu_warp_mem_record")
    bx, by, _ = t.block_dim
    x, y, z = t.thread_idx
    warp, lane = divmod((z * by + y) * bx + x, WARP)
    ins = Instruction(t.read_timer(), r[3], r[4], r[5] >> 32, r[5] & 0xFFFF, r[5] >> 16 & 0xFF, t.smid,
                      t.block_idx, (bx, by), warp)
    run.vm.warps.join(ring, ins, lane, r[2])
    return _set(run, 0)


def _release(run: "Run", submit: bool) -> bool:
    addr = run.regs[1]
    held = run.reservations.pop(addr, None)
    if held is None:
        raise VmError(f"ringbuf_{'submit' if submit else 'discard'} of 0x{addr:x}, not a reserved record")
    storage, buf = held
    run.mem.remove(addr)
    storage.release(buf, submit)
    return False


def _release_as(submit: bool) -> Callable[["Run"], bool]:
    return lambda run: _release(run, submit)


def _reads(read: Callable[[ThreadSim], int]) -> Callable[["Run"], bool]:
    """A helper returning what the simulated thread reads (%globaltimer, %smid, ...)."""
    return lambda run: _set(run, read(run.thread))


def _store_dim3(attr: str) -> Callable[["Run"], bool]:
    """Helpers 503-505 and 508 store x, y, z of a thread dimension as u64 through r1, r2, r3."""
    def helper(run: "Run") -> bool:
        for reg, v in zip((1, 2, 3), getattr(run.thread, attr)):
            run.mem.store(run.regs[reg], 8, v)
        return _set(run, 0)
    return helper


def exit(run: "Run") -> bool:  # noqa: A001 - bpftime's name for helper 507
    """Ends the probe with r0 = 0 (helpers.py: the kernel's thread keeps running)."""
    _set(run, 0)
    return True


_timer = _reads(ThreadSim.read_timer)  # DESIGN.md 2: ktime is %globaltimer on the GPU
_sm_id = _reads(lambda t: t.smid)

_BY_NAME: dict[str, Callable[["Run"], bool]] = {
    "map_lookup_elem": map_lookup_elem, "map_update_elem": map_update_elem, "map_delete_elem": map_delete_elem,
    "map_push_elem": map_push_elem, "map_pop_elem": _take(True), "map_peek_elem": _take(False),
    "ktime_get_ns": _timer, "trace_printk": trace_printk, "get_smp_processor_id": _sm_id,
    "ktime_get_boot_ns": _timer, "ktime_get_coarse_ns": _timer, "get_numa_node_id": lambda run: _set(run, 0),
    "perf_event_output": perf_event_output, "ringbuf_output": ringbuf_output, "ringbuf_reserve": ringbuf_reserve,
    "ringbuf_submit": _release_as(True), "ringbuf_discard": _release_as(False), "get_globaltimer": _timer,
    "get_block_idx": _store_dim3("block_idx"), "get_block_dim": _store_dim3("block_dim"),
    "get_thread_idx": _store_dim3("thread_idx"), "get_grid_dim": _store_dim3("grid_dim"),
    "membar": lambda run: _set(run, 0),  # one simulated thread: every access is already visible
    "exit": exit, "get_sm_id": _sm_id, "get_warp_id": _reads(lambda t: t.warp),
    "get_lane_id": _reads(lambda t: t.lane),
    "get_current_pid_tgid": lambda run: _set(run, os.getpid() << 32 | os.getpid()),
    "get_current_uid_gid": lambda run: _set(run, uid_gid()),
    "get_prandom_u32": lambda run: _set(run, random.getrandbits(32)),
    "get_current_comm": get_current_comm,
    **dict.fromkeys(("probe_read", "probe_read_str", "probe_read_user", "probe_read_user_str"), probe_read_user),
    "egpu_warp_mem_record": egpu_warp_mem_record,
}
HANDLERS: dict[int, Callable[["Run"], bool]] = {BY_NAME[name].id: f for name, f in _BY_NAME.items()}
