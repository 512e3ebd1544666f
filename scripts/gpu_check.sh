#!/usr/bin/env bash
# The one script a GPU machine runs, in one device call: a preflight, the CUDA kernels built from a clean cache,
# the CUDA tests in three processes, then the benchmarks, the most valuable figures first, all inside nine
# minutes. scripts/gpu_check.py holds the steps and says what each one saves.
#
#   scripts/gpu_check.sh OUT_DIR    # OUT_DIR: gpu_check.tar.gz, summary.md, summary.json (four files at most)
#   scripts/gpu_check.sh --plan     # the steps, their time caps and what each saves
#
# PYTHON: the interpreter (default python3, the GPU machine's); GPU_CHECK_COMMIT: the commit the summary names
# (the tree travels without .git; README's GPU notes give the device command); GPU_CHECK_ARCH: the arch the kernels build for
# (default 9.0, an H200), whatever TORCH_CUDA_ARCH_LIST the machine presets; GPU_CHECK_BUDGET_S: the whole run's
# budget (default 540); GPU_CHECK_DESELECT: pytest node ids the test steps leave out (a rerun past a test that
# crashes its process); GPU_CHECK_ONLY: the steps to run (a rerun in the device time left). Exit status: 2
# when the preflight finds no usable GPU (nothing else runs), 1 when a step failed, timed out or was skipped,
# else 0. No step needs the network or a model download.
set -u
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null 2>&1; then
  if [[ ${1:-} != --plan && -n ${1:-} ]]; then
    mkdir -p "$1" && printf '| step | status |\n|---|---|\n| preflight | STOPPED: no %s on PATH |\n' "$PY" >"$1/summary.md"
  fi
  echo "no $PY on PATH; set PYTHON" >&2
  exit 2
fi
exec "$PY" scripts/gpu_check.py "$@"
