#!/usr/bin/env bash
# Runs every command of README.md's sh blocks, so the README cannot drift from the CLI. Each command runs as written
# except for shorter settings (fewer steps, tokens and samples: the point is that it works, not its result), in a
# scratch folder that links the repository's build/, models/, tests/, routers/ and ../shared/. Skipped, and listed: the set-up
# and test scripts themselves (CI runs them), commands for a folder the reader supplies (/path/to), and --device cuda
# commands on a machine without a GPU. `serve` starts in the background for the curl that follows it.
# Usage: readme_commands.sh SOURCE_DIR ELASTIC_BIN
set -u
SRC=$(realpath "$1"); BIN=$(realpath "$2"); TMP=$(mktemp -d); fails=0; ran=0; skipped=0
trap 'kill $SERVE_PID 2>/dev/null; rm -rf "$TMP"' EXIT
SERVE_PID=
mkdir -p "$TMP/work/build"
ln -s "$BIN" "$TMP/work/build/elastic"
ln -s "$SRC/models" "$TMP/work/models"
ln -s "$SRC/tests" "$TMP/work/tests"
ln -s "$SRC/routers" "$TMP/work/routers"
ln -s "$(realpath "$SRC/../shared")" "$TMP/shared"
printf 'x,a,b\n1,2,3\n2,4,5\n4,8,7\n' > "$TMP/work/results.csv"  # the plot example's "any CSV"
cd "$TMP/work"
if [ ! -f models/SmolLM2-135M-Instruct.Q4_1.gguf ]; then  # scripts/setup.sh fetches it
  [ "${ELASTIC_SKIP_REAL_MODEL:-0}" = 1 ] && { echo "README commands skipped: no default model"; exit 0; }
  echo "FAIL: models/SmolLM2-135M-Instruct.Q4_1.gguf missing (bash scripts/get_smollm2.sh)"; exit 1
fi
has_gpu=0; command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && has_gpu=1

# The sh blocks, one command per entry (backslash continuations joined, comments dropped).
mapfile -t cmds < <(awk '/^```sh/{f=1;next} /^```/{f=0} f' "$SRC/README.md" |
  sed -e 's/[[:space:]]#[^"'"'"']*$//' | awk '{ if (sub(/\\$/, "")) { acc = acc $0; next } print acc $0; acc = "" }' |
  sed -e 's/^[[:space:]]*//' | grep -v '^$')
[ ${#cmds[@]} -ge 10 ] || { echo "FAIL: found only ${#cmds[@]} commands in README.md"; exit 1; }

shorten() {  # the same command with short settings
  sed -E -e 's/ -n [0-9]+/ -n 4/' -e 's/--steps [0-9]+/--steps 1/' -e 's/--batch [0-9]+/--batch 1/' \
    -e 's/--max-len [0-9]+/--max-len 320/' -e 's/--samples [0-9]+/--samples 1/' -e 's/--lengths [0-9]+/--lengths 256/' \
    -e 's/--depths [0-9]+/--depths 2/' -e 's/"max_tokens":[0-9]+/"max_tokens":4/' <<<"$1"
}

for c in "${cmds[@]}"; do
  case "$c" in
    "bash scripts/"*|*"/path/to/"*) echo "skip (not run here): $c"; skipped=$((skipped+1)); continue ;;
    *"--device cuda"*) if [ $has_gpu = 0 ]; then echo "skip (no GPU): $c"; skipped=$((skipped+1)); continue; fi ;;
  esac
  s=$(shorten "$c")
  if [[ "$s" == "build/elastic serve "* ]]; then
    s=$(sed -E 's/[[:space:]]*&?[[:space:]]*$//' <<<"$s")  # runs in the background here anyway
    if [ -n "$SERVE_PID" ]; then  # the README's previous server
      kill $SERVE_PID 2>/dev/null || { echo "FAIL: the server started before exited early:"; tail -5 "$TMP/serve.log"; fails=$((fails+1)); }
      wait $SERVE_PID 2>/dev/null
    fi
    port=$(sed -nE 's/.*--port ([0-9]+).*/\1/p' <<<"$s")
    (eval "exec $s -q") >"$TMP/serve.log" 2>&1 &  # exec: the PID is the server itself
    SERVE_PID=$!
    for _ in $(seq 1 300); do
      curl -sf "localhost:$port/health" >/dev/null 2>&1 && break
      kill -0 $SERVE_PID 2>/dev/null || break  # it exited: the curl below fails and shows its log
      sleep 0.2
    done
    ran=$((ran+1)); continue
  fi
  out=$(eval "$s" 2>&1); rc=$?
  ran=$((ran+1))
  if [[ "$s" == curl* ]] && ! grep -q '"choices"' <<<"$out"; then rc=1; fi
  if [ $rc -ne 0 ]; then
    echo "FAIL (rc=$rc): $s"; echo "$out" | tail -5
    [[ "$s" == curl* ]] && tail -5 "$TMP/serve.log"
    fails=$((fails+1))
  fi
done
echo "README commands: $ran run, $skipped skipped, $fails failed"
exit $fails
