#!/usr/bin/env bash
# Sets up xpuruntime on a Debian 12 machine: system packages, a virtual environment that sees Debian's
# Python packages, and the build (C++ core, Python module, tests, benchmarks). Idempotent: run it again at
# any time; it installs only what is missing and rebuilds incrementally.
#
#   XPURT_BUILD_DIR   build folder (default: build)
#   XPURT_CMAKE_ARGS  extra CMake arguments (e.g. -DXPURT_WARNINGS_AS_ERRORS=ON)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD_DIR=${XPURT_BUILD_DIR:-build}

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  python3 python3-dev python3-venv python3-numpy python3-pytest python3-setuptools python3-wheel
  pybind11-dev libdlpack-dev libgtest-dev libgmock-dev nlohmann-json3-dev libyaml-cpp-dev libopenblas-dev
  python3-yaml python3-onnx libonnx-testdata libonnx-dev libprotobuf-dev protobuf-compiler libssl-dev
)
# Packages only the tests need (scripts/test.sh sets XPURT_TEST_DEPS=1): a headless browser that opens the HTML
# explain report (tests/python/test_report_html.py); Debian's PyTorch (CPU) and its headers, for the
# xpuruntime.pytorch tests and its native routing path, which is compiled against the PyTorch in use.
# pip builds the wheel (scripts/test_wheel.sh); clang and its sanitizer runtimes build the checking build and the
# libFuzzer harnesses (scripts/sanitize.sh). scikit-learn ships the digits data set the quantization accuracy tests
# train on (tests/python/test_quantization.py). Dask and Dask Distributed run xpuruntime.dask's tests on a local
# cluster of worker processes (tests/python/test_dask.py).
TEST_PACKAGES=(chromium python3-torch libtorch-dev python3-pip clang libclang-rt-14-dev python3-sklearn
  python3-dask python3-distributed)
if [ "${XPURT_TEST_DEPS:-0}" = 1 ]; then PACKAGES+=("${TEST_PACKAGES[@]}"); fi
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] installing Debian packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Debian's interpreter has numpy/pytest; the venv sees them through --system-site-packages.
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
PY=$ROOT/.venv/bin/python
# The package runs from the source tree: the .pth file puts src/python on the venv's path.
SITE=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$ROOT/src/python" > "$SITE/xpuruntime-dev.pth"
# The `xpuruntime` command (pyproject.toml's console script) for this source-tree install.
printf '#!%s\nimport sys\n\nfrom xpuruntime.cli import main\n\nsys.exit(main())\n' "$PY" > .venv/bin/xpuruntime
chmod +x .venv/bin/xpuruntime

# ONNX Runtime for the onnxruntime engine: the pinned npm package, sha256-checked, into .deps/ (once).
if ! command -v npm >/dev/null && [ -z "${XPURT_ORT_TARBALL:-}" ]; then
  echo "[setup] installing npm (to fetch ONNX Runtime)"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends npm
fi
./scripts/fetch_onnxruntime.sh

echo "[setup] configuring and building in $BUILD_DIR"
# shellcheck disable=SC2086
cmake -S . -B "$BUILD_DIR" -G Ninja -DPython3_EXECUTABLE=/usr/bin/python3 ${XPURT_CMAKE_ARGS:-} > "$BUILD_DIR.configure.log" 2>&1 \
  || { cat "$BUILD_DIR.configure.log"; exit 1; }
sed -n '/xpuruntime .* configuration/,/warnings as errors/p' "$BUILD_DIR.configure.log"
cmake --build "$BUILD_DIR" -j "$(nproc)"
echo "[setup] done: $($PY -c 'import xpuruntime as x; print("xpuruntime", x.__version__, "devices:", x.get_all_devices())')"
