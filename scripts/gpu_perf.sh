#!/usr/bin/env bash
# GPU machine: kernel-level and end-to-end speed with the prebuilt binaries in .gpucarry/ (scripts/gpu_carry.sh):
#   1. bench_attention_gpu --decode: the decode kernel alone, all-full vs all-streaming heads, Qwen3-4B shape;
#   2. bench_attention_gpu: the prefill attention table (full / ssa / xattn with both estimators / hybrid);
#   3. elastic bench --device cuda on the Qwen3-4B shape with decode timing (prefill and decode tokens/s per mode);
#   4. (KERNEL_LENGTHS set) PyTorch SDPA flash / cuDNN and bench_attention_gpu --kernels at those lengths, in the same
#      run: the all-full / all-streaming rows of every wgmma variant against the PyTorch baselines.
# Results under $OUT: decode_kernel.md, attention.md, bench.md, sdpa.md, kernels.md. Env: DECODE_LENGTHS,
# ATTN_LENGTHS, BENCH_LENGTHS, BENCH_MODES, REPS, SKIP_DECODE, SKIP_ATTN, SKIP_E2E, KERNEL_LENGTHS. ELASTIC_ATTN_KERNEL,
# ELASTIC_ATTN_OPTS, ELASTIC_DECODE_LOADS, ELASTIC_DECODE_COMBINE and ELASTIC_DECODE_SPLIT pass through to every step (they change what the
# Auto rows and the whole-model bench run).
set -uo pipefail
. "$(dirname "$0")/gpu_env.sh"  # root, $O, $C, libraries
[ -n "${SKIP_DECODE:-}" ] || timeout 120 $C/bench_attention_gpu --decode ${DECODE_LENGTHS:-8192 16384 32768 65536 131072} | tee "$O/decode_kernel.md"
[ -n "${SKIP_ATTN:-}" ] || timeout 240 $C/bench_attention_gpu ${ATTN_LENGTHS:-8192 32768 131072} | tee "$O/attention.md"
[ -n "${SKIP_E2E:-}" ] || timeout 300 $C/elastic bench --device cuda --shape qwen3-4b -c "${BENCH_LENGTHS:-8k,32k}" \
  --modes "${BENCH_MODES:-full,ssa,hybrid@0.7,xattn}" -r "${REPS:-2}" --decode 34 --plot "$O/bench" | tee "$O/bench.md"
if [ -n "${KERNEL_LENGTHS:-}" ]; then
  timeout 200 python3 bench/gpu/sdpa_baseline.py $KERNEL_LENGTHS | tee "$O/sdpa.md"
  timeout 200 $C/bench_attention_gpu --kernels $KERNEL_LENGTHS | tee "$O/kernels.md"
fi
