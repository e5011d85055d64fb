#!/usr/bin/env bash
# GPU machine: whole-model decode before and after a change in one call, interleaved (before, after, before, after):
# .gpucarry/elastic_before is a build of the earlier commit, .gpucarry/elastic the current one (scripts/gpu_carry.sh,
# then copy and strip the other build in). Qwen3-4B shape, random weights, full / hybrid 0.7 / ssa, 32 decode steps.
set -u
. "$(dirname "$0")/gpu_env.sh"  # root, $O, $C, libraries
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
for b in elastic_before elastic elastic_before elastic; do
  echo "== $b"
  timeout 280 .gpucarry/$b bench --device cuda --shape qwen3-4b -c ${LENGTHS:-8k,32k,128k} --modes full,hybrid@0.7,ssa --decode 32 -r 1 2>$OUT/$b.err | tee -a $OUT/wm_$b.md
  tail -2 $OUT/$b.err
done
