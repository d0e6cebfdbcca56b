"""The SASS back end's runtime side without a GPU: which back end serves each module kind under
--backend auto|ptx|sass, the programs a patched kernel runs, egpu-run's settling of the back end, and
jobs against the stand-in driver with no sanitizer, a missing one, and a stand-in sanitizer
(tests/sass_stub) that calls back from the stand-in driver (module loads, launches). Live flips:
tests/test_sass_live.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from egpu_preload.bpf import program as prog
from egpu_preload.bpf.asm import assemble
from egpu_preload.errors import EgpuError
from egpu_preload.runtime import config, dump, sass
from egpu_preload.runtime.probes import Probe
from egpu_preload.translate.sass_patch import patch_module
from stub_job import egpu_run
from translate_support import COUNTER, EMPTY

PROBES = Path(__file__).resolve().parent / "probes"

SASS_STUB = Path(__file__).parent / "sass_stub" / "libsanitizer_stub.c"   # calls back from the stand-in driver
# What standby subscribes to: module loads and unloads, not the resource domain's memory and stream callbacks.
STANDBY = ["sanitizerEnableCallback on=1 domain=3 cbid=9", "sanitizerEnableCallback on=1 domain=3 cbid=10"]
COUNTS = [prog.MapDef("counts", 2, 4, 8, 1)]
needs_ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas not installed")


@pytest.mark.parametrize("backend, has_ptx, served", [
    ("auto", True, "ptx"), ("auto", False, "sass"),
    ("ptx", True, "ptx"), ("ptx", False, None),
    ("sass", True, "sass"), ("sass", False, "sass"),
])
def test_choose(backend, has_ptx, served):
    assert sass.choose(backend, has_ptx) == served


def probe(sections: list[tuple[str, str, str]], path: str = "p.bpf.o") -> Probe:
    code = {"launch": assemble(EMPTY)}
    progs = [prog.Program(f"p{k}", f"{kind}/{glob}", prog.Attach(kind, glob, scope), code.get(kind, assemble(COUNTER)))
             for k, (kind, glob, scope) in enumerate(sections)]
    return Probe(Path(path), prog.BpfObject(path, progs, COUNTS), (), "")


@pytest.mark.parametrize("only, name, mask", [
    (None, "_Z6vecaddPKfS0_Pfi", 0b011),        # vec* by its demangled name, and *
    (None, "_Z5copykPKfPfi", 0b010),
    (None, "sm80_xmma_gemm_f32f32", 0b110),     # extern "C" names match as they are
    ("copy*", "_Z6vecaddPKfS0_Pfi", 0),         # --kernel selects before any glob
    ("copy*", "_Z5copykPKfPfi", 0b010),
])
def test_kernel_runs_the_programs_whose_globs_match(only, name, mask):
    p = probe([("entry", "vec*", "thread"), ("mem", "*", "thread"), ("launch", "*", "launch"),
               ("exit", "sm80_*", "warp")])
    b = sass.SassBackend(config.Config(kernel=only), [p], None, None)
    b.generations[3] = patch_module([p.obj])
    from egpu_preload.bpf.ctx import kernel_id
    assert b.kernel(3, name) == sass.KernelChoice(mask, kernel_id(name))
    assert b.kernel(2, name) == sass.KernelChoice(0, kernel_id(name))   # a generation it never had: no programs


def test_for_job_settles_the_back_end(tmp_path, monkeypatch):
    kernel_site, launch_only = probe([("entry", "*", "thread")]), probe([("launch", "*", "launch")])
    with pytest.raises(EgpuError, match="--backend cuda: must be one of auto, ptx, sass"):
        sass.for_job(config.Config(backend="cuda"), [kernel_site])
    with monkeypatch.context() as m:
        m.setattr(sass, "sanitizer_library", lambda: None)
        cfg, _ = sass.for_job(config.Config(backend="auto"), [launch_only], standby=True)
    assert cfg.backend == "ptx"   # nothing to patch and no sanitizer found: the shim never loads one
    assert cfg.backend_why.startswith("--backend auto ran the job as ptx: --live-sass, but no Compute Sanitizer")
    with_sanitizer = config.Config(backend="auto", sanitizer="/x/libsanitizer-public.so")
    cfg, _ = sass.for_job(with_sanitizer, [launch_only])
    assert cfg.backend == "ptx"   # no standby unless asked: CUPTI users need the driver's one tool slot
    assert "no probe given at its start patches kernels, and no --live-sass" in cfg.backend_why
    cfg, _ = sass.for_job(with_sanitizer, [launch_only], standby=True)
    assert cfg.backend == "auto"  # standby: subscribed from cuInit, for a kernel-site probe attached later
    cfg, _ = sass.for_job(config.Config(backend="ptx", sanitizer="/x/libsanitizer-public.so"), [kernel_site])
    assert (cfg.backend, cfg.backend_why) == ("ptx", None)   # asked for: nothing to explain
    cfg, _ = sass.for_job(config.Config(backend="sass", sanitizer="/x/libsanitizer-public.so"), [kernel_site])
    assert (cfg.backend, cfg.sanitizer) == ("sass", "/x/libsanitizer-public.so")
    assert sass.sanitizer_library({"CUDA_HOME": str(tmp_path)}) in (None, "/usr/local/cuda/" + sass.SANITIZER_LIB)
    (tmp_path / "compute-sanitizer").mkdir()
    (tmp_path / sass.SANITIZER_LIB).write_bytes(b"")
    assert sass.sanitizer_library({"CUDA_HOME": str(tmp_path)}) == str(tmp_path / sass.SANITIZER_LIB)
    assert sass.sanitizer_library({"EGPU_SANITIZER_LIB": "/a.so", "CUDA_HOME": str(tmp_path)}) == "/a.so"


# ---- jobs against the stand-in driver ----------------------------------------------------------------

@pytest.fixture(scope="module")
def sanitizer_stub(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sass_stub") / "libsanitizer-public.so"
    subprocess.run(["gcc", "-O1", "-Wall", "-Werror", "-shared", "-fPIC", str(SASS_STUB), "-o", str(out)], check=True)
    return out


def job(stub_job, tmp_path, probe_path: Path, backend: str, mode: str, sanitizer: str, *flags: str,
        app: tuple[str, str, str] = ("2", "32", "0"), **env: str):
    """egpu-run --keep --backend B [FLAGS] app_vec MODE K N STATUS (``app``): (the one dump, the logged calls)."""
    log = tmp_path / "driver.log"
    r = egpu_run(["--keep", "--backend", backend, *flags, "-p", str(probe_path), str(stub_job.app), mode, *app],
                 stub_job.env(log, EGPU_SANITIZER_LIB=sanitizer, **env))
    assert r.returncode == 0, r.stderr
    session = Path(next(ln for ln in r.stderr.splitlines() if "session kept" in ln).split(" in ")[1])
    (doc,) = dump.read_all(session)
    calls = [ln.split(" ", 1)[1] for ln in log.read_text().splitlines()] if log.exists() else []
    return doc, [c for c in calls if not c.startswith("cuGetProcAddress")]


def launches(calls: list[str]) -> list[str]:
    return [c.split("params=")[1] for c in calls if c.startswith("cuLaunchKernel")]


@pytest.mark.parametrize("backend, mode, status, served_by, params, state", [
    ("ptx", "cubin", "SASS only", "", "", "off"),          # the stand-in's cubin kernel takes no params
    ("auto", "cubin", "SASS only", "", "", "failed"),
    ("auto", "module", "instrumented", "ptx", "11,22,32", "failed"),   # PTX needs no sanitizer: counted, no id
    ("sass", "module", "SASS only", "", "11,22,32", "failed"),           # never the PTX back end
])
def test_without_a_sanitizer(stub_job, probe_obj, tmp_path, backend, mode, status, served_by, params, state):
    doc, calls = job(stub_job, tmp_path, probe_obj("count"), backend, mode, str(tmp_path / "missing.so"))
    (m,) = doc["modules"]
    assert (m["status"], m["backend"]) == (status, served_by)
    assert launches(calls)[0] == params
    assert doc["sass"]["state"] == state
    if state == "failed":
        assert doc["sass"]["error"].startswith("cannot load the sanitizer: ") and "missing.so" in doc["sass"]["error"]
        assert doc["sass"]["serving"] in (None, f"sanitizer failed: {doc['sass']['error']}")


@needs_ptxas
@pytest.mark.parametrize("backend, mode", [("auto", "cubin"), ("sass", "module"), ("sass", "library")])
def test_with_the_stand_in_sanitizer(stub_job, probe_obj, tmp_path, sanitizer_stub, backend, mode):
    """--in-kernel: count's counter runs in the patch (tests/test_launch_eval.py: counted at the launch)."""
    doc, calls = job(stub_job, tmp_path, probe_obj("count"), backend, mode, str(sanitizer_stub), "--in-kernel")
    assert doc["sass"]["state"] == "subscribed" and doc["sass"]["serving"] == "", doc["sass"]
    san = [c for c in calls if c.startswith("sanitizer")]
    # subscribed in cuInit, before the driver started; enter patches only (count has a kprobe only); the
    # launch domain once the module is patched (launch callbacks cost every launch of the process)
    assert san[:3] == ["sanitizerSubscribe cb=1", *STANDBY]
    assert calls.index("sanitizerSubscribe cb=1") < calls.index("cuInit flags=0")
    patched = [c for c in san if c.startswith(("sanitizerPatch", "sanitizerEnableDomain on=1 domain=5"))]
    assert [c.split(" name=")[0] for c in patched] == ["sanitizerPatchInstructions id=1", "sanitizerPatchModule -",
                                                      "sanitizerEnableDomain on=1 domain=5"]
    runs = [c for c in calls if c.startswith("run ")]
    assert len(runs) == 2 and all(" enter=egpu_sass_block_enter_" in r for r in runs), runs
    (m, patched_kernels) = doc["modules"]   # the load, then its kernels as they launched
    assert (m["status"], m["backend"]) == ("instrumented", "sass")
    assert patched_kernels["api"] == "SANITIZER_MODULE"
    assert [k[1:] for k in patched_kernels["kernels"]] == [["instrumented", "SASS patch"]]
    plain = "" if mode == "cubin" else "11,22,32"
    assert launches(calls) == [plain, plain]   # the kernel as it was: no launch id appended
    assert any(c.startswith("cuMemcpyHtoD") for c in calls)   # the table block the patches read
    assert doc["probes"][0]["maps"] == [{"values": [bytes(8)]}]   # maps made and read back at exit


