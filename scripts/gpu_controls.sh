#!/usr/bin/env bash
# GPU machine: the method against its controls at matched sparsity (issue 23), on SmolLM2-135M-Instruct.
# Resumable across device calls: everything lives in .ctl/ (git-ignored, kept on a warm machine between calls) and each
# stage is skipped when its output exists, so a second call carries on where the first stopped. Stages:
#   1. GPU tests of the router step (the head-identity input is new) and the model assembled from its parts;
#   2. the retrieval-head probe the static baseline deserves: the eval's own niah_single_2 prompts, chat-wrapped, at
#      the eval length (PROBE_PROMPTS of them);
#   3. routers trained in parallel on the one GPU: SEEDS input-adaptive ones (pooled keys) and SEEDS learned-static
#      ones (the same trainer, data, loss and seed with a fixed input per head: --router-input head-identity);
#   4. eval, phase 1: full and every router, one process per method (the GPU is far from busy with a 135M model);
#   5. phase 2, at the adaptive routers' measured mean Omega_MSR: random heads (RANDOM_DRAWS draws), static retrieval
#      heads from the task probe and from the classic magic-number probe of run 3 (docs/results), all-SSA;
#   6. if time is left, the held-out templates (eval --paraphrase) for full, the first seed's routers and one draw.
# Eval prompts use a real-text haystack (Debian's licence texts, carried as .ctl_in/haystack.txt: the router trained
# on the synthetic grammar) and real C++ for code_continue (this repo's src/model), over the training tasks and held-out
# ones. Results: .ctl/eval_*/results.jsonl, merged into $OUT/results.jsonl.gz with the training logs and the report.
# Env: STEPS, BATCH, MAXLEN, LR, MLR, SEEDS ("1 2 3"), LENGTHS, SAMPLES, TASKS, RANDOM_DRAWS, PROBE_PROMPTS, BUDGET
# (seconds this call may use, default 560; stages that do not fit are left for the next call), DEVICE (cuda; cpu for a
# dry run of the script here with tiny settings, e.g. STEPS=2 MAXLEN=300 LENGTHS=256 SAMPLES=1 SEEDS=1 PROBE_PROMPTS=1).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp}
C=.gpucarry
[ -d $C/lib ] || tar -xJf $C/lib.tar.xz -C $C  # gpu_carry.sh packs the libraries
export LD_LIBRARY_PATH=$PWD/$C/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
M=models/$NAME
mkdir -p models .ctl
if [ ! -f "$M" ] || [ "$(sha256sum "$M" | cut -d' ' -f1)" != "$SHA" ]; then
  cat models/parts/q* > "$M" || exit 1
  [ "$(sha256sum "$M" | cut -d' ' -f1)" = "$SHA" ] || { echo "model parts do not reassemble to $NAME"; exit 1; }
fi
STEPS=${STEPS:-600}
BATCH=${BATCH:-4}
MAXLEN=${MAXLEN:-1088}
LR=${LR:-5e-4}
MLR=${MLR:-1e-2}
SEEDS=${SEEDS:-1 2 3}
LENGTHS=${LENGTHS:-1024}
SAMPLES=${SAMPLES:-25}
TASKS=${TASKS:-niah_single_2,niah_multikey_1,qa_1,sum_recap,code_continue,niah_single_3,niah_multivalue,qa_2}
RANDOM_DRAWS=${RANDOM_DRAWS:-5}
PROBE_PROMPTS=${PROBE_PROMPTS:-50}
BUDGET=${BUDGET:-560}
DEVICE=${DEVICE:-cuda}
SPARSE="--sink 64 --local 256 --block 64"
X=.ctl
HAY=.ctl_in/haystack.txt
[ -s "$HAY" ] || { echo "missing $HAY (scripts/gpu_controls.sh expects it carried)"; exit 1; }
left() { echo $(( BUDGET - SECONDS )); }
log() { echo "[$(date +%T) +${SECONDS}s] $*"; }

