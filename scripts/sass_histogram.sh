#!/usr/bin/env bash
# The SASS of a CUDA kernel on this machine, without a GPU: how many instructions of each kind a kernel's loop
# issues, registers and spills. The toolkit here (CUDA 13) has nvcc and ptxas but no cuobjdump or nvdisasm, and
# CUDA 11.8's (Debian non-free's nvidia-cuda-toolkit, fetched once into ~/.cache/xpurt-cuda118 with apt-get download:
# nothing is installed) cannot read CUDA 13's cubins. So the file is compiled to PTX with CUDA 13, its PTX version
# lowered to 7.8 (the kernels use nothing newer) and assembled for sm_90 by CUDA 11.8's ptxas, whose cubin CUDA
# 11.8's cuobjdump reads. The SASS is 11.8's ptxas's, not 13's: close, not identical; use it to compare variants of
# a kernel, and time them on the device.
#
#   scripts/sass_histogram.sh src/cpp/backends/cuda_raw/int4_gemm.cu int4_gemv_kernelI6__halfS3_Li1ELb1E [FROM TO]
#
# Prints ptxas's registers and spills of the kernels whose mangled name matches the pattern, the offsets of the
# first one's branches and barriers (where its loops are), and the histogram of its instructions between the SASS
# offsets FROM and TO (hex, e.g. 0x3b40 0x59a0: a loop's body), or of the whole kernel.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,15p' "$0"; exit 2; }
source=$1 pattern=$2 from=${3:-} to=${4:-}
cd "$(dirname "$0")/.."
cache=${XPURT_CUDA118_CACHE:-$HOME/.cache/xpurt-cuda118}
if [ ! -x "$cache/usr/bin/cuobjdump" ]; then
  mkdir -p "$cache/apt/sources.list.d" "$cache/apt/lists/partial" "$cache/deb"
  sed 's/^Components: main$/Components: main non-free/' /etc/apt/sources.list.d/debian.sources \
    > "$cache/apt/sources.list.d/debian.sources"
  apt_opts=(-o "Dir::Etc::sourceparts=$cache/apt/sources.list.d" -o Dir::Etc::sourcelist=/dev/null
            -o "Dir::State::Lists=$cache/apt/lists")
  apt-get "${apt_opts[@]}" update > /dev/null 2>&1
  (cd "$cache/deb" && apt-get "${apt_opts[@]}" download nvidia-cuda-toolkit > /dev/null 2>&1)
  dpkg -x "$cache"/deb/nvidia-cuda-toolkit_*.deb "$cache"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/local/cuda/bin/nvcc -DXPURT_BUILDING_CORE -DXPURT_CUDA_RAW_MIN_ARCH=90 -DXPURT_WITH_CUDA=1 -Isrc/cpp/include \
  -Isrc/cpp -O2 -DNDEBUG -arch=sm_90 --expt-relaxed-constexpr -std=c++17 -ptx -o "$work/k.ptx" "$source"
sed 's/^\.version [0-9.]*/.version 7.8/' "$work/k.ptx" > "$work/k78.ptx"
"$cache/usr/bin/ptxas" -arch=sm_90 -O3 -v -o "$work/k.cubin" "$work/k78.ptx" 2> "$work/ptxas.txt"
grep -A3 "Compiling entry.*$pattern" "$work/ptxas.txt" | grep -E "entry|spill|Used" | sed 's/ptxas info *: //'
name=$("$cache/usr/bin/cuobjdump" -sass "$work/k.cubin" | grep "Function :.*$pattern" | head -1 | awk '{print $3}')
[ -n "$name" ] || { echo "no kernel matches $pattern" >&2; exit 1; }
"$cache/usr/bin/cuobjdump" -sass -fun "$name" "$work/k.cubin" | grep -E '^\s+/\*[0-9a-f]{4}\*/' > "$work/k.sass"
echo "== $name: $(wc -l < "$work/k.sass") instructions; branches and barriers:"
grep -E 'BRA|BAR|EXIT' "$work/k.sass" | sed 's/ *;.*//' | awk '{$1=$1; print}' | head -40
body=$work/k.sass
if [ -n "$from" ] && [ -n "$to" ]; then
  awk -v from="$((from))" -v to="$((to))" '{
    match($0, /\/\*[0-9a-f]+\*\//); at = strtonum("0x" substr($0, RSTART + 2, RLENGTH - 4))
    if (at >= from && at < to) print }' "$work/k.sass" > "$work/body.sass"
  body=$work/body.sass
  echo "== $(wc -l < "$body") instructions in [$from, $to):"
fi
sed -E 's/^\s+\/\*[0-9a-f]+\*\/\s+(@!?U?P[0-9T] )?//; s/[ .;].*//' "$body" | sort | uniq -c | sort -rn
