"""examples/*.bpf.c: each compiles, loads, verifies, translates to PTX that ptxas accepts, and gives exact
map contents on the reference VM for a scripted sequence of events (SCENARIOS); a few also run on the GPU.

A scenario is data: events (which program, the ctx fields, the simulated thread), then the expected
contents of maps (ARRAY slots that are zero are left out), records of ring and perf buffers, global
variables by name, and trace lines. Every example must have at least one scenario.
"""

from __future__ import annotations

import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from egpu_preload.bpf import btf as btfmod
from egpu_preload.bpf import ctx as ctxmod
from egpu_preload.bpf.ctx import kernel_id
from egpu_preload.bpf.elf import load_object
from egpu_preload.bpf.program import BpfObject
from egpu_preload.bpf.verifier import verify
from egpu_preload.maps import ArrayStorage, MapsState, PerfStorage, RingbufStorage
from egpu_preload.output import perfetto, text, warp_records
from egpu_preload.output.values import Histogram, Records as RecordsValue, snapshot
from egpu_preload.translate import probe_object_ptx
from egpu_preload.translate.demangle import matches
from egpu_preload.vm import ThreadSim, Vm
from conftest import EXAMPLES_DIR
from test_vm import make_ctx

EXAMPLES = sorted(p.name.removesuffix(".bpf.c") for p in EXAMPLES_DIR.glob("*.bpf.c"))

VEC_ADD = kernel_id("_Z9vectorAddPKfS0_Pf")
GEMM = kernel_id("_Z4gemmPKfS0_Pfi")
LOAD, STORE, ATOMIC = ctxmod.FLAG_LOAD, ctxmod.FLAG_STORE, ctxmod.FLAG_ATOMIC


@pytest.fixture(scope="session")
def example_obj(example_path):
    """``example_obj("access_trace") -> BpfObject``: examples/access_trace.bpf.c compiled and loaded once."""
    loaded: dict[str, BpfObject] = {}

    def build(name: str) -> BpfObject:
        if name not in loaded:
            loaded[name] = load_object(example_path(name))
        return loaded[name]

    return build


# --- scenarios ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Event:
    program: str
    ctx: dict = field(default_factory=dict)      # struct egpu_ctx fields
    thread: dict = field(default_factory=dict)   # ThreadSim fields
    timer_after: int | None = None               # the thread's globaltimer after the run (spins)


@dataclass(frozen=True)
class Contents:
    """A map's entries: {key: value}, decoded with struct formats (a one-field format gives plain ints)."""

    entries: dict
    value_fmt: str = "<Q"
    key_fmt: str | None = None  # default: "<I" for 4-byte keys, "<Q" for 8-byte keys


@dataclass(frozen=True)
class Records:
    """A ring buffer's records (or a perf buffer's, as (sm, record) pairs) and its drop count."""

    records: list
    fmt: str
    drops: int = 0


@dataclass(frozen=True)
class Scenario:
    example: str
    title: str
    events: list[Event]
    maps: dict[str, Contents | Records] = field(default_factory=dict)
    globals: dict[str, int] = field(default_factory=dict)   # .bss/.data variables by name
    rodata: dict[str, int] = field(default_factory=dict)    # set before running, as a loader may
    trace: list[str] | None = None
    text: tuple[str, ...] = ()  # lines of egpu-run's text output (output/text.py) for these maps


def ev(program: str, *, t: int | None = None, timer_after: int | None = None, thread: dict | None = None,
       **ctx) -> Event:
    """An event; ``t`` is the thread's globaltimer (it stays put unless thread sets a tick)."""
    th = dict(thread or {})
    if t is not None:
        th["globaltimer"] = t
    return Event(program, ctx, th, timer_after)


def blk(x: int, y: int = 0, z: int = 0, *, grid: tuple = (1, 1, 1), **more) -> dict:
    return {"block_idx": (x, y, z), "grid_dim": grid, **more}


# The struct each example's ring or perf buffer carries (what egpu-run needs to print and trace them).
RECORD_TYPES = {"access_trace": {"events": "struct mem_event"}, "stragglers": {"stragglers": "struct straggler"},
                "kernelretsnoop": {"rb": "struct data"}}
KERNEL_NAMES = {VEC_ADD: "_Z9vectorAddPKfS0_Pf", GEMM: "_Z4gemmPKfS0_Pfi"}

