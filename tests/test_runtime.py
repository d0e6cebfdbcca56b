"""The in-process runtime and what surrounds it: the config the launcher hands over, the job's
environment, the exit dump, and the instrumenter inside programs that reach the stand-in driver
(stub_job.py): what the driver receives and what each process leaves behind."""

from __future__ import annotations

import os
import re
import stat
import sys
import types
from pathlib import Path

import msgpack
import pytest

from egpu_preload.bpf import program as prog
from egpu_preload.errors import EgpuError
from egpu_preload.maps import MapsState, TraceRecord
from egpu_preload.runtime import config, dump, job
from egpu_preload.translate.devmaps import SPREAD, TRACE_BYTES
from egpu_preload.translate.rewrite import instrument, probe_specs
from stub_job import MORE, egpu_run


# ---- config -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg", [
    config.Config(),
    config.Config((Path("/a/x.bpf.o"),), Path("/run/egpu/s1"), "vec*", 2),
    config.Config((Path("/a/x.bpf.o"), Path("/b/y z.bpf.o")), None, None, 0),
    config.Config((Path("/a:b/x:y.bpf.o"), Path("/c\nd/\u00e9 \udcff.bpf.o"), Path("/e;f/'\"].bpf.o"))),
    config.Config((), Path("/run/egpu/s2"), None, 0, durations=True, ptxas="/opt/ptxas"),
    config.Config(backend="sass", sanitizer="/opt/san/libsanitizer-public.so"),
    config.Config(backend="ptx"),
    config.Config(backend="ptx", backend_why="--backend auto ran the job as ptx: no probe"),
    config.Config(restore=Path("/ckpt/step 40")),
    config.Config(restore=Path("/ckpt/step 40"), restore_other_build=True),
    config.Config(durations=True, timeline=True),
    config.Config(mirror=0.0),
    config.Config(mirror=0.25),
    config.Config(launch_vm="python"),
    config.Config(trace=Path("/t/out trace.parquet"), on_full="wait"),
    config.Config(uprobes={"on_call": "libcudart.so:cudaLaunchKernel", "b": "/a:b/lib.so:f"}),
    config.Config(early_start=True),
    config.Config(in_kernel=True),
])
def test_config_survives_the_environment(cfg):
    env = config.to_env(cfg)
    assert set(env) == {config.PROBES, config.SESSION, config.KERNEL, config.LOG, config.DURATIONS,
                        config.PTXAS, config.BACKEND, config.BACKEND_WHY, config.SANITIZER, config.RESTORE,
                        config.RESTORE_OTHER_BUILD, config.TIMELINE,
                        config.MIRROR, config.LAUNCH_VM, config.TRACE, config.ON_FULL, config.UPROBES,
                        config.EARLY_START, config.IN_KERNEL}
    assert config.from_env(env) == cfg


@pytest.mark.parametrize("env, cfg", [
    ({}, config.Config()),
    ({config.LOG: "loud", config.KERNEL: ""}, config.Config()),
    ({config.PROBES: '["/p.bpf.o"]'}, config.Config((Path("/p.bpf.o"),))),
    ({config.PROBES: ""}, config.Config()),
    ({config.MIRROR: "soon"}, config.Config()),
    ({config.LAUNCH_VM: "jit"}, config.Config()),
    ({config.MIRROR: "-1"}, config.Config()),
])
def test_config_defaults_for_missing_or_odd_values(env, cfg):
    assert config.from_env(env) == cfg


@pytest.mark.parametrize("value, reason", [
    ("/a.bpf.o:/b.bpf.o", "EGPU_PROBES is not JSON"),      # the old os.pathsep list: never split, never dropped
    ('{"p": 1}', "EGPU_PROBES is not a JSON list of paths"),
    ('["/a.bpf.o", 3]', "EGPU_PROBES is not a JSON list of paths"),
    ('[""]', "EGPU_PROBES is not a JSON list of paths"),
])
def test_malformed_probe_list_is_an_error_not_a_job_without_probes(value, reason):
    with pytest.raises(EgpuError, match=reason):
        config.from_env({config.PROBES: value})


# ---- the job's environment --------------------------------------------------------------------------

