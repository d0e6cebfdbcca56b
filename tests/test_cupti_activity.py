"""Copies, sets, syncs (runtime/copies.py) and unified-memory counters (runtime/uvm.py) from CUPTI
records: each record laid out at cupti_activity.h's offsets (CUDA 13.0) and parsed exactly, the
aggregate per operation, direction and stream, and whole jobs whose stand-in libcupti
(tests/runtime_stub/cupti_stub.c) hands over copies and unified-memory records."""

from __future__ import annotations

import json
import struct
import subprocess

import pytest

from egpu_preload.runtime import copies, durations, uvm
from stub_job import MORE, egpu_run
from test_durations import cupti_dir  # noqa: F401  (the stand-in libcupti, built once per module)


def record(fields: dict[int, tuple[str, int]], size: int = 128) -> bytes:
    """A record with each value at its byte offset: {offset: (struct format, value)}."""
    raw = bytearray(size)
    for offset, (fmt, value) in fields.items():
        struct.pack_into("<" + fmt, raw, offset, value)
    return bytes(raw)


def memcpy6(kind: int, direction: int, nbytes: int, start: int, end: int, stream: int, corr: int) -> bytes:
    """CUpti_ActivityMemcpy6 (kind 1) or CUpti_ActivityMemcpyPtoP4 (kind 22, correlationId at 60)."""
    return record({0: ("I", kind), 4: ("B", direction), 8: ("Q", nbytes), 16: ("Q", start), 24: ("Q", end),
                   32: ("I", 3), 40: ("I", stream), 44 if kind == 1 else 60: ("I", corr),
                   **({44: ("I", 0xEEEE)} if kind == 22 else {})})  # srcDeviceId there: not a correlation id


@pytest.mark.parametrize("raw, span", [
    (memcpy6(1, 1, 4096, 10, 2010, 7, 41), copies.Span(1, 1, 10, 2010, 7, 41, 4096)),
    (memcpy6(1, 2, 1 << 33, 5, 6, 9, 42), copies.Span(1, 2, 5, 6, 9, 42, 1 << 33)),
    (memcpy6(22, 10, 8192, 100, 4100, 8, 43), copies.Span(22, 10, 100, 4100, 8, 43, 8192)),
    (record({0: ("I", 2), 4: ("I", 0xAB), 8: ("Q", 256), 16: ("Q", 1), 24: ("Q", 501), 40: ("I", 7),
             44: ("I", 44), 48: ("H", 0), 50: ("H", 3)}), copies.Span(2, 3, 1, 501, 7, 44, 256)),
    (record({0: ("I", 38), 4: ("I", 3), 8: ("Q", 20), 16: ("Q", 920), 24: ("I", 45), 28: ("I", 1),
             32: ("I", 7)}), copies.Span(38, 3, 20, 920, 7, 45, 0)),
    (record({0: ("I", 10)}), None),
])
def test_copy_set_and_sync_records_parse_exactly(raw, span):
    assert copies.parse(raw) == span


@pytest.mark.parametrize("span, operation, direction", [
    (copies.Span(1, 1, 0, 1, 0, 0), "memcpy", "HtoD"), (copies.Span(1, 8, 0, 1, 0, 0), "memcpy", "DtoD"),
    (copies.Span(22, 10, 0, 1, 0, 0), "memcpy_peer", "PtoP"), (copies.Span(2, 5, 0, 1, 0, 0), "memset", "managed"),
    (copies.Span(38, 4, 0, 1, 0, 0), "sync", "context_synchronize"), (copies.Span(1, 99, 0, 1, 0, 0), "memcpy", "99"),
])
def test_operation_and_direction_names(span, operation, direction):
    assert (span.operation, span.direction) == (operation, direction)


def test_copies_aggregate_per_direction_and_stream_and_keep_spans_up_to_the_limit():
    c = copies.Copies(timeline=True, limit=3)
    for s in [copies.Span(1, 1, 0, 1000, 7, 1, 4096), copies.Span(1, 1, 2000, 5000, 7, 2, 4096),
              copies.Span(1, 1, 0, 10, 8, 3, 64), copies.Span(38, 3, 0, 9, 7, 4),  # a sync: a span only
              copies.Span(2, 3, 50, 40, 7, 5, 1)]:                                  # ends before it starts
        c.add(s)
    assert c.dump() == [["memcpy", "HtoD", 7, 2, 8192, 4000, 1000, 3000, [[9, 1], [11, 1]]],
                        ["memcpy", "HtoD", 8, 1, 64, 10, 10, 10, [[3, 1]]]]
    kept = c.dump_spans()
    assert kept["dropped"] == 2
    assert copies.spans(kept, 100) == [copies.Span(1, 1, 100, 1100, 7, 1, 4096),
                                       copies.Span(1, 1, 2100, 5100, 7, 2, 4096), copies.Span(1, 1, 100, 110, 8, 3, 64)]


