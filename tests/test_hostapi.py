"""Host-API probes (egpu/memcpy, memset, alloc, free, sync): the verifier's context rules for them, the
objects refused because they cannot run in C, and a whole job on the stand-in driver
(runtime_stub/app_hostapi.c) that calls every copy, set, allocation, free and synchronization the shim
hooks once, through dlsym and cuGetProcAddress: each call is counted against the driver symbol it
reached, with its bytes, direction, flags and stream exact, and the object's maps are one set shared
with its launch program."""

from __future__ import annotations

import re
import struct
import subprocess
from pathlib import Path

import pytest

from egpu_preload.bpf import ctx as C
from egpu_preload.bpf.compile import compile_probe
from egpu_preload.errors import EgpuError
from egpu_preload.runtime.probes import load_probe
from stub_job import MORE, ROOT
from test_runtime import run_kept

PROBE = ROOT / "tests" / "host_probes" / "host_calls.bpf.c"


def _load(tmp_path: Path, source: str):
    src = tmp_path / "p.bpf.c"
    src.write_text('#include "egpu.bpf.h"\n' + source)
    return load_probe(compile_probe(src, tmp_path / "p.bpf.o"))


# ---- the verifier: each section reads its own context -------------------------------------------------

CROSSED = [
    # a GPU field in a host-API section
    ('SEC("egpu/memcpy/*") int p(struct egpu_ctx *c) { return c->grid[0]; }',
     "grid is a field of struct egpu_ctx, which only GPU and launch sections receive"),
    ('SEC("egpu/sync/*") int p(struct egpu_ctx *c) { return c->launch_id; }',
     "launch_id is a field of struct egpu_ctx"),
    # a host field in a GPU or launch section
    ('SEC("kprobe/*") int p(struct egpu_host_ctx *c) { return c->bytes; }',
     "bytes is a field of struct egpu_host_ctx, which only host-API sections"),
    ('SEC("egpu/launch/*") int p(struct egpu_host_ctx *c) { return c->blocked_ns; }',
     "blocked_ns is a field of struct egpu_host_ctx"),
    ('SEC("egpu/mem/*") int p(struct egpu_host_ctx *c) { return c->dst; }',
     "dst/addr is a field of struct egpu_host_ctx"),
]


@pytest.mark.parametrize("source,reason", CROSSED, ids=[c[1].split()[0] + "-" + c[0][5:15] for c in CROSSED])
def test_a_section_reading_the_other_context_is_refused(tmp_path, source, reason):
    with pytest.raises(EgpuError, match=re.escape(reason)):
        _load(tmp_path, source)


def test_every_host_field_reads_where_ctx_py_says(tmp_path):
    """A host-API program may read every field of struct egpu_host_ctx, and clang puts each where
    ctx.HOST_FIELDS says (the verifier notes the offsets each load reads)."""
    from egpu_preload.bpf.elf import load_object
    from egpu_preload.bpf.verifier import verify
    names = [f.name for f in C.HOST_FIELDS if f.name != "pad"]
    body = " + ".join(f"(__u64)c->{n}" for n in names)
    src = tmp_path / "all.bpf.c"
    src.write_text(f'#include "egpu.bpf.h"\nSEC("egpu/memcpy/*") int p(struct egpu_host_ctx *c) {{ return {body}; }}\n')
    obj = load_object(compile_probe(src, tmp_path / "all.bpf.o"))
    v = verify(obj.programs[0].code, obj.maps, section=obj.programs[0].section)  # its context: the section's
    expected = {o for f in C.HOST_FIELDS if f.name != "pad" for o in range(f.offset, f.offset + f.size)}
    assert v.ctx_reads == expected
    assert C.HOST.size == 216 and min(f.offset for f in C.HOST_FIELDS) == C.SIZE


