"""Programs evaluated at the launch (translate/launch_eval.py): which qualify, what one run adds, how the
host's lanes merge into the device's values (runtime/launch_counts.py), and jobs against the stand-in driver
and sanitizer where the shim counts a kernel's launches instead of patching it (SASS back end) or instrumenting it
(PTX back end), until a stream capture makes the runtime put them into the kernels (shim/interpose.c, eval_*)."""

from __future__ import annotations

import json
import re
import struct
import sys
from pathlib import Path

import cffi
import pytest

from egpu_preload.bpf.compile import compile_probe
from egpu_preload.bpf.elf import load_object
from egpu_preload.maps import MapsState
from egpu_preload.runtime.launch_counts import LaunchCounts
from egpu_preload.runtime.probes import load_probe, verify_each
from egpu_preload.translate.launch_eval import evaluated
from stub_job import MORE, egpu_run
from test_sass_live import ThreadedJob, stand_ins, step_cubins  # noqa: F401  (fixtures)
from test_sass_runtime import job, launches, needs_ptxas, sanitizer_stub, two_kernel_cubin  # noqa: F401  (fixtures)

ARRAY = ("struct {{ __uint(type, BPF_MAP_TYPE_{kind}); __uint(max_entries, {n}); __type(key, __u32);"
         " __type(value, {value}); }} {name} SEC(\".maps\");\n")


def _source(tmp_path: Path, body: str, maps: str = "") -> Path:
    src = tmp_path / "p.bpf.c"
    src.write_text('#include "egpu.bpf.h"\n'
                   + (maps or ARRAY.format(kind="ARRAY", n=4, value="__u64", name="counts"))
                   + body + '\nchar LICENSE[] SEC("license") = "GPL";\n')
    return compile_probe(src, tmp_path / "p.bpf.o")


def _evaluated(tmp_path: Path, body: str, maps: str = "") -> dict[str, tuple[str, list[tuple]]]:
    """{program name: (scope, [(map name, entry, offset, width, delta)])} of those that qualify."""
    obj = load_object(_source(tmp_path, body, maps))
    found = evaluated(obj, verify_each(obj, str(obj.path)))
    return {obj.programs[i].name: (e.scope, [(obj.maps[a.map].name, a.entry, a.offset, a.width, a.delta)
                                             for a in e.adds]) for i, e in found.items()}


BUMP = """
static __always_inline void bump(__u32 key, __u64 by)
{
	__u64 *n = bpf_map_lookup_elem(&counts, &key);

	if (n)
		__sync_fetch_and_add(n, by);
}
"""


@pytest.mark.parametrize("body, expected", [
    # the suite's entry/exit counter: both programs, one slot each
    (BUMP + 'SEC("kprobe/*") int in(void *c) { bump(0, 1); return 0; }\n'
            'SEC("kretprobe/*") int out(void *c) { bump(1, 1); return 0; }',
     {"in": ("thread", [("counts", 0, 0, 8, 1)]), "out": ("thread", [("counts", 1, 0, 8, 1)])}),
    # scopes are kept; several adds, a loop with a known bound, a subtraction (an add modulo 2^64)
    (BUMP + 'SEC("kprobe.warp/k*") int w(void *c) { for (int i = 0; i < 3; i++) bump(i, 2); return 0; }\n'
            'SEC("kretprobe.block/*") int b(void *c) { bump(3, -1); return 0; }',
     {"w": ("warp", [("counts", 0, 0, 8, 2), ("counts", 1, 0, 8, 2), ("counts", 2, 0, 8, 2)]),
      "b": ("block", [("counts", 3, 0, 8, (1 << 64) - 1)])}),
    # a key past the array's end finds nothing on every run: nothing to add, nothing to run
    (BUMP + 'SEC("kprobe/*") int past(void *c) { bump(9, 1); return 0; }', {"past": ("thread", [])}),
    # a context field, a helper, a value read, an add whose old value is used: run in the kernel
    (BUMP + 'SEC("kprobe/*") int ctx(struct egpu_ctx *c) { bump(0, c->grid[0]); return 0; }', {}),
    (BUMP + 'SEC("kprobe/*") int sm(void *c) { bump(bpf_get_sm_id() & 3, 1); return 0; }', {}),
    (BUMP + 'SEC("kprobe/*") int now(void *c) { bump(0, bpf_ktime_get_ns()); return 0; }', {}),
    ('SEC("kprobe/*") int rd(void *c) { __u32 k = 0; __u64 *n = bpf_map_lookup_elem(&counts, &k);'
     ' if (n && *n < 5) __sync_fetch_and_add(n, 1); return 0; }', {}),
    ('SEC("kprobe/*") int old(void *c) { __u32 k = 0; __u64 *n = bpf_map_lookup_elem(&counts, &k);'
     ' return n ? __sync_fetch_and_add(n, 1) : 0; }', {}),
    # a memory probe (its count follows the accesses) and the entry probe sharing its map: both in the kernel
    (BUMP + 'SEC("kprobe/*") int in(void *c) { bump(0, 1); return 0; }\n'
            'SEC("egpu/mem/*") int mem(void *c) { bump(1, 1); return 0; }', {}),
    # a launch probe keeps the map on the host copy: the entry probe sharing it runs in the kernel
    (BUMP + 'SEC("kprobe/*") int in(void *c) { bump(0, 1); return 0; }\n'
            'SEC("egpu/launch/*") int l(void *c) { bump(1, 1); return 0; }', {}),
    # a map of its own is not shared: the entry probe qualifies beside a memory probe
    (BUMP + 'SEC("kprobe/*") int in(void *c) { bump(0, 1); return 0; }\n'
            'SEC("egpu/mem/*") int mem(void *c) { __sync_fetch_and_add(&bytes, 4); return 0; }',
     {"in": ("thread", [("counts", 0, 0, 8, 1)])}),
])
def test_programs_that_a_launch_evaluates(tmp_path, body, expected):
    body = body if "bytes" not in body else "__u64 bytes;\n" + body
    assert _evaluated(tmp_path, body) == expected


