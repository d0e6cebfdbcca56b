"""The CLI on the inputs a new user gets wrong (issue 21): each refusal is one line naming the file and
the reason with a nonzero exit, never a traceback and never a silent success; egpu-run's own failures
exit 125; help, names of map types and helpers, static archives, progress lines."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import launcher
from egpu_preload.bpf.compile import compile_probe, find_clang
from egpu_preload.bpf.lineinfo import LineTable
from egpu_preload.fatbin import archive_members
from launcher import egpu, egpu_run

ROOT = Path(__file__).resolve().parent.parent
PTX = ROOT / "tests" / "fixtures" / "ptx" / "cupy_0.ptx"
HEAD = '#include "egpu.bpf.h"\n'
LICENSE = 'char LICENSE[] SEC("license") = "GPL";\n'
BAD_PTX = """.version 8.0
.target sm_90
.address_size 64

.visible .entry k(.param .u64 k_param_0)
{
	.reg .b64 	%rd<3>;
	.reg .f32 	%f<3>;
	ld.param.u64 	%rd1, [k_param_0];
	ld.global.f32 	%f1, [%rd1;
	ret;
}
"""
NO_ACCESS_PTX = BAD_PTX.replace("\tld.global.f32 \t%f1, [%rd1;\n", "")

runner = CliRunner()


def run(app, args: list) -> "object":
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception   # never a traceback
    return r


def refused(app, args: list, status: int, message: str) -> str:
    """Run; it must exit ``status`` with ``message`` in its one stderr line (returned)."""
    r = run(app, args)
    lines = r.stderr.splitlines()
    assert r.exit_code == status, (r.exit_code, r.stderr)
    assert len(lines) == 1 and message in lines[0], r.stderr
    return lines[0]


@pytest.fixture()
def files(tmp_path, probe_obj):
    """Inputs of every wrong kind, and probes."""
    f = {"rand": tmp_path / "rand.bin", "empty": tmp_path / "empty.ptx", "cu": tmp_path / "k.cu",
         "bad_ptx": tmp_path / "bad.ptx", "no_access": tmp_path / "plain.ptx", "count": probe_obj("count"),
         "memtrace": probe_obj("memtrace"), "src": ROOT / "tests" / "probes" / "count.bpf.c"}
    f["rand"].write_bytes(os.urandom(3000))
    f["empty"].write_bytes(b"")
    f["cu"].write_text("__global__ void k(float *a) { a[0] = 1; }\n")
    f["bad_ptx"].write_text(BAD_PTX)
    f["bom"] = tmp_path / "bom.ptx"
    f["bom"].write_text("\ufeff" + NO_ACCESS_PTX)
    f["no_access"].write_text(NO_ACCESS_PTX)
    f["noprog_src"] = tmp_path / "noprog.bpf.c"
    f["noprog_src"].write_text(HEAD + "int x;\n")
    f["noprog"] = compile_probe(f["noprog_src"])
    f["mine"] = tmp_path / "mine.bpf.o"   # a probe a test may write over (probe_obj's are the session's)
    f["mine"].write_bytes(f["count"].read_bytes())
    return f


@pytest.mark.parametrize("args, message", [
    (lambda f: ["rewrite", f["rand"], "-p", f["count"]], "rand.bin: not PTX: binary data"),
    (lambda f: ["rewrite", "/bin/true", "-p", f["count"]], "/bin/true: not PTX: an ELF file"),
    (lambda f: ["rewrite", f["empty"], "-p", f["count"]],
     "empty.ptx: not PTX: no .version directive (the file is empty)"),
    (lambda f: ["rewrite", f["cu"], "-p", f["count"]], "k.cu: not PTX: no .version directive"),
    # Found by the PTX sweep: after a byte-order mark the first kernel went unseen ("no kernels").
    (lambda f: ["rewrite", f["bom"], "-p", f["count"]], "bom.ptx: not PTX: non-ASCII character '\\ufeff' on line 1"),
    (lambda f: ["rewrite", PTX, "-p", f["count"], "-o", "/nonexistent/dir/x.ptx"],
     "/nonexistent/dir/x.ptx: cannot write: no directory /nonexistent/dir"),
    (lambda f: ["rewrite", PTX, "-p", f["noprog"]], "noprog.bpf.o: no programs in the object"),
    # found by a helper's PTX sweep: every probe call was spliced twice
    (lambda f: ["rewrite", PTX, "-p", f["count"], "-p", f["count"]], "given twice (-p): its programs would run twice"),
    (lambda f: ["rewrite", PTX, "-p", f["rand"]], "rand.bin: not an ELF file"),
    # the instrumented PTX was written over the probe
    (lambda f: ["rewrite", PTX, "-p", f["mine"], "-o", f["mine"]], "mine.bpf.o: -o names a probe given with -p"),
    (lambda f: ["inspect", "/bin/true", "--extract-ptx", f["cu"]], "k.cu: exists and is not a directory"),
    (lambda f: ["inspect", f["rand"]], "rand.bin: not an ELF file, static archive or fatbin"),
    (lambda f: ["inspect", f["empty"]], "empty.ptx: not an ELF file, static archive or fatbin: an empty file"),
    (lambda f: ["inspect", "/bin/true"], "/bin/true: no CUDA device code"),
    (lambda f: ["inspect", f["rand"].parent], ": is a directory"),
    (lambda f: ["compile", f["count"]], "count.v3.bpf.o: not a probe source"),
    (lambda f: ["compile", f["rand"]], "rand.bin: not a probe source"),
    (lambda f: ["compile", f["src"], "-o", f["rand"].parent], ": is a directory (expected an output file)"),
    (lambda f: ["verify", f["noprog"]], "noprog.bpf.o: no programs in the object"),
    (lambda f: ["compile", f["noprog_src"]], "noprog.bpf.c: no programs in the object"),
    (lambda f: ["disasm", f["noprog"]], "noprog.bpf.o: no programs in the object"),
    (lambda f: ["ptx", f["noprog"]], "noprog.bpf.o: no programs in the object"),
    (lambda f: ["trace", "/nonexistent.parquet"], "egpu: /nonexistent.parquet: no such file"),   # no "not a
    (lambda f: ["trace", f["rand"].parent], ": is a directory"),                       # trace file: [Errno 2]"
], ids=lambda v: "" if callable(v) else v.split(": ", 1)[-1][:40])
def test_bad_input_is_one_line_and_exit_1(files, args, message):
    refused(egpu, args(files), 1, message)


@pytest.mark.parametrize("command, out", [("verify", "prog count_entries (kprobe/*): ok"),
                                          ("disasm", "kprobe/* <count_entries>:"), ("ptx", ".visible .const")])
def test_a_probe_source_is_compiled_first_as_egpu_run_compiles_it(files, command, out):
    """verify, disasm and ptx take a .bpf.c as egpu-run and attach do (they refused one: compile it first)."""
    r = run(egpu, [command, files["src"]])
    assert r.exit_code == 0 and out in r.stdout, r.output


@pytest.mark.parametrize("relative", [False, True])
def test_a_refused_probe_source_is_named_by_its_line(tmp_path, monkeypatch, relative):
    """As the user named it: a relative path stays relative (clang's line info holds the absolute path)."""
    src = tmp_path / "spin.bpf.c"
    src.write_text(HEAD + 'SEC("kprobe/*")\nint spin(struct egpu_ctx *ctx)\n{\n\tvolatile int i = 0;\n'
                   "\twhile (i < ctx->kernel_id)\n\t\ti++;\n\treturn 0;\n}\n")
    if relative:
        monkeypatch.chdir(tmp_path)
        src = Path(src.name)
    r = run(egpu, ["verify", src])
    first = r.stderr.splitlines()[0]
    where = rf"egpu: {re.escape(str(src))}:[67]:kprobe/\*:\d+: "
    assert r.exit_code == 1 and re.match(where + ".*program too complex", first), r.stderr


@pytest.mark.parametrize("command", [["verify"], ["ptx"], ["run-on-gpu", "--vm"]], ids=" ".join)
def test_a_probe_source_egpu_run_refuses_after_the_verifier_is_named_as_egpu_run_names_it(tmp_path, command):
    """Found writing probes: a GPU program pushing to a QUEUE verified, then egpu verify and egpu ptx said
    "/tmp/egpu-compile-.../q.bpf.o:kprobe/*:7: map_push_elem has no GPU form", naming the compiled copy, gone
    at exit, where egpu-run names the source and the map; egpu run-on-gpu --vm ran it, printing "@q: 0"."""
    src = tmp_path / "q.bpf.c"
    src.write_text(HEAD + "struct { __uint(type, BPF_MAP_TYPE_QUEUE); __uint(max_entries, 16); __type(value, __u64); }"
                   ' q SEC(".maps");\nSEC("kprobe/*")\nint p(struct egpu_ctx *ctx)\n{\n\t__u64 v = ctx->site;\n'
                   "\tbpf_map_push_elem(&q, &v, 0);\n\treturn 0;\n}\n" + LICENSE)
    args = [*command, src] + (["p"] if command[0] == "run-on-gpu" else [])
    refused(egpu, args, 1, f"egpu: {src}: QUEUE maps are host-only: GPU program p (kprobe/*) uses map q")


def test_disasm_names_the_file_and_section_of_an_instruction_it_cannot_decode(files):
    """Found by mutating instructions: "egpu: 0: unknown opcode 0x00", with neither the file nor the program."""
    import io
    from elftools.elf.elffile import ELFFile
    data = bytearray(files["mine"].read_bytes())
    data[ELFFile(io.BytesIO(bytes(data))).get_section_by_name("kprobe/*")["sh_offset"]] = 0   # no opcode 0x00
    files["mine"].write_bytes(data)
    refused(egpu, ["disasm", files["mine"]], 1, f"egpu: {files['mine']}:kprobe/*:0: unknown opcode 0x00")


def test_a_failed_rewrite_writes_nothing(files, tmp_path):
    out = tmp_path / "out.ptx"
    r = run(egpu, ["rewrite", files["bad_ptx"], "-p", files["memtrace"], "-o", out])
    assert r.exit_code == 1 and not out.exists()
    assert r.stderr.splitlines() == ["k: failed: ld.global.f32 without an address operand",
                                     f"egpu: {files['bad_ptx']}: 1 of 1 kernels could not be rewritten (first: k: "
                                     "ld.global.f32 without an address operand); nothing written"]


def test_an_untouched_kernel_says_why(files):
    r = run(egpu, ["rewrite", files["no_access"], "-p", files["memtrace"]])
    assert r.exit_code == 0
    assert r.stderr.startswith("k: untouched: no sites for the matching probes (memory probes see ")
    assert "not wmma" in r.stderr and "nvcc -G" in r.stderr


def test_rewrite_says_which_probe_has_nothing_to_splice(files, probe_obj):
    """A launch probe's object alone left every kernel "untouched: no probe matches", as if its glob were
    wrong (found by a helper's PTX sweep); the object is named once, the kernels as before."""
    r = run(egpu, ["rewrite", PTX, "-p", probe_obj("launch"), "-p", files["count"]])
    assert r.exit_code == 0, r.stderr
    assert r.stderr.splitlines() == [f"egpu: {probe_obj('launch')}: no kernel-site program to splice (launch, uprobe "
                                     "and host-API programs run on the host, under egpu-run)",
                                     "cupy_multiply__float32_float_float32: instrumented (1 calls)"]


def test_rewrite_takes_a_probe_source(files, tmp_path):
    out = tmp_path / "out.ptx"
    r = run(egpu, ["rewrite", PTX, "-p", files["src"], "-o", out])
    assert r.exit_code == 0, r.stderr
    assert r.stderr == "cupy_multiply__float32_float_float32: instrumented (1 calls)\n"
    assert "__egpu" in out.read_text()


def test_compile_shows_clangs_warnings_on_success(tmp_path):
    src = tmp_path / "w.bpf.c"
    src.write_text(HEAD + '#warning "look here"\nSEC("kprobe/*") int p(struct egpu_ctx *c) { return 0; }\n' + LICENSE)
    r = run(egpu, ["compile", src])
    assert r.exit_code == 0 and r.stdout == f"{tmp_path / 'w.bpf.o'}\n"
    assert f"{src}:2:2: warning: \"look here\"" in r.stderr


def test_compile_searches_the_include_directories_given(tmp_path):
    """A bpftime or libbpf-tools probe includes a vmlinux.h of its own: -I says where, as with clang."""
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "knobs.h").write_text("#define SITE_KIND EGPU_KIND_ENTRY\n")
    src = tmp_path / "i.bpf.c"
    src.write_text(HEAD + '#include "knobs.h"\n'
                   'SEC("kprobe/*") int p(struct egpu_ctx *c) { return c->kind == SITE_KIND; }\n' + LICENSE)
    assert "knobs.h' file not found" in run(egpu, ["compile", src]).stderr
    r = run(egpu, ["compile", "-I", tmp_path / "inc", src])
    assert r.exit_code == 0 and r.stdout == f"{tmp_path / 'i.bpf.o'}\n", r.stderr
    r = run(egpu, ["compile", "-I", tmp_path / "nope", src])
    assert r.exit_code == 1 and r.stderr == f"egpu: {src}: -I {tmp_path / 'nope'}: not a directory\n"


@pytest.mark.parametrize("output", ["SRC", "LINK", "-"])
def test_compile_never_writes_over_its_source_nor_into_stdout(tmp_path, output):
    """-o naming the source (or a link to it) overwrote the probe's C with the object; -o - was a
    UnicodeDecodeError traceback (clang's object in its captured stdout)."""
    src = tmp_path / "s.bpf.c"
    text = HEAD + 'SEC("kprobe/*") int p(struct egpu_ctx *c) { return 0; }\n' + LICENSE
    src.write_text(text)
    (tmp_path / "link.bpf.c").symlink_to(src)
    out = {"SRC": src, "LINK": tmp_path / "link.bpf.c", "-": "-"}[output]
    refused(egpu, ["compile", src, "-o", out], 1, f"egpu: {src}: ")
    assert src.read_text() == text


@pytest.mark.timeout(60)
def test_compile_writes_no_object_over_a_device_or_a_pipe(tmp_path):
    """egpu compile X.bpf.c -o /dev/null read the object back ("is a device, not a file") and removed what it
    refused: run as root, /dev/null itself. A FIFO stands in for the device."""
    src = tmp_path / "s.bpf.c"
    src.write_text(HEAD + 'SEC("kprobe/*") int p(struct egpu_ctx *c) { return 0; }\n' + LICENSE)
    fifo = tmp_path / "out.bpf.o"
    os.mkfifo(fifo)
    refused(egpu, ["compile", src, "-o", fifo], 1, f"egpu: {fifo}: -o: not a regular file (a device, a pipe)")
    assert fifo.is_fifo()


@pytest.mark.parametrize("body, message", [("int x;\n", "no programs in the object"),
                                           ('SEC("tracepoint/x") int p(void *c) { return 0; }\n',
                                            "a Linux kernel program")])
def test_compile_removes_the_object_it_refuses(tmp_path, body, message):
    """The refused object was left in place: make took it for built, and egpu-run refused it later."""
    src = tmp_path / "r.bpf.c"
    src.write_text(HEAD + body + LICENSE)
    refused(egpu, ["compile", src], 1, message)
    assert not (tmp_path / "r.bpf.o").exists()


def test_compile_shows_clangs_errors_as_clang_prints_them(tmp_path):
    src = tmp_path / "e.bpf.c"
    src.write_text(HEAD + "SEC(\"kprobe/*\") int p(struct egpu_ctx *c) { return undeclared; }\n")
    r = run(egpu, ["compile", src])
    first, *clang = r.stderr.splitlines()
    assert r.exit_code == 1 and first == f"egpu: {src}: clang failed (exit 1)"
    assert clang[0].startswith(f"{src}:2:") and "error: use of undeclared identifier 'undeclared'" in clang[0]
    assert clang[-1] == "1 error generated."


# ---- egpu-run: its own failures exit 125 -----------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--backend", "foo", "true"], "Invalid value for '--backend'"),
    (["--launch-vm", "rust", "true"], "Invalid value for '--launch-vm'"),
    (["--interval", "0", "true"], "Invalid value for '--interval'"),
    (["--prometheus", "port", "true"], "Invalid value for '--prometheus'"),
    (["--prometheus", "99999", "true"], "Invalid value for '--prometheus'"),   # was bind()'s OverflowError
    (["--prometheus", "-1", "true"], "Invalid value for '--prometheus'"),
    (["--prometheus", "0", "true"], "Invalid value for '--prometheus'"),   # served on a port no one was told
    (["--no-such-option", "true"], "No such option: --no-such-option"),
    (["-p"], "Option '-p' requires an argument"),
    (["-v"], "Missing CMD"),
    (["--per-rank", "--sum", "true"], "--per-rank and --sum exclude each other"),   # printed the maps twice
    (["--kernel", "", "true"], "Invalid value for '--kernel': empty glob"),   # instrumented every kernel
    (["--uprobe", "p=/a:f", "--uprobe", "p=/b:g", "true"],   # the last one was taken without a word
     "--uprobe p=...: given twice (/a:f, /b:g): a program attaches at one function"),
    (["-p", "/nonexistent.bpf.o", "true"], "/nonexistent.bpf.o: cannot read"),
    (["-p", str(ROOT / "tests/probes/count.bpf.c"), "-p", str(ROOT / "tests/../tests/probes/count.bpf.c"), "true"],
     "count.bpf.c: given twice (-p): its programs would run twice"),
])
def test_egpu_run_own_failures_exit_125(args, message):
    line = refused(egpu_run, args, 125, message)
    assert line.startswith("egpu-run: ")


