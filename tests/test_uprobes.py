"""Host uprobes (runtime/uprobes.py, shim/uprobe.c) on tests/uprobe_app's library, under egpu-run against
the stand-in driver: arguments and return values exact, the application's results unchanged, one map
shared with a launch probe, bare uprobes targeted by --uprobe."""

from __future__ import annotations

import contextlib
import json
import os
import re
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bpftime_build import bpftime_cflags
from egpu_preload.bpf.compile import compile_probe, find_clang
from egpu_preload.bpf.elf import load_object
from egpu_preload.maps import MapsState
from egpu_preload.runtime import dump
from egpu_preload.bpf.verifier import verify
from egpu_preload.errors import VerifierError
from stub_job import ROOT
from test_runtime import run_kept

APP = ROOT / "tests" / "uprobe_app"
PROBE = ROOT / "tests" / "uprobe_probes" / "args.bpf.c"
BARE = ["--uprobe", "sum8_entry=libupt.so:upt_sum8", "--uprobe", "sum8_exit=libupt.so:upt_sum8"]
ADD6_CALLS, ADD6_RETURNS, SUM8_CALLS, SUM8_RETURNS, LAUNCHES, HALF_RETURNS = range(6)


def uprobe_probe(tmp_path: Path, name: str, *flags: str) -> Path:
    """tests/uprobe_probes/NAME.bpf.c built as bpftime's examples are (bpftime_cflags), with ``flags``."""
    clang, obj = find_clang(), tmp_path / f"{name}.bpf.o"
    source = ROOT / "tests" / "uprobe_probes" / f"{name}.bpf.c"
    subprocess.run([clang, *bpftime_cflags(clang), *flags, "-c", str(source), "-o", str(obj)], check=True)
    return obj


@pytest.fixture(scope="module")
def uprobe_app(stub_job, tmp_path_factory) -> tuple[Path, Path]:
    """(app_uprobe linked against libupt.so beside the stand-in driver, args.bpf.o built with bpftime's flags)."""
    d = stub_job.driver_dir
    clang = find_clang()
    obj = tmp_path_factory.mktemp("uprobe") / "args.bpf.o"
    for step in (["gcc", "-O1", "-shared", "-fPIC", str(APP / "libupt.c"), "-o", str(d / "libupt.so")],
                 ["gcc", "-O1", "-Wall", "-fcf-protection=full", str(APP / "app_uprobe.c"), "-o", str(d / "app_uprobe"),
                  f"-L{d}", "-lupt", "-l:libcuda.so.1", f"-Wl,-rpath,{d}", "-ldl", "-lpthread"],
                 [clang, *bpftime_cflags(clang), "-c", str(PROBE), "-o", str(obj)]):
        subprocess.run(step, check=True)
    return d / "app_uprobe", obj


def plain_output(app: Path, n: int, env: dict) -> str:
    return subprocess.run([str(app), "calls", str(n)], env=env, capture_output=True, text=True, check=True).stdout


def entries(doc: dict, obj: Path, name: str) -> dict[int, int]:
    """Map ``name`` of the job's dump, as integers."""
    state = dump.restore_state(MapsState(load_object(obj).maps), doc["probes"][0])
    (storage,) = [s for m, s in zip(state.maps, state.storages) if m.name == name]
    return {int.from_bytes(k, "little"): int.from_bytes(v, "little") for k, v in storage.items()}


def test_uprobes_see_exact_arguments_and_return_values_and_share_a_map_with_launch_probes(stub_job, uprobe_app,
                                                                                          tmp_path):
    app, obj = uprobe_app
    n = 40
    r, (doc,), _ = run_kept(stub_job, tmp_path, obj, *BARE, str(app), "calls", str(n))
    assert r.returncode == 0, r.stderr
    # the calls went through the stubs and came back with what the functions returned
    assert r.stdout.splitlines()[0] == plain_output(app, n, stub_job.env(tmp_path / "plain.log")).strip()
    counts = entries(doc, obj, "counts")
    assert [counts[k] for k in range(7)] == [n] * 6 + [0]  # LAUNCHES: the launch probe, on the same map
    # upt_add6(i, i+1, .., i+5): rdi, rsi, rdx, rcx, r8, r9 each read as PT_REGS_PARMn
    packed = 1 | 2 << 8 | 3 << 16 | 4 << 24 | 5 << 32
    assert entries(doc, obj, "add6_args") == {i: packed for i in range(n)}
    # rax at return: upt_add6 = 6i + 15, upt_sum8(i x7, i + 1) = 36i + 8 (its two stack arguments intact)
    expected = {6 * i + 15: 0 for i in range(n)} | {36 * i + 8: 0 for i in range(n)}
    for i in range(n):
        expected[6 * i + 15] += 1
        expected[36 * i + 8] += 1
    assert entries(doc, obj, "returns") == expected
    # bpf_printk in a uretprobe runs in C too: sp at the return is the caller's, 16-aligned
    assert [tuple(t[:4]) for t in doc["probes"][0]["trace"]] == [(b"upt_half returned, sp %lx\0", 0, 0, 0)] * n
    sites = {a["prog"]: (a["target"], a["state"], a["sites"]) for a in doc["uprobes"]["attached"]}
    assert sites["add6_entry"] == ("libupt.so:upt_add6", "attached", 1)  # the app's PLT slot
    assert sites["sum8_entry"][:2] == ("libupt.so:upt_sum8", "attached")  # reached through dlsym only
    # the GOT slot bound to the shim's own cuLaunchKernel hook stays: its launches (LAUNCHES) still counted
    assert sites["driver_launch"] == ("libcuda.so.1:cuLaunchKernel", "attached", 0)


def test_uprobes_send_records_to_ring_and_perf_buffers_from_c(stub_job, uprobe_app, tmp_path):
    """bpf_ringbuf_output and bpf_perf_event_output in uprobes, which run only in C: every call's record
    reaches the ring, every return's the perf buffer (the host as CPU 0), in order, in the dump. Reserved
    in place (bpf_ringbuf_reserve, submit, discard): a submitted record arrives zeroed where the probe did
    not write it, a discarded one does not arrive, two held at once (filled by atomic adds, as the kernel
    allows on a record) arrive in the order they were submitted, and a reserve with flags gets NULL."""
    app, _ = uprobe_app
    obj = uprobe_probe(tmp_path, "records")
    n = 30
    r, (doc,), _ = run_kept(stub_job, tmp_path, obj, str(app), "calls", str(n))
    assert r.returncode == 0, r.stderr
    assert "not attached" not in r.stderr, r.stderr
    state = dump.restore_state(MapsState(load_object(obj).maps), doc["probes"][0])
    calls, returns, reserved_calls, reserved_returns = state.storages
    assert [struct.unpack("<qq", rec) for rec in calls.records] == [(i, i + 1) for i in range(n)]
    assert [(cpu, struct.unpack("<q", rec)[0]) for cpu, rec in returns.records] == [(0, 6 * i + 15) for i in range(n)]
    assert [struct.unpack("<qq", rec) for rec in reserved_calls.records] == \
        [(i, i + 1 if i % 3 == 1 else 0) for i in range(n) if i % 3]   # a field left unwritten reads 0
    assert [struct.unpack("<q", rec)[0] for rec in reserved_returns.records] == \
        [v for i in range(n) for v in (-(6 * i + 15), 6 * i + 15)]


def test_uprobes_use_queue_stack_and_bloom_filter_maps_in_c(stub_job, uprobe_app, tmp_path):
    """tests/uprobe_probes/queue.bpf.c under egpu-run: 30 calls of upt_add6(i, ...) leave the queue its last four
    arguments (BPF_EXIST dropped the oldest), the stack what its pushes and pops left (16 pushes refused as full,
    10 pops), the bloom filter no miss of a pushed value; egpu-run prints the queue and stack in pop order, the
    bloom filter as its size."""
    app, _ = uprobe_app
    obj = uprobe_probe(tmp_path, "queue")
    r, (doc,), _ = run_kept(stub_job, tmp_path, obj, str(app), "calls", "30")
    assert r.returncode == 0, r.stderr
    assert "not attached" not in r.stderr, r.stderr
    state = dump.restore_state(MapsState(load_object(obj).maps), doc["probes"][0])
    fifo, lifo = state.storages[:2]
    assert [struct.unpack("<q", v)[0] for _, v in fifo.items()] == [26, 27, 28, 29]
    assert [struct.unpack("<q", v)[0] for _, v in lifo.items()] == [1, 2, 4, 28]   # oldest first
    assert "@fifo: 26\n@fifo: 27\n@fifo: 28\n@fifo: 29\n" in r.stdout
    assert "@lifo: 28\n@lifo: 4\n@lifo: 2\n@lifo: 1\n" in r.stdout
    assert "@seen: bloom filter of 2048 bits, 5 hash functions\n" in r.stdout
    assert "@queue.bss: { counts: [16, 0, 10], last_a: 29 }" in r.stdout   # counts[1]: no pushed value missed


