#!/bin/bash
# Run here (no GPU needed) before `make gpu-test` on the device: the GPU machine has no clang and no
# network, so probes are compiled and wheels downloaded here, into ignored folders the run carries.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpubuild/probes
# Named as tests/conftest.py's probe_obj fixture expects: NAME.MCPU.bpf.o
python3 - <<'PY'
from pathlib import Path
from egpu_preload.bpf.compile import compile_probe
srcs = sorted(Path("tests/probes").glob("*.bpf.c")) + sorted(Path("examples").glob("*.bpf.c")) \
    + sorted(Path("tests/e2e").glob("*.bpf.c")) + sorted(Path("bench/probes").glob("*.bpf.c"))
names = [s.name for s in srcs]
clash = sorted({n for n in names if names.count(n) > 1})
if clash:  # one flat folder of prebuilt objects: a second source of the same name would replace the first
    raise SystemExit(f"gpu-prep: probe names used twice: {', '.join(clash)}")
for src in srcs:
    for mcpu in ("v3", "v4"):
        compile_probe(src, Path(".gpubuild/probes") / f"{src.name.removesuffix('.bpf.c')}.{mcpu}.bpf.o", mcpu=mcpu)
PY
# README's example probe, as a reader copies it (tests/test_e2e_gpu.py runs it on the README's sample program)
PYTHONPATH=tests python3 -c 'from pathlib import Path; from readme_blocks import build_snippet
build_snippet(Path(".gpubuild/probes"))'
# bpftime's example probes, with bpftime's flags (tests/test_bpftime_examples.py reads them from here)
PYTHONPATH=tests python3 -c 'from pathlib import Path; from bpftime_build import build_all
build_all(Path(".gpubuild/bpftime"))'
# bpftime's CUTLASS example program, which the GPU machine cannot build (no CUTLASS there): against the
# headers of CUTLASS 3.5.0 from PyPI (downloaded into .deps, which is not carried); fails here if its GEMM
# kernel is not the one cutlass_launch_counter.bpf.c's section names
PYTHONPATH=tests python3 -c 'import sys; from pathlib import Path; from bpftime_build import prepare_cutlass
try: prepare_cutlass(Path(".gpubuild/bpftime"), Path(".deps"))
except RuntimeError as e: sys.exit(f"gpu-prep: {e}")'
# HEAD and its files' blob ids: the device hashes the files it received against them (bench/provenance.py)
rm -f .gpubuild/COMMIT
python3 bench/provenance.py manifest
[ -d .whl ] || bash ../shared/tools/device-wheels.sh .whl >/dev/null
# capstone for inline uprobe hooks (runtime/inline_hooks.py); the image has none. (Its pyarrow, 25.0.1,
# serves egpu-run --trace.)
ls .whl/capstone-*.whl >/dev/null 2>&1 || python3 -m pip download -q --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux2014_x86_64 -d .whl "capstone>=5.0"
# The image's numba needs numpy < 2.3 (the image has 2.5): a numpy for the numba test's processes only.
[ -d .whl/numba ] || python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl/numba "numpy==2.2.6"
ls .gpubuild/probes | wc -l
