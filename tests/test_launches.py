"""Launch probes (runtime/launches.py) and their writes into device maps (runtime/mapsync.py): the
context a launch probe sees, which maps stay on the host, element writes that the GPU's hash protocol
reads back, and whole jobs on the stand-in driver where SASS-only kernels are counted by name and a
launch probe's writes reach the device copy that GPU probes read."""

from __future__ import annotations

import struct
import time
from contextlib import contextmanager

import pytest

from egpu_preload.bpf import ctx as C
from egpu_preload.bpf import program as prog
from egpu_preload.bpf.ctx import kernel_id
from egpu_preload.maps import MapsState
from egpu_preload.runtime import launches, mapsync
from egpu_preload.runtime.probes import load_probe
from egpu_preload.translate import devmaps
from stub_job import ROOT
from test_runtime import launches as launch_params
from test_runtime import run_kept

EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """``example("launch_count") -> Probe``: an examples/ probe compiled and loaded."""
    from egpu_preload.bpf.compile import compile_probe
    out = tmp_path_factory.mktemp("examples")
    return lambda name: load_probe(compile_probe(EXAMPLES / f"{name}.bpf.c", out / f"{name}.bpf.o"))


LAUNCH = launches.Launch(launch_id=7, time_ns=1_000, function=0x1234, stream=0xABC, grid=(4, 2, 1),
                         block=(128, 1, 1), name="_Z6vecaddPKfS0_Pfi")


def test_the_context_of_a_launch_probe():
    raw = launches.context_bytes(LAUNCH, 99)
    assert len(raw) == C.SIZE
    f = C.BY_NAME
    read = {name: struct.unpack_from("<Q" if f[name].size == 8 else "<I", raw, f[name].offset)[0]
            for name in ("kernel_id", "launch_id", "kind", "stream", "nargs")}
    assert read == {"kernel_id": 99, "launch_id": 7, "kind": C.KIND_LAUNCH, "stream": 0xABC, "nargs": 0}
    assert struct.unpack_from("<3I", raw, f["grid"].offset) == (4, 2, 1)
    assert struct.unpack_from("<3I", raw, f["block"].offset) == (128, 1, 1)


@pytest.mark.parametrize("name, launch_only, shared", [
    ("launch_count", {"launches", "hist_grid_blocks"}, set()),
    ("launch_latency", set(), {"enqueue_ns"}),   # hist and clock_skew: GPU probes only
    ("launchlate", set(), {"launch_times"}),
    ("kernel_duration", None, None),             # no launch program: nothing on the host
])
def test_maps_are_split_by_who_uses_them(example, name, launch_only, shared):
    side = launches.probe_maps(example(name))
    if launch_only is None:
        assert side is None
        return
    names = [m.name for m in side.probe.obj.maps]
    assert {names[i] for i in side.launch_only} == launch_only
    assert {names[i] for i in side.shared} == shared


def test_launch_probes_count_by_kernel_and_read_the_enqueue_time(example):
    probes = launches.LaunchProbes([example("launch_count"), example("launch_latency")])
    probes.offset = 5_000
    for i, name in enumerate(["_Z6vecaddPKfS0_Pfi", "_Z6vecaddPKfS0_Pfi", "other", None]):
        probes.run(launches.Launch(i + 1, 100 * i, 0x10 + i, 0, (3, 1, 1), (32, 1, 1), name))
    count = probes.sides[0].host_state()
    assert dict(count.by_name("launches").items()) == {
        struct.pack("<Q", kernel_id("_Z6vecaddPKfS0_Pfi")): struct.pack("<Q", 2),
        struct.pack("<Q", kernel_id("other")): struct.pack("<Q", 1),
        struct.pack("<Q", 0): struct.pack("<Q", 1)}  # a handle never looked up: "*" still sees it
    # ktime in a launch probe is the record's time on the %globaltimer clock
    latency = probes.sides[1].host_state()
    assert dict(latency.by_name("enqueue_ns").items()) == {
        struct.pack("<Q", i + 1): struct.pack("<Q", 100 * i + 5_000) for i in range(4)}
    assert probes.sides[1].pending == {0: {struct.pack("<Q", i + 1) for i in range(4)}}
    assert probes.runs == 8 and probes.errors == []