@pytest.mark.parametrize("base, preload, pythonpath_head", [
    ({}, "/s/libegpu_shim.so", []),
    ({"LD_PRELOAD": "/x/libfoo.so", "PYTHONPATH": "/mine"}, "/s/libegpu_shim.so /x/libfoo.so", ["/mine"]),
])
def test_job_env(base, preload, pythonpath_head):
    cfg = config.Config((Path("/p/c.bpf.o"),), Path("/run/s"), None, 1)
    env = job.job_env(cfg, Path("/s/libegpu_shim.so"), {"PATH": "/bin", **base})
    assert env["LD_PRELOAD"] == preload
    assert env["EGPU_RUNTIME"] == "egpu_preload.runtime.instrumenter"
    assert env["CUPY_COMPILE_WITH_PTX"] == "1"
    assert env["PATH"] == "/bin"
    assert config.from_env(env) == cfg
    # the job's own paths, then only the folder whose _cffi_backend lets the shim's Python start
    assert env["PYTHONPATH"].split(os.pathsep) == pythonpath_head + [str(job.JOB_PYTHONPATH)]
    paths = env["EGPU_IMPORT_DIRS"].split(os.pathsep)   # the shim's start-up code puts these after the job's own
    import _cffi_backend
    import egpu_preload
    import msgpack as m
    for module in (egpu_preload.__file__, _cffi_backend.__file__, m.__file__):
        assert any(module.startswith(p + os.sep) for p in paths), module


def test_resolve_program_fails_as_a_shell_does(tmp_path):
    exe = tmp_path / "tool"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    plain = tmp_path / "data"
    plain.write_text("")
    env = {"PATH": str(tmp_path)}
    assert job.resolve_program("tool", env) == str(exe)
    assert job.resolve_program(str(exe), env) == str(exe)
    for name, status in [("missing", 127), (str(tmp_path / "missing"), 127), (str(plain), 126),
                         (str(tmp_path), 126)]:
        with pytest.raises(job.ProgramError) as e:
            job.resolve_program(name, env)
        assert e.value.exit_status == status, name


# ---- the dump ---------------------------------------------------------------------------------------

MAPS = [prog.MapDef("arr", prog.MAP_ARRAY, 4, 8, 3), prog.MapDef("pcpu", prog.MAP_PERCPU_ARRAY, 4, 4, 2),
        prog.MapDef("h", prog.MAP_HASH, 8, 4, 16), prog.MapDef("lru", prog.MAP_LRU_HASH, 4, 4, 4),
        prog.MapDef("rb", prog.MAP_RINGBUF, 0, 0, 4096), prog.MapDef("perf", prog.MAP_PERF_EVENT_ARRAY, 4, 4, 0)]


def filled_state() -> MapsState:
    st = MapsState(MAPS)
    st[0].update((1).to_bytes(4, "little"), (7).to_bytes(8, "little"))
    st[1].update((1).to_bytes(4, "little"), (5).to_bytes(4, "little"), cpu=131)
    st[2].update(b"key-0001", b"\x01\x00\x00\x00")
    st[3].update(b"abcd", b"wxyz")
    st[4].output(b"record one")
    st[5].output(17, b"perf")
    st.trace.append(TraceRecord(b"wide %u\n\0", (16, 0, 0), 3))
    return st


def contents(st: MapsState):
    return ([sorted(s.items()) for s in st.storages], sorted(st[1].per_cpu), st[4].records, st[4].drops,
            st[5].records, [(t.fmt, t.args, t.cpu) for t in st.trace])


def test_every_map_kind_survives_the_dump(tmp_path):
    st = filled_state()
    doc = {"pid": 4242, "probes": [dump.state_contents(st)]}
    dump.write(tmp_path, doc)
    assert [p.name for p in tmp_path.iterdir()] == ["4242.msgpack"]  # no temporary file left
    (back,) = dump.read_all(tmp_path)
    restored = dump.restore_state(MapsState(MAPS), back["probes"][0])
    assert contents(restored) == contents(st)
    assert contents(restored) != contents(MapsState(MAPS))


