"""Every test marked `gpu` has passed in the newest committed GPU run, or says why it is owed.

CI has no GPU, so a gpu test is skipped here; what stands for it is the log of its run on the device
(scripts/gpu-test.sh runs pytest -v, one `tests/test_x.py::test_y[id] PASSED` line per test). The
newest run is the newest folder docs/gpu-results/<date>[suffix]/, all its *.log files together. A gpu
test added or changed after that run goes into docs/gpu-results/owed.txt, one `test id  # why owed` a
line, until the next run logs it. Ids are compared, not code: a test tightened after the run keeps its
id and passes this check; its owed.txt line is what says the tightened form has not run yet.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "gpu-results"
OWED = RESULTS / "owed.txt"
RUN_DIR = re.compile(r"\d{4}-\d{2}-\d{2}[a-z]?")
# pytest -v: "ID PASSED [ 1%]" (or "ID PASSED" at the end of the line); -rA's summary: "PASSED ID";
# pytest-xdist -v: "[gw3] [ 12%] PASSED ID"
VERBOSE_LINE = re.compile(r"^(tests/\S.*?) PASSED(?: +\[ *\d+%\])?$")
SUMMARY_LINE = re.compile(r"^(?:\[gw\d+\] \[ *\d+%\] )?PASSED (tests/\S.*?)(?: - .*)?$")


def newest_run(results: Path) -> Path:
    runs = sorted(p for p in results.iterdir() if p.is_dir() and RUN_DIR.fullmatch(p.name))
    if not runs:
        raise AssertionError(f"{results}: no run folder named <date>[suffix]")
    return runs[-1]


def passed_ids(log_text: str) -> set[str]:
    """Test ids a pytest -v / -rA log shows as PASSED."""
    out = set()
    for line in log_text.splitlines():
        m = VERBOSE_LINE.match(line.rstrip()) or SUMMARY_LINE.match(line.rstrip())
        if m:
            out.add(m.group(1))
    return out


def owed_ids(text: str, where: str) -> dict[str, str]:
    """owed.txt: `test id  # why owed` per line; blank lines and lines starting with # are skipped. A
    line with no reason is an error naming the file and line."""
    out = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        test_id, sep, why = line.partition("  # ")
        if not sep or not why.strip() or not test_id.strip():
            raise ValueError(f"{where}:{n}: expected 'test id  # why owed', got {line.strip()!r}")
        out[test_id.strip()] = why.strip()
    return out


def unaccounted(gpu_tests: set[str], logged: set[str], owed: dict[str, str]) -> tuple[list[str], list[str]]:
    """(gpu tests neither logged nor owed, owed lines naming no gpu test)."""
    return sorted(gpu_tests - logged - owed.keys()), sorted(owed.keys() - gpu_tests)


def collected_gpu_tests() -> set[str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu",
                           "-p", "no:cacheprovider", "tests"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    ids = {line for line in proc.stdout.splitlines() if line.startswith("tests/") and "::" in line}
    assert proc.returncode == 0 and ids, proc.stdout[-2000:] + proc.stderr[-2000:]
    return ids


def test_every_gpu_test_is_logged_or_owed():
    run = newest_run(RESULTS)
    logged = set().union(*(passed_ids(p.read_text(errors="replace")) for p in sorted(run.glob("*.log"))))
    missing, stale = unaccounted(collected_gpu_tests(), logged, owed_ids(OWED.read_text(), str(OWED)))
    assert not missing, f"gpu tests with no PASSED line in {run.relative_to(ROOT)}/*.log and not in owed.txt: {missing}"
    assert not stale, f"owed.txt names tests that are not gpu tests: {stale}"


def test_log_lines_are_read_in_every_pytest_format():
    log = ("tests/test_a.py::test_x[r0 = r2\\nexit-abc-3] PASSED [  6%]\n"
           "tests/test_a.py::test_y FAILED [ 10%]\n"
           "tests/test_a.py::test_z SKIPPED (needs x) [ 12%]\n"
           "PASSED tests/test_b.py::test_w\n"
           "[gw1] [ 40%] PASSED tests/test_d.py::test_u[a b]\n"
           "tests/test_c.py::test_v PASSED\n")
    assert passed_ids(log) == {"tests/test_a.py::test_x[r0 = r2\\nexit-abc-3]", "tests/test_b.py::test_w",
                               "tests/test_c.py::test_v", "tests/test_d.py::test_u[a b]"}


def test_owed_lines_need_a_reason_and_are_matched_by_id():
    owed = owed_ids("# header\n\ntests/t.py::a  # added after the run\n", "owed.txt")
    assert owed == {"tests/t.py::a": "added after the run"}
    try:
        owed_ids("tests/t.py::b\n", "owed.txt")
    except ValueError as e:
        assert str(e).startswith("owed.txt:1: expected")
    else:
        raise AssertionError("a line with no reason was accepted")
    assert unaccounted({"tests/t.py::a", "tests/t.py::b", "tests/t.py::c"}, {"tests/t.py::c"},
                       owed | {"tests/t.py::gone": "x"}) == (["tests/t.py::b"], ["tests/t.py::gone"])


def test_the_newest_run_is_the_last_folder_by_date_and_suffix(tmp_path):
    for name in ("2026-12-02", "2026-12-02c", "2026-12-02b", "2026-11-29", "notes"):
        (tmp_path / name).mkdir()
    (tmp_path / "2026-12-03-h200.md").write_text("")
    assert newest_run(tmp_path).name == "2026-12-02c"
