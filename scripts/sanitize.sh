#!/usr/bin/env bash
# The checking build (docs/reliability.md): clang with AddressSanitizer + UndefinedBehaviorSanitizer, CPU only,
# the core, the C++ tests and the libFuzzer harnesses of tests/fuzz. Runs the C++ tests under the sanitizers, then
# each harness for FUZZ_SECONDS (default 60) from its committed corpus. A finding fails the script, leaving the
# crashing input in $XPURT_FUZZ_OUT (default build-asan/fuzz-findings).
#
#   scripts/sanitize.sh            # build, tests, fuzzers (CI runs this)
#   FUZZ_SECONDS=3600 scripts/sanitize.sh --fuzz-only   # a long campaign
#   XPURT_FUZZ_ENGINE=onnxruntime build-asan/tests/fuzz/fuzz_model_structure DIR tests/fuzz/corpus/model
#                                                       # structure-aware, one engine (the script runs both)
#   XPURT_SANITIZE=thread scripts/sanitize.sh --tests-only   # ThreadSanitizer over the C++ tests (build-tsan) and
#                                                            # the Python tests that run from several threads
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-all}
SANITIZE=${XPURT_SANITIZE:-address,undefined}
if [ "$SANITIZE" = "thread" ]; then BUILD=${XPURT_SANITIZE_BUILD_DIR:-build-tsan}; else BUILD=${XPURT_SANITIZE_BUILD_DIR:-build-asan}; fi
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
# FUZZ_RUNS=N: N inputs per harness from seed 1 instead of FUZZ_SECONDS (the same inputs on every machine: CI).
FUZZ_RUNS=${FUZZ_RUNS:-}
# The structure-aware model harness (fuzz_model_structure) runs once per engine; its inputs are whole models run
# under ASan, so it gets its own counts with FUZZ_RUNS: FUZZ_STRUCTURE_RUNS for the native engine (default 10000,
# about 30 s on 2 cores) and FUZZ_STRUCTURE_ORT_RUNS for the onnxruntime engine (default 400: ONNX Runtime creates
# a session in about 0.2 s under ASan's interceptors; scripts/fuzz_structure.py fuzzes it at volume in scripts/test.sh).
FUZZ_STRUCTURE_RUNS=${FUZZ_STRUCTURE_RUNS:-10000}
FUZZ_STRUCTURE_ORT_RUNS=${FUZZ_STRUCTURE_ORT_RUNS:-400}
# Real exports it starts from besides tests/fuzz/corpus/model: the smallest of models/suite/tiny (a CNN, a ViT
# block, BERT-like and GPT-2-like encoders), small enough that a run under ASan stays well under a second.
STRUCTURE_SEEDS="regnet.torchscript.float16 densenet.torchscript.float16 whisper_encoder.torchscript.float16
  vit.torchscript.float16 clip_vision.torchscript.float16 t5_encoder.torchscript.float16 gpt2.torchscript.float16"
