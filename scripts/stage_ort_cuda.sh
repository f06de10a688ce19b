#!/usr/bin/env bash
# Stages ONNX Runtime's CUDA execution provider plugin (libonnxruntime_providers_cuda.so, ORT 1.29.0, CUDA 13) for
# the lent GPU machine, which has no network and takes at most 64 MiB per call (docs/DEVICE.md, "ONNX Runtime
# with its CUDA execution provider"):
#   1. fetches com.github.asus4.onnxruntime.linux-x64-gpu@0.4.9 with `npm pack` and checks its pinned sha256;
#   2. extracts Plugins/Linux/x64/libonnxruntime_providers_cuda.so (about 230 MB);
#   3. xz-compresses it and splits the stream into 24 MiB parts (XPURT_ORT_PART_MIB), one per git-ignored folder
#      .ortgpu1/ .ortgpu2/ ..., each with a MANIFEST (number of parts, sha256 of the library and of the compressed stream).
# On the device, carry the folders one call each and run scripts/ort_cuda_unstage.sh in every call: it collects
# the parts and, once all are there, rebuilds the library and prints the XPURT_ORT_CUDA_PROVIDER export line.
#
#   scripts/stage_ort_cuda.sh            # a second run with the same package does nothing
#
# Environment:
#   XPURT_ORT_GPU_TARBALL  a local copy of com.github.asus4.onnxruntime.linux-x64-gpu-0.4.9.tgz (skips npm pack)
set -euo pipefail

readonly NPM_PACKAGE="com.github.asus4.onnxruntime.linux-x64-gpu@0.4.9"
readonly TARBALL_NAME="com.github.asus4.onnxruntime.linux-x64-gpu-0.4.9.tgz"
# sha256 of the tarball `npm pack` wrote on 2026-11-21 (179145956 bytes).
readonly TARBALL_SHA256="2b459e0c17f340c92970c10ed86de4f37a3009f93c14053e6ad4334cbb6be412"
readonly LIBRARY_IN_TARBALL="package/Plugins/Linux/x64/libonnxruntime_providers_cuda.so"
# 24 MiB parts: a call carries the working tree too (about 37 MB with the committed tiny suite) within 64 MiB.
readonly PART_MIB="${XPURT_ORT_PART_MIB:-24}"
readonly PART_BYTES=$((PART_MIB * 1024 * 1024))

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${repo_root}"

die() { echo "stage_ort_cuda.sh: error: $*" >&2; exit 1; }

for tool in xz split sha256sum tar; do
  command -v "${tool}" >/dev/null || die "${tool} is not installed"
done

if [[ -f .ortgpu1/MANIFEST ]] && grep -qx "package ${NPM_PACKAGE}" .ortgpu1/MANIFEST && \
   grep -q "^parts " .ortgpu1/MANIFEST && (( $(du -sm .ortgpu1 | cut -f1) <= PART_MIB + 1 )); then
  echo "${NPM_PACKAGE} already staged in .ortgpu1.. ($(grep '^parts ' .ortgpu1/MANIFEST))"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT

# shellcheck source=lib/npm_tarball.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/npm_tarball.sh"
tarball="$(npm_tarball "${NPM_PACKAGE}" "${TARBALL_NAME}" "${TARBALL_SHA256}" XPURT_ORT_GPU_TARBALL "about 180 MB" "${work}")" || exit 1

echo "Extracting libonnxruntime_providers_cuda.so ..."
tar -xzf "${tarball}" -C "${work}" "${LIBRARY_IN_TARBALL}" || die "the tarball lacks ${LIBRARY_IN_TARBALL}"
library="${work}/${LIBRARY_IN_TARBALL}"
library_sha="$(sha256sum "${library}" | cut -d' ' -f1)"

echo "Compressing ($(du -m "${library}" | cut -f1) MB; xz -6, a few minutes) ..."
mkdir -p "${work}/parts"
xz -T2 -6 -c "${library}" | split -b "${PART_BYTES}" -d - "${work}/parts/part"
mapfile -t parts < <(cd "${work}/parts" && ls part*)
FOLDERS=()
for i in "${!parts[@]}"; do FOLDERS+=(".ortgpu$((i + 1))"); done
stream_sha="$(cat "${work}/parts"/part* | sha256sum | cut -d' ' -f1)"

rm -rf .ortgpu*
for i in "${!FOLDERS[@]}"; do
  folder="${FOLDERS[$i]}"
  mkdir -p "${folder}"
  if (( i < ${#parts[@]} )); then cp "${work}/parts/${parts[$i]}" "${folder}/"; fi
  {
    echo "package ${NPM_PACKAGE}"
    echo "parts ${#parts[@]}"
    echo "library_sha256 ${library_sha}"
    echo "stream_sha256 ${stream_sha}"
  } > "${folder}/MANIFEST"
done

for folder in "${FOLDERS[@]}"; do
  echo "  ${folder}/: $(ls "${folder}" | tr '\n' ' ')($(du -sm "${folder}" | cut -f1) MB)"
done
cat <<EOF
Staged. On the device, one call per folder, back to back while the machine stays warm (a call carries at most
64 MiB, so the ONNX Runtime core, .deps/onnxruntime (28 MB), travels in a call of its own, e.g. the build call):
  call k: carry [".ortgpuk"]   command: scripts/ort_cuda_unstage.sh     (k = 1 .. ${#FOLDERS[@]})
  then:   carry [".deps/onnxruntime", ...]   command: eval "\$(scripts/ort_cuda_unstage.sh --export)" && ...
EOF
