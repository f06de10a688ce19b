#!/usr/bin/env bash
# One call's worth of work on the lent GPU (docs/DEVICE.md: a session has 30 minutes of device time, a call at most
# 10): builds what is asked, then runs what the variables name, each step bounded by what is left of LIMIT seconds,
# and prints a short summary; full logs go to $OUT (the device tool brings them back).
#
#   LIMIT=480 TARGETS=_core PYTESTS="tests/python/test_fused_elementwise.py" TINY=1 \
#   BENCH="mobilevit shufflenet_v2" BATCHES=1,16 AB="densenet:1,16::concat_fusion" \
#   BREAK="shufflenet_v2:16" scripts/gpu_session.sh
#
#   TARGETS   build targets (XPURT_GPU_TARGETS of scripts/gpu_check.sh; default _core)
#   PYTESTS   pytest arguments run first (PYTEST_K: their -k expression)
#   CTEST     a ctest -R expression of C++ tests to run next (their test executables in TARGETS)
#   TINY=1    the tiny suite on CUDA (scripts/model_suite.py run --tiny, dynamo float16 exports)
#   BENCH     models for benchmarks/model_suite_bench.py against torch.compile + CUDA graph (BATCHES, default 1,16)
#   SUITE     models (comma-separated; "all": every architecture) timed in one model_suite_bench.py process after
#             (--resume: the rows are kept in SUITE_ROWS, default /tmp/xpurt_suite_rows.jsonl, which outlives the call
#             on the warm machine, so a later SUITE call times only what is left and renders the whole table)
#             JOBS (default 8) processes exported and compiled them; with ORT ONNX Runtime's CUDA EP columns too
#             (XPURT_ORT_CUDA_PROVIDER set: scripts/ort_cuda_unstage.sh). The table and summary: suite.md, rendered
#             from the rows done when the time ran out; AUDIT (default 2) profiled native runs give each row its
#             roofline audit, summarised under the table (AUDIT=0: none)
#   SKIP      more columns SUITE leaves out (e.g. torch_eager)
#   PREPARE   the same models' exports and compiles only (JOBS processes), for a SUITE call on the warm machine;
#             SUITE's or PREPARE's preparation runs while xpuruntime builds (it needs no xpuruntime), and a model it
#             prepared before on this machine is skipped
#   AB        model:batches:kernels:disabled_passes ... : the native engine with and without a policy, same run (a
#             ':' inside a kernel value is written '+': conv2d=auto+BestPerformance)
#   ROOFLINE  case names for benchmarks/kernel_roofline_bench.py (comma-separated)
#   BREAK     model:batch,... for benchmarks/suite_kernel_breakdown.py (TOP kernels per side, default 30; EXPLAIN
#             op types whose kernel decisions to print)
#   TINY_EXPORT  architectures (comma-separated) whose tiny exports (both exporters and dtypes, the committed test
#             data) are made in parallel while xpuruntime builds, one process each, merged and packed into
#             $OUT/tiny.tgz (the device tool brings back a few dozen files at most); bring them in with `tar xzf
#             <files_at>/tiny.tgz -C /tmp && scripts/model_suite.py merge /tmp/tiny` (they need torch, which only the
#             device has)
#   INT4      arguments of benchmarks/bench_int4_gemm.py (issue 41's int4 table), e.g. "--m 1 4 --grids --shapes 8192x8192"
#   NCU       KERNEL_REGEX:COMMAND - Nsight Compute on the first launch of a kernel matching the regex in `python3
#             COMMAND` (speed of light, memory, occupancy, warp states, scheduler): e.g.
#             "int4_stream:benchmarks/bench_int4_gemm.py --m 1 --shapes 8192x8192 --iters 1 --inner 1"; ncu.txt
#   LLAMA     arguments of benchmarks/llama_generation_bench.py (issue 44's table), e.g. "--models 1b --batches 1,64
#             --weights float16,int4 --skip-continuous"; its exports stay in /tmp/llama_bench for later calls on the
#             warm machine (an 8B export can take a call of its own: "--models 8b --skip-torch --batches 1" first)
# Carry .third_party (scripts/gpu_check.sh --prepare) with the call; a call that carries a part of ONNX Runtime's
# CUDA EP (.ortgpuN, scripts/stage_ort_cuda.sh; two parts, which fit beside the tree once scripts/device_slim.sh
# moved the exports the device does not read) adds it to the machine's stage, and once all are there the EP is used
# and the ONNX Runtime core is in .deps/onnxruntime (XPURT_ORT_CUDA_PROVIDER; ORT=1 for SUITE's ONNX Runtime
# columns, TARGETS must then include ort_direct_bench).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s)
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
SP=$(python3 -c 'import site; print(site.getsitepackages()[0])')
export LD_LIBRARY_PATH=$SP/nvidia/cudnn/lib:$SP/nvidia/cu13/lib:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1
left() { echo $(( ${LIMIT:-480} - ($(date +%s) - T0) )); }
stamp() { echo "== $1 at $(( $(date +%s) - T0 )) s ($(date -u +%H:%M:%S) UTC)"; }
if compgen -G ".ortgpu*" > /dev/null; then  # ONNX Runtime's CUDA EP, staged over calls (scripts/stage_ort_cuda.sh)
  scripts/ort_cuda_unstage.sh | tail -2
  eval "$(scripts/ort_cuda_unstage.sh --export 2>/dev/null)" || true