def test_egpu_usage_errors_exit_2():
    refused(egpu, ["verify"], 2, "egpu verify: Missing argument 'PROBE'")
    refused(egpu, ["no-such-command"], 2, "No such command 'no-such-command'")
    refused(egpu, ["compile", "x.bpf.c", "--mcpu", "v9"], 2, "Invalid value for '--mcpu'")


@pytest.mark.parametrize("args", [["maps", "1"], ["detach", "1"], ["swap", "1", "old", "NEW"],
                                  ["attach", "1", "-p", "NEW"]])
def test_rank_and_all_together_are_a_usage_error(probe_obj, args):
    """Conflicting options exit 2, as trace's --json --parquet do: --rank R --all exited 1, a job's failure."""
    args = [probe_obj("count") if a == "NEW" else a for a in args]
    refused(egpu, args + ["--rank", "0", "--all"], 2, f"egpu {args[0]}: --rank and --all exclude each other")


@pytest.mark.parametrize("app, args", [(egpu, ["restore", "1"]), (egpu_run, ["--restore"])])
def test_a_checkpoint_that_is_a_file_is_not_called_missing(tmp_path, app, args):
    """--restore FILE and egpu restore PID FILE said "no such checkpoint directory" of a file that is there."""
    path = tmp_path / "ckpt"
    path.write_text("")
    refused(app, [*args, path] + (["true"] if app is egpu_run else []), 1 if app is egpu else 125,
            f"{path}: not a directory (a checkpoint is one)")