def test_global_data_and_narrow_lanes(tmp_path):
    """A .bss counter, and a struct value of two u32 lanes: each lane's add, modulo 2^32."""
    maps = "struct pair { __u32 a, b; };\n" + ARRAY.format(kind="ARRAY", n=2, value="struct pair", name="pairs")
    body = """__u64 total;
SEC("kprobe/*") int in(void *c)
{
	__u32 k = 1;
	struct pair *p = bpf_map_lookup_elem(&pairs, &k);

	__sync_fetch_and_add(&total, 3);
	if (p) {
		__sync_fetch_and_add(&p->a, 1);
		__sync_fetch_and_add(&p->b, 0xffffffff);
	}
	return 0;
}"""
    assert _evaluated(tmp_path, body, maps) == {
        "in": ("thread", [("pairs", 1, 0, 4, 1), ("pairs", 1, 4, 4, 0xFFFFFFFF), ("p.bss", 0, 0, 8, 3)])}


@pytest.mark.parametrize("maps", [
    ARRAY.format(kind="PERCPU_ARRAY", n=4, value="__u64", name="counts"),   # rows by SM: which SM is unknown
    ARRAY.format(kind="HASH", n=4, value="__u64", name="counts"),
])
def test_only_plain_arrays_are_counted(tmp_path, maps):
    assert _evaluated(tmp_path, BUMP + 'SEC("kprobe/*") int in(void *c) { bump(0, 1); return 0; }', maps) == {}


def test_adds_of_two_widths_to_one_map_stay_in_the_kernel(tmp_path):
    body = ('SEC("kprobe/*") int a(void *c) { __u32 k = 0; __u64 *n = bpf_map_lookup_elem(&counts, &k);'
            ' if (n) __sync_fetch_and_add(n, 1); return 0; }\n'
            'SEC("kretprobe/*") int b(void *c) { __u32 k = 1; __u32 *n = bpf_map_lookup_elem(&counts, &k);'
            ' if (n) __sync_fetch_and_add(n, 1); return 0; }')
    assert _evaluated(tmp_path, body) == {}


