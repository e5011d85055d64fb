#!/usr/bin/env bash
# GPU machine: the method against its controls at matched sparsity (issue 23), on SmolLM2-135M-Instruct.
# Resumable across device calls: everything lives in .ctl/ (git-ignored, kept on a warm machine between calls) and each
# stage is skipped when its output exists, so a second call carries on where the first stopped. Stages:
#   1. the retrieval-head probe the static baseline deserves: the eval's own niah_single_2 prompts, chat-wrapped, at
#      the eval length (PROBE_PROMPTS of them), run beside
#   2. routers trained in parallel on the one GPU: SEEDS input-adaptive ones (pooled keys) and SEEDS learned-static
#      ones (the same trainer, data, loss and seed with a fixed input per head: --router-input head-identity);
#   3. eval, phase 1: full and every router, one process per method (the GPU is far from busy with a 135M model);
#      the sweep routers (SWEEPS: what changes the picture) train in the background meanwhile;
#   4. phase 2, at the adaptive routers' measured mean Omega_MSR: random heads (RANDOM_DRAWS draws), static retrieval
#      heads from the task probe and from the classic magic-number probe of run 3 (docs/results), all-SSA;
#   5. the held-out templates (eval --paraphrase) for full, the first seed's routers and one draw; the sweep routers;
#   6. LONG (e.g. 4096): the probe, full and the routers at that length, then the controls at the Omega measured there;
#   7. the whole GPU test suite with the transformers fixtures, run in the background from the start (SKIP_TESTS=1: not).
# Eval prompts use a real-text haystack (Debian's licence texts, carried as .ctl_in/haystack.txt: the router trained
# on the synthetic grammar) and real C++ for code_continue (this repo's src/model), over the training tasks and held-out
# ones. Results: .ctl/eval_*/results.jsonl, merged into $OUT/results.jsonl.gz with the training logs and the report.
# A fresh machine can take up a finished earlier run: RESTORE=docs/results/<run> rebuilds the eval folders from that
# run's results.jsonl.gz and its probe and matched Omega from its train_logs.tgz, so only what is missing runs (the
# routers are retrained, same command and seeds, for the phases that still need them).
# Env: STEPS, BATCH, MAXLEN, LR, MLR, SEEDS ("1 2 3"), LENGTHS, LONG, SAMPLES, TASKS, TASKS_LONG (the tasks at LONG,
# default every task), LONG_ROUTERS (the routers phase 6 runs, adaptive ones first: "adaptive|static" names of .ctl routers,
# default the main ones), MAIN (0: train no main routers, for a run restored from one that has their results),
# RANDOM_DRAWS, PROBE_PROMPTS, SWEEP_START (seconds a call must have left to start the sweep trainings,
# which cannot resume: default 470), RESTORE, BUDGET
# (seconds this call may use, default 560; stages that do not fit are left for the next call), DEVICE (cuda; cpu for a
# dry run of the script here with tiny settings, e.g. STEPS=2 MAXLEN=300 LENGTHS=256 SAMPLES=1 SEEDS=1 PROBE_PROMPTS=1).
set -uo pipefail
. "$(dirname "$0")/gpu_env.sh"  # root, $O, $C, libraries
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
M=models/$NAME
mkdir -p models .ctl
if [ ! -f "$M" ] || [ "$(sha256sum "$M" | cut -d' ' -f1)" != "$SHA" ]; then
  cat models/parts/q* > "$M" || exit 1
  [ "$(sha256sum "$M" | cut -d' ' -f1)" = "$SHA" ] || { echo "model parts do not reassemble to $NAME"; exit 1; }
