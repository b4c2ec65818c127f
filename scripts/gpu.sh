#!/usr/bin/env bash
# The whole GPU job in one device call: install the Python packages, build the CUDA variant of
# pagekernels, run the test suite on the GPU, run the benchmarks, and leave logs + JSON in $OUT.
#
# On the lent H200, MLX's CUDA wheel travels in three parts (scripts/stage-gpu.sh, after
# ../shared/device/stage-mlx-cuda.sh), in calls made back to back:
#   call 1: carry [".gpu-1", ".whl"], command: bash .gpu-1/stash.sh
#   call 2: carry [".gpu-2"], command: bash .gpu-2/stash.sh
#   call 3: carry [".gpu-3"], command:
#           bash .gpu-3/install.sh && COMMIT=<sha> bash scripts/gpu.sh [stage ...]
#   (.whl, ignored, stays on the machine from call 1; later calls while it is warm carry nothing
#   and start with `python3 -c "import mlx.core" || exit 3`. The shared recipe's two halves,
#   .gpu-a and .gpu-b, fit beside a tree of at most ~20 MB only.)
#   (`export COMMIT=<sha>` instead when other commands follow in the same call, so that their
#   JSON records the commit too. Take <sha> from your checkout: `git rev-parse` on the device
#   reported an older commit in session 7.)
# Stages (default: build test bench serve mlxlm): install (the pure-Python packages and the
# carried wheels; build does it too) build test bench decode prefill prefill-profile
# sdpa-profile sustained kernel-time serve mlxlm admission profile. Test selection: TEST_PATHS
# (pytest paths or node ids), TEST_K (a pytest -k expression) and TEST_SHARD (I/N: every N-th
# test from the I-th, scripts/pytest_shard.py; on a fresh machine the whole suite needs two
# calls beside the build: TEST_SHARD=1/2 TEST_TIMEOUT_S=420, then 2/2). .whl/ holds wheels the machine
# lacks (structlog, nanobind 3.x, scikit-build-core); scripts/fetch-gpu-wheels.sh downloads them.
# Exit status: 1 when the install or the build fails (nothing after it runs), 4 when the test
# stage did not pass (every later stage still runs), else 0.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
STAGES=${*:-build test bench serve mlxlm}
COMMIT=${COMMIT:-unknown}
export PYTHONUNBUFFERED=1

has_stage() { [[ " $STAGES " == *" $1 "* ]]; }
section() { echo; echo "=== $* ($(date +%H:%M:%S))"; }

section "environment"
python3 - <<'EOF' | tee "$OUT/env.txt"
import platform, mlx.core as mx
print("python", platform.python_version(), "mlx", mx.__version__, "cuda", mx.cuda.is_available())
print("default device", mx.default_device())
EOF
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$OUT/env.txt"
echo "commit $COMMIT" | tee -a "$OUT/env.txt"