# (command, parameter, arguments with "" for it, how click names it)
EMPTY_PATHS = [
    ("egpu-run", "probes", ["-p", "", "true"], "'-p' / '--probe'"),
    ("egpu-run", "output", ["-o", "", "true"], "'-o' / '--output'"),
    ("egpu-run", "perfetto", ["--perfetto", "", "true"], "'--perfetto'"),
    ("egpu-run", "restore", ["--restore", "", "true"], "'--restore'"),
    ("egpu-run", "trace", ["--trace", "", "true"], "'--trace'"),
    ("inspect", "binary", [""], "'BINARY'"),
    ("inspect", "extract_ptx", ["x", "--extract-ptx", ""], "'--extract-ptx'"),
    ("compile", "source", [""], "'X.bpf.c'"),
    ("compile", "output", ["x.bpf.c", "-o", ""], "'-o' / '--output'"),
    ("compile", "include", ["x.bpf.c", "-I", ""], "'-I' / '--include'"),
    ("disasm", "obj", [""], "'PROBE'"),
    ("verify", "obj", [""], "'PROBE'"),
    ("run-on-gpu", "obj", ["", "p"], "'PROBE'"),
    ("run-on-gpu", "maps_file", ["x.bpf.o", "p", "--maps", ""], "'--maps'"),
    ("run-on-cuda", "obj", ["", "p"], "'PROBE'"),
    ("run-on-cuda", "maps_file", ["x.bpf.o", "p", "--maps", ""], "'--maps'"),
    ("ptx", "obj", [""], "'PROBE'"),
    ("trace", "path", [""], "'FILE'"),
    ("trace", "perfetto", ["x", "--perfetto", ""], "'--perfetto'"),
    ("trace", "parquet", ["x", "--parquet", ""], "'--parquet'"),
    ("rewrite", "ptx_in", ["", "-p", "x"], "'IN.ptx'"),
    ("rewrite", "probes", ["x", "-p", ""], "'-p' / '--probe'"),
    ("rewrite", "output", ["x", "-p", "y", "-o", ""], "'-o' / '--output'"),
    ("attach", "probe", ["1", "-p", ""], "'-p' / '--probe'"),
    ("swap", "new", ["1", "old", ""], "'NEW'"),
    ("checkpoint", "directory", ["1", ""], "'DIR'"),
    ("restore", "directory", ["1", ""], "'DIR'"),
]


