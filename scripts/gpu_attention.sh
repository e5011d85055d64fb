#!/usr/bin/env bash
# GPU machine: the CUDA attention kernels alone. Register / spill report and the matrix instructions of the prefill
# kernel (nvcc -c here), then the carried test binary's attention tests (against the CPU reference in src/attention/),
# a compute-sanitizer memcheck of the small ones, the PyTorch SDPA baselines and bench_attention_gpu, in that order.
# Binaries from .gpucarry (bash scripts/gpu_carry.sh, carry [".gpucarry"]); logs go to $OUT (or /tmp).
# Env: LENGTHS="8192 16384 ..." (benchmark lengths), SKIP_BENCH=1, SKIP_SANITIZER=1, SKIP_SDPA=1.
set -uo pipefail
. "$(dirname "$0")/gpu_env.sh"  # root, $O, $C, libraries
LENGTHS=${LENGTHS:-"8192 16384 32768 65536 131072"}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$O/gpu_info.log"
nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc -Xptxas -v -c src/cuda/attention_fwd.cu \
  -o /tmp/attention_fwd.o 2>&1 | grep -E "registers|spill|entry" | tee "$O/ptxas.log"
# Which matrix instructions the kernels use (HGMMA = wgmma, HMMA = mma.sync).
cuobjdump --dump-sass /tmp/attention_fwd.o | grep -oE "(HGMMA|HMMA)\.[A-Z0-9.]*" | sort | uniq -c | tee -a "$O/ptxas.log"
FILTER='Cuda*:*Decode*:*Paged*'
timeout 240 $C/elastic_gpu_tests --gtest_filter="$FILTER" 2>&1 | tee "$O/attn_tests.log" | grep -vE "^\[ +(RUN|OK) "
test_rc=${PIPESTATUS[0]}
if [ "$test_rc" = 124 ]; then  # a hung kernel (pipeline deadlock): nothing after this is worth running
  echo "tests timed out"; exit 124
fi
if [ -z "${SKIP_SANITIZER:-}" ]; then
  timeout 240 compute-sanitizer --tool memcheck --leak-check no $C/elastic_gpu_tests \
    --gtest_filter='CudaHybridAttention.Mixed*:CudaHybridAttention.Chunked*:CudaDecode*:PagedDecodeCuda.*' 2>&1 |
    tail -n 30 | tee "$O/sanitizer.log"
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  [ -z "${SKIP_SDPA:-}" ] && PYTHONUNBUFFERED=1 python3 bench/gpu/sdpa_baseline.py $LENGTHS 2>&1 | tee "$O/sdpa_baseline.log"
  timeout 300 $C/bench_attention_gpu $LENGTHS 2>&1 | tee "$O/bench_attention_gpu.log"
fi
echo "tests exit code: $test_rc"
exit $test_rc