fi
STEPS=${STEPS:-500}
BATCH=${BATCH:-4}
MAXLEN=${MAXLEN:-1088}
LR=${LR:-5e-4}
MLR=${MLR:-1e-3}  # the method's multiplier lr (run 3 used 1e-2)
SEEDS=${SEEDS:-1 2 3}
LENGTHS=${LENGTHS:-1024}
LONG=${LONG-4096}  # a second eval length for phase 6 (LONG= : none)
SAMPLES=${SAMPLES:-50}
ALL_TASKS=niah_single_2,niah_multikey_1,qa_1,sum_recap,code_continue,continue_text,niah_single_3,niah_multivalue,qa_2,recap_last
TASKS=${TASKS:-$ALL_TASKS}
TASKS_LONG=${TASKS_LONG:-$ALL_TASKS}  # every task at LONG, also when TASKS keeps a restored run's list
SWEEP_START=${SWEEP_START:-470}
RESTORE=${RESTORE:-}
MAIN=${MAIN:-1}
# Sweeps (what changes the picture), "name|train-router flags" beyond the shared ones, seed 1: the pooling window (the
# router sees only the first and last 100 tokens), run 3's multiplier lr 1e-2 (with its own learned-static twin), the
# temperature schedule, the training length (1K-4K prompts, about 2.3x the tokens per step, so half the steps: about the
# main routers' token budget, and a training that fits one call; --max-len and --steps in a sweep replace the shared
# ones), and class targets
# farther apart (sensitive 0.5, robust 1.0, with lr 1e-2 so they are reached: the adaptive router then has a reason
# to route the classes differently, the static one cannot). A sweep that
# leaves the head-identity input's training unchanged (pooling) is paired with static_s1; the others with a twin.
# Last, the paper's other two configurations (issue 22): FA-XA (full or XAttention heads) and XA-SSA (XAttention or
# streaming heads), each with its learned-static twin, evaluated on the same prompts.
SWEEPS=${SWEEPS-"pool400|--router-input pooled --multiplier-lr $MLR --pool 400;mlr1e-2|--router-input pooled --multiplier-lr 1e-2;mlr1e-2static|--router-input head-identity --multiplier-lr 1e-2;tauexp|--router-input pooled --multiplier-lr $MLR --tau-schedule exp;tauexpstatic|--router-input head-identity --multiplier-lr $MLR --tau-schedule exp;len4k|--router-input pooled --multiplier-lr $MLR --builtin-len 1024,2048,4096 --max-len 4160 --steps 250;len4kstatic|--router-input head-identity --multiplier-lr $MLR --builtin-len 1024,2048,4096 --max-len 4160 --steps 250;targets|--router-input pooled --multiplier-lr 1e-2 --target retrieval=0.5 --target qa=0.5;targetsstatic|--router-input head-identity --multiplier-lr 1e-2 --target retrieval=0.5 --target qa=0.5;\
faxa|--router-input pooled --multiplier-lr $MLR --config fa-xa;faxastatic|--router-input head-identity --multiplier-lr $MLR --config fa-xa;\
xassa|--router-input pooled --multiplier-lr $MLR --config xa-ssa;xassastatic|--router-input head-identity --multiplier-lr $MLR --config xa-ssa"}
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
n_items() { echo "$1" | tr ',' '\n' | grep -c .; }  # entries of a comma list
NT=$(n_items "$TASKS")
NL=$(n_items "$LENGTHS")
WANT=$(( NT * NL * SAMPLES ))  # samples of one method's folder at LENGTHS
# Every folder given ($2...) has all its samples ($1 of them; one method per folder).
done_all() {
  local want=$1 d; shift
  for d in "$@"; do
    [ -f "$d/results.jsonl" ] && [ "$(grep -c . "$d/results.jsonl")" -ge "$want" ] || return 1
  done
}

