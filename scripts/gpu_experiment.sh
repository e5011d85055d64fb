#!/usr/bin/env bash
# GPU machine: the method on a real backbone (issue 7), end to end with the prebuilt binaries in .gpucarry/:
# retrieval-head probe (CPU threads), router training on the GPU (built-in sensitive + robust task mix), then the
# eval suite on the GPU over full / all-SSA / static retrieval-head baselines / the trained router.
# The model travels in parts (the device tool's 64 MiB limit per call): models/parts/q* -> models/<NAME>, checked.
# Results: $OUT/experiment.tgz (probe heat map, training log and curves, router file, eval folder) + logs.
# Env: LENGTHS (eval prompt lengths), SAMPLES, STEPS, BATCH, MAXLEN, LOCAL, SINK, LR, MLR, SEED, BUILTIN (built-in
# training samples), METHODS, TASKS, SKIP_PROBE=1 (no static@ methods then), EVAL_TIMEOUT, RESUME (a results.jsonl or
# .jsonl.gz of an earlier eval with the same seed and options: its samples are kept and only the rest run; its
# router rows only together with ROUTER),
# ROUTER (an existing router file: no training), SCORES (an existing probe heads.json: no probe), TRAIN_FLAGS (extra train-router flags, e.g. --no-chat),
# BUDGET (seconds for the whole script, default 570: the eval gets what is left, so the results always come back
# within one 10-minute device call; an unfinished eval resumes with RESUME and ROUTER).
set -uo pipefail
. "$(dirname "$0")/gpu_env.sh"  # root, $O, $C, libraries
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
M=models/$NAME
if [ ! -f "$M" ] || [ "$(sha256sum "$M" | cut -d' ' -f1)" != "$SHA" ]; then
  cat models/parts/q* > "$M" || exit 1
  [ "$(sha256sum "$M" | cut -d' ' -f1)" = "$SHA" ] || { echo "model parts do not reassemble to $NAME"; exit 1; }
fi
LENGTHS=${LENGTHS:-1024,2048}
SAMPLES=${SAMPLES:-20}
STEPS=${STEPS:-300}
BATCH=${BATCH:-4}
MAXLEN=${MAXLEN:-2112}
SINK=${SINK:-64}
LOCAL=${LOCAL:-256}
LR=${LR:-2e-3}
MLR=${MLR:-1e-2}
SEED=${SEED:-1}
BUILTIN=${BUILTIN:-800}
METHODS=${METHODS:-full,ssa,static@0.5,static@0.7,static@0.9}
TASKS=${TASKS:-niah_single_2,niah_multikey_1,qa_1,sum_recap,continue_text,code_continue}
X=$O/exp
mkdir -p "$X"
T=$(nproc)
set -x
if [ -n "${SCORES:-}" ]; then cp "$SCORES" "$X/heads.json"; else
[ -n "${SKIP_PROBE:-}" ] || $C/elastic probe -m "$M" -c 1024 --depths 5 --needles 1 -o "$X/heads.json" -t "$T" 2>&1 | tail -n 3
fi
if [ -n "${RESUME:-}" ]; then
  mkdir -p "$X/eval"
  case "$RESUME" in *.gz) gunzip -c "$RESUME" ;; *) cat "$RESUME" ;; esac > "$X/eval/resumed.jsonl"
  # A router's rows are kept only when the same router is given (ROUTER); a newly trained one is evaluated afresh.
  if [ -n "${ROUTER:-}" ]; then mv "$X/eval/resumed.jsonl" "$X/eval/results.jsonl"
  else grep -v '"method":"router-' "$X/eval/resumed.jsonl" > "$X/eval/results.jsonl"; rm "$X/eval/resumed.jsonl"; fi
fi
if [ -n "${ROUTER:-}" ]; then cp "$ROUTER" "$X/router.safetensors"; else
$C/elastic train-router -m "$M" --device cuda --steps "$STEPS" --batch "$BATCH" --max-len "$MAXLEN" \
  --builtin-samples "$BUILTIN" --sink "$SINK" --local "$LOCAL" --block 64 --lr "$LR" --multiplier-lr "$MLR" --seed "$SEED" \
  -o "$X/router.safetensors" --log "$X/train.jsonl" -t "$T" ${TRAIN_FLAGS:-} 2>&1 | tee "$X/train.log" | grep -E "^step [0-9]*0/|plan|wrote|error" | tail -n 40
fi
LEFT=$(( ${BUDGET:-570} - SECONDS - 15 ))
EVAL_TIMEOUT=${EVAL_TIMEOUT:-$LEFT}
[ "$EVAL_TIMEOUT" -le "$LEFT" ] || EVAL_TIMEOUT=$LEFT
timeout "$EVAL_TIMEOUT" $C/elastic eval -m "$M" --device cuda --tasks "$TASKS" --lengths "$LENGTHS" --samples "$SAMPLES" --methods "$METHODS" \
  --scores "$X/heads.json" --router "$X/router.safetensors" --sink "$SINK" --local "$LOCAL" --block 64 \
  -o "$X/eval" -t "$T" 2>&1 | tr '\r' '\n' | tail -n 5
set +x
cat "$X/eval/results.md" | head -n 60
tar czf "$O/experiment.tgz" -C "$O" exp && rm -rf "$X"