OUT=${XPURT_FUZZ_OUT:-$BUILD/fuzz-findings}
for p in clang libclang-rt-14-dev libtsan2; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || MISSING="${MISSING:-} $p"
done
if [ -n "${MISSING:-}" ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $MISSING
fi
FUZZERS=ON
PYTHON_ARGS=(-DXPURT_BUILD_PYTHON=OFF)
if [ "$SANITIZE" = "thread" ]; then
  FUZZERS=OFF  # libFuzzer runs with ASan/UBSan
  # The Python module too, placed in the build folder (the tree's own module stays the normal build's).
  PYTHON_ARGS=(-DXPURT_BUILD_PYTHON=ON -DPython3_EXECUTABLE=/usr/bin/python3
               -DXPURT_PYTHON_PACKAGE_DIR="$PWD/$BUILD/python/xpuruntime")
fi
echo "[sanitize] configuring $BUILD (clang, -fsanitize=$SANITIZE, CPU only)"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS="-O1 -g" -DXPURT_WITH_CUDA=OFF "${PYTHON_ARGS[@]}" -DXPURT_BUILD_BENCHMARKS=OFF \
  -DXPURT_SANITIZE="$SANITIZE" -DXPURT_BUILD_FUZZERS=$FUZZERS > "$BUILD.configure.log" 2>&1 \
  || { tail -30 "$BUILD.configure.log"; exit 1; }
cmake --build "$BUILD" -j "$(nproc)" > "$BUILD.build.log" 2>&1 || { grep -B2 -A10 "error" "$BUILD.build.log" | head -60; exit 1; }
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:allocator_may_return_null=1}
# ONNX Runtime's prebuilt library is not instrumented and keeps a few bytes until exit (tests/sanitizers.supp).
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/sanitizers.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# ThreadSanitizer sees OpenMP's fork/join only through LLVM's Archer tool (libarcher, annotations for libomp); the
# threads of the uninstrumented OpenBLAS are left out (ignore_noninstrumented_modules). Without them every parallel
# CPU kernel reports the main thread reading what a worker wrote before the join.
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1}
if [ "$SANITIZE" = "thread" ] && [ -z "${OMP_TOOL_LIBRARIES:-}" ]; then
  archer=$(ls /usr/lib/llvm-*/lib/libarcher.so 2>/dev/null | head -1 || true)
  if [ -n "$archer" ]; then export OMP_TOOL_LIBRARIES="$archer"; else echo "[sanitize] libarcher not found"; fi
fi
status=0
if [ "$MODE" != "--fuzz-only" ]; then
  echo "[sanitize] C++ tests under -fsanitize=$SANITIZE"
  # cmake_consumer installs and builds a consumer without the sanitizer runtime: it is covered by the normal build.
  ctest --test-dir "$BUILD" -j "$(nproc)" -E cmake_consumer --output-on-failure > "$BUILD.ctest.log" 2>&1 || status=1
  grep -E "tests passed|tests failed|\*\*\*Failed|ERROR: (Address|Undefined|Thread)Sanitizer|runtime error" \
    "$BUILD.ctest.log" | head -30
fi
if [ "$MODE" != "--fuzz-only" ] && [ "$SANITIZE" = "thread" ]; then
  # Python-driven concurrency: the instrumented module under the uninstrumented interpreter, with a shared
  # ThreadSanitizer runtime preloaded (its interceptors see the GIL's mutexes, so the GIL's ordering is known).
  # clang 14's libclang_rt.tsan-x86_64.so crashes Debian's python3 at start-up (even `python3 -c 1`); GCC's
  # libtsan.so.2 (the same runtime, same instrumentation ABI) runs it.
  echo "[sanitize] Python tests from several threads under -fsanitize=thread"
  tar -C src/python --exclude='*.so' --exclude=__pycache__ -cf - xpuruntime | tar -C "$BUILD/python" -xf -
  runtime=$(ls /usr/lib/x86_64-linux-gnu/libtsan.so.2 2>/dev/null || clang -print-file-name=libclang_rt.tsan-x86_64.so)
  if ! LD_PRELOAD="$runtime" PYTHONPATH="$PWD/$BUILD/python" /usr/bin/python3 -m pytest -q \
      -p no:cacheprovider tests/python/test_inference_session.py tests/python/test_native_engine.py \
      tests/python/test_memory.py tests/python/test_profiler.py tests/python/test_model_safety.py \
      -k "thread or memory_limit_caps_what" > "$BUILD.pytest.log" 2>&1; then
    status=1
  fi
  grep -E "passed|failed|WARNING: ThreadSanitizer|SUMMARY: ThreadSanitizer" "$BUILD.pytest.log" | head -20
  if ! LD_PRELOAD="$runtime" PYTHONPATH="$PWD/$BUILD/python" /usr/bin/python3 benchmarks/soak.py --runs 2000 \
      --cycles 20 --max-growth-mib 4096 > "$BUILD.soak.log" 2>&1; then
    status=1
  fi
  grep -E "WARNING: ThreadSanitizer|SUMMARY: ThreadSanitizer|mismatch|phase|threads|sessions|cycles" \
    "$BUILD.soak.log" | head -20
