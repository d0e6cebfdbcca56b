#!/bin/bash
# Every GPU check in one call (make gpu-test on the device machine). Needs `scripts/gpu-prep.sh` run
# first where clang and the network are (carry .whl and .gpubuild). Writes $OUT/gpu-test.log.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/egpu-gpu-test}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 EGPU_PREBUILT_PROBES=$PWD/.gpubuild/probes
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
if [ -d .whl/numba ]; then  # tests/test_e2e_gpu.py's numba test puts it first on its processes' path
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-numba \
    .whl/numba/*.whl && export EGPU_TEST_NUMBA_SITE=/tmp/site-numba
fi
{
  echo "# egpu gpu-test"
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(cat .gpubuild/COMMIT 2>/dev/null | tr '\n' ' ')"
  echo "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
  echo "cuda: $(nvcc --version | tail -2 | head -1)"
  echo "python: $(python3 --version), torch $(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)"
  python3 shim/build.py && echo "shim: built"
  python3 -m pytest -m gpu -v -rsx --durations=40 -p no:cacheprovider ${GPU_TESTS:-tests} 2>&1
  echo "pytest exit: $?"
  for b in ${GPU_BENCH:-bench/bench_*.py}; do  # bench/suite.py runs on its own (one device call)
    [ -f "$b" ] || continue
    echo "## bench $b"
    timeout "${GPU_BENCH_TIMEOUT:-400}" python3 "$b" "$OUT/$(basename "${b%.py}").json" 2>&1 || echo "bench $b failed: $?"
  done
} 2>&1 | tee "$OUT/gpu-test.log"
