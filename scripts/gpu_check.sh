#!/usr/bin/env bash
# The one script a GPU machine runs: environment, a from-scratch build of the CUDA kernels, the CUDA tests,
# then the benchmarks. Each step logs to OUT_DIR/<step>.log; a failed step is recorded and the next one
# still runs; a summary table comes last (also OUT_DIR/summary.md). Needs torch (CUDA build), nvcc, ninja,
# pytest and transformers; no gradio or plotly (nothing here imports ui/).
#
#   scripts/gpu_check.sh OUT_DIR
#
# Every step's timeout is cut from one budget (GPU_CHECK_BUDGET_S, default 440 s), so the whole run ends
# in under 8 minutes; a step the budget cannot reach is reported as skipped. Exit status 1 if any step failed.
set -u -o pipefail

OUT=${1:?usage: scripts/gpu_check.sh OUT_DIR}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
BUDGET_S=${GPU_CHECK_BUDGET_S:-440}
START=$(date +%s)
DECODESCOPE_CACHE=$(mktemp -d)  # scratch: the build step starts from nothing, later steps reuse it
export DECODESCOPE_CACHE PYTHONUNBUFFERED=1
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

step env 60 bash -c "
  nvidia-smi
  nvcc --version | tail -n 2
  echo ninja \$(ninja --version)
  $PY -c 'import sys, torch; print(\"python\", sys.version.split()[0]); print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda); print(\"device\", torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))'
  $PY -c 'import transformers; print(\"transformers\", transformers.__version__)'
  $PY -m pytest --version
  git log -1 --format='commit %H %s' 2>/dev/null; git status --porcelain 2>/dev/null | head -n 20
"

step build 240 $PY -m engine.ext build

TESTS=(tests/test_kernels_cuda.py)
[[ -f tests/test_graphs.py ]] && TESTS+=(tests/test_graphs.py)
step tests 240 $PY -m pytest -q -rs "${TESTS[@]}"

step bench_attention 90 $PY -m bench.attention --out "$OUT"

if [[ -f bench/latency.py ]]; then
  step bench_latency 120 $PY -m bench.latency --device cuda --out "$OUT"
else
  SUMMARY+=("bench_latency|skipped: bench/latency.py not present|0")
fi
if [[ -f bench/spec.py ]]; then
  step bench_spec 120 $PY -m bench.spec --device cuda --out "$OUT"
else
  SUMMARY+=("bench_spec|skipped: bench/spec.py not present|0")
fi
step bench_profile 120 $PY -m bench.profile --device cuda --out "$OUT"

rm -rf "$DECODESCOPE_CACHE"
{
  echo "| step | status | seconds |"
  echo "|---|---|---|"
  for row in "${SUMMARY[@]}"; do echo "| ${row//|/ | } |"; done
  echo
  echo "total: $(($(date +%s) - START)) s; logs and results in $OUT"
} | tee "$OUT/summary.md"
exit $FAILED