def test_a_uprobe_calls_bpf_loop_in_c(stub_job, uprobe_app, tmp_path):
    """tests/uprobe_probes/loop.bpf.c: bpf_loop in a uprobe, which runs only in C, where it once was refused (the
    uprobe reported not attached). 12 calls of upt_add6(i, ...) loop min(i, 5) rounds (the callback stops at
    index 4), summing the indices on the uprobe's stack; flags give -EINVAL with no round."""
    app, _ = uprobe_app
    obj = uprobe_probe(tmp_path, "loop")
    n = 12
    r, (doc,), _ = run_kept(stub_job, tmp_path, obj, str(app), "calls", str(n))
    assert r.returncode == 0, r.stderr
    assert "not attached" not in r.stderr, r.stderr
    state = dump.restore_state(MapsState(load_object(obj).maps), doc["probes"][0])
    (bss,) = [s for s in state.storages if s.mapdef.name.endswith(".bss")]
    rounds = [min(i, 5) for i in range(n)]
    assert struct.unpack("<3q", bss.values[0]) == (sum(k * (k - 1) // 2 for k in rounds), sum(rounds), -22 * n)


def test_egpu_maps_reads_a_running_jobs_queue_stack_and_bloom_filter(stub_job, uprobe_app, tmp_path):
    """queue.bpf.c in a job that calls upt_add6 until stopped: egpu maps prints its queue and stack as egpu-run
    does at exit (values in pop order, read from the C engine), its bloom filter as its size, and --json has the
    queue's values as records."""
    app, _ = uprobe_app
    obj = uprobe_probe(tmp_path, "queue")
    with attachable_job(stub_job, tmp_path, app, "loop", ("-p", str(obj))) as (pid, egpu):
        deadline = time.monotonic() + 30
        while "@fifo: " not in (text := egpu("maps", pid)).stdout and time.monotonic() < deadline:
            time.sleep(0.05)
        assert text.returncode == 0 and len(re.findall(r"^@fifo: \d+$", text.stdout, re.M)) == 4, text
        assert re.search(r"^@lifo: \d+$", text.stdout, re.M), text.stdout
        assert "@seen: bloom filter of 2048 bits, 5 hash functions\n" in text.stdout
        doc = json.loads(egpu("maps", pid, "--json").stdout)["maps"]
        assert len(doc["fifo"]["records"]) == 4, doc["fifo"]


BURST_CALLS = 4 * 20000   # app_uprobe bench_threads 20000 4: calls of upt_inc


def lossy_burst(stub_job, uprobe_app, tmp_path, *args: str, **env: str) -> tuple[Any, dict, int, dict[str, int]]:
    """4 threads call upt_inc 20,000 times each under egpu-run ``args``; at each call a uprobe in C makes a bpf_printk
    line, a ring buffer record and a perf buffer record, faster than the drain thread takes them out of C's buffer.
    (result, its dump, the lines egpu-run says were dropped, records dropped by map, as it says). Every call is
    accounted for among the lines: those the dump has (under --trace, the trace file's trace_printk rows) plus
    those dropped."""
    app, _ = uprobe_app
    obj = uprobe_probe(tmp_path, "lossy")
    r, (doc,), _ = run_kept(stub_job, tmp_path, obj, *args, "--uprobe", "lossy=libupt.so:upt_inc", str(app),
                            "bench_threads", "20000", "4", **env)
    assert r.returncode == 0, r.stderr
    lines = re.search(r"^egpu: (\d+) bpf_printk lines of host probes dropped \(the C buffer was full\)$", r.stderr,
                      re.M)
    lost = {m[1]: int(m[0]) for m in re.findall(r"^egpu: .*lossy\.bpf\.o: (\d+) records of host probes for @(\w+) "
                                                r"dropped \(the C buffer was full; counted in its dropped\)$",
                                                r.stderr, re.M)}
    dropped = int(lines[1]) if lines else 0
    kept = len(doc["probes"][0]["trace"])
    if "--trace" in args:
        from egpu_preload.output import tracefile
        rows = tracefile.read(Path(args[args.index("--trace") + 1])).rows.column("map").to_pylist()
        assert not kept, "the lines went to the exit dump, not the trace file"
        kept = rows.count(tracefile.TRACE_PRINTK)
    assert kept + dropped == BURST_CALLS, r.stderr
    return r, doc, dropped, lost


def test_records_lost_to_a_full_c_buffer_count_as_what_they_were(stub_job, uprobe_app, tmp_path):
    """The burst under --on-full drop (no --trace): every call is accounted for in each kind, the records each map
    has plus its dropped count (where the map's own drops count too). Every record lost in C was counted as a
    bpf_printk line, and the maps' dropped counts said nothing of it."""
    r, doc, dropped, lost = lossy_burst(stub_job, uprobe_app, tmp_path)
    assert dropped and set(lost) == {"calls", "also"}, r.stderr   # the drain ran behind: each kind lost some
    state = dump.restore_state(MapsState(load_object(tmp_path / "lossy.bpf.o").maps), doc["probes"][0])
    for name in ("calls", "also"):
        storage = state.by_name(name)
        assert len(storage.records) + storage.drops == BURST_CALLS and storage.drops >= lost[name], (name, r.stderr)


@pytest.mark.parametrize("stall_ms", [None, "1"])
def test_under_on_full_wait_the_burst_waits_for_the_drain_thread(stub_job, uprobe_app, tmp_path, stall_ms):
    """The burst under --trace, whose --on-full wait makes each hook that finds C's buffer full wait for the
    drain thread to take: every line and record arrives (in the trace file), none dropped. With the
    stall time cut to 1 ms (EGPU_WAIT_STALL_MS), under the drain thread's 2 ms sleep between passes, hooks give
    up again: what they lose is dropped and counted as under drop, and the job goes on."""
    from egpu_preload.output import tracefile
    out = tmp_path / "t.arrow"
    r, _, dropped, lost = lossy_burst(stub_job, uprobe_app, tmp_path, "--trace", str(out),
                                      **({"EGPU_WAIT_STALL_MS": stall_ms} if stall_ms else {}))
    trace = tracefile.read(out)
    rows = trace.rows.to_pylist()
    for name in ("calls", "also"):
        assert len([x for x in rows if x["map"] == name]) + trace.dropped[name] == BURST_CALLS, (name, r.stderr)
    if stall_ms is None:
        assert (dropped, lost, trace.dropped["calls"], trace.dropped["also"]) == (0, {}, 0, 0), r.stderr
        assert f"egpu-run: {3 * BURST_CALLS:,} records in {out}, none dropped" in r.stderr.splitlines(), r.stderr
    else:
        assert dropped and set(lost) == {"calls", "also"}, r.stderr


def test_a_uprobe_reads_the_calling_threads_id_and_name(stub_job, uprobe_app, tmp_path):
    """A uprobe runs in the thread that called. Linux's bpf_get_current_pid_tgid gives it tgid << 32 | that
    thread's id, so per-thread state is kept under it (an entry's time or argument, read at the return), and
    bpf_get_current_comm its name, which libbpf-tools key their counts by: app_uprobe's 4 bench threads, named
    upt-bench0..3, call upt_inc 10,000 times each. Every thread read the process's main thread's id there (all
    calls under one key), and get_current_comm was an unknown helper (the probe was not attached). Its
    bpf_get_current_uid_gid is gid << 32 | uid as the job's process has them (an unknown helper too)."""
    app, _ = uprobe_app
    obj = uprobe_probe(tmp_path, "by_thread")
    r, (doc,), _ = run_kept(stub_job, tmp_path, obj, "--uprobe", "by_thread=libupt.so:upt_inc", str(app),
                            "bench_threads", "10000", "4")
    assert r.returncode == 0, r.stderr
    by_tid = entries(doc, obj, "by_tid")
    assert sorted(by_tid.values()) == [10000] * 4, by_tid
    assert len({key >> 32 for key in by_tid}) == 1 and all(key >> 32 != key & 0xFFFFFFFF for key in by_tid), by_tid
    state = dump.restore_state(MapsState(load_object(obj).maps), doc["probes"][0])
    by_comm = {bytes(k): int.from_bytes(v, "little") for k, v in state.by_name("by_comm").items()}
    assert by_comm == {f"upt-bench{k}".encode().ljust(16, b"\0"): 10000 for k in range(4)}, by_comm
    assert entries(doc, obj, "uid_gid") == {0: os.getgid() << 32 | os.getuid()}


def test_a_uprobe_reads_a_string_argument_from_the_applications_memory(stub_job, uprobe_app, tmp_path):
    """bpf_probe_read_user_str and bpf_probe_read_user, the way libbpf tools (bpftime's bashreadline, sslsniff,
    goroutine) read what an argument points to, were unknown helpers: the probe was refused. A name longer
    than the buffer is cut to its size with the NUL (16), and NULL, which the application has not mapped, gives
    -EFAULT (-14) with the buffers zeroed, as Linux gives."""
    app, _ = uprobe_app
    obj = uprobe_probe(tmp_path, "strings")
    r, (doc,), _ = run_kept(stub_job, tmp_path, obj, str(app), "names", "5")
    assert r.returncode == 0, r.stderr
    assert "app_uprobe names calls=7 total=50 result=0" in r.stdout   # 26 - 1 + 5 * 5: the calls unchanged
    state = dump.restore_state(MapsState(load_object(obj).maps), doc["probes"][0])
    names = {bytes(k).rstrip(b"\0"): int.from_bytes(v, "little") for k, v in state.by_name("names").items()}
    assert names == {b"alpha": 5, b"a-name-of-twent": 1, b"": 1}, names
    results = {int.from_bytes(k, "little", signed=True): int.from_bytes(v, "little")
               for k, v in state.by_name("results").items()}
    assert results == {6: 5, 16: 1, -14: 1, 1000: 6, 1000 - 14: 1, 2000 + ord("a"): 6, 2000: 1}, results


def test_reading_the_applications_memory_is_refused_outside_its_threads():
    """A GPU or launch probe runs where no application thread is: the verifier says so (a uprobe may)."""
    code = (struct.pack("<BBhi", 0xbf, 0xa1, 0, 0) + struct.pack("<BBhi", 0x07, 0x01, 0, -8)   # r1 = r10 - 8
            + struct.pack("<BBhi", 0xb7, 0x02, 0, 8) + struct.pack("<BBhi", 0xb7, 0x03, 0, 0)   # r2 = 8, r3 = 0
            + struct.pack("<BBhi", 0x85, 0, 0, 112) + struct.pack("<BBhi", 0x95, 0, 0, 0))      # probe_read_user
    verify(code, [], section="uprobe/libc.so.6:malloc")
    verify(code, [], section="egpu/memcpy/*")
    for section in ("kprobe/*", "egpu/launch/*"):
        why = (r"bpf_probe_read_user#112 reads the application's memory: only uprobes and host-API programs, which "
               r"run in its threads, may call it")
        with pytest.raises(VerifierError, match=why):
            verify(code, [], section=section)


def test_a_string_reads_length_bounds_what_is_sent_of_it():
    """bpf_probe_read_user_str returns the bytes it wrote, NUL included, at most its size, or -errno (Linux's
    do_refine_retval_range): a positive return sends that much of the buffer, as libbpf tools do (bashreadline).
    It was unknown, and the send refused as unbounded."""
    from egpu_preload.bpf import program as prog
    from egpu_preload.bpf.asm import assemble
    rb = prog.MapDef("rb", prog.MAP_RINGBUF, 0, 0, 4096)
    send = ("r1 = r10\nr1 += -16\nr2 = 16\nr3 = 0\ncall probe_read_user_str\nif r0 s< 1 goto out\nr3 = r0\n"
            "r2 = r10\nr2 += -16\nr1 = map[0] ll\nr4 = 0\ncall ringbuf_output\nout: r0 = 0\nexit")
    verify(assemble(send), [rb], section="uprobe/libc.so.6:puts")
    with pytest.raises(VerifierError, match=r"invalid stack access off=-16 size=17"):   # one past its size
        verify(assemble(send.replace("r3 = r0\n", "r3 = r0\nr3 += 1\n")), [rb], section="uprobe/libc.so.6:puts")


def test_egpu_ptx_leaves_the_programs_the_host_runs_out(tmp_path):
    """`egpu ptx` prints the GPU's programs alone: a uprobe that reads the application's memory (which has no
    GPU form) made it fail, though `egpu verify` passed the same object; a uprobe beside a kernel probe is left out
    of the PTX."""
    from typer.testing import CliRunner
    from launcher import egpu
    runner = CliRunner()
    strings, shared = uprobe_probe(tmp_path, "strings"), uprobe_probe(tmp_path, "shared")
    for cmd in ("verify", "ptx"):
        res = runner.invoke(egpu, [cmd, str(strings)])
        assert res.exit_code == 0, res.output
    res = runner.invoke(egpu, ["ptx", str(shared)])
    assert res.exit_code == 0, res.output
    names = {p.name for p in load_object(shared).programs}
    funcs = [n for n in names if f"_{n}(" in res.output]
    assert len(names) == 3 and funcs == ["launched"], (names, funcs)


def test_a_uprobe_hooked_once_its_library_was_loaded_reports_attached(stub_job, uprobe_app, tmp_path):
    """Uprobes on a library the job opens after their attach wait for it, and are hooked at the dlsym after its
    dlopen: every call runs them. The exit dump said "pending" still, the state the attach had left."""
    app, obj = uprobe_app
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", str(APP / "libupt.c"), "-o",
                    str(stub_job.driver_dir / "libuptlate.so")], check=True)
    n = 20
    r, (doc,), _ = run_kept(stub_job, tmp_path, obj, "--uprobe", "sum8_entry=libuptlate.so:upt_add6", "--uprobe",
                            "sum8_exit=libuptlate.so:upt_add6", str(app), "late", str(n))
    assert r.returncode == 0 and "app_uprobe late loaded=1 wrong=0 result=0" in r.stdout, r.stderr
    counts = entries(doc, obj, "counts")
    assert (counts[SUM8_CALLS], counts[SUM8_RETURNS]) == (n, n)
    states = {a["prog"]: a["state"] for a in doc["uprobes"]["attached"]}
    assert states["sum8_entry"] == states["sum8_exit"] == "attached", doc["uprobes"]


