#!/usr/bin/env bash
# Fetches ONNX Runtime 1.29.0 (CPU, Linux x86-64) for the onnxruntime engine into .deps/onnxruntime/:
#   .deps/onnxruntime/include/*.h        the C and C++ API headers
#   .deps/onnxruntime/lib/libonnxruntime.so (+ its SONAME link when the SONAME differs)
#   .deps/onnxruntime/.version           "1.29.0" once complete (a second run then does nothing)
# Source: the npm package com.github.asus4.onnxruntime@0.4.9 (ORT 1.29.0), checked against a pinned sha256.
#
# Environment:
#   XPURT_ORT_TARBALL  a local copy of com.github.asus4.onnxruntime-0.4.9.tgz (skips `npm pack`)
#   XPURT_ORT_DEST     the destination folder (default: <repo>/.deps/onnxruntime)
# Then configure with -DXPURT_WITH_ONNXRUNTIME=ON (or AUTO); -DONNXRUNTIME_ROOT=<dir> points at another copy.
set -euo pipefail

readonly ORT_VERSION="1.29.0"
readonly NPM_PACKAGE="com.github.asus4.onnxruntime@0.4.9"
readonly TARBALL_NAME="com.github.asus4.onnxruntime-0.4.9.tgz"
readonly TARBALL_SHA256="e59788788818fdde1b2e522e766a21ba0f7d8391de55737abf81e32cc801785d"
readonly HEADERS_IN_TARBALL="package/Plugins/iOS~/onnxruntime.xcframework/ios-arm64_x86_64-simulator/onnxruntime.framework/Headers"
readonly LIBRARY_IN_TARBALL="package/Plugins/Linux/x64/libonnxruntime.so"
# The provider bridge that execution-provider plugins (the CUDA EP) resolve Provider_GetHost from.
readonly SHARED_IN_TARBALL="package/Plugins/Linux/x64/libonnxruntime_providers_shared.so"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${XPURT_ORT_DEST:-${repo_root}/.deps/onnxruntime}"

die() { echo "fetch_onnxruntime.sh: error: $*" >&2; exit 1; }

if [[ -f "${dest}/.version" && "$(cat "${dest}/.version")" == "${ORT_VERSION}" ]]; then
  echo "ONNX Runtime ${ORT_VERSION} already in ${dest}"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT

# shellcheck source=lib/npm_tarball.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/npm_tarball.sh"
tarball="$(npm_tarball "${NPM_PACKAGE}" "${TARBALL_NAME}" "${TARBALL_SHA256}" XPURT_ORT_TARBALL "about 150 MB" "${work}")" || exit 1

echo "Extracting headers and libonnxruntime.so ..."
tar -xzf "${tarball}" -C "${work}" --wildcards "${HEADERS_IN_TARBALL}/*.h" "${LIBRARY_IN_TARBALL}" "${SHARED_IN_TARBALL}" \
  || die "the tarball lacks ${HEADERS_IN_TARBALL}/*.h or ${LIBRARY_IN_TARBALL}"
[[ -f "${work}/${HEADERS_IN_TARBALL}/onnxruntime_cxx_api.h" ]] || die "onnxruntime_cxx_api.h missing in the tarball"

staging="${dest}.partial"
rm -rf "${staging}"
mkdir -p "${staging}/include" "${staging}/lib"
cp "${work}/${HEADERS_IN_TARBALL}"/*.h "${staging}/include/"
cp "${work}/${LIBRARY_IN_TARBALL}" "${staging}/lib/libonnxruntime.so"
cp "${work}/${SHARED_IN_TARBALL}" "${staging}/lib/libonnxruntime_providers_shared.so"

# The dynamic linker looks a dependency up by its SONAME: provide that file name when it differs.
if command -v objdump >/dev/null; then
  soname="$(objdump -p "${staging}/lib/libonnxruntime.so" | awk '/SONAME/ {print $2}')"
  if [[ -n "${soname}" && "${soname}" != "libonnxruntime.so" ]]; then
    ln -sf libonnxruntime.so "${staging}/lib/${soname}"
  fi
else
  echo "warning: objdump not found; cannot check the SONAME of libonnxruntime.so" >&2
fi

echo "${ORT_VERSION}" > "${staging}/.version"
rm -rf "${dest}"
mkdir -p "$(dirname "${dest}")"
mv "${staging}" "${dest}"
echo "ONNX Runtime ${ORT_VERSION} installed in ${dest}"