def test_launch_globs_pick_kernels_by_mangled_or_plain_name(example):
    probes = launches.LaunchProbes([example("launchlate")])  # SEC("egpu/launch/vectorAdd*")
    for i, name in enumerate(["_Z9vectorAddPKfS0_Pfi", "vectorAdd_v2", "_Z6vecaddPKfS0_Pfi", None]):
        probes.run(launches.Launch(i, 0, 0, 0, (1, 1, 1), (1, 1, 1), name))
    assert probes.runs == 2
    only = launches.LaunchProbes([example("launch_count")], only="vectorAdd")  # egpu-run --kernel
    for i, name in enumerate(["_Z9vectorAddPKfS0_Pfi", "_Z6vecaddPKfS0_Pfi", None]):
        only.run(launches.Launch(i, 0, 0, 0, (1, 1, 1), (1, 1, 1), name))
    assert only.runs == 1


def test_the_clock_offset_is_realtime_minus_monotonic():
    import time
    off = launches.clock_offset()
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC) + off
    assert abs(now - time.clock_gettime_ns(time.CLOCK_REALTIME)) < 50_000_000


# ---- element writes into device regions -----------------------------------------------------------

class FakeDevice:
    """mapsync.Memory over one region image."""

    def __init__(self, image: bytes, base: int = 0x1000) -> None:
        self.base, self.img = base, bytearray(image)
        self.writes = 0

    def read(self, addr: int, n: int) -> bytes:
        return bytes(self.img[addr - self.base:addr - self.base + n])

    def write(self, addr: int, data: bytes) -> None:
        self.img[addr - self.base:addr - self.base + len(data)] = data
        self.writes += 1


def device_view(m: prog.MapDef, img: bytes) -> dict[bytes, bytes]:
    st = MapsState([m])
    devmaps.apply_region(st, 0, img)
    return dict(st[0].items())


def k8(i: int) -> bytes:
    return struct.pack("<Q", i)


@pytest.mark.parametrize("mtype", [prog.MAP_HASH, prog.MAP_LRU_HASH])
def test_hash_keys_written_by_the_host_read_back_as_the_gpu_reads_them(mtype):
    m = prog.MapDef("h", mtype, 8, 8, 4)
    gpu = MapsState([m])
    gpu[0].update(k8(100), k8(1))                      # already on the device, written by a GPU probe
    dev = FakeDevice(devmaps.region_image(m, gpu[0], 1))
    host = MapsState([m])[0]
    for key, value in [(1, 10), (2, 20), (100, 5)]:    # insert, insert, overwrite the GPU's key
        host.update(k8(key), k8(value))
        mapsync.push_key(dev, dev.base, host, k8(key), now_ns=7)
    assert device_view(m, dev.img) == {k8(1): k8(10), k8(2): k8(20), k8(100): k8(5)}
    host.delete(k8(1))
    mapsync.push_key(dev, dev.base, host, k8(1), now_ns=8)
    assert device_view(m, dev.img) == {k8(2): k8(20), k8(100): k8(5)}
    assert struct.unpack_from("<I", dev.img, 0)[0] == 2   # live entries
    host.update(k8(1), k8(11))                         # a deleted key revives in the slot it owns
    mapsync.push_key(dev, dev.base, host, k8(1), now_ns=9)
    assert device_view(m, dev.img) == {k8(1): k8(11), k8(2): k8(20), k8(100): k8(5)}


@pytest.mark.parametrize("mtype", [prog.MAP_PERCPU_HASH, prog.MAP_LRU_PERCPU_HASH])
def test_per_cpu_hash_keys_the_host_writes_go_to_sm_0s_row(mtype):
    """The host is SM 0: its value of a key goes to row 0, the GPU's SMs' values of it stay; a key it deletes
    leaves every SM, and revived, its other SMs' old values read as zeros (as the GPU's insert zeroes them)."""
    m = prog.MapDef("h", mtype, 8, 8, 4)
    gpu = MapsState([m])
    gpu[0].update(k8(100), k8(1), cpu=2)                # on the device, written by a GPU probe on SM 2
    dev = FakeDevice(devmaps.region_image(m, gpu[0], 3))
    host = MapsState([m])[0]
    for key, value in [(1, 10), (100, 5)]:
        host.update(k8(key), k8(value))
        mapsync.push_key(dev, dev.base, host, k8(key), now_ns=7)
    st = MapsState([m])
    devmaps.apply_region(st, 0, dev.img)
    assert dict(st[0].entries) == {k8(1): {0: k8(10)}, k8(100): {0: k8(5), 2: k8(1)}}
    host.delete(k8(100))
    mapsync.push_key(dev, dev.base, host, k8(100), now_ns=8)
    host.update(k8(100), k8(6))
    mapsync.push_key(dev, dev.base, host, k8(100), now_ns=9)
    devmaps.apply_region(st, 0, dev.img)
    assert dict(st[0].entries) == {k8(1): {0: k8(10)}, k8(100): {0: k8(6)}}
    assert struct.unpack_from("<I", dev.img, 0)[0] == 2