DIRECT = ["--uprobe", "sum8_entry=app_uprobe:upt_direct", "--uprobe", "sum8_exit=app_uprobe:upt_direct"]


def test_a_function_linked_into_the_executable_is_hooked_inline(stub_job, uprobe_app, tmp_path):
    """upt_direct is called directly and exported by no symbol table the loader reads: no GOT slot or
    dlsym reaches it, so it is hooked inline. Its first instructions (endbr64, a RIP-relative locked add)
    run moved; every call after the hook runs the entry and the return program, on exact values."""
    app, obj = uprobe_app
    n = 50
    r, (doc,), _ = run_kept(stub_job, tmp_path, obj, *DIRECT, str(app), "direct", str(n))
    assert r.returncode == 0, r.stderr
    assert f"app_uprobe direct calls={n} sum={sum(4 * i + 1 for i in range(n))} wrong=0 result=0" in r.stdout
    counts = entries(doc, obj, "counts")
    assert (counts[SUM8_CALLS], counts[SUM8_RETURNS]) == (n, n)
    assert entries(doc, obj, "returns") == {4 * i + 1: 1 for i in range(n)}
    states = {a["prog"]: (a["target"], a["state"], a["inline"]) for a in doc["uprobes"]["attached"]}
    assert states["sum8_entry"] == ("app_uprobe:upt_direct", "attached", True)
    assert states["add6_entry"] == ("libupt.so:upt_add6", "attached", False)


def test_an_inline_hook_is_not_stored_while_a_thread_stays_inside_its_bytes(stub_job, uprobe_app, tmp_path):
    """A thread that never leaves the 5 bytes the jump would cover (blocked in upt_parked's read, 2 bytes
    in): the hook is refused and says why, the function is left as it was, and the job runs on; a thread
    blocking every signal beside it (as the CUDA driver's do) is not waited for."""
    app, obj = uprobe_app
    r, docs, _ = run_kept(stub_job, tmp_path, obj, "--uprobe", "sum8_entry=app_uprobe:upt_parked", "--uprobe",
                          "sum8_exit=app_uprobe:upt_parked", str(app),
                          "parked", "0")
    assert r.returncode == 0 and "app_uprobe parked direct=5 result=0" in r.stdout, r.stderr
    (doc,) = docs
    (state,) = [a["state"] for a in doc["uprobes"]["attached"] if a["prog"] == "sum8_entry"]
    assert state.startswith("a thread stayed inside the 5 bytes"), doc["uprobes"]
    assert any("upt_parked" in x and "a thread stayed inside" in x for x in doc["uprobes"]["refused"])