# 1. The router step on the GPU against the CPU, every variant (head-identity included).
if [ "$DEVICE" = cuda ] && [ ! -f $X/tests.ok ]; then
  $C/elastic_gpu_tests --gtest_filter='*GpuTrainStep*:GpuTrainRouter.*' 2>&1 | tail -n 4 | tee $X/tests.log
  grep -q PASSED $X/tests.log && touch $X/tests.ok
fi

# 2. The task probe: the eval's niah_single_2 prompts at the first eval length, chat-wrapped, on the real text.
L0=${LENGTHS%%,*}
if [ ! -s $X/heads_task.json ]; then
  log "probe --task niah_single_2 --prompts $PROBE_PROMPTS -c $L0"
  $C/elastic probe -m "$M" --device "$DEVICE" --task niah_single_2 --prompts "$PROBE_PROMPTS" -c "$L0" --haystack "$HAY" \
    --seed 7 -o $X/heads_task.json 2>&1 | tr '\r' '\n' | tail -n 2
fi

# 3. Routers, all in parallel.
pids=()
for s in $SEEDS; do
  for kind in adaptive static; do
    f=$X/${kind}_s$s.safetensors
    [ -s "$f" ] && continue
    input=pooled; [ $kind = static ] && input=head-identity
    $C/elastic train-router -m "$M" --device "$DEVICE" --steps "$STEPS" --batch "$BATCH" --max-len "$MAXLEN" \
      --builtin-samples 800 $SPARSE --lr "$LR" --multiplier-lr "$MLR" --seed "$s" --router-input $input \
      -o "$f.tmp" --log $X/train_${kind}_s$s.jsonl -t 2 > $X/train_${kind}_s$s.log 2>&1 &
    pids+=($!)
  done
