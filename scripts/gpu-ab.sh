#!/usr/bin/env bash
# A/B of pagekernels variants on one GPU machine, in one device call (after the MLX staging of
# scripts/gpu.sh's header). Stage the variants first on the development machine:
#   scripts/variants.sh main wip/softmax-turn-serial     # writes ab/<name>/overlay.tar
# then, on the device (after the staging calls of scripts/gpu.sh's header; no carry needed):
#   bash .gpu-3/install.sh >/dev/null 2>&1; python3 -c "import mlx.core" || exit 3
#   AB_TESTS="prefill128 or growing" bash scripts/gpu-ab.sh
#
# Builds one wheel per variant (in parallel), runs the GPU tests selected by AB_TESTS (a pytest
# -k expression; none when empty) in AB_TEST_PATHS (default: the GPU paged-attention file) on
# each variant named in AB_TEST_VARIANTS (default: all), then AB_ROUNDS rounds of AB_BENCH per
# variant, the variants in forward order in even rounds and backward in odd ones, so that every
# variant runs early and late. AB_BENCH is a shell command run with $VARIANT, $ROUND and $OUT set; its default
# is the prefill benchmark (1024 and 4096 tokens, pages of 16 and 128, paged and MLX SDPA). Logs
# and JSON go to $OUT (packed into one archive when there are more than 8 files);
# benchmarks/ab_table.py prints the default benchmark's paired table from them.
#
# Each variant is installed into its own folder (ab/site/<name>) and chosen by PYTHONPATH, so
# that two variants can run at once; its commit is the COMMIT its results record. (The
# extension's RPATH, $ORIGIN/../mlx/lib, does not reach MLX from there: it loads because
# `import pagekernels` imports mlx.core first.) On a machine with two GPUs, AB_SUITE=<name> runs
# scripts/gpu.sh's test stage (TEST_* settings as there; TEST_TIMEOUT_S default 420) on that
# variant on GPU AB_SUITE_GPU (default 1) while the tests and rounds above run on GPU AB_GPU
# (default 0); its logs go to $OUT/suite/, and the script fails when a suite test failed,
# errored or was skipped, or none ran.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
[ -f ab/variants.txt ] || { echo "no ab/variants.txt: run scripts/variants.sh first" >&2; exit 2; }
mapfile -t variants <ab/variants.txt
if [ -n "${AB_SUITE:-}" ]; then
  gpus=$(nvidia-smi -L | grep -c '^GPU')
  ((gpus >= 2)) || { echo "AB_SUITE runs on a second GPU; this machine has $gpus" >&2; exit 2; }
fi
default_bench='timeout 150 python3 benchmarks/attention.py --device gpu --paths paged sdpa \
  --batches 1 --contexts 128 --page-sizes 16 128 --prefill 1024 4096 --repeats 3 \
  --process-timeout-s 60 --json-output "$OUT/prefill-$VARIANT-$ROUND.json" \
  >"$OUT/prefill-$VARIANT-$ROUND.log" 2>&1; grep "prefill B" "$OUT/prefill-$VARIANT-$ROUND.log"'
bench=${AB_BENCH:-$default_bench}
rounds=${AB_ROUNDS:-2}
start=$(date +%s)

OUT=$OUT bash scripts/gpu.sh install || exit 1

# The overlays are differences from the tree that variants.sh saw: refuse another one.
sha256sum --quiet -c ab/base.sha256 ||
  { echo "packages/pagekernels changed since scripts/variants.sh: run it again" >&2; exit 2; }
