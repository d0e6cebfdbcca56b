"""The --trace drain on the CPU, no GPU: ``python3 bench/bench_drain.py OUT.json [--profile CONFIG | --busy]``.

A stand-in device (a bytearray; the reader's pass copies it with memcpy in C, tests/host_memory.py, the GIL let
go as around the driver's copies) holds the probe's 16 MiB ring, made to wait; a producer thread fills it the way the
GPU's producers do (each record's header, READY flag and bytes, head moved past them, room waited for). Two
record streams: examples/access_trace.bpf.c's (80 bytes with the ring header) and mem_trace_warp.bpf.c's
warp records, whose size follows from the lanes' form (72 to 336 bytes, mixed as below). For each,
three configurations, the best of three runs each, in MB/s of ring bytes (headers included), the
reader's walk in the shim's C as inside a job (the shim is built here):

- ``reader``: ring_drain.RingDrain alone, the records thrown away;
- ``writer``: output/tracefile.TraceWriter alone, fed what the reader took (Arrow IPC and Parquet);
- ``both``: runtime/streaming.Streaming, reader and writer threads together, into Arrow IPC and
  Parquet, the file read back and compared with what was produced; ``both.FORMAT.produced``: until the
  producer had put its last record in the ring (what kernels made to wait by a ring take), the rest of
  ``both`` being the writer's catching up; ``both.FORMAT.pace``: where the best run's drain spent its time
  (the reader's spooling passes in C: copies, scan, clear, the wait for the spool's writes), as egpu-run prints
  it under a trace line.

``--profile access:both.arrow`` (say) runs that one configuration under cProfile, every thread, and
prints where the time went. ``--busy`` runs every configuration beside a Python thread that spins, holding
the GIL but for the switch interval, as a job's main thread does: the reader's passes then wait for it after
each call into C; the reader's passes, and where they spent their time, go into OUT.json too. Needs numpy, pyarrow and
clang (the probes are compiled)."""

from __future__ import annotations

import contextlib
import cProfile
import dataclasses
import io
import json
import os
import platform
import pstats
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from egpu_preload.bpf import program as prog  # noqa: E402
from egpu_preload.bpf.compile import compile_probe  # noqa: E402
from egpu_preload.bpf.elf import load_object  # noqa: E402
from egpu_preload.maps import MapsState  # noqa: E402
from egpu_preload.output import tracefile, warp_records as wr  # noqa: E402
from egpu_preload.runtime.driver import StreamCopies  # noqa: E402
from egpu_preload.runtime.probes import Probe  # noqa: E402
from egpu_preload.runtime import ring_drain  # noqa: E402
from egpu_preload.runtime.ring_drain import RingDrain, RingReader, count  # noqa: E402
from egpu_preload.runtime.streaming import Streaming, rings  # noqa: E402
from egpu_preload.translate import devmaps  # noqa: E402
from host_memory import HostCopies  # noqa: E402

RING = 16 << 20
RUNS = 3
RING_BYTES = int(os.environ.get("BENCH_DRAIN_MB", 96)) << 20  # of records per run and stream
FORMATS = (".arrow", ".parquet")