def um3(counter: int, value: int, start: int, end: int, address: int, flags: int = 0) -> bytes:
    """CUpti_ActivityUnifiedMemoryCounter3."""
    return record({0: ("I", 25), 4: ("I", counter), 8: ("Q", value), 16: ("Q", start), 24: ("Q", end),
                   32: ("Q", address), 40: ("I", 0), 44: ("I", 1), 48: ("I", 7), 52: ("I", 999), 56: ("I", flags)})


@pytest.mark.parametrize("raw, rec, name, nbytes", [
    (um3(1, 65536, 10, 30, 0x7F0000200000, 3), uvm.UvmRecord(1, 0x7F0000200000, 65536, 10, 30, 0, 1, 3, 7), "htod",
     65536),
    (um3(2, 4096, 10, 20, 0x1000), uvm.UvmRecord(2, 0x1000, 4096, 10, 20, 0, 1, 0, 7), "dtoh", 4096),
    # a CPU fault has no end (CUPTI leaves it as it is) and its value is the faulting PC, not bytes
    (um3(3, 0x401234, 10, 0, 0x2000), uvm.UvmRecord(3, 0x2000, 0x401234, 10, 10, 0, 1, 0, 7), "cpu_page_fault", 0),
    (um3(4, 3, 10, 90, 0x3000, 2), uvm.UvmRecord(4, 0x3000, 3, 10, 90, 0, 1, 2, 7), "gpu_page_fault", 0),
    (um3(5, 1 << 21, 10, 99, 0x4000), uvm.UvmRecord(5, 0x4000, 1 << 21, 10, 10, 0, 1, 0, 7), "thrashing", 1 << 21),
])
def test_unified_memory_records_parse_exactly(raw, rec, name, nbytes):
    got = uvm.parse(raw)
    assert got == rec and got.name == name and got.bytes == nbytes


def test_unified_memory_totals_spans_and_the_sink_on_the_moved_clock():
    seen: list[list[uvm.UvmRecord]] = []
    u = uvm.Uvm(clock_offset_ns=1000, timeline=True, sink=seen.append, limit=2)
    batch = [uvm.UvmRecord(1, 0x1000, 8192, 10, 20, 0, 1, 0, 7), uvm.UvmRecord(4, 0x1000, 2, 5, 9, 0, 1, 1, 7),
             uvm.UvmRecord(1, 0x3000, 4096, 30, 40, 0, 1, 0, 7)]
    u.add(batch)
    d = u.dump()
    assert d["counters"] == [["htod", 2, 12288], ["gpu_page_fault", 1, 2]] and d["dropped"] == 1
    assert uvm.spans(d) == [uvm.UvmRecord(1, 0x1000, 8192, 10, 20, 0, 1, 0, 0),
                            uvm.UvmRecord(4, 0x1000, 2, 5, 9, 0, 1, 1, 0)]
    assert [(r.start_ns, r.end_ns) for r in seen[0]] == [(1010, 1020), (1005, 1009), (1030, 1040)]


def test_unified_memory_config_array():
    assert uvm.config((1, 4)) == struct.pack("<8I", 1, 1, 0, 1, 1, 4, 0, 1)


COPIES = "1:1:1048576:2000:7,1:1:1048576:6000:7,1:2:4096:1000:8,22:10:8192:4000:8,2:3:256:500:7,38:3:0:900:7"
UVM = "1:7f0000200000:65536:3000:3,1:7f0000210000:4096:100:3,3:401234:0:0:0,4:7f0000200000:2:50:1"


def _job(stub_job, cupti_dir, tmp_path, *args: str, **env_extra: str):  # noqa: F811
    log = tmp_path / "log"
    env = stub_job.env(log, EGPU_STUB_CUPTI="vecadd:1500", EGPU_STUB_CUPTI_COPIES=COPIES, EGPU_STUB_CUPTI_UVM=UVM,
                       **env_extra)
    env["LD_LIBRARY_PATH"] = f"{cupti_dir}:{env['LD_LIBRARY_PATH']}"
    r = egpu_run([*args, str(stub_job.app), "cubin", "1", "64", "0"], env)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()[1:], log