done
if [ ${#pids[@]} -gt 0 ]; then
  log "training ${#pids[@]} routers in parallel"
  for p in "${pids[@]}"; do wait $p; done
  for f in $X/*.safetensors.tmp; do [ -s "$f" ] && mv "$f" "${f%.tmp}"; done
  log "trained"; for f in $X/train_*.log; do echo "$f: $(grep -E '^step' "$f" | tail -n 1 | tr '\r' ' ' | cut -c1-220)"; done
fi

# One eval process per method; each its own folder (they share nothing but the GPU). $1 = folder, rest = eval flags.
run_eval() {
  local dir=$1; shift
  sanitize "$dir"
  timeout $(( $(left) - 20 )) $C/elastic eval -m "$M" --device "$DEVICE" --tasks "$TASKS" --lengths "$LENGTHS" \
    --samples "$SAMPLES" --seed 3 $SPARSE --haystack "$HAY" --code-corpus src/model -t 2 -o "$dir" "$@" \
    > "$dir.log" 2>&1
  sanitize "$dir"
}
phase() {  # "name|eval flags" specs, run in parallel
  local pids=() spec
  for spec in "$@"; do
    run_eval "$X/eval_${spec%%|*}" ${spec#*|} &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait $p; done
}
NT=$(echo "$TASKS" | tr ',' '\n' | grep -c .)
NL=$(echo "$LENGTHS" | tr ',' '\n' | grep -c .)
WANT=$(( NT * NL * SAMPLES ))
# A sample line cut by a timeout is dropped, so the eval resumes from whole lines.
sanitize() {
  [ -f "$1/results.jsonl" ] || return 0
  python3 -c '
import json, sys
p = sys.argv[1]
keep = []
for l in open(p):
    try: json.loads(l); keep.append(l if l.endswith("\n") else l + "\n")
    except ValueError: pass
open(p, "w").writelines(keep)' "$1/results.jsonl"
}
# Every folder given has all its samples (one method per folder).
done_all() {
  local d
  for d in "$@"; do
    [ -f "$d/results.jsonl" ] && [ "$(grep -c . "$d/results.jsonl")" -ge "$WANT" ] || return 1
  done
}

# 4. Phase 1: full and the routers.
P1=("full|--methods full")
for s in $SEEDS; do
  P1+=("adaptive_s$s|--methods none --router $X/adaptive_s$s.safetensors")
  P1+=("static_s$s|--methods none --router $X/static_s$s.safetensors")
done
dirs1=(); for spec in "${P1[@]}"; do dirs1+=($X/eval_${spec%%|*}); done
if ! done_all "${dirs1[@]}" && [ "$(left)" -gt 90 ]; then
  log "eval phase 1: ${#P1[@]} processes"; phase "${P1[@]}"; log "phase 1 ended"
fi

# 5. Phase 2 at the adaptive routers' mean Omega_MSR over phase 1's samples.
if done_all "${dirs1[@]}"; then
  # Measured once: a later call with more seeds keeps it, so the control folders never mix two Omegas.
  [ -s $X/omega_matched.txt ] || cat $X/eval_adaptive_s*/results.jsonl | python3 -c '
import json, sys
v = [json.loads(l)["msr"] for l in sys.stdin if l.strip() and json.loads(l)["method"].startswith("router-")]
print(f"{sum(v) / len(v):.3f}")' > $X/omega_matched.txt
  OMEGA=$(cat $X/omega_matched.txt)
  log "matched Omega_MSR $OMEGA"
  cp docs/results/smollm2_gpu/heads_1024.json $X/heads_classic.json
  P2=("ssa|--methods ssa" "static_task|--methods static@$OMEGA --scores $X/heads_task.json"
      "static_classic|--methods static@$OMEGA --scores $X/heads_classic.json")
  for r in $(seq 1 "$RANDOM_DRAWS"); do P2+=("random_$r|--methods random@$OMEGA:$r"); done
  dirs2=(); for spec in "${P2[@]}"; do dirs2+=($X/eval_${spec%%|*}); done
  if ! done_all "${dirs2[@]}" && [ "$(left)" -gt 90 ]; then
    log "eval phase 2: ${#P2[@]} processes"; phase "${P2[@]}"; log "phase 2 ended"
  fi
fi

# 6. Held-out templates (eval --paraphrase), if time is left: full, the seed-1 routers and one random draw at the
# same Omega, on the same tasks asked in other words. Folders eval_para_*; their rows carry templates=paraphrase.
if [ -s $X/omega_matched.txt ] && [ "$(left)" -gt 150 ]; then
  OMEGA=$(cat $X/omega_matched.txt)
  s1=${SEEDS%% *}
  log "eval phase 3 (paraphrased templates)"
  phase "para_full|--paraphrase --methods full" \
        "para_adaptive_s$s1|--paraphrase --methods none --router $X/adaptive_s$s1.safetensors" \
        "para_static_s$s1|--paraphrase --methods none --router $X/static_s$s1.safetensors" \
        "para_random_1|--paraphrase --methods random@$OMEGA:1"
  log "phase 3 ended"
fi

# What comes back: every finished sample, its method named after its folder (adaptive_s1, static_s2, random_3,
# static_task, ...; eval's own name kept as eval_method), the logs and the report.
python3 - $X "$O/results.jsonl.gz" <<'EOF'
import glob, gzip, json, os, sys
with gzip.open(sys.argv[2], "wt") as out:
    for d in sorted(glob.glob(sys.argv[1] + "/eval_*/")):
        tag = os.path.basename(d.rstrip("/"))[len("eval_"):]
        for l in open(d + "results.jsonl"):
            try: r = json.loads(l)
            except ValueError: continue
            r["eval_method"], r["method"] = r["method"], tag  # static@<omega> of two probes would collide
            out.write(json.dumps(r, sort_keys=True) + "\n")
EOF
tar czf "$O/train_logs.tgz" $X/train_*.jsonl $X/train_*.log $X/heads_task.json $X/omega_matched.txt $X/tests.log \
  $X/eval_*.log 2>/dev/null
python3 scripts/controls_report.py "$O/results.jsonl.gz" --out $X/report 2>&1 | tail -n 80
tar czf "$O/report.tgz" -C $X report
# The first adaptive router comes back too (the device keeps nothing): the candidate to ship under routers/.
s1=${SEEDS%% *}
[ -s $X/adaptive_s$s1.safetensors ] && cp $X/adaptive_s$s1.safetensors "$O/router_adaptive_s$s1.safetensors"
for f in $X/eval_*/results.jsonl; do echo "$f: $(grep -c . "$f")"; done
ls -la "$O"
