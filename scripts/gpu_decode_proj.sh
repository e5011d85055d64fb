#!/usr/bin/env bash
# GPU machine: decode's projections, our GEMV (norms and SwiGLU fused) against cuBLASLt, in one call: the GEMV tests,
# the GPU model tests (decode against the CPU), then `elastic bench --decode` with ELASTIC_DECODE_PROJ=cublaslt and
# =gemv interleaved (tok/s and the per-part table). Binaries from .gpucarry (scripts/gpu_carry.sh); logs to $OUT.
set -u
O=${OUT:-/tmp}
C=.gpucarry
[ -d $C/lib ] || tar -xzf $C/lib.tar.gz -C $C
export LD_LIBRARY_PATH=$PWD/$C/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee "$O/gpu_info.log"
GTEST_FILTER='CudaGemv.*:Archs/GpuModelTest.*:GpuEval.*:GpuServe.*' timeout 240 $C/elastic_gpu_tests 2>&1 | tail -n 25 | tee "$O/gemv_tests.log"
for proj in cublaslt gemv cublaslt gemv; do
  echo "## ELASTIC_DECODE_PROJ=$proj" | tee -a "$O/decode_proj.md"
  ELASTIC_DECODE_PROJ=$proj timeout 200 $C/elastic bench --device cuda --shape ${SHAPE:-qwen3-4b} -c ${CTX:-8k,32k,127k} \
    --modes full,hybrid@0.7 --decode 32 -r 1 2>&1 | grep -E '^\||kernels' | tee -a "$O/decode_proj.md"
done