def test_durations_print_copies_beside_kernels(stub_job, cupti_dir, tmp_path):  # noqa: F811
    lines, _ = _job(stub_job, cupti_dir, tmp_path, "--durations")
    bar = "@" * 52
    assert lines == [
        "@duration_ns[vecadd]: count 1, total 1500, mean 1500, min 1500, max 1500",
        f"[1K, 2K)               1 |{bar}|",
        "",
        # the longest total first; bandwidth = bytes / device time (B/ns = GB/s); the sync is no copy
        "@copy_ns[memcpy HtoD stream 7]: count 2, bytes 2097152, total 8000, mean 4000, min 2000, max 6000, "
        "262.14 GB/s",
        f"[1K, 2K)               1 |{bar}|",
        "[2K, 4K)               0 |" + " " * 52 + "|",
        f"[4K, 8K)               1 |{bar}|",
        "",
        "@copy_ns[memcpy_peer PtoP stream 8]: count 1, bytes 8192, total 4000, mean 4000, min 4000, max 4000, "
        "2.05 GB/s",
        f"[2K, 4K)               1 |{bar}|",
        "",
        "@copy_ns[memcpy DtoH stream 8]: count 1, bytes 4096, total 1000, mean 1000, min 1000, max 1000, 4.10 GB/s",
        f"[512, 1K)              1 |{bar}|",
        "",
        "@copy_ns[memset device stream 7]: count 1, bytes 256, total 500, mean 500, min 500, max 500, 0.51 GB/s",
        f"[256, 512)             1 |{bar}|",
        "",
        "@uvm[htod]: count 2, bytes 69632",
        "@uvm[cpu_page_fault]: count 1",
        "@uvm[gpu_page_fault]: count 1, fault groups 2"]


def test_durations_json_has_copies_and_unified_memory(stub_job, cupti_dir, tmp_path):  # noqa: F811
    lines, _ = _job(stub_job, cupti_dir, tmp_path, "--json", "--durations")
    doc = json.loads(lines[0])
    assert doc["copies"][0] == {"operation": "memcpy", "direction": "DtoH", "stream": 8, "count": 1, "bytes": 4096,
                                "total_ns": 1000, "min_ns": 1000, "max_ns": 1000, "hist_log2_ns": {"9": 1}}
    assert [(c["operation"], c["direction"], c["stream"], c["count"], c["bytes"]) for c in doc["copies"]] == [
        ("memcpy", "DtoH", 8, 1, 4096), ("memcpy", "HtoD", 7, 2, 2097152), ("memcpy_peer", "PtoP", 8, 1, 8192),
        ("memset", "device", 7, 1, 256)]
    assert doc["uvm"] == {"htod": {"count": 2, "value": 69632}, "cpu_page_fault": {"count": 1, "value": 0},
                          "gpu_page_fault": {"count": 1, "value": 2}}
    assert doc["error"] is None and doc["copies_error"] is None and doc["uvm_error"] is None


def test_a_refused_unified_memory_configuration_is_said_and_the_rest_comes(stub_job, cupti_dir, tmp_path):  # noqa: F811
    lines, log = _job(stub_job, cupti_dir, tmp_path, "--durations", EGPU_STUB_CUPTI_NO_UVM="1")
    assert lines[-1] == ("uvm: none (cuptiActivityConfigureUnifiedMemoryCounter failed (8 counters: CUptiResult 1, "
                         "4 counters: CUptiResult 1))")
    assert "@copy_ns[memcpy HtoD stream 7]: count 2" in "\n".join(lines)
    assert "cuptiActivityEnable 25" not in log.read_text()


def test_render_keeps_processes_apart():
    docs = [{"pid": 1, "durations": [], "copies": [["memcpy", "HtoD", 7, 1, 10, 10, 10, 10, [[3, 1]]]]},
            {"pid": 2, "durations": [], "uvm": {"counters": [["dtoh", 1, 4096]]}}]
    assert durations.render(docs).splitlines() == [
        "pid 1:", "@copy_ns[memcpy HtoD stream 7]: count 1, bytes 10, total 10, mean 10, min 10, max 10, 1.00 GB/s",
        "[8, 16)                1 |" + "@" * 52 + "|", "", "pid 2:", "@uvm[dtoh]: count 1, bytes 4096"]


