#!/usr/bin/env bash
# The wheel as a new user gets it (docs/install.md): `pip wheel .` builds it through CMake (reusing the build folder
# of scripts/setup.sh when XPURT_BUILD_DIR names one), a fresh virtual environment installs it offline, and from
# another folder: the quickstart runs, the `xpuruntime` command answers, ONNX Runtime's API works through
# xpuruntime.onnxruntime, and a C++ consumer builds with find_package(xpuruntime) against the wheel's CMake package.
# Also: the build leaves nothing in the source tree, and a wheel without ONNX Runtime is announced by the build's
# warning while the quickstart claims no comparison with ONNX Runtime (setup.py, Note [A wheel without ONNX Runtime]).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
WORK=$(mktemp -d /tmp/xpurt-wheel.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
# What the build could leave in the tree: untracked or ignored paths outside the sources (other work in src/cpp, tests
# and docs is not the build's).
tree_outputs() { git -C "$ROOT" status --porcelain --ignored --untracked-files=normal | grep -E '^(\?\?|!!) ' \
  | grep -Ev ' (src/cpp|tests|docs)/' | sort || true; }
tree_outputs > "$WORK/tree.before"
echo "[wheel] building the wheel"
/usr/bin/python3 -m pip wheel "$ROOT" --no-build-isolation --no-deps -v -w "$WORK/dist" > "$WORK/wheel.log" 2>&1 \
  || { tail -40 "$WORK/wheel.log"; exit 1; }
WHEEL=$(ls "$WORK"/dist/xpuruntime-*.whl)
echo "[wheel] $(basename "$WHEEL"): $(du -h "$WHEEL" | cut -f1)"
tree_outputs > "$WORK/tree.after"
comm -13 "$WORK/tree.before" "$WORK/tree.after" > "$WORK/tree.new"
if [ -s "$WORK/tree.new" ]; then
  echo "[wheel] FAIL: the build left files in the source tree:"; cat "$WORK/tree.new"; exit 1
fi
if /usr/bin/python3 -c "import sys, zipfile; sys.exit(0 if 'xpuruntime/lib/libonnxruntime.so.1' in \
zipfile.ZipFile(sys.argv[1]).namelist() else 1)" "$WHEEL"; then
  HAS_ORT=1
  ! grep -q "does NOT carry ONNX Runtime" "$WORK/wheel.log" || { echo "[wheel] FAIL: warned about ONNX Runtime it has"; exit 1; }
else
  HAS_ORT=0
  grep -q "WARNING (at the end of the build): this wheel does NOT carry ONNX Runtime" "$WORK/wheel.log" \
    || { echo "[wheel] FAIL: the wheel has no ONNX Runtime and the build did not say so"; exit 1; }
  echo "[wheel] the wheel has no ONNX Runtime, and the build warned about it"
fi
# A fresh venv: Debian's numpy (and onnx) through --system-site-packages, nothing of the source tree.
/usr/bin/python3 -m venv --system-site-packages "$WORK/venv"
"$WORK/venv/bin/python" -m pip install --no-index --no-deps "$WHEEL" > "$WORK/install.log" 2>&1 \
  || { tail -20 "$WORK/install.log"; exit 1; }
mkdir -p "$WORK/elsewhere" && cp -r examples "$WORK/elsewhere/"
cd "$WORK/elsewhere"
PY="$WORK/venv/bin/python"
$PY -c "import xpuruntime, sys; p = xpuruntime.__file__; print('[wheel] imported', p); \
sys.exit(0 if p.startswith('$WORK/venv') else 'xpuruntime came from ' + p)"
$PY examples/quickstart.py > quickstart.log 2>&1 || { tail -30 quickstart.log; exit 1; }
grep -q "probs" quickstart.log
if [ "$HAS_ORT" = 1 ]; then
  grep -q "native engine agrees with onnxruntime: True" quickstart.log || { cat quickstart.log; exit 1; }
else  # nothing claims a comparison it did not run
  ! grep -q "agrees with onnxruntime" quickstart.log && grep -q "onnxruntime was not available" quickstart.log \
    || { cat quickstart.log; exit 1; }
fi
"$WORK/venv/bin/xpuruntime" --help > /dev/null
[ "$HAS_ORT" = 1 ] && $PY - <<'PYEOF'
import numpy as np
import xpuruntime.onnxruntime as ort
sess = ort.InferenceSession("examples/models/tiny_classifier.onnx", providers=["CPUExecutionProvider"])
probs = sess.run(None, {sess.get_inputs()[0].name: np.ones((2, 8), np.float32)})[0]
assert probs.shape == (2, 4) and np.allclose(probs.sum(axis=1), 1, atol=1e-5), probs
print("[wheel] xpuruntime.onnxruntime runs:", sess.get_providers())
PYEOF
# xpuruntime[torch]: the PyTorch extension's source travels in the wheel (compiled on first use).
$PY -c "from pathlib import Path; import xpuruntime; \
assert (Path(xpuruntime.__file__).parent / 'pytorch' / 'routing_native.cpp').exists()"
PREFIX=$($PY -c "import xpuruntime; print(xpuruntime.cmake_prefix_path())")
cmake -S "$ROOT/tests/cmake_consumer" -B "$WORK/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$PREFIX" \
  -DXPURT_DLPACK_INCLUDE_DIR=/usr/include > "$WORK/consumer.log" 2>&1 && cmake --build "$WORK/consumer" \
  >> "$WORK/consumer.log" 2>&1 && "$WORK/consumer/consumer" >> "$WORK/consumer.log" 2>&1 \
  || { tail -30 "$WORK/consumer.log"; exit 1; }
echo "[wheel] ok: installed from the wheel, quickstart, command, onnxruntime API and find_package(xpuruntime) work"
