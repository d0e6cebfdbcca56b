"""libegpu_shim.so built from this checkout, preloaded into C programs that reach a stand-in
libcuda.so.1 (tests/stub_driver) the ways real programs do: cuGetProcAddress like cudart, dlsym
like PyTorch (and dlvsym), direct linking like Triton's stub. The stand-in logs every call it receives."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STUB = ROOT / "tests" / "stub_driver"
MORE = ROOT / "tests" / "runtime_stub"
APPS = ["app_cudart", "app_dlsym", "app_dlvsym", "app_linked"]
CUDA_H = Path("/usr/local/cuda/include/cuda.h")


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> Path:
    """The shim (shim/build.py), the stand-in driver and the apps, built once per session."""
    d = tmp_path_factory.mktemp("shim")
    cc = ["gcc", "-O1", "-Wall", "-Werror", "-I", str(ROOT / "shim")]
    shim = subprocess.Popen([sys.executable, str(ROOT / "shim" / "build.py"), str(d)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    steps = [
        cc + ["-shared", "-fPIC", "-Wl,-Bsymbolic", "-Wl,-soname,libcuda.so.1",
              f"-Wl,--version-script={STUB / 'libcuda_stub.map'}", str(STUB / "libcuda_stub.c"), "-o", "libcuda.so.1"],
        cc + ["-shared", "-fPIC", str(STUB / "next_a.c"), "-o", "libnext_a.so"],
        cc + ["-shared", "-fPIC", str(STUB / "next_b.c"), "-o", "libnext_b.so"],
        cc + [str(STUB / "app_cudart.c"), "-o", "app_cudart", "-ldl"],
        cc + [str(STUB / "app_dlsym.c"), "-o", "app_dlsym", "-ldl"],
        cc + ["-DBY_DLVSYM", str(STUB / "app_dlsym.c"), "-o", "app_dlvsym", "-ldl"],
        cc + [str(STUB / "app_threads.c"), "-o", "app_threads", "-ldl", "-pthread"],
        cc + [str(STUB / "app_escape.c"), "-o", "app_escape", "-ldl"],
        cc + [str(STUB / "app_no_params.c"), "-o", "app_no_params", "-ldl"],
        cc + [str(STUB / "app_lookups.c"), "-o", "app_lookups", "-ldl", "-pthread"],
        cc + [str(STUB / "app_vfork_exec.c"), "-o", "app_vfork_exec", "-ldl", "-pthread"],
        cc + ["-shared", "-fPIC", str(STUB / "loader_busy.c"), "-o", "loader_busy.so"],
    ]
    procs = [subprocess.Popen(s, cwd=d) for s in steps]
    assert all(p.wait() == 0 for p in procs), [p.args for p in procs if p.returncode]
    os.symlink("libcuda.so.1", d / "libcuda.so")
    rpath = f"-Wl,-rpath,{d}"
    linked = [
        cc + [str(STUB / "app_linked.c"), "-o", "app_linked", f"-L{d}", "-lcuda", "-ldl", rpath],
        # --no-as-needed: app_nocuda uses nothing of libnext_b.so, yet RTLD_NEXT must find it there
        cc + [str(STUB / "app_nocuda.c"), "-o", "app_nocuda", "-Wl,--no-as-needed", f"-L{d}", "-lnext_a",
              "-lnext_b", "-ldl", rpath],
    ]
    procs = [subprocess.Popen(s, cwd=d) for s in linked]
    assert all(p.wait() == 0 for p in procs), [p.args for p in procs if p.returncode]
    # app_linked.c lists what it links by hand: exactly the symbols app_common.h resolves
    resolves = set(re.findall(r"GETV?\((?:\w+, )?\w+, \d+, \d+,\s*(\w+),", (STUB / "app_common.h").read_text()))
    assert set(re.findall(r'\{"(\w+)", ', (STUB / "app_linked.c").read_text())) == resolves
    out, err = shim.communicate()
    assert shim.returncode == 0, err
    assert Path(out.strip()) == d / "libegpu_shim.so"
    return d


@pytest.fixture(scope="session")
def full_stub(built, tmp_path_factory) -> Path:
    """The stand-in with the rest of a driver (runtime_stub/driver_more.c, driver_cow.c: contexts, copies,
    streams, events) and app_safety, in a directory of their own with the shim."""
    d = tmp_path_factory.mktemp("full_stub")
    cc = ["gcc", "-O1", "-Wall", "-Werror"]
    steps = [cc + ["-shared", "-fPIC", "-Wl,-Bsymbolic", "-Wl,-soname,libcuda.so.1", str(STUB / "libcuda_stub.c"),
                   str(MORE / "driver_more.c"), str(MORE / "driver_cow.c"), "-o", str(d / "libcuda.so.1")],
             # -rdynamic: the shim's malloc calls reach app_safety's own (its "oom" mode fails some)
             cc + ["-I", str(ROOT / "shim"), "-rdynamic", "-pthread", str(MORE / "app_safety.c"), "-o",
                   str(d / "app_safety"), "-ldl"]]
    for p in [subprocess.Popen(s) for s in steps]:
        assert p.wait() == 0, p.args
    os.symlink(built / "libegpu_shim.so", d / "libegpu_shim.so")
    return d


class Run:
    def __init__(self, proc: subprocess.CompletedProcess, log: Path) -> None:
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        lines = log.read_text().splitlines() if log.exists() else []
        self.pids = [ln.split(" ", 1)[0] for ln in lines]
        self.log = [ln.split(" ", 1)[1] for ln in lines]  # without the pid

    def lines(self, prefix: str) -> list[str]:
        return [ln[len(prefix) + 1:] for ln in self.stdout.splitlines() if ln.startswith(prefix + " ")]

    def rc(self) -> dict[str, int]:
        return {step: int(v) for step, v in (ln.split() for ln in self.lines("rc"))}

    def driver_calls(self) -> list[str]:
        """What reached the stand-in, without the lookups."""
        return [ln for ln in self.log if not ln.startswith("cuGetProcAddress")]


def run(built: Path, app: str, *args: str, preload: bool = True, runtime: str | None = "instrumenter",
        **env: str) -> Run:
    log = built / f"{app}.{os.getpid()}.{len(list(built.iterdir()))}.log"
    full = {k: v for k, v in os.environ.items() if not k.startswith("EGPU")}
    full.update(LD_LIBRARY_PATH=str(built), EGPU_STUB_LOG=str(log),
                PYTHONPATH=os.pathsep.join([str(STUB), str(ROOT)]))
    full.update(env)
    if runtime:
        full["EGPU_RUNTIME"] = runtime
    if preload:
        full["LD_PRELOAD"] = str(built / "libegpu_shim.so")
    proc = subprocess.run([str(built / app), *args], env=full, capture_output=True, text=True,
                          timeout=60, cwd=built)
    return Run(proc, log)


# The driver's own entry points the scenario uses; every other one it resolves must be a hook.
UNHOOKED = {"cuGetExportTable", "cuLinkDestroy", "cuModuleEnumerateFunctions",
            "cuMemAlloc"}  # cuMemAlloc: the v2000 twin with 32-bit pointers, not hooked

# cudart's lookups beyond the scenario's: (api, cudaVersion, flags) -> the symbol handed back.
PROC_ADDRESS = {
    ("cuGetProcAddress", 12000, 0): "libegpu_shim.so cuGetProcAddress_v2",
    ("cuGetProcAddress", 11030, 0): "libegpu_shim.so cuGetProcAddress",
    ("cuLaunchKernel", 12000, 1): "libegpu_shim.so cuLaunchKernel",  # LEGACY_STREAM
    ("cuLaunchKernel", 6000, 2): "libegpu_shim.so cuLaunchKernel",   # no _ptsz before 7000
    ("cuGraphAddKernelNode", 11000, 0): "libegpu_shim.so cuGraphAddKernelNode",  # v1 params struct
    ("cuMemFreeAsync", 12000, 2): "libegpu_shim.so cuMemFreeAsync_ptsz",
    ("cuGraphAddNode", 13000, 0): "libegpu_shim.so cuGraphAddNode_v2",  # the newest not newer
    ("cuStreamBeginCapture", 10000, 0): "libegpu_shim.so cuStreamBeginCapture",  # (stream): mode implied
    ("cuStreamBeginCapture", 10000, 2): "libegpu_shim.so cuStreamBeginCapture_ptsz",
    ("cuStreamBeginCapture", 12000, 2): "libegpu_shim.so cuStreamBeginCapture_v2_ptsz",
    ("cuStreamEndCapture", 12000, 0): "libegpu_shim.so cuStreamEndCapture",
    ("cuNoSuchFunction", 12000, 0): "none none",
}


@pytest.mark.parametrize("app", APPS)
def test_every_lookup_gets_the_abi_matching_hook(built, app):
    r = run(built, app)
    assert r.returncode == 0, r.stderr
    resolved = [re.match(r"(\w+) (\d+) (\d+) -> (.*)", ln).groups() for ln in r.lines("resolve")]
    scenario = resolved[len(PROC_ADDRESS):] if app == "app_cudart" else resolved
    assert len(scenario) == 62
    for api, version, flags, answer in scenario:
        lib, symbol = answer.split()
        assert lib == ("libcuda.so.1" if symbol in UNHOOKED else "libegpu_shim.so"), (api, answer)
        assert symbol.startswith(api)
    if app == "app_cudart":
        extra = {(a, int(v), int(f)): ans for a, v, f, ans in resolved[:len(PROC_ADDRESS)]}
        assert extra == PROC_ADDRESS
        # the driver saw every request with the version and flags the app asked for
        asked = [f"cuGetProcAddress_v2 symbol={a} version={v} flags={f}" for a, v, f, _ in resolved]
        assert [ln.split(" ->")[0] for ln in r.log if ln.startswith("cuGetProcAddress")] == asked


def expected_calls(instrumented: bool, beside: bool) -> list[str]:
    """What the stand-in receives. With the test instrumenter (instrumenter.py): instrumented PTX for
    every load and kernel_a launched with the launch id appended (kernelParams and buffer forms, graph
    nodes included); `beside`: kernel_b redirected to the module the runtime loaded beside (module 2).
    Without: the originals, unchanged (the wrapper reaches the driver as is)."""
    i = int(instrumented)
    b = 2 if beside else 1  # kernel_b's module
    lib = 3 if beside else 2

    def args(launch: int) -> str:
        return f"11,22,{launch}" if instrumented else "11,22"

    def load(original: str, module: int, kind: str, app_jit: str = "") -> str:
        """A load: the original call, or the replacement through cuModuleLoadDataEx (cuLibraryLoadData for a
        library) with the app's JIT options and egpu's error log (5, 6) in place of the app's own."""
        if not i:
            return f"{original} module={module} kind={kind} instrumented=0" + (f" jit={app_jit}" if app_jit else "")
        api = "cuLibraryLoadData" if original.startswith("cuLibrary") else "cuModuleLoadDataEx"
        kept = [o for o in app_jit.split(",") if o not in ("", "5", "6")]
        return f"{api} module={module} kind=ptx instrumented=1 jit={','.join(kept + ['5', '6'])}"
    return [
        "cuInit flags=0",
        load("cuModuleLoadData", 1, "ptx"),
        "cuModuleGetFunction module=1 name=kernel_a",
        "cuModuleGetFunction module=1 name=kernel_b",
        *(["cuModuleLoadData module=2 kind=ptx instrumented=0",
           "cuModuleGetFunction module=2 name=kernel_b"] if beside else []),
        f"cuLaunchKernel f=kernel_a@1 grid=1 block=32 stream=(nil) params={args(1)}",
        f"cuLaunchKernel_ptsz f=kernel_b@{b} grid=2 block=64 stream=0x5 params=33",
        f"cuLaunchKernel f=kernel_a@1 grid=3 block=32 stream=(nil) params=buffer:{16 + 8 * i}:{args(3)}",
        f"cuLaunchKernelEx_ptsz f=kernel_a@1 grid=4 block=128 stream=(nil) params={args(4)}",
        f"cuLaunchCooperativeKernel f=kernel_a@1 grid=5 block=32 stream=(nil) params={args(5)}",
        f"cuGraphAddKernelNode_v2 f=kernel_a@1 grid=6 block=32 stream=(nil) params={args(6)}",
        f"cuLaunchKernel f=kernel_a@1 grid=0 block=32 stream=(nil) params={args(7)}",
        load("cuLibraryLoadData", lib, "wrapper"),
        f"cuModuleGetFunction module={lib} name=kernel_a",
        "cuKernelGetFunction name=kernel_a",
        "cuKernelGetFunction name=kernel_a",
        # the stand-in counts parameters in PTX only, so the original wrapper's launch shows none
        f"cuLaunchKernel f=kernel_a@{lib}k grid=7 block=32 stream=(nil) params={args(8) if i else ''}",
        # an instrumented file load reaches the driver as cuModuleLoadDataEx of the replacement
        load("cuModuleLoad", lib + 1, "ptx"),
        f"cuModuleGetFunction module={lib + 1} name=kernel_a",
        load("cuModuleLoadDataEx", lib + 2, "ptx", app_jit="0,3,4,5,6"),
        load("cuModuleLoadFatBinary", lib + 3, "fatbin"),
        # a graph node's launch id is drawn once, when its parameters are set
        f"cuGraphExecKernelNodeSetParams_v2 f=kernel_a@{lib + 1} grid=9 block=32 stream=(nil) "
        f"params={args(9)}",
        # likewise a library file: cuLibraryLoadData of the replacement
        load("cuLibraryLoadFromFile", lib + 4, "ptx"),
        f"cuLibraryGetModule module={lib + 4}",
        f"cuModuleGetFunction module={lib + 4} name=kernel_a",
        f"cuLaunchKernelEx f=kernel_a@{lib + 4} grid=10 block=128 stream=(nil) params={args(10)}",
        f"cuLaunchCooperativeKernel_ptsz f=kernel_b@{b} grid=11 block=64 stream=(nil) params=33",
        f"cuGraphAddKernelNode f=kernel_a@1 grid=12 block=32 stream=(nil) params={args(12)}",
        f"cuGraphKernelNodeSetParams f=kernel_b@{b} grid=13 block=64 stream=(nil) params=33",
        # a node given by its CUkernel reaches the driver with the registered target as its function
        f"cuGraphKernelNodeSetParams_v2 f=kernel_a@{lib}k grid=14 block=32 stream=(nil) "
        f"params={args(14) if i else ''}",
        f"cuGraphExecKernelNodeSetParams f=kernel_a@1 grid=0 block=32 stream=(nil) params={args(15)}",
        f"cuGraphAddNode f=kernel_b@{b} grid=16 block=64 stream=(nil) params=33",
        f"cuGraphAddNode_v2 f=kernel_a@1 grid=17 block=32 stream=(nil) params={args(17)}",
        f"cuGraphNodeSetParams f=kernel_a@{lib}k grid=0 block=32 stream=(nil) params={args(18) if i else ''}",
        f"cuGraphExecNodeSetParams f=kernel_a@{lib + 1} grid=19 block=32 stream=(nil) "
        f"params=buffer:{16 + 8 * i}:{args(19)}",
        "cuGraphAddNode_v2 type=10",
        "cuGraphNodeSetParams type=10",
        "cuLinkCreate_v2",
        f"cuLinkAddData_v2 type=1 size={243 if i else 190} instrumented={i}",
        "cuLinkAddData_v2 type=0 size=4 instrumented=0",
        # likewise a PTX link input file: cuLinkAddData of the replacement
        "cuLinkAddData_v2 type=1 size=243 instrumented=1" if i else "cuLinkAddFile_v2 type=1 path=egpu_app.ptx",
        "cuLinkComplete",
        "cuLinkDestroy",
        "cuMemAlloc_v2 size=4096",
        "cuMemAllocAsync_ptsz",
        "cuMemHostAlloc",
        "cuMemCreate",
        "cuMemMap",
        "cuMemAllocHost_v2 size=500",
        "cuMemAllocPitch_v2",
        "cuMemAllocManaged",
        "cuMemAllocAsync",
        "cuMemAllocFromPoolAsync",
        "cuMemAllocFromPoolAsync_ptsz",
        "cuMemHostRegister_v2",
        "cuMemcpy_ptds size=64",
        "cuMemFree_v2 ptr=0x700000000000",
        "cuMemFree_v2 ptr=0",
        "cuMemFreeHost",
        "cuMemUnmap",
        "cuMemRelease",
        "cuMemFreeHost",
        "cuMemFreeAsync",
        "cuMemHostUnregister",
        f"cuModuleEnumerateFunctions module={lib + 3}",
        "cuOccupancyMaxActiveBlocksPerMultiprocessor name=kernel_a",
        "cuOccupancyMaxActiveBlocksPerMultiprocessor name=kernel_a",
        "cuFuncSetAttribute name=kernel_b",
        "cuKernelGetAttribute name=kernel_a",
        f"cuModuleGetFunction module={lib + 4} name=kernel_a",
        "cuKernelGetAttribute name=kernel_a",
        f"cuLaunchKernel f=kernel_a@{lib + 4}k grid=20 block=32 stream=(nil) params={args(20)}",
        f"cuLaunchKernel f=kernel_a@{lib + 4}k grid=21 block=32 stream=(nil) params={args(21)}",
        "cuGraphInstantiateWithFlags",
        "cuModuleLoad path=/nonexistent/egpu.ptx missing",
        "cuFuncGetAttribute attrib=99",
        "cuCtxSynchronize",
        "cuGetExportTable",
        "cuMemAlloc size=16",
        "cuModuleUnload module=1",
        f"cuLibraryUnload module={lib}",
    ]