@pytest.mark.parametrize("command, param, args, shown", EMPTY_PATHS, ids=[f"{c}-{p}" for c, p, _, _ in EMPTY_PATHS])
def test_an_empty_path_is_a_usage_error_naming_its_option(command, param, args, shown):
    """typer read "" as Path(""), the current directory: -p '' said '.: is a directory', --trace '' named
    the working directory, and no line said which option was empty."""
    app, args = (egpu_run, args) if command == "egpu-run" else (egpu, [command, *args])
    refused(app, args, 125 if app is egpu_run else 2, f"Invalid value for {shown}: empty path")


def test_every_path_parameter_is_tried_empty():
    """EMPTY_PATHS names every parameter typed Path, so a new one is tried too."""
    from typing import get_type_hints
    import typer.main
    commands = {"egpu-run": typer.main.get_command(egpu_run), **typer.main.get_command(egpu).commands}
    paths = {(name, p) for name, cmd in commands.items()
             for p, hint in get_type_hints(cmd.callback).items() if "Path" in str(hint)}
    assert paths == {(c, p) for c, p, _, _ in EMPTY_PATHS}


def test_choices_match_the_runtime():
    from typing import get_args
    from egpu_preload.runtime import config, sass
    assert get_args(launcher.Backend) == sass.BACKENDS
    assert get_args(launcher.LaunchVm) == config.LAUNCH_VMS


def test_no_driver_is_said_before_the_job(monkeypatch):
    from egpu_preload import version
    from egpu_preload.runtime import job
    monkeypatch.setattr(version, "cuda_driver", lambda: None)
    monkeypatch.setattr(job, "find_shim", lambda: Path("/no/shim.so"))
    monkeypatch.setattr(job, "run_job", lambda *a, **k: 3)
    r = run(egpu_run, ["true"])
    assert r.exit_code == 3   # the job's status, passed through
    assert r.stderr.startswith("egpu-run: no CUDA driver (libcuda.so.1 not found): the job cannot load CUDA code")


@pytest.mark.parametrize("flag, lost", [("--backend=sass", "no kernel"), ("--live-sass", "no SASS-only kernel")])
def test_no_sanitizer_for_the_sass_back_end_is_said_before_the_job(monkeypatch, probe_obj, flag, lost):
    """--backend sass without a Compute Sanitizer ran the job with every kernel "SASS only" and never said why;
    --live-sass without one said nothing at all."""
    from egpu_preload import version
    from egpu_preload.runtime import job, sass
    monkeypatch.setattr(sass, "sanitizer_library", lambda: None)
    monkeypatch.setattr(version, "cuda_driver", lambda: "13.0")
    monkeypatch.setattr(job, "find_shim", lambda: Path("/no/shim.so"))
    monkeypatch.setattr(job, "run_job", lambda *a, **k: 3)
    monkeypatch.setattr(job, "report", lambda *a, **k: ("", []))
    r = run(egpu_run, [flag, "-p", probe_obj("count"), "true"])
    assert r.exit_code == 3   # the job runs, and its status is passed through
    assert r.stderr.splitlines() == [f"egpu-run: {flag.split('=')[0]}{' sass' * ('=' in flag)}, but no Compute "
                                     "Sanitizer library was found (EGPU_SANITIZER_LIB, CUDA_HOME): "
                                     f"{lost} can be instrumented in this job"]