assemble() {  # the tree's pagekernels (no build folder) with the variant's overlay
  rm -rf "ab/$1/pagekernels" "ab/$1/src" && mkdir -p "ab/$1/src/packages" &&
    tar -C packages --exclude=pagekernels/build -cf - pagekernels | tar -C "ab/$1/src/packages" -xf - &&
    if [ -f "ab/$1/overlay.tar" ]; then tar -x -f "ab/$1/overlay.tar" -C "ab/$1/src"; fi &&
    while IFS= read -r f; do rm -f "ab/$1/src/$f"; done <"ab/$1/removed.txt" &&
    mv "ab/$1/src/packages/pagekernels" "ab/$1/pagekernels" && rm -rf "ab/$1/src"
}
wheel() {  # the image's default CXX breaks the extension: see scripts/gpu.sh
  assemble "$1" || { echo "assemble $1 failed"; return 1; }
  rm -rf "ab/whl/$1" && mkdir -p "ab/whl/$1" &&
    CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++ PAGEKERNELS_CUDA=1 python3 -m pip wheel -q \
      --no-index --no-deps --no-build-isolation -w "ab/whl/$1" "ab/$1/pagekernels" \
      >"$OUT/build-$1.log" 2>&1 ||
    { echo "build $1 failed"; tail -n 20 "$OUT/build-$1.log"; return 1; }
}
site() {  # the variant's wheel, installed on its own
  rm -rf "ab/site/$1" && python3 -m pip install -q --no-index --no-deps --target "ab/site/$1" \
    "ab/whl/$1"/*.whl >/dev/null 2>&1 || { echo "install $1 failed"; return 1; }
}
use() {
  [ -d "ab/site/$1" ] && export PYTHONPATH="$PWD/ab/site/$1" COMMIT="$(cat "ab/$1/commit")"
}
# A site folder left by an earlier call on a warm machine must not stand in for a failed build.
for v in "${variants[@]}"; do rm -rf "ab/site/$v" "ab/whl/$v"; done
for v in "${variants[@]}"; do { wheel "$v" && site "$v"; } & done
wait
echo "wheels in $(($(date +%s) - start)) s: ${variants[*]}"
export CUDA_VISIBLE_DEVICES=${AB_GPU:-${CUDA_VISIBLE_DEVICES:-0}}

suite=""
if [ -n "${AB_SUITE:-}" ]; then
  mkdir -p "$OUT/suite"
  (
    use "$AB_SUITE" || { echo "suite: $AB_SUITE was not installed"; exit 1; }
    echo "== suite $AB_SUITE ($COMMIT) on GPU ${AB_SUITE_GPU:-1}, pagekernels from $PYTHONPATH"
    CUDA_VISIBLE_DEVICES=${AB_SUITE_GPU:-1} OUT="$OUT/suite" TEST_TIMEOUT_S=${TEST_TIMEOUT_S:-420} \
      bash scripts/gpu.sh test
  ) >"$OUT/suite/gpu.log" 2>&1 &
  suite=$!
fi

if [ -n "${AB_TESTS:-}" ]; then
  for v in ${AB_TEST_VARIANTS:-${variants[*]}}; do
    use "$v" || continue
    echo "== tests $v ($(cat "ab/$v/commit"))"
    timeout "${AB_TEST_TIMEOUT_S:-240}" python3 -m pytest -q -p no:cacheprovider \
      ${AB_TEST_PATHS:-packages/pagekernels/tests/test_gpu_paged_attention.py} -k "$AB_TESTS" 2>&1 |
      tail -n 3 | tee "$OUT/tests-$v.log"
  done
fi

for ((round = 0; round < rounds; round++)); do
  order=("${variants[@]}")
  if ((round % 2)); then
    order=()
    for ((i = ${#variants[@]} - 1; i >= 0; i--)); do order+=("${variants[i]}"); done
  fi
  for v in "${order[@]}"; do
    use "$v" || continue
    echo "== $v round $round ($(cat "ab/$v/commit"))"
    VARIANT=$v ROUND=$round OUT=$OUT bash -c "$bench"
  done
done
status=0
if [ -n "$suite" ]; then
  wait "$suite" || status=1  # gpu.sh fails unless every test passed (scripts/junit_summary.py)
  echo "== suite $AB_SUITE"
  tail -n 4 "$OUT/suite/gpu.log"
fi
echo "done in $(($(date +%s) - start)) s"
for v in "${variants[@]}"; do echo "$v $(cat "ab/$v/commit")"; done >"$OUT/variants.txt"
files=("$OUT"/*)
if [ "${#files[@]}" -gt 8 ]; then
  (cd "$OUT" && tar czf ab-results.tgz --remove-files -- *) && echo "packed into $OUT/ab-results.tgz"
fi
exit "$status"