# Every hooked call returns the driver's own result.
RESULTS = {"launch_zero_grid": 1, "graph_exec_set_v1_zero_grid": 1, "node_set_kernel_zero_grid": 1,
           "node_set_alloc": 801, "free_null": 1, "load_missing_file": 301, "func_attribute_bad": 1}
# A memory node reaches the driver as the app's own struct: its address comes back there, and the
# registered function in the word where a kernel node keeps one is left alone.
NODE_OUT = ["dptr=0x7e0000000000 first=fb"]
# What the app's own JIT options read back after its cuModuleLoadDataEx without egpu (the stand-in's info and
# empty error log, their sizes as written): a replacement, loaded or refused, leaves them just so
LOAD_EX_OPTIONS = ["0,3,4,5,6 32 47 1 [stand-in JIT: loaded with 32 registers at most] []"]


@pytest.mark.parametrize("app", APPS)
def test_driver_receives_instrumented_code_and_redirected_launches(built, app):
    r = run(built, app)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert r.driver_calls() == expected_calls(instrumented=True, beside=True)
    assert {k: v for k, v in r.rc().items() if v} == RESULTS
    assert r.lines("node_out") == NODE_OUT
    assert r.lines("load_ex_options") == LOAD_EX_OPTIONS


def waits(built: Path, env: dict[str, str]) -> tuple[list[str], list[str], list[str]]:
    """(app_linked's driver calls with no wait, the calls each added cuCtxSynchronize comes before when
    rings wait, the calls each added cuFuncLoad comes right after), the rest of the calls checked
    unchanged."""
    off = run(built, "app_linked", **env).driver_calls()
    r = run(built, "app_linked", EGPU_TEST_RINGS_WAIT="1", **env)
    assert r.returncode == 0, r.stderr
    waited, loaded, left = [], [], iter(off)   # what the shim added: the calls around it
    expected, previous = next(left), None
    for call in r.driver_calls():
        if call == expected:
            expected, previous = next(left, None), call
        elif call.startswith("cuFuncLoad "):
            loaded.append(f"{previous} -> {call}")
        else:
            assert call == "cuCtxSynchronize", (call, expected)
            waited.append(expected.split(" grid=")[0])
    assert expected is None
    return off, waited, loaded