STRAGGLER = "<QQQQIIII"  # struct straggler
MEM_EVENT = "<QQQQIIII3I3I"  # struct mem_event
WARP_MEM = warp_records.HEADER.format  # struct egpu_warp_mem, affine: no tail
# Rings of warp records (output/warp_records.py): no BTF struct types them, so they print in hex.
WARP_RECORD_RINGS = {"mem_trace_warp": "warp_events"}

SCENARIOS = [
    Scenario("launch_count", "3 launches of vectorAdd and 1 of gemm", [
        ev("count_launch", kernel_id=VEC_ADD, grid=(4, 1, 1)),
        ev("count_launch", kernel_id=GEMM, grid=(2, 2, 1)),
        ev("count_launch", kernel_id=VEC_ADD, grid=(1000, 1, 1)),
        ev("count_launch", kernel_id=VEC_ADD, grid=(1, 1, 1)),
    ], maps={"launches": Contents({VEC_ADD: 3, GEMM: 1}),
             "hist_grid_blocks": Contents({0: 1, 2: 2, 9: 1})},
        text=("@launches[vectorAdd]: 3", "@launches[gemm]: 1", "@hist_grid_blocks:")),

    Scenario("kernel_duration", "block 0 starts, the last block to exit ends the launch", [
        ev("block_enter", t=1000, launch_id=7, kernel_id=VEC_ADD, thread=blk(0, grid=(3, 1, 1))),
        ev("block_enter", t=1100, launch_id=7, kernel_id=VEC_ADD, thread=blk(1, grid=(3, 1, 1))),
        ev("block_exit", t=1500, launch_id=7, kernel_id=VEC_ADD, thread=blk(2, grid=(3, 1, 1))),
        ev("block_exit", t=1800, launch_id=7, kernel_id=VEC_ADD, thread=blk(0, grid=(3, 1, 1))),
        ev("block_exit", t=2600, launch_id=7, kernel_id=VEC_ADD, thread=blk(1, grid=(3, 1, 1))),  # 1600 ns
        ev("block_enter", t=5000, launch_id=8, kernel_id=VEC_ADD, thread=blk(0)),
        ev("block_exit", t=5003, launch_id=8, kernel_id=VEC_ADD, thread=blk(0)),                  # 3 ns
        # attached mid-launch: block 0's entry never seen, so the launch is dropped and forgotten
        ev("block_exit", t=100, launch_id=9, kernel_id=GEMM, thread=blk(1, grid=(2, 1, 1))),
        ev("block_exit", t=200, launch_id=9, kernel_id=GEMM, thread=blk(0, grid=(2, 1, 1))),
    ], maps={"hist_duration_ns": Contents({10: 1, 1: 1}),
             "duration_by_kernel": Contents({VEC_ADD: (2, 1603)}, "<QQ"),
             "running": Contents({}, "<QQ")},
        text=("@duration_by_kernel[vectorAdd]: { launches: 2, total_ns: 1603 }",)),

    Scenario("mem_bytes", "4 loads of 4 bytes and 2 stores of 8; an atomic counts both ways", [
        *[ev("count_bytes", t=100 + 10 * i, kernel_id=VEC_ADD, size=4, flags=LOAD) for i in range(4)],
        *[ev("count_bytes", t=140 + 10 * i, kernel_id=VEC_ADD, size=8, flags=STORE) for i in range(2)],
        ev("count_bytes", t=200, kernel_id=GEMM, size=16, flags=LOAD | STORE | ATOMIC),
    ], maps={"traffic": Contents({VEC_ADD: (16, 16, 100, 150), GEMM: (16, 16, 200, 200)}, "<QQQQ")},
        text=("@traffic[vectorAdd]: { loaded: 16, stored: 16, first_ns: 100, last_ns: 150 }",)),

    Scenario("access_trace", "a record per access with its thread", [
        ev("trace_access", addr=0x7F0000001000, size=4, flags=LOAD, site=3, kernel_id=VEC_ADD, launch_id=1,
           thread={"globaltimer": 500, "smid": 7, "block_idx": (2, 0, 0), "thread_idx": (33, 0, 0)}),
        ev("trace_access", addr=0x7F0000002000, size=16, flags=STORE | ATOMIC, site=9, kernel_id=GEMM,
           launch_id=2, thread={"globaltimer": 600, "smid": 1, "block_idx": (0, 1, 2), "thread_idx": (0, 3, 1)}),
    ], maps={"events": Records([
        (500, 0x7F0000001000, VEC_ADD, 1, 3, 4, LOAD, 7, 2, 0, 0, 33, 0, 0),
        (600, 0x7F0000002000, GEMM, 2, 9, 16, STORE | ATOMIC, 1, 0, 1, 2, 0, 3, 1)], MEM_EVENT)}),

    Scenario("mem_trace_warp", "lanes run one by one: a one-lane warp record each, affine with stride 0", [
        ev("trace_warp_access", addr=0x7F0000001000, size=4, flags=LOAD, site=3, kernel_id=VEC_ADD, launch_id=1,
           thread={"globaltimer": 500, "smid": 7, "block_idx": (2, 0, 0), "thread_idx": (33, 0, 0),
                   "block_dim": (64, 1, 1)}),
        ev("trace_warp_access", addr=0x7F0000002000, size=16, flags=STORE | ATOMIC, site=9, kernel_id=GEMM,
           launch_id=2, thread={"globaltimer": 600, "smid": 1, "block_idx": (0, 1, 2), "thread_idx": (0, 3, 1),
                                "block_dim": (4, 4, 2)}),
    ], maps={"warp_events": Records([   # ts, base, kernel, launch, stride, site, mask, block, block_dim, warp, sm,
        # size, flags, form; thread (33, 0, 0) of 64 is warp 1's lane 1, (0, 3, 1) of 4x4x2 warp 0's lane 28
        (500, 0x7F0000001000, VEC_ADD, 1, 0, 3, 1 << 1, 2, 0, 0, 64, 1, 1, 7, 4, LOAD, 0),
        (600, 0x7F0000002000, GEMM, 2, 0, 9, 1 << 28, 0, 1, 2, 4, 4, 0, 1, 16, STORE | ATOMIC, 0)], WARP_MEM)}),

    Scenario("sm_balance", "warps per SM and slot, busy time per SM", [
        ev("warp_enter", t=100, thread={"smid": 3, "warp": 5}),
        ev("warp_enter", t=150, thread={"smid": 3, "warp": 6}),
        ev("warp_enter", t=200, thread={"smid": 7, "warp": 5}),
        ev("warp_exit", t=400, thread={"smid": 3, "warp": 5}),
        ev("warp_exit", t=250, thread={"smid": 3, "warp": 6}),
        ev("warp_exit", t=1200, thread={"smid": 7, "warp": 5}),
        ev("warp_exit", t=1300, thread={"smid": 9, "warp": 1}),    # no entry seen: ignored
        ev("warp_enter", t=1400, thread={"smid": 300, "warp": 1}),  # beyond MAX_SMS: ignored
    ], maps={"lhist_warps_per_sm": Contents({3: 2, 7: 1}),
             "lhist_warps_per_slot": Contents({5: 2, 6: 1}),
             "lhist_busy_ns_per_sm": Contents({3: 400, 7: 1000}),
             "warp_start": Contents({})}),

    Scenario("uvm_ranges", "migrated bytes per 2 MiB range and direction, events per kind", [
        ev("count_uvm", kind=1, addr=0x7F0000200000, bytes=65536),
        ev("count_uvm", kind=1, addr=0x7F00003F0000, bytes=4096),   # the same 2 MiB range
        ev("count_uvm", kind=1, addr=0x7F0000400000, bytes=8192),
        ev("count_uvm", kind=2, addr=0x7F0000200000, bytes=65536),
        ev("count_uvm", kind=4, addr=0x7F0000200000, value=3),       # a GPU fault: counted, no bytes
        ev("count_uvm", kind=3, addr=0x7F0000200000, value=0x401234),
    ], maps={"htod_bytes": Contents({0x7F0000200000: 69632, 0x7F0000400000: 8192}),
             "dtoh_bytes": Contents({0x7F0000200000: 65536}),
             "events": Contents({1: 3, 2: 1, 3: 1, 4: 1})},
        text=("@htod_bytes[0x7f0000200000]: 69632",)),

    Scenario("hot_pages", "accesses per 64 KiB page, keyed by the page's address", [
        ev("count_page", addr=a) for a in (0x7F0000010000, 0x7F000001FFF0, 0x7F0000020000, 0x7F0000010008)
    ], maps={"page_accesses": Contents({0x7F0000010000: 3, 0x7F0000020000: 1})},
        text=("@page_accesses[0x7f0000010000]: 3",)),

    # globaltimer advances 10 ns per read: the spin's length is the number of reads it made.
    Scenario("cxl_latency", "the delay grows with the bandwidth of the last window", [
        ev("cxl_delay", addr=0x1000, size=4, thread={"globaltimer": 1_000_000, "tick": 10},
           timer_after=1_000_000 + 10 + 250),   # closes the first window; factor 0 -> delta_ns
        ev("cxl_delay", addr=0x1000, size=1_280_000, thread={"globaltimer": 1_005_000, "tick": 10},
           timer_after=1_005_000 + 10 + 250),   # inside the window: counted, same delay
        # closes the window: 1,280,000 bytes in 11,000 ns at 64 B/ns = 181% -> 250 * 181 / 100 = 452 ns,
        # i.e. 46 reads of the timer after the first
        ev("cxl_delay", addr=0x1000, size=0, thread={"globaltimer": 1_011_000, "tick": 10},
           timer_after=1_011_000 + 10 + 460),
    ], globals={"window_start_ns": 1_011_000, "window_bytes": 0, "bw_factor_pct": 181}),

    Scenario("cxl_latency", "the spin stops after MAX_SPINS reads", [
        ev("cxl_delay", addr=0x1000, size=4, thread={"globaltimer": 1_000_000, "tick": 10},
           timer_after=1_000_000 + 10 + 10 * 1000),
    ], rodata={"delta_ns": 10**9}),

    Scenario("cxl_latency", "only loads in [cxl_lo, cxl_hi) wait", [
        ev("cxl_delay", addr=0x1000, size=4, thread={"globaltimer": 1_000_000, "tick": 10},
           timer_after=1_000_000 + 10),
        ev("cxl_delay", addr=0x2000, size=8, thread={"globaltimer": 2_000_000, "tick": 10},
           timer_after=2_000_000 + 10 + 250),
    ], rodata={"cxl_lo": 0x2000, "cxl_hi": 0x3000}, globals={"window_bytes": 0, "window_start_ns": 2_000_000}),

    Scenario("stragglers", "blocks over threshold_ns go to the ring buffer", [
        ev("block_enter", t=1000, launch_id=1, kernel_id=GEMM, thread=blk(1, 1, grid=(2, 2, 1))),
        ev("block_enter", t=1000, launch_id=1, kernel_id=GEMM, thread=blk(0, 0, grid=(2, 2, 1))),
        ev("block_enter", t=1000, launch_id=1, kernel_id=GEMM, thread=blk(1, 0, grid=(2, 2, 1))),
        ev("block_exit", t=51_000, launch_id=1, kernel_id=GEMM, thread=blk(0, 0, grid=(2, 2, 1))),
        ev("block_exit", t=301_000, launch_id=1, kernel_id=GEMM, thread=blk(1, 1, grid=(2, 2, 1), smid=4)),
        ev("block_exit", t=400_000, launch_id=2, kernel_id=GEMM, thread=blk(0)),  # entry not seen
    ], maps={"hist_block_ns": Contents({15: 1, 18: 1}),
             "block_start": Contents({(1, 1): 1000}, key_fmt="<QQ"),  # block (1,0,0) is still running
             "stragglers": Records([(GEMM, 1, 1000, 300_000, 1, 1, 0, 4)], STRAGGLER)}),

    # host-API probes (struct egpu_host_ctx)
    Scenario("memcpy_bytes", "bytes by direction and stream; bandwidth of the synchronous copies", [
        ev("on_copy", kind=ctxmod.COPY_H2D, bytes=1000, blocked_ns=500, stream=0),
        ev("on_copy", kind=ctxmod.COPY_H2D, bytes=3000, blocked_ns=20, stream=0xABC, flags=ctxmod.HOST_F_ASYNC),
        ev("on_copy", kind=ctxmod.COPY_D2H, bytes=4096, blocked_ns=1024, stream=2, flags=ctxmod.HOST_F_PER_THREAD),
        ev("on_copy", kind=ctxmod.COPY_D2D, bytes=8, stream=0xABC, flags=ctxmod.HOST_F_ASYNC | ctxmod.HOST_F_GRAPH),
        ev("on_copy", kind=ctxmod.COPY_H2D, bytes=5, result=1),  # refused by the driver: nothing moved
    ], maps={"by_direction": Contents({1: (2, 4000, 1000, 500, 2000), 2: (1, 4096, 4096, 1024, 4000),
                                       3: (1, 8, 0, 0, 0)}, "<QQQQQ", "<I"),
             "bytes_by_stream": Contents({0: 1000, 0xABC: 3008, 2: 4096}),
             "hist_copy_bytes": Contents({9: 1, 11: 1, 12: 1, 3: 1})},
        globals={"captured_copies": 1},
        text=("@by_direction[EGPU_COPY_H2D]: { copies: 2, bytes: 4000, sync_bytes: 1000, sync_ns: 500, "
              "sync_mb_per_s: 2000 }", "@bytes_by_stream[0xabc]: 3008")),

    Scenario("alloc_hist", "sizes by kind, live bytes and their peak per second", [
        ev("on_alloc", t=10**9, kind=ctxmod.ALLOC_DEVICE, bytes=1 << 20, addr=0x7000),
        ev("on_alloc", t=15 * 10**8, kind=ctxmod.ALLOC_POOL, bytes=4096),
        ev("on_alloc", t=22 * 10**8, kind=ctxmod.ALLOC_HOST, bytes=100),
        ev("on_free", t=31 * 10**8, kind=ctxmod.ALLOC_DEVICE, bytes=1 << 20, addr=0x7000),
        ev("on_free", t=32 * 10**8, kind=0, bytes=0),                 # never seen allocated: ignored
        ev("on_alloc", t=32 * 10**8, kind=ctxmod.ALLOC_VMM_HANDLE, bytes=2 << 20),  # live once mapped
        ev("on_alloc", t=33 * 10**8, kind=ctxmod.ALLOC_DEVICE, bytes=7, result=2),  # out of memory: ignored
    ], maps={"by_kind": Contents({1: (1, 1 << 20, 1, 1 << 20), 4: (1, 4096, 0, 0), 5: (1, 100, 0, 0),
                                  7: (1, 2 << 20, 0, 0)}, "<QQQQ", "<I"),
             "hist_alloc_bytes": Contents({20: 1, 12: 1, 6: 1, 21: 1}),
             "peak_live_by_second": Contents({0: (1 << 20) + 4096, 1: (1 << 20) + 4196, 2: 4196})},
        globals={"live_bytes": 4196, "peak_live_bytes": (1 << 20) + 4196, "first_ns": 10**9},
        text=("@by_kind[EGPU_ALLOC_DEVICE]: { allocs: 1, bytes: 1048576, frees: 1, freed_bytes: 1048576 }",)),

    Scenario("sync_wait", "time blocked by stream, event and context", [
        ev("on_sync", kind=ctxmod.SYNC_STREAM, stream=0xABC, handle=0xABC, blocked_ns=1000),
        ev("on_sync", kind=ctxmod.SYNC_STREAM, stream=0xABC, handle=0xABC, blocked_ns=3000),
        ev("on_sync", kind=ctxmod.SYNC_EVENT, handle=0x99, blocked_ns=50),
        ev("on_sync", kind=ctxmod.SYNC_CONTEXT, blocked_ns=1 << 20),
    ], maps={"blocked_by_handle": Contents({0xABC: (2, 4000, 3000), 0x99: (1, 50, 50), 0: (1, 1 << 20, 1 << 20)},
                                           "<QQQ"),
             "blocked_ns_by_kind": Contents({1: 4000, 2: 50, 3: 1 << 20}, "<Q", "<I"),
             "hist_blocked_ns": Contents({9: 1, 11: 1, 5: 1, 20: 1})},
        text=("@blocked_ns_by_kind[EGPU_SYNC_STREAM]: 4000",
              "@blocked_by_handle[0xabc]: { calls: 2, blocked_ns: 4000, max_ns: 3000 }")),

    Scenario("launch_latency", "enqueue on the host, first block on the GPU", [
        ev("on_enqueue", t=1000, launch_id=1),
        ev("on_enqueue", t=1500, launch_id=2),
        ev("on_block_start", t=4000, launch_id=1, thread=blk(3)),  # first block of launch 1: 3000 ns
        ev("on_block_start", t=4100, launch_id=1, thread=blk(0)),  # second block: time already taken
        ev("on_block_start", t=1400, launch_id=2, thread=blk(0)),  # before its enqueue: clock skew
        ev("on_block_start", t=9000, launch_id=3, thread=blk(0)),  # never enqueued (probe attached late)
    ], maps={"enqueue_ns": Contents({}), "hist_launch_latency_ns": Contents({11: 1})},
        globals={"clock_skew": 1}),

    Scenario("cuda_counter", "bpftime's counters: per-thread entries, block-x start times", [
        ev("cuda__probe", t=100, kernel_id=VEC_ADD, thread=blk(0, thread_idx=(0, 0, 0))),
        ev("cuda__probe", t=110, kernel_id=VEC_ADD, thread=blk(0, thread_idx=(1, 0, 0))),
        ev("cuda__probe", t=120, kernel_id=VEC_ADD, thread=blk(1, thread_idx=(0, 0, 0))),
        ev("cuda__retprobe", t=200, kernel_id=VEC_ADD, thread=blk(0, thread_idx=(0, 0, 0))),
        ev("cuda__retprobe", t=210, kernel_id=VEC_ADD, thread=blk(0, thread_idx=(1, 0, 0))),
        ev("cuda__retprobe", t=300, kernel_id=VEC_ADD, thread=blk(1, thread_idx=(0, 0, 0))),
        ev("cuda__retprobe", t=310, kernel_id=VEC_ADD, thread=blk(5, thread_idx=(0, 0, 0))),
    ], maps={"start_ts": Contents({0: 110, 1: 120}), "call_count": Contents({VEC_ADD: 3}),
             "total_time_ns": Contents({VEC_ADD: 90 + 100 + 180})},
        trace=["Entered _Z9vectorAddPKfS0_Pf x=0, ts=100\n", "Entered _Z9vectorAddPKfS0_Pf x=1, ts=120\n",
               "Exited _Z9vectorAddPKfS0_Pf x=0 duration=90 ns\n",
               "Exited _Z9vectorAddPKfS0_Pf x=1 duration=180 ns\n",
               "Exited (without tsp) _Z9vectorAddPKfS0_Pf x=5\n"]),

    Scenario("mem_trace", "bpftime's access counter, split by kind", [
        ev("cuda__trace_cuda_kernel", flags=f) for f in (LOAD, LOAD, STORE, LOAD | STORE | ATOMIC, STORE | ATOMIC)
    ], maps={"counter": Contents({0: 5, 1: 3, 2: 3, 3: 2})}, text=("@counter[all]: 5", "@counter[atomics]: 2")),

    Scenario("kernelretsnoop", "a perf record per exiting thread, tagged with its SM", [
        ev("cuda__retprobe", thread={"block_idx": (1, 0, 0), "thread_idx": (5, 0, 0), "globaltimer": 777,
                                     "smid": 2}),
        ev("cuda__retprobe", thread={"block_idx": (0, 2, 0), "thread_idx": (0, 1, 0), "globaltimer": 778,
                                     "smid": 9}),
    ], maps={"rb": Records([(2, (1, 0, 0, 5, 0, 0, 777)), (9, (0, 2, 0, 0, 1, 0, 778))], "<7Q")}),

    Scenario("threadhist", "exits per global thread index", [
        ev("retprobe__cuda", thread={"block_idx": (0, 0, 0), "block_dim": (4, 1, 1), "thread_idx": (1, 0, 0)}),
        ev("retprobe__cuda", thread={"block_idx": (1, 0, 0), "block_dim": (4, 1, 1), "thread_idx": (1, 0, 0)}),
        ev("retprobe__cuda", thread={"block_idx": (1, 0, 0), "block_dim": (4, 1, 1), "thread_idx": (1, 0, 0)}),
        ev("retprobe__cuda", thread={"block_idx": (300, 0, 0), "block_dim": (4, 1, 1)}),  # beyond MAX_THREADS
    ], maps={"lhist_calls_per_thread": Contents({1: 1, 5: 2})}),

    Scenario("launchlate", "bpftime's decade bins, sampled by block 0's thread 0", [
        ev("uprobe_cuda_launch", t=1000, launch_id=1),
        ev("cuda__probe", t=5000, launch_id=1, thread=blk(0, thread_idx=(1, 0, 0))),  # not thread 0
        ev("cuda__probe", t=3500, launch_id=1, thread=blk(0)),                       # 2.5 us
        ev("uprobe_cuda_launch", t=10_000, launch_id=2),
        ev("cuda__probe", t=10_000 + 2 * 10**9, launch_id=2, thread=blk(0)),         # 2 s
        ev("uprobe_cuda_launch", t=5000, launch_id=3),
        ev("cuda__probe", t=4000, launch_id=3, thread=blk(0)),                       # clocks apart: bin 0
    ], maps={"time_histogram": Contents({0: 1, 2: 1, 8: 1}), "launch_times": Contents({})},
        text=("@time_histogram[under_10us]: 1", "@time_histogram[under_10s]: 1")),
]