def test_an_inline_hook_is_refused_when_the_application_owns_the_guards_signal(stub_job, uprobe_app, tmp_path):
    """The application has its own handler on SIGRTMAX-5, so the other threads cannot be held while the jump
    is stored: the hook is refused with that reason (before, the jump was stored unguarded and reported
    attached), the function is left as it was, and the job's calls, two threads' among them, stay right."""
    app, obj = uprobe_app
    n = 200
    r, docs, _ = run_kept(stub_job, tmp_path, obj, *DIRECT, str(app), "owned_signal", str(n))
    assert r.returncode == 0, r.stderr
    assert f"app_uprobe owned_signal calls={n} sum={sum(4 * i + 1 for i in range(n))} wrong=0 result=0" in r.stdout
    (doc,) = docs
    (state,) = [a["state"] for a in doc["uprobes"]["attached"] if a["prog"] == "sum8_entry"]
    assert state.startswith("the other threads could not be held"), doc["uprobes"]
    assert "SIGRTMAX-5 is the application's" in state
    assert entries(doc, obj, "counts").get(SUM8_CALLS, 0) == 0


def test_an_inline_hook_is_written_while_threads_run_the_function(stub_job, uprobe_app, tmp_path):
    """Two threads call upt_direct without pause while the runtime hooks it: each call runs the old code
    or the hooked, no result is wrong, and every call whose entry program ran ran its return program.
    Before the jump was stored with the other threads held (shim/uprobe.c store_stopped), this failed
    once in CI under load: a thread stopped after the endbr64 resumed inside the jump."""
    app, obj = uprobe_app
    n = 1000
    r, docs, _ = run_kept(stub_job, tmp_path, obj, *DIRECT, str(app), "direct_threads", str(n))
    assert len(docs) == 1, f"exit {r.returncode}, no exit dump: {r.stderr[-2000:]}"
    doc = docs[0]
    assert r.returncode == 0, r.stderr
    assert "wrong=0 result=0" in r.stdout, r.stdout
    counts = entries(doc, obj, "counts")
    assert counts[SUM8_CALLS] >= n and counts[SUM8_RETURNS] == counts[SUM8_CALLS]


def test_an_inline_hook_near_the_end_of_a_page_writes_within_it(stub_job, uprobe_app, tmp_path):
    """upt_edge starts 1 byte past an 8-byte boundary, 7 bytes before its page ends: the jump goes into the
    aligned word holding its 5 bytes, not into the 8 bytes from the function's start (the last of them on the
    next page, which the shim had not made writable: the job died of SIGSEGV as the hook was stored)."""
    app, obj = uprobe_app
    n = 50
    r, docs, _ = run_kept(stub_job, tmp_path, obj, "--uprobe", "sum8_entry=app_uprobe:upt_edge", "--uprobe",
                          "sum8_exit=app_uprobe:upt_edge", str(app), "edge", str(n))
    assert r.returncode == 0 and f"app_uprobe edge calls={n} wrong=0 result=0" in r.stdout, r.stderr[-2000:]
    (doc,) = docs
    assert entries(doc, obj, "counts")[SUM8_CALLS] == n
    assert entries(doc, obj, "returns") == {i + 2: 1 for i in range(n)}


def test_detach_puts_back_only_the_bytes_the_jump_covered(stub_job, uprobe_app, tmp_path):
    """While upt_near is hooked inline, the application changes the instruction right after the jump's 5 bytes
    (as a debugger's breakpoint there would): detach restores those 5 bytes and leaves the change (before, it
    wrote back the 8 bytes it had read at attach, undoing it)."""
    app, _ = uprobe_app
    live = uprobe_probe(tmp_path, "live", "-DNEAR")
    with attachable_job(stub_job, tmp_path, app, "near_loop") as (pid, egpu):
        r = egpu("attach", pid, "-p", str(live))
        assert r.returncode == 0, r.stderr
        deadline = time.monotonic() + 10
        while live_maps(egpu("maps", pid, "--json"), "counts").get(1, 0) < 10:   # returns of the changed code
            assert time.monotonic() < deadline, "no calls hooked"
            time.sleep(0.05)
        r = egpu("detach", pid)
        assert r.returncode == 0, r.stderr
    # attachable_job: the job's every result was right, and at the end upt_near was unhooked, still changed


@pytest.mark.parametrize("code, why", [
    (bytes.fromhex("eb0290909090c3"), "its first 5 bytes hold a branch (jmp"),
    (bytes.fromhex("31c0c3"), "its first 5 bytes hold a branch (ret)"),   # a function of 3 bytes
    (bytes.fromhex("31c0"), "do not decode"),
])
def test_a_prologue_that_cannot_move_is_refused_with_the_reason(code, why):
    from egpu_preload.errors import EgpuError
    from egpu_preload.runtime.inline_hooks import moved
    with pytest.raises(EgpuError, match=re.escape(why)):
        moved(code, 0x1000, 0x2000)


def test_moved_instructions_keep_their_operands():
    """A relative call keeps its callee and a RIP-relative operand its address, from the trampoline."""
    from egpu_preload.runtime.inline_hooks import moved
    at, to = 0x400000, 0x500010
    code = bytes.fromhex("f30f1efa" "e8f00f0000" "488b0508000000" "c3")   # endbr64; call +0xff0; mov rax, [rip+8]
    out, cut = moved(code, at, to)
    assert cut == 9 and out[:4] == code[:4] and out[4] == 0xE8
    assert to + 4 + 5 + int.from_bytes(out[5:9], "little", signed=True) == at + 4 + 5 + 0xFF0
    out, cut = moved(code[9:], at + 9, to)
    assert cut == 7 and to + 7 + int.from_bytes(out[3:7], "little", signed=True) == at + 9 + 7 + 8


def test_a_bare_uprobe_needs_a_target(stub_job, uprobe_app, tmp_path):
    app, obj = uprobe_app
    from stub_job import egpu_run
    r = egpu_run(["-p", str(obj), str(app), "calls", "1"], stub_job.env(tmp_path / "log"))
    assert r.returncode == 125
    assert "prog sum8_entry (uprobe): no target: give egpu-run --uprobe sum8_entry=PATH:SYMBOL" in r.stderr
    r = egpu_run(["-p", str(obj), *BARE, "--uprobe", "add6_entry=libupt.so:upt_add6", str(app), "calls", "1"],
                 stub_job.env(tmp_path / "log"))
    assert r.returncode == 125
    assert "--uprobe add6_entry=...: no bare uprobe or uretprobe program is named add6_entry" in r.stderr


def test_a_missing_function_is_reported_and_the_job_runs(stub_job, uprobe_app, tmp_path):
    app, obj = uprobe_app
    r, (doc,), _ = run_kept(stub_job, tmp_path, obj, "--uprobe", "sum8_entry=libupt.so:no_such_function",
                            "--uprobe", "sum8_exit=libupt.so:upt_sum8", str(app), "calls", "3")
    assert r.returncode == 0, r.stderr
    assert "prog sum8_entry (uprobe): not attached at libupt.so:no_such_function: no such function in it" in r.stderr
    assert entries(doc, obj, "counts")[ADD6_CALLS] == 3


def test_a_library_not_loaded_is_named_and_the_job_runs(stub_job, uprobe_app, tmp_path):
    """A target in a library no loaded object is (misspelt here, or one the job opens later) waits for it to be
    loaded; before, egpu-run said nothing of it, so a misspelt library failed silently."""
    app, obj = uprobe_app
    r, (doc,), _ = run_kept(stub_job, tmp_path, obj, "--uprobe", "sum8_entry=libupt_typo.so:upt_sum8",
                            "--uprobe", "sum8_exit=libupt.so:upt_sum8", str(app), "calls", "3")
    assert r.returncode == 0, r.stderr
    assert ("prog sum8_entry (uprobe): no loaded object is libupt_typo.so yet: libupt_typo.so:upt_sum8 is hooked "
            "once one is loaded") in r.stderr
    assert [ln for ln in r.stderr.splitlines() if "no loaded object" in ln] == \
        [ln for ln in r.stderr.splitlines() if "sum8_entry" in ln], r.stderr   # one line, naming it
    assert entries(doc, obj, "counts")[ADD6_CALLS] == 3


def ctx_read(off: int) -> bytes:
    return struct.pack("<BBhi", 0x79, 0x10, off, 0) + struct.pack("<BBhi", 0x95, 0, 0, 0)