@pytest.mark.parametrize("data, reason", [
    (b"\xc1not msgpack", "unreadable dump"),
    (msgpack.packb({"version": 99, "pid": 1}), "not an egpu dump"),
    (msgpack.packb([1, 2]), "not an egpu dump"),
])
def test_bad_dumps_are_named(tmp_path, data, reason):
    (tmp_path / "7.msgpack").write_bytes(data)
    (tmp_path / ".8.msgpack.tmp").write_bytes(b"half")  # being written: never read
    with pytest.raises(EgpuError, match=reason) as e:
        dump.read_all(tmp_path)
    assert e.value.file == str(tmp_path / "7.msgpack")


@pytest.mark.parametrize("argv, shown", [
    (["/usr/bin/python3", "train.py", "--lr", "3e-4"], "python3 train.py --lr 3e-4"),
    (["./app"], "app"),
    (["python", "-c", "import os\nos._exit(0)"], "python -c import os?os._exit(0)"),   # as ps shows it
    (["python", "x" * 80], "python " + "x" * 50 + "..."),
    ([], ""),
])
def test_a_command_is_named_as_ps_shows_it(argv, shown):
    assert dump.command(argv) == shown


def test_a_process_that_ended_before_its_dump_is_named_by_its_command(tmp_path, probe_obj, monkeypatch):
    """egpu-run's line for a process that owed a dump names it by the command its started mark holds; a mark
    egpu made before marks held one (empty) leaves the pid alone."""
    from egpu_preload.runtime.probes import load_probes
    monkeypatch.setattr(os, "getpid", lambda: 4_000_001)   # no such process (pid_max is at most 2**22)
    monkeypatch.setattr(config, "argv", lambda: ["/usr/bin/python3", "train.py", "--lr", "3e-4"])
    assert not dump.mark_started(tmp_path)
    (tmp_path / "4000002.started").touch()   # an old mark
    _, notes = job.report(load_probes([probe_obj("count")]), tmp_path, False, False)
    assert [n for n in notes if " pid " in n] == [
        f"egpu-run: pid {pid} ended (killed?) before its exit dump and before any copy of its maps: its counts are "
        "missing" for pid in ("4000001 (python3 train.py --lr 3e-4)", "4000002")]


def test_restore_refuses_another_probes_maps():
    with pytest.raises(EgpuError, match="dump has 6 maps, the probe 1"):
        dump.restore_state(MapsState(MAPS[:1]), dump.state_contents(filled_state()))


# ---- what the runtime needs from the rewriter -------------------------------------------------------

PTX = (".version 8.0\n.target sm_90\n.address_size 64\n\n"
       ".visible .entry vecadd(\n\t.param .u64 a,\n\t.param .u32 n\n)\n{\n\tret;\n}\n\n"
       ".visible .entry other(\n\t.param .u64 a\n)\n{\n\tret;\n}\n")


@pytest.mark.parametrize("only, expect", [
    (None, {"vecadd": ("instrumented", 2, 16), "other": ("instrumented", 1, 8)}),
    ("vec*", {"vecadd": ("instrumented", 2, 16), "other": ("untouched", 0, None)}),
    ("nothing", {"vecadd": ("untouched", 0, None), "other": ("untouched", 0, None)}),
])
def test_kernel_statuses_carry_the_launch_contract(probe_obj, only, expect):
    from egpu_preload.bpf.elf import load_object
    res = instrument(PTX, probe_specs(load_object(probe_obj("count"))), only)
    assert {k.name: (k.status, k.nparams, k.launch_param_offset) for k in res.kernels} == expect
    if only == "nothing":
        assert res.text == PTX and res.status("other").reason == "not selected by nothing"


# ---- the runtime inside programs on the stand-in driver -----------------------------------------------

def run_kept(stub_job, tmp_path, probe: Path, *cmd: str, **env: str):
    """egpu-run --keep: (result, the dumps the job left, the stand-in's log without lookups)."""
    log = tmp_path / "driver.log"
    r = egpu_run(["--keep", "-p", str(probe), *cmd], stub_job.env(log, **env))
    kept = [ln.removeprefix("egpu-run: session kept in ") for ln in r.stderr.splitlines() if "session kept" in ln]
    session = Path(kept[0])
    docs = dump.read_all(session)
    assert stat.S_IMODE(session.stat().st_mode) == 0o700
    calls = [ln.split(" ", 1)[1] for ln in log.read_text().splitlines()] if log.exists() else []
    return r, docs, [c for c in calls if not c.startswith("cuGetProcAddress")]


