#!/usr/bin/env bash
# Runs tests/python/test_distributed.py N times in a row, one process per run, on the GPU machine (after
# scripts/gpu_check.sh --build-only), and writes each run's result and wall time to $OUT/distributed_runs.md
# (docs/distributed.md, "The multi-GPU tests, run after run"). A hung test dumps every thread's stack after
# FAULT_S seconds (pytest's faulthandler_timeout), so a hang says where it waited.
#
#   scripts/distributed_repeat.sh [N=10] [extra pytest arguments...]
set -uo pipefail
cd "$(dirname "$0")/.."
N=${1:-10}
shift || true
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
PY=$(command -v python3)
SP=$($PY -c 'import site; print(site.getsitepackages()[0])')
export LD_LIBRARY_PATH="$SP/nvidia/cudnn/lib:$SP/nvidia/cu13/lib:$SP/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}"
export PYTHONPATH=$PWD/src/python NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} NCCL_DEBUG=${NCCL_DEBUG:-WARN}
GPUS=$(nvidia-smi -L | wc -l)
{
  echo "| run | result | wall (s) |"
  echo "| ---: | --- | ---: |"
} > "$OUT/distributed_runs.md"
failed=0
for i in $(seq 1 "$N"); do
  start=$(date +%s%N)
  $PY -m pytest -q -p no:cacheprovider -o faulthandler_timeout="${FAULT_S:-45}" --durations=8 \
    tests/python/test_distributed.py "$@" > "$OUT/distributed_run_$i.log" 2>&1
  rc=$?
  wall_ms=$((($(date +%s%N) - start) / 1000000))
  summary=$(grep -E "^[0-9]+ (passed|failed)|passed|failed" "$OUT/distributed_run_$i.log" | tail -1)
  [ $rc -eq 0 ] || failed=$((failed + 1))
  printf '| %d | %s | %d.%d |\n' "$i" "$summary" $((wall_ms / 1000)) $((wall_ms % 1000 / 100)) | tee -a "$OUT/distributed_runs.md"
done
echo "$GPUS GPUs, $N runs, $failed failed" | tee -a "$OUT/distributed_runs.md"
[ $failed -eq 0 ]
