#!/usr/bin/env bash
# Builds xpuruntime on the lent GPU machine and runs everything there: the C++ and Python test suites (GPU
# tests included, the cross-backend conformance suite among them) and the GPU benchmarks. Logs and result
# tables go to $OUT (or ./gpu_out).
#
#   scripts/gpu_check.sh [--tests-only | --bench-only | --build-only]
#
# That machine has no Debian packages: the DLPack and nlohmann-json headers and the GoogleTest sources travel in
# .third_party/ (made here by `scripts/gpu_check.sh --prepare`, which copies them from this machine's Debian
# packages). Carry .deps/onnxruntime too (scripts/fetch_onnxruntime.sh) for the onnxruntime engine. cuDNN comes
# from the pip wheel folder there; yaml-cpp is absent, so the YAML tests skip.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--prepare" ]; then
  mkdir -p .third_party/dlpack/include
  cp -r /usr/include/dlpack .third_party/dlpack/include/
  rm -rf .third_party/googletest && cp -r /usr/src/googletest .third_party/googletest
  mkdir -p .third_party/nlohmann/include && cp -r /usr/include/nlohmann .third_party/nlohmann/include/
  # ONNX's protobuf classes, generated here with Debian's protoc (3.21.12: the protobuf runtime that machine has).
  rm -rf .third_party/onnx_proto && mkdir -p .third_party/onnx_proto/onnx
  cp /usr/include/onnx/onnx.proto .third_party/onnx_proto/onnx/onnx-ml.proto
  (cd .third_party/onnx_proto && protoc --cpp_out=. onnx/onnx-ml.proto)
  echo "prepared .third_party (carry it to the device)"
  exit 0
fi
MODE=${1:-all}
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
PY=$(command -v python3)
SP=$($PY -c 'import site; print(site.getsitepackages()[0])')
export LD_LIBRARY_PATH="$SP/nvidia/cudnn/lib:$SP/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}"
export PYTHONUNBUFFERED=1
{
  echo "date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c 'import torch, numpy; print("torch", torch.__version__, "numpy", numpy.__version__)'
} 2>&1 | tee "$OUT/env.txt"

# The image's default compiler (/opt/gcc) links libstdc++ statically into each shared object, which breaks
# C++ streams across libxpuruntime_core.so and _core.so; the distribution's g++ links it dynamically.
# nvcc's host compiler must be that g++ too: CMake takes the CUDA implicit link libraries from it, and /opt/gcc's
# would link a static libstdc++ into libxpuruntime_core.so (whose exported locale ids then crash `import torch`).
CXX_COMPILER=${XPURT_GPU_CXX:-/usr/bin/g++}  # not $CXX: that machine sets CXX to /opt/gcc
export PATH=/usr/bin:$PATH
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DXPURT_USE_CCACHE=OFF -DCMAKE_CXX_COMPILER="$CXX_COMPILER" \
  -DCMAKE_CUDA_HOST_COMPILER="$CXX_COMPILER" -DCMAKE_C_COMPILER=/usr/bin/gcc \
  -DPython3_EXECUTABLE="$PY" -Dpybind11_DIR="$($PY -m pybind11 --cmakedir)" \
  -DXPURT_DLPACK_INCLUDE_DIR="$PWD/.third_party/dlpack/include" \
  -DXPURT_GTEST_SOURCE_DIR="$PWD/.third_party/googletest" -DXPURT_WITH_CUDA=ON \
  -DXPURT_BUILD_PYTHON=ON -DXPURT_BUILD_TESTS=ON -DXPURT_BUILD_BENCHMARKS=ON \
  -DXPURT_NLOHMANN_JSON_INCLUDE_DIR="$PWD/.third_party/nlohmann/include" \
  -DXPURT_ONNX_PROTO_GENERATED_DIR="$PWD/.third_party/onnx_proto" \
  -DXPURT_WITH_CUDNN=ON -DCUDNN_ROOT="$SP/nvidia/cudnn" -DNCCL_ROOT="$SP/nvidia/nccl" -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/configure.log" 2>&1 \
  || { tail -40 "$OUT/configure.log"; exit 1; }
grep -A10 "configuration" "$OUT/configure.log"
# XPURT_GPU_TARGETS="_core test_generation ..." builds only those targets (and what they need): a shorter build for a
# session that runs a few tests and benchmarks.
# A target this configuration does not define (ort_direct_bench before ONNX Runtime is staged) is left out with a
# note rather than failing the whole build (and the call with it).
TARGETS=()
if [ -n "${XPURT_GPU_TARGETS:-}" ]; then
  defined=$(ninja -C build-gpu -t targets all 2>/dev/null | cut -d: -f1)
  for t in $XPURT_GPU_TARGETS; do
    if grep -qx "$t" <<< "$defined"; then TARGETS+=(--target "$t"); else echo "== no target $t in this build: left out"; fi
  done
  [ ${#TARGETS[@]} -gt 0 ] || { echo "== none of the targets ($XPURT_GPU_TARGETS) is defined"; exit 1; }
fi
cmake --build build-gpu -j 16 "${TARGETS[@]}" > "$OUT/build.log" 2>&1 || { grep -B2 -A8 "error" "$OUT/build.log" | head -60; exit 1; }
echo "== build ok"
[ "$MODE" = "--build-only" ] && exit 0

status=0
if [ "$MODE" != "--bench-only" ]; then
  ctest --test-dir build-gpu --output-on-failure -j 8 > "$OUT/ctest.log" 2>&1 || status=1
  grep -E "tests passed|tests failed|\*\*\*Failed|Not Run|Exception" "$OUT/ctest.log" | head -40
  PYTHONPATH=$PWD/src/python $PY -m pytest -q -rs -p no:cacheprovider tests/python > "$OUT/pytest.log" 2>&1 || status=1
  grep -E "passed|failed|FAILED|ERROR" "$OUT/pytest.log" | head -40
fi
if [ "$MODE" != "--tests-only" ]; then
  export PYTHONPATH=$PWD/src/python
  $PY benchmarks/allocator_bench.py --bench build-gpu/benchmarks/bench_allocator --out "$OUT/allocator_bench.md" \
    > "$OUT/bench_allocator.log" 2>&1 || status=1
  $PY benchmarks/dispatch_bench.py --bench build-gpu/benchmarks/bench_dispatch --out "$OUT/bench_dispatch.md" \
    2>&1 | tee "$OUT/bench_dispatch.log" | tail -12 || status=1
  for bench in gemm attention; do
    if [ -f benchmarks/bench_$bench.py ]; then
      $PY benchmarks/bench_$bench.py --out "$OUT/bench_$bench.md" 2>&1 | tee "$OUT/bench_$bench.log" | tail -30 || status=1
    fi
  done
  # Routed kernels inside PyTorch training (xpuruntime.pytorch) against PyTorch's own backends.
  $PY benchmarks/torch_routing_bench.py --out "$OUT/torch_routing.md" 2>&1 | tee "$OUT/torch_routing.log" | tail -30 \
    || status=1
  $PY examples/training_kernel_policy.py > "$OUT/training_kernel_policy.log" 2>&1 || status=1
  tail -8 "$OUT/training_kernel_policy.log"
fi
exit $status
