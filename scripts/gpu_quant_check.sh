#!/usr/bin/env bash
# The GPU checks of quantized execution (issue 41, docs/quantization.md) on the lent machine, in one call: builds
# (scripts/gpu_check.sh --build-only, carry .third_party), then the quantized kernels' C++ tests, the Python tests of
# the quantized ops, models and producers, the conformance cases of the quantized ops, and the benchmarks (the int8
# GEMM, the int4 weight-only GEMM, ResNet-50 and BERT-base int8/fp8 against float16 and ONNX Runtime's CUDA EP).
# Logs and tables go to $OUT (or ./gpu_out).
#
#   scripts/gpu_quant_check.sh [--no-build] [--tests-only | --bench-only]
#
# ONNX Runtime's CUDA EP columns need its plugin staged first (scripts/stage_ort_cuda.sh here, then
# scripts/ort_cuda_unstage.sh there, one call per part); without it the model benchmark runs with --skip-ort.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
BUILD=1
MODE=all
for arg in "$@"; do
  case "$arg" in
    --no-build) BUILD=0 ;;
    --tests-only | --bench-only) MODE=$arg ;;
    *) echo "usage: $0 [--no-build] [--tests-only | --bench-only]" >&2; exit 2 ;;
  esac
done
if [ "$BUILD" = 1 ]; then
  scripts/gpu_check.sh --build-only > "$OUT/build_step.log" 2>&1 || { tail -60 "$OUT/build_step.log"; exit 1; }
  echo "== build ok"
fi
PY=$(command -v python3)
SP=$($PY -c 'import site; print(site.getsitepackages()[0])')
export LD_LIBRARY_PATH="$SP/nvidia/cudnn/lib:$SP/nvidia/cu13/lib:$SP/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}"
export PYTHONPATH=$PWD/src/python PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
status=0
if [ "$MODE" != "--bench-only" ]; then
  ctest --test-dir build-gpu --output-on-failure -j 8 \
    -R "Quant|quant|QLinear|Qlinear|QConv|Qconv|qconv|Int4|int4|NBits|Nbits|LowBit|Epilogue|Dp4a" > "$OUT/ctest_quant.log" 2>&1 \
    || status=1
  grep -E "tests passed|tests failed|\*\*\*Failed|Not Run|Exception" "$OUT/ctest_quant.log" | head -40
  $PY -m pytest -q -rs -p no:cacheprovider tests/python/test_quantize_linear_ops.py tests/python/test_quantized_gemm.py \
    tests/python/test_qconv2d_gpu.py tests/python/test_int4_gemm.py tests/python/test_quantized_fusion.py \
    tests/python/test_quantized_models.py tests/python/test_quantization.py > "$OUT/pytest_quant.log" 2>&1 || status=1
  grep -E "passed|failed|FAILED|ERROR" "$OUT/pytest_quant.log" | head -40
  $PY -m pytest -q -rs -p no:cacheprovider tests/python/test_conformance.py \
    -k "qlinear or qconv or quantize or nbits or dequantize" > "$OUT/pytest_conformance_quant.log" 2>&1 || status=1
  grep -E "passed|failed|FAILED|ERROR" "$OUT/pytest_conformance_quant.log" | head -20
  $PY -m pytest -q -rs -p no:cacheprovider tests/python/test_quantized_producers.py > "$OUT/pytest_producers.log" 2>&1 \
    || status=1
  grep -E "passed|failed|FAILED|ERROR|SKIPPED" "$OUT/pytest_producers.log" | head -40
fi
if [ "$MODE" != "--tests-only" ]; then
  $PY benchmarks/bench_quant_gemm.py --out "$OUT/bench_quant_gemm.md" > "$OUT/bench_quant_gemm.log" 2>&1 || status=1
  tail -30 "$OUT/bench_quant_gemm.log"
  $PY benchmarks/bench_int4_gemm.py --out "$OUT/bench_int4_gemm.md" > "$OUT/bench_int4_gemm.log" 2>&1 || status=1
  tail -30 "$OUT/bench_int4_gemm.log"
  ort=()
  if eval "$(scripts/ort_cuda_unstage.sh --export 2>/dev/null)" && [ -n "${XPURT_ORT_CUDA_PROVIDER:-}" ]; then
    echo "ONNX Runtime CUDA EP: $XPURT_ORT_CUDA_PROVIDER"
  else
    ort=(--skip-ort)
  fi
  for model in resnet bert; do
    $PY benchmarks/quantized_bench.py --dir /tmp/suite --models "$model" --iterations 30 --warmup 5 "${ort[@]}" \
      --out "$OUT/quantized_$model.json" > "$OUT/quantized_$model.log" 2>&1 || status=1
    tail -40 "$OUT/quantized_$model.log"
  done
fi
exit $status