def test_while_rings_wait_what_may_load_code_waits_for_the_context_first(built):
    """Under --trace with waiting rings a kernel may wait for egpu's reader, and a load of code meanwhile
    held the driver and the reader's copies up (H200, 2026-12-04g). With the wait on, a cuCtxSynchronize
    comes right before each load and unload, each cuModuleGetFunction and cuLibraryGetModule, the first
    cuKernelGetFunction of a kernel (not the same again), and, where the driver says a function is not
    loaded (cuFuncIsLoaded: a CUkernel's handle never is), before its first launch, occupancy or attribute
    call; before a CUkernel's attributes until it was seen loaded; before a graph's instantiation. A lookup
    that waited loads what it found (cuFuncLoad), so its launches need no wait (the stand-in has no
    cuModuleGetLoadingMode: lazy loading assumed); nothing else changes."""
    off, waited, loaded = waits(built, {})
    lib = 3   # the library the runtime's kernel_b module (2) comes before
    assert waited == [
        "cuModuleLoadDataEx module=1 kind=ptx instrumented=1 jit=5,6",
        "cuModuleGetFunction module=1 name=kernel_a", "cuModuleGetFunction module=1 name=kernel_b",
        # kernel_b is sent to the runtime's module, whose function no lookup of the app's loaded
        "cuLaunchKernel_ptsz f=kernel_b@2",
        # the CUkernel's launch: cuKernelGetFunction loaded it in this context
        f"cuLibraryLoadData module={lib} kind=ptx instrumented=1 jit=5,6", "cuKernelGetFunction name=kernel_a",
        f"cuModuleLoadDataEx module={lib + 1} kind=ptx instrumented=1 jit=5,6",
        f"cuModuleGetFunction module={lib + 1} name=kernel_a",
        f"cuModuleLoadDataEx module={lib + 2} kind=ptx instrumented=1 jit=0,3,4,5,6",
        f"cuModuleLoadDataEx module={lib + 3} kind=ptx instrumented=1 jit=5,6",
        f"cuLibraryLoadData module={lib + 4} kind=ptx instrumented=1 jit=5,6",
        f"cuLibraryGetModule module={lib + 4}",
        f"cuModuleGetFunction module={lib + 4} name=kernel_a",
        # functions cuModuleEnumerateFunctions handed out partly loaded: the first call that loads each
        "cuOccupancyMaxActiveBlocksPerMultiprocessor name=kernel_a", "cuFuncSetAttribute name=kernel_b",
        "cuKernelGetAttribute name=kernel_a",   # the library file's CUkernel; not the first library's
        f"cuLaunchKernel f=kernel_a@{lib + 4}k",   # its first launch in this context; not the second
        "cuGraphInstantiateWithFlags",
        "cuModuleLoad path=/nonexistent/egpu.ptx missing",   # a load that fails waits all the same
        *[c for c in off if c.startswith(("cuModuleUnload", "cuLibraryUnload"))]]
    assert loaded == [f"{lookup} -> cuFuncLoad name={lookup.rsplit('=', 1)[1]}" for lookup in (
        "cuModuleGetFunction module=1 name=kernel_a", "cuModuleGetFunction module=1 name=kernel_b",
        "cuKernelGetFunction name=kernel_a", f"cuModuleGetFunction module={lib + 1} name=kernel_a",
        f"cuModuleGetFunction module={lib + 4} name=kernel_a")]


