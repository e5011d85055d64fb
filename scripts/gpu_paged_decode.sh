#!/usr/bin/env bash
# GPU machine: the paged decode kernel (issue 21) in one call: its GPU tests, then bench_attention_gpu --decode (the
# contiguous-cache kernel's table, then the paged table with the copy rate) and the SDPA decode anchor of the same
# shape, then every GPU test and the logits check (scripts/gpu_logits_check.sh). Binaries from .gpucarry
# (scripts/gpu_carry.sh). Logs go to $OUT. DECODE_FLAG=--paged: only the paged table.
set -u
. "$(dirname "$0")/gpu_env.sh"  # root, $O, $C, libraries
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$O/gpu_info.log"
GTEST_FILTER='PagedDecodeCuda.*' timeout 120 $C/elastic_gpu_tests 2>&1 | tail -n 30 | tee "$O/paged_tests.log"
timeout 200 $C/bench_attention_gpu ${DECODE_FLAG:---decode} ${LENGTHS:-8192 32768 131072} 2>&1 | tee "$O/decode_bench.md"
timeout 120 python3 bench/gpu/sdpa_decode_baseline.py ${LENGTHS:-8192 32768 131072} 2>&1 | tee "$O/sdpa_decode.md"
[ -n "${SKIP_ALL_TESTS:-}" ] || bash scripts/gpu_logits_check.sh > "$O/all_tests.log" 2>&1
tail -n 40 "$O/all_tests.log" 2>/dev/null
