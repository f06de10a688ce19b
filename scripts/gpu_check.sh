#!/usr/bin/env bash
# Builds xpuruntime on the lent GPU machine and runs everything there: the C++ and Python test suites (GPU
# tests included) and the allocator benchmark. Logs and the results table go to $OUT (or ./gpu_out).
#
# That machine has no Debian packages: the DLPack header and GoogleTest sources travel in .third_party/
# (made here by `scripts/gpu_check.sh --prepare`, which copies them from this machine's Debian packages).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--prepare" ]; then
  mkdir -p .third_party/dlpack/include
  cp -r /usr/include/dlpack .third_party/dlpack/include/
  rm -rf .third_party/googletest && cp -r /usr/src/googletest .third_party/googletest
  echo "prepared .third_party (carry it to the device)"
  exit 0
fi
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
PY=$(command -v python3)
export PYTHONUNBUFFERED=1
{
  echo "date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c 'import torch, numpy; print("torch", torch.__version__, "numpy", numpy.__version__)'
} 2>&1 | tee "$OUT/env.txt"

# The image's default compiler (/opt/gcc) links libstdc++ statically into each shared object, which breaks
# C++ streams across libxpuruntime_core.so and _core.so; the distribution's g++ links it dynamically.
CXX_COMPILER=${CXX:-/usr/bin/g++}
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DXPURT_USE_CCACHE=OFF -DCMAKE_CXX_COMPILER="$CXX_COMPILER" \
  -DPython3_EXECUTABLE="$PY" -Dpybind11_DIR="$($PY -m pybind11 --cmakedir)" \
  -DXPURT_DLPACK_INCLUDE_DIR="$PWD/.third_party/dlpack/include" \
  -DXPURT_GTEST_SOURCE_DIR="$PWD/.third_party/googletest" -DXPURT_WITH_CUDA=ON > "$OUT/configure.log" 2>&1 \
  || { tail -40 "$OUT/configure.log"; exit 1; }
grep -A10 "configuration" "$OUT/configure.log"
cmake --build build-gpu -j 16 > "$OUT/build.log" 2>&1 || { grep -B2 -A8 "error" "$OUT/build.log" | head -60; exit 1; }
echo "== build ok"

status=0
ctest --test-dir build-gpu --output-on-failure -j 4 > "$OUT/ctest.log" 2>&1 || status=1
tail -15 "$OUT/ctest.log"
PYTHONPATH=$PWD/src/python $PY -m pytest -q -rs -p no:cacheprovider tests/python > "$OUT/pytest.log" 2>&1 || status=1
tail -15 "$OUT/pytest.log"
PYTHONPATH=$PWD/src/python $PY benchmarks/allocator_bench.py --bench build-gpu/benchmarks/bench_allocator \
  --out "$OUT/allocator_bench.md" 2>&1 | tee "$OUT/bench.log" || status=1
exit $status
