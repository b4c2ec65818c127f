#!/usr/bin/env bash
# Compile every csrc/cuda/*.cu for sm_90a (flags as in CMakeLists.txt, plus ptxas statistics) and
# print one line per kernel: registers, stack frame, spills, plus any ptxas note that wgmma was
# serialised. Nonzero exit on a compile error.
# Usage: csrc/cuda/check_compile.sh [file.cu ...]   (needs nvcc 13 and the mlx wheel headers)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
csrc="$(dirname "$here")"
python="${PYTHON:-$csrc/../../../.venv/bin/python}"
[ -x "$python" ] || python=python3
mlx_include="$("$python" -m mlx --cmake-dir)/include"
out="${TMPDIR:-/tmp}/pagekernels-check-compile"
mkdir -p "$out"
files=("$@")
[ ${#files[@]} -gt 0 ] || files=("$here"/*.cu)
for f in "${files[@]}"; do
  name="$(basename "$f")"
  echo "== $name"
  if ! nvcc -std=c++20 -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_90,code=compute_90 -O3 --expt-relaxed-constexpr -diag-suppress=997 -Xptxas -v \
      -I "$here/fmt_shim" -I "$csrc" -I "$mlx_include" -DPAGEKERNELS_WITH_CUDA \
      -c "$f" -o "$out/$name.o" >"$out/$name.log" 2>&1; then
    cat "$out/$name.log"
    exit 1
  fi
  grep -v '^ptxas info\|bytes stack frame' "$out/$name.log" || true  # warnings
  # ptxas reports serialised wgmma (C7514, C7518, ...) as "info", not as a warning.
  grep 'C75[0-9][0-9]' "$out/$name.log" | sed 's/in the function.*//' | sort -u || true
  # ptxas prints, per kernel: entry name, stack/spill line, register line.
  awk '/Compiling entry function/ { match($0, /\x27[^\x27]+\x27/); fn = substr($0, RSTART + 1, RLENGTH - 2) }
       /bytes stack frame/ { frame = $1; spill = $5 + $9 }
       /Used [0-9]+ registers/ { match($0, /Used [0-9]+/); print substr($0, RSTART + 5, RLENGTH - 5) "\t" frame "\t" spill "\t" fn }' \
    "$out/$name.log" | c++filt | sed -e 's/pagekernels::cuda:://g' -e 's/(pagekernels::cuda::AttentionParams.*)//' |
    sort -t$'\t' -k4 | awk -F'\t' 'BEGIN { print "regs\tstack\tspill\tkernel" } { print }'
done
