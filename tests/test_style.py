"""The house limit of 120 columns, over every tracked Python, C, header and shell source and the Makefile."""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_COLUMNS = 120
SOURCES = ("*.py", "*.c", "*.h", "*.sh", "Makefile")
# copied unchanged from eunomia-bpf/bpftime (its README there says so): kept byte for byte as upstream has them
VENDORED = ("tests/fixtures/bpftime/*",)


def long_lines(root: Path, paths: list[str], limit: int = MAX_COLUMNS) -> list[str]:
    """Each line of paths (relative to root) longer than limit characters, as "path:line: N columns"."""
    found = []
    for path in paths:
        text = (root / path).read_text(encoding="utf-8", errors="replace")
        found += [f"{path}:{n}: {len(line)} columns" for n, line in enumerate(text.splitlines(), 1)
                  if len(line) > limit]
    return found


def tracked_sources() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no list of tracked files")
    listed = subprocess.run(["git", "ls-files", "-z", "--", *SOURCES], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.split("\0")
    skipped = VENDORED
    # a tracked file deleted in the work tree but not yet in the index has nothing to check
    return [p for p in listed if p and not any(fnmatch.fnmatch(p, g) for g in skipped) and (ROOT / p).is_file()]


def test_no_tracked_source_line_is_over_120_columns():
    found = long_lines(ROOT, tracked_sources())
    assert not found, f"over {MAX_COLUMNS} columns:\n" + "\n".join(found)


def test_a_long_line_is_named_by_file_and_line(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n" + "#" * MAX_COLUMNS + "\n" + "y" * (MAX_COLUMNS + 1) + "\n")
    (tmp_path / "b.c").write_text("/* µ */" + "-" * (MAX_COLUMNS - 7) + "\n")  # characters, not bytes
    assert long_lines(tmp_path, ["a.py", "b.c"]) == [f"a.py:3: {MAX_COLUMNS + 1} columns"]