def test_under_eager_loading_only_loads_and_unloads_wait(built):
    """CUDA_MODULE_LOADING=EAGER: the driver loads every kernel with its module, so lookups and first
    launches go on at once, and only loads and unloads wait while rings wait."""
    off, waited, loaded = waits(built, {"EGPU_STUB_LOADING": "1"})
    assert loaded == []
    assert waited and all(w.startswith(("cuModuleLoad", "cuLibraryLoad", "cuModuleUnload", "cuLibraryUnload"))
                          for w in waited), waited
    assert len(waited) == len([c for c in off if c.startswith(("cuModuleLoad", "cuLibraryLoad", "cuModuleUnload",
                                                               "cuLibraryUnload")) and "module=2 " not in c])


def test_without_the_shim_the_program_is_untouched(built):
    r = run(built, "app_dlsym", preload=False)
    assert r.returncode == 0
    assert r.driver_calls() == expected_calls(instrumented=False, beside=False)
    assert {k: v for k, v in r.rc().items() if v} == RESULTS
    assert r.lines("node_out") == NODE_OUT
    assert r.lines("load_ex_options") == LOAD_EX_OPTIONS


def test_without_an_instrumenter_everything_passes_through(built):
    r = run(built, "app_dlsym", runtime=None)
    assert r.returncode == 0, r.stderr
    assert r.driver_calls() == expected_calls(instrumented=False, beside=False)