def test_host_api_programs_that_c_cannot_run_are_refused_when_loaded(tmp_path):
    """Host-API programs run in the hook, in C only: a map C does not keep (bpftime's per-thread array)
    refuses the object before the job starts, where a launch program alone would fall back to the Python
    VM. A ring buffer record reserved in place C does take."""
    per_thread = ('struct { __uint(type, 1502); __uint(max_entries, 1); __type(key, __u32); __type(value, __u64); }'
                  ' n SEC(".maps");\n'
                  'SEC("egpu/memcpy/*") int p(struct egpu_host_ctx *c) { __u32 k = 0; __u64 *v = '
                  'bpf_map_lookup_elem(&n, &k);\n  if (v) *v += c->bytes; return 0; }\n')
    with pytest.raises(EgpuError, match="host-API programs run only in C, in the hooks, which cannot take this "
                                        "object: map n is a perthread_array"):
        _load(tmp_path, per_thread)
    ring = ('struct { __uint(type, BPF_MAP_TYPE_RINGBUF); __uint(max_entries, 4096); } rb SEC(".maps");\n'
            'SEC("egpu/memcpy/*") int p(struct egpu_host_ctx *c) { __u64 *n = bpf_ringbuf_reserve(&rb, 8, 0);\n'
            '  if (n) { *n = c->bytes; bpf_ringbuf_submit(n, 0); } return 0; }\n')
    _load(tmp_path, ring)


@pytest.mark.parametrize("section, struct", [
    ("kprobe/*", "egpu_ctx"), ("egpu/mem.warp/*", "egpu_ctx"), ("egpu/launch/*", "egpu_ctx"),
    ("egpu/memcpy/*", "egpu_host_ctx"), ("egpu/memset/*", "egpu_host_ctx"), ("egpu/alloc/*", "egpu_host_ctx"),
    ("egpu/free/*", "egpu_host_ctx"), ("egpu/sync/*", "egpu_host_ctx"), ("egpu/uvm/*", "egpu_uvm_ctx"),
    ("uprobe/libc.so.6:getpid", "pt_regs"), ("uretprobe", "pt_regs"),
])
def test_each_section_kind_gets_one_context(section, struct):
    """One Layout per context struct; ctx.layout_for the section's kind is what the verifier holds it to."""
    from egpu_preload.bpf.sections import parse_section
    assert C.layout_for(parse_section(section).kind).name == struct


def test_gpu_programs_may_not_use_host_only_maps(tmp_path):
    """A QUEUE, STACK or BLOOM_FILTER map lives on the host: a kernel-site program pushing to one is refused at
    load, naming the file, the program and the map; the object whose host-API program alone uses it loads, and
    its device layout gives the map a bare region."""
    from egpu_preload.translate import devmaps
    q = 'struct { __uint(type, BPF_MAP_TYPE_STACK); __uint(max_entries, 4); __type(value, __u64); } q SEC(".maps");\n'
    api = 'SEC("egpu/memcpy/*") int p(struct egpu_host_ctx *c) { __u64 v = c->bytes; bpf_map_push_elem(&q, &v, 0); ' \
          'return 0; }\n'
    gpu = 'SEC("kprobe/*") int k(struct egpu_ctx *c) { __u64 v = c->site; bpf_map_push_elem(&q, &v, 0); return 0; }\n'
    with pytest.raises(EgpuError, match=r"p\.bpf\.o: STACK maps are host-only: GPU program k \(kprobe/\*\) uses map q"):
        _load(tmp_path, q + api + gpu)
    idle = 'SEC("kprobe/*") int k(struct egpu_ctx *c) { return 0; }\n'
    probe = _load(tmp_path, q + api + idle)
    assert devmaps.layout(probe.obj.maps[0]).region_size(132) == devmaps.HEADER


def test_an_object_with_host_api_and_egpu_uvm_programs_is_refused(tmp_path):
    """egpu/uvm programs put an object's host side on the Python VM, where its host-API programs cannot run."""
    both = ('SEC("egpu/memcpy/*") int p(struct egpu_host_ctx *c) { return 0; }\n'
            'SEC("egpu/uvm/*") int q(struct egpu_uvm_ctx *c) { return 0; }\n')
    with pytest.raises(EgpuError, match="host-API programs run only in C, in the hooks, which cannot take this "
                                        "object: q is an egpu/uvm program"):
        _load(tmp_path, both)


def test_a_running_job_refuses_host_api_programs(tmp_path):
    """Hooks are routed when the job's probes start: an attached object's host-API programs would never run."""
    from types import SimpleNamespace

    from egpu_preload.control import ControlError
    from egpu_preload.runtime import live
    data = compile_probe(PROBE, tmp_path / "h.bpf.o").read_bytes()
    control = live.Live(SimpleNamespace(probes=[], cfg=SimpleNamespace(session=tmp_path)))
    with pytest.raises(ControlError, match=r"h: host-API programs \(egpu/\w+/...\) cannot be attached"):
        control._load(data, "h")