if has_stage build || has_stage install; then
  section "install packages"
  python3 -m pip install -q --no-index --no-deps --no-cache-dir .whl/*.whl || exit 1
  # Non-editable installs: the image lacks the `editables` wheel that editable hatchling
  # builds need.
  python3 -m pip install -q --no-index --no-deps --no-build-isolation \
    packages/pagepool packages/pageruntime packages/qwen3model || exit 1
fi

if has_stage build; then
  section "build pagekernels (CUDA)"
  start=$(date +%s)
  # The image's default CXX (/opt/gcc) yields an extension that segfaults in libstdc++ at the
  # first op call; the system g++ matches the libstdc++ that python3 and libmlx load.
  if ! CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++ PAGEKERNELS_CUDA=1 \
      python3 -m pip install --no-index --no-deps --no-build-isolation -v packages/pagekernels \
      >"$OUT/build.log" 2>&1; then
    tail -n 60 "$OUT/build.log"; exit 1
  fi
  echo "built in $(( $(date +%s) - start )) s"
  # Installed packages shadow nothing in the tree: run from a folder without src/ on sys.path.
  python3 -c "import pagekernels, pagekernels.native as n; print('pagekernels', pagekernels.__file__)"
fi

tests_passed=1
if has_stage test; then
  section "tests on the GPU (default device: gpu)"
  rm -f "$OUT/gpu-tests.xml"  # a report left by an earlier run must not stand in for this one
  PYTHONPATH="$PWD/scripts${PYTHONPATH:+:$PYTHONPATH}" timeout "${TEST_TIMEOUT_S:-240}" \
    python3 -m pytest -q -p no:cacheprovider \
    --junitxml="$OUT/gpu-tests.xml" ${TEST_K:+-k "$TEST_K"} \
    ${TEST_SHARD:+-p pytest_shard --shard "$TEST_SHARD"} ${TEST_PATHS:-packages/pagekernels/tests tests} \
    2>&1 | tee "$OUT/gpu-tests.log" | tail -n 25
  # The later stages still run; the script's status says whether every test passed (none
  # failed, errored or skipped, and the report exists: a timeout leaves none).
  python3 scripts/junit_summary.py "$OUT/gpu-tests.xml" || tests_passed=0
fi

if has_stage bench; then
  section "operator benchmarks"
  python3 benchmarks/attention.py --device gpu --json-output "$OUT/attention.json" \
    --time-limit-s "${BENCH_TIME_S:-150}" --process-timeout-s 120 \
    2>&1 | tee "$OUT/attention.log" | tail -n 45
fi

if has_stage prefill; then
  section "prefill: the 128-row kernels back to back (wgmma where the GPU has it, then mma.sync)"
  for kernel in auto mma_sync; do
    timeout "${PREFILL_TIMEOUT_S:-240}" python3 benchmarks/attention.py --device gpu \
      --paths paged sdpa --batches 1 --contexts 128 --page-sizes 16 128 --prefill 1024 4096 \
      --repeats "${PREFILL_REPEATS:-3}" --prefill-kernel "$kernel" --json-output "$OUT/prefill-$kernel.json" \
      2>&1 | tee "$OUT/prefill-$kernel.log" | grep "prefill B"
  done
fi

if has_stage decode; then
  section "decode, small shapes (B = 1, 8): paged against SDPA, then paged with forced key chunks"
  python3 benchmarks/attention.py --device gpu --paths paged sdpa --batches 1 8 \
    --contexts 128 1024 8192 --page-sizes 16 128 --repeats "${DECODE_REPEATS:-3}" \
    --json-output "$OUT/decode.json" 2>&1 | tee "$OUT/decode.log" | grep "decode B"
  # 0 = the planner's choice.
  for splits in ${DECODE_SPLITS:-0 1 2 4}; do
    python3 benchmarks/attention.py --device gpu --paths paged --batches ${SPLIT_BATCHES:-8} \
      --contexts ${SPLIT_CONTEXTS:-1024} --page-sizes ${SPLIT_PAGE_SIZES:-16 128} \
      --repeats "${DECODE_REPEATS:-3}" --decode-splits "$splits" \
      --json-output "$OUT/decode-splits-$splits.json" 2>&1 | grep "decode B" | sed "s/^/splits $splits: /"
  done
fi

# ncu_case PREFIX KERNEL_REGEX CASE [--sdpa]: Nsight Compute's full set on one launch of
# ncu_cases.py's CASE (BxCONTEXTxPAGE_SIZExQUERY_LEN), then its SASS listing with samples and
# every section's details (the report itself, tens of MB, is removed). NCU_CACHE_CONTROL=none
# keeps the caches between ncu's replays (default all: flushed); PREFILL_NCU_SKIP (default 1)
# skips that many matching launches: the first one migrates the case's metadata into GPU memory,
# as the first kernel of every serving step does.
ncu_case() {
  local cache=${NCU_CACHE_CONTROL:-all} skip=${PREFILL_NCU_SKIP:-1} tag=""
  [ "$cache" = all ] || tag+="-cache-$cache"
  [ "$skip" = 1 ] || tag+="-skip$skip"
  local name="$OUT/$1-$3$tag"
  timeout 240 ncu --clock-control none --cache-control "$cache" -s "$skip" --set full \
    --import-source yes -k regex:"$2" -c 1 -o "$name" \
    python3 benchmarks/ncu_cases.py ${4:-} "$3" >"$name.ncu.log" 2>&1
  local rc=$?
  echo "ncu $1 $3$tag rc=$rc"
  [ "$rc" = 0 ] || return  # the log says why; no empty extracts
  ncu -i "$name.ncu-rep" --page source --csv --print-source sass | gzip >"$name-sass.csv.gz"
  ncu -i "$name.ncu-rep" --print-details all | gzip >"$name-details.txt.gz"
  # The first line of each: the kernel, then a few headline figures.
  for pattern in "^  [a-zA-Z_].*(attention|sdpa|fmha|flash)" "SM Frequency" "Duration" \
      "Compute \(SM\) Throughput" "L2 Cache Throughput" "Issue Slots Busy"; do
    zcat "$name-details.txt.gz" | grep -m 1 -E "$pattern"
  done
  rm -f "$name.ncu-rep"
}
prefill_cases=${PREFILL_NCU_CASES:-1x4096x16x4096 1x1024x16x1024}

if has_stage prefill-profile; then
  section "ncu: the 128-row prefill kernel, B = 1 causal (one launch per case)"
  for case in $prefill_cases; do
    ncu_case prefill "${PREFILL_NCU_KERNEL:-attention_wgmma}" "$case"
  done
fi

if has_stage sdpa-profile; then
  section "ncu: MLX SDPA on dense K/V of the prefill cases (one launch per case)"
  for case in $prefill_cases; do
    ncu_case sdpa "${SDPA_NCU_KERNEL:-sdpa|fmha|flash}" "$case" --sdpa
  done
fi

if has_stage sustained; then
  section "sustained load: SM clock and power while each path runs back to back, then a trace"
  for shape in ${SUSTAINED_SHAPES:-1x4096x16x4096}; do  # BxCONTEXTxPAGE_SIZExQUERY_LEN
    timeout 180 python3 benchmarks/sustained_load.py --shape "$shape" --trace \
      --json-output "$OUT/sustained-$shape.json" 2>&1 | tee -a "$OUT/sustained.log"
  done
fi

if has_stage kernel-time; then
  section "decode, small shapes: GPU latency per call, chained calls (CUPTI kernel durations)"
  timeout 300 python3 benchmarks/kernel_time.py --rounds "${KERNEL_TIME_ROUNDS:-5}" \
    --json-output "$OUT/kernel_time.json" 2>&1 | tee "$OUT/kernel_time.log" | grep "decode B"
fi

if has_stage serve; then
  section "serving benchmark (synthetic Qwen3-4B, the seed's trace)"
  timeout "${SERVE_TIMEOUT_S:-240}" python3 -m qwen3model serve-bench --device gpu \
    --json-output "$OUT/serving.json" 2>&1 | tee -a "$OUT/serving.log" | tail -n 30
  section "serving benchmark, paged with the compiled decode step"
  timeout "${SERVE_TIMEOUT_S:-240}" python3 -m qwen3model serve-bench --device gpu --compile-decode \
    --variants paged --json-output "$OUT/serving-compiled.json" 2>&1 | tee -a "$OUT/serving.log" | tail -n 12
  section "serving benchmark, paged, compiled, each decode step launched before the previous is collected"
  timeout "${SERVE_TIMEOUT_S:-240}" python3 -m qwen3model serve-bench --device gpu --compile-decode \
    --overlap-decode --variants paged --json-output "$OUT/serving-overlap.json" 2>&1 \
    | tee -a "$OUT/serving.log" | tail -n 12
fi

if has_stage mlxlm; then
  section "mlx-lm BatchGenerator on the same trace (outside reference)"
  timeout "${MLXLM_TIMEOUT_S:-150}" python3 benchmarks/mlx_lm_reference.py --device gpu \
    --json-output "$OUT/mlx_lm.json" 2>&1 | tee "$OUT/mlx_lm.log" | tail -n 20
fi
if has_stage admission; then
  section "admission sweep (KV budgets in longest requests)"
  timeout "${ADMISSION_TIMEOUT_S:-240}" python3 benchmarks/admission_sweep.py --device gpu \
    --budgets ${ADMISSION_BUDGETS:-1 2 4} --json-output "$OUT/admission.json" \
    2>&1 | tee "$OUT/admission.log" | tail -n 14
fi

if has_stage profile; then
  section "decode step: whole step against its parts"
  # STEP_ARGS: more decode_step.py options, e.g. "--attention-splits 0 1 2 4 8".
  timeout 300 python3 benchmarks/decode_step.py --device gpu --kernel-trace ${STEP_ARGS:-} \
    --json-output "$OUT/decode_step.json" \
    2>&1 | tee "$OUT/decode_step.log" | tail -n 60
  # The compiled step under other MLX settings, one process each: STEP_ENVS is a list of
  # settings, each VAR=value[,VAR=value...] (MLX_USE_CUDA_GRAPHS, MLX_MAX_OPS_PER_BUFFER,
  # MLX_MAX_MB_PER_BUFFER: when MLX closes and launches a CUDA graph).
  for setting in ${STEP_ENVS:-}; do
    env ${setting//,/ } timeout 120 python3 benchmarks/decode_step.py --device gpu --step-only \
      2>&1 | tail -n 1 | sed "s/^/$setting: /" | tee -a "$OUT/step_envs.log"
  done
  if [ "${NCU:-1}" = 1 ]; then
  section "ncu: small decode shapes"
  timeout 180 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section LaunchStats --section Occupancy \
    -k regex:"attention|merge" python3 benchmarks/ncu_cases.py ${NCU_CASES:-} \
    > "$OUT/ncu.txt" 2> "$OUT/ncu.err"
  echo "ncu rc=$?"; grep -E "attention_mma|merge_splits|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Grid Size" "$OUT/ncu.txt" | head -n 60
  fi
fi
section "done"
# A device call returns at most 8 files: past that, everything goes into one archive, so no
# result is left behind (unpack it with `tar xzf gpu-results.tgz`). An archive from an earlier
# gpu.sh in the same call is unpacked first, so its files go into the new one.
files=("$OUT"/*)
if [ "${#files[@]}" -gt "${MAX_OUT_FILES:-8}" ]; then
  (cd "$OUT" && { [ ! -f gpu-results.tgz ] || { tar xzf gpu-results.tgz && rm gpu-results.tgz; }; } && \
    tar czf gpu-results.tgz -- * && \
    find . -maxdepth 1 -type f ! -name gpu-results.tgz -delete) && \
    echo "bundled $(tar tzf "$OUT/gpu-results.tgz" | wc -l) files into $OUT/gpu-results.tgz"
fi
((tests_passed)) || { echo "gpu.sh: the test stage did not pass (see gpu-tests.log)"; exit 4; }
