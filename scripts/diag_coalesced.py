"""On the GPU: which part of a site splits cg::coalesced_threads() in the corpus' cg_coalesced kernel.

The kernel writes ``thread_rank + 100 * size`` of the coalesced group inside ``if (i % 3 == 0)``. Run
as compiled every lane of a warp's group sees the same size; instrumented with probes in every scope it
did not until a barrier followed each leader's guarded call (translate/rewrite.py). Each variant takes
the rewritten PTX or removes some of its barriers, and prints the group sizes the lanes of warps 0 and
1 saw and how many words of the output differ from the uninstrumented run.

    PYTHONPATH=tests:. python3 scripts/diag_coalesced.py [OUT.json]
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import ptx_corpus  # noqa: E402
from test_rewrite_gpu import LAUNCH_ID, Gpu, _cases, _run  # noqa: E402

from egpu_preload.translate.rewrite import instrument  # noqa: E402

GUARDED = re.compile(r"^(\t)@%__egpu_q (call [^;]*;)\n\tbar.warp.sync %__egpu_m;$", re.M)


def _no_guard_sync(text: str) -> str:
    """As rewritten before 2026-12-01: no barrier right after a leader's guarded call."""
    return GUARDED.sub(r"\1@%__egpu_q \2", text)


def _branch_guard(text: str) -> str:
    """The guarded call as a branch around an unguarded call, no barrier after it."""
    n = iter(range(1 << 30))

    def sub(m: re.Match) -> str:
        k = next(n)
        return f"\t@!%__egpu_q bra $__egpu_g{k};\n\t{m.group(2)}\n$__egpu_g{k}:"
    return GUARDED.sub(sub, text)


def _no_site_sync(text: str) -> str:
    """No barrier at all: neither after guarded calls nor at the end of a site."""
    return _no_guard_sync(text).replace("\tbar.warp.sync %__egpu_m;\n", "")


def main() -> None:
    case = next(c for c in _cases() if c.kernel == "cg_coalesced")
    text = ptx_corpus.build()[case.module]
    gpu = Gpu()
    _, want, _ = _run(gpu, text, case, None)
    probes = ptx_corpus.stats_probes(glob=case.kernel)
    variants = {"as rewritten": None, "no barrier after guarded calls": _no_guard_sync,
                "guard as a branch, no barrier after": _branch_guard, "no barriers": _no_site_sync}

    def sizes(out: bytes, warp: int) -> list[int]:
        vals = struct.unpack(f"<{len(out) // 4}i", out)
        return [vals[i] // 100 for i in range(32 * warp, 32 * warp + 32) if i % 3 == 0]

    results = {"uninstrumented": {"warp0": sizes(want[0], 0), "warp1": sizes(want[0], 1), "differ": 0}}
    rewritten = instrument(text, probes).text
    for name, edit in variants.items():
        t = edit(rewritten) if edit else rewritten
        try:
            _, got, _ = _run(gpu, t, case, LAUNCH_ID)
        except Exception as e:  # a variant ptxas or the driver refuses is a result too
            results[name] = {"error": str(e)}
            continue
        differ = sum(a != b for a, b in zip(struct.iter_unpack("<i", got[0]), struct.iter_unpack("<i", want[0])))
        results[name] = {"warp0": sizes(got[0], 0), "warp1": sizes(got[0], 1), "differ": differ}
    for name, r in results.items():
        print(f"{name:40} {r}")
    _print_sass(instrument(text, [p for p in probes if p.attach.kind == "entry" and p.attach.scope == "warp"]).text)


def _print_sass(text: str) -> None:
    """The SASS of the kernel with only the warp-scope entry probe, where cuobjdump is installed."""
    if not shutil.which("cuobjdump"):
        return
    with tempfile.TemporaryDirectory() as tmp:
        ptx, cubin = Path(tmp, "k.ptx"), Path(tmp, "k.cubin")
        ptx.write_text(text)
        subprocess.run(["ptxas", "-arch=sm_90", str(ptx), "-o", str(cubin)], check=True)
        out = subprocess.run(["cuobjdump", "-sass", "-fun", "cg_coalesced", str(cubin)],
                             capture_output=True, text=True).stdout
    print(re.sub(r"\s*/\* 0x[0-9a-f]+ \*/", "", out))
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