def test_host_lanes_add_into_the_device_values_modulo_their_width(tmp_path):
    maps = "struct pair { __u32 a, b; };\n" + ARRAY.format(kind="ARRAY", n=3, value="struct pair", name="pairs")
    body = ('SEC("kprobe/*") int in(void *c) { __u32 k = 2; struct pair *p = bpf_map_lookup_elem(&pairs, &k);'
            ' if (p) { __sync_fetch_and_add(&p->a, 5); __sync_fetch_and_add(&p->b, 1); } return 0; }')
    probe = load_probe(_source(tmp_path, body, maps))
    ffi = cffi.FFI()
    counts = LaunchCounts(ffi, probe)
    (a, b) = counts.adds(0)
    assert [x[1:] for x in (a, b)] == [(5, 4, 0), (1, 4, 0)] and int(ffi.cast("uintptr_t", b[0])) % 4 == 0
    ffi.cast("unsigned int *", a[0])[0] = 5 * 3
    ffi.cast("unsigned int *", b[0])[0] = 3
    state = MapsState(probe.obj.maps)
    state[0].values[2][:] = struct.pack("<II", 0xFFFFFFFF, 7)   # the device's: a wraps
    state[0].values[0][:] = struct.pack("<II", 4, 4)             # untouched by the host
    counts.add_into(state)
    assert [struct.unpack("<II", v) for v in state[0].values] == [(4, 4), (0, 0), (14, 10)]


# ---- jobs: the stand-in driver's vecadd, from nvcc's cubin, served by the SASS back end -------------------

SCOPED = BUMP + """
SEC("kprobe/vecadd") int threads(void *c) { bump(0, 1); return 0; }
SEC("kprobe.warp/vecadd") int warps(void *c) { bump(1, 2); return 0; }
SEC("kretprobe.block/vecadd") int blocks(void *c) { bump(2, 5); return 0; }
SEC("kprobe/scale") int other(void *c) { bump(3, 1); return 0; }
"""


def _values(doc: dict) -> list[int]:
    return [struct.unpack("<Q", v)[0] for v in doc["probes"][0]["maps"][0]["values"]]


@needs_ptxas
def test_launches_count_and_the_kernel_is_left_unpatched(stub_job, tmp_path, sanitizer_stub, two_kernel_cubin):
    """3 launches of 4 blocks of 32 threads: 384 threads, 12 warps, 12 blocks; scale never launches. No patch at
    all (nothing of the module runs in it), and the kernels say how their probes run."""
    doc, calls = job(stub_job, tmp_path, _source(tmp_path, SCOPED), "sass", "elf", str(sanitizer_stub),
                     APP_VEC_CUBIN=str(two_kernel_cubin), app=("3", "100", "0"))
    assert _values(doc) == [384, 12 * 2, 12 * 5, 0]
    san = [c for c in calls if c.startswith("sanitizer")]
    assert not any(c.startswith(("sanitizerPatchModule", "sanitizerEnableDomain on=1 domain=5")) for c in san), san
    (kernels, _) = doc["modules"]
    assert sorted(tuple(k[:3]) for k in kernels["kernels"]) == [
        ("halve", "untouched", "no probe matches"), ("scale", "instrumented", "counted at the launch"),
        ("vecadd", "instrumented", "counted at the launch")]


@needs_ptxas
def test_kernel_selects_what_launches_count(stub_job, tmp_path, sanitizer_stub, two_kernel_cubin):
    """--kernel halve: vecadd's launches add nothing, as its patch would run nothing."""
    doc, calls = job(stub_job, tmp_path, _source(tmp_path, SCOPED), "sass", "elf", str(sanitizer_stub),
                     "--kernel", "halve", APP_VEC_CUBIN=str(two_kernel_cubin), app=("3", "100", "0"))
    assert _values(doc) == [0, 0, 0, 0]
    (kernels, _) = doc["modules"]
    assert {k[0]: k[1] for k in kernels["kernels"]}["vecadd"] == "untouched"


@needs_ptxas
def test_in_kernel_patches_them_instead(stub_job, tmp_path, sanitizer_stub, two_kernel_cubin):
    doc, calls = job(stub_job, tmp_path, _source(tmp_path, SCOPED), "sass", "elf", str(sanitizer_stub),
                     "--in-kernel", APP_VEC_CUBIN=str(two_kernel_cubin), app=("3", "100", "0"))
    assert _values(doc) == [0, 0, 0, 0]   # the stand-in runs no patch
    runs = [c for c in calls if c.startswith("run ")]
    assert len(runs) == 3 and all(" enter=egpu_sass_block_enter_" in r and "record=-" not in r for r in runs), runs


