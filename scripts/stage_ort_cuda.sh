#!/usr/bin/env bash
# Stages ONNX Runtime's CUDA execution provider plugin (libonnxruntime_providers_cuda.so, ORT 1.29.0, CUDA 13) and
# the ONNX Runtime core it plugs into (.deps/onnxruntime) for the lent GPU machine, which has no network and takes
# at most 64 MiB per call, working tree included (docs/engines.md, "ONNX Runtime's CUDA EP on the lent GPU"):
#   1. fetches com.github.asus4.onnxruntime.linux-x64-gpu@0.4.9 with `npm pack` and checks its pinned sha256;
#   2. extracts Plugins/Linux/x64/libonnxruntime_providers_cuda.so (230 MB) and zeroes the GPU code of every
#      architecture but XPURT_ORT_KEEP_ARCH (scripts/fatbin_keep_arch.py; 166 MB of it is SASS for six
#      architectures, of which an H100/H200 loads sm_90's);
#   3. bundles it with .deps/onnxruntime (scripts/fetch_onnxruntime.sh fills that first when missing), xz-compresses
#      the bundle (about 44 MiB) and splits it into XPURT_ORT_PART_MIB parts, one per git-ignored folder .ortgpu1/
#      .ortgpu2/ ..., each with a MANIFEST (parts, the sha256 of both libraries and of the compressed stream).
# On the device, carry one folder per call and run scripts/ort_cuda_unstage.sh in every call (scripts/gpu_session.sh
# does): it collects the parts and, once all are there, rebuilds the plugin, restores .deps/onnxruntime (for the
# ort_direct_bench target) and prints the XPURT_ORT_CUDA_PROVIDER export line. scripts/device_slim.sh makes room in
# the working tree for the parts.
#
#   scripts/stage_ort_cuda.sh            # a second run with the same package and settings does nothing
#
# Environment:
#   XPURT_ORT_GPU_TARBALL  a local copy of com.github.asus4.onnxruntime.linux-x64-gpu-0.4.9.tgz (skips npm pack)
#   XPURT_ORT_KEEP_ARCH    the SM architectures whose GPU code stays (default 90; "all" keeps the library as it is)
#   XPURT_ORT_PART_MIB     the size of a part (default 22: two calls with the working tree slimmed)
set -euo pipefail

readonly NPM_PACKAGE="com.github.asus4.onnxruntime.linux-x64-gpu@0.4.9"
readonly TARBALL_NAME="com.github.asus4.onnxruntime.linux-x64-gpu-0.4.9.tgz"
# sha256 of the tarball `npm pack` wrote on 2026-11-21 (179145956 bytes).
readonly TARBALL_SHA256="2b459e0c17f340c92970c10ed86de4f37a3009f93c14053e6ad4334cbb6be412"
readonly LIBRARY_IN_TARBALL="package/Plugins/Linux/x64/libonnxruntime_providers_cuda.so"
readonly PART_MIB="${XPURT_ORT_PART_MIB:-22}"
readonly KEEP_ARCH="${XPURT_ORT_KEEP_ARCH:-90}"
readonly PART_BYTES=$((PART_MIB * 1024 * 1024))

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${repo_root}"

die() { echo "stage_ort_cuda.sh: error: $*" >&2; exit 1; }

for tool in xz split sha256sum tar; do
  command -v "${tool}" >/dev/null || die "${tool} is not installed"
done

if [[ -f .ortgpu1/MANIFEST ]] && grep -qx "package ${NPM_PACKAGE}" .ortgpu1/MANIFEST && \
   grep -qx "keep_arch ${KEEP_ARCH}" .ortgpu1/MANIFEST && grep -q "^core_sha256 " .ortgpu1/MANIFEST && \
   (( $(du -sm .ortgpu1 | cut -f1) <= PART_MIB + 1 )); then
  echo "${NPM_PACKAGE} already staged in .ortgpu1.. ($(grep '^parts ' .ortgpu1/MANIFEST))"
  exit 0
fi

if [[ ! -f .deps/onnxruntime/lib/libonnxruntime.so ]]; then
  scripts/fetch_onnxruntime.sh || die "could not fetch the ONNX Runtime core into .deps/onnxruntime"
fi

work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT

# shellcheck source=lib/npm_tarball.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/npm_tarball.sh"
tarball="$(npm_tarball "${NPM_PACKAGE}" "${TARBALL_NAME}" "${TARBALL_SHA256}" XPURT_ORT_GPU_TARBALL "about 180 MB" "${work}")" || exit 1

echo "Extracting libonnxruntime_providers_cuda.so ..."
tar -xzf "${tarball}" -C "${work}" "${LIBRARY_IN_TARBALL}" || die "the tarball lacks ${LIBRARY_IN_TARBALL}"
mkdir -p "${work}/bundle/ort"
library="${work}/bundle/ort/libonnxruntime_providers_cuda.so"
if [[ "${KEEP_ARCH}" == all ]]; then
  mv "${work}/${LIBRARY_IN_TARBALL}" "${library}"
else
  python3 scripts/fatbin_keep_arch.py "${work}/${LIBRARY_IN_TARBALL}" "${library}" --keep "${KEEP_ARCH}" \
    || die "could not strip the plugin's GPU code to sm_${KEEP_ARCH}"
  rm -f "${work}/${LIBRARY_IN_TARBALL}"
fi
library_sha="$(sha256sum "${library}" | cut -d' ' -f1)"
cp -a .deps/onnxruntime "${work}/bundle/onnxruntime"
core_sha="$(sha256sum "${work}/bundle/onnxruntime/lib/libonnxruntime.so" | cut -d' ' -f1)"

echo "Compressing the plugin and the core ($(du -sm "${work}/bundle" | cut -f1) MB; xz -9e, about a minute) ..."
mkdir -p "${work}/parts"
tar -C "${work}/bundle" -cf - ort onnxruntime | xz -T2 -9e -c | split -b "${PART_BYTES}" -d - "${work}/parts/part"
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
    echo "keep_arch ${KEEP_ARCH}"
    echo "library_sha256 ${library_sha}"
    echo "core_sha256 ${core_sha}"
    echo "stream_sha256 ${stream_sha}"
  } > "${folder}/MANIFEST"
done

for folder in "${FOLDERS[@]}"; do
  echo "  ${folder}/: $(ls "${folder}" | tr '\n' ' ')($(du -sm "${folder}" | cut -f1) MB)"
done
cat <<EOF
Staged. On the device, one call per folder, back to back while the machine stays warm (a call carries at most
64 MiB with the working tree: scripts/device_slim.sh first), each running scripts/ort_cuda_unstage.sh
(scripts/gpu_session.sh does):  call k: carry [".ortgpuk"]   (k = 1 .. ${#FOLDERS[@]})
Once all are there: eval "\$(scripts/ort_cuda_unstage.sh --export)", and .deps/onnxruntime is in place for the build.
EOF
