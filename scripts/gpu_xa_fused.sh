#!/usr/bin/env bash
# GPU machine: the dev area's fused XAttention estimator (XAttnEstimateKernel::Fused, dev/cuda/xattn_estimate_fused.cu)
# in one call: first the estimator tests (every form against xattn_select, the fused form's long, stride-8 and partial-
# row cases), each under a timeout (a wrong mbarrier parity hangs rather than fails); then, if they pass,
# `bench_attention_gpu --xa-estimate` at LENGTHS (the full kernel, the mma.sync, cuBLASLt and fused forms in the same
# run, with how far each form's selections are from the engine's); with NCU=1 also the kernels' durations at 32K.
# Binaries from .gpucarry (scripts/gpu_carry.sh). Logs and tables go to $OUT.
# Env: LENGTHS (8192 16384 32768 131072), NCU (unset: no profile), FORCE_BENCH=1 (bench even if a test failed).
set -u
. "$(dirname "$0")/gpu_env.sh"  # root, $O, $C, libraries
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$O/gpu.txt"
GTEST_FILTER='CudaXAttnEstimate.*' timeout 240 $C/elastic_gpu_tests > "$O/xa_tests.log" 2>&1
rc=$?
echo "estimator tests rc=$rc"; grep -E "^\[  (PASSED|FAILED) |^\[       OK|FAILED|differ|Failure" "$O/xa_tests.log" | head -n 30
if [ $rc -ne 0 ] && [ -z "${FORCE_BENCH:-}" ]; then echo "tests failed: no bench (FORCE_BENCH=1 runs it anyway)"; exit 1; fi
timeout 300 $C/bench_attention_gpu --xa-estimate ${LENGTHS:-8192 16384 32768 131072} > "$O/bench_xa_estimate.md" 2>&1
echo "bench rc=$?"; grep -E "^\| " "$O/bench_xa_estimate.md" | grep -Ei "full|estimate|differ" | head -n 24
if [ -n "${NCU:-}" ] && command -v ncu > /dev/null; then
  timeout 200 ncu --clock-control none -k 'regex:pack_|select_|nvjet|scores_block|partial_row' \
    --metrics gpu__time_duration.sum $C/bench_attention_gpu --xa-estimate 32768 > "$O/ncu_xa_32k.txt" 2>&1
  echo "ncu rc=$?"
fi