def test_no_kernel_instrumented_says_where_the_reasons_are():
    """egpu-run --kernel GLOB matching nothing said "no kernel was instrumented (1 load untouched)" and no
    more: why ("not selected by GLOB") is in -v's lines only, which nothing pointed to."""
    from egpu_preload.runtime.job import module_report
    d = {"pid": 7, "error": None, "modules": [{"api": "MODULE_LOAD_DATA", "image": "ptx", "status": "untouched",
                                                "kernels": [["vecadd", "untouched", "not selected by nomatch"]]}]}
    assert module_report([d], verbose=False) == ["egpu-run: no kernel was instrumented (1 load untouched): "
                                                 "egpu-run -v says why, kernel by kernel"]
    assert module_report([d], verbose=True)[-2:] == ["egpu-run:   vecadd: untouched (not selected by nomatch)",
                                                     "egpu-run: no kernel was instrumented (1 load untouched)"]


def test_long_steps_say_what_they_wait_for(monkeypatch, tmp_path, files):
    """-v: a clang that takes longer than the patience is announced; without -v nothing is said."""
    from egpu_preload import progress
    from egpu_preload.runtime import job
    slow = tmp_path / "bin" / "clang-19"
    slow.parent.mkdir()
    slow.write_text(f"#!/bin/sh\nsleep 0.5\nexec {find_clang()} \"$@\"\n")
    slow.chmod(0o755)
    monkeypatch.setenv("PATH", f"{slow.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(progress, "PATIENCE_S", 0.1)
    monkeypatch.setattr(job, "find_shim", lambda: Path("/no/shim.so"))
    monkeypatch.setattr(job, "run_job", lambda *a, **k: 0)
    monkeypatch.setattr(job, "report", lambda *a, **k: ("", []))
    loud = run(egpu_run, ["-v", "-p", files["src"], "true"])
    assert f"egpu-run: compiling {files['src']} ...\n" in loud.stderr
    quiet = run(egpu_run, ["-p", files["src"], "true"])
    assert "compiling" not in quiet.stderr


def test_progress_is_silent_for_short_steps(capsys):
    from egpu_preload.progress import Progress
    import time
    p = Progress("egpu", steps=True, patience=0.05)
    with p.step("quick"):
        pass
    with p.step("slow"):
        time.sleep(0.3)
    assert capsys.readouterr().err == "egpu: slow ...\n"


# ---- help, version, names --------------------------------------------------------------------------------

COMMANDS = ["inspect", "compile", "disasm", "verify", "ptx", "trace", "rewrite", "ps", "attach", "detach", "swap",
            "maps", "modules", "checkpoint", "restore"]


@pytest.mark.parametrize("app, args", [(egpu, []), (egpu_run, [])] + [(egpu, [c]) for c in COMMANDS])
def test_help_shows_no_python_types_or_source_paths(app, args):
    r = run(app, args + ["--help"])
    assert r.exit_code == 0
    for leak in ("<bool>", "<list", ".py", "egpu_preload", "[["):   # [[PROBE]]: typer brackets an optional one
        assert leak not in r.stdout, (leak, r.stdout)


@pytest.mark.parametrize("app, args", [(egpu, []), (egpu_run, [])] + [(egpu, [c]) for c in COMMANDS])
def test_dash_h_is_help(app, args):
    """-h, as bpftool and bpftrace take it: it was "No such option: -h" (exit 2, egpu-run 125)."""
    short, long = run(app, args + ["-h"]), run(app, args + ["--help"])
    assert (short.exit_code, short.stdout) == (0, long.stdout) and "-h, --help" in short.stdout


@pytest.mark.parametrize("app, args", [(egpu, ["--version"]), (egpu_run, ["--version"])])
def test_version(app, args):
    from egpu_preload import __version__
    r = run(app, args)
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"egpu {__version__} ")
    heads = [line.split(":")[0] for line in lines[1:]]
    assert heads == ["CUDA driver", "GPUs", "CUDA toolkit", "clang", "PTX back end", "SASS back end"]