# ---- a whole job on the stand-in --------------------------------------------------------------------

# Each symbol's kind and flags, from its name: the oracle the probe's context is held to.
UNIFIED = {"cuMemcpy": C.COPY_H2D, "cuMemcpy_ptds": C.COPY_D2H, "cuMemcpyAsync": C.COPY_D2D,
           "cuMemcpyAsync_ptsz": C.COPY_H2H}
ALLOC_KINDS = {"cuMemAlloc_v2": C.ALLOC_DEVICE, "cuMemAllocPitch_v2": C.ALLOC_PITCH,
               "cuMemAllocManaged": C.ALLOC_MANAGED, "cuMemAllocAsync": C.ALLOC_POOL,
               "cuMemAllocFromPoolAsync": C.ALLOC_POOL,
               "cuMemAllocHost_v2": C.ALLOC_HOST, "cuMemHostAlloc": C.ALLOC_HOST,
               "cuMemHostRegister_v2": C.ALLOC_HOST_REGISTERED, "cuMemCreate": C.ALLOC_VMM_HANDLE,
               "cuMemMap": C.ALLOC_VMM_MAPPING}
FREE_KINDS = {"cuMemFree_v2": C.ALLOC_DEVICE, "cuMemFreeAsync": C.ALLOC_POOL, "cuMemFreeHost": C.ALLOC_HOST,
              "cuMemHostUnregister": C.ALLOC_HOST_REGISTERED, "cuMemUnmap": C.ALLOC_VMM_MAPPING,
              "cuMemRelease": C.ALLOC_VMM_HANDLE}
SYNC_KINDS = {"cuStreamSynchronize": C.SYNC_STREAM, "cuEventSynchronize": C.SYNC_EVENT,
              "cuCtxSynchronize": C.SYNC_CONTEXT}
CAPTURED = "cuMemcpyDtoDAsync_v2_ptsz"  # made while its stream was captured


def base(symbol: str) -> str:
    return re.sub(r"(_v2)?(_ptds|_ptsz)?$", "", symbol)


def expected_kind(symbol: str) -> int:
    b = base(symbol)
    if symbol in UNIFIED:
        return UNIFIED[symbol]
    if b.startswith("cuMemset"):
        return C.COPY_SET
    if b.startswith("cuMemcpy3DPeer"):
        return C.COPY_D2D  # a 3D copy's direction is its memory types', peer or not
    if b.startswith("cuMemcpy2D"):
        return C.COPY_H2D
    if b.startswith("cuMemcpy3D"):
        return C.COPY_D2H
    if b.startswith("cuMemcpyPeer"):
        return C.COPY_PEER
    if b == "cuGraphAddMemcpyNode":
        return C.COPY_D2H  # app_hostapi's 3D copy
    if b == "cuGraphAddMemsetNode":
        return C.COPY_SET
    if b.startswith("cuMemcpyBatch"):
        return C.COPY_H2D  # app_hostapi's batches copy host to device
    for word, kind in (("HtoD", C.COPY_H2D), ("DtoH", C.COPY_D2H), ("DtoD", C.COPY_D2D), ("HtoA", C.COPY_H2D),
                       ("AtoH", C.COPY_D2H), ("DtoA", C.COPY_D2D), ("AtoD", C.COPY_D2D), ("AtoA", C.COPY_D2D)):
        if word in b:
            return kind
    return {**ALLOC_KINDS, **FREE_KINDS}.get(symbol) or {**ALLOC_KINDS, **FREE_KINDS, **SYNC_KINDS}.get(b, -1)


def expected_flags(symbol: str) -> int:
    flags = C.HOST_F_ASYNC * ("Async" in symbol) + C.HOST_F_PER_THREAD * symbol.endswith(("_ptds", "_ptsz"))
    flags += C.HOST_F_STRIDED * bool(re.search(r"(2D|3D|^cuGraphAdd)", symbol))
    return flags + C.HOST_F_GRAPH * (symbol == CAPTURED or symbol.startswith("cuGraphAdd"))


CALL = struct.Struct("<6Q2Ii I")


