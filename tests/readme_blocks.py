"""The README's set-up command and its probe example, read from README.md as a reader copies them: the tests
that run them (test_readme.py here, test_e2e_gpu.py on the GPU) and gpu-prep.sh, which compiles the example
for the GPU machine (no clang there), take them from here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SNIPPET_NAME = "readme_bytes"   # the example's prebuilt object: .gpubuild/probes/readme_bytes.v3.bpf.o


def _block_after(heading: str, lang: str = "") -> str:
    """The first fenced block (```lang) after the line holding ``heading``."""
    text = README.read_text()
    at = text.index(heading)
    m = re.compile(rf"^```{lang}\n(.*?)^```$", re.M | re.S).search(text, at)
    assert m is not None, f"README: no ```{lang} block after {heading!r}"
    return m.group(1)


def quick_start() -> list[str]:
    """The steps (``&&``-separated) of the command that runs a probe on a sample CUDA program."""
    (line,) = _block_after("Run a probe on a sample CUDA program").strip().splitlines()
    return line.split(" && ")


def probe_snippet() -> str:
    """The C source under "What a probe looks like"."""
    return _block_after("## What a probe looks like", "c")


def build_snippet(out_dir: Path, mcpu: str = "v3") -> Path:
    """The example compiled as egpu-run compiles a .bpf.c, to ``out_dir``/readme_bytes.MCPU.bpf.o."""
    from egpu_preload.bpf.compile import compile_probe
    src = out_dir / f"{SNIPPET_NAME}.bpf.c"
    src.write_text(probe_snippet())
    return compile_probe(src, out_dir / f"{SNIPPET_NAME}.{mcpu}.bpf.o", mcpu=mcpu)
