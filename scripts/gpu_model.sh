#!/usr/bin/env bash
# GPU machine: the GPU model backend end to end. Runs the prebuilt binaries carried in .gpucarry/ (built here by
# scripts/gpu_carry.sh, since that image lacks OpenBLAS/PCRE2/CLI11): makes the transformers fixtures for the GPU
# tests, runs every GPU test, then `elastic bench --device cuda` on the Qwen3-4B shape and the transformers SDPA
# end-to-end prefill baseline on the same shape and lengths. Logs go to $OUT.
# Then the router-training speed (bench_train_gpu) on the same shape.
# Env: LENGTHS (bench lengths), MODES, LONG_LENGTHS / LONG_MODES (a second bench pass, e.g. 64K-128K without the
# XAttention estimate), TRAIN_LENGTHS, SKIP_TESTS=1, SKIP_HF=1, SKIP_BENCH=1, SKIP_TRAIN=1, REPS, GTEST_FILTER.
set -uo pipefail
. "$(dirname "$0")/gpu_env.sh"  # root, $O, $C, libraries
LENGTHS=${LENGTHS:-"8192,16384,32768"}
MODES=${MODES:-"full,ssa,xattn,hybrid@0.5,hybrid@0.7,hybrid@0.9"}
REPS=${REPS:-2}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$O/gpu_info.log"
ldd $C/elastic | grep -E "not found" && echo "missing libraries" | tee -a "$O/gpu_info.log"
rc=0
if [ -z "${SKIP_TESTS:-}" ]; then
  python3 scripts/make_fixtures.py --only qwen3_gpu,llama_gpu --out "$O/fixtures" 2>&1 | tail -n 3 | tee "$O/fixtures.log"
  ELASTIC_GPU_FIXTURES=$O/fixtures timeout ${TEST_TIMEOUT:-300} $C/elastic_gpu_tests 2>&1 | tee "$O/gpu_tests.log" | grep -vE "^\[ +(RUN|OK) " | tail -n 60
  rc=${PIPESTATUS[0]}
fi
if [ -z "${SKIP_TRAIN:-}" ] && [ ! -x $C/bench_train_gpu ]; then
  echo "gpu_model: no $C/bench_train_gpu (WITH_TRAIN_BENCH=1 bash scripts/gpu_carry.sh carries it): training bench skipped"
elif [ -z "${SKIP_TRAIN:-}" ]; then
  timeout ${TRAIN_TIMEOUT:-300} $C/bench_train_gpu qwen3-4b "${TRAIN_LENGTHS:-8192,32768,65536}" 2 ssa \
    2> "$O/bench_train.err" | tee "$O/bench_train.md"
  tail -n 4 "$O/bench_train.err"
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  timeout ${BENCH_TIMEOUT:-400} $C/elastic bench --device cuda --shape qwen3-4b -c "$LENGTHS" --modes "$MODES" -r "$REPS" \
    --plot "$O/bench_gpu" 2> "$O/bench_gpu.err" | tee "$O/bench_gpu.md"
  tail -n 3 "$O/bench_gpu.err"
  if [ -n "${LONG_LENGTHS:-}" ]; then
    timeout ${BENCH_TIMEOUT:-400} $C/elastic bench --device cuda --shape qwen3-4b -c "$LONG_LENGTHS" \
      --modes "${LONG_MODES:-full,ssa,hybrid@0.5,hybrid@0.7,hybrid@0.9}" -r "$REPS" --plot "$O/bench_gpu_long" \
      2> "$O/bench_gpu_long.err" \
      | tee "$O/bench_gpu_long.md"
    tail -n 3 "$O/bench_gpu_long.err"
  fi
fi
if [ -z "${SKIP_HF:-}" ]; then
  timeout ${HF_TIMEOUT:-300} python3 bench/gpu/hf_prefill_baseline.py --shape qwen3-4b ${LENGTHS//,/ } ${LONG_LENGTHS//,/ } 2>&1 | tail -n 8 | tee "$O/hf_prefill.log"
fi
echo "gpu tests exit code: $rc"
exit $rc
