#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs every test: the C++ suite (CTest: GoogleTest and the find_package
# consumer), the Python suite (pytest) and the wheel (scripts/test_wheel.sh). GPU-only tests skip without a GPU.
# Warnings are errors here.
set -euo pipefail
cd "$(dirname "$0")/.."
export XPURT_CMAKE_ARGS="${XPURT_CMAKE_ARGS:-} -DXPURT_WARNINGS_AS_ERRORS=ON"
export XPURT_TEST_DEPS=1  # setup.sh also installs the packages only the tests need (chromium)
./scripts/setup.sh
BUILD_DIR=${XPURT_BUILD_DIR:-build}
echo "[test] C++ tests"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j 2
echo "[test] Python tests"
.venv/bin/python -m pytest -q -rs tests/python "$@"
echo "[test] layering: C++ includes point down, no Python import circle, against scripts/layers_allowlist.txt (scripts/check_layers.py)"
.venv/bin/python scripts/check_layers.py
echo "[test] long functions: none in src/cpp over 150 lines without a '// Long function: <reason>' comment (scripts/long_functions.py; --report lists them all)"
.venv/bin/python scripts/long_functions.py
echo "[test] structural fuzzing of both engines: ${FUZZ_STRUCTURE_MUTANTS:-3000} mutants of real exports (scripts/fuzz_structure.py)"
.venv/bin/python scripts/fuzz_structure.py --mutants "${FUZZ_STRUCTURE_MUTANTS:-3000}" --seed 1 --out "$BUILD_DIR/fuzz-structure"
echo "[test] the wheel: pip wheel ., installed into a fresh venv, used from another folder"
XPURT_BUILD_DIR="$BUILD_DIR" ./scripts/test_wheel.sh
if [ "${XPURT_SKIP_SANITIZE:-0}" != 1 ]; then
  echo "[test] ASan + UBSan build: the C++ tests and the fuzz harnesses (scripts/sanitize.sh, docs/reliability.md)"
  FUZZ_RUNS=${FUZZ_RUNS:-20000} ./scripts/sanitize.sh
fi
