#!/usr/bin/env bash
# GPU machine: which part of the overlap attention variant makes Archs/GpuModelTest.RouterDecidesLikeCpu/Qwen3 fail
# inside the GPU suite (it passes alone)? Runs the suite (without the transformers-fixture tests) once per
# kernel:options combination (ELASTIC_ATTN_KERNEL, ELASTIC_ATTN_OPTS: bit 0 adjacent tile pairs, bit 1 bulk-store
# epilogue), then compute-sanitizer memcheck on that test alone under ELASTIC_ATTN_KERNEL=overlap. Needs .gpucarry/
# (scripts/gpu_carry.sh).
# Env: COMBOS (default "overlap:0 overlap:3 simple:0": the engine's kernels, the overlap loop with the old and the
# new pairing and stores; the measurement variants run from dev/cuda, not through the variable; one suite run takes
# 90-115 s, so with memcheck at most 3 combinations fit one 10-minute call),
# SUITE_TIMEOUT (150),
# SKIP_MEMCHECK, TOOLS (compute-sanitizer tools, default memcheck), TOOL_KERNEL (overlap), TOOL_FILTER,
# MEMCHECK_TIMEOUT (200 per tool).
# Output: $OUT/suite_<kernel>_<opts>.txt, $OUT/<tool>_router.txt, one summary line per run on stdout.
# The variables reach the tests that build a GpuModel (read once there, attention_config_from_env); the kernel-level
# tests name their kernels and options in HybridAttnParams.
set -uo pipefail
. "$(dirname "$0")/gpu_env.sh"  # root, $O, $C, libraries
for combo in ${COMBOS:-overlap:0 overlap:3 simple:0}; do  # the engine's kernels (the variants: dev/cuda)
  k=${combo%%:*} o=${combo##*:}
  f="$O/suite_${k}_${o}.txt"
  ELASTIC_ATTN_KERNEL=$k ELASTIC_ATTN_OPTS=$o timeout "${SUITE_TIMEOUT:-150}" $C/elastic_gpu_tests \
    --gtest_filter='-Transformers*' > "$f" 2>&1
  rc=$?
  echo "$k opts $o: rc $rc, $(grep -cE '^\[       OK \]' "$f") ok, failed: $(grep -E '^\[  FAILED  \] [A-Z]' "$f" |
    grep -v 'listed below' | sed 's/\[  FAILED  \] //; s/ (.*//' | sort -u | tr '\n' ' ')"
done
# memcheck finds out-of-range accesses; initcheck finds reads of device memory nothing wrote (a test that passes alone
# on fresh, zeroed allocations and fails after other tests reused them); racecheck finds shared-memory hazards.
if [ -z "${SKIP_MEMCHECK:-}" ]; then
  for tool in ${TOOLS:-memcheck}; do
    ELASTIC_ATTN_KERNEL=${TOOL_KERNEL:-overlap} timeout "${MEMCHECK_TIMEOUT:-200}" compute-sanitizer --tool "$tool" \
      $C/elastic_gpu_tests --gtest_filter="${TOOL_FILTER:-Archs/GpuModelTest.RouterDecidesLikeCpu/*}" \
      > "$O/${tool}_router.txt" 2>&1
    echo "$tool (rc $?):"; tail -4 "$O/${tool}_router.txt"
  done
fi