@pytest.mark.parametrize("section, off, ok", [
    ("uprobe/libc.so.6:malloc", 112, True),     # di: PT_REGS_PARM1
    ("uretprobe/libc.so.6:malloc", 80, True),   # ax: PT_REGS_RC
    ("uprobe", 160, True),                      # ss, the last field
    ("uprobe", 168, False),                     # past struct pt_regs
    ("kprobe/vecadd", 112, False),              # GPU probes get struct egpu_ctx: grid[1] is 4 bytes
])
def test_host_programs_read_pt_regs(section, off, ok):
    if ok:
        verify(ctx_read(off), [], section=section)
    else:
        with pytest.raises(VerifierError, match="invalid ctx access"):
            verify(ctx_read(off), [], section=section)


@contextlib.contextmanager
def attachable_job(stub_job, tmp_path: Path, app: Path, mode: str, options: tuple[str, ...] = (),
                   ended: list[str] | None = None, **env: str) -> Iterator[tuple[str, Any]]:
    """app_uprobe ``mode`` (a loop) under egpu-run with ``options`` (no probe unless they give one): (its pid,
    egpu(*args) run against it as the console script); at the end the loop stops, and every result it got
    must have been right. ``ended`` gets egpu-run's stdout and stderr."""
    from egpu_preload.control import list_sessions
    environ = stub_job.env(tmp_path / "log", **env)
    stop = tmp_path / "stop"
    proc = subprocess.Popen([sys.executable, "-c", "import launcher; launcher.run_main()", *options, str(app), mode,
                             str(stop)],
                            env=environ, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def egpu(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", "import launcher; launcher.egpu_main()", *args], env=environ,
                              capture_output=True, text=True, timeout=60, cwd=ROOT)

    try:
        deadline = time.monotonic() + 30
        while not (found := [s for s in list_sessions(tmp_path / "egpu") if s.info and str(app) in s.info["argv"]]):
            assert time.monotonic() < deadline, "no session"
            time.sleep(0.05)
        yield str(found[0].pid), egpu
    finally:
        stop.touch()
        out, err = proc.communicate(timeout=60)
    if ended is not None:
        ended += [out, err]
    assert proc.returncode == 0, err
    assert "wrong=0" in out


def live_maps(r: subprocess.CompletedProcess, name: str) -> dict[int, int]:
    """Map ``name`` of the probe in egpu maps or detach --json's document, as integers."""
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    return {e["key"]: e["value"] for e in doc["maps"].get(name, {}).get("entries", [])}


@pytest.mark.parametrize("defines, mode", [([], "loop"), (["-DDIRECT"], "direct_loop")], ids=["got", "inline"])
def test_egpu_attach_hooks_a_running_job_and_detach_unhooks_it(stub_job, uprobe_app, tmp_path, defines, mode):
    """app_uprobe loop under egpu-run with no probe: egpu attach hooks upt_add6 through the app's GOT (or
    upt_direct inline), the maps fill while it runs, detach gives the final maps and puts the slot (or the
    function's bytes) back (the job's results stay right throughout, and a second attach starts from zero)."""
    app, _ = uprobe_app
    live = uprobe_probe(tmp_path, "live", *defines)

    def counts(r: subprocess.CompletedProcess) -> list[int]:
        """counts[0..2] (calls, returns, right returns) of egpu maps/detach --json."""
        by_key = live_maps(r, "counts")
        return [by_key.get(k, 0) for k in range(3)]

    with attachable_job(stub_job, tmp_path, app, mode) as (pid, egpu):
        for attempt in range(2):
            r = egpu("attach", pid, "-p", str(live))
            assert r.returncode == 0, r.stderr
            time.sleep(0.5)
            running = counts(egpu("maps", pid, "--json"))
            assert running and running[0] > 0
            final = counts(egpu("detach", pid, "--json"))
            # entry and return programs start and stop together; a call inside upt_add6 at detach ran its
            # entry program and no return program
            assert final[0] >= running[0] and final[0] - final[1] in (0, 1) and final[2] == final[1], final
    assert "egpu_globaltimer" not in (tmp_path / "log").read_text()   # no map shared with GPU programs: no clock


def test_egpu_maps_reads_the_uprobes_egpu_run_attached(stub_job, uprobe_app, tmp_path):
    """live.bpf.c given to egpu-run: its uprobes' maps are the host side the launch drainer keeps in C (no
    GPU program: no device maps), which egpu maps and --mirror read as the exit dump does, counting on."""
    app, _ = uprobe_app
    live = uprobe_probe(tmp_path, "live")
    with attachable_job(stub_job, tmp_path, app, "loop", ("--mirror", "0.05", "-p", str(live))) as (pid, egpu):
        time.sleep(0.5)
        first = live_maps(egpu("maps", pid, "--json"), "counts")
        time.sleep(0.3)
        later = live_maps(egpu("maps", pid, "--mirror", "--json"), "counts")
    assert first[0] > 0 and later[0] > first[0] and later[2] > 0, (first, later)


@pytest.mark.parametrize("started", [False, True], ids=["attached", "started"])
def test_a_swap_that_fails_puts_the_old_uprobes_back_as_they_were(stub_job, uprobe_app, tmp_path, started):
    """A swap refused after the old probe's uprobes were paused (the new probe's maps do not fit the device)
    runs them again, still hooked: the old probe counts on from where it was, exactly, attached live or given
    to egpu-run (``started``: they were once hooked a second time, live, from zero, so its counts went back
    and every call ran it twice). A call that entered while they were paused returns without them, so returns
    stay at or one below calls (a return counted without its call failed CI once)."""
    app, _ = uprobe_app
    clang = find_clang()
    objs = {name: tmp_path / f"{name}.bpf.o" for name in ("live", "big")}
    for name, defines in (("live", []), ("big", ["-DBIG"])):
        subprocess.run([clang, *bpftime_cflags(clang), *defines, "-c",
                        str(ROOT / "tests" / "uprobe_probes" / "live.bpf.c"), "-o", str(objs[name])], check=True)
    options = ("-p", str(objs["live"])) if started else ()
    with attachable_job(stub_job, tmp_path, app, "loop", options, EGPU_STUB_ALLOC_LIMIT=str(1 << 22)) as (pid, egpu):
        assert started or egpu("attach", pid, "-p", str(objs["live"])).returncode == 0
        time.sleep(3)   # longer than the swap and the next read take: counts made again from zero stay below
        before = live_maps(egpu("maps", pid, "--json"), "counts")
        r = egpu("swap", pid, "live", str(objs["big"]))
        assert r.returncode != 0 and " big" not in egpu("ps").stdout, r.stdout + r.stderr
        after = live_maps(egpu("maps", pid, "--json"), "counts")
        time.sleep(0.3)
        later = live_maps(egpu("maps", pid, "--json"), "counts")
        final = live_maps(egpu("detach", pid, "--json"), "counts")
    assert before[0] > 0 and after[0] >= before[0] and later[0] > after[0], (before, after, later)
    assert final[0] >= later[0] and final[0] - final[1] in (0, 1) and final[2] == final[1], final


GPU_LAUNCHES, CALLS, RETURNS, RIGHT_RETURNS, CALL_TIME, FIRST, LAST = range(7)   # shared.bpf.c's counts


def test_egpu_attach_takes_uprobes_that_share_maps_with_gpu_programs(stub_job, uprobe_app, tmp_path):
    """shared.bpf.c attached live to app_uprobe launch_loop: its uprobes' writes reach the device copy (egpu
    maps reads the shared maps there: slot GPU_LAUNCHES, which only the stand-in's launches write, sits beside
    the uprobes' counts), the clock is put on the GPU's once (the stand-in's kernel stores nothing: so
    CLOCK_REALTIME), detach's final maps are exact, a second attach starts from zero, and a swap to a second
    such object takes both regions over with their contents and pushes into them."""
    app, _ = uprobe_app
    clang = find_clang()
    objs = [tmp_path / "shared.bpf.o", tmp_path / "second.bpf.o"]
    for obj, defines in zip(objs, ([], ["-DSECOND"])):
        subprocess.run([clang, *bpftime_cflags(clang), *defines, "-c", str(ROOT / "tests" / "uprobe_probes" /
                        "shared.bpf.c"), "-o", str(obj)], check=True)
    log = tmp_path / "log"

    def exact(r: subprocess.CompletedProcess, missed: bool = False) -> dict[int, int]:
        """counts of a detach reply, checked: every call from the first one hooked to the last counted once
        (``missed``: but those a swap made between unhooking the old uprobes and hooking the new), its
        return too (but for one inside upt_add6 at the end); seen counted them alike."""
        final, seen = live_maps(r, "counts"), live_maps(r, "seen")
        calls = final[LAST] - (final[FIRST] - 1) + 1
        assert final[CALLS] <= calls if missed else final[CALLS] == calls, final
        assert final[CALLS] - final[RETURNS] in (0, 1) and final[RIGHT_RETURNS] == final[RETURNS], final
        assert sum(seen.values()) == final[CALLS], (seen, final)
        return final

    with attachable_job(stub_job, tmp_path, app, "launch_loop", EGPU_STUB_PROBE_COUNTS="1") as (pid, egpu):
        for attempt in range(2):
            r = egpu("attach", pid, "-p", str(objs[0]))
            assert r.returncode == 0, r.stderr
            measured = log.read_text().count("egpu_globaltimer")
            assert measured, "the first attach of such an object measures %globaltimer"
            time.sleep(0.5)
            first = live_maps(egpu("maps", pid, "--json"), "counts")
            time.sleep(0.3)
            r = egpu("maps", pid, "--json")
            running, seen = live_maps(r, "counts"), live_maps(r, "seen")
            assert first[GPU_LAUNCHES] > 0 and first[CALLS] > 0 and seen, first   # both sides' writes, on the device
            assert running[CALLS] > first[CALLS] and running[GPU_LAUNCHES] > first[GPU_LAUNCHES], (first, running)
            assert abs(running[CALL_TIME] - time.time_ns()) < 60e9, running[CALL_TIME]   # CLOCK_REALTIME
            if attempt == 0:
                assert exact(egpu("detach", pid, "--json"))[CALLS] >= running[CALLS]
                continue
            r = egpu("swap", pid, "shared", str(objs[1]))
            assert r.returncode == 0, r.stderr
            time.sleep(0.2)
            after = live_maps(egpu("maps", pid, "--json"), "counts")
            # the new uprobes start from the regions they took over (FIRST stays) and go on counting there
            assert after[FIRST] == running[FIRST] and after[CALLS] > running[CALLS], (running, after)
            assert exact(egpu("detach", pid, "--json"), missed=True)[CALLS] >= after[CALLS]
        assert log.read_text().count("egpu_globaltimer") == measured, "measured once per process"


@pytest.mark.parametrize("change", ["detach", "swap"])
def test_a_first_change_in_a_job_without_device_maps_leaves_the_others_readable(stub_job, uprobe_app, tmp_path,
                                                                                change):
    """Two copies of live.bpf.c given to egpu-run: only uprobes, so no device maps until the first change
    makes them. A detach or swap read the probes' maps before that (none): the detach published the other
    with none (every egpu maps after failed, AttributeError), the swap failed taking regions over from none.
    Now both go through and the other probe counts on."""
    app, _ = uprobe_app
    clang = find_clang()
    objs = {name: tmp_path / f"{name}.bpf.o" for name in ("left", "kept", "twin")}
    for obj in objs.values():
        subprocess.run([clang, *bpftime_cflags(clang), "-c", str(ROOT / "tests" / "uprobe_probes" / "live.bpf.c"),
                        "-o", str(obj)], check=True)
    options = ("-p", str(objs["left"]), "-p", str(objs["kept"]))
    with attachable_job(stub_job, tmp_path, app, "loop", options) as (pid, egpu):
        time.sleep(0.5)
        args = ("detach", pid, "left") if change == "detach" else ("swap", pid, "left", str(objs["twin"]))
        left_final = live_maps(egpu(*args, "--json"), "counts")
        time.sleep(0.3)
        kept = live_maps(egpu("maps", pid, "--json"), "counts" if change == "detach" else "kept:counts")
    assert left_final[0] > 0 and left_final[0] - left_final[1] in (0, 1) and left_final[2] == left_final[1]
    assert kept[0] > left_final[0], (left_final, kept)


def test_the_uprobes_of_a_probe_egpu_run_started_with_stop_at_its_detach_or_swap(stub_job, uprobe_app, tmp_path):
    """egpu detach or swap of a probe egpu-run started with unhooks its uprobes, its alone (Live._retire:
    Uprobes.detach_probe). Two copies of shared.bpf.c count upt_add6's calls into maps their GPU program
    shares, which the drain thread pushes into each one's own regions. After left's detach kept counts on
    there (the pushes went by position among the attached probes': kept's to none). Swapped for quiet, which
    takes its regions over and hooks only upt_half (never called), kept counts no more: what quiet reads
    there is exactly kept's final maps, every call kept's uprobes saw pushed before the flip copied them and
    none after (Live._stop). The exit dump lists no uprobe of egpu-run's hooked."""
    app, _ = uprobe_app
    clang = find_clang()
    objs = {name: tmp_path / f"{name}.bpf.o" for name in ("left", "kept", "quiet")}
    for name, obj in objs.items():
        subprocess.run([clang, *bpftime_cflags(clang), *(["-DQUIET"] if name == "quiet" else []), "-c",
                        str(ROOT / "tests" / "uprobe_probes" / "shared.bpf.c"), "-o", str(obj)], check=True)
    options = ("--keep", "-p", str(objs["left"]), "-p", str(objs["kept"]))
    with attachable_job(stub_job, tmp_path, app, "launch_loop", options) as (pid, egpu):
        time.sleep(0.5)
        left_final = live_maps(egpu("detach", pid, "left", "--json"), "counts")
        time.sleep(0.3)
        kept_after_detach = live_maps(egpu("maps", pid, "--json"), "counts")
        time.sleep(0.3)
        kept_later = live_maps(egpu("maps", pid, "--json"), "counts")
        r = egpu("swap", pid, "kept", str(objs["quiet"]), "--json")
        kept_final, kept_seen = live_maps(r, "counts"), live_maps(r, "seen")
        time.sleep(0.3)   # a push of kept's keys after the flip would have come by now
        r = egpu("maps", pid, "--json")
        quiet_after_swap, quiet_seen = live_maps(r, "counts"), live_maps(r, "seen")
        time.sleep(0.5)
        quiet_later = live_maps(egpu("maps", pid, "--json"), "counts")
    assert left_final[CALLS] > 0 and kept_after_detach[LAST] > left_final[LAST], (left_final, kept_after_detach)
    assert kept_later[CALLS] > kept_after_detach[CALLS], (kept_after_detach, kept_later)
    assert kept_final[CALLS] >= kept_later[CALLS], (kept_later, kept_final)
    # the regions quiet took over hold kept's final counts, and nothing adds to them once the swap is over
    uprobes_part = {k: v for k, v in quiet_after_swap.items() if k != GPU_LAUNCHES}
    assert uprobes_part == {k: v for k, v in kept_final.items() if k != GPU_LAUNCHES}, (kept_final, quiet_after_swap)
    assert quiet_seen == kept_seen and kept_final[CALLS] > kept_later[CALLS], (kept_seen, quiet_seen)
    assert quiet_later == quiet_after_swap, (quiet_after_swap, quiet_later)
    (session,) = (tmp_path / "egpu").glob("session-*")
    (doc,) = dump.read_all(session)
    assert doc["uprobes"]["attached"] == [], doc["uprobes"]


ALLOCS, ALLOC_BYTES, COPIES, COPY_BYTES, FREES, LAUNCH_RUNS, EVENTS = range(7)   # host_probes/threads.bpf.c
THREAD_CALLS, THREAD_RETURNS, THREAD_RIGHT = range(3)   # uprobe_probes/threads_live.bpf.c


def test_probes_in_many_threads_and_the_runtimes_count_exactly_while_uprobes_come_and_go(stub_job, uprobe_app,
                                                                                          tmp_path):
    """app_stress.c's 8 threads allocate, copy, launch, call upt_add6 and free, in a loop, under host-API
    programs (run in those threads) and a launch program (on the drainer) sharing two maps, while egpu attach
    and detach hook a uprobe object with a GPU program (its writes pushed to the device copy) over and over
    through the control socket: the job ends well, every call and launch record counted once, in total and
    by thread, and each attach's counts are whole (returns but for calls inside at the detach)."""
    clang = find_clang()
    d = stub_job.driver_dir
    app, host, live = d / "app_stress", tmp_path / "threads.bpf.o", tmp_path / "threads_live.bpf.o"
    for step in (["gcc", "-O1", "-Wall", "-Werror", str(APP / "app_stress.c"), "-o", str(app), f"-L{d}", "-lupt",
                  f"-Wl,-rpath,{d}", "-ldl", "-pthread"],
                 [clang, *bpftime_cflags(clang), "-c", str(ROOT / "tests" / "uprobe_probes" / "threads_live.bpf.c"),
                  "-o", str(live)]):
        subprocess.run(step, check=True)
    compile_probe(ROOT / "tests" / "host_probes" / "threads.bpf.c", host)
    ended: list[str] = []
    with attachable_job(stub_job, tmp_path, app, "20000", ("--keep", "-p", str(host)), ended,
                        EGPU_STUB_LOG="") as (pid, egpu):
        for _ in range(3):
            r = egpu("attach", pid, "-p", str(live))
            assert r.returncode == 0, r.stderr
            time.sleep(0.2)
            final = live_maps(egpu("detach", pid, "threads_live", "--json"), "counts")
            calls, returns = final.get(THREAD_CALLS, 0), final.get(THREAD_RETURNS, 0)
            assert calls > 0 and 0 <= calls - returns <= 8 and final.get(THREAD_RIGHT, 0) == returns, final
    out, err = ended
    assert "fault" not in err and "Traceback" not in err, err
    rounds = [int(r) for r in re.findall(r"^thread \d rounds=(\d+)$", out, re.M)]
    assert len(rounds) == 8 and f"rounds={sum(rounds)} wrong=0 failed=0" in out, out
    (doc,) = dump.read_all(Path(re.search(r"session kept in (\S+)", err).group(1)))
    totals = entries(doc, host, "totals")
    by_thread = {t: struct.unpack("<3Q", v.to_bytes(24, "little")) for t, v in entries(doc, host, "by_thread").items()}
    n, recorded = sum(rounds), totals[LAUNCH_RUNS]
    assert recorded + doc["stats"]["dropped"] == n, (recorded, doc["stats"])
    assert [totals[k] for k in (ALLOCS, COPIES, FREES, EVENTS)] == [n, n, n, 3 * n + recorded], totals
    assert totals[ALLOC_BYTES] == sum(256 * (t + 1) * r for t, r in enumerate(rounds)), totals
    assert totals[COPY_BYTES] == sum(16 * (t + 1) * r for t, r in enumerate(rounds)), totals
    assert [by_thread[t][:2] for t in range(8)] == [(r, r) for r in rounds], by_thread
    tids = entries(doc, host, "tids")   # host-API programs run in the calling thread: its id, as Linux's
    assert len(tids) == 8 and len({k >> 32 for k in tids}) == 1 and all(k >> 32 != k & 0xFFFFFFFF for k in tids), tids
    assert sum(v[2] for v in by_thread.values()) == recorded, by_thread


def test_egpu_verify_says_where_each_uprobe_attaches(uprobe_app):
    from typer.testing import CliRunner
    from launcher import egpu
    _, obj = uprobe_app
    res = CliRunner().invoke(egpu, ["verify", str(obj)])
    assert res.exit_code == 0, res.output
    assert "prog add6_entry (uprobe/libupt.so:upt_add6): host uprobe on libupt.so:upt_add6" in res.output
    assert ("prog sum8_exit (uretprobe): host uprobe on the function egpu-run --uprobe sum8_exit=PATH:SYMBOL "
            "names") in res.output


def test_egpu_attach_refuses_bare_uprobes(uprobe_app):
    """A running job has no --uprobe to name their target."""
    from egpu_preload.runtime.probes import load_probe
    from egpu_preload.runtime.uprobes import live_refusal
    _, obj = uprobe_app
    assert live_refusal(load_probe(obj)) == ('prog sum8_entry is a bare uprobe: egpu attach takes '
                                            'SEC("uprobe/PATH:SYMBOL") ones only')


def test_uprobes_may_print_where_egpu_run_takes_the_lines(tmp_path):
    """One refusal rule for an object's host side: trace_printk and ring or perf buffer output run in C
    beside uprobes (the drainer takes their records), not beside launch programs alone; a live attach
    has no drainer for them, so refuses them, maps shared with GPU programs or not (those alone it takes)."""
    from egpu_preload.bpf.compile import compile_probe
    from egpu_preload.runtime import native
    from egpu_preload.runtime.probes import load_probe
    from egpu_preload.runtime.uprobes import live_refusal
    src = tmp_path / "p.bpf.c"
    src.write_text('#include "egpu.bpf.h"\n'
                   'SEC("uprobe/libc.so.6:getpid") int on_call(void *regs) { bpf_printk("call"); return 0; }\n'
                   'SEC("egpu/launch/*") int on_launch(struct egpu_ctx *c) { bpf_printk("launch"); return 0; }\n')
    probe = load_probe(compile_probe(src, tmp_path / "p.bpf.o"))
    host, used, _ = native.host_side(probe.obj)
    assert native.refusal(host, probe.obj.maps, used) is None
    launch = [p for p in host if p.attach.kind == "launch"]
    assert native.refusal(launch, probe.obj.maps, used) == "on_launch calls trace_printk"
    uprobe = [p for p in probe.obj.programs if p.attach.kind == "uprobe"]
    assert native.queues(uprobe) and not native.queues([])
    refused = "its uprobes print or send records (bpf_printk, ring or perf buffers): only egpu-run takes those"
    assert live_refusal(probe) == refused
    # a record for a ring buffer, as a line: the drainer of egpu-run's start-up probes would not take it
    src.write_text('#include "egpu.bpf.h"\n'
                   'struct { __uint(type, BPF_MAP_TYPE_RINGBUF); __uint(max_entries, 4096); } rb SEC(".maps");\n'
                   'SEC("uprobe/libc.so.6:getpid") int on_call(void *regs) { __u64 v = 1;\n'
                   '  bpf_ringbuf_output(&rb, &v, sizeof(v), 0); return 0; }\n')
    assert live_refusal(load_probe(compile_probe(src, tmp_path / "r.bpf.o"))) == refused
    shared = ('#include "egpu.bpf.h"\n'
              'struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 1); __type(key, __u32);\n'
              '  __type(value, __u64); } n SEC(".maps");\n'
              'static void add(void) { __u32 k = 0; __u64 *v = bpf_map_lookup_elem(&n, &k); if (v) *v += 1; }\n'
              'SEC("kprobe/vecadd") int on_kernel(struct egpu_ctx *c) { add(); return 0; }\n'
              'SEC("uprobe/libc.so.6:getpid") int on_call(void *regs) { add(); PRINT; return 0; }\n')
    src.write_text(shared.replace("PRINT;", ""))
    probe = load_probe(compile_probe(src, tmp_path / "s.bpf.o"))
    assert native.host_side(probe.obj)[2] == {0} and live_refusal(probe) is None
    src.write_text(shared.replace("PRINT;", 'bpf_printk("call");'))
    assert live_refusal(load_probe(compile_probe(src, tmp_path / "sp.bpf.o"))) == refused


def test_a_throw_in_a_library_opened_locally_is_caught(built, tmp_path):
    """The shim's _Unwind_RaiseException, which puts swapped return addresses back before an unwind, forwarded
    to RTLD_NEXT's: a C++ library a C program (or Python) opens RTLD_LOCAL brings libgcc_s into no global
    scope, so that found nothing and every throw, with or without uprobes, jumped to NULL (SIGSEGV). Now the
    unwinder the throwing library itself sees is called."""
    lib, app = tmp_path / "libcatch.so", tmp_path / "app_local"
    subprocess.run(["g++", "-O1", "-shared", "-fPIC", str(APP / "libcatch.cpp"), "-o", str(lib)], check=True)
    subprocess.run(["gcc", "-O1", "-Wall", str(APP / "app_local.c"), "-o", str(app), "-ldl"], check=True)
    r = subprocess.run([str(app), str(lib)], env={"LD_PRELOAD": str(built / "libegpu_shim.so")},
                       capture_output=True, text=True)
    assert (r.returncode, r.stdout) == (0, "caught 28\n"), (r.returncode, r.stderr)


def test_throws_in_libraries_with_c_runtimes_of_their_own_are_caught_by_each(built, tmp_path):
    """A library linked with -static-libstdc++ exports a C++ runtime of its own; opened RTLD_LOCAL beside one
    that uses libstdc++.so, each catches with its own. The shim's __cxa_begin_catch kept the first function
    a caller's scope gave for every caller: the other library's catch began in the wrong runtime, and its
    rethrow inside the catch found no exception there (std::terminate), with or without uprobes."""
    own, shared, app = tmp_path / "libcatch_own.so", tmp_path / "libcatch.so", tmp_path / "app_local"
    for lib, static in ((own, ["-static-libstdc++"]), (shared, [])):
        subprocess.run(["g++", "-O1", "-shared", "-fPIC", *static, str(APP / "libcatch.cpp"), "-o", str(lib)],
                       check=True)
    subprocess.run(["gcc", "-O1", "-Wall", str(APP / "app_local.c"), "-o", str(app), "-ldl"], check=True)
    for libs in ((own, shared), (shared, own)):
        plain = subprocess.run([str(app), *map(str, libs)], capture_output=True, text=True)
        assert (plain.returncode, plain.stdout) == (0, "caught 56\n"), plain.stderr
        r = subprocess.run([str(app), *map(str, libs)], env={"LD_PRELOAD": str(built / "libegpu_shim.so")},
                           capture_output=True, text=True)
        assert (r.returncode, r.stdout) == (0, "caught 56\n"), (libs, r.returncode, r.stderr)


def test_a_library_loaded_where_a_patched_one_was_closed_is_patched_and_never_written_by_a_detach(built, tmp_path):
    """A library whose GOT slot a uprobe patched is closed and another is loaded at its address (the loader reuses
    the hole). The shim kept the closed one's slot: the same file loaded anew was not patched there (its calls ran
    no probe), and the detach wrote the closed one's old value there, into whatever the new library keeps at that
    address: here its slot of getpid, which then called getppid."""
    lib, other, again, app = (tmp_path / n for n in ("libreload.so", "libother.so", "libagain.so", "app_reload"))
    for out, flags in ((lib, []), (other, ["-DOTHER"])):
        subprocess.run(["gcc", "-O1", "-shared", "-fPIC", *flags, str(APP / "libreload.c"), "-o", str(out)], check=True)
    again.write_bytes(lib.read_bytes())
    subprocess.run(["gcc", "-O1", "-Wall", "-I", str(ROOT / "shim"), str(APP / "app_reload.c"), "-o", str(app), "-ldl"],
                   check=True)
    for second in (again, other):
        r = subprocess.run([str(app), str(lib), str(second)], env={"LD_PRELOAD": str(built / "libegpu_shim.so")},
                           capture_output=True, text=True)
        assert (r.returncode, r.stdout) == (0, "base same runs 2\ngetpid ok\n"), (second.name, r.returncode, r.stderr)


def test_a_slot_importing_an_older_version_of_the_function_keeps_calling_it(built, tmp_path):
    """A uprobe on ver_get is on its default version (ver_get@@VER_2); the program also imports ver_get@VER_1, as
    programs built against an older glibc import pthread_cond_wait@GLIBC_2.2.5. Its PLT slot, not bound yet, was
    matched by name alone and pointed at the probed function's stub: the old version's call ran the probe and then
    the new version (which returned 2, not 1)."""
    lib, app = tmp_path / "libver.so", tmp_path / "app_version"
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", f"-Wl,--version-script={APP / 'libver.map'}",
                    str(APP / "libver.c"), "-o", str(lib)], check=True)
    subprocess.run(["gcc", "-O1", "-Wall", "-I", str(ROOT / "shim"), str(APP / "app_version.c"), "-o", str(app),
                    f"-L{tmp_path}", "-lver", f"-Wl,-rpath,{tmp_path}", "-Wl,-z,lazy", "-ldl"], check=True)
    r = subprocess.run([str(app)], env={"LD_PRELOAD": str(built / "libegpu_shim.so")}, capture_output=True, text=True,
                       timeout=30)
    assert (r.returncode, r.stdout) == (0, "new 2 old 1 runs 1\n"), (r.returncode, r.stdout, r.stderr)


