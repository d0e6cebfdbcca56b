"""bpftime's GPU example probes (tests/fixtures/bpftime, its example/gpu/*/*.bpf.c), built as bpftime's
Makefiles build them, load, verify and translate unchanged; its map types keep their semantics (one
array per GPU thread for PERGPUTD arrays); helper 14 is the application's pid. Section forms:
test_sections.py."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from egpu_preload.bpf import program as prog
from egpu_preload.bpf.elf import load_object
from egpu_preload.maps import MapsState, PerthreadArrayStorage
from egpu_preload.translate import devmaps, probe_function
from egpu_preload.translate.module import probe_runner_ptx
from egpu_preload.translate.striping import stripe_counters
from egpu_preload.vm import ThreadSim, Vm
import bpftime_build
import ptx_corpus
from launcher import egpu
from stub_job import ROOT, egpu_run

# bpftime's run-as-a-kernel GEMM: loops K times, K read from a map (up to 2^32 rounds), which only a
# directly-run section may do (bpf/verifier: bounded at run time)
DIRECTLY_RUN = "directly_run_on_gpu/directly_run.bpf.c"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """Every fixture compiled once with bpftime's flags (name -> .bpf.o); on the GPU machine, which has
    no clang, the objects scripts/gpu-prep.sh built beside the other prebuilt probes."""
    prebuilt = os.environ.get("EGPU_PREBUILT_PROBES")
    if prebuilt:
        names = [bpftime_build.name(src) for src in bpftime_build.SOURCES] + list(bpftime_build.LIVE)
        return {n: Path(prebuilt).parent / "bpftime" / bpftime_build.object_name(n) for n in names}
    return bpftime_build.build_all(tmp_path_factory.mktemp("bpftime"))


def test_the_fixtures_are_bpftimes_twenty():
    assert len(bpftime_build.SOURCES) == 20


def test_live_launchlate_hooks_the_launch_and_probes_vector_add(built):
    """What its GPU test attaches: a uprobe with its target, and a GPU program on vectorAdd itself (the
    -kernel-gpu-shared-map file's `cuda__` section names no kernel, so it is not the one made live)."""
    attach = {p.name: p.attach for p in load_object(built["live/launchlate.bpf.c"]).programs}
    assert {n: (a.kind, a.glob) for n, a in attach.items()} == {
        "uprobe_cuda_launch": ("uprobe", "libcudart.so:__cudaLaunchKernel"),
        "cuda__probe": ("entry", "_Z9vectorAddPKfS0_Pf")}


def test_live_sources_are_their_fixtures_with_their_edits():
    """LIVE's edits apply (each text once: a fixture that changed under them fails here, not as a probe
    built from a half-edited file), and live/launchlate.bpf.c keeps the rest of bpftime's file."""
    text = bpftime_build.live_source("live/launchlate.bpf.c")
    assert 'SEC("uprobe/libcudart.so:__cudaLaunchKernel")' in text and 'bpf_printk("CPU' not in text
    theirs = (bpftime_build.FIXTURES / "launchlate" / "launchlate.bpf.c").read_text()
    assert len(theirs.splitlines()) - len(text.splitlines()) == 2
    with pytest.raises(ValueError, match="is not in .* exactly once"):
        bpftime_build.LIVE["x"] = ("threadhist/threadhist.bpf.c", (("no such text", ""),))
        try:
            bpftime_build.live_source("x")
        finally:
            del bpftime_build.LIVE["x"]


def test_every_example_verifies_and_assembles(built, ptxas, tmp_path):
    """Each program verifies, and its PTX, called from a kernel, assembles."""
    assembled = []
    for name, path in built.items():
        obj = load_object(path)
        assert obj.programs, name
        for p in obj.programs:
            ptx = tmp_path / "p.ptx"
            ptx.write_text(probe_runner_ptx(probe_function(p, obj, ctx_params=True)))
            done = subprocess.run([ptxas, "-arch=sm_90", str(ptx), "-o", str(tmp_path / "p.cubin")],
                                  capture_output=True, text=True)
            assert done.returncode == 0, f"{name}:{p.section}: {done.stderr[-2000:]}"
            assembled.append(f"{name}:{p.name}")
    assert len(assembled) == 30 + 2   # bpftime's, and live/launchlate's two


def test_egpu_verify_and_ptx_accept_the_examples(built):
    runner = CliRunner()
    for name, path in built.items():
        for cmd in ("verify", "ptx"):
            res = runner.invoke(egpu, [cmd, str(path)])
            assert res.exit_code == 0, f"egpu {cmd} {name}: {res.output}"


def _gemm(built) -> tuple[prog.BpfObject, prog.Program]:
    obj = load_object(built[DIRECTLY_RUN])
    (p,) = [p for p in obj.programs if p.name == "cuda__gemm"]
    return obj, p


def test_gemms_loop_is_bounded_at_run_time_in_its_section_only(built):
    """cuda__gemm's loop over K verifies in bpftime's directly-run section, its two backward jumps budgeted;
    the same code in a kernel's probe is refused as Linux refuses it (8192 waiting branches, about 5 s)."""
    from egpu_preload.bpf.verifier import verify
    from egpu_preload.errors import VerifierError
    obj, p = _gemm(built)
    assert len(verify(p.code, obj.maps, section=p.section).budgeted) == 2
    with pytest.raises(VerifierError, match="too complex"):
        verify(p.code, obj.maps, file=DIRECTLY_RUN, section="kprobe/vectorAdd")
    res = CliRunner().invoke(egpu, ["verify", str(built[DIRECTLY_RUN])])
    assert res.exit_code == 0, res.output
    assert re.search(r"prog cuda__gemm \(kprobe/__directly_run\): loop at insn \d+ bounded at run time: 1048576 "
                     r"backward jumps a run \(at \d+, \d+\), and the next ends it as bpf_cuda_exit \(507\) does",
                     res.output), res.output
    assert res.output.count("bounded at run time") == 1


def test_gemm_multiplies_on_the_vm(built):
    """cuda__gemm over 32x32x32, its maps filled as bpftime's directly_run.c fills them (A = 1 << 16, B = 0.01
    in 16.16 fixed point), one thread an element (2x2 blocks of 16x16): each C is the sum of A*B truncated
    to s32, and no run reaches the budget."""
    from egpu_preload.bpf.verifier import verify
    obj, p = _gemm(built)
    m = n = k = 32
    state = MapsState(obj.maps)
    a, b = 1 << 16, int(0.01 * (1 << 16))
    state.by_name("gemm_dims").update(struct.pack("<I", 0), struct.pack("<3I", m, n, k))
    for i in range(m * k):
        state.by_name("gemm_A").update(struct.pack("<I", i), struct.pack("<i", a))
    for i in range(k * n):
        state.by_name("gemm_B").update(struct.pack("<I", i), struct.pack("<i", b))
    vm = Vm(p.code, obj.maps, state, budgeted=verify(p.code, obj.maps, section=p.section).budgeted)
    for y in range(m):
        for x in range(n):
            assert vm.run(bytes(512), ThreadSim(thread_idx=(x % 16, y % 16, 0), block_idx=(x // 16, y // 16, 0),
                                                block_dim=(16, 16, 1), grid_dim=(2, 2, 1))) == 0
    c = struct.unpack(f"<{m * n}i", b"".join(state.by_name("gemm_C").lookup(struct.pack("<I", i))
                                               for i in range(m * n)))
    expected = (k * a * b + (1 << 31)) % (1 << 32) - (1 << 31)
    assert set(c) == {expected} and state.loops_cut == 0


def test_egpu_verify_says_where_launchlates_uprobe_attaches(built):
    """A bare uprobe that prints (bpf_printk): in C, its target from egpu-run --uprobe."""
    res = CliRunner().invoke(egpu, ["verify", str(built["launchlate/launchlate.bpf.c"])])
    assert res.exit_code == 0, res.output
    assert ("prog uprobe_cuda_launch (uprobe): host uprobe on the function egpu-run --uprobe "
            "uprobe_cuda_launch=PATH:SYMBOL names") in res.output


# ---- map types --------------------------------------------------------------------------------

@pytest.mark.parametrize("name, map_name, kind", [
    ("threadscheduling_dynamic_hook/threadscheduling.bpf.c", "thread_mapping", prog.MAP_HASH),     # 1501
    ("threadhist/threadhist.bpf.c", "call_count", prog.MAP_PERTHREAD_ARRAY),                      # 1502
    ("gpu_shared_map/gpu_shared_map.bpf.c", "counter", prog.MAP_ARRAY),                          # 1503
    ("launchlate-kernel-gpu-shared-map/launchlate.bpf.c", "time_histogram", prog.MAP_ARRAY),      # 1504
    ("host_map_test/host_map_test.bpf.c", "perthread_counter", prog.MAP_PERTHREAD_ARRAY),         # 1512
    ("host_map_test/host_map_test.bpf.c", "shared_counter", prog.MAP_ARRAY),                      # 1513
    ("kernel_trace/kernel_trace.bpf.c", "events", prog.MAP_PERF_EVENT_ARRAY),                     # 1527
])
def test_bpftime_map_types_load_as_egpu_types(built, name, map_name, kind):
    m = next(m for m in load_object(built[name]).maps if m.name == map_name)
    assert m.type == kind


def test_a_map_a_uprobe_shares_is_not_striped(built):
    """threadhist-gpu-kernel-shared-map: both programs only add to call_count, but one runs on the host,
    which would write the one host copy: the map keeps one copy (translate/striping.py)."""
    obj = load_object(built["threadhist-gpu-kernel-shared-map/threadhist.bpf.c"])
    stripe_counters(obj)
    assert [m.stripe for m in obj.maps if m.name == "call_count"] == [0]
    obj.programs = [p for p in obj.programs if p.attach.kind != "uretprobe"]
    stripe_counters(obj)
    assert [m.stripe for m in obj.maps if m.name == "call_count"] == [8]


def _threadhist(built) -> tuple[prog.BpfObject, prog.Program]:
    obj = load_object(built["threadhist/threadhist.bpf.c"])
    return obj, obj.programs[0]


def _grid_thread(i: int, block: int = 256, blocks: int = 8) -> ThreadSim:
    return ThreadSim(thread_idx=(i % block, 0, 0), block_idx=(i // block, 0, 0), block_dim=(block, 1, 1),
                     grid_dim=(blocks, 1, 1), smid=i % 3)


def test_perthread_array_counts_each_thread_apart_on_the_vm(built):
    """threadhist's `*cnt += 1` at exit: thread t's count is in array t, whatever its SM; a thread past
    the map's THREADS finds no value and counts nothing."""
    obj, p = _threadhist(built)
    state = MapsState(obj.maps)
    vm = Vm(p.code, obj.maps, state)
    for i in (0, 1, 1, 300, 1023, 1024, 2000):
        vm.run(b"\0" * 512, _grid_thread(i))
    counts = {t: struct.unpack("<Q", v)[0] for t in state[0].cpus() for _, v in state[0].items(t)}
    assert counts == {0: 1, 1: 2, 300: 1, 1023: 1}


def test_thread_index_is_bpftimes_global_index():
    t = ThreadSim(thread_idx=(3, 2, 1), block_idx=(1, 1, 1), block_dim=(4, 4, 2), grid_dim=(2, 3, 2))
    x, y, z = 1 * 4 + 3, 1 * 4 + 2, 1 * 2 + 1
    assert t.global_index == (z * (3 * 4) + y) * (2 * 4) + x


def test_perthread_array_region_round_trips(built):
    obj, _ = _threadhist(built)
    m = obj.maps[0]
    lay = devmaps.layout(m)
    assert lay.threads == PerthreadArrayStorage.THREADS
    assert lay.region_size(ncpu=132) == devmaps.HEADER + PerthreadArrayStorage.THREADS * lay.cpu_stride
    state = MapsState(obj.maps)
    state[0].update(b"\0" * 4, struct.pack("<Q", 7), cpu=1000)
    img = devmaps.region_image(m, state[0], ncpu=132)
    back = MapsState(obj.maps)
    devmaps.apply_region(back, 0, img)
    assert back[0].lookup(b"\0" * 4, 1000) == struct.pack("<Q", 7)
    assert back[0].lookup(b"\0" * 4, 999) == bytes(8)


def test_perthread_array_storage_refuses_threads_past_its_arrays(built):
    obj, _ = _threadhist(built)
    s = MapsState(obj.maps)[0]
    key, value = b"\0" * 4, bytes(8)
    assert s.lookup(key, PerthreadArrayStorage.THREADS) is None
    assert s.update(key, value, cpu=PerthreadArrayStorage.THREADS) == -7       # -E2BIG
    assert s.update(key, value, flags=3, cpu=PerthreadArrayStorage.THREADS) == -22  # -EINVAL first
    assert s.update(key, value, cpu=PerthreadArrayStorage.THREADS - 1) == 0


def test_perthread_array_ptx_indexes_by_global_thread(built):
    obj, p = _threadhist(built)
    ptx = probe_function(p, obj).func
    for sreg in ("%ctaid.x", "%ntid.x", "%tid.x", "%nctaid.x", "%nctaid.y", "%tid.z"):
        assert sreg in ptx
    assert "%smid" not in ptx  # not per SM
    assert re.search(rf"setp\.ge\.u64 \S+, \S+, {PerthreadArrayStorage.THREADS};", ptx)


@pytest.mark.gpu
def test_perthread_array_on_the_gpu_matches_the_vm(built):
    """1100 threads of 256 exit once each: threads 0..1023 count 1 in their own array, the rest nothing."""
    from egpu_preload.translate import run_probe_on_gpu
    obj, p = _threadhist(built)
    _, state = run_probe_on_gpu(obj, p, 1100, block=256)
    counts = {t: struct.unpack("<Q", v)[0] for t in state[0].cpus() for _, v in state[0].items(t) if any(v)}
    assert counts == {t: 1 for t in range(PerthreadArrayStorage.THREADS)}


# ---- helper 14 --------------------------------------------------------------------------------

class _HostMemory:
    """DeviceMaps' memory interface over host buffers."""

    def __init__(self) -> None:
        self.blocks: dict[int, bytearray] = {}

    def alloc(self, n: int) -> int:
        addr = 0x1000 * (len(self.blocks) + 1) << 20
        self.blocks[addr] = bytearray(n)
        return addr

    def free(self, ptr: int) -> None:
        del self.blocks[ptr]

    def htod(self, ptr: int, data: bytes) -> None:
        self.blocks[ptr][:len(data)] = data

    def dtoh(self, ptr: int, n: int) -> bytes:
        return bytes(self.blocks[ptr][:n])


def _call_count(state: MapsState) -> dict[bytes, bytes]:
    return dict(next(s for s in state.storages if s.mapdef.name == "call_count").items())


def test_pid_tgid_is_the_process_on_the_vm_and_where_the_gpu_reads_it(built):
    """cuda-counter counts calls by pid: the VM's pid is this process's; on the GPU the probe loads it
    from the trace ring's header, where the process that allocates the maps writes its own."""
    obj = load_object(built["cuda-counter/cuda_probe.bpf.c"])
    p = obj.programs[0]
    pid_tgid = os.getpid() << 32 | os.getpid()
    state = MapsState(obj.maps)
    Vm(p.code, obj.maps, state).run(b"\0" * 512, ThreadSim())
    assert _call_count(state) == {struct.pack("<I", os.getpid()): struct.pack("<Q", 1)}
    assert re.search(rf"ld\.global\.nc\.u32 (%w\d+), \[%t\d+\+{devmaps.TGID}\];\s+mov\.b64 %r0, {{\1, \1}};",
                     probe_function(p, obj).func)
    mem = _HostMemory()
    dev = devmaps.DeviceMaps(mem, MapsState(obj.maps), ncpu=4)
    trace_ring = dev.addrs[len(obj.maps)]
    assert struct.unpack_from("<I", mem.blocks[trace_ring], devmaps.TGID)[0] == pid_tgid >> 32


@pytest.mark.gpu
def test_pid_tgid_on_the_gpu_is_the_process(built):
    from egpu_preload.translate import run_probe_on_gpu
    obj = load_object(built["cuda-counter/cuda_probe.bpf.c"])
    _, state = run_probe_on_gpu(obj, obj.programs[0], 1)
    assert _call_count(state) == {struct.pack("<I", os.getpid()): struct.pack("<Q", 1)}


# ---- programs for the probes whose library the GPU machine lacks ----------------------------------

@pytest.mark.parametrize("probe", sorted(bpftime_build.STAND_INS), ids=lambda p: p.split("/")[0])
def test_a_stand_ins_kernel_is_the_one_its_probe_names(built, probe, tmp_path):
    """faiss-test's and llama-cpp-test's threadhist name faiss' and llama.cpp's kernels by their mangled
    names; tests/bpftime_targets declares each with its library's namespaces, templates and arguments.
    nvcc's PTX of the stand-in has one kernel, named exactly as the probe's section, and the rewriter
    instruments it with the probe; ptxas takes the result."""
    ptx = bpftime_build.build_stand_in(probe, tmp_path / "target.ptx", ptx=True).read_text()
    (p,) = load_object(built[probe]).programs
    res = bpftime_build.rewrite(built[probe], ptx)
    assert {k.name: k.status for k in res.kernels} == {p.attach.glob: "instrumented"}
    [(_, _, rc, _, err)] = ptx_corpus.ptxas([(bpftime_build.STAND_INS[probe], "sm_90", res.text)])
    assert rc == 0, err


def test_gpu_prep_refuses_a_cutlass_build_whose_kernel_the_counter_does_not_name(built, monkeypatch, tmp_path):
    """scripts/gpu-prep.sh's check of bpftime's CUTLASS program (CI has no CUTLASS: vec_add stands in for a
    build whose GEMM kernel came out under another name): it stops, naming each kernel and why."""
    def build(deps: Path, out: Path) -> Path:
        exe = tmp_path / "vec_add"
        subprocess.run(["nvcc", *bpftime_build.SM_90, str(ROOT / "examples" / "vec_add.cu"), "-o", str(exe)],
                       check=True)
        return exe
    monkeypatch.setattr(bpftime_build, "build_cutlass_gemm", build)
    with pytest.raises(RuntimeError, match=r"vec_add: cutlass/counter/cutlass_launch_counter.bpf.c instruments "
                                           r"none of its kernels: _Z9vectorAddPKfS0_Pf: untouched \(no probe"):
        bpftime_build.prepare_cutlass(built[bpftime_build.CUTLASS_PROBE].parent, tmp_path)


def _shim(tmp_path: Path) -> Path:
    """egpu's shim, built into tmp_path."""
    out = subprocess.run([sys.executable, str(ROOT / "shim" / "build.py"), str(tmp_path)], capture_output=True,
                         text=True, check=True).stdout
    return Path(out.strip().splitlines()[-1])


def _json_doc(stdout: str) -> dict:
    (doc,) = [json.loads(ln) for ln in stdout.splitlines() if ln.startswith('{"time"')]
    return doc


@pytest.mark.gpu
@pytest.mark.parametrize("probe, geometry", [("faiss-test/threadhist.bpf.c", "16 blocks of 64 threads"),
                                             ("llama-cpp-test/threadhist.bpf.c", "1 block of 1024 threads")],
                         ids=["faiss-test", "llama-cpp-test"])
def test_threadhist_on_its_stand_in_counts_every_thread_each_launch(built, tmp_path, probe, geometry):
    """faiss-test's and llama-cpp-test's threadhist, unchanged, on their stand-ins (faiss_l2norm: 16
    blocks of 64 threads; llama_rms_norm: one block of 1024): each of the 1024 threads exits once a
    launch, so its slot of the per-thread array (bpftime's `Thread N: count` lines, equal for every
    thread in faiss-test's README) holds the launch count, and the sum is launches x 1024."""
    from test_e2e_gpu import env_for
    launches = 7
    exe = bpftime_build.build_stand_in(probe, tmp_path / "target")
    r = egpu_run(["--json", "-p", str(built[probe]), str(exe), str(launches)], env_for(_shim(tmp_path), tmp_path),
                 timeout=300)
    assert r.returncode == 0, r.stderr
    line = r.stdout.splitlines()[0]   # the program's own; egpu-run's JSON follows it
    assert f"{launches} launches of {geometry}, checksum=" in line and line.endswith(" OK"), r.stdout
    count = _json_doc(r.stdout)["maps"]["call_count"]
    per_thread = {t: v for t, v in count["per_sm"].items() if v}
    assert (count["value"], per_thread) == (launches * 1024, {str(t): launches for t in range(1024)}), count


@pytest.mark.gpu
def test_cutlass_launch_counter_counts_the_launches_of_bpftimes_gemm(built, tmp_path):
    """bpftime's cutlass example, both halves unchanged: cutlass_gemm.cu, built by scripts/gpu-prep.sh as
    its Makefile builds it against CUTLASS 3.5.0's headers (gpu-prep checks that its GEMM kernel is the
    one the probe's section names), and cutlass_launch_counter, which counts a launch in thread (0,0,0) of
    block (0,0,0) at its exit: the counter is the warmup and timed launches together, as bpftime's README
    has it climbing in step with the launch count."""
    from test_e2e_gpu import env_for
    exe = built[bpftime_build.CUTLASS_PROBE].parent / "cutlass_gemm"
    assert exe.is_file(), f"{exe}: not built (scripts/gpu-prep.sh builds it)"
    r = egpu_run(["--json", "-p", str(built[bpftime_build.CUTLASS_PROBE]), str(exe), "--shape", "256x256x256",
                  "--warmup", "2", "--launches", "5", "--verify"], env_for(_shim(tmp_path), tmp_path), timeout=300)
    assert r.returncode == 0, r.stderr
    assert "[cutlass] completed 5 launches" in r.stdout, r.stdout
    error = float(re.search(r"max abs error: (\S+)", r.stdout).group(1))
    assert error < 1e-3, r.stdout
    assert _json_doc(r.stdout)["maps"]["cutlass_call_count"]["value"] == 2 + 5


# ---- launchlate: a host uprobe on cudaLaunchKernel sharing a map with a GPU probe ----------------

@pytest.mark.gpu
@pytest.mark.parametrize("cudart, target", [("shared", "libcudart.so:__cudaLaunchKernel"),
                                            ("static", "vectoradd_bpftime:__cudaLaunchKernel")])
def test_launchlate_times_every_launch_from_its_uprobe_on_cuda_launch_kernel(built, tmp_path, cudart, target):
    """bpftime's launchlate unchanged, on tests/e2e/vectoradd_bpftime.cu built with -cudart shared (its
    launches reach cudart through the PLT) and static (nvcc's default: cudart is linked into the
    executable and called directly, so the uprobe is an inline hook on the executable's own copy).
    CUDA 13's <<<>>> calls __cudaLaunchKernel, not cudaLaunchKernel (crt/host_runtime.h; the H200 saw no
    call of the latter), so the bare uprobe is given that symbol. The uprobe runs once per launch (its
    bpf_printk lines); the GPU probe in the launch's one thread finds a host time in last_uprobe_time and
    counts a latency. egpu copies that host write to the device a few ms after the call, so a kernel may
    read the previous launch's time, and the first may find none: the histogram holds the launches, or
    all but the first."""
    from test_e2e_gpu import E2E, cuda_lib_dirs, env_for
    launches = 8
    shim = _shim(tmp_path)
    exe = tmp_path / "vectoradd_bpftime"
    subprocess.run(["nvcc", "-O2", "-arch=sm_90", "-cudart", cudart,
                    *[f"-Xlinker=-rpath,{d}" for d in cuda_lib_dirs()], str(E2E / "vectoradd_bpftime.cu"),
                    "-o", str(exe)], check=True)
    r = egpu_run(["--json", "-p", str(built["launchlate/launchlate.bpf.c"]),
                  "--uprobe", f"uprobe_cuda_launch={target}", str(exe), str(launches)],
                 env_for(shim, tmp_path), timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"vectoradd_bpftime launches={launches} error=0" in r.stdout
    doc = _json_doc(r.stdout)
    host_lines = [t for t in doc["trace"] if "CPU: cudaLaunchKernel called" in str(t)]
    assert len(host_lines) == launches, doc["trace"]
    histogram = sum(e["value"] for e in doc["maps"]["time_histogram"]["entries"])
    assert histogram in (launches - 1, launches), doc["maps"]["time_histogram"]


@pytest.mark.gpu
def test_launchlate_attached_live_counts_the_launches_after_its_push(built, tmp_path):
    """live/launchlate.bpf.c attached with `egpu attach` to vectoradd (-cudart shared) running under egpu-run
    with no probe, then detached. Its uprobe on __cudaLaunchKernel writes the launch's host time into a map
    its GPU program reads; egpu pushes that host write to the device copy every 2 ms, and the GPU program
    counts the latency of each launch that found a time. So every launch between the attach's flip and the
    detach's is counted but those before the first push arrived: the uprobe is hooked after the flip, once
    the clocks are aligned and the shared maps seeded (launches are 20 ms apart: 10 launches allowed for
    that), and the one at either flip may fall on either side. A kernel starts microseconds after its call and
    the push comes up to 2 ms after it, so most launches time from the previous launch's call, 20 ms earlier
    (bin 6), and only one the push beat from its own (bins 1 to 5); bin 0 would mean the host and GPU clocks
    disagree beyond the alignment's uncertainty, bin 7 on (100 ms) a time left five launches old."""
    import time
    from egpu_preload.control import list_sessions
    from test_e2e_gpu import E2E, cuda_lib_dirs, env_for
    shim = _shim(tmp_path)
    exe = tmp_path / "vectoradd_bpftime"
    subprocess.run(["nvcc", "-O2", "-arch=sm_90", "-cudart", "shared",
                    *[f"-Xlinker=-rpath,{d}" for d in cuda_lib_dirs()], str(E2E / "vectoradd_bpftime.cu"),
                    "-o", str(exe)], check=True)
    env = env_for(shim, tmp_path)

    def egpu_cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", "import launcher; launcher.egpu_main()", *args], env=env,
                              capture_output=True, text=True, timeout=120, cwd=ROOT)

    # -v: the job's stderr says how well the clocks were aligned, for a histogram that finds them apart.
    job = subprocess.Popen([sys.executable, "-c", "import launcher; launcher.run_main()", "-v", str(exe), "400"],
                           env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, pid = time.monotonic() + 60, None
        while pid is None and time.monotonic() < deadline and job.poll() is None:
            pid = next((s.pid for s in list_sessions(tmp_path / "egpu")
                        if s.info and str(exe) in s.info["argv"] and s.info["launches"] > 0), None)
            time.sleep(0.05)
        assert pid is not None, job.communicate(timeout=60)
        r = egpu_cli("attach", str(pid), "-p", str(built["live/launchlate.bpf.c"]), "--json")
        assert r.returncode == 0, r.stderr
        attached = json.loads(r.stdout)
        assert (attached["kernels"], attached["uprobes"]["attached"][0]["state"]) == (1, "attached"), attached
        time.sleep(3)
        r = egpu_cli("detach", str(pid), "--json")
        assert r.returncode == 0, r.stderr
        detached = int(re.search(r"flip at launch (\d+)", r.stderr).group(1))
        histogram = {e["key"]: e["value"] for e in json.loads(r.stdout)["maps"]["time_histogram"]["entries"]
                     if e["value"]}
    finally:
        out, err = job.communicate(timeout=120)
    assert job.returncode == 0 and "vectoradd_bpftime launches=400 error=0" in out, err
    between = detached - attached["launches"]
    assert between > 50, (attached["launches"], detached)
    clocks = [line for line in err.splitlines() if "%globaltimer" in line]
    assert between - 10 <= sum(histogram.values()) <= between + 1, (between, histogram, clocks)
    # The probe puts a GPU time at or before the host time into bin 0. Eight test processes sharing the GPU
    # left the alignment +-579 us on 2026-12-07b (an H100): more than a launch's own latency (some 10 us from
    # its call to its kernel's start), so a launch the push beat could land there; a tighter one cannot.
    window = [int(m.group(1)) for line in clocks if (m := re.search(r"\(\+-(\d+) ns\)", line))]
    assert window, err
    loose = {0} if max(window) > 10_000 else set()
    assert set(histogram) <= {1, 2, 3, 4, 5, 6} | loose, (histogram, clocks)


# ---- directly_run_on_gpu: `egpu run-on-gpu`, bpftimetool run-on-cuda's counterpart ----------------

VEC_N = 1024


def _vec_add_maps(tmp_path: Path) -> Path:
    """What bpftime's loader (directly_run.c) writes before a run: vec_N = 1024, vec_A[i] = i, vec_B[i] = 2i,
    as a document in egpu's --json form."""
    def entries(f):
        return {"kind": "map", "entries": [{"key": i, "value": f(i)} for i in range(VEC_N)]}
    path = tmp_path / "init.json"
    path.write_text(json.dumps({"maps": {"vec_N": {"kind": "scalar", "value": VEC_N},
                                         "vec_A": entries(lambda i: i), "vec_B": entries(lambda i: 2 * i)}}))
    return path


# bpftime's README's geometry (4 blocks of 256), the same threads in blocks of 128, and a 2-D grid of 2-D blocks:
# vec_add's index is blockIdx.x * blockDim.x + threadIdx.x, so there it reaches 2 * 128 elements, each written
# by the two threads of y 0 and 1 alike; threads that read another block size or index write other elements.
GEOMETRIES = {"bpftime": (["1", "4", "1", "1", "256", "1", "1"], VEC_N),
              "blocks-of-128": (["--grid", "8", "--block", "128"], VEC_N),
              "2-d": (["--grid", "2,2", "--block", "128,2"], 256)}


def _run_on_gpu(args: list) -> Result:
    return CliRunner().invoke(egpu, ["run-on-gpu", *map(str, args)])


def _vec_c(stdout: str) -> dict[int, int]:
    return {e["key"]: e["value"] for e in _json_doc(stdout)["maps"]["vec_C"]["entries"]}


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=list(GEOMETRIES))
def test_run_on_gpu_vec_add_on_the_vm_adds_bpftimes_vectors(built, tmp_path, geometry):
    """cuda__vec_add over the grid, the maps filled as bpftime's loader fills them: vec_C[i] = 3i for each
    index the grid's threads compute from their own block index, block size and thread index (503-505);
    vec_C[0] = 0 is an all-zero slot, which egpu's output leaves out."""
    args, reached = GEOMETRIES[geometry]
    r = _run_on_gpu([built[DIRECTLY_RUN], "cuda__vec_add", *args, "--maps", _vec_add_maps(tmp_path), "--vm",
                     "--json"])
    assert r.exit_code == 0, r.output
    assert _vec_c(r.stdout) == {i: 3 * i for i in range(1, reached)}


def test_run_on_gpu_prints_the_maps_as_egpu_does_and_reads_its_own_json_back(built, tmp_path):
    """Text output is egpu's map output; the --json document it prints loads back with --maps (the dump,
    edit, load cycle): a second run over vec_C's output adds to the same vectors and gives the same sums."""
    obj = built[DIRECTLY_RUN]
    r = _run_on_gpu([obj, "cuda__vec_add", "1", "4", "1", "1", "256", "1", "1", "--maps", _vec_add_maps(tmp_path),
                     "--vm"])
    assert r.exit_code == 0, r.output
    assert "@vec_N: 1024\n" in r.stdout and "@vec_C[1023]: 3069\n" in r.stdout
    first = _run_on_gpu([obj, "cuda__vec_add", "--maps", _vec_add_maps(tmp_path), "--vm", "--json"])
    (tmp_path / "out.json").write_text(first.stdout)
    again = _run_on_gpu([obj, "cuda__vec_add", "--grid", "4", "--block", "256", "--maps", tmp_path / "out.json",
                         "--vm", "--json"])
    assert again.exit_code == 0, again.output
    assert _vec_c(first.stdout) == {} and _vec_c(again.stdout) == {i: 3 * i for i in range(1, VEC_N)}


def test_run_on_cuda_runs_cuda_run_once_and_prints_its_line(built):
    """bpftime's README's first command, spelled as bpftimetool spells it: one thread, one bpf_printk line."""
    r = CliRunner().invoke(egpu, ["run-on-cuda", str(built[DIRECTLY_RUN]), "cuda__run", "--vm"])
    assert r.exit_code == 0, r.output
    assert r.stdout.endswith("\ndirectly run on GPU\n")
    assert r.stdout.count("directly run on GPU") == 1


@pytest.mark.parametrize("doc, reason", [
    ("{", "not JSON: Expecting property name enclosed in double quotes (line 1 column 2)"),
    ('{"time": 1}', 'not a maps document: no "maps" object'),
    ('{"maps": {"vec_Q": {"kind": "scalar", "value": 1}}}',
     "map vec_Q: the object has no map of that name (vec_N, vec_A, vec_B, vec_C, gemm_dims, gemm_A, gemm_B, gemm_C)"),
    ('{"maps": {"vec_N": {"kind": "scalar", "value": -1}}}',
     "map vec_N: key 0: value: -1 is not an integer from 0 to 4294967295"),
    ('{"maps": {"vec_A": {"kind": "map", "entries": [{"key": 4096, "value": 1}]}}}',
     "map vec_A: key 4096: no room for it (the map holds 4096 entries)"),
    ('{"maps": {"vec_A": {"kind": "scalar", "value": 1}}}',
     "map vec_A: a scalar, but the map is not an array of one entry"),
    ('{"maps": {}}\n{"maps": {}}\n', "2 lines of JSON (a document per process?): keep the one to load"),
], ids=["not-json", "no-maps", "unknown-map", "negative", "past-the-end", "scalar-for-array", "two-documents"])
def test_run_on_gpu_refuses_a_bad_maps_file_in_one_line(built, tmp_path, doc, reason):
    path = tmp_path / "bad.json"
    path.write_text(doc)
    r = _run_on_gpu([built[DIRECTLY_RUN], "cuda__vec_add", "--maps", path, "--vm"])
    assert r.exit_code == 2, r.output
    assert r.stderr.splitlines() == [f"egpu run-on-gpu: --maps {path}: {reason}"
                                     + (" (egpu maps --json prints one)" if "maps document" in reason else "")
                                     + " (see egpu run-on-gpu --help)"]


def test_run_on_gpu_names_the_maps_file_for_an_sm_the_gpu_has_no_row_for(built, tmp_path, monkeypatch):
    """A --maps document's value for an SM past this GPU's (egpu maps --json of a larger GPU): the device's run
    refuses it (devmaps.region_image, as ProbeLaunch makes the maps, before any launch) and the line names the
    document, not the probe. The GPU's run stands in here: it raises as ProbeLaunch does on a GPU of 132 SMs."""
    from egpu_preload import version
    from egpu_preload.translate import execute

    def no_row(*args, **kwargs):
        raise devmaps.NoRow("map counts: a value for SM 140, but its region on this device has rows for 132 SMs "
                            "(0-131)")

    monkeypatch.setattr(version, "cuda_driver", lambda: "580.159.04")
    monkeypatch.setattr(execute, "run_grid_on_gpu", no_row)
    path = tmp_path / "maps.json"
    path.write_text('{"maps": {}}')
    r = _run_on_gpu([built[DIRECTLY_RUN], "cuda__vec_add", "--maps", path])
    assert r.exit_code == 2, r.output
    assert r.stderr.splitlines() == [f"egpu run-on-gpu: --maps {path}: map counts: a value for SM 140, but its region "
                                     "on this device has rows for 132 SMs (0-131) (see egpu run-on-gpu --help)"]


def test_run_on_gpu_refuses_an_unknown_program(built):
    obj = built[DIRECTLY_RUN]
    r = _run_on_gpu([obj, "cuda__nope", "--vm"])
    assert r.exit_code == 1, r.output
    assert r.stderr.splitlines() == [f"egpu: {obj}: no program named cuda__nope (its programs: cuda__run, "
                                     "cuda__vec_add, cuda__gemm)"]


GEMM_DIMS = 8   # M = N = K: one block of 8x8 threads


def _gemm_maps(tmp_path: Path) -> Path:
    """What directly_run.c writes before a GEMM, as a document in egpu's --json form: the dims, A all 1.0
    and B all 0.01 in Q16.16, at 8x8x8 (its own are 32x32x32; the VM runs one thread at a time)."""
    n = GEMM_DIMS * GEMM_DIMS
    path = tmp_path / "gemm.json"
    path.write_text(json.dumps({"maps": {
        "gemm_dims": {"kind": "scalar", "value": [GEMM_DIMS] * 3},
        "gemm_A": {"kind": "map", "entries": [{"key": i, "value": 1 << 16} for i in range(n)]},
        "gemm_B": {"kind": "map", "entries": [{"key": i, "value": int(0.01 * (1 << 16))} for i in range(n)]}}}))
    return path


def _gemm_c(stdout: str) -> set[int]:
    (doc,) = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return {e["value"] for e in doc["maps"]["gemm_C"]["entries"]}


def test_run_on_gpu_multiplies_with_cuda_gemm_on_the_vm(built, tmp_path):
    """cuda__gemm's loop over K, bounded at run time in its directly-run section, runs to the end: every C is
    K x A x B (Q16.16 products, as bpftime's loader fills A and B), and no run is cut by the loop budget."""
    r = _run_on_gpu([built[DIRECTLY_RUN], "cuda__gemm", "1", "1", "1", "1", str(GEMM_DIMS), str(GEMM_DIMS), "1",
                     "--maps", _gemm_maps(tmp_path), "--vm", "--json"])
    assert r.exit_code == 0 and "loop budget" not in r.stderr, r.output
    assert _gemm_c(r.stdout) == {GEMM_DIMS * (1 << 16) * int(0.01 * (1 << 16))}


def test_run_on_gpu_says_how_many_runs_the_loop_budget_cut(tmp_path):
    """A directly-run program that never leaves its loop ends at the budget, as helper 507 ends a probe;
    run-on-gpu says how many of its runs did, and exits 0 (the kernel finished)."""
    src = tmp_path / "spin.bpf.c"
    src.write_text('#include "egpu.bpf.h"\nSEC("kprobe/__directly_run")\nint spin(void *ctx)\n{\n'
                   "\tvolatile int i = 0;\n\twhile (1)\n\t\ti++;\n\treturn 0;\n}\n"
                   'char LICENSE[] SEC("license") = "GPL";\n')
    r = _run_on_gpu([src, "spin", "--block", "2", "--vm"])
    assert r.exit_code == 0, r.output
    assert "egpu: 2 runs of spin cut by the loop budget (1048576 backward jumps a run)" in r.stderr.splitlines()


@pytest.mark.parametrize("args, reason", [
    (["1", "4"], "2 numbers after PROG: COUNT, or COUNT and GX GY GZ BX BY BZ"),
    (["0"], "COUNT is 0: launch at least once"),
    (["--block", "2048"], "block x is 2048: CUDA takes 1 to 1024"),
    (["--block", "64,32"], "a block of 64x32x1 threads: CUDA takes at most 1024"),
    (["1", "1", "1", "1", "1", "1", "1", "--grid", "2"], "the grid and block are given twice: as numbers and as "
                                                         "--grid/--block"),
], ids=["two-numbers", "no-launch", "block-x", "block-threads", "twice"])
def test_run_on_gpu_refuses_a_launch_cuda_would_refuse(built, args, reason):
    r = _run_on_gpu([built[DIRECTLY_RUN], "cuda__vec_add", *args, "--vm"])
    assert r.exit_code == 2, r.output
    assert r.stderr.splitlines() == [f"egpu run-on-gpu: {reason} (see egpu run-on-gpu --help)"]


@pytest.mark.gpu
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=list(GEOMETRIES))
def test_run_on_gpu_vec_add_on_the_gpu(built, tmp_path, geometry):
    """The same run as on the VM, launched on the GPU: each thread's indices (503-505) are the runner
    kernel's own, so vec_C matches the VM's."""
    args, reached = GEOMETRIES[geometry]
    r = _run_on_gpu([built[DIRECTLY_RUN], "cuda__vec_add", *args, "--maps", _vec_add_maps(tmp_path), "--json"])
    assert r.exit_code == 0, r.output
    assert _vec_c(r.stdout) == {i: 3 * i for i in range(1, reached)}


@pytest.mark.gpu
def test_run_on_gpu_cuda_gemm_on_the_gpu(built, tmp_path):
    """The GEMM on the GPU, its loop's budget counter in the kernel: the VM's C, no run cut."""
    r = _run_on_gpu([built[DIRECTLY_RUN], "cuda__gemm", "1", "1", "1", "1", str(GEMM_DIMS), str(GEMM_DIMS), "1",
                     "--maps", _gemm_maps(tmp_path), "--json"])
    assert r.exit_code == 0 and "loop budget" not in r.stderr, r.output
    assert _gemm_c(r.stdout) == {GEMM_DIMS * (1 << 16) * int(0.01 * (1 << 16))}