# --- running them ------------------------------------------------------------------------------------

def _global_vars(obj: BpfObject) -> dict[str, tuple[int, int, int]]:
    """Global variable -> (map index, offset, size), from each global-data map's BTF DATASEC."""
    out = {}
    for index, m in enumerate(obj.maps):
        if m.value_type_id is None or obj.btf is None:
            continue
        sec = obj.btf.type(m.value_type_id)
        if sec.kind != btfmod.KIND_DATASEC:
            continue
        for v in sec.secinfos:
            out[obj.btf.type(v.type).name] = (index, v.offset, v.size)
    return out


def _contents(storage, key_fmt: str | None, value_fmt: str) -> dict:
    def unpack(fmt: str, raw: bytes):
        t = struct.unpack(fmt, raw)
        return t[0] if len(t) == 1 else t

    key_fmt = key_fmt or {4: "<I", 8: "<Q"}[storage.mapdef.key_size]
    skip_zero = isinstance(storage, ArrayStorage)
    return {unpack(key_fmt, k): unpack(value_fmt, v) for k, v in storage.items()
            if not (skip_zero and not any(v))}


def run_scenario(obj: BpfObject, sc: Scenario) -> MapsState:
    state = MapsState(obj.maps)
    variables = _global_vars(obj)
    for name, value in sc.rodata.items():
        index, off, size = variables[name]
        state[index].lookup(struct.pack("<I", 0))[off:off + size] = value.to_bytes(size, "little")
    vms = {p.name: Vm(p.code, obj.maps, state) for p in obj.programs}
    layouts = {p.name: ctxmod.layout_for(p.attach.kind) for p in obj.programs}
    for i, e in enumerate(sc.events):
        thread = ThreadSim(**e.thread)
        assert vms[e.program].run(make_ctx(layouts[e.program], **e.ctx), thread) == 0, f"event {i}"
        if e.timer_after is not None:
            assert thread.globaltimer == e.timer_after, f"event {i}: timer"
    return state


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_verifies_and_assembles(example_obj, ptxas: str, tmp_path: Path, name: str) -> None:
    obj = example_obj(name)
    assert obj.programs and obj.license == "GPL"
    for p in obj.programs:
        verify(p.code, obj.maps, file=obj.path, section=p.section)
    ptx = tmp_path / f"{name}.ptx"
    ptx.write_text(probe_object_ptx(obj))
    done = subprocess.run([ptxas, "-arch=sm_90", str(ptx), "-o", str(tmp_path / f"{name}.cubin")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


BPFTIME_PORTS = ["cuda_counter", "kernelretsnoop", "launchlate", "mem_trace", "threadhist"]


def test_bpftime_ports_attach_to_vec_add(example_obj, tmp_path: Path) -> None:
    """examples/vec_add.cu is the program they trace: every program of theirs selects its kernel."""
    ptx = tmp_path / "vec_add.ptx"
    subprocess.run(["nvcc", "-arch=sm_90", "--ptx", "-o", str(ptx), str(EXAMPLES_DIR / "vec_add.cu")], check=True)
    entries = [line.split()[-1].rstrip("(") for line in ptx.read_text().splitlines() if ".entry" in line]
    assert entries == ["_Z9vectorAddPKfS0_Pf"]
    for name in BPFTIME_PORTS:
        for p in example_obj(name).programs:
            assert matches(p.attach.glob, entries[0]), (name, p.section)


def test_every_example_has_a_scenario() -> None:
    assert sorted({sc.example for sc in SCENARIOS}) == EXAMPLES


@pytest.mark.parametrize("sc", SCENARIOS, ids=lambda sc: f"{sc.example}: {sc.title}")
def test_example_scenario(example_obj, sc: Scenario) -> None:
    obj = example_obj(sc.example)
    state = run_scenario(obj, sc)
    for map_name, want in sc.maps.items():
        storage = state.by_name(map_name)
        if isinstance(want, Records):
            if isinstance(storage, PerfStorage):
                got = [(cpu, struct.unpack(want.fmt, r)) for cpu, r in storage.consume()]
            else:
                assert isinstance(storage, RingbufStorage)
                got = [struct.unpack(want.fmt, r) for r in storage.consume()]
            assert (got, storage.drops) == (want.records, want.drops), map_name
        else:
            assert _contents(storage, want.key_fmt, want.value_fmt) == want.entries, map_name
    variables = _global_vars(obj)
    for var, value in sc.globals.items():
        index, off, size = variables[var]
        raw = state[index].lookup(struct.pack("<I", 0))[off:off + size]
        assert int.from_bytes(raw, "little") == value, var
    if sc.trace is not None:
        assert [t.text() for t in state.trace] == sc.trace


@pytest.mark.parametrize("sc", SCENARIOS, ids=lambda sc: f"{sc.example}: {sc.title}")
def test_example_output(example_obj, sc: Scenario) -> None:
    """The maps print as intended: hist*/lhist* as histograms, records with field names, kernels by name."""
    obj = example_obj(sc.example)
    snap = snapshot(run_scenario(obj, sc), obj, KERNEL_NAMES, RECORD_TYPES.get(sc.example, {}))
    out = text.render(snap)
    trace = perfetto.Trace(pid=1, kernel_names=KERNEL_NAMES)
    for v in snap.maps:
        assert isinstance(v, Histogram) == v.name.startswith(("hist", "lhist")), v.name
        if isinstance(v, RecordsValue) and v.name == WARP_RECORD_RINGS.get(sc.example):
            assert v.records and all(warp_records.decode(bytes.fromhex(r.value)) for r in v.records), v.name
        elif isinstance(v, RecordsValue):
            assert v.records and all(isinstance(r.value, dict) for r in v.records), v.name
            trace.add_records(v)
    lines = out.splitlines()
    assert [line for line in sc.text if line not in lines] == []
    with_ts = [name for name, types in RECORD_TYPES.get(sc.example, {}).items() if "ts" in _fields(obj, types)]
    assert sorted(name for name, track in trace.records.items() if track) == sorted(with_ts)


def _fields(obj: BpfObject, type_name: str) -> list[str]:
    t = obj.btf.find(type_name.removeprefix("struct "), btfmod.KIND_STRUCT)
    return [m.name for m in t.members]


# --- on the GPU: the translated probes under real contention -------------------------------------------
# run_probe_on_gpu calls a program from every thread of a plain kernel (no scope guard), so these check
# what holds for any interleaving: exact atomic counts and one record per thread.

THREADS, BLOCK = 4096, 256


def _counts(state: MapsState, map_name: str) -> dict:
    return _contents(state.by_name(map_name), None, "<Q")


def _global_threads(records: list[bytes], fmt: str, block_x: int, thread_x: int) -> list[int]:
    """blockIdx.x * BLOCK + threadIdx.x of each record, sorted (fields given by index in fmt)."""
    return sorted(f[block_x] * BLOCK + f[thread_x] for f in (struct.unpack(fmt, r) for r in records))


def _warp_threads(s: MapsState) -> list[int]:
    """The global thread of each lane of the warp records in mem_trace_warp's ring, sorted."""
    lanes = [lane for r in s.by_name("warp_events").consume() for lane in warp_records.expand(r)]
    return sorted(lane.block[0] * BLOCK + lane.thread[0] for lane in lanes)


def _gpu_mem_bytes(s: MapsState) -> bool:
    loaded, stored, first, last = struct.unpack("<QQQQ", s.by_name("traffic").lookup(struct.pack("<Q", VEC_ADD)))
    return (loaded, stored) == (4 * THREADS, 4 * THREADS) and first > 0 and last > 0


@pytest.mark.gpu
@pytest.mark.parametrize("name, program, ctx, check", [
    ("mem_bytes", "count_bytes", {"kernel_id": VEC_ADD, "size": 4, "flags": LOAD | STORE | ATOMIC}, _gpu_mem_bytes),
    ("mem_trace", "cuda__trace_cuda_kernel", {"flags": LOAD | STORE},
     lambda s: _counts(s, "counter") == {0: THREADS, 1: THREADS, 2: THREADS}),
    ("hot_pages", "count_page", {"addr": 0x7F0000010010},
     lambda s: _counts(s, "page_accesses") == {0x7F0000010000: THREADS}),
    ("threadhist", "retprobe__cuda", {},
     lambda s: _counts(s, "lhist_calls_per_thread") == {i: 1 for i in range(min(THREADS, 1024))}),
    ("sm_balance", "warp_enter", {},
     lambda s: sum(_counts(s, "lhist_warps_per_sm").values()) == THREADS
     and sum(_counts(s, "lhist_warps_per_slot").values()) == THREADS),
    ("access_trace", "trace_access", {"addr": 0x1000, "size": 4, "flags": LOAD},
     lambda s: _global_threads(s.by_name("events").consume(), MEM_EVENT, 8, 11) == list(range(THREADS))),
    ("kernelretsnoop", "cuda__retprobe", {},
     lambda s: _global_threads([r for _, r in s.by_name("rb").consume()], "<7Q", 0, 3) == list(range(THREADS))),
    ("mem_trace_warp", "trace_warp_access", {"addr": 0x1000, "size": 4, "flags": LOAD},
     lambda s: _warp_threads(s) == list(range(THREADS))),
])
def test_example_on_gpu(example_obj, name: str, program: str, ctx: dict, check) -> None:
    from egpu_preload.translate import run_probe_on_gpu

    obj = example_obj(name)
    prog = next(p for p in obj.programs if p.name == program)
    r0s, state = run_probe_on_gpu(obj, prog, THREADS, make_ctx(**ctx), block=BLOCK)
    assert r0s == [0] * THREADS
    assert check(state)
