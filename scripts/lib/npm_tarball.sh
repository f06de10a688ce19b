# Sourced by scripts/fetch_onnxruntime.sh and scripts/stage_ort_cuda.sh: fetch a pinned npm package tarball (or take
# one the user downloaded) and check its sha256.
#
#   tarball="$(npm_tarball PACKAGE@VERSION FILE.tgz SHA256 OVERRIDE_VARIABLE "about 150 MB" WORKDIR)"
#
# OVERRIDE_VARIABLE names an environment variable that, when set, points at an already downloaded tarball.
# Exits the calling script (through `die`, which the caller defines) when npm is missing, the download fails or the
# checksum differs.
npm_tarball() {
  local package="$1" file="$2" sha="$3" override_var="$4" size="$5" work="$6"
  local override="${!override_var:-}" tarball
  if [[ -n "${override}" ]]; then
    [[ -f "${override}" ]] || die "${override_var}=${override} is not a file"
    tarball="${override}"
  else
    command -v npm >/dev/null || die "npm is not installed; install Node.js/npm, or download ${file} \
yourself and pass it as ${override_var}=<path>"
    echo "Downloading ${package} (${size}) with npm pack ..." >&2
    (cd "${work}" && npm pack --silent "${package}" >/dev/null) || die "npm pack ${package} failed"
    tarball="${work}/${file}"
    [[ -f "${tarball}" ]] || die "npm pack did not write ${file}"
  fi
  local actual
  actual="$(sha256sum "${tarball}" | cut -d' ' -f1)"
  [[ "${actual}" == "${sha}" ]] || die "sha256 mismatch for ${tarball}: expected ${sha}, got ${actual}; \
the download is corrupt or not ${package}. Delete it and run again."
  echo "${tarball}"
}