# tests/probes/count.bpf.c's counter region: count only adds to it, so it is striped (striping.py): the
# header, then SPREAD 128-byte lines for each of the stand-in's 132 SMs.
COUNTER_REGION = 64 + 132 * SPREAD * 128
# The trace ring: the header, 1 MiB of records and as much slack, a line per SM (devmaps.py).
TRACE_REGION = 64 + 2 * TRACE_BYTES + 132 * 128


def launches(calls: list[str]) -> list[str]:
    """The application's launches (not the runtime's clock reading, driver.GLOBALTIMER_PTX)."""
    return [c.split("params=")[1] for c in calls if c.startswith("cuLaunchKernel") and " f=egpu_globaltimer@" not in c]


def test_a_load_inside_a_stream_capture_is_instrumented_and_leaves_the_capture_valid(stub_job, probe_obj, tmp_path):
    """Lazy loading brings a module in at its first launch, here one being captured in global mode: the
    maps are allocated in relaxed capture mode and filled on our stream (the stand-in refuses cuMemAlloc
    and legacy-stream copies there, and then fails the capture, as the H200 did), so the capture ends
    well and the launches carry their ids."""
    r, docs, calls = run_kept(stub_job, tmp_path, probe_obj("count"), str(stub_job.app), "capture", "2", "64", "0")
    assert r.returncode == 0, r.stderr
    assert "app_vec capture launches=2 threads=64 result=0" in r.stdout
    assert not [c for c in calls if "refused" in c]
    assert launches(calls) == ["11,22,64,1", "11,22,64,2"]
    (doc,) = docs
    assert [m["status"] for m in doc["modules"]] == ["instrumented"]


@pytest.mark.parametrize("app, mode", [("c", "module"), ("c", "library"), ("c", "fatbin"), ("python", "module")])
def test_instrumented_load_fills_the_table_and_appends_launch_ids(stub_job, probe_obj, tmp_path, app, mode):
    cmd = [str(stub_job.app)] if app == "c" else ["python3", str(MORE / "app_vec.py")]
    # --in-kernel: the instrumented load is the subject (a counter alone is counted at the launch)
    r, docs, calls = run_kept(stub_job, tmp_path, probe_obj("count"), "--in-kernel", *cmd, mode, "3", "64", "0")
    assert r.returncode == 0, r.stderr
    # the driver got instrumented PTX: the kernel has a 4th parameter, and each launch passes its id
    assert launches(calls) == ["11,22,64,1", "11,22,64,2", "11,22,64,3"]
    api = "cuModuleGetGlobal_v2" if mode == "module" else "cuLibraryGetGlobal"
    (table,) = [c for c in calls if c.startswith(api)]
    assert table.endswith("found=1")
    fill = "cuMemcpyHtoDAsync_v2 size=16 stream=ours ctx=app"  # one map and the trace ring, in the app's context
    assert calls.index(table) < calls.index(fill) < calls.index(next(c for c in calls
                                                                     if c.startswith("cuLaunchKernel")))
    # the primary context is not the app's: the runtime leaves it as it found it
    assert [c for c in calls if c.startswith("cuDevicePrimaryCtx")] == ["cuDevicePrimaryCtxRetain dev=0",
                                                                       "cuDevicePrimaryCtxRelease_v2 dev=0"]
    # read back at exit from the same context, once
    assert [c for c in calls if c.startswith("cuMemcpyDtoH")] == [
        f"cuMemcpyDtoHAsync_v2 size={COUNTER_REGION} stream=ours ctx=app",
        f"cuMemcpyDtoHAsync_v2 size={TRACE_REGION} stream=ours ctx=app"]
    (doc,) = docs
    assert doc["argv"] == cmd + [mode, "3", "64", "0"]
    assert doc["error"] is None and doc["rank"] is None
    assert [m["status"] for m in doc["modules"]] == ["instrumented"]
    assert doc["modules"][0]["kernels"] == [["vecadd", "instrumented", ""]]
    assert doc["modules"][0]["image"] == ("fatbin compute_90" if mode == "fatbin" else "ptx")
    assert doc["stats"]["launches"] == 3 and doc["stats"]["redirected"] == 3
    from egpu_preload.bpf.ctx import kernel_id
    assert [kernel_id("vecadd"), "vecadd"] in doc["kernels"]
    # the stand-in runs no kernel: the count read back is the zero that went in
    assert doc["probes"][0]["maps"] == [{"values": [bytes(8)]}]


