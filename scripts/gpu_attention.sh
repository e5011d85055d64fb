#!/usr/bin/env bash
# GPU machine: builds the CUDA attention kernels, their GoogleTest file (against the CPU reference in
# src/attention/, compiled with g++ -fopenmp semantics through nvcc) and the benchmark with nvcc alone, then runs the
# tests, a compute-sanitizer memcheck of the small tests, the PyTorch SDPA baselines and our benchmark, in that order.
# Logs go to $OUT (or /tmp). GoogleTest headers and static libs come from .gpudeps/ (carried).
# Env: LENGTHS="8192 16384 ..." (benchmark lengths), SKIP_BENCH=1, SKIP_SANITIZER=1, SKIP_SDPA=1.
set -uo pipefail
cd "$(dirname "$0")/.."
DEPS=${DEPS:-.gpudeps}
O=${OUT:-/tmp}
LENGTHS=${LENGTHS:-"8192 16384 32768 65536 131072"}
ARCH="-gencode=arch=compute_90a,code=sm_90a"
KERNELS="src/cuda/device.cu src/cuda/attention_fwd.cu src/cuda/xattn_estimate.cu src/cuda/decode_attention.cu"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$O/gpu_info.log"
set -e
nvcc -std=c++17 -O3 $ARCH -Iinclude -Xptxas -v -c src/cuda/attention_fwd.cu -o /tmp/attention_fwd.o 2>&1 |
  grep -E "registers|spill|entry" | tee "$O/ptxas.log"
# Which matrix instructions the kernels use (HGMMA = wgmma, HMMA = mma.sync).
cuobjdump --dump-sass /tmp/attention_fwd.o | grep -oE "(HGMMA|HMMA)\.[A-Z0-9.]*" | sort | uniq -c | tee -a "$O/ptxas.log"
nvcc -std=c++17 -O3 $ARCH -Iinclude -I$DEPS/include $KERNELS src/attention/attention.cpp src/attention/xattn_select.cpp \
  tests/gpu/test_attention_cuda.cpp -L$DEPS/lib -lgtest_main -lgtest -lpthread -Xcompiler -fopenmp \
  -o /tmp/attn_gpu_tests
nvcc -std=c++17 -O3 $ARCH -Iinclude bench/gpu/bench_attention_gpu.cu $KERNELS -o /tmp/bench_attention_gpu
set +e
timeout 120 /tmp/attn_gpu_tests 2>&1 | tee "$O/attn_tests.log"
test_rc=${PIPESTATUS[0]}
if [ "$test_rc" = 124 ]; then  # a hung kernel (pipeline deadlock): nothing after this is worth running
  echo "tests timed out"; exit 124
fi
if [ -z "${SKIP_SANITIZER:-}" ]; then
  timeout 240 compute-sanitizer --tool memcheck --leak-check no /tmp/attn_gpu_tests \
    --gtest_filter='CudaHybridAttention.Mixed*:CudaHybridAttention.Chunked*:CudaDecode*' 2>&1 |
    tail -n 30 | tee "$O/sanitizer.log"
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  [ -z "${SKIP_SDPA:-}" ] && PYTHONUNBUFFERED=1 python3 bench/gpu/sdpa_baseline.py $LENGTHS 2>&1 | tee "$O/sdpa_baseline.log"
  timeout 300 /tmp/bench_attention_gpu $LENGTHS 2>&1 | tee "$O/bench_attention_gpu.log"
fi
echo "tests exit code: $test_rc"
exit $test_rc
