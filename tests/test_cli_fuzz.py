"""Property: every command, fed any wrong input, refuses it cleanly (issue 21). Random and truncated
files, files of the wrong kind (an ELF that is not eBPF, PTX, CUDA C++, empty, random bytes, a
directory, nothing at all), unwritable and existing output paths, and bad option values: never a
traceback, always a nonzero exit, and one line naming the file (or the option) and the reason.

In process through typer's CliRunner, so a few hundred cases take seconds; the examples that run clang
(a ".c" name) cost a process each.
"""

from __future__ import annotations

import itertools
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from launcher import OWN_FAILURE, USAGE_STATUS, egpu, egpu_run

ROOT = Path(__file__).resolve().parent.parent
PTX = (ROOT / "tests" / "fixtures" / "ptx" / "cupy_0.ptx").read_bytes()
HOST_ELF = Path(shutil.which("true") or "/bin/true").read_bytes()
CU = b"__global__ void k(float *a) { a[threadIdx.x] = 1; }\n"
SUFFIXES = [".bpf.o", ".bpf.c", ".ptx", ".cu", ".a", ".o", ""]
FAST = settings(deadline=None, max_examples=50, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                      HealthCheck.too_slow])
# Lines a refusal may have besides its one line: clang's own diagnostics after "clang failed", and
# rewrite's per-kernel status before a failed rewrite's line.
KERNEL_STATUS = re.compile(r"^\S+: (failed|untouched|instrumented)\b")
PROGRESS = re.compile(r"^egpu(-run)?: .* \.\.\.$")   # a step that took more than a second (attach says so)
# clang's warnings on a .bpf.c that still compiles, printed as clang prints them before the refusal
CLANG_NOTE = re.compile(r"^(\S.*:\d+:\d+: (warning|note): |\s*\d* \| |\d+ warnings? generated\.$)")

runner = CliRunner()
counter = itertools.count()


@pytest.fixture(scope="module")
def probe(probe_obj) -> Path:
    return probe_obj("count")


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def contents(probe_bytes: bytes) -> st.SearchStrategy:
    """(what, bytes or None for a directory / "missing" for no file) of a wrong input."""
    def prefix(data: bytes, keep_last: int = 1) -> st.SearchStrategy:
        return st.integers(0, len(data) - keep_last).map(lambda n: data[:n])
    return st.one_of(
        st.tuples(st.just("random"), st.binary(max_size=1024)),   # clang reads it as C when named .c: kept short
        st.tuples(st.just("truncated .bpf.o"), prefix(probe_bytes)),
        st.tuples(st.just("truncated PTX"), prefix(PTX, keep_last=3)),   # always loses the kernel's closing brace
        st.tuples(st.just("truncated ELF"), prefix(HOST_ELF)),
        st.tuples(st.just("host ELF"), st.just(HOST_ELF)),
        st.tuples(st.just("CUDA C++"), st.just(CU)),
        st.tuples(st.just("empty"), st.just(b"")),
        st.tuples(st.just("directory"), st.none()),
        st.tuples(st.just("missing"), st.just("missing")),
    )


def make(work: Path, what: tuple, suffix: str) -> Path:
    """The input on disk, under a fresh name ending in ``suffix``."""
    path = work / f"in{next(counter)}{suffix}"
    _, data = what
    if data is None:
        path.mkdir()
    elif data != "missing":
        path.write_bytes(data)
    return path


def outputs(work: Path) -> st.SearchStrategy:
    """None (the default output), an existing file, an existing directory, a path under a file, a path in
    a directory that does not exist."""
    existing = work / "existing.out"
    existing.write_bytes(b"old")
    (work / "outdir").mkdir(exist_ok=True)
    return st.sampled_from([None, existing, work / "outdir", existing / "x.out", work / "no" / "such" / "x.out"])


def check(app, args: list, named: str, status: int | None = None) -> None:
    """No traceback, a nonzero exit (``status`` when given), and one line naming ``named``."""
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), (args, r.exception)
    assert r.exit_code != 0, (args, r.stdout, r.stderr)
    if status is not None:
        assert r.exit_code == status, (args, r.exit_code, r.stderr)
    lines = [line for line in r.stderr.splitlines() if not PROGRESS.match(line)]
    mine = [i for i, line in enumerate(lines) if re.match(r"egpu(-run)?( [\w-]+)?: ", line)]
    assert len(mine) == 1, (args, r.stderr)
    line = lines[mine[0]]
    assert named in line, (args, named, r.stderr)
    if "clang failed" not in line:
        assert all(KERNEL_STATUS.match(x) or CLANG_NOTE.match(x) for x in lines[:mine[0]]), (args, r.stderr)
        assert all(KERNEL_STATUS.match(x) for x in lines[mine[0] + 1:]), (args, r.stderr)


def test_a_refused_source_with_clang_warnings_is_refused_in_one_line(tmp_path):
    """A .bpf.c that compiles with warnings to an object without programs (a NUL byte: hypothesis found it):
    clang's warnings as clang prints them, then egpu's one line."""
    path = tmp_path / "nul.bpf.c"
    path.write_bytes(b"\x00")
    check(egpu, ["compile", path], str(path))


@FAST
@given(data=st.data(), command=st.sampled_from(["inspect", "compile", "disasm", "verify", "ptx", "rewrite IN",
                                                "rewrite -p", "egpu-run -p", "attach -p", "swap NEW", "run-on-gpu",
                                                "run-on-gpu --maps"]))