@pytest.fixture(scope="module")
def app(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("app_hostapi") / "app_hostapi"
    subprocess.run(["gcc", "-O1", "-Wall", "-Werror", str(MORE / "app_hostapi.c"), "-o", str(out), "-ldl"], check=True)
    return out


def run_app(stub_job, d: Path, app: Path, *args: str):
    """app_hostapi under host_calls.bpf.c: (egpu-run's result, the app's calls, the probe's rows by
    symbol, the events array, the app's stream, the dump)."""
    r, (doc,), _ = run_kept(stub_job, d, PROBE, "-v", str(app), *args)
    assert r.returncode == 0, r.stdout + r.stderr
    calls: dict[str, list[int]] = {}
    for line in r.stdout.splitlines():
        if line.startswith("call "):
            _, symbol, size = line.split()
            calls.setdefault(symbol, []).append(int(size.removeprefix("bytes=")))
    stream = int(re.search(r"^stream (0x[0-9a-f]+)$", r.stdout, re.M).group(1), 16)
    maps = doc["probes"][0]["maps"]
    by_id = {C.api_id(s): s for s in calls}
    rows = {by_id[struct.unpack("<Q", k)[0]]: CALL.unpack(v) for k, v in maps[0]["entries"]}
    events = [struct.unpack("<Q", v)[0] for v in maps[1]["values"]]
    return r, calls, rows, events, stream, doc


@pytest.fixture(scope="module")
def job(stub_job, app, tmp_path_factory):
    return run_app(stub_job, tmp_path_factory.mktemp("hostapi"), app)


def test_every_call_is_counted_once_with_its_bytes(job):
    """The app calls every API a host-API section runs on (the dump lists them), and each call was
    counted against the symbol it reached, with its bytes."""
    _, calls, rows, _, _, doc = job
    hooked = doc["launch_probes"]["host_apis"]
    assert set(calls) == {s for kind in ("memcpy", "memset", "alloc", "free", "sync") for s in hooked[f"egpu/{kind}/*"]}
    assert {s: (len(sizes), sum(sizes)) for s, sizes in calls.items()} == \
        {s: (row[0], row[1]) for s, row in rows.items()}


def test_each_call_has_its_kind_flags_and_result(job):
    _, calls, rows, _, _, _ = job
    got = {s: (row[6], row[7], row[8]) for s, row in rows.items()}
    assert got == {s: (expected_kind(s), expected_flags(s), 0) for s in calls}
    assert all(row[9] == row[0] for row in rows.values())  # every call spent some time in the driver


def test_streams_are_the_apps_or_the_per_thread_stream(job):
    """An async call's stream is the one it was given; a per-thread twin given the legacy stream (0), and
    every synchronous per-thread copy, is on the per-thread stream (2); the others on the legacy one."""
    _, calls, rows, _, stream, _ = job
    given_null = {"cuMemAllocAsync_ptsz", "cuMemAllocFromPoolAsync_ptsz", "cuMemFreeAsync_ptsz",
                  "cuMemcpyAsync_ptsz", "cuMemcpyHtoDAsync_v2_ptsz", "cuStreamSynchronize_ptsz",
                  "cuMemcpyAtoHAsync_v2_ptsz"}

    def want(s: str) -> int:
        if s in given_null or (s.endswith("_ptds")):
            return 2
        return stream if "Async" in s or s == "cuStreamSynchronize" else 0
    assert {s: row[4] for s, row in rows.items()} == {s: want(s) for s in calls}


def test_operands_reach_the_context(job):
    """Copies: destination and source; sets: the value; pool allocations and stream waits: the handle;
    frees: the address freed; a VMM mapping: its handle (the stand-in's 42)."""
    _, _, rows, _, stream, _ = job
    assert rows["cuMemsetD2D16_v2"][3] == 0x55 and rows["cuMemsetD8Async_ptsz"][3] == 0x11
    assert rows["cuMemAllocFromPoolAsync"][5] == 0x77 and rows["cuStreamSynchronize"][5] == stream
    assert rows["cuEventSynchronize"][5] == 0x99 and rows["cuCtxSynchronize_v2"][5] == 0x33
    assert rows["cuMemcpyHtoA_v2"][2] == 0x5000 and rows["cuMemcpyAtoA_v2"][3] == 0x6000
    assert rows["cuGraphAddMemsetNode"][3] == 0x77 and rows["cuGraphAddMemsetNode"][5] == 0x6a  # value; the graph
    assert rows["cuMemMap"][2] == 0x7100000000 and rows["cuMemMap"][5] == 42
    assert rows["cuMemUnmap"][2] == 0x7100000000 and rows["cuMemRelease"][2] == 42
    htod = rows["cuMemcpyHtoD_v2"]
    dtoh = rows["cuMemcpyDtoH_v2"]
    assert htod[2] == dtoh[3] and htod[3] == dtoh[2] and 0x700000000000 <= htod[2] < 0x710000000000


def test_one_object_one_set_of_maps(job):
    """The launch program and the copy programs count into the same array; a glob takes every variant
    of one API (cuMemcpyHtoDAsync_v2 and _v2_ptsz); the dump names what each section ran on."""
    _, calls, _, events, _, doc = job
    attached = doc["launch_probes"]["host_apis"]
    copies = sum(len(v) for s, v in calls.items() if s in attached["egpu/memcpy/*"])
    assert events == [1, copies, 2]
    assert attached["egpu/memcpy/cuMemcpyHtoDAsync*"] == ["cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync_v2_ptsz"]
    assert len(attached["egpu/sync/*"]) == 5 and len(attached["egpu/memset/*"]) == 25
    assert doc["launch_probes"]["in_c"] == [doc["probes"][0]["path"]]


def test_host_api_programs_print_and_send_records_from_c(stub_job, app, tmp_path):
    """A host-API program runs only in C: its bpf_printk lines and ring buffer records reach the dump, one
    per synchronous host-to-device copy of the app, with the bytes it copied."""
    probe = _load(tmp_path, 'struct { __uint(type, BPF_MAP_TYPE_RINGBUF); __uint(max_entries, 1 << 16); } '
                            'copies SEC(".maps");\n'
                            'SEC("egpu/memcpy/cuMemcpyHtoD_v2") int on_copy(struct egpu_host_ctx *c) {\n'
                            '  __u64 n = c->bytes; bpf_ringbuf_output(&copies, &n, sizeof(n), 0);\n'
                            '  bpf_printk("copy %llu", n); return 0; }\n')
    r, (doc,), _ = run_kept(stub_job, tmp_path, probe.path, str(app))
    assert r.returncode == 0, r.stderr
    sizes = [int(ln.split("bytes=")[1]) for ln in r.stdout.splitlines()
             if ln.startswith("call cuMemcpyHtoD_v2 ")]
    assert sizes
    from egpu_preload.maps import MapsState
    from egpu_preload.runtime import dump
    state = dump.restore_state(MapsState(probe.obj.maps), doc["probes"][0])
    (ring,) = [s for m, s in zip(state.maps, state.storages) if m.name == "copies"]
    assert [struct.unpack("<Q", rec)[0] for rec in ring.records] == sizes
    assert [(bytes(t.fmt).rstrip(b"\0"), t.args[0]) for t in state.trace] == [(b"copy %llu", n) for n in sizes]


def test_a_program_that_loads_no_module_is_seen_from_its_first_call(stub_job, app, tmp_path):
    """The runtime starts at a process's first module load; a job with host-API probes starts it with
    CUDA (EGPU_EARLY_START: the cuInit hook, else the first hooked copy, allocation or sync), so a program
    that copies before (or without) loading code is seen from its first call."""
    _, calls, rows, events, _, _ = run_app(stub_job, tmp_path, app, "nomodule")
    assert {s: (len(sizes), sum(sizes)) for s, sizes in calls.items()} == \
        {s: (row[0], row[1]) for s, row in rows.items()}
    assert events[0] == 0 and events[1] > 0  # no launch; every copy


def test_a_host_api_call_from_a_thread_key_destructor_writes_no_freed_memory(built, tmp_path):
    """app_api_exit.c: a thread ends, the shim's destructor frees the run state its host-API programs used, and
    a destructor of the application's that runs after it calls an API with a program: that run gets a run state
    of its own (it wrote into the freed one, which the heap had handed to the application by then)."""
    app, src = tmp_path / "app_api_exit", ROOT / "tests" / "uprobe_app" / "app_api_exit.c"
    subprocess.run(["gcc", "-O1", "-Wall", "-I", str(ROOT / "shim"), str(src), "-o", str(app), "-ldl", "-pthread"],
                   check=True)
    r = subprocess.run([str(app)], env={"LD_PRELOAD": str(built / "libegpu_shim.so")}, capture_output=True, text=True,
                       timeout=60)
    assert (r.returncode, r.stdout) == (0, "runs=2 heap=intact\n"), (r.returncode, r.stdout, r.stderr)