@pytest.mark.parametrize("env, message", [
    ({"EGPU_TEST_FAIL": "1"}, "egpu: hook failed, the original call proceeds: RuntimeError"),
    ({"EGPU_TEST_REFUSE": "1"}, ""),
    ({}, "egpu: cannot load runtime no_such_module"),
])
def test_a_failing_runtime_leaves_the_original_path_working(built, env, message):
    runtime = "no_such_module" if not env else "instrumenter"
    r = run(built, "app_cudart", runtime=runtime, **env)
    assert r.returncode == 0, r.stderr
    assert message in r.stderr
    calls = [ln for ln in r.driver_calls() if " refused" not in ln]
    # kernel_b is still redirected to the module loaded beside whenever the runtime is there
    assert calls == expected_calls(instrumented=False, beside=runtime == "instrumenter")
    refused = [ln for ln in r.driver_calls() if " refused" in ln]
    # a refused module or library is asked for the driver's error log (5, 6), beside the app's own options; a
    # link input cannot be (cuLinkAddData takes no log options)
    assert refused == ([f"{api} refused{jit}" for api, jit in (
        ("cuModuleLoadDataEx", " jit=5,6"), ("cuLibraryLoadData", " jit=5,6"), ("cuModuleLoadDataEx", " jit=5,6"),
        ("cuModuleLoadDataEx", " jit=0,3,4,5,6"), ("cuModuleLoadDataEx", " jit=5,6"), ("cuLibraryLoadData", " jit=5,6"),
        ("cuLinkAddData_v2", ""), ("cuLinkAddData_v2", ""))] if "EGPU_TEST_REFUSE" in env else [])
    # the log reached the runtime; the app's options and its own error log are as it left them
    logs = [ln for ln in r.stderr.splitlines() if ln.startswith("egpu-test: ")]
    assert len(logs) == (6 if "EGPU_TEST_REFUSE" in env else 0)
    assert all(ln.endswith("refused: ptxas application ptx input, line 26; error   : stand-in refuses "
                           "'// egpu-refuse'") for ln in logs), logs
    assert r.lines("load_ex_options") == LOAD_EX_OPTIONS


def test_launch_counters_records_and_allocations(built):
    r = run(built, "app_cudart")
    # launch ids 12-19 went to graph nodes: drawn, never launched through a hook
    assert r.lines("stats") == ["launches=21 redirected=11 records=10 dropped=0 launches_a=5 launches_b=2"]
    assert r.lines("record") == [
        "id=2 api=17 f=b redirected=1 grid=2 block=64 stream=0x5",
        "id=3 api=17 f=a redirected=0 grid=3 block=32 stream=(nil)",
        "id=4 api=18 f=a redirected=0 grid=4 block=128 stream=(nil)",
        "id=5 api=19 f=a redirected=0 grid=5 block=32 stream=(nil)",
        "id=7 api=17 f=a redirected=0 grid=0 block=32 stream=(nil)",
        "id=8 api=17 f=kern redirected=0 grid=7 block=32 stream=(nil)",
        "id=10 api=18 f=? redirected=0 grid=10 block=128 stream=(nil)",
        "id=11 api=19 f=b redirected=1 grid=11 block=64 stream=(nil)",
        "id=20 api=17 f=? redirected=0 grid=20 block=32 stream=(nil)",
        "id=21 api=17 f=? redirected=0 grid=21 block=32 stream=(nil)",
    ]
    # kinds (egpu_shim.h): 1 device, 2 pitch (3 rows of 512), 3 managed, 4 async, 5 host,
    # 6 registered host, 7 VMM handle, 8 VMM mapping
    live = r.lines("allocs")[0].split()
    assert live[:2] == ["live", "n=12"]
    assert sorted(live[2:]) == sorted(["1:4096", "4:8192", "5:100", "7:2097152", "8:2097152", "5:500", "2:1536",
                                       "3:300", "4:200", "4:600", "4:700", "6:800"])
    after = r.lines("allocs")[1].split()
    assert after[:2] == ["after", "n=5"]
    assert sorted(after[2:]) == sorted(["4:8192", "2:1536", "3:300", "4:600", "4:700"])


def test_concurrent_launches_swaps_and_drains_lose_nothing(built):
    r = run(built, "app_threads", EGPU_STUB_LOG="")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("ok launches=80000")


def test_a_kernel_looked_up_again_reaches_python_once(built):
    """Libraries look kernels up on every call; only the first answer goes to Python (microseconds a
    call), and an unload forgets them all. The launch still runs what the first lookup routed."""
    r = run(built, "app_lookups", EGPU_STUB_LOG="")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split() == ["lookups", "first=1", "repeated=0", "after_unload=1", "redirected=1"]


