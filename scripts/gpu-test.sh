#!/bin/bash
# Every GPU check in one call (make gpu-test on the device machine). Needs `scripts/gpu-prep.sh` run
# first where clang and the network are (carry .whl and .gpubuild). Writes $OUT/gpu-test.log and each
# bench's JSON beside it, every JSON stamped (bench/provenance.py) with the commit and dirty state of
# the files that ran here, the GPU, its driver, the time and the log. pytest -v logs one line per test
# id (tests/test_gpu_logged.py reads them). GPU_TESTS: pytest's arguments (default tests; "none": no
# tests); GPU_BENCH: bench scripts (default bench/bench_*.py; "none": none), each given OUT.json and then
# GPU_BENCH_ARGS (for one bench that takes them, as bench_trace.py's sizes); GPU_SUITE: bench/suite.py's
# PARTs (unset: no suite; "all": every part), its suite.json and suite.md into $OUT; GPU_EXAMPLES:
# scripts/capture_examples.py's names ("all": every example) captured into $OUT/examples.md and .json.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/egpu-gpu-test}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 EGPU_PREBUILT_PROBES=$PWD/.gpubuild/probes EGPU_TEST_FAILURES=$OUT/failures.log
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}   # a caller's own after ours (next-run.md item 2)
if [ -d .whl/numba ]; then  # tests/test_e2e_gpu.py's numba test puts it first on its processes' path
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-numba \
    .whl/numba/*.whl && export EGPU_TEST_NUMBA_SITE=/tmp/site-numba
fi
{
  echo "# egpu gpu-test"
  echo "date: $(date -u +%FT%TZ)"
  echo "provenance: $(python3 bench/provenance.py stamp)"
  echo "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
  echo "cuda: $(nvcc --version | tail -2 | head -1)"
  echo "python: $(python3 --version), torch $(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)"
  python3 shim/build.py && echo "shim: built"
  if [ "${GPU_TESTS:-tests}" != none ]; then
    python3 -m pytest -m gpu -v -rsx --durations=40 -p no:cacheprovider ${GPU_TESTS:-tests} 2>&1
    echo "pytest exit: $?"
    for j in "$OUT"/*.json; do   # what the tests measured (swap latency, checkpoints): stamped as benches are
      [ -f "$j" ] && python3 bench/provenance.py annotate "$j"
    done
  fi
  for b in ${GPU_BENCH:-bench/bench_*.py}; do
    [ -f "$b" ] || continue
    echo "## bench $b"
    json="$OUT/$(basename "${b%.py}").json"
    timeout "${GPU_BENCH_TIMEOUT:-400}" python3 "$b" "$json" ${GPU_BENCH_ARGS:-} 2>&1 || echo "bench $b failed: $?"
    [ -f "$json" ] && python3 bench/provenance.py annotate "$json"
  done
  if [ -n "${GPU_EXAMPLES:-}" ]; then
    echo "## examples ${GPU_EXAMPLES}"
    python3 scripts/capture_examples.py "$OUT/examples.md" $([ "$GPU_EXAMPLES" = all ] || echo "$GPU_EXAMPLES") 2>&1 \
      || echo "examples failed: $?"
  fi
  if [ -n "${GPU_SUITE:-}" ]; then
    echo "## suite ${GPU_SUITE}"
    python3 bench/suite.py "$OUT" $([ "$GPU_SUITE" = all ] || echo "$GPU_SUITE") 2>&1 || echo "suite failed: $?"
  fi
} 2>&1 | tee "$OUT/gpu-test.log"