# 1-2. The task probe at the first eval length, beside the main routers, all in parallel. A router is trained to a
# .tmp file and renamed when done, so a call cut mid-training retrains it next call rather than keeping half of it.
L0=${LENGTHS%%,*}
# A command's time limit: what the call has left minus a margin, at least 1 s (timeout 0 would mean no limit).
limit() { local t=$(( $(left) - $1 )); echo $(( t > 1 ? t : 1 )); }
probe_at() {  # $1 = length; writes $X/heads_task_$1.json
  [ -s $X/heads_task_$1.json ] && return 0
  timeout "$(limit 60)" $C/elastic probe -m "$M" --device "$DEVICE" --task niah_single_2 --prompts "$PROBE_PROMPTS" -c "$1" --haystack "$HAY" \
    --seed 7 -o $X/heads_task_$1.json.tmp > $X/probe_$1.log 2>&1 && mv $X/heads_task_$1.json.tmp $X/heads_task_$1.json
}
train() {  # $1 = name, rest = train-router flags beyond the shared ones
  local name=$1; shift
  [ -s $X/$name.safetensors ] && return 0
  local maxlen=(--max-len "$MAXLEN") steps=(--steps "$STEPS")
  [[ " $* " == *" --max-len "* ]] && maxlen=()  # the sweep sets its own
  [[ " $* " == *" --steps "* ]] && steps=()
  timeout "$(limit 45)" $C/elastic train-router -m "$M" --device "$DEVICE" "${steps[@]}" --batch "$BATCH" \
    "${maxlen[@]}" --builtin-samples 800 $SPARSE --lr "$LR" "$@" -o $X/$name.safetensors.tmp \
    --log $X/train_$name.jsonl -t 2 > $X/train_$name.log 2>&1 && mv $X/$name.safetensors.tmp $X/$name.safetensors
}
main_ok() { [ "$MAIN" = 0 ] && return 0; local s; for s in $SEEDS; do [ -s $X/adaptive_s$s.safetensors ] && [ -s $X/static_s$s.safetensors ] || return 1; done; }
# 0. Take up an earlier run's finished folders (RESTORE): a sample already in a folder is not run again.
if [ -n "$RESTORE" ] && [ ! -f $X/restored ]; then
  log "restoring $RESTORE"
  tar xzf "$RESTORE/train_logs.tgz" -C . .ctl/heads_task_$L0.json .ctl/omega_matched.txt || exit 1
  # The LONG phase's probe and matched Omega too, where that run got to them (else they are made here).
  tar xzf "$RESTORE/train_logs.tgz" -C . --wildcards '.ctl/heads_task_*.json' '.ctl/omega_matched_*.txt' 2>/dev/null
  python3 - "$RESTORE/results.jsonl.gz" $X "$L0" <<'EOF2' || exit 1
import gzip, json, os, sys
out = {}
for l in gzip.open(sys.argv[1], "rt"):
    r = json.loads(l)
    tag = r["method"]
    if str(r["length"]) != sys.argv[3]:
        tag = f"L{r['length']}_{tag}"  # as phase 6 names its folders
    r["method"] = r.pop("eval_method")  # as eval wrote it
    out.setdefault(tag, []).append(json.dumps(r, sort_keys=True) + "\n")
for tag, rows in out.items():
    os.makedirs(f"{sys.argv[2]}/eval_{tag}", exist_ok=True)
    open(f"{sys.argv[2]}/eval_{tag}/results.jsonl", "w").writelines(rows)
print(f"restored {sum(map(len, out.values()))} samples in {len(out)} folders")
EOF2
  touch $X/restored
fi

# 0b. Every GPU test with the transformers fixtures (validation of code not yet run on a GPU), in the background from
# the start: a 135M model's trainings and evals leave the GPU far from busy, and the suite takes about a minute.
tests_pid=
if [ "$DEVICE" = cuda ] && [ ! -f $X/tests.ok ] && [ -z "${SKIP_TESTS:-}" ]; then
  log "GPU tests (background)"
  (
    python3 scripts/make_fixtures.py --only qwen3_gpu,llama_gpu --out $X/fixtures > $X/fixtures.log 2>&1
    ELASTIC_GPU_FIXTURES=$X/fixtures timeout 300 $C/elastic_gpu_tests > $X/tests.full 2>&1
    rc=$?  # gtest prints "[  PASSED  ] N tests." even when others failed: the exit status decides
    { tail -n 3 $X/fixtures.log; grep -E "^\[  FAILED  \]" $X/tests.full; tail -n 30 $X/tests.full; } > $X/tests.log
    [ $rc -eq 0 ] && touch $X/tests.ok
  ) & tests_pid=$!