@pytest.mark.parametrize("mtype, survivors", [
    (prog.MAP_HASH, 2),        # full: the device keeps what it has (-E2BIG, as on the GPU)
    (prog.MAP_LRU_HASH, 2),    # full: the least recently used slot near the key's home goes
])
def test_a_full_device_hash(mtype, survivors):
    m = prog.MapDef("h", mtype, 8, 8, 2)
    dev = FakeDevice(devmaps.region_image(m, MapsState([m])[0], 1))
    host = MapsState([m])[0]
    for key in (1, 2, 3):
        host.update(k8(key), k8(key))
        mapsync.push_key(dev, dev.base, host, k8(key), now_ns=key)
    seen = device_view(m, dev.img)
    assert len(seen) == survivors and struct.unpack_from("<I", dev.img, 0)[0] == survivors
    assert (k8(3) in seen) == (mtype == prog.MAP_LRU_HASH)


def test_array_elements_written_by_the_host():
    m = prog.MapDef("a", prog.MAP_ARRAY, 4, 8, 4)
    dev = FakeDevice(devmaps.region_image(m, MapsState([m])[0], 1))
    host = MapsState([m])[0]
    host.update(struct.pack("<I", 2), k8(42))
    mapsync.push_key(dev, dev.base, host, struct.pack("<I", 2), now_ns=0)
    assert [v for _, v in sorted(device_view(m, dev.img).items())] == [k8(0), k8(0), k8(42), k8(0)]
    assert dev.writes == 1


def test_reads_alone_are_not_written_back():
    m = prog.MapDef("h", prog.MAP_HASH, 8, 8, 4)
    st = MapsState([m])
    st[0].update(k8(1), k8(1))
    t = launches.Touched(st[0])
    t.lookup(k8(1))
    t.lookup(k8(2))
    assert t.take() == set()
    t.lookup(k8(1))[:] = k8(9)  # written through the pointer a lookup handed out
    t.update(k8(3), k8(3))
    assert t.take() == {k8(1), k8(3)}


# ---- whole jobs on the stand-in driver --------------------------------------------------------------

def test_sass_only_kernels_are_counted_by_name(stub_job, tmp_path):
    """launch_count on a cubin (no PTX): nothing is instrumented, every launch is counted by the kernel's
    name, and the application's launches reach the driver unchanged."""
    r, docs, calls = run_kept(stub_job, tmp_path, EXAMPLES / "launch_count.bpf.c", str(stub_job.app), "cubin", "3",
                              "64", "0")
    assert r.returncode == 0, r.stderr
    assert launch_params(calls) == ["", "", ""]
    assert r.stdout.splitlines()[1:] == [
        "@launches[vecadd]: 3", "", "@hist_grid_blocks:",
        "[2, 4)                 3 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|"]
    (doc,) = docs
    assert doc["modules"][0]["status"] == "SASS only" and doc["stats"]["records"] == 3
    assert not [c for c in calls if c.startswith(("cuMemAlloc", "cuStreamCreate"))]  # nothing on the device


def test_launches_the_ring_could_not_hold_are_counted_and_reported(stub_job, tmp_path):
    """40,000 back-to-back launches outrun launch_count on the Python VM (tens of us a record) and the
    shim's 16 Ki-record ring: egpu-run says how many records were lost, and the probe counted every other
    launch."""
    n = 40_000
    r, (doc,), _ = run_kept(stub_job, tmp_path, EXAMPLES / "launch_count.bpf.c", "--launch-vm", "python",
                            str(stub_job.app), "cubin", str(n), "64", "0")
    assert r.returncode == 0, r.stderr
    lost = doc["stats"]["dropped"]
    assert 0 < lost < n and doc["stats"]["records"] == n - lost
    assert f"@launches[vecadd]: {n - lost}" in r.stdout.splitlines()
    assert (f"egpu-run: pid {doc['pid']}: {lost} of {n} launch records lost (the launch ring was full: launch "
            "probes ran slower than the job launched)") in r.stderr.splitlines()