def test_ptx_linked_into_a_cubin_is_instrumented(stub_job, probe_obj, tmp_path):
    """numba's path: the PTX goes through cuLinkAddData, the cubin cuLinkComplete makes is copied and
    loaded with cuModuleLoadData. The link gets instrumented PTX; the cubin is adopted as instrumented:
    its table filled and the launch id appended."""
    r, docs, calls = run_kept(stub_job, tmp_path, probe_obj("count"), str(stub_job.app), "link", "2", "64", "0")
    assert r.returncode == 0, r.stderr
    (add,) = [c for c in calls if c.startswith("cuLinkAddData_v2")]
    assert int(add.split("size=")[1].split()[0]) > 400   # app_vec's PTX is 231 bytes; the probe came in
    assert launches(calls) == ["11,22,64,1", "11,22,64,2"]   # the cubin's kernel has a 4th parameter
    assert [c for c in calls if c.startswith("cuModuleGetGlobal_v2")][0].endswith("found=1")
    (doc,) = docs
    assert [(m["api"], m["image"], m["status"]) for m in doc["modules"]] == [
        ("LINK_ADD_DATA", "ptx link input", "instrumented"), ("MODULE_LOAD_DATA", "cubin from cuLink", "instrumented")]
    assert doc["modules"][1]["kernels"] == [["vecadd", "instrumented", ""]]
    assert doc["stats"]["redirected"] == 2


def test_a_cubin_linked_from_other_ptx_stays_sass_only(stub_job, probe_obj, tmp_path):
    """A link whose PTX no probe matches: nothing is replaced and the cubin is not adopted."""
    r, docs, calls = run_kept(stub_job, tmp_path, probe_obj("count"), "--kernel", "other*", str(stub_job.app),
                              "link", "1", "32", "0")
    assert r.returncode == 0, r.stderr
    assert launches(calls) == ["11,22,32"]
    (doc,) = docs
    assert [(m["image"], m["status"]) for m in doc["modules"]] == [("ptx link input", "untouched"),
                                                                  ("cubin", "SASS only")]


@pytest.mark.parametrize("mode, unload", [("module", "cuModuleUnload"), ("library", "cuLibraryUnload")])
def test_driver_calls_after_the_interpreter_is_gone_pass_through(stub_job, probe_obj, tmp_path, mode, unload):
    """A Python program whose C exit handlers unload and free after Py_FinalizeEx (cuDNN's static
    destructors in PyTorch): the hooks reach the driver without calling into the finalized
    interpreter, and the program exits 0 (it died of SIGSEGV when they called in)."""
    cmd = ["python3", str(MORE / "app_vec.py"), mode, "1", "32", "0", "late"]
    # --in-kernel: an instrumented module unloaded late (a counter alone is counted at the launch)
    r, docs, calls = run_kept(stub_job, tmp_path, probe_obj("count"), "--in-kernel", *cmd, PYTHONFAULTHANDLER="1")
    assert r.returncode == 0, r.stderr
    assert launches(calls) == ["11,22,32,1"]
    # the exit dump read the maps back first; the late calls reached the driver after it
    read = calls.index(f"cuMemcpyDtoHAsync_v2 size={COUNTER_REGION} stream=ours ctx=app")
    assert [c.split(" ")[0] for c in calls[read:] if c.startswith((unload, "cuMemFree_v2"))][-2:] == \
        ["cuMemFree_v2", unload]
    assert docs[0]["error"] is None


def test_without_a_current_context_the_maps_go_to_the_primary_context(stub_job, probe_obj, tmp_path):
    # --in-kernel: the kernel's table, filled there (a counter alone is counted at the launch)
    r, docs, calls = run_kept(stub_job, tmp_path, probe_obj("count"), "--in-kernel", str(stub_job.app), "library",
                              "1", "32", "0", EGPU_STUB_NO_CONTEXT="1")
    assert r.returncode == 0, r.stderr
    assert [c for c in calls if c.startswith("cuDevicePrimaryCtx")] == ["cuDevicePrimaryCtxRetain dev=0"]
    assert {c.split("ctx=")[1] for c in calls if c.startswith("cuMemcpy")} == {"primary"}
    assert launches(calls) == ["11,22,32,1"]
    assert docs[0]["error"] is None


