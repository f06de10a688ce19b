#!/usr/bin/env bash
# Runs on the GPU machine: collects the parts of the bundle scripts/stage_ort_cuda.sh split into .ortgpu1/
# .ortgpu2/ ... (carried one per call: ONNX Runtime's CUDA execution provider plugin and the ONNX Runtime core), and
# once every part is there unpacks it, checks both libraries' sha256, puts the core in .deps/onnxruntime (where
# CMake finds it for ort_direct_bench) when it is not there already, and prints the line that points the onnxruntime
# engine at the plugin:
#   export XPURT_ORT_CUDA_PROVIDER=/tmp/ort/libonnxruntime_providers_cuda.so
#
#   scripts/ort_cuda_unstage.sh [--export] [--dest DIR]
#
# Call it in every staging call: parts found in the working tree are copied to $XPURT_ORT_STAGE (default
# /tmp/ortstage), which outlives the call while the machine stays warm. Until all parts are there it says which
# ones are missing (exit code 0, so a staging call succeeds; 3 with --export, whose output is eval'ed). A later call
# with the library already rebuilt only prints the export line. --export prints nothing but that line (for
# `eval "$(scripts/ort_cuda_unstage.sh --export)"`); DIR defaults to /tmp/ort. The library also needs the CUDA 13,
# cuBLAS and cuDNN libraries on LD_LIBRARY_PATH ($SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib, docs/DEVICE.md).
set -euo pipefail

export_only=0
dest=/tmp/ort
while (( $# )); do
  case "$1" in
    --export) export_only=1 ;;
    --dest) dest="$2"; shift ;;
    *) echo "ort_cuda_unstage.sh: unknown argument $1 (use --export, --dest DIR)" >&2; exit 2 ;;
  esac
  shift
done

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
stage="${XPURT_ORT_STAGE:-/tmp/ortstage}"
library="${dest}/libonnxruntime_providers_cuda.so"

say() { if (( ! export_only )); then echo "$@"; fi; }
die() { echo "ort_cuda_unstage.sh: error: $*" >&2; exit 1; }

mkdir -p "${stage}"
for folder in "${repo_root}"/.ortgpu*; do
  [[ -d "${folder}" ]] || continue
  cp "${folder}"/MANIFEST "${stage}/MANIFEST"
  for part in "${folder}"/part*; do
    [[ -f "${part}" ]] || continue
    cp "${part}" "${stage}/"
    say "staged $(basename "${part}") from $(basename "${folder}")"
  done
done

[[ -f "${stage}/MANIFEST" ]] || die "no MANIFEST: carry .ortgpu1 (made by scripts/stage_ort_cuda.sh) first"
parts="$(awk '$1 == "parts" {print $2}' "${stage}/MANIFEST")"
library_sha="$(awk '$1 == "library_sha256" {print $2}' "${stage}/MANIFEST")"
stream_sha="$(awk '$1 == "stream_sha256" {print $2}' "${stage}/MANIFEST")"
core_sha="$(awk '$1 == "core_sha256" {print $2}' "${stage}/MANIFEST")"
[[ -n "${core_sha}" ]] || die "the MANIFEST predates the bundle of plugin and core: run scripts/stage_ort_cuda.sh again"
core="${repo_root}/.deps/onnxruntime"

# The core the bundle carried, in .deps/onnxruntime unless a copy with the same library is there.
restore_core() {
  if [[ ! -f "${core}/lib/libonnxruntime.so" || \
        "$(sha256sum "${core}/lib/libonnxruntime.so" | cut -d' ' -f1)" != "${core_sha}" ]]; then
    rm -rf "${core}" && mkdir -p "$(dirname "${core}")" && cp -a "${dest}/onnxruntime" "${core}"
    say "restored the ONNX Runtime core into .deps/onnxruntime"
  fi
}

if [[ -f "${library}" && "$(sha256sum "${library}" | cut -d' ' -f1)" == "${library_sha}" ]]; then
  restore_core
  echo "export XPURT_ORT_CUDA_PROVIDER=${library}"
  exit 0
fi

missing=""
for (( i = 0; i < parts; ++i )); do
  name="$(printf 'part%02d' "${i}")"
  [[ -f "${stage}/${name}" ]] || missing+=" ${name} (in .ortgpu$((i + 1)))"
done
if [[ -n "${missing}" ]]; then
  say "waiting for${missing}; carry the next folder and run this script again"
  exit $(( export_only ? 3 : 0 ))
fi

actual_stream="$(cat "${stage}"/part* | sha256sum | cut -d' ' -f1)"
[[ "${actual_stream}" == "${stream_sha}" ]] || die "the staged parts do not match the MANIFEST (sha256 \
${actual_stream}, expected ${stream_sha}); rm -rf ${stage} and stage again"
rm -rf "${dest}.partial" && mkdir -p "${dest}.partial"
cat "${stage}"/part* | xz -d | tar -x -C "${dest}.partial" || die "could not unpack the staged bundle"
unpacked="${dest}.partial/ort/libonnxruntime_providers_cuda.so"
actual_library="$(sha256sum "${unpacked}" | cut -d' ' -f1)"
[[ "${actual_library}" == "${library_sha}" ]] || die "the rebuilt plugin's sha256 is ${actual_library}, expected \
${library_sha}"
actual_core="$(sha256sum "${dest}.partial/onnxruntime/lib/libonnxruntime.so" | cut -d' ' -f1)"
[[ "${actual_core}" == "${core_sha}" ]] || die "the unpacked core's sha256 is ${actual_core}, expected ${core_sha}"
mkdir -p "${dest}"
rm -rf "${dest}/onnxruntime" && mv "${dest}.partial/onnxruntime" "${dest}/onnxruntime"
mv "${unpacked}" "${library}" && rm -rf "${dest}.partial"
say "rebuilt ${library} ($(du -m "${library}" | cut -f1) MB, sha256 ok)"
restore_core
echo "export XPURT_ORT_CUDA_PROVIDER=${library}"