def test_a_uprobe_in_a_signal_handler_never_waits_for_the_lock_its_thread_holds(built, tmp_path):
    """A signal handler that calls a function with a uprobe, on a thread that holds launchvm.c's lock (a host-API
    probe running in a hook, the runtime's drain of launch records, an attach): the probe waited for that lock,
    which its own thread held, for good (the job hung). Such a call now runs no program."""
    app = tmp_path / "app_signal"
    subprocess.run(["gcc", "-O1", "-Wall", "-I", str(ROOT / "shim"), str(APP / "app_signal.c"), "-o", str(app), "-ldl",
                    "-pthread"], check=True)
    r = subprocess.run([str(app)], env={"LD_PRELOAD": str(built / "libegpu_shim.so")}, capture_output=True, text=True,
                       timeout=30)
    assert (r.returncode, r.stdout) == (0, "handled 1\n"), (r.returncode, r.stderr)


@pytest.mark.parametrize("attempt", range(3))
def test_uprobes_run_in_many_threads_at_once_with_exact_maps_and_detach_while_they_run(built, tmp_path, attempt):
    """app_concurrent.c: 8 threads call a function with a uprobe, whose program counts into an array map (atomic
    adds) and a hash map keyed by the thread: every call counted, in both. A program attached and detached over
    and over meanwhile never runs after its detach returned (its count and runs stay still while the threads go
    on). And runs overlap: every run took one lock before, so two never did (met=none). But a per-CPU value is
    the running CPU's own in Linux, so a program adds to it with a plain load and store; all host threads here
    are CPU 0, so runs of a program with a per-CPU map take turns (none of those adds is lost). A call runs the
    return programs its entry found running, as the kernel's uretprobes: one that entered while they were
    paused (egpu-run's probe while a swap is tried) returns without them, one they were paused and ran again
    across returns with them (held=)."""
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", str(APP / "libupt.c"), "-o", str(tmp_path / "libupt.so")],
                   check=True)
    app = tmp_path / "app_concurrent"
    subprocess.run(["gcc", "-O1", "-Wall", "-I", str(ROOT / "shim"), str(APP / "app_concurrent.c"), "-o", str(app),
                    f"-L{tmp_path}", "-lupt", f"-Wl,-rpath,{tmp_path}", "-ldl", "-pthread"], check=True)
    calls = 100_000
    r = subprocess.run([str(app), str(calls)], env={"LD_PRELOAD": str(built / "libegpu_shim.so")},
                       capture_output=True, text=True, timeout=120)
    want = f"counted={8 * calls} hash=exact cycles=some late=0 marker=exact met=some percpu=exact held=0,0/1,1/2,1\n"
    assert (r.returncode, r.stdout) == (0, want), (r.returncode, r.stdout, r.stderr)


