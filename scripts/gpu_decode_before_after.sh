#!/usr/bin/env bash
# GPU machine: whole-model decode before and after a change in one call, interleaved (before, after, before, after):
# .gpucarry/elastic_before is a build of the earlier commit, .gpucarry/elastic the current one (scripts/gpu_carry.sh,
# then copy and strip the other build in). Qwen3-4B shape, random weights, full / hybrid 0.7 / ssa, 32 decode steps
# (LENGTHS, MODES, DECODE, REPS change them); the SM clock and power logged beside them in $OUT/clocks.csv.
set -u
. "$(dirname "$0")/gpu_env.sh"  # root, $O, $C, libraries
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
# The SM clock and power every 200 ms beside the runs (read-only): a build that idles the device between kernels can
# run them at higher clocks, which would show here.
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv -lms 200 > $OUT/clocks.csv 2>/dev/null & clocks=$!
for b in elastic_before elastic elastic_before elastic; do
  echo "== $b $(date +%T)"
  timeout 280 .gpucarry/$b bench --device cuda --shape qwen3-4b -c ${LENGTHS:-8k,32k,128k} --modes ${MODES:-full,hybrid@0.7,ssa} \
    --decode ${DECODE:-32} -r ${REPS:-1} 2>$OUT/$b.err | tee -a $OUT/wm_$b.md
  tail -2 $OUT/$b.err
done
kill $clocks 2>/dev/null
