#!/usr/bin/env bash
# GPU machine: Nsight Compute readings of one kernel (first launch whose mangled name matches KERNEL) inside a
# program of .gpucarry/. Sections: speed of light, memory, warp state, scheduler; plus pipe utilisation and the stall
# reasons per issued instruction as raw metrics. `--clock-control none` leaves the clocks alone (the GPU machine's
# measuring rules ask for that).
# Usage: KERNEL=<regex> bash scripts/gpu_ncu.sh <program> [args...]
#   e.g. KERNEL=decode_partial bash scripts/gpu_ncu.sh bench_attention_gpu --decode 131072
#        KERNEL=decode_combine bash scripts/gpu_ncu.sh bench_attention_gpu --decode 131072
#        KERNEL='attn_fwd_wgmmaILi128ELb1ELb0ELb1E' bash scripts/gpu_ncu.sh bench_attention_gpu --kernels 16384
# Output: $OUT/ncu_<program>_<KERNEL with non-word characters as _>.txt and a summary on stdout.
set -uo pipefail
. "$(dirname "$0")/gpu_env.sh"  # root, $O, $C, libraries
[ $# -ge 1 ] || { echo "usage: KERNEL=<regex> $0 <program> [args...]" >&2; exit 2; }
[ -n "${KERNEL:-}" ] || { echo "$0: set KERNEL to a regex of the kernel's mangled name" >&2; exit 2; }
prog=$1; shift
f="$O/ncu_${prog}_$(echo "$KERNEL" | tr -c 'A-Za-z0-9\n' '_').txt"
timeout "${NCU_TIMEOUT:-300}" ncu --clock-control none --kernel-name-base mangled -k "regex:$KERNEL" -c 1 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
  --section LaunchStats --section Occupancy \
  --metrics 'regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$,regex:^sm__pipe_.*cycles_active\.avg\.pct_of_peak_sustained_active$,regex:^sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active$,smsp__inst_executed.sum' \
  "$C/$prog" "$@" > "$f" 2>&1
echo "rc $? -> $f"
grep -E "Duration|DRAM Throughput|Compute \(SM\) Throughput|L2 Hit Rate|Achieved Occupancy|Registers Per|Block Limit|tensor_op_hmma_cycles|pipe_xu\.|stalled_(barrier|long_scoreboard|short_scoreboard|math|mio|lg_throttle|wait|not_selected|selected|no_instruction)_per" "$f" | head -40
