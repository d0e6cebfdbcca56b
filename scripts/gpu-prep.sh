#!/bin/bash
# Run here (no GPU needed) before `make gpu-test` on the device: the GPU machine has no clang and no
# network, so probes are compiled and wheels downloaded here, into ignored folders the run carries.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpubuild/probes
for src in tests/probes/*.bpf.c examples/*.bpf.c; do
  [ -f "$src" ] || continue
  python3 -c "import sys; from pathlib import Path; from egpu_preload.bpf.compile import compile_probe; compile_probe(Path(sys.argv[1]), Path(sys.argv[2]))" \
    "$src" ".gpubuild/probes/$(basename "${src%.c}").o"
done
git rev-parse HEAD > .gpubuild/COMMIT
git status --porcelain | grep -q . && echo "+dirty" >> .gpubuild/COMMIT || true
[ -d .whl ] || bash ../shared/tools/device-wheels.sh .whl >/dev/null
ls .gpubuild/probes | wc -l
