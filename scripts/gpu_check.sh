#!/usr/bin/env bash
# The one script a GPU machine runs: a preflight of what the machine has, a from-scratch build of the CUDA
# kernels, the CUDA tests (junit XML), then the benchmarks. Each step logs to OUT_DIR/<step>.log and writes
# its results as it finishes, so a timeout or a failed step loses only itself; the next step still runs.
# A summary table comes last (also OUT_DIR/summary.md). Needs torch (CUDA build), nvcc, ninja, pytest and
# transformers; no gradio, plotly, network or model cache: everything runs offline, on random weights where
# a model is needed.
#
#   scripts/gpu_check.sh OUT_DIR
#
# Every step's timeout is cut from one budget (GPU_CHECK_BUDGET_S, default 440 s), so the whole run ends
# in under 8 minutes; a step the budget cannot reach is reported as skipped. Exit status: 2 when the
# preflight finds no usable GPU (nothing else runs), 1 if any step failed, else 0.
set -u -o pipefail

OUT=${1:?usage: scripts/gpu_check.sh OUT_DIR}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
BUDGET_S=${GPU_CHECK_BUDGET_S:-440}
START=$(date +%s)
# a fresh kernel cache, so the build is timed from scratch; never the network (the machine has none, and
# waiting for pip or the hub to give up would eat the budget)
DECODESCOPE_EXT_CACHE=$(mktemp -d)
export DECODESCOPE_EXT_CACHE DECODESCOPE_OFFLINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
SUMMARY=()
FAILED=0

# step NAME MAX_SECONDS COMMAND...
step() {
  local name=$1 cap=$2
  shift 2
  local left=$((BUDGET_S - ($(date +%s) - START)))
  if ((left < 15)); then
    SUMMARY+=("$name|skipped: time budget spent|0")
    return
  fi
  local limit=$((cap < left ? cap : left)) t0
  t0=$(date +%s)
  echo "=== $name (timeout ${limit}s) -> $OUT/$name.log"
  timeout --kill-after=5 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=$? status=ok
  if ((rc == 124 || rc == 137)); then
    status="TIMEOUT after ${limit}s"
  elif ((rc != 0)); then
    status="FAILED (exit $rc)"
  fi
  [[ $status == ok ]] || FAILED=1
  SUMMARY+=("$name|$status|$(($(date +%s) - t0))")
}

summary() {
  rm -rf "$DECODESCOPE_EXT_CACHE"
  {
    echo "| step | status | seconds |"
    echo "|---|---|---|"
    for row in "${SUMMARY[@]}"; do echo "| ${row//|/ | } |"; done
    echo
    echo "total: $(($(date +%s) - START)) s; logs and results in $OUT"
  } | tee "$OUT/summary.md"
}

# What the machine has, before spending a minute on anything: stop at once, saying why, without a GPU.
if ! $PY -m bench.preflight "$OUT/preflight.json" 2>&1 | tee "$OUT/preflight.log"; then
  SUMMARY+=("preflight|STOPPED: $(tail -n 1 "$OUT/preflight.log")|$(($(date +%s) - START))")
  summary
  exit 2
fi
SUMMARY+=("preflight|ok|$(($(date +%s) - START))")

step build 240 $PY -m engine.ext build --target cuda

# The CUDA cases only: the emulated ones run in CI already, and the clean-cache build is the step above.
step tests 150 $PY -m pytest -q -rs tests/test_kernels_cuda.py tests/test_gemv_cuda.py tests/test_graphs.py tests/test_drafters.py \
  -k "not emulated and not clean_cache" --junitxml="$OUT/tests.xml"

step bench_attention 60 $PY -m bench.attention --out "$OUT"
step bench_latency 120 $PY -m bench.latency --device cuda --out "$OUT"
step bench_spec 60 $PY -m bench.spec --device cuda --out "$OUT"
step bench_profile 60 $PY -m bench.profile --device cuda --out "$OUT"

summary
exit $FAILED