class Device:
    """Device memory in a bytearray; addresses are offsets. The reader's copies are memcpy in C
    (tests/host_memory.py), the others go through numpy; pinned memory is a bytearray of its own, as in
    tests/test_trace_stream.py."""

    def __init__(self, size: int) -> None:
        self.mem, self.top = bytearray(size), 0
        self.u8 = np.frombuffer(self.mem, np.uint8)
        self.host = HostCopies(self.mem)

    def alloc(self, n: int) -> int:
        self.top, at = self.top + devmaps.round8(n), self.top
        return at

    def free(self, ptr: int) -> None:
        pass

    def read(self, addr: int, n: int) -> bytes:
        return self.u8[addr:addr + n].tobytes()

    def copies(self) -> StreamCopies:
        return self.host.copies()

    def write(self, addr: int, data: bytes | memoryview) -> None:
        np.copyto(self.u8[addr:addr + len(data)], np.frombuffer(data, np.uint8))

    def pinned(self, size: int) -> memoryview:
        return memoryview(bytearray(size))

    def unpin(self, buf: memoryview) -> None:
        pass

    def entered(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    htod, dtoh = write, read


@dataclasses.dataclass
class Stream:
    """What the producers write: the ring bytes of every record in order and where each one starts."""

    data: np.ndarray      # uint8
    starts: np.ndarray    # int64, one more than records: the end

    def __len__(self) -> int:
        return len(self.starts) - 1


def stream(bodies: list[bytes], kinds: np.ndarray, field: int) -> Stream:
    """Records ``bodies[kinds[i]]`` with SM i % 132 and the u64 at ``field`` of record i made unique
    (1 << 40 + i), so that the file read back shows every record in its place."""
    sizes = np.array([8 + devmaps.round8(len(b)) for b in bodies], np.int64)[kinds]
    starts = np.zeros(len(kinds) + 1, np.int64)
    np.cumsum(sizes, out=starts[1:])
    data = np.zeros(int(starts[-1]), np.uint8)
    for k, body in enumerate(bodies):
        at = starts[:-1][kinds == k]
        for j, byte in enumerate(body):
            if byte:
                data[at + 8 + j] = byte
        data.view(np.uint32)[at // 4] = len(body)
    i = np.arange(len(kinds), dtype=np.uint32)
    data.view(np.uint32)[starts[:-1] // 4 + 1] = devmaps.REC_READY | (i % 132) << 8
    data.view(np.uint64)[(starts[:-1] + 8 + field) // 8] = (1 << 40) + i.astype(np.uint64)
    return Stream(data, starts)


def access_stream(n: int) -> Stream:
    """struct mem_event records (the layout warp_records.LANE reads), addr unique."""
    body = wr.LANE.pack(1_000_000, 0x7F0000000000, 77, 3, 2, 4, 1, 5, 1, 2, 0, 3, 0, 0)
    return stream([body], np.zeros(n, np.int64), 8)


# A warp trace's forms, mixed: most instructions affine (a[threadIdx.x]), some gathers within 2 GiB of the
# first lane's address (offsets, all 32 lanes or 7), a few beyond (addresses).
WARP_MIX = (0.70, 0.15, 0.10, 0.05)


def warp_stream(n: int) -> Stream:
    ins = wr.Instruction(1_000_000, 7, 9, 3, 4, 1, 5, (1, 2, 0), (256, 1), 3)
    base = 0x7F0000000000
    bodies = [wr.encode(wr.warp_record(ins, {i: base + 4 * i for i in range(32)})),
              wr.encode(wr.warp_record(ins, {i: base + 4 * (i * 7 % 32) for i in range(32)})),
              wr.encode(wr.warp_record(ins, {i: base + 4 * (i * 7 % 32) for i in range(0, 32, 5)})),
              wr.encode(wr.warp_record(ins, {i: base + (i << 33) for i in range(32)}))]
    kinds = np.random.default_rng(19).choice(len(bodies), n, p=WARP_MIX)
    return stream(bodies, kinds, 0)   # ts unique


class Producer(threading.Thread):
    """The GPU's producers at full speed: every record of ``s`` written into the ring at ``addr`` as room
    appears (bytes and READY flag first, then reserved and head moved past them, then counted on the SM's line as
    the GPU's count what they commit: devmaps.py COMMITTED), in C with the GIL let go (host_memory.HostCopies.produce),
    as no GPU producer waits for it."""

    def __init__(self, dev: Device, addr: int, s: Stream) -> None:
        super().__init__(name="bench-producer", daemon=True)
        self.dev, self.addr, self.s = dev, addr, s
        dev.host.state.counts = 1

    def run(self) -> None:
        self.dev.host.produce(self.addr, self.s.starts, self.s.data, RING)


def probe(tmp: Path, name: str) -> tuple[Probe, int]:
    """The example's probe with its ring made 16 MiB and to wait; the ring's map index."""
    obj = load_object(compile_probe(ROOT / "examples" / f"{name}.bpf.c", tmp / f"{name}.bpf.o"))
    maps = [dataclasses.replace(m, max_entries=RING, wait=True) if m.type == prog.MAP_RINGBUF else m
            for m in obj.maps]
    index = next(i for i, m in enumerate(maps) if m.type == prog.MAP_RINGBUF)
    warp = frozenset({index}) if name == "mem_trace_warp" else frozenset()
    return Probe(Path(f"{name}.bpf.o"), dataclasses.replace(obj, maps=maps), (), "t", warp), index


def device(p: Probe) -> tuple[Device, devmaps.DeviceMaps]:
    dev = Device(3 * RING + (8 << 20))
    return dev, devmaps.DeviceMaps(dev, MapsState(p.obj.maps), 132)


def run_reader(p: Probe, index: int, s: Stream, keep: bool) -> tuple[float, list, dict]:
    """(seconds, what the reader took if ``keep``, its passes and phases) for the whole stream, the records
    thrown away."""
    dev, dm = device(p)
    reader = RingReader(dev, dm.addrs[index], dm.layouts[index])
    kept: list = []
    sink = (lambda i, taken: kept.append(taken)) if keep else (lambda i, taken: None)
    producer = Producer(dev, dm.addrs[index], s)
    t = time.perf_counter()
    producer.start()
    drain = RingDrain([reader], sink).start()
    producer.join()
    drain.stop()
    seconds = time.perf_counter() - t
    assert reader.taken == len(s), (reader.taken, len(s))
    return seconds, kept, {"passes": drain.passes, **{f"{k}_s": round(v, 3) for k, v in reader.phases.items()}}


def run_writer(p: Probe, index: int, batches: list, path: Path) -> float:
    name, _, lay = next(r for r in rings([p]) if r[1] == (0, index))
    t = time.perf_counter()
    w = tracefile.TraceWriter(path, [(name, lay)])
    for taken in batches:
        w.add(0, taken)
    w.close({name: 0})
    return time.perf_counter() - t


def run_both(p: Probe, index: int, s: Stream, path: Path) -> tuple[float, float, dict]:
    """(seconds until the file was closed, seconds until the producer had put its last record in the ring: what
    a job's kernels made to wait would take, where the drain's time went: egpu-run's pace line)."""
    dev, dm = device(p)
    path.unlink(missing_ok=True)
    producer = Producer(dev, dm.addrs[index], s)
    streaming = Streaming(path, [p], [dm], dev)
    t = time.perf_counter()
    producer.start()
    producer.join()
    produced = time.perf_counter() - t
    report = streaming.finish()
    seconds = time.perf_counter() - t
    assert report["records"] == len(s) and report["error"] is None, report
    return seconds, produced, report["drain"]


def check(path: Path, s: Stream, field: str) -> bool:
    """The file holds every record once, in order, each one's bytes as produced."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    if path.suffix == ".arrow":
        with pa.OSFile(str(path)) as f:
            t = pa.ipc.open_file(f).read_all()
    else:
        t = pq.read_table(path)
    unique = (1 << 40) + np.arange(len(s), dtype=np.uint64)
    if field == "data":   # each record's bytes: its ts at 0
        data = t.column("data").combine_chunks()
        offsets = np.frombuffer(data.buffers()[1], np.int32, len(data) + 1, data.offset * 4)
        values = np.frombuffer(data.buffers()[2], np.uint8)
        ok = bool((values[offsets[:-1]].size == len(s)) and
                  (np.diff(offsets) == np.diff(s.starts) - 8).all())
        ts = np.array([int.from_bytes(values[o:o + 8].tobytes(), "little") for o in offsets[:-1:997]], np.uint64)
        return ok and bool((ts == unique[::997]).all()) and t.num_rows == len(s)
    return t.num_rows == len(s) and bool((t.column(field).to_numpy() == unique).all()) \
        and int(t.column("seq").to_numpy()[-1]) == len(s) - 1


def configs(tmp: Path) -> dict:
    """stream name -> (probe, ring index, stream, the column that shows a record's identity)."""
    access, ai = probe(tmp, "access_trace")
    warp, wi = probe(tmp, "mem_trace_warp")
    n_access = RING_BYTES // 80
    warp_s = warp_stream(RING_BYTES // 120)
    return {"access": (access, ai, access_stream(n_access), "addr"), "warp": (warp, wi, warp_s, "data")}


def measure(name: str, cfg: tuple, tmp: Path, only: str | None = None) -> dict:
    p, index, s, field = cfg
    mb = s.starts[-1] / 1e6
    out: dict = {"records": len(s), "ring_bytes": int(s.starts[-1])}
    best: dict[str, float] = {}

    def note(key: str, seconds: float) -> bool:
        """Whether ``seconds`` is the best of ``key`` so far."""
        best[key] = min(best.get(key, float("inf")), seconds)
        return best[key] == seconds

    batches: list = []
    for _ in range(RUNS):
        if only in (None, "reader"):
            seconds, _, pace = run_reader(p, index, s, False)
            if note("reader", seconds):
                out["reader.pace"] = pace
        if only in (None, "writer") or only.startswith("writer"):
            if not batches:
                batches = run_reader(p, index, s, True)[1]
                out["batches"] = len(batches)
                out["records_per_batch"] = round(sum(count(b) for b in batches) / len(batches))
            for f in FORMATS:
                if only in (None, "writer", f"writer{f}"):
                    note(f"writer{f}", run_writer(p, index, batches, tmp / f"w{f}"))
        for f in FORMATS:
            if only in (None, f"both{f}"):
                seconds, produced, pace = run_both(p, index, s, tmp / f"b{f}")
                if note(f"both{f}", seconds):
                    out[f"both{f}.pace"] = pace
                note(f"both{f}.produced", produced)
                out[f"both{f}.read_back_whole"] = check(tmp / f"b{f}", s, field)
    for key, seconds in best.items():
        out[key] = {"seconds": round(seconds, 4), "mb_per_s": round(mb / seconds)}
        print(f"{name:7s} {key:16s} {seconds:7.3f} s {mb / seconds:7.0f} MB/s", flush=True)
    return out


def profile(target: str, tmp: Path) -> None:
    """``stream:config`` under cProfile, a profiler per thread, their calls added up."""
    global RUNS
    name, only = target.split(":")
    cfg = configs(tmp)[name]
    RUNS = 1
    profs = [cProfile.Profile()]
    orig = threading.Thread.run

    def run(self: threading.Thread) -> None:
        prof = cProfile.Profile()
        profs.append(prof)
        prof.runcall(orig, self)

    threading.Thread.run = run
    try:
        profs[0].runcall(measure, name, cfg, tmp, only)
    finally:
        threading.Thread.run = orig
    text = io.StringIO()
    pstats.Stats(*profs, stream=text).sort_stats("tottime").print_stats(30)
    print(text.getvalue())


def walk_in_c(tmp: Path) -> None:
    """The reader's walk on the shim's C (shim/drain.c), as inside a job: the shim built here and loaded
    ABI-mode (its Python never starts)."""
    sys.path.insert(0, str(ROOT / "shim"))
    import build as shim_build
    c = shim_build.load(shim_build.build(tmp / "shim"))
    ring_drain._shim = lambda: c


@contextlib.contextmanager
def spinning(on: bool) -> Iterator[None]:
    """A Python thread spinning for the block (``on``), as a job's main thread that holds the GIL."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    thread = threading.Thread(target=spin, name="bench-busy", daemon=True)
    if on:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if on:
            thread.join()


def main() -> None:
    args = sys.argv[1:]
    busy = args[1:] == ["--busy"]
    if len(args) not in (1, 2, 3) or (len(args) == 3 and args[1] != "--profile") or (len(args) == 2 and not busy):
        raise SystemExit(__doc__)
    with tempfile.TemporaryDirectory() as t, spinning(busy):
        tmp = Path(t)
        walk_in_c(tmp)
        if len(args) == 3:
            profile(args[2], tmp)
            return
        doc: dict = {"cpus": os.cpu_count(), "python": platform.python_version(), "ring_bytes": RING,
                     "warp_mix": dict(zip(("affine32", "offsets32", "offsets7", "addrs32"), WARP_MIX)),
                     "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                              text=True).stdout.strip(),
                     "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "busy_thread": busy}
        for name, cfg in configs(tmp).items():
            doc[name] = measure(name, cfg, tmp)
    Path(args[0]).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