def test_launch_probes_in_c_count_every_record(stub_job, tmp_path):
    """The same 40,000 launches with launch_count in C (shim/launchvm.c): every record the ring took
    was counted, and no launch record reached Python (the drain runs the probe itself)."""
    n = 40_000
    r, (doc,), _ = run_kept(stub_job, tmp_path, EXAMPLES / "launch_count.bpf.c", "-v", str(stub_job.app), "cubin",
                            str(n), "64", "0")
    assert r.returncode == 0, r.stderr
    recorded = doc["stats"]["records"]
    assert recorded + doc["stats"]["dropped"] == n
    assert f"@launches[vecadd]: {recorded}" in r.stdout.splitlines()
    path = doc["probes"][0]["path"]
    assert doc["launch_probes"] == {"in_c": [path], "python_vm": {}, "python_records": 0}
    assert f"egpu-run: pid {doc['pid']}: launch probes of {path}: in C" in r.stderr.splitlines()


def test_a_launch_probe_that_prints_stays_on_the_python_vm(stub_job, tmp_path):
    r, (doc,), _ = run_kept(stub_job, tmp_path, ROOT / "tests" / "launch_probes" / "launch_printk.bpf.c", "-v",
                            str(stub_job.app), "module", "3", "64", "0")
    assert r.returncode == 0, r.stderr
    path = doc["probes"][0]["path"]
    why = "say_launch calls trace_printk"
    assert doc["launch_probes"] == {"in_c": [], "python_vm": {path: why}, "python_records": 3}
    assert f"egpu-run: pid {doc['pid']}: launch probes of {path}: on the Python VM ({why})" in r.stderr.splitlines()
    assert [ln for ln in r.stdout.splitlines() if "launch " in ln][-3:] == [f"launch {i}" for i in (1, 2, 3)]


def test_a_launch_probe_beside_a_gpu_only_probe(stub_job, probe_obj, tmp_path):
    """launch_count (launch programs only) and count (GPU programs only) in one job: the object without
    launch programs has no host side, and the maps are made and filled all the same (a crash there left
    the table empty, the kernels faulting on their maps)."""
    # --in-kernel: count's program in the kernel, whose table is the subject (else it is counted at the launch)
    r, docs, calls = run_kept(stub_job, tmp_path, EXAMPLES / "launch_count.bpf.c", "-p", str(probe_obj("count")),
                              "--in-kernel", str(stub_job.app), "module", "3", "64", "0")
    assert r.returncode == 0, r.stderr
    assert launch_params(calls) == ["11,22,64,1", "11,22,64,2", "11,22,64,3"]
    (doc,) = docs
    assert [m["status"] for m in doc["modules"]] == ["instrumented"] and doc["stats"]["records"] == 3
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("app", ["c", "python"])
def test_launch_probe_writes_reach_the_maps_gpu_probes_read(stub_job, tmp_path, app):
    """launch_latency: the launch probe's enqueue times go into the device copy of enqueue_ns (keyed by
    the launch ids the kernels receive), through the runtime's own non-blocking stream."""
    import time
    cmd = [str(stub_job.app)] if app == "c" else ["python3", str(ROOT / "tests" / "runtime_stub" / "app_vec.py")]
    before = time.clock_gettime_ns(time.CLOCK_REALTIME)
    r, docs, calls = run_kept(stub_job, tmp_path, EXAMPLES / "launch_latency.bpf.c", *cmd, "module", "3", "64", "0")
    after = time.clock_gettime_ns(time.CLOCK_REALTIME)
    assert r.returncode == 0, r.stderr
    assert launch_params(calls) == ["11,22,64,1", "11,22,64,2", "11,22,64,3"]
    assert "cuStreamCreate flags=1 ctx=app" in calls
    # pushes happened before the exit read-back: the device copy holds them
    (doc,) = docs
    assert doc["launch_probes"]["in_c"] == [doc["probes"][0]["path"]]  # the shared map is tracked in C
    enq = dict(doc["probes"][0]["maps"][0]["entries"])
    assert sorted(enq) == [k8(1), k8(2), k8(3)]
    assert all(before <= struct.unpack("<Q", v)[0] <= after for v in enq.values())
    assert [ln.split(":")[0] for ln in r.stdout.splitlines()[1:4]] == ["@enqueue_ns[1]", "@enqueue_ns[2]",
                                                                        "@enqueue_ns[3]"]