def test_version_without_a_driver_says_why_no_back_end_works():
    """A process of its own where libcuda.so.1 cannot be found (an empty library path, no GPU here)."""
    from egpu_preload.version import cuda_driver
    if cuda_driver() is not None:
        pytest.skip("this machine has a CUDA driver")
    r = subprocess.run([sys.executable, "-m", "launcher", "--version"], capture_output=True, text=True,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert "PTX back end: not usable (no CUDA driver)" in r.stdout.splitlines()
    assert "SASS back end: not usable (no CUDA driver)" in r.stdout.splitlines()


@pytest.mark.parametrize("cmd", [["ls", "-h"], ["python3", "--version"]])
def test_options_after_cmd_are_the_jobs(monkeypatch, cmd):
    from egpu_preload.runtime import job
    seen = {}
    monkeypatch.setattr(job, "find_shim", lambda: Path("/no/shim.so"))
    monkeypatch.setattr(job, "run_job", lambda cmd, *a, **k: seen.setdefault("cmd", cmd) and 0)
    assert run(egpu_run, cmd).exit_code == 0
    assert seen["cmd"] == cmd


def test_unsupported_map_type_and_helper_by_name(tmp_path):
    src = tmp_path / "names.bpf.c"
    src.write_text(HEAD + "struct { __uint(type, 7); __uint(max_entries, 1); __type(key, __u32); "
                   "__type(value, __u64); } st SEC(\".maps\");\n"
                   "SEC(\"kprobe/*\") int p(struct egpu_ctx *c) { return 0; }\n" + LICENSE)
    compile_probe(src)
    refused(egpu, ["verify", tmp_path / "names.bpf.o"], 1,
            "map st: unsupported map type 7 (BPF_MAP_TYPE_STACK_TRACE; supported: ")
    src.write_text(HEAD + "static long (*probe_read)(void *, __u32, const void *) = (void *)4;\n"
                   "SEC(\"kprobe/*\") int p(struct egpu_ctx *c) { long v; probe_read(&v, 8, 0); return 0; }\n"
                   + LICENSE)
    compile_probe(src)
    r = run(egpu, ["verify", tmp_path / "names.bpf.o"])
    assert r.exit_code == 1
    assert "bpf_probe_read#4 reads the application's memory: only uprobes and host-API programs" in \
        r.stderr.splitlines()[0]


def test_libbpf_printk_of_four_arguments_says_why_it_is_refused(tmp_path):
    """libbpf's bpf_printk calls bpf_trace_vprintk past three arguments: the refusal names what was written."""
    src = tmp_path / "p4.bpf.c"
    src.write_text("#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\n" + HEAD +
                   "SEC(\"kprobe/*\") int p(struct egpu_ctx *c) { bpf_printk(\"%d %d %d %d\", 1, 2, 3, c->site); "
                   "return 0; }\n" + LICENSE)
    compile_probe(src)
    r = run(egpu, ["verify", tmp_path / "p4.bpf.o"])
    assert r.exit_code == 1
    assert ("unknown func bpf_trace_vprintk#177 (libbpf's bpf_printk calls it for more than three arguments: "
            "egpu's takes at most three)") in r.stderr.splitlines()[0]


# ---- static archives ---------------------------------------------------------------------------------

def _ar(members: dict[str, bytes]) -> bytes:
    """A GNU ar archive (long names through the // table), as ar rcs writes one."""
    longs = b"".join(n.encode() + b"/\n" for n in members if len(n) > 15)
    out, offsets, at = [b"!<arch>\n"], {}, 0
    for n in members:
        if len(n) > 15:
            offsets[n] = at
            at += len(n) + 2

    def member(name: str, data: bytes) -> bytes:
        head = f"{name:<16}{0:<12}{0:<6}{0:<6}{644:<8}{len(data):<10}`\n".encode()
        return head + data + (b"\n" if len(data) & 1 else b"")
    if longs:
        out.append(member("//", longs))
    for n, data in members.items():
        out.append(member(f"/{offsets[n]}" if n in offsets else n + "/", data))
    return b"".join(out)


def test_archive_members():
    data = _ar({"a.o": b"\x7fELFodd", "a_very_long_member_name.o": b"\x7fELF2"})
    assert archive_members(data) == [("a.o", b"\x7fELFodd"), ("a_very_long_member_name.o", b"\x7fELF2")]


def test_inspect_a_static_archive(tmp_path, probe_obj):
    """The fatbins of each member (nvcc -c output in libk.a), and a truncated archive refused."""
    cu = tmp_path / "k.cu"
    cu.write_text("__global__ void k(float *a) { a[0] = 1; }\n")
    subprocess.run(["nvcc", "-c", str(cu), "-o", str(tmp_path / "k.o"), "-arch=sm_90"], check=True)
    lib = tmp_path / "libk.a"
    lib.write_bytes(_ar({"k.o": (tmp_path / "k.o").read_bytes(), "count.bpf.o": probe_obj("count").read_bytes()}))
    r = run(egpu, ["inspect", lib])
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "k.o:" and lines[1].startswith("  fatbin #1: .nv_fatbin ")
    assert any("PTX  compute_90" in line for line in lines)
    lib.write_bytes(lib.read_bytes()[:200])
    refused(egpu, ["inspect", lib], 1, "libk.a: archive member at 68 runs past the end")
    bad = bytearray((tmp_path / "k.o").read_bytes())
    bad[0x28:0x30] = (1 << 63).to_bytes(8, "little")   # e_shoff: the section headers far past the end
    lib.write_bytes(_ar({"count.bpf.o": probe_obj("count").read_bytes(), "k.o": bytes(bad)}))
    refused(egpu, ["inspect", lib], 1, "libk.a: member k.o: not a readable ELF file")   # which of its members


# ---- line info ---------------------------------------------------------------------------------------

def test_line_info_of_a_verifier_refusal(tmp_path):
    """egpu verify of an object names the object and, at the line's end, the source line refused (the log
    below starts at the program's first line, which read as the refusal's); its log shows the source lines."""
    from test_egpu_run import BAD_PROBE
    src = tmp_path / "bad.bpf.c"
    src.write_text(BAD_PROBE)
    assert run(egpu, ["compile", src]).exit_code == 0
    r = run(egpu, ["verify", tmp_path / "bad.bpf.o"])
    first, *log = r.stderr.splitlines()
    assert r.exit_code == 1
    assert first.startswith(f"egpu: {tmp_path / 'bad.bpf.o'}:kprobe/*:7: r0 = *(u64 *)(r0 + 0x0): invalid mem access")
    assert first.endswith(f"(r0: compare it with 0 first) (source: {src}:8)")
    assert log[log.index(f"; return *v;  /* no NULL check */ @ {src}:8") + 1].startswith("7: ")
    table = LineTable.from_object((tmp_path / "bad.bpf.o").read_bytes())
    assert str(table.lookup("kprobe/*", 0)) == f"{src}:4"
    assert table.lookup("kprobe/*", 9) is None   # past the program, which calls no subprogram
    assert LineTable.from_object(b"\x7fELF junk").records == {}


@pytest.mark.timeout(60)
def test_line_info_of_records_of_no_bytes_is_no_line_info(tmp_path):
    """Found by mutating .BTF.ext: line records of 0 bytes, 0xFFFFFFFF of them, made egpu verify of a refused
    probe hang while it looked up the source line. Records shorter than bpf_line_info's 16 bytes are refused
    as libbpf's btf_ext_setup_info refuses them: no source lines."""
    import io
    import struct
    from elftools.elf.elffile import ELFFile
    from test_egpu_run import BAD_PROBE
    src = tmp_path / "bad.bpf.c"
    src.write_text(BAD_PROBE)
    data = bytearray(compile_probe(src).read_bytes())
    ext = ELFFile(io.BytesIO(bytes(data))).get_section_by_name(".BTF.ext")["sh_offset"]
    hdr_len, line_off = struct.unpack_from("<I", data, ext + 4)[0], struct.unpack_from("<I", data, ext + 16)[0]
    at = ext + hdr_len + line_off   # u32 record size, then the first section's {u32 name, u32 count}
    struct.pack_into("<I", data, at, 0)
    struct.pack_into("<I", data, at + 8, 0xFFFFFFFF)
    obj = tmp_path / "bad.bpf.o"
    obj.write_bytes(data)
    assert LineTable.from_object(bytes(data)).records == {}
    r = run(egpu, ["verify", obj])
    assert r.exit_code == 1 and r.stderr.startswith(f"egpu: {obj}:kprobe/*:7: r0 = *(u64 *)(r0 + 0x0): invalid mem")


SUBPROGRAM_PROBE = """#include "egpu.bpf.h"
struct {__uint(type,BPF_MAP_TYPE_ARRAY);__uint(max_entries,1);__type(key,__u32);__type(value,__u64);} m SEC(".maps");
static __attribute__((noinline)) __u64 value_of(__u32 k)
{
	__u64 *v = bpf_map_lookup_elem(&m, &k);
	return *v;  /* no NULL check, in a subprogram */
}
SEC("kprobe/*")
int calls(struct egpu_ctx *ctx)
{
	return value_of(ctx->site);
}
char LICENSE[] SEC("license") = "GPL";
"""


def test_a_refusal_inside_a_subprogram_names_its_source_line(tmp_path):
    """elf.py appends a __noinline callee after the program; its instructions map back to .text's lines."""
    from egpu_preload.bpf.lineinfo import located
    from egpu_preload.bpf.elf import load_object
    from egpu_preload.bpf.verifier import verify
    from egpu_preload.errors import VerifierError
    src = tmp_path / "sub.bpf.c"
    src.write_text(SUBPROGRAM_PROBE)
    assert run(egpu, ["compile", src]).exit_code == 0
    data = (tmp_path / "sub.bpf.o").read_bytes()
    (prog,) = load_object(tmp_path / "sub.bpf.o").programs
    assert [piece for piece, _, _ in prog.layout] == ["kprobe/*", ".text"]
    with pytest.raises(VerifierError) as refused:
        verify(prog.code, load_object(tmp_path / "sub.bpf.o").maps, file=str(src), section=prog.section)
    assert refused.value.insn >= prog.layout[0][2]   # refused in the appended subprogram
    e = located(refused.value, data, str(src))
    assert e.file == f"{src}:6", e.file


TWO_IN_ONE_SECTION = HEAD + """struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 4); __type(key, __u32);
	 __type(value, __u64); } h SEC(".maps");
SEC("kprobe/*")
int first(struct egpu_ctx *ctx) { __u32 k = 1; __u64 *v = bpf_map_lookup_elem(&h, &k); return v ? *v : 0; }
SEC("kprobe/*")
int second(struct egpu_ctx *ctx)
{
	__u32 k = ctx->size;
	__u64 *v = bpf_map_lookup_elem(&h, &k);
	return *v;  /* no NULL check */
}
""" + LICENSE


@pytest.mark.parametrize("given", ["source", "object"])
def test_a_refusal_in_a_section_of_two_programs_names_the_program_and_line(tmp_path, given):
    """Two programs in SEC("kprobe/*"), as libbpf allows: the refusal said kprobe/*:7 with neither the program
    nor its source line, and its log had no source lines, for .bpf.c and .bpf.o alike."""
    src = tmp_path / "two.bpf.c"
    src.write_text(TWO_IN_ONE_SECTION)
    path = src if given == "source" else compile_probe(src, tmp_path / "two.bpf.o")
    for cmd in ("verify", "ptx"):
        r = run(egpu, [cmd, path])
        first, *log = r.stderr.splitlines()
        assert r.exit_code == 1
        if given == "source":
            assert first.startswith(f"egpu: {src}:11:kprobe/* (second):"), first
        else:
            assert first.startswith(f"egpu: {path}:kprobe/* (second):") and first.endswith(f"(source: {src}:11)")
        assert f"; return *v;  /* no NULL check */ @ {src}:11" in log


def test_the_readmes_scope_rule():
    """README: .warp/.block right before the / that opens the glob; not after egpu; not on launch probes."""
    from egpu_preload.bpf.sections import parse_section
    from egpu_preload.errors import ElfError
    readme = (ROOT / "README.md").read_text()
    for ok in ("kprobe.warp/*", "kretprobe.block/k*", "egpu/mem.warp/*", "egpu/store.block/*"):
        assert f"`{ok}`" in readme and parse_section(ok).scope in ("warp", "block")
    for bad in ("egpu.warp/mem/*", "egpu/launch.warp/*"):
        with pytest.raises(ElfError):
            parse_section(bad)
    assert "`egpu.warp/mem/*`" in readme


def test_attach_names_the_users_source_line(tmp_path):
    """Refused here, before the process is asked: the user's file and line, not a temp copy."""
    from test_egpu_run import BAD_PROBE
    src = tmp_path / "bad.bpf.c"
    src.write_text(BAD_PROBE)
    line = refused(egpu, ["attach", "1", "-p", src], 1, f"egpu: {src}:8:kprobe/*:7: r0 = *(u64 *)(r0 + 0x0): ")
    assert "egpu-attach-" not in line
    verbose = run(egpu, ["attach", "1", "-v", "-p", src])
    assert f"; return *v;  /* no NULL check */ @ {src}:8" in verbose.stderr.splitlines()


def test_egpu_run_shows_clangs_warnings(monkeypatch, tmp_path):
    from egpu_preload.runtime import job
    monkeypatch.setattr(job, "find_shim", lambda: Path("/no/shim.so"))
    monkeypatch.setattr(job, "run_job", lambda *a, **k: 0)
    monkeypatch.setattr(job, "report", lambda *a, **k: ("", []))
    src = tmp_path / "w.bpf.c"
    src.write_text(HEAD + '#warning "look here"\nSEC("kprobe/*") int p(struct egpu_ctx *c) { return 0; }\n' + LICENSE)
    r = run(egpu_run, ["-p", src, "true"])
    assert r.exit_code == 0, r.stderr
    assert f"{src}:2:2: warning: \"look here\"" in r.stderr


# ---- outputs that are inputs -----------------------------------------------------------------------------

@pytest.mark.parametrize("outputs", [["--trace", "PROBE"], ["--perfetto", "PROBE"],
                                     ["--trace", "OUT", "--perfetto", "OUT"]])
def test_egpu_run_writes_no_output_over_a_probe_or_another_output(monkeypatch, tmp_path, probe_obj, outputs):
    """--trace X.bpf.o unlinked the probe before the job (which then ran uninstrumented, exit 0), --perfetto
    X.bpf.o wrote its JSON over it, and --trace F --perfetto F left only the Perfetto trace in F."""
    from egpu_preload.runtime import job
    monkeypatch.setattr(job, "run_job", lambda *a, **k: pytest.fail("the job ran"))
    probe = tmp_path / "p.bpf.o"
    probe.write_bytes(probe_obj("ringbuf").read_bytes())
    paths = {"PROBE": probe, "OUT": tmp_path / "out"}
    line = refused(egpu_run, ["-p", probe, *[paths.get(o, o) for o in outputs], "true"], 125, f"{paths[outputs[-1]]}: ")
    assert line.endswith("it would be overwritten" if "PROBE" in outputs else "one would overwrite the other")
    assert probe.read_bytes() == probe_obj("ringbuf").read_bytes()


@pytest.mark.parametrize("option", ["--perfetto", "--parquet"])
def test_egpu_trace_writes_no_output_over_its_input(tmp_path, option):
    """egpu trace T --perfetto T replaced the trace with a Perfetto trace of it (no records with a ts: none)."""
    from egpu_preload.output.tracefile import TraceWriter
    path = tmp_path / "t.parquet"
    w = TraceWriter(path, [("events", None)])
    w.add(0, [(0, b"\1\2\3\4")])
    w.close({"events": 0})
    before = path.read_bytes()
    refused(egpu, ["trace", path, option, tmp_path / "." / "t.parquet"], 1,
            f"{option} names the trace file it reads: it would be overwritten")
    assert path.read_bytes() == before


@pytest.mark.parametrize("output", [[], ["--json"], ["--perfetto", "OUT"]])
def test_egpu_trace_says_what_the_probes_dropped_whatever_the_output(tmp_path, output):
    """--json and --perfetto said nothing of the records the probes dropped, as if the trace were whole."""
    import json
    from egpu_preload.output.tracefile import TraceWriter
    path = tmp_path / "t.arrow"
    w = TraceWriter(path, [("events", None)])
    w.add(0, [(0, b"\1\2\3\4"), (1, b"\5\6")])
    w.close({"events": 7})
    r = run(egpu, ["trace", path, *[tmp_path / "t.json" if o == "OUT" else o for o in output]])
    assert r.exit_code == 0, r.stderr
    assert "@events: 7 records dropped by the probes (the ring was full)" in r.stderr.splitlines()
    if output == ["--json"]:   # stdout is the records alone
        assert [json.loads(x)["seq"] for x in r.stdout.splitlines()] == [0, 1]


@pytest.mark.parametrize("cond", ["seq", "=1"])
def test_egpu_trace_where_without_field_and_value_is_a_usage_error(tmp_path, cond):
    """--where seq exited 1, as a trace it could not read, where --limit -1 exits 2: a malformed option is a
    usage error, whatever the file."""
    from egpu_preload.output.tracefile import TraceWriter
    path = tmp_path / "t.arrow"
    w = TraceWriter(path, [("events", None)])
    w.add(0, [(0, b"\1\2\3\4")])
    w.close({"events": 0})
    refused(egpu, ["trace", path, "--where", cond], 2, f"Invalid value for '--where': {cond!r} is not FIELD=VALUE")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", [["verify"], ["inspect"], ["disasm"], ["ptx"], ["rewrite", "-p", "x.bpf.o"]])
def test_a_device_is_refused_not_read_to_its_end(command):
    """Found by a fuzz sweep: `egpu verify /dev/zero` read until the machine ran out of memory."""
    args = command[:1] + ["/dev/zero"] + command[1:]
    r = run(egpu, args)
    assert r.exit_code != 0 and "/dev/zero: is a device, not a file" in r.stderr, r.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("main, args, status", [("egpu_main", ["disasm", "PROBE"], 1),
                                                ("egpu_main", ["compile", "--cflags"], 1),
                                                ("run_main", ["--version"], 125)])
def test_output_to_a_full_disk_is_one_line(probe_obj, main, args, status):
    """egpu disasm X > /dev/full was a traceback: a stdout that takes nothing is said in one line."""
    args = [str(probe_obj("count")) if a == "PROBE" else a for a in args]
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-c", f"import launcher; launcher.{main}()", *args], cwd=ROOT,
                           stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    prog = "egpu" if main == "egpu_main" else "egpu-run"
    assert (r.returncode, r.stderr) == (status, f"{prog}: stdout: cannot write (No space left on device)\n")



def test_a_closed_stdout_is_refused_before_anything_is_done(probe_obj):
    """egpu verify X >&- (fd 1 closed) printed nothing, said nothing and exited 0."""
    r = subprocess.run([sys.executable, "-c", "import launcher; launcher.egpu_main()", "verify",
                        str(probe_obj("count"))], cwd=ROOT, preexec_fn=lambda: os.close(1), stderr=subprocess.PIPE,
                       text=True, timeout=60)
    assert (r.returncode, r.stderr) == (1, "egpu: stdout: closed: what egpu prints would be lost (>/dev/null "
                                           "discards it)\n")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("app, args", [(egpu_run, ["-p", "FIFO", "true"]), (egpu, ["attach", "1", "-p", "FIFO"]),
                                       (egpu, ["swap", "1", "old", "FIFO"])])
def test_a_probe_in_a_pipe_is_refused_by_name(tmp_path, app, args):
    """-p <(cat x.bpf.o) was read here, then "/dev/fd/63: cannot read (No such file or directory)" for the
    job's own read; a named FIFO hung egpu-run until a writer came."""
    fifo = tmp_path / "probe.bpf.o"
    os.mkfifo(fifo)
    refused(app, [fifo if a == "FIFO" else a for a in args], 125 if app is egpu_run else 1,
            f"{fifo}: is a pipe, not a file: each process of the job reads the probe again (give it a file)")


@pytest.mark.timeout(60)
def test_a_trace_in_a_pipe_is_refused_by_name(tmp_path):
    """egpu trace <(cat t.arrow) said "not a trace file: File or stream is not seekable"; a FIFO hung."""
    fifo = tmp_path / "t.arrow"
    os.mkfifo(fifo)
    refused(egpu, ["trace", fifo], 1, f"{fifo}: is a pipe, not a file: a trace file is read from its end")