fi

# The sweep routers train in the background while the evals run. A training cannot resume, so they start only when
# the call has SWEEP_START seconds left (else the next call starts them first thing).
sweep_pids=()
start_sweeps() {
  [ "$(left)" -gt "$SWEEP_START" ] || return 0
  IFS=';' read -ra SW <<< "$SWEEPS"
  for spec in "${SW[@]}"; do
    [ -n "$spec" ] || continue
    done_all "$WANT" "$X/eval_sweep_${spec%%|*}" && continue  # evaluated already (a restored run): no router needed
    [ -s $X/sweep_${spec%%|*}.safetensors ] && continue
    train "sweep_${spec%%|*}" --seed 1 ${spec#*|} & sweep_pids+=($!)
  done
}
[ "$MAIN" = 0 ] && start_sweeps  # no main routers to wait for: the sweeps train beside the probes

if ! main_ok || [ ! -s $X/heads_task_$L0.json ] || { [ -n "$LONG" ] && [ ! -s $X/heads_task_$LONG.json ]; }; then
  log "probes and the main routers, in parallel"
  pids=()
  probe_at "$L0" & pids+=($!)
  [ -z "$LONG" ] || { probe_at "$LONG" & pids+=($!); }
  [ "$MAIN" = 0 ] || for s in $SEEDS; do
    train adaptive_s$s --seed "$s" --router-input pooled --multiplier-lr "$MLR" & pids+=($!)
    train static_s$s --seed "$s" --router-input head-identity --multiplier-lr "$MLR" & pids+=($!)
  done
  for p in "${pids[@]}"; do wait $p; done
  log "trained"; for f in $X/train_*.log; do echo "$f: $(grep -E '^step' "$f" | tail -n 1 | tr '\r' ' ' | cut -c1-200)"; done
fi
main_ok || { log "main routers not done; the next call goes on"; }

[ "$MAIN" = 0 ] || { main_ok && start_sweeps; }

# One eval process per method; each its own folder (they share nothing but the GPU). $1 = folder, $2 = lengths, rest =
# eval flags.
run_eval() {
  local dir=$1 lengths=$2; shift 2
  sanitize "$dir"
  timeout "$(limit 20)" $C/elastic eval -m "$M" --device "$DEVICE" --tasks "$EVAL_TASKS" --lengths "$lengths" \
    --samples "$SAMPLES" --seed 3 $SPARSE --haystack "$HAY" --code-corpus src/model -t 2 -o "$dir" "$@" \
    > "$dir.log" 2>&1
  sanitize "$dir"
}
phase() {  # $1 = folder prefix, $2 = lengths, then "name|eval flags" specs, run in parallel
  local pre=$1 lengths=$2 pids=() spec; shift 2
  for spec in "$@"; do
    run_eval "$X/eval_$pre${spec%%|*}" "$lengths" ${spec#*|} &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait $p; done
}
EVAL_TASKS=$TASKS  # phase 6 sets TASKS_LONG
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
dirs_of() { local pre=$1 spec; shift; for spec in "$@"; do echo "$X/eval_$pre${spec%%|*}"; done; }
# Runs a phase unless done or out of time. $1 = prefix, $2 = lengths, $3 = samples wanted per folder, rest = specs.
run_phase() {
  local pre=$1 lengths=$2 want=$3; shift 3
  done_all "$want" $(dirs_of "$pre" "$@") && return 0
  [ "$(left)" -gt 90 ] || return 1
  log "eval $pre${1%%|*}... ($# processes, lengths $lengths)"; phase "$pre" "$lengths" "$@"; log "ended"
  done_all "$want" $(dirs_of "$pre" "$@")
}
# Mean Omega_MSR of the adaptive routers' samples in folders matching $1 (measured once, then kept in $2, so the
# control folders never mix two Omegas).
measure_omega() {
  [ -s "$2" ] || cat $1 | python3 -c '
import json, sys
v = [json.loads(l)["msr"] for l in sys.stdin if l.strip() and json.loads(l)["method"].startswith("router-")]
print(f"{sum(v) / len(v):.3f}")' > "$2"
  cat "$2"
}

# 3. Phase 1: full and the routers.
P1=("full|--methods full")
for s in $SEEDS; do
  P1+=("adaptive_s$s|--methods none --router $X/adaptive_s$s.safetensors")
  P1+=("static_s$s|--methods none --router $X/static_s$s.safetensors")
done
main_ok && run_phase "" "$LENGTHS" "$WANT" "${P1[@]}" && {
  # 4. Phase 2 at the adaptive routers' mean Omega_MSR over phase 1's samples.
  OMEGA=$(measure_omega "$X/eval_adaptive_s*/results.jsonl" $X/omega_matched.txt)
  log "matched Omega_MSR $OMEGA"
  cp docs/results/smollm2_gpu/heads_1024.json $X/heads_classic.json
  P2=("ssa|--methods ssa" "static_task|--methods static@$OMEGA --scores $X/heads_task_$L0.json"
      "static_classic|--methods static@$OMEGA --scores $X/heads_classic.json")
  for r in $(seq 1 "$RANDOM_DRAWS"); do P2+=("random_$r|--methods random@$OMEGA:$r"); done
  run_phase "" "$LENGTHS" "$WANT" "${P2[@]}"
}

# 5. Held-out templates (eval --paraphrase): full, the seed-1 routers and one random draw at the same Omega, on the
# same tasks asked in other words (folders eval_para_*; rows carry templates=paraphrase).
if [ -s $X/omega_matched.txt ]; then
  OMEGA=$(cat $X/omega_matched.txt)
  s1=${SEEDS%% *}
  run_phase para_ "$LENGTHS" "$WANT" "full|--paraphrase --methods full" \
    "adaptive_s$s1|--paraphrase --methods none --router $X/adaptive_s$s1.safetensors" \
    "static_s$s1|--paraphrase --methods none --router $X/static_s$s1.safetensors" \
    "random_1|--paraphrase --methods random@$OMEGA:1"
fi

# 6b (below, in the background beside 6). The sweep routers at the first length, once trained.
for p in "${sweep_pids[@]}"; do wait $p; done
sweep_phase() {
  local PS=() spec n
  IFS=';' read -ra SW <<< "$SWEEPS"
  for spec in "${SW[@]}"; do
    n=sweep_${spec%%|*}
    [ -s $X/$n.safetensors ] && PS+=("$n|--methods none --router $X/$n.safetensors")
  done
  [ ${#PS[@]} -eq 0 ] || run_phase "" "$LENGTHS" "$WANT" "${PS[@]}"
}
[ -s $X/omega_matched.txt ] && { sweep_phase & sweep_eval=$!; }

# 6. A longer prompt length (TASKS_LONG there): the probe (run beside the trainings), full and the routers
# (LONG_ROUTERS), then the controls at the Omega the adaptive ones have there.
LONG_ROUTERS=${LONG_ROUTERS:-$(for s in $SEEDS; do echo -n "adaptive_s$s "; done)|$(for s in $SEEDS; do echo -n "static_s$s "; done)}
LA=(${LONG_ROUTERS%%|*}) LS=(${LONG_ROUTERS#*|})
long_ok() { local r; for r in "${LA[@]}" "${LS[@]}"; do [ -s $X/$r.safetensors ] || return 1; done; }
if [ -n "$LONG" ] && [ -s $X/omega_matched.txt ] && [ "$(left)" -gt 120 ] && long_ok; then
  EVAL_TASKS=$TASKS_LONG
  WL=$(( $(n_items "$TASKS_LONG") * SAMPLES ))
  probe_at "$LONG"
  PL=("full|--methods full")
  for r in "${LA[@]}" "${LS[@]}"; do PL+=("$r|--methods none --router $X/$r.safetensors"); done
  if run_phase "L${LONG}_" "$LONG" "$WL" "${PL[@]}"; then
    OL=$(measure_omega "$(for r in "${LA[@]}"; do echo -n "$X/eval_L${LONG}_$r/results.jsonl "; done)" $X/omega_matched_$LONG.txt)
    log "matched Omega_MSR at $LONG: $OL"
    P4=("ssa|--methods ssa" "static_task|--methods static@$OL --scores $X/heads_task_$LONG.json")
    for r in $(seq 1 "$RANDOM_DRAWS"); do P4+=("random_$r|--methods random@$OL:$r"); done
    run_phase "L${LONG}_" "$LONG" "$WL" "${P4[@]}"
  fi
  EVAL_TASKS=$TASKS
fi
[ -z "${sweep_eval:-}" ] || wait $sweep_eval

# 7. (started in 0b) the GPU tests' result.
if [ -n "${tests_pid:-}" ]; then
  wait $tests_pid
  grep -E "FAILED|PASSED|tests ran" $X/tests.log | tail -n 8
fi

for p in "${sweep_pids[@]}"; do wait $p; done  # train() stops them 45 s before the budget: time for the report

# What comes back: every finished sample, its method named after its folder (adaptive_s1, static_s2, random_3,
# static_task, ...; eval's own name kept as eval_method), the logs and the report.
python3 - $X "$O/results.jsonl.gz" <<'EOF'
import glob, gzip, json, os, sys
with gzip.open(sys.argv[2], "wt") as out:
    for d in sorted(glob.glob(sys.argv[1] + "/eval_*/")):
        tag = os.path.basename(d.rstrip("/"))[len("eval_"):]
        if tag.startswith("L") and "_" in tag and tag[1:tag.index("_")].isdigit():
            tag = tag[tag.index("_") + 1:]  # eval_L4096_full: rows carry their length
        for l in open(d + "results.jsonl"):
            try: r = json.loads(l)
            except ValueError: continue
            r["eval_method"], r["method"] = r["method"], tag  # static@<omega> of two probes would collide
            out.write(json.dumps(r, sort_keys=True) + "\n")
EOF
tar czf "$O/train_logs.tgz" $X/train_*.jsonl $X/train_*.log $X/heads_task_*.json $X/omega_matched*.txt $X/tests.log \
  $X/probe_*.log $X/eval_*.log 2>/dev/null
# Routers of another name at LONG (a sweep and its twin) take the adaptive / learned-static roles there.
ROLES=()
if [ -n "$LONG" ] && [ ${#LA[@]} -eq 1 ] && [ ${#LS[@]} -eq 1 ] && [[ ${LA[0]} != adaptive_s* ]]; then
  ROLES=(--roles "$LONG:${LA[0]}=adaptive,$LONG:${LS[0]}=learned-static")
fi
python3 scripts/controls_report.py "$O/results.jsonl.gz" --out $X/report "${ROLES[@]}" 2>&1 | tail -n 80
tar czf "$O/report.tgz" -C $X report
# The adaptive and sweep routers come back too, as F16 in one archive (the device keeps nothing; at most 8 files come
# back): the candidates to ship under routers/.
mkdir -p $X/f16
for f in $X/adaptive_s*.safetensors $X/sweep_*.safetensors; do
  [ -s "$f" ] && python3 scripts/router_f16.py "$f" "$X/f16/$(basename "$f")" > /dev/null
done
tar czf "$O/routers_f16.tgz" -C $X f16
for f in $X/eval_*/results.jsonl; do echo "$f: $(grep -c . "$f")"; done
ls -la "$O"