def test_functions_left_by_a_throw_or_a_longjmp_keep_the_job_running(stub_job, tmp_path):
    """A uretprobe swaps its function's return address for egpu's thunk, which has no unwind tables: a C++
    exception through such a frame ended the job (std::terminate), pthread_exit's unwind stopped there
    (the destructors of the frames past it never ran), and a longjmp out of one left its entry behind, so
    the frame it jumped to returned through the wrong entry. Now every swapped address goes back before an
    unwind starts, and entries a longjmp left are passed over: the output is the plain run's, calls all
    counted, returns of the functions so left not. The frames that catch a throw, and their callers, get
    their addresses swapped again at the catch: thr_outer's and thr_guard's returns all run (thr_outer's
    ran none after a throw inside it), thr_guard's through a cleanup in thr_clean that throws and catches
    in the unwind, thr_shelter's through thr_relay's catch and rethrow (`throw;`). A tail call from one
    probed function into another (thr_tail's, into thr_add) enters with its caller's slot: both returns
    run."""
    d = stub_job.driver_dir
    cxx = ["g++", "-O1", "-Wall"]
    for step in (cxx + ["-shared", "-fPIC", str(APP / "libthrow.cpp"), "-o", str(d / "libthrow.so")],
                 cxx + ["-O2", "-shared", "-fPIC", str(APP / "libouter.cpp"), "-o", str(d / "libouter.so"), f"-L{d}",
                        "-lthrow", f"-Wl,-rpath,{d}"],
                 cxx + [str(APP / "app_unwind.cpp"), "-o", str(d / "app_unwind"), f"-L{d}", "-lthrow", "-louter",
                        f"-Wl,-rpath,{d}", "-ldl", "-lpthread"]):
        subprocess.run(step, check=True)
    obj = uprobe_probe(tmp_path, "unwind")
    n = 200   # 50 longjmps from one call site (one slot), 50 nested: each more than the 32 entries a thread keeps
    plain = subprocess.run([str(d / "app_unwind"), str(n)], env=stub_job.env(tmp_path / "plain.log"),
                           capture_output=True, text=True, check=True).stdout
    r, (doc,), _ = run_kept(stub_job, tmp_path, obj, str(d / "app_unwind"), str(n))
    assert r.returncode == 0 and r.stdout.splitlines()[0] == plain.strip(), (r.stdout, r.stderr[-2000:])
    threes, fours = len(range(0, n, 3)), len(range(0, n, 4))
    # libthrow's own calls of thr_maybe (thr_clean's, its cleanup's, thr_relay's) are not hooked: only the
    # GOTs that import it are
    assert entries(doc, obj, "counts") == {0: 2 * n, 1: 2 * (n - threes), 2: 2 * n, 3: 2 * (n - fours),
                                           4: n, 5: n, 6: n, 7: n, 8: 2, 9: 1, 10: n, 11: n, 12: n, 13: n,
                                           14: n, 15: n - threes, 16: n, 17: n, 18: n, 19: n - threes, 20: n, 21: n}
