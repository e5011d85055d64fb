#!/usr/bin/env bash
# GPU machine: the decode step with programmatic dependent launch (GpuOptions::programmatic_launch, `bench --pdl`)
# against plain launches, in one call: first the GPU tests that hold the two to the same bits (graph and eager decode,
# batched decode with cuBLASLt and the small-M kernel between our kernels) and the decode kernels' own tests, then
# `elastic bench --device cuda --shape qwen3-4b --decode 32` with --no-pdl and --pdl, alternating for ROUNDS rounds, so
# clock drift falls on both. Binaries from .gpucarry (scripts/gpu_carry.sh). Logs and tables go to $OUT.
# Env: LENGTHS (8k,32k,127k), MODES (full,hybrid@0.7), ROUNDS (2), WITH_KERNEL (below).
set -u
. "$(dirname "$0")/gpu_env.sh"  # root, $O, $C, libraries
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$O/gpu.txt"
GTEST_FILTER='*DecodeStepsMatchCpu*:*BatchedDecodeMatchesLoneRunsAndCpu*:PagedDecodeCuda.*:*SmallM*:*Gemv*' \
  timeout 180 $C/elastic_gpu_tests > "$O/pdl_tests.log" 2>&1
echo "tests rc=$?"; grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran" "$O/pdl_tests.log" | tail -n 12
for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in plain pdl; do
    flag=--no-pdl; [ $v = pdl ] && flag=--pdl
    timeout 240 $C/elastic bench --device cuda --shape qwen3-4b -c "${LENGTHS:-8k,32k,127k}" \
      --modes "${MODES:-full,hybrid@0.7}" --decode 32 -r 1 $flag > "$O/bench_${v}_$r.md" 2>&1
    echo "== $v round $r (rc=$?)"; grep -E "^\| .*(full|hybrid|ssa)" "$O/bench_${v}_$r.md" | head -n 12
  done
done
# WITH_KERNEL=1: then the kernel-level decode table and PyTorch's SDPA decode anchor of the same shape, same call
# (issue 21's kernel targets): scripts/gpu_paged_decode.sh without its test runs.
if [ -n "${WITH_KERNEL:-}" ]; then
  DECODE_FLAG=--paged SKIP_ALL_TESTS=1 timeout 300 bash scripts/gpu_paged_decode.sh > "$O/paged.log" 2>&1
  echo "paged rc=$?"; tail -n 8 "$O/sdpa_decode.md" 2>/dev/null
fi