def test_a_lookup_python_failed_on_is_asked_again(built):
    """A lookup whose handling raised is not remembered: the next one goes to Python, and routes."""
    r = run(built, "app_lookups", EGPU_STUB_LOG="", EGPU_TEST_FOUND_FAILS="1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split() == ["lookups", "first=1", "repeated=1", "after_unload=1", "redirected=1"]
    assert "egpu: hook failed, the original call proceeds: RuntimeError" in r.stderr


def test_a_lookup_while_the_first_is_in_python_waits_for_its_routing(built):
    """A lookup is remembered once Python has handled it: a second thread asking meanwhile goes to Python
    too, so its launch runs what the lookup routes (a memo made before would launch it unrouted)."""
    r = run(built, "app_lookups", "race", EGPU_STUB_LOG="", EGPU_TEST_FOUND_DELAY="0.3")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split() == ["race", "redirected=1"]


ESCAPED = {"plain": 0, "node": 1, "exec_node": 1, "unregistered": 0, "capture": 1, "capture_ptsz": 1,
           "capture_v2": 1, "capture_v2_ptsz": 1, "capture_to_graph": 1, "capture_to_graph_ptsz": 1,
           "after_captures": 0, "refused_begin": 0, "refused_end": 1, "second_capture": 1, "after_second": 0,
           "node_history": 1, "other_function": 0}


def test_targets_that_escape_the_launch_hooks(built):
    """egpu_shim_escaped (what the runtime asks before unloading a copy): a target given to a graph
    kernel node or launched while any capture was in progress escaped (every begin hook counts, ended
    and refused captures do not); plain launches leave it alone; the slot's history keeps the mark
    after the handle moved on."""
    r = run(built, "app_escape", EGPU_STUB_LOG="")
    assert r.returncode == 0, r.stdout + r.stderr
    assert dict((k, int(v)) for k, v in (ln.split() for ln in r.lines("escaped"))) == ESCAPED
    assert r.lines("begin") == []


def test_launches_that_name_no_parameters(built):
    """kernelParams NULL and no buffer in extra, to a target with a launch id: a kernel with parameters gets
    the application's NULL and extra, for the driver to refuse as it would without the shim (before, the shim
    read the NULL list and the job died of SIGSEGV); a kernel with none gets its launch id alone."""
    r = run(built, "app_no_params", EGPU_STUB_LOG="")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == ["null result=0 params=null extra=null",
                                     "pointer_only result=0 params=null extra=app",
                                     "ex_null result=0 params=null extra=null",
                                     "no_params result=0 params=4 extra=null",
                                     "ex_no_params result=0 params=5 extra=null"]


def test_child_processes_get_the_shim(built):
    r = run(built, "app_cudart", "--fork")
    assert r.returncode == 0, r.stderr
    assert "child exit=0" in r.stdout
    pids = dict.fromkeys(r.pids)
    assert len(pids) == 2
    child = list(pids)[1]  # the parent's first lookups come before the fork
    child_calls = [ln for pid, ln in zip(r.pids, r.log) if pid == child and not ln.startswith("cuGetProc")]
    assert child_calls == expected_calls(instrumented=True, beside=True)[:7]


def test_a_program_without_cuda_never_starts_python(built):
    r = run(built, "app_nocuda")
    assert r.returncode == 0, r.stderr
    # python=0: libpython is mapped (the shim links it) but never initialized;
    # next=2: dlsym(RTLD_NEXT) still resolves relative to its real caller through the shim's dlsym
    assert sorted(r.stdout.splitlines()) == ["child next=2 puts=1 python=0", "parent next=2 puts=1 python=0"]
    assert r.log == []


def test_a_vfork_child_execs_without_the_loaders_lock(built):
    """A vfork child shares its parent's memory while the parent's other threads run on, one of them maybe
    inside dlopen: the exec hooks' child must reach the real exec without the loader (no dlsym there), in a
    process that never started the runtime too, else it waits on that thread, which here waits on the parent."""
    r = run(built, "app_vfork_exec", str(built / "loader_busy.so"))
    assert r.returncode == 0, r.stderr
    assert r.stdout == "child exit=0 signal=0 lib=1\n"


@pytest.mark.gpu
@pytest.mark.parametrize("cudart, loading", [("static", "LAZY"), ("shared", "LAZY"), ("static", "EAGER")])
def test_gpu_nvcc_program_runs_the_instrumented_image(built, tmp_path, cudart, loading):
    """On the real driver: cudart's cuLibraryLoadData gets our replacement (the fatbin's PTX, marked),
    the driver JITs it, every launch goes through the hook, and the output is bit-identical."""
    exe = tmp_path / "gpu_app"
    subprocess.run(["nvcc", "-cudart", cudart, str(STUB / "gpu_app.cu"), "-o", str(exe)], check=True)
    loads = tmp_path / "loads"
    env = {k: v for k, v in os.environ.items() if not k.startswith("EGPU")}
    env["CUDA_MODULE_LOADING"] = loading
    plain = subprocess.run([str(exe)], env=env, capture_output=True, text=True, timeout=120)
    env.update(LD_PRELOAD=str(built / "libegpu_shim.so"), EGPU_RUNTIME="instrumenter",
               EGPU_TEST_LOADS=str(loads),
               PYTHONPATH=os.pathsep.join([str(STUB), str(ROOT), env.get("PYTHONPATH", "")]))
    shimmed = subprocess.run([str(exe)], env=env, capture_output=True, text=True, timeout=120)
    assert plain.returncode == shimmed.returncode == 0, shimmed.stderr
    checksum = plain.stdout.splitlines()[0]
    assert checksum.endswith("error 0")
    assert shimmed.stdout.splitlines()[0] == checksum
    assert shimmed.stdout.splitlines()[1].startswith("egpu launches 10 ")
    assert "LIBRARY_LOAD_DATA 0 0" in loads.read_text().splitlines()  # replacement loaded


ABI_CHECK = r"""
// cudaTypedefs.h declares the older ABIs (cuStreamBeginCapture v10000) for the driver's own build only
#define __CUDA_API_VERSION_INTERNAL
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cstddef>
#include <cstdio>
#include <type_traits>
namespace egpu {
#include "egpu_shim.h"
#include "egpu_cow.h"
#include "egpu_hostapi.h"
#define X(sym, api, ver, ptsz, params) typedef CUresult sym##_t params;
EGPU_HOOKS(X) EGPU_COW_HOOKS(X) EGPU_HOSTAPI_HOOKS(X)
#undef X
}
template <typename T> char cls() {
    return std::is_floating_point<T>::value ? 'f' : std::is_pointer<T>::value ? 'p' : 'i';
}
template <typename R, typename... A> void sig(const char *who, const char *name, R (*)(A...)) {
    std::printf("%s %s %c%zu", who, name, cls<R>(), sizeof(R));
    ((std::printf(" %c%zu", cls<A>(), sizeof(A))), ...);
    std::printf("\n");
}
// pasted inside X, so cuda.h's "#define cuMemAlloc cuMemAlloc_v2" cannot rename the api
#define PFN_SEL(base, ptsz) PFN_SEL_##ptsz(base)
#define PFN_SEL_0(base) base
#define PFN_SEL_1(base) base##_ptsz
#define PFN_SEL_2(base) base##_ptds
#define FIELD(t, f) std::printf("field %s.%s %zu %zu\n", #t, #f, offsetof(egpu::t, f), offsetof(::t, f));
int main() {
#define X(sym, api, ver, ptsz, params) sig("ours", #sym, (egpu::sym##_t *)nullptr); \
    sig("cuda", #sym, (PFN_SEL(PFN_##api##_v##ver, ptsz))nullptr);
    EGPU_HOOKS(X) EGPU_COW_HOOKS(X) EGPU_HOSTAPI_HOOKS(X)
    std::printf("size CUlaunchConfig %zu %zu\n", sizeof(egpu::CUlaunchConfig), sizeof(::CUlaunchConfig));
    std::printf("size params_v1 %zu %zu\n", sizeof(egpu::CUDA_KERNEL_NODE_PARAMS_v1),
                sizeof(::CUDA_KERNEL_NODE_PARAMS_v1));
    std::printf("size params_v2 %zu %zu\n", sizeof(egpu::CUDA_KERNEL_NODE_PARAMS_v2),
                sizeof(::CUDA_KERNEL_NODE_PARAMS_v2));
    std::printf("size params_v3 %zu %zu\n", sizeof(egpu::CUDA_KERNEL_NODE_PARAMS_v3),
                sizeof(::CUDA_KERNEL_NODE_PARAMS_v3));
    std::printf("size CUgraphNodeParams %zu %zu\n", sizeof(egpu::CUgraphNodeParams), sizeof(::CUgraphNodeParams));
    std::printf("size CUgraphEdgeData %zu %zu\n", sizeof(egpu::CUgraphEdgeData), sizeof(::CUgraphEdgeData));
    FIELD(CUlaunchConfig, hStream) FIELD(CUlaunchConfig, numAttrs)
    FIELD(CUDA_KERNEL_NODE_PARAMS_v2, kernelParams) FIELD(CUDA_KERNEL_NODE_PARAMS_v2, kern)
    FIELD(CUDA_KERNEL_NODE_PARAMS_v3, kernelParams) FIELD(CUDA_KERNEL_NODE_PARAMS_v3, kern)
    FIELD(CUgraphNodeParams, kernel) FIELD(CUgraphNodeParams, reserved2)
    std::printf("const %d %d %d %d %d %d %d %d %d\n", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, CU_JIT_INPUT_PTX,
                (int)CU_JIT_ERROR_LOG_BUFFER, (int)CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                (int)CU_GRAPH_NODE_TYPE_KERNEL, (int)(size_t)CU_LAUNCH_PARAM_BUFFER_POINTER,
                (int)(size_t)CU_LAUNCH_PARAM_BUFFER_SIZE, (int)CUDA_ERROR_NOT_FOUND,
                (int)CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}
"""


@pytest.mark.skipif(not CUDA_H.exists() or not shutil.which("g++"), reason="needs cuda.h and g++")
def test_hook_prototypes_match_cuda_h(tmp_path):
    """Every hook's parameters have the ABI (class and size) of cudaTypedefs.h's PFN_<api>_v<version>
    [_ptsz] -- which also pins each row's version -- and the structs the shim reads line up."""
    (tmp_path / "abi.cpp").write_text(ABI_CHECK)
    subprocess.run(["g++", "-std=c++17", "-I", str(CUDA_H.parent), "-I", str(ROOT / "shim"), "abi.cpp",
                    "-o", "abi"], cwd=tmp_path, check=True)
    out = subprocess.run([str(tmp_path / "abi")], capture_output=True, text=True, check=True).stdout
    ours = [ln.split(" ", 1)[1] for ln in out.splitlines() if ln.startswith("ours ")]
    cuda = [ln.split(" ", 1)[1] for ln in out.splitlines() if ln.startswith("cuda ")]
    assert len(ours) == 86 + 67 + 25 and ours == cuda
    for ln in out.splitlines():
        if ln.startswith(("size ", "field ")):
            a, b = ln.split()[-2:]
            assert a == b, ln
    interpose = (ROOT / "shim" / "interpose.c").read_text()
    constants = dict(re.findall(r"#define (CU\w+|CUDA_ERROR_NOT_FOUND) \(?\(?(?:void \*\))?(0x[0-9a-f]+|\d+)",
                                interpose))
    assert out.splitlines()[-1] == "const " + " ".join(str(int(constants[k], 0)) for k in (
        "CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM", "CU_JIT_INPUT_PTX", "CU_JIT_ERROR_LOG_BUFFER",
        "CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES", "CU_GRAPH_NODE_TYPE_KERNEL",
        "CU_LAUNCH_PARAM_BUFFER_POINTER",
        "CU_LAUNCH_PARAM_BUFFER_SIZE", "CUDA_ERROR_NOT_FOUND", "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"))


# hooks.read_image on images laid out in memory the way applications pass them.
def test_read_image_follows_wrappers_and_sizes_binaries(tmp_path):
    import cffi
    from egpu_preload.fatbin import FATBIN_MAGIC, WRAPPER_MAGIC, ImageKind
    from egpu_preload.runtime.hooks import read_image
    ffi = cffi.FFI()
    ptx = b".version 8.0\n.target sm_90\n.address_size 64\n"
    payload = ptx + bytes(-len(ptx) % 8)
    fat = struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, 64 + len(payload)) + struct.pack(
        "<HHIQIIHHIIIQQQ", 1, 0x101, 64, len(payload), 0, 0, 0, 8, 90, 0, 0, 0x11, 0, 0) + payload
    fat_buf = ffi.new("char[]", fat + b"trailing garbage")
    wrapper = ffi.new("char[]", struct.pack("<IIQQ", WRAPPER_MAGIC, 1, int(ffi.cast("uintptr_t", fat_buf)), 0))
    elf = bytearray(64)
    elf[:5] = b"\x7fELF\x02"
    struct.pack_into("<QQ", elf, 0x20, 0, 64)          # no program headers, section headers at 64
    struct.pack_into("<HHHH", elf, 0x36, 56, 0, 64, 2)  # two 64-byte section headers
    elf_buf = ffi.new("char[]", bytes(elf) + bytes(128) + b"after")
    ptx_buf = ffi.new("char[]", ptx)
    (tmp_path / "m.ptx").write_bytes(ptx)

    def read(buf, size=0, path=None):
        address = int(ffi.cast("uintptr_t", buf)) if buf is not None else 0
        return read_image(ffi, address, size, path, "MODULE_LOAD_DATA", 1)

    assert (read(wrapper).kind, read(wrapper).data) == (ImageKind.WRAPPER, fat)
    assert (read(fat_buf).kind, read(fat_buf).data) == (ImageKind.FATBIN, fat)
    assert (read(elf_buf).kind, len(read(elf_buf).data)) == (ImageKind.ELF, 192)
    assert (read(ptx_buf).kind, read(ptx_buf).data) == (ImageKind.PTX, ptx)
    assert read(ptx_buf, size=10).data == ptx[:10]
    assert (read(None, path=str(tmp_path / "m.ptx")).kind, read(None, path=str(tmp_path / "m.ptx")).data) == \
        (ImageKind.PTX, ptx)
    assert read(None, path=str(tmp_path / "missing")).data == b""