class _ClockDriver:
    """The driver calls ContextMemory.globaltimer_offset makes, over a GPU whose %globaltimer runs
    ``ahead`` ns ahead of CLOCK_REALTIME and reads it ``delay`` ns into each launch's round trip (the first
    ``late`` launches ``late_delay`` ns in, as when other processes' kernels hold the GPU)."""

    def __init__(self, ahead: int, delay: int, late: int = 0, late_delay: int = 0) -> None:
        import cffi
        self.ffi, self.ahead, self.delay = cffi.FFI(), ahead, delay
        self.late, self.late_delay = late, late_delay
        self.mem: dict[int, bytes] = {}
        self.launches = 0

    @contextmanager
    def current(self, context: int):
        yield

    @contextmanager
    def capture_relaxed(self):
        yield

    def stream(self) -> int:
        return 1

    def load(self, image: bytes, library: bool) -> int:
        assert b".entry egpu_globaltimer" in image
        return 7

    def function(self, owner: int, name: str, library: bool) -> int:
        return 8

    def unload(self, handle: int, library: bool) -> None:
        pass

    def alloc(self, size: int) -> int:
        return 0x1000

    def free(self, ptr: int) -> None:
        pass

    def htod_on(self, stream: int, ptr: int, data: bytes) -> None:
        self.mem[ptr] = data

    def dtoh_on(self, stream: int, ptr: int, size: int) -> bytes:
        return self.mem[ptr][:size]

    def call(self, symbol: str, *args) -> None:
        if symbol == "cuLaunchKernel":
            self.launches += 1
            delay = self.late_delay if self.launches <= self.late else self.delay
            out = self.ffi.cast("unsigned long long **", args[9])[0][0]
            now = time.clock_gettime_ns(time.CLOCK_REALTIME) + delay
            self.mem[out] = struct.pack("<Q", now + self.ahead)
            time.sleep(2 * delay / 1e9)


def test_globaltimer_offset_is_the_gpu_clock_minus_realtime_within_its_window():
    from egpu_preload.runtime.driver import ContextMemory
    drv = _ClockDriver(ahead=1_190_000, delay=50_000)
    offset, within = ContextMemory(drv, 1).globaltimer_offset()
    assert drv.launches >= 5
    assert abs(offset - 1_190_000) <= within and within < 1_000_000


def test_globaltimer_offset_launches_again_while_the_gpu_starts_its_kernel_late():
    """With other processes' kernels on the GPU the measuring kernel may start milliseconds late in all of the
    first five launches, which left the offset that uncertain (a suspect in the 2 launches a live launchlate
    timed before their host time, among eight test processes, 2026-12-07). Launches go on, 50 at most, until
    one's window is within GLOBALTIMER_WINDOW_NS."""
    from egpu_preload.runtime.driver import GLOBALTIMER_WINDOW_NS, ContextMemory
    drv = _ClockDriver(ahead=1_190_000, delay=0, late=8, late_delay=3_000_000)
    offset, within = ContextMemory(drv, 1).globaltimer_offset()
    assert drv.launches > 8
    assert abs(offset - 1_190_000) <= within and within < 3_000_000
    assert within <= GLOBALTIMER_WINDOW_NS or drv.launches == 50


def test_a_driver_that_runs_no_kernel_leaves_the_clocks_unaligned():
    from egpu_preload.runtime.driver import ContextMemory
    drv = _ClockDriver(ahead=0, delay=0)
    drv.call = lambda symbol, *args: None   # the kernel stores nothing: the buffer keeps its zeros
    assert ContextMemory(drv, 1).globaltimer_offset() is None


def test_an_unknown_launch_vm_is_refused_before_the_job_starts(tmp_path):
    from stub_job import egpu_run
    marker = tmp_path / "ran"
    r = egpu_run(["--launch-vm", "jit", "-p", str(EXAMPLES / "launch_count.bpf.c"), "touch", str(marker)], {
        "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "XDG_RUNTIME_DIR": str(tmp_path)})
    assert (r.returncode, r.stderr) == (125, "egpu-run: Invalid value for '--launch-vm': Value error, 'jit' is not one "
                                             "of 'c', 'python'. (see egpu-run --help)\n")
    assert not marker.exists()