def test_unified_memory_records_reach_egpu_uvm_probes_while_the_job_runs(stub_job, cupti_dir, tmp_path):  # noqa: F811
    """examples/uvm_ranges.bpf.c on the stand-in's records: delivered to the probe on the Python VM with
    every ctx field it reads (kind, addr, bytes) by a periodic flush while app_loop runs (0.5 s), not
    only at exit; no kernel timing asked for, none enabled."""
    from stub_job import ROOT
    log = tmp_path / "log"
    env = stub_job.env(log, EGPU_STUB_CUPTI_UVM=UVM)
    env["LD_LIBRARY_PATH"] = f"{cupti_dir}:{env['LD_LIBRARY_PATH']}"
    r = egpu_run(["-p", str(ROOT / "examples/uvm_ranges.bpf.c"), str(stub_job.loop), str(tmp_path / "stop"), "0.5"],
                 env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # per kind: 2 migrations to the GPU, a CPU fault, a GPU fault; both migrations in one 2 MiB range
    assert lines[2:] == ["@events[3]: 1", "@events[4]: 1", "@events[1]: 2", "", "@htod_bytes[0x7f0000200000]: 69632"]
    calls = [ln.split(" ", 1)[1] for ln in log.read_text().splitlines() if " cupti" in ln or " records" in ln]
    assert calls[:5] == [*(f"cuptiActivityConfigureUnifiedMemoryCounter {k}" for k in (1, 2, 3, 4)),
                         "cuptiActivityEnable 25"]
    assert calls[5:7] == ["cuptiActivityFlushAll 0", "records handed over 4"] and calls[-1] == "cuptiActivityFlushAll 1"
    assert set(calls[7:-1]) == {"cuptiActivityFlushAll 0"}


UVM_PROBE = """#include "egpu.bpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 1); __type(key, __u32); __type(value, __u64); }
    out SEC(".maps");
SEC("egpu/uvm/*") int p(struct egpu_uvm_ctx *ctx) {
    __u32 k = 0;
    __u64 v = ctx->FIELD;
    bpf_map_update_elem(&out, &k, &v, 0);
    return 0;
}
char LICENSE[] SEC("license") = "GPL";
"""


@pytest.mark.parametrize("field, error", [
    ("addr + ctx->bytes + ctx->value + ctx->start_ns + ctx->end_ns + ctx->kind + ctx->flags + ctx->src + ctx->dst"
     " + ctx->stream", None),
    # struct egpu_ctx's stream is at 136: past the end of a uvm probe's context
    ("addr + ((struct egpu_ctx *)ctx)->stream",
     "invalid ctx access off=136 size=8 (struct egpu_uvm_ctx is 64 bytes of aligned fields)"),
])
def test_the_verifier_holds_egpu_uvm_programs_to_their_context(tmp_path, field, error):
    from egpu_preload.bpf.compile import compile_probe
    from egpu_preload.errors import EgpuError
    from egpu_preload.runtime.probes import load_probe
    src = tmp_path / "p.bpf.c"
    src.write_text(UVM_PROBE.replace("FIELD", field))
    obj = compile_probe(src, tmp_path / "p.bpf.o")
    if error is None:
        assert load_probe(obj).specs == ()  # a host program: nothing spliced into kernels
        return
    with pytest.raises(EgpuError, match=error.replace("(", r"\(").replace(")", r"\)")):
        load_probe(obj)


def test_a_running_job_refuses_egpu_uvm_programs(tmp_path):
    """Its unified-memory records go to the probes it started with: an attach would never see any."""
    from types import SimpleNamespace

    from egpu_preload.bpf.compile import compile_probe
    from egpu_preload.control import ControlError
    from egpu_preload.runtime import live
    from stub_job import ROOT
    data = compile_probe(ROOT / "examples/uvm_ranges.bpf.c", tmp_path / "u.bpf.o").read_bytes()
    control = live.Live(SimpleNamespace(probes=[], cfg=SimpleNamespace(session=tmp_path)))
    with pytest.raises(ControlError, match=r"u: unified-memory programs \(egpu/uvm/...\) cannot be attached"):
        control._load(data, "u")


def test_egpu_uvm_programs_run_on_the_python_vm_beside_their_objects_uprobes(tmp_path):
    """An object's host side is one: its egpu/uvm programs run on the Python VM (run_uvm) and its uprobes
    only in C, so the Python VM's list holds the uvm programs and no uprobe."""
    from egpu_preload.bpf.compile import compile_probe
    from egpu_preload.runtime import launches
    from egpu_preload.runtime.probes import load_probe
    src = tmp_path / "u.bpf.c"
    src.write_text('#include "egpu.bpf.h"\n'
                   'struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 1); __type(key, __u32); '
                   '__type(value, __u64); } moved SEC(".maps");\n'
                   'SEC("egpu/uvm/htod") int on_uvm(struct egpu_uvm_ctx *c) { __u32 k = 0; '
                   '__u64 *v = bpf_map_lookup_elem(&moved, &k); if (v) *v += c->bytes; return 0; }\n'
                   'SEC("uprobe/libc.so.6:getpid") int on_call(void *regs) { return 0; }\n')
    probe = load_probe(compile_probe(src, tmp_path / "u.bpf.o"))
    probes = launches.LaunchProbes([probe])
    (side,) = probes.sides
    assert [p.name for p, _ in side.programs] == ["on_uvm"] and probes.has_uvm
    probes.run_uvm(uvm.UvmRecord(1, 0x1000, 8192, 10, 20, 0, 1, 0, 7))
    probes.run_uvm(uvm.UvmRecord(2, 0x1000, 4096, 30, 40, 1, 0, 0, 7))  # dtoh: the glob takes htod only
    assert struct.unpack("<Q", side.state.storages[0].lookup(struct.pack("<I", 0)))[0] == 8192


def test_struct_egpu_uvm_ctx_in_the_header_matches_ctx_py_and_context_bytes(tmp_path):
    """egpu.bpf.h's struct and enum (compiled by gcc) against bpf/ctx.py UVM_CTX and uvm.COUNTERS; and
    context_bytes puts each field where UVM_CTX says."""
    import subprocess

    from egpu_preload.bpf import ctx as C
    from stub_job import ROOT
    fields = C.UVM_CTX.fields
    src = tmp_path / "o.c"
    src.write_text('#include <stddef.h>\n#include <stdio.h>\n#include "egpu.bpf.h"\nint main(void) {\n'
                   + "".join(f'printf("{f.name} %zu %zu\\n", offsetof(struct egpu_uvm_ctx, {f.name}), '
                             f'sizeof(((struct egpu_uvm_ctx *)0)->{f.name}));\n' for f in fields)
                   + 'printf("size %zu\\n", sizeof(struct egpu_uvm_ctx));\n'
                   + "".join(f'printf("EGPU_UVM_{n.upper()} %d\\n", EGPU_UVM_{n.upper()});\n'
                             for n in uvm.COUNTERS.values())
                   + "return 0;\n}\n")
    subprocess.run(["gcc", "-w", "-I", str(ROOT / "egpu_preload/include"), str(src), "-o", str(tmp_path / "o")],
                   check=True)
    out = subprocess.run([str(tmp_path / "o")], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ([f"{f.name} {f.offset} {f.size}" for f in fields] + [f"size {C.UVM_CTX.size}"]
                   + [f"EGPU_UVM_{n.upper()} {k}" for k, n in uvm.COUNTERS.items()])
    r = uvm.UvmRecord(kind=2, address=0xA000, value=4096, start_ns=11, end_ns=22, src=5, dst=6, flags=3, stream=7)
    ctx = uvm.context_bytes(r)
    at = {f.name: int.from_bytes(ctx[f.offset:f.offset + f.size], "little") for f in fields}
    assert at == {"addr": 0xA000, "bytes": 4096, "value": 4096, "start_ns": 11, "end_ns": 22, "kind": 2, "flags": 3,
                  "src": 5, "dst": 6, "stream": 7, "pad": 0}


def test_a_program_that_loads_no_code_is_timed_from_its_first_call(stub_job, cupti_dir, tmp_path):  # noqa: F811
    """--durations starts the runtime with CUDA (EGPU_EARLY_START, the cuInit hook): a program that only
    copies (no module load ever starts the runtime) still gets its copies and unified-memory records,
    and CUPTI is set before the program's first allocation (its unified-memory counters need that)."""
    app = tmp_path / "app_hostapi"
    subprocess.run(["gcc", "-O1", "-Wall", "-Werror", str(MORE / "app_hostapi.c"), "-o", str(app), "-ldl"],
                   check=True)
    log = tmp_path / "log"
    env = stub_job.env(log, EGPU_STUB_CUPTI_COPIES=COPIES, EGPU_STUB_CUPTI_UVM=UVM)
    env["LD_LIBRARY_PATH"] = f"{cupti_dir}:{env['LD_LIBRARY_PATH']}"
    r = egpu_run(["--json", "--durations", str(app), "nomodule"], env)
    assert r.returncode == 0, r.stderr
    (doc,) = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(doc["copies"]) == 4 and doc["uvm"]["htod"] == {"count": 2, "value": 69632}
    calls = [ln.split(" ", 1)[1] for ln in log.read_text().splitlines()]
    first_alloc = next(i for i, c in enumerate(calls) if c.startswith("cuMemAlloc"))
    assert calls.index("cuptiActivityEnable 25") < first_alloc