# ---- safety: bounded holds, memory, the GIL -----------------------------------------------------

def test_a_swap_whose_drain_never_ends_gives_up_and_launches_never_wait_longer(full_stub):
    """A kernel that never ends (the stand-in's cuCtxSynchronize held): the swap gives up at its hold
    limit (300 ms here) with EGPU_SWAP_TIMEOUT, launches waited at most that long and went on with the
    old target; once the work ends a swap goes through, and every launch ran the target of its side
    of the flip."""
    r = run(full_stub, "app_safety", "gate", runtime=None, EGPU_STUB_LOG="")
    assert r.returncode == 0, r.stdout + r.stderr
    code, ms = r.lines("timed_out")[0].split()
    assert int(code) == -3 and 300 <= float(ms) < 1500, r.stdout
    assert r.lines("swapped") == ["0"]
    words = r.lines("launches")[0].split()
    stats = dict(zip(words[1::2], words[2::2]))
    assert float(stats["max_ms"]) < 1500 and int(stats["old"]) > 0 and int(stats["new"]) > 0, r.stdout
    assert stats["wrong"] == "0", r.stdout


def test_a_capture_begun_while_rings_wait_never_meets_the_waits_synchronize(full_stub):
    """While rings wait, egpu_shim_idle synchronizes before code loads; a stream capture that begins while
    one runs would be invalidated by it (a synchronize during a capture is refused and ends the capture).
    The begin waits for the synchronize to end (held 200 ms here), and an idle after the begin
    synchronizes nothing; the capture ends whole."""
    r = run(full_stub, "app_safety", "capture", runtime=None)
    assert r.returncode == 0, r.stdout + r.stderr
    words = r.lines("capture")[0].split()
    got = dict(zip(words[0::2], words[1::2]))
    assert got["begin"] == "0" and got["end"] == "0" and got["idled_first"] == "1", r.stdout
    assert 100 <= float(got["ms"]) < 1500 and float(got["idle_after_ms"]) < 100, r.stdout
    assert not [c for c in r.driver_calls() if "refused" in c], r.driver_calls()