@needs_ptxas
def test_a_capture_ends_the_counting_in_one_flip(stub_job, tmp_path, sanitizer_stub, two_kernel_cubin):
    """2 launches counted, then a stream capture: before it begins, one flip patches vecadd, so the 2 captured
    launches (replayed unseen later) and the 2 after run the patch; none of them is counted on the host."""
    doc, calls = job(stub_job, tmp_path, _source(tmp_path, SCOPED), "sass", "elf", str(sanitizer_stub),
                     APP_VEC_CUBIN=str(two_kernel_cubin), app=("2", "64", "capture"))
    assert _values(doc) == [2 * 64, 2 * 2 * 2, 2 * 2 * 5, 0]
    begin = calls.index(next(c for c in calls if c.startswith("cuStreamBeginCapture")))
    patched = [i for i, c in enumerate(calls) if c.startswith("sanitizerPatchModule")]
    first_runs = [i for i, c in enumerate(calls) if c.startswith("run ")]
    assert len(patched) == 1 and patched[0] < begin and len(first_runs) == 4 and first_runs[0] > begin, calls
    assert all("record=-" not in calls[i] for i in first_runs), [calls[i] for i in first_runs]
    assert doc["sass"]["flips"] == 2   # the start-up generation, then the one that patches them


@needs_ptxas
def test_counting_never_starts_after_a_capture(stub_job, tmp_path, sanitizer_stub, two_kernel_cubin):
    """The module loads while a stream captures (app_vec capture): the start-up probes are patched at once."""
    doc, calls = job(stub_job, tmp_path, _source(tmp_path, SCOPED), "sass", "capture", str(sanitizer_stub))
    assert _values(doc) == [0, 0, 0, 0]
    assert any(c.startswith("sanitizerPatchModule") for c in calls)