def test_any_wrong_input_is_refused_in_one_line(work, probe, data, command):
    what = data.draw(contents(probe.read_bytes()), label="input")
    suffix = data.draw(st.sampled_from(SUFFIXES), label="suffix")
    path = make(work, what, suffix)
    out = data.draw(outputs(work), label="output")
    with_out = ["-o", out] if out is not None else []
    bad_file_out = out is not None and (out.is_dir() or not out.parent.is_dir())   # refused before the input
    if command == "inspect":
        bad_dir_out = out is not None and (out.is_file() or out.parent.is_file())
        check(egpu, ["inspect", path] + (["--extract-ptx", out] if out is not None else []),
              str(out if bad_dir_out else path))
    elif command == "compile":   # a .c that is a file gets its output checked before clang runs
        check(egpu, ["compile", path] + with_out, str(out if bad_file_out and path.suffix == ".c" and path.is_file()
                                                      else path))
    elif command in ("disasm", "verify", "ptx", "run-on-gpu"):
        check(egpu, [*command.split(), path] + (["prog", "--vm"] if command == "run-on-gpu" else []), str(path))
    elif command == "run-on-gpu --maps":   # refused before the object is read
        check(egpu, ["run-on-gpu", probe, "count", "--vm", "--maps", path], str(path), USAGE_STATUS)
    elif command == "rewrite IN":
        check(egpu, ["rewrite", path, "-p", probe] + with_out, str(out if bad_file_out else path))
    elif command == "rewrite -p":
        ptx = work / "good.ptx"
        ptx.write_bytes(PTX)
        check(egpu, ["rewrite", ptx, "-p", path], str(path))
    elif command == "egpu-run -p":
        check(egpu_run, ["-p", path, "true"], str(path), OWN_FAILURE)
    elif command == "attach -p":   # refused here, before any process is asked
        check(egpu, ["attach", "1", "-p", path], str(path))
    else:
        check(egpu, ["swap", "1", "old", path], str(path))


@FAST
@given(data=st.data())
def test_good_input_to_a_bad_output_is_refused_in_one_line(work, probe, data):
    out = data.draw(st.sampled_from([work / "outdir", work / "existing.out" / "x", work / "no" / "such" / "x"]))
    (work / "outdir").mkdir(exist_ok=True)
    (work / "existing.out").write_bytes(b"old")
    ptx = work / "good.ptx"
    ptx.write_bytes(PTX)
    src = ROOT / "tests" / "probes" / "count.bpf.c"
    args = data.draw(st.sampled_from([["compile", src, "-o", out], ["rewrite", ptx, "-p", probe, "-o", out],
                                      ["inspect", "/bin/true", "--extract-ptx", work / "existing.out"]]))
    check(egpu, args, str(args[-1]))


BAD_TEXT = st.text(st.characters(codec="ascii", exclude_categories=["Cc"]), max_size=12).filter(
    lambda s: not s.startswith("-"))


@FAST
@given(data=st.data())
def test_bad_option_values_are_refused_in_one_line(data):
    """Each option that takes a value, given one it cannot take: exit 2 (egpu) or 125 (egpu-run)."""
    option, valid = data.draw(st.sampled_from([("--backend", {"auto", "ptx", "sass"}), ("--launch-vm", {"c", "python"}),
                                               ("--interval", None), ("--mirror", None), ("--prometheus", None)]))
    if valid is None:   # numbers: text that is no number, or one below the minimum
        value = data.draw(st.one_of(BAD_TEXT.filter(lambda s: not _number(float, s)),
                                    st.sampled_from(["-1", "0.01"] if option == "--interval" else ["-1"])))
        if option == "--prometheus" and value == "-1":
            value = "x"
    else:
        value = data.draw(BAD_TEXT.filter(lambda s: s not in valid))
    check(egpu_run, [f"{option}={value}", "true"], option, OWN_FAILURE)
    command = data.draw(st.sampled_from(["maps", "modules", "detach", "checkpoint", "restore", "attach", "mcpu"]))
    pid = data.draw(BAD_TEXT.filter(lambda s: not _number(int, s) or int(s) <= 0))
    if command == "mcpu":
        check(egpu, ["compile", "x.bpf.c", f"--mcpu={pid}"] if pid not in ("v3", "v4") else ["compile", "--mcpu"],
              "--mcpu", USAGE_STATUS)
    else:
        extra = {"checkpoint": ["dir"], "restore": ["dir"], "attach": ["-p", "x.bpf.o"]}.get(command, [])
        check(egpu, [command, pid, *extra], "PID", USAGE_STATUS)


def _number(kind: type, text: str) -> bool:
    try:
        kind(text)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("pid", ["0.0", "7.5", "1e3", "0x10"])
def test_a_pid_int_cannot_read_is_a_usage_error(pid):
    """typer's int took "0.0" for process 0 (hypothesis found it): PID is read as int() reads it."""
    check(egpu, ["maps", pid], "PID", USAGE_STATUS)


@pytest.mark.parametrize("command, options, after", [
    ("maps", [], []), ("modules", [], []), ("detach", [], []), ("swap", [], ["old", "x.bpf.o"]),
    ("checkpoint", [], ["dir"]), ("restore", [], ["dir"]), ("attach", ["-p", "x.bpf.o"], []),
])
@pytest.mark.parametrize("pid", ["-5", "0"])
def test_a_pid_no_process_has_is_a_usage_error(command, options, after, pid):
    """egpu maps -- -5 looked the process up and said "no egpu session in process -5" (exit 1, a job's
    failure); without -- click already took -5 for an option."""
    check(egpu, [command, *options, "--", pid, *after], f"'PID': {pid!r} is not a process id (a positive number)",
          USAGE_STATUS)