fi
# The models a PREPARE or SUITE value names: "all" is every architecture of scripts/model_suite.py.
suite_models() {
  if [ "$1" = all ]; then
    python3 -c 'import sys; sys.path.insert(0, "scripts"); import model_suite as m
print(",".join(a.name for a in m.ARCHS))'
  else
    echo "$1"
  fi
}
rows_file=${SUITE_ROWS:-/tmp/xpurt_suite_rows.jsonl}
skip=ort,ort_graphs,torch_graph
[ -n "${ORT:-}" ] && skip=torch_graph
skip=$skip${SKIP:+,$SKIP}
# PREPARE's or SUITE's exports and Inductor's cache (JOBS processes), made while xpuruntime builds: the preparation
# needs no xpuruntime, and a fresh machine's build and the suite's exports are each minutes of the call.
prepare_pid=
if [ -n "${PREPARE:-}${SUITE:-}" ]; then
  # shellcheck disable=SC2046 # no --resume for PREPARE alone
  timeout "$(left)" python3 benchmarks/model_suite_bench.py --models "$(suite_models "${SUITE:-$PREPARE}")" \
    --batches "${BATCHES:-1,16}" --skip "$skip" --prepare-jobs "${JOBS:-8}" --prepare-only \
    $([ -n "${SUITE:-}" ] && echo --resume "$rows_file") > "$OUT/prepare.log" 2>&1 &
  prepare_pid=$!
fi
tiny_pid=
if [ -n "${TINY_EXPORT:-}" ]; then  # one process an architecture, each into its own folder, merged after
  mkdir -p "$OUT/tiny_parts"
  # shellcheck disable=SC2016 # $0 is expanded by the sh -c of each architecture: $OUT
  echo "${TINY_EXPORT//,/ }" | tr ' ' '\n' | timeout "$(left)" xargs -P 6 -I{} sh -c \
    'python3 scripts/model_suite.py export --tiny --out "$0/tiny_parts/{}" --only {} > "$0/tiny_parts/{}.log" 2>&1' \
    "$OUT" &
  tiny_pid=$!
fi
XPURT_GPU_TARGETS="${TARGETS:-_core}" OUT="$OUT" scripts/gpu_check.sh --build-only 2>&1 | tail -3
stamp "build done"
if [ -n "$prepare_pid" ]; then
  wait "$prepare_pid"
  tail -3 "$OUT/prepare.log"
  stamp "prepare done"