def test_a_launch_with_no_memory_for_its_launch_id_is_refused_not_launched_short(full_stub):
    """malloc fails for the longer parameter list of a target that takes a launch id: the launch (and a
    graph node) is answered CUDA_ERROR_OUT_OF_MEMORY and never reaches the driver with the id missing;
    with memory back, it launches."""
    r = run(full_stub, "app_safety", "oom", runtime=None)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.lines("oom") == ["buffer 2 params 2 node 2 after 0 refused 3"]
    launches = [ln for ln in r.driver_calls() if ln.startswith(("cuLaunchKernel", "cuGraphAddKernelNode"))]
    assert launches == ["cuLaunchKernel f=kernel_a@1 grid=4 block=32 stream=(nil) params=11,22"]


def test_a_free_in_a_full_allocation_table_ends(full_stub):
    """The allocation table full (a job with 65536 live allocations: VMM handles and mappings count one each):
    a free's backward shift looked for an empty slot after the freed one, found none and never ended, under
    the table's lock (the job hung). Every range freed, one registered again between, leaves none behind."""
    r = run(full_stub, "app_safety", "allocs", runtime=None, EGPU_STUB_LOG="")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.lines("allocs") == ["full 65536 less 65535 again 65536 empty 0"]


def test_a_restore_in_python_never_blocks_a_launch_that_holds_the_gil(full_stub):
    """The launch that restores a checkpoint calls Python; another thread launching meanwhile with the GIL
    held (ctypes.PyDLL, as PyTorch launches) waits for the restore without keeping the GIL from it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EGPU")}
    env.update(LD_LIBRARY_PATH=str(full_stub), LD_PRELOAD=str(full_stub / "libegpu_shim.so"), EGPU_STUB_LOG="",
               PYTHONPATH=str(ROOT))
    try:
        proc = subprocess.run([sys.executable, str(MORE / "app_restore.py")], env=env, capture_output=True,
                              text=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("deadlock: the restore waits for the GIL, the launch holding it waits for the restore")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split()
    assert lines[0] == "restored" and sorted(proc.stdout.splitlines()[1:]) == ["held 0", "released 0"], proc.stdout