@needs_ptxas
def test_a_live_attach_ends_the_counting_in_its_flip(stub_job, stand_ins, step_cubins, probe_obj, tmp_path,
                                                    monkeypatch):
    """Four threads launching step and step2 (32 threads each) under count.bpf.o: counted, nothing patched. A live
    attach's flip patches count's program beside the new probe's, so the count at exit is exactly the launches
    before the flip times 32 (the stand-in runs no patch): none counted twice, none after."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with ThreadedJob(stub_job, stand_ins, tmp_path, flags=("--json", "-p", str(probe_obj("count"))),
                     APP_CUBINS=step_cubins) as job:
        assert not [c for c in job.calls() if c.startswith("sanitizerPatchModule")]
        a = job.client.request("attach", probe=probe_obj("hash_count").read_bytes(), name="hash_count")
        assert (a["sass"]["modules_patched"], a["sass"]["modules"]) == (2, 2), a["sass"]
        job.wait_runs()
        out = job.finish()
    doc = json.loads(next(ln for ln in out.splitlines() if ln.startswith('{"time"')))
    launched = int(re.search(r"launches (\d+) failed 0", out).group(1))
    assert launched > a["launches"] > 20 and doc["maps"]["counts"]["value"] == 32 * a["launches"], out[-2000:]


# ---- jobs: the stand-in driver's vecadd from PTX text, served by the PTX back end --------------------------

def _loads(calls: list[str], images: Path) -> list[tuple[int, bool]]:
    """(index in ``calls``, whether its PTX takes egpu's launch id: instrumented) of every module or library
    load, from the PTX the stand-in was given (EGPU_STUB_IMAGES)."""
    found = [(i, int(re.search(r" module=(\d+)", c).group(1))) for i, c in enumerate(calls)
             if c.startswith(("cuModuleLoad", "cuLibraryLoad")) and " module=" in c]
    return [(i, "__egpu_launch_id" in (images / f"module-{m}.ptx").read_text()) for i, m in found]


@pytest.mark.parametrize("mode", ["module", "library"])
def test_ptx_launches_count_and_the_module_loads_as_it_is(stub_job, tmp_path, mode):
    """The PTX back end leaves out what the launch gives: the application's image loads as it is, its kernel
    takes no launch id, and the 3 launches of 128 threads add 384, 12 warps x 2 and 12 blocks x 5."""
    doc, calls = job(stub_job, tmp_path, _source(tmp_path, SCOPED), "ptx", mode, str(tmp_path / "missing.so"),
                     app=("3", "100", "0"), EGPU_STUB_IMAGES=str(tmp_path))
    assert _values(doc) == [384, 12 * 2, 12 * 5, 0]
    assert [loaded for _, loaded in _loads(calls, tmp_path)] == [False], calls
    assert [len(p.split(",")) for p in launches(calls)] == [3] * 3, calls
    (m,) = doc["modules"]
    assert (m["status"], m["backend"]) == ("instrumented", "ptx")
    assert [tuple(k[:3]) for k in m["kernels"]] == [("vecadd", "instrumented", "counted at the launch")]


def test_ptx_kernel_selects_what_launches_count(stub_job, tmp_path):
    doc, calls = job(stub_job, tmp_path, _source(tmp_path, SCOPED), "ptx", "module", str(tmp_path / "missing.so"),
                     "--kernel", "halve", app=("3", "100", "0"))
    (m,) = doc["modules"]
    assert m["status"] == "untouched" and m["kernels"] == [["vecadd", "untouched", "not selected by halve"]]
    assert not any(p["maps"] for p in doc["probes"])   # nothing counted, nothing instrumented: all zero


def test_ptx_in_kernel_instruments_them_instead(stub_job, tmp_path):
    doc, calls = job(stub_job, tmp_path, _source(tmp_path, SCOPED), "ptx", "module", str(tmp_path / "missing.so"),
                     "--in-kernel", app=("3", "100", "0"), EGPU_STUB_IMAGES=str(tmp_path))
    assert _values(doc) == [0, 0, 0, 0]   # the stand-in runs no PTX
    assert [loaded for _, loaded in _loads(calls, tmp_path)] == [True], calls
    assert [len(p.split(",")) for p in launches(calls)] == [4] * 3, calls   # the launch id after its own three


@pytest.mark.parametrize("mode", ["module", "library"])
def test_ptx_capture_ends_the_counting_in_one_flip(stub_job, tmp_path, mode):
    """2 launches counted, then a stream capture: before it begins, one flip loads a copy of the module
    instrumented with the programs, which the 2 captured launches (replayed unseen later) and the 2 after run
    (they pass the launch id); none of them is counted on the host."""
    doc, calls = job(stub_job, tmp_path, _source(tmp_path, SCOPED), "ptx", mode, str(tmp_path / "missing.so"),
                     app=("2", "64", "capture"), EGPU_STUB_IMAGES=str(tmp_path))
    assert _values(doc) == [2 * 64, 2 * 2 * 2, 2 * 2 * 5, 0]
    begin = calls.index(next(c for c in calls if c.startswith("cuStreamBeginCapture")))
    loads = _loads(calls, tmp_path)
    assert [loaded for _, loaded in loads] == [False, True] and loads[1][0] < begin, calls
    assert [len(p.split(",")) for p in launches(calls)] == [3, 3, 4, 4, 4, 4], calls


def test_ptx_a_kernel_the_rewriter_refuses_is_not_counted(stub_job, tmp_path):
    """vecadd uses a name in egpu's reserved prefix, so the rewriter will not put the probes into it: its launches
    count nothing either (a flip that ended the counting would change no count), and the report says why, as
    refused.cu's does on the GPU (tests/test_e2e_gpu.py)."""
    ptx = tmp_path / "refused.ptx"
    ptx.write_text(".version 8.0\n.target sm_90\n.address_size 64\n\n.visible .entry vecadd(\n\t.param .u64 a,\n"
                   "\t.param .u64 b,\n\t.param .u64 n\n)\n{\n\t.reg .b64 %__egpu_mine<2>;\n\tret;\n}\n")
    doc, calls = job(stub_job, tmp_path, _source(tmp_path, SCOPED), "ptx", "module", str(tmp_path / "missing.so"),
                     app=("3", "100", "0"), APP_VEC_PTX=str(ptx))
    (m,) = doc["modules"]
    assert m["kernels"] == [["vecadd", "failed", "kernel already uses the reserved prefix __egpu"]], m
    assert not any(p["maps"] for p in doc["probes"]), doc["probes"]


# ---- the flip that ends the PTX counting, seen from handles the application looked up before it -------------

def _flip_job(stub_job, tmp_path, probe: Path, scenario: str) -> tuple[str, list[str]]:
    """egpu-run -p PROBE app_flip.py SCENARIO: (its stdout, the stand-in's log without lookups)."""
    log = tmp_path / "driver.log"
    r = egpu_run(["-p", str(probe), sys.executable, str(MORE / "app_flip.py"), scenario], stub_job.env(log))
    assert r.returncode == 0, r.stderr
    calls = [ln.split(" ", 1)[1] for ln in log.read_text().splitlines()]
    return r.stdout, [c for c in calls if not c.startswith("cuGetProcAddress")]


@pytest.mark.parametrize("scenario", ["shared", "shared-after", "shared-kernel", "shared-function"])
def test_ptx_more_shared_memory_allowed_to_a_handle_is_allowed_to_its_copy(stub_job, tmp_path, probe_obj, scenario):
    """vecadd allowed 64 KiB of dynamic shared memory (cudaFuncSetAttribute) before the capture's flip, or after it,
    or a library's CUkernel allowed it by cuKernelSetAttribute, or the function cuKernelGetFunction gave it by
    cuFuncSetAttribute (where the copy's CUkernel takes it through its own function in the maps' context):
    its launches after the flip run the instrumented copy, which must be allowed as much, or the driver refuses them
    (a kernel launched with more than 48 KiB unless its function was allowed it): the application broke at its
    first graph capture. The 2 launches before the flip counted, 32 threads each."""
    out, calls = _flip_job(stub_job, tmp_path, probe_obj("count"), scenario)
    assert not [c for c in calls if c.startswith("launch refused")], calls
    assert f"app_flip {scenario} result=0" in out and "@counts: 64" in out, out
    assert [len(p.split(",")) for p in launches(calls)] == [3, 3, 4, 4], calls   # the copy's take the launch id


def test_ptx_module_state_set_before_the_flip_is_the_copys(stub_job, tmp_path, probe_obj):
    """vecadd's module bumps its __device__ state by its __constant__ increment at every launch (the stand-in): the
    increment set to 3 through the application's symbol address before the capture, 2 launches on each side of the
    flip, the state read back through that address: 12, the copy having taken both over in the flip."""
    out, calls = _flip_job(stub_job, tmp_path, probe_obj("count"), "state")
    assert "app_flip state result=0 state=12" in out and "@counts: 64" in out, out
    assert [len(p.split(",")) for p in launches(calls)] == [3, 3, 4, 4], calls


def test_ptx_a_module_of_another_device_keeps_its_image_at_the_flip(stub_job, tmp_path, probe_obj):
    """The maps are on device 0; vecadd's module is loaded and launched on device 1, where its kernels run without
    probes (its table is never filled). The capture's flip must not serve it from a copy loaded in the maps'
    context: device 1's launches of a device 0 module are refused (the application broke), and if run they would
    read device 0's maps."""
    out, calls = _flip_job(stub_job, tmp_path, probe_obj("count"), "devices")
    assert not [c for c in calls if c.startswith("launch refused")], calls
    assert "app_flip devices result=0" in out and "@counts: 0" in out, out
    assert {re.search(r" f=(\S+) ", c)[1] for c in calls if c.startswith("cuLaunchKernel")} == {"vecadd@2"}, calls


@pytest.mark.parametrize("scenario", ["enumerate", "enumerate-library"])
def test_ptx_a_handle_no_lookup_returned_counts_and_runs_the_programs_after_the_flip(stub_job, tmp_path, probe_obj,
                                                                                    scenario):
    """kernel_a's handle from cuModuleEnumerateFunctions (a library's: cuLibraryEnumerateKernels), which no hooked
    lookup returns: the runtime routed it as
    the module loaded, so its 2 launches before the capture count (32 threads each) and the flip moves it to the
    instrumented copy. Unknown, its first launch ended the counting, and the flip left it running the application's
    image, loaded without the programs: none of its 4 launches counted (under --in-kernel, and before the PTX back
    end counted at the launch, that image had them)."""
    out, calls = _flip_job(stub_job, tmp_path, probe_obj("count"), scenario)
    assert f"app_flip {scenario} result=0" in out and "@counts: 64" in out, out
    assert [len(p.split(",")) for p in launches(calls)] == [3, 3, 4, 4], calls   # 4: the copy's, with the launch id


def test_ptx_the_copy_is_compiled_with_the_applications_jit_options(stub_job, tmp_path, probe_obj):
    """vecadd's module loaded with CU_JIT_MAX_REGISTERS (option 0) = 32. The application's image is compiled with it
    (the shim adds its log options to the application's), and so is the copy the capture's flip loads (the shim
    hands the load's numeric options to the runtime: egpu_shim_load_jit): without it, on a GPU its kernels may take
    more registers than blocks of 1024 threads allow (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES), and options such as
    CU_JIT_FMA, CU_JIT_FTZ or CU_JIT_PREC_DIV, dropped the same way, change what the kernels compute."""
    out, calls = _flip_job(stub_job, tmp_path, probe_obj("count"), "registers")
    assert "app_flip registers result=0" in out, out
    loads = [re.search(r" jit=([\d,]+)", c) for c in calls if c.startswith("cuModuleLoadDataEx")]
    assert len(loads) == 2 and all(m and "0" in m[1].split(",") for m in loads), calls