fi
if [ "$MODE" != "--tests-only" ] && [ "$FUZZERS" = ON ]; then
  mkdir -p "$OUT"
  # The real exports the structural harness starts from, linked rather than copied (models/suite/tiny is committed).
  seeds="$BUILD/fuzz-seeds/model_structure"
  rm -rf "$seeds" && mkdir -p "$seeds"
  for m in $STRUCTURE_SEEDS; do
    [ -f "models/suite/tiny/$m.onnx" ] && ln -s "$PWD/models/suite/tiny/$m.onnx" "$seeds/$m.onnx"
  done
  # fuzz_model_structure twice: the native engine, then the onnxruntime engine (when this build has it: its
  # sessions are typed UnsupportedOperationErrors otherwise, and the run is skipped).
  ort_engine=0; [ -f .deps/onnxruntime/include/onnxruntime_cxx_api.h ] && ort_engine=1
  for h in model policy autotune model_structure:native model_structure:onnxruntime; do
    engine=${h#*:}; h=${h%%:*}; name=$h
    [ "$engine" != "$h" ] && name="${h}_$engine" || engine=native
    if [ "$name" = model_structure_onnxruntime ] && [ $ort_engine = 0 ]; then
      echo "[sanitize] fuzz_model_structure on onnxruntime: skipped (no .deps/onnxruntime: scripts/setup.sh)"
      continue
    fi
    corpus="$BUILD/fuzz-corpus/$name"
    mkdir -p "$corpus"
    dict=""; [ "$h" = model ] && dict="-dict=tests/fuzz/onnx.dict"
    seed_dirs=("tests/fuzz/corpus/$h")
    # Structural mutants start from whole models: the model corpus and the real exports.
    [ "$h" = model_structure ] && seed_dirs=("tests/fuzz/corpus/model" "$seeds")
    runs=$FUZZ_RUNS; [ "$name" = model_structure_native ] && runs=$FUZZ_STRUCTURE_RUNS
    [ "$name" = model_structure_onnxruntime ] && runs=$FUZZ_STRUCTURE_ORT_RUNS
    if [ -n "$FUZZ_RUNS" ]; then
      budget=(-runs="$runs" -seed=1)
      rm -rf "$corpus" && mkdir -p "$corpus"  # the same start on every machine
      echo "[sanitize] fuzz_$name: $runs inputs from seed 1"
    else
      budget=(-max_total_time="$FUZZ_SECONDS")
      echo "[sanitize] fuzz_$name for ${FUZZ_SECONDS} s"
    fi
    # The corpus in the build folder grows across runs; the committed seeds stay as they are. A structural input
    # is a whole model: -max_len lets mutants grow past the largest seed, -timeout bounds one model's run.
    extra=(); [ "$h" = model_structure ] && extra=(-max_len=400000)
    start=$SECONDS
    if ! XPURT_FUZZ_ENGINE=$engine "$BUILD/tests/fuzz/fuzz_$h" "${budget[@]}" -timeout=25 -rss_limit_mb=2560 \
        -print_final_stats=1 -artifact_prefix="$OUT/${name}-" "${extra[@]}" $dict "$corpus" "${seed_dirs[@]}" \
        > "$BUILD/fuzz_$name.log" 2>&1; then
      status=1
      grep -E "ERROR|SUMMARY|Test unit written|==[0-9]+==" "$BUILD/fuzz_$name.log" | head -20
    fi
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb|^#[0-9]+.*DONE" "$BUILD/fuzz_$name.log" | tail -3
    echo "[sanitize] fuzz_$name: $((SECONDS - start)) s"
  done
fi
[ $status -eq 0 ] && echo "[sanitize] ok" || echo "[sanitize] FINDINGS (logs in $BUILD.*.log, inputs in $OUT)"
exit $status