@pytest.mark.parametrize("mode, kernel, status, params", [
    ("cubin", None, "SASS only", ""),          # no PTX: launched as it is
    ("module", "other*", "untouched", "11,22,32"),  # nothing selected: the original module, no launch id
])
def test_modules_left_alone_are_reported(stub_job, probe_obj, tmp_path, mode, kernel, status, params):
    args = ["--kernel", kernel] if kernel else []
    r, docs, calls = run_kept(stub_job, tmp_path, probe_obj("count"), *args, str(stub_job.app), mode, "2", "32", "0")
    assert r.returncode == 0, r.stderr
    assert launches(calls) == [params, params]
    assert not [c for c in calls if "Global" in c or c.startswith("cuMemcpy")]  # no maps were made
    (doc,) = docs
    assert doc["probes"] == [] and [m["status"] for m in doc["modules"]] == [status]
    assert doc["modules"][0]["kernels"][0][:2] == ["vecadd", status]
    assert f"no kernel was instrumented (1 load {status})" in r.stderr
    assert "detached" not in r.stderr, r.stderr   # no maps were made, and nobody detached the probe
    assert r.stdout.splitlines() == [f"app_vec {mode} launches=2 threads=32 result=0"]


@pytest.mark.parametrize("mode", ["module", "library"])
def test_a_module_the_driver_refuses_is_reported_with_its_jit_log(stub_job, probe_obj, tmp_path, mode):
    """The stand-in's JIT refuses the instrumented PTX (it holds the launch id parameter) with a ptxas log: the
    original runs, and the reason names the log's first lines, in the dump and on egpu-run's stderr."""
    # --in-kernel: the instrumented PTX the JIT refuses (a counter alone is counted at the launch)
    r, docs, calls = run_kept(stub_job, tmp_path, probe_obj("count"), "--in-kernel", str(stub_job.app), mode, "2",
                              "32", "0", EGPU_STUB_REFUSE="__egpu_launch_id")
    assert r.returncode == 0, r.stderr
    assert launches(calls) == ["11,22,32", "11,22,32"]
    (doc,) = docs
    (m,) = doc["modules"]
    why = ("driver JIT error 218: ptxas application ptx input, line {}; error : stand-in refuses '__egpu_launch_id' | "
           "ptxas fatal : Ptx assembly aborted due to errors")
    assert re.fullmatch("failed: " + re.escape(why).replace(r"\{\}", r"\d+"), m["status"]), m["status"]
    assert m["kernels"][0][:2] == ["vecadd", "failed"] and m["kernels"][0][2] == m["status"].removeprefix("failed: ")
    assert f"no kernel was instrumented (1 load {m['status']})" in r.stderr and "detached" not in r.stderr


def test_launch_probes_alone_need_no_instrumented_kernel(stub_job, probe_obj, tmp_path):
    """A probe of launch programs only runs on the host: its kernels left untouched are no failure, so
    no warning says "no kernel was instrumented" beside its maps."""
    r, docs, calls = run_kept(stub_job, tmp_path, probe_obj("launch"), str(stub_job.app), "module", "2", "32", "0")
    assert r.returncode == 0, r.stderr
    assert "no kernel was instrumented" not in r.stderr
    assert "@launches[vecadd]: { launches: 2," in r.stdout


def test_global_data_reaches_the_device_and_comes_back(stub_job, probe_obj, tmp_path):
    """globals.bpf.c's .data weight = 3 and .rodata min_size = 4 go into device memory with the
    module's table and are read back from there at exit."""
    r, docs, calls = run_kept(stub_job, tmp_path, probe_obj("globals"), str(stub_job.app), "module", "1", "32", "0")
    assert r.returncode == 0, r.stderr
    assert launches(calls) == ["11,22,32,1"]
    from egpu_preload.bpf.elf import load_object
    names = [m.name.split(".", 1)[1] for m in load_object(probe_obj("globals")).maps]  # "globals.data"
    firsts = {n: m["values"][0] for n, m in zip(names, docs[0]["probes"][0]["maps"])}
    assert firsts["data"] == (3).to_bytes(8, "little")
    assert firsts["rodata"] == (4).to_bytes(4, "little") + b"egpu" + bytes(4)
    assert firsts["bss"] == bytes(16)


