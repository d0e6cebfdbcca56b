"""On the GPU: which part of a site splits cg::coalesced_threads() in the corpus' cg_coalesced kernel.

The kernel writes ``thread_rank + 100 * size`` of the coalesced group inside ``if (i % 3 == 0)``. Run
as compiled every lane of a warp's group sees the same size; instrumented with probes in every scope it
did not (translate/rewrite.py). Each variant below instruments with a subset of the probes or changes how
the leader's guarded call is written, and prints the group sizes the lanes of warps 0 and 1 saw and how
many words of the output differ from the uninstrumented run.

    PYTHONPATH=tests:. python3 scripts/diag_coalesced.py [OUT.json]
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import tempfile
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import ptx_corpus  # noqa: E402
from test_rewrite_gpu import LAUNCH_ID, Gpu, _cases, _run  # noqa: E402

from egpu_preload.translate.rewrite import instrument  # noqa: E402

GUARDED = re.compile(r"^(\t)@%__egpu_q (call [^;]*;)$", re.M)


def _sync_after_guard(text: str) -> str:
    return GUARDED.sub(r"\1@%__egpu_q \2\n\1bar.warp.sync %__egpu_m;", text)


def _branch_guard(text: str, sync: bool = False) -> str:
    n = iter(range(1 << 30))
    after = "\n\tbar.warp.sync %__egpu_m;" if sync else ""

    def sub(m: re.Match) -> str:
        k = next(n)
        return f"\t@!%__egpu_q bra $__egpu_g{k};\n\t{m.group(2)}\n$__egpu_g{k}:{after}"
    return GUARDED.sub(sub, text)


def _no_site_sync(text: str) -> str:
    return text.replace("\tbar.warp.sync %__egpu_m;\n", "")


def main() -> None:
    case = next(c for c in _cases() if c.kernel == "cg_coalesced")
    text = ptx_corpus.build()[case.module]
    gpu = Gpu()
    _, want, _ = _run(gpu, text, case, None)
    probes = ptx_corpus.stats_probes(glob=case.kernel)
    variants = {"all": (probes, None), "all, sync after each guarded call": (probes, _sync_after_guard),
                "all, guard as a branch": (probes, _branch_guard),
                "all, branch guard + sync after": (probes, lambda t: _branch_guard(t, sync=True)),
                "all, no site bar.warp.sync": (probes, _no_site_sync)}
    for p in probes:
        variants[f"only {p.attach.kind}/{p.attach.scope}"] = ([p], None)
    for scope in ptx_corpus.SCOPES:
        variants[f"{scope} scope, all sites"] = ([p for p in probes if p.attach.scope == scope], None)

    def sizes(out: bytes, warp: int) -> list[int]:
        vals = struct.unpack(f"<{len(out) // 4}i", out)
        return [vals[i] // 100 for i in range(32 * warp, 32 * warp + 32) if i % 3 == 0]

    results = {"uninstrumented": {"warp0": sizes(want[0], 0), "warp1": sizes(want[0], 1), "differ": 0}}
    for name, (subset, edit) in variants.items():
        res = instrument(text, subset)
        t = edit(res.text) if edit else res.text
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
