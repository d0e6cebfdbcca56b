"""scripts/capture_examples.py's text handling (the GPU runs are the lead's): cutting outputs, the
markdown, and putting outputs into examples/README.md in place of each section's placeholder."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("capture_examples", ROOT / "scripts" / "capture_examples.py")
cap = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cap)


@pytest.mark.parametrize("n, limit, want", [
    (3, 5, "l0\nl1\nl2"),
    (5, 5, "l0\nl1\nl2\nl3\nl4"),
    (7, 5, "l0\nl1\nl2\nl3\nl4\n... (2 more lines)"),
])
def test_shown(n, limit, want):
    assert cap.shown([f"l{i}" for i in range(n)], limit) == want


def c(name, output="@x: 1"):
    return {"name": name, "command": f"egpu-run -p examples/{name}.bpf.c ./vec_add", "status": "exit 0",
            "seconds": 1.0, "lines": 1, "output": output}


README = """## a.bpf.c

Text about a.

(output captured on the GPU: see docs/gpu-results)

### b.bpf.c

(output captured on the GPU: see docs/gpu-results)

### c.bpf.c

no placeholder here

(output captured on the GPU: see docs/gpu-results)
"""


def test_apply_replaces_each_sections_placeholder_only():
    got = cap.apply(README, [c("b", "@b: 2"), c("a"), c("zzz")])
    a_sec, b_sec, c_sec = got.split("### ")[0], got.split("### ")[1], got.split("### ")[2]
    assert "```\n$ egpu-run -p examples/a.bpf.c ./vec_add\n@x: 1\n```" in a_sec and "(output captured" not in a_sec
    assert "@b: 2" in b_sec and "(output captured" not in b_sec
    assert c_sec.endswith("(output captured on the GPU: see docs/gpu-results)\n")  # no capture for c: untouched


def test_apply_leaves_a_section_without_placeholder():
    text = "## a.bpf.c\n\nnothing\n\n## b.bpf.c\n\n(output captured on the GPU: see docs/gpu-results)\n"
    assert cap.apply(text, [c("a")]) == text


def test_every_example_is_captured_and_readme_has_its_heading():
    names = {p.name.removesuffix(".bpf.c") for p in (ROOT / "examples").glob("*.bpf.c")}
    assert set(cap.EXAMPLES) == names
    readme = (ROOT / "examples" / "README.md").read_text()
    for name in names:
        assert f"{name}.bpf.c\n" in readme


def test_markdown():
    md = cap.markdown([c("a"), {**c("b"), "status": "timeout after 60 s"}])
    assert "## a\n\nexit 0, 1.0 s\n\n```\n$ egpu-run -p examples/a.bpf.c ./vec_add\n@x: 1\n```" in md
    assert "timeout after 60 s" in md


def test_every_bpftime_file_captured_is_a_fixture_and_has_a_readme_heading():
    readme = (ROOT / "examples" / "README.md").read_text()
    for name in cap.BPFTIME:
        assert (ROOT / "tests" / "fixtures" / "bpftime" / f"{name}.bpf.c").is_file(), name
        assert f"#### {name}.bpf.c\n" in readme, name


def test_apply_says_output_on_the_gpu_once():
    text = "## a.bpf.c\n\nOutput on the GPU:\n\n(output captured on the GPU: later)\n"
    assert cap.apply(text, [c("a")]).count("Output on the GPU:") == 1
    assert cap.apply(README, [c("a")]).count("Output on the GPU:") == 1


def test_uvm_ranges_trace_is_replayed_through_the_caches(tmp_path):
    """uvm_ranges runs with --perfetto, and its trace goes through examples/uvm_lru.py as a capture of its
    own: the hit rates the README's uvm section shows."""
    from egpu_preload.output import perfetto
    assert cap.EXAMPLES["uvm_ranges"][2][:2] == ["--perfetto", "trace.json"]
    t = perfetto.Trace(7, "app")
    for start, addr in [(100, 0), (200, 4 << 20), (300, 0)]:
        t.add_slice(perfetto.Slice("unified memory htod", "htod", start, 10, "uvm",
                                   {"address": f"{addr:#x}", "value": 4096}))
    t.write(tmp_path / "trace.json")
    c = cap.replay_uvm(tmp_path, tmp_path, dict(os.environ))
    assert c["name"] == "uvm_lru" and c["status"] == "exit 0", c["output"]
    assert c["output"].splitlines()[0] == "3 accesses to 2 ranges of 2097152 bytes"