TWO_KERNELS = r"""
extern "C" __global__ void vecadd(long *a, long *b, long n) { a[threadIdx.x] += b[threadIdx.x] + n; }
extern "C" __global__ void scale(float *a, float k) { a[threadIdx.x] *= k; }
__device__ __noinline__ float twice(float x) { return 2 * x; }   // a device function: no kernel
extern "C" __global__ void halve(float *a) { a[threadIdx.x] = twice(a[threadIdx.x]) / 4; }
"""


@pytest.fixture(scope="module")
def two_kernel_cubin(tmp_path_factory) -> Path:
    """nvcc's cubin holding vecadd (app_vec's kernel), scale and halve: what the sanitizer reports at load."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    d = tmp_path_factory.mktemp("cubin")
    (d / "k.cu").write_text(TWO_KERNELS)
    subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-rdc=true", "-o", str(d / "k.cubin"), str(d / "k.cu")],
                   check=True)
    return d / "k.cubin"


@needs_ptxas
@pytest.mark.parametrize("glob, patched, runs", [
    ("vecadd", True, True),      # the kernel that launches
    ("scale", True, False),      # another kernel of its module: the whole module is patched, vecadd gets no record
    ("nothing_here", False, False),   # no kernel of the module: left as it is, no launch callback at all
    ("twice", False, False),     # a device function is no kernel
])
def test_a_module_is_patched_only_where_a_probe_selects_a_kernel(stub_job, tmp_path, sanitizer_stub,
                                                                 two_kernel_cubin, glob, patched, runs):
    from egpu_preload.bpf.compile import compile_probe
    src = tmp_path / "p.bpf.c"
    src.write_text((PROBES / "count.bpf.c").read_text().replace('SEC("kprobe/*")', f'SEC("kprobe/{glob}")'))
    doc, calls = job(stub_job, tmp_path, compile_probe(src, tmp_path / "p.bpf.o"), "sass", "elf",
                     str(sanitizer_stub), "--in-kernel", APP_VEC_CUBIN=str(two_kernel_cubin))
    san = [c for c in calls if c.startswith("sanitizer")]
    assert any(c.startswith("sanitizerPatchModule") for c in san) == patched, san
    assert ("sanitizerEnableDomain on=1 domain=5" in san) == patched   # no launch callbacks with nothing patched
    assert doc["sass"]["modules_unselected"] == (not patched) and doc["sass"]["patched_now"] == patched
    if patched:
        records = [c for c in calls if c.startswith("run ")]
        assert len(records) == 2 and all((" record=-" in r) != runs for r in records), records
    # every kernel of the module is named at its load, with what runs in it; the device function is not
    (kernels, _) = doc["modules"]   # the module as the sanitizer saw it load, then the load call
    assert kernels["status"] == ("instrumented" if patched else "untouched")
    assert sorted((k[0], k[1]) for k in kernels["kernels"]) == sorted(
        (name, "instrumented" if name == glob else "untouched") for name in ("vecadd", "scale", "halve"))
    assert doc["probes"][0]["maps"] == [{"values": [bytes(8)]}]


@needs_ptxas
def test_launches_on_another_gpu_get_no_record(stub_job, probe_obj, tmp_path, sanitizer_stub):
    """app_vec devices launches the library's kernel on device 0, where the maps are, then on device 1, and a
    module loaded on device 1: the patches there get no record (the tables' memory is device 0's, an illegal
    address for device 1's kernels), the launches are counted, and egpu-run says they ran without probes."""
    log = tmp_path / "driver.log"
    r = egpu_run(["--keep", "--backend", "sass", "--in-kernel", "-p", str(probe_obj("count")), str(stub_job.app),
                  "devices", "2", "32", "0"], stub_job.env(log, EGPU_SANITIZER_LIB=str(sanitizer_stub)))
    assert r.returncode == 0, r.stderr
    session = Path(next(ln for ln in r.stderr.splitlines() if "session kept" in ln).split(" in ")[1])
    (doc,) = dump.read_all(session)
    runs = [ln.split(" ", 1)[1] for ln in log.read_text().splitlines() if " run f=" in ln]
    assert [("record=-" not in run) for run in runs] == [True] * 2 + [False] * 4, runs
    assert (doc["sass"]["launches"], doc["sass"]["probed"], doc["sass"]["other_context"]) == (6, 2, 4)
    assert (f"egpu-run: pid {doc['pid']}: 4 launches of SASS-patched kernels in another context than the maps' "
            "(another GPU's) ran without probes") in r.stderr.splitlines()


@pytest.mark.parametrize("fail, call", [("sanitizerSubscribe", "sanitizerSubscribe"),
                                        ("sanitizerEnableCallback:2", "sanitizerEnableCallback")])
def test_a_failing_subscription_is_reported(stub_job, probe_obj, tmp_path, sanitizer_stub, fail, call):
    doc, calls = job(stub_job, tmp_path, probe_obj("count"), "auto", "cubin", str(sanitizer_stub),
                     EGPU_STUB_SANITIZER_FAIL=fail)
    assert doc["sass"]["state"] == "failed"
    assert doc["sass"]["error"] == f"{call} failed: 7 (SANITIZER_ERROR_OUT_OF_MEMORY)"
    assert doc["modules"][0]["status"] == "SASS only"


def test_launch_probes_alone_leave_the_sanitizer_in_standby(stub_job, probe_obj, tmp_path, sanitizer_stub):
    """With --live-sass: subscribed from cuInit (a probe attached later needs it), but nothing patched and
    no launch callbacks."""
    doc, calls = job(stub_job, tmp_path, probe_obj("launch"), "auto", "cubin", str(sanitizer_stub), "--live-sass")
    san = [c for c in calls if c.startswith("sanitizer")]
    assert san == ["sanitizerSubscribe cb=1", *STANDBY]
    assert doc["sass"]["state"] == "subscribed" and doc["sass"]["serving"] == sass.NO_PROGRAMS
    assert doc["modules"][0]["status"] == "SASS only"


def test_without_live_sass_launch_probes_never_load_the_sanitizer(stub_job, probe_obj, tmp_path, sanitizer_stub):
    """No kernel-site probe and no --live-sass: the job runs as --backend ptx, so CUPTI users in it
    (torch.profiler, --durations) find the driver's tool slot free."""
    doc, calls = job(stub_job, tmp_path, probe_obj("launch"), "auto", "cubin", str(sanitizer_stub))
    assert not [c for c in calls if c.startswith("sanitizer")]
    assert doc["sass"]["state"] == "off" and doc["modules"][0]["status"] == "SASS only"


def test_backend_ptx_never_loads_the_sanitizer(stub_job, probe_obj, tmp_path, sanitizer_stub):
    doc, calls = job(stub_job, tmp_path, probe_obj("count"), "ptx", "cubin", str(sanitizer_stub))
    assert not [c for c in calls if c.startswith("sanitizer")]
    assert doc["sass"]["state"] == "off"


def test_a_live_generation_before_the_first_sass_load_stands():
    """A probe attached live before any module the SASS back end serves had loaded: that load must not
    commit the start-up probes over it (prepare says ready, stages nothing)."""
    b = sass.SassBackend(config.Config(), [probe([("entry", "*", "thread")])], None, None)
    b.current = 2
    assert b.prepare(90) == "" and b.staged is None


def test_the_first_sass_load_patches_the_probes_attached_then():
    """A probe detached live before the first module the SASS back end serves loads: that load patches
    what is attached then (here nothing), not the start-up probes."""
    probes = [probe([("entry", "*", "thread")])]
    b = sass.SassBackend(config.Config(), probes, None, None)
    probes[:] = []   # Live's detach changes the runtime's list in place
    assert b.prepare(90) == sass.NO_PROGRAMS and b.staged is None


def test_a_probe_set_staged_again_is_not_translated_again(tmp_path, monkeypatch):
    """Live cycles stage the same probe sets over and over: each set's patch module is translated once
    (the image comes from the session's cache, the shim gets a fresh generation each time)."""
    import cffi
    ffi = cffi.FFI()
    ffi.cdef("struct egpu_sass_generation { const void *image; size_t size; unsigned int classes;"
             " const char *const *entries; unsigned long long image_id, id, tables; const char *const *names;"
             " const unsigned long long *masks, *kernel_ids; size_t nkernels; int evaluates; };")

    class Lib:
        staged: list = []

        def egpu_sass_stage(self, g) -> int:
            self.staged.append((int(g.id), int(g.nkernels)))
            return 0

        def egpu_sass_kernel_names(self, out, size) -> int:
            return 0
    translated = []
    monkeypatch.setattr(sass, "patch_module", lambda objects: translated.append(objects) or patch_module(objects))
    monkeypatch.setattr(sass, "build_image", lambda ptx, sm, cache: tmp_path / "image")
    (tmp_path / "image").write_bytes(b"\x7fELF")
    a, b = probe([("entry", "*", "thread")], "a.bpf.o"), probe([("mem", "*", "thread")], "b.bpf.o")
    backend = sass.SassBackend(config.Config(session=tmp_path), [], ffi, Lib())
    backend.kernel(0, "_Z6vecaddPKfS0_Pfi")   # a kernel seen before: its answer goes with every generation
    for objects in ([a.obj], [a.obj, b.obj], [a.obj], [a.obj, b.obj]):
        backend.stage(objects, 90, None)
    assert translated == [[a.obj], [a.obj, b.obj]]
    assert Lib.staged == [(1, 1), (2, 1), (3, 1), (4, 1)]


def test_a_generation_is_staged_with_every_loaded_modules_kernels(tmp_path, monkeypatch):
    """The shim names the kernels of the modules loaded so far (egpu_sass_kernel_names): each goes into the
    staged generation's table with its programs, so the flip weighs those modules without asking Python."""
    import cffi
    ffi = cffi.FFI()
    ffi.cdef("struct egpu_sass_generation { const void *image; size_t size; unsigned int classes;"
             " const char *const *entries; unsigned long long image_id, id, tables; const char *const *names;"
             " const unsigned long long *masks, *kernel_ids; size_t nkernels; int evaluates; };")
    names = b"vecadd\0scale\0vecadd\0"   # a name in two modules counts once

    class Lib:
        table: dict = {}

        def egpu_sass_stage(self, g) -> int:
            self.table.update({ffi.string(g.names[k]).decode(): int(g.masks[k]) for k in range(g.nkernels)})
            return 0

        def egpu_sass_kernel_names(self, out, size) -> int:
            if out != ffi.NULL:
                ffi.memmove(out, names, min(size, len(names)))
            return len(names)
    monkeypatch.setattr(sass, "build_image", lambda ptx, sm, cache: tmp_path / "image")
    (tmp_path / "image").write_bytes(b"\x7fELF")
    backend = sass.SassBackend(config.Config(session=tmp_path), [], ffi, Lib())
    backend.stage([probe([("entry", "vecadd", "thread")]).obj], 90, None)
    assert Lib.table == {"vecadd": 1, "scale": 0}


def test_restaging_hashes_no_kernel_id_again(tmp_path, monkeypatch):
    """Every stage lists every loaded kernel; each one's id is hashed once per process. Hashing them all
    again at each stage (a pure-Python FNV of a long mangled name, thousands of them in a PyTorch job) made
    the live cycles' stage step 89 ms on the H200 (2026-12-04d), where the goal for the whole swap is 50."""
    import cffi
    from egpu_preload.bpf.ctx import kernel_id
    ffi = cffi.FFI()
    ffi.cdef("struct egpu_sass_generation { const void *image; size_t size; unsigned int classes;"
             " const char *const *entries; unsigned long long image_id, id, tables; const char *const *names;"
             " const unsigned long long *masks, *kernel_ids; size_t nkernels; int evaluates; };")
    names = [f"_ZN2at6native{k}kernelEv" for k in range(300)]
    listed = b"".join(n.encode() + b"\0" for n in names)

    class Lib:
        tables: list = []

        def egpu_sass_stage(self, g) -> int:
            self.tables.append({ffi.string(g.names[k]).decode(): (int(g.masks[k]), int(g.kernel_ids[k]))
                                for k in range(g.nkernels)})
            return 0

        def egpu_sass_kernel_names(self, out, size) -> int:
            if out != ffi.NULL:
                ffi.memmove(out, listed, min(size, len(listed)))
            return len(listed)
    hashed = []
    monkeypatch.setattr(sass, "kernel_id", lambda name: hashed.append(name) or kernel_id(name))
    monkeypatch.setattr(sass, "build_image", lambda ptx, sm, cache: tmp_path / "image")
    (tmp_path / "image").write_bytes(b"\x7fELF")
    backend = sass.SassBackend(config.Config(session=tmp_path), [], ffi, Lib())
    for glob in ("*native7kernel*", "*native1*", "*native7kernel*"):
        backend.stage([probe([("entry", glob, "thread")]).obj], 90, None)
    assert sorted(hashed) == sorted(names)
    assert [sum(m for m, _ in t.values()) for t in Lib.tables] == [1, 111, 1]
    assert all(t[n][1] == kernel_id(n) for t in Lib.tables for n in names)


def test_a_kernels_programs_are_weighed_once_per_set_of_globs(monkeypatch):
    """Each (globs, kernel) is matched once: stages weigh every loaded kernel, and live cycles stage the
    same sets again. Two sets whose programs differ only in their globs still get their own answers."""
    calls = []
    monkeypatch.setattr(sass, "matches", lambda glob, name: calls.append((glob, name)) or glob == name)
    backend = sass.SassBackend(config.Config(), [], None, None)
    one = patch_module([probe([("entry", "step", "thread")]).obj])
    two = patch_module([probe([("entry", "step2", "thread")]).obj])
    backend.generations = {1: one, 2: two}
    assert [backend.kernel(g, k).mask for g in (1, 2, 1, 2) for k in ("step", "step2")] == [1, 0, 0, 1] * 2
    assert len(calls) == 4


@needs_ptxas
@pytest.mark.parametrize("mode, unload", [("module", "cuModuleUnload"), ("library", "cuLibraryUnload")])
def test_launch_callbacks_go_off_with_the_last_patched_module(stub_job, probe_obj, tmp_path, sanitizer_stub,
                                                              mode, unload):
    """A program that unloads its patched module (here from a C exit handler, after Py_FinalizeEx, as cuDNN's
    static destructors do): once the unload has returned, the launch callbacks, which cost every launch of
    the process, are off; the unload callback itself made no sanitizer call."""
    app = Path(__file__).parent / "runtime_stub" / "app_vec.py"
    log = tmp_path / "driver.log"
    r = egpu_run(["--keep", "--backend", "sass", "-p", str(probe_obj("count")), "python3", str(app), mode, "2",
                  "32", "0", "late"], stub_job.env(log, EGPU_SANITIZER_LIB=str(sanitizer_stub)))
    assert r.returncode == 0, r.stderr
    calls = [ln.split(" ", 1)[1] for ln in log.read_text().splitlines()]
    at = next(i for i, c in enumerate(calls) if c.startswith(unload))
    on, off = "sanitizerEnableDomain on=1 domain=5", "sanitizerEnableDomain on=0 domain=5"
    assert on in calls[:at] and off not in calls[:at]
    assert [c for c in calls[at + 1:] if c.startswith("sanitizer")] == [off]
