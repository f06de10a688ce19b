#!/usr/bin/env bash
# Makes room in the working tree that travels to the lent GPU (64 MiB per call, carried folders included) by moving
# the tracked files no device call reads into the git-ignored folder .slim/, and puts them back:
#
#   scripts/device_slim.sh            # before the device calls: the tiny suite's torchscript and float32 exports
#   scripts/device_slim.sh --restore  # after them (`git status` shows the moved files as deleted until then)
#
# The device calls of scripts/gpu_session.sh run the tiny suite from its dynamo float16 exports (TINY=1), which
# stay, as does everything else; the moved exports (about 32 MB of the tree's 51) are what CI and the CPU tests use,
# and some GPU tests too (tests/python/test_exporter_patterns.py, test_model_suite.py): run those in a call made
# before slimming. With them moved, both parts of ONNX Runtime's CUDA EP (scripts/stage_ort_cuda.sh, 22 MiB each) fit
# beside the tree in one call (without .third_party: build in an earlier call). Never commit while slimmed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
readonly SLIM=.slim

if [[ "${1:-}" == --restore ]]; then
  [[ -d "${SLIM}" ]] || { echo "device_slim.sh: nothing to restore (no ${SLIM}/)"; exit 0; }
  (cd "${SLIM}" && find . -type f -print0) | while IFS= read -r -d '' f; do
    mkdir -p "$(dirname "${f}")" && mv "${SLIM}/${f}" "${f}"
  done
  rm -rf "${SLIM}"
  git diff --quiet --diff-filter=D || { echo "device_slim.sh: error: tracked files are still missing:" >&2
                                        git diff --name-only --diff-filter=D >&2; exit 1; }
  echo "restored; the working tree is whole again"
  exit 0
fi
[[ -z "${1:-}" ]] || { echo "device_slim.sh: unknown argument $1 (none, or --restore)" >&2; exit 2; }
[[ ! -e "${SLIM}" ]] || { echo "device_slim.sh: error: ${SLIM}/ exists: already slimmed (--restore it)" >&2; exit 1; }
mapfile -t moved < <(git ls-files 'models/suite/tiny/*.torchscript.*.onnx' 'models/suite/tiny/*.dynamo.float32.onnx')
for f in "${moved[@]}"; do
  mkdir -p "${SLIM}/$(dirname "${f}")" && mv "${f}" "${SLIM}/${f}"
done
# du fails on the moved files, which are gone: their sizes are not in the total
size=$( (git ls-files -z | xargs -0 du -cb 2>/dev/null || true) | tail -1 | cut -f1)
echo "moved ${#moved[@]} files to ${SLIM}/; the tracked tree is now $((size / 1048576)) MiB. Restore before committing:"
echo "  scripts/device_slim.sh --restore"