fi
if [ -n "$tiny_pid" ]; then
  wait "$tiny_pid"
  python3 scripts/model_suite.py merge "$OUT"/tiny_parts/*/ --into "$OUT/tiny" | tail -1
  grep -h "FAILED" "$OUT"/tiny_parts/*.log | cut -c1-200
  tar czf "$OUT/tiny.tgz" -C "$OUT" tiny && rm -rf "$OUT/tiny_parts" "$OUT/tiny"
  stamp "tiny exports done"
fi
export PYTHONPATH=$PWD/src/python
if [ -n "${PYTESTS:-}" ]; then
  # shellcheck disable=SC2086 # PYTESTS is a list of arguments
  timeout "$(left)" python3 -m pytest -q -p no:cacheprovider $PYTESTS ${PYTEST_K:+-k "$PYTEST_K"} \
    > "$OUT/pytest.log" 2>&1
  tail -3 "$OUT/pytest.log"
  stamp "pytest done"
fi
if [ -n "${CTEST:-}" ]; then
  # C++ tests whose names match the regular expression CTEST (their executables must be in TARGETS, e.g.
  # TARGETS="_core test_native_engine test_flash_attention" CTEST="Gpu|CacheAppends")
  timeout "$(left)" ctest --test-dir build-gpu --output-on-failure -R "$CTEST" > "$OUT/ctest.log" 2>&1
  grep -E "tests passed|tests failed|\*\*\*Failed|Not Run" "$OUT/ctest.log" | head -20
  stamp "ctest done"
fi
if [ "${TINY:-0}" = 1 ]; then
  timeout "$(left)" python3 scripts/model_suite.py run --tiny --device cuda:0 --exporters dynamo --dtypes float16 \
    > "$OUT/tiny.log" 2>&1
  grep -E "^FAIL|passed," "$OUT/tiny.log" | tail -8
  stamp "tiny suite done"
fi
if [ -n "${ROOFLINE:-}" ]; then
  timeout "$(left)" python3 benchmarks/kernel_roofline_bench.py --cases "$ROOFLINE" > "$OUT/roofline.log" 2>&1
  grep -E "^\| [a-z]" "$OUT/roofline.log" | cut -c1-220
  stamp "roofline done"
fi
if [ -n "${SUITE:-}" ]; then
  timeout "$(left)" python3 benchmarks/model_suite_bench.py --models "$(suite_models "$SUITE")" \
    --batches "${BATCHES:-1,16}" --skip "$skip" --iterations 30 --warmup 5 --audit "${AUDIT:-2}" \
    --resume "$rows_file" > "$OUT/suite.log" 2>&1
  touch "$rows_file"
  python3 benchmarks/model_suite_bench.py --render "$rows_file" > "$OUT/suite.md"
  cp "$rows_file" "$OUT/suite_rows.jsonl"
  grep -E "^- native" "$OUT/suite.md"
  stamp "suite done ($(grep -cE '^\| [a-z0-9_]+ \| [0-9]' "$OUT/suite.md") rows)"
fi
for m in ${BENCH:-}; do
  timeout "$(left)" python3 benchmarks/model_suite_bench.py --models "$m" --batches "${BATCHES:-1,16}" \
    --skip ort,ort_graphs,torch_graph --iterations 30 --warmup 5 --markdown "$OUT/bench_$m.md" \
    > "$OUT/bench_$m.log" 2>&1
  grep -E "^\| $m " "$OUT/bench_$m.md" 2>/dev/null || tail -3 "$OUT/bench_$m.log"
  stamp "bench $m done"
done
for spec in ${AB:-}; do
  IFS=: read -r m b k d <<< "$spec"
  k=${k//+/:}  # conv2d=auto+BestPerformance -> conv2d=auto:BestPerformance
  timeout "$(left)" python3 benchmarks/model_suite_bench.py --models "$m" --batches "$b" --native-kernels "$k" \
    --native-disabled-passes "$d" --skip ort,ort_graphs,torch_graph,torch_eager,compile_graph --iterations 30 \
    --warmup 5 --markdown "$OUT/ab_$m.md" > "$OUT/ab_$m.log" 2>&1
  grep -E "^\| $m " "$OUT/ab_$m.md" 2>/dev/null || tail -3 "$OUT/ab_$m.log"
  stamp "A/B $m done"
done
if [ -n "${BREAK:-}" ]; then
  timeout "$(left)" python3 benchmarks/suite_kernel_breakdown.py --specs "$BREAK" --top "${TOP:-30}" \
    --explain "${EXPLAIN:-}" \
    > "$OUT/breakdown.log" 2>&1
  grep -E "^== " "$OUT/breakdown.log"
  stamp "breakdown done (kernels in breakdown.log)"
fi
if [ -n "${LLAMA:-}" ]; then
  # shellcheck disable=SC2086 # LLAMA is a list of arguments
  timeout "$(left)" python3 benchmarks/llama_generation_bench.py $LLAMA --out "$OUT/llama.json" > "$OUT/llama.log" 2>&1
  grep -E "^\| |NOT met|: met" "$OUT/llama.log" | cut -c1-200
  stamp "llama done"
fi
if [ -n "${INT4:-}" ]; then
  # shellcheck disable=SC2086 # INT4 is a list of arguments
  timeout "$(left)" python3 benchmarks/bench_int4_gemm.py $INT4 --out "$OUT/int4.md" > "$OUT/int4.log" 2>&1
  grep -E "^\| [0-9]|^- M=" "$OUT/int4.md" | cut -c1-220
  stamp "int4 done"
fi
if [ -n "${NCU:-}" ]; then
  ncu=$(command -v ncu || find /usr/local /opt/nvidia -name ncu -type f -perm -u+x 2>/dev/null | head -1 || true)
  if [ -z "$ncu" ]; then
    echo "NCU: no ncu on this machine"
  else
    # shellcheck disable=SC2086 # the command after the regex is a list of arguments
    timeout "$(left)" "$ncu" --target-processes all -k "regex:${NCU%%:*}" -c 1 --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section SchedulerStats \
      --section LaunchStats python3 ${NCU#*:} > "$OUT/ncu.txt" 2>&1
    grep -E "Duration|Throughput|Achieved Occupancy|Registers Per|Issued Warp|No Eligible|Warp Cycles Per Issued" \
      "$OUT/ncu.txt" | head -30
  fi
  stamp "ncu done"
fi
stamp "all done"