def test_maps_that_do_not_fit_leave_the_original_running_and_no_stream_behind(stub_job, probe_obj, tmp_path):
    """A device too full for the maps (the stand-in refuses the 2 MiB trace ring): the launches go to the
    original, the module says why, and the stream made for the maps is destroyed with them (each later
    load would make another)."""
    r, docs, calls = run_kept(stub_job, tmp_path, probe_obj("count"), str(stub_job.app), "module", "2", "32", "0",
                              EGPU_STUB_ALLOC_LIMIT=str(1 << 20))
    assert r.returncode == 0, r.stderr
    assert "result=0" in r.stdout
    assert [c for c in calls if "refused: out of memory" in c] == [
        f"cuMemAlloc_v2 size={TRACE_REGION} refused: out of memory"]
    assert launches(calls) == ["11,22,32", "11,22,32"]
    created = [c for c in calls if c.startswith("cuStreamCreate")]
    assert len(created) == 1 and len([c for c in calls if c.startswith("cuStreamDestroy_v2")]) == 1
    (doc,) = docs
    (m,) = doc["modules"]
    assert m["status"].startswith("failed: cannot fill the map table: cuMemAlloc_v2 failed")


@pytest.mark.parametrize("mode", ["module", "library"])
def test_a_table_that_cannot_be_filled_sends_launches_to_the_original(stub_job, probe_obj, tmp_path, mode):
    """The app holds the instrumented module; with no maps behind it, its kernels would fault, so the
    runtime loads the original beside it and redirects every launch there, without a launch id."""
    # --in-kernel: the instrumented module the app holds (a counter alone is counted at the launch)
    r, docs, calls = run_kept(stub_job, tmp_path, probe_obj("count"), "--in-kernel", str(stub_job.app), mode, "2",
                              "32", "0", EGPU_STUB_NO_GLOBALS="1")
    assert r.returncode == 0, r.stderr
    load = "cuModuleLoadData" if mode == "module" else "cuLibraryLoadData"
    replaced = "cuModuleLoadDataEx" if mode == "module" else load   # with the JIT's error log asked for
    # the shim's replacement, then the original beside (Driver.load): both with the error log asked for
    assert [c for c in calls if c.startswith(load)] == [f"{replaced} module={n} kind=ptx instrumented=0 jit=5,6"
                                                        for n in (1, 2)]
    suffix = "" if mode == "module" else "k"
    assert [c.split(" f=")[1].split()[0] for c in calls if c.startswith("cuLaunchKernel")] == [f"vecadd@2{suffix}"] * 2
    assert launches(calls) == ["11,22,32", "11,22,32"]
    (doc,) = docs
    (m,) = doc["modules"]
    assert m["status"].startswith("failed: cannot fill the map table: ")
    assert m["kernels"][0][:2] == ["vecadd", "failed"]


class _CxaAtexit:
    """A stand-in for C's __cxa_atexit: records registrations, registers nothing."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.argtypes = None

    def __call__(self, *args) -> int:
        self.calls.append(args)
        return 0


def test_the_exit_hook_registers_again_once_python_loaded_modules(monkeypatch):
    """An embedded runtime's dump runs among C's exit handlers, last registered first: the hook
    registers again after Python loaded modules (pyarrow, pandas under its first write register
    their teardown as they load), so that it runs before their teardown."""
    from egpu_preload.runtime import exit_hook
    cxa = _CxaAtexit()
    monkeypatch.setattr(exit_hook.sys, "orig_argv", [])
    monkeypatch.setattr(exit_hook.ctypes, "CDLL", lambda _: {"__cxa_atexit": cxa})
    hook = exit_hook.ExitHook(lambda: None)
    assert len(cxa.calls) == 1
    hook.rearm_if_loaded()
    assert len(cxa.calls) == 1
    monkeypatch.setitem(sys.modules, "egpu_test_loaded_late", types.ModuleType("egpu_test_loaded_late"))
    hook.rearm_if_loaded()
    hook.rearm_if_loaded()
    assert len(cxa.calls) == 2
