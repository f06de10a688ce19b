#!/usr/bin/env bash
# Runs on the GPU machine: collects the parts of ONNX Runtime's CUDA execution provider that
# scripts/stage_ort_cuda.sh split into .ortgpu1/ .ortgpu2/ .ortgpu3/ (carried one per call), and once every part
# is there rebuilds libonnxruntime_providers_cuda.so, checks its sha256 and prints the line that points the
# onnxruntime engine at it:
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

if [[ -f "${library}" && "$(sha256sum "${library}" | cut -d' ' -f1)" == "${library_sha}" ]]; then
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
mkdir -p "${dest}"
cat "${stage}"/part* | xz -d > "${library}.partial"
actual_library="$(sha256sum "${library}.partial" | cut -d' ' -f1)"
[[ "${actual_library}" == "${library_sha}" ]] || die "the rebuilt library's sha256 is ${actual_library}, expected \
${library_sha}"
mv "${library}.partial" "${library}"
say "rebuilt ${library} ($(du -m "${library}" | cut -f1) MB, sha256 ok)"
echo "export XPURT_ORT_CUDA_PROVIDER=${library}"
