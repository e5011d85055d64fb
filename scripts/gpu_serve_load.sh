#!/usr/bin/env bash
# GPU machine: the continuous-batching GPU server under load (issue 26), random weights of a named shape. For each
# routing in ROUTINGS (full; hybrid: 70% of KV heads streaming, drawn with a fixed seed; ssa: all streaming; router:
# an untrained router (elastic route init, seed 7, dense bias ROUTER_BIAS) decides each request's heads from its own
# prompt; sink 128 + window 2048, block 128) and each --parallel P in PARALLEL (1 is the one-request-at-a-time server, the anchor in
# the same call), starts
#   elastic serve --device cuda --shape SHAPE -c CTX --parallel P [--routing ...] [--kv-budget-mib POOL_MIB]
# and runs scripts/load_test.py for each prompt length in PROMPTS and concurrency in CONC (streamed, random token-id
# prompts, MAXTOK tokens each). Writes $OUT/serve_load.jsonl (one line per run), $OUT/serve_load.md and
# $OUT/serve_logs.tgz (each server's stderr, serve_<routing>_p<P>.log, and its last metrics). Binaries from .gpucarry (bash scripts/gpu_carry.sh).
# Env: SHAPE (qwen3-4b), PROMPTS ("4000 8000 32000"; PROMPT=N is one), CTX (the longest prompt + MAXTOK),
#      MAXTOK (64), PARALLEL ("1 16"), CONC ("1 4 16 64"), ROUTINGS ("full hybrid ssa"),
#      POOL_MIB (unset: --parallel x every head full at CTX), SECONDS_PER_RUN (60), ROUTER_BIAS (-0.1),
#      APPEND (set: keep serve_load.jsonl's earlier rows; the table covers them all), TAG (serve_logs_TAG.tgz).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp}
SHAPE=${SHAPE:-qwen3-4b}; PROMPTS=${PROMPTS:-${PROMPT:-"4000 8000 32000"}}; MAXTOK=${MAXTOK:-64}
longest=$(for x in $PROMPTS; do echo "$x"; done | sort -n | tail -1)
CTX=${CTX:-$((longest + MAXTOK))}
PARALLEL=${PARALLEL:-"1 16"}; CONC=${CONC:-"1 4 16 64"}; ROUTINGS=${ROUTINGS:-"full hybrid ssa"}
SECS=${SECONDS_PER_RUN:-60}
. scripts/gpu_serve_common.sh
[ -n "${APPEND:-}" ] || : > "$O/serve_load.jsonl"  # APPEND=1: add to an earlier invocation's rows
port=18700
for R in $ROUTINGS; do
  RFLAG=$(routing_flags "$R")
  for P in $PARALLEL; do
    port=$((port + 1))
    POOL=${POOL_MIB:+--kv-budget-mib $POOL_MIB}
    $E serve --device cuda --shape "$SHAPE" -c "$CTX" --parallel "$P" --port $port --max-queue 1024 -q $RFLAG $POOL \
      > "$W/serve_${R}_p$P.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 120); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 1; done
    for PROMPT in $PROMPTS; do
    for C in $CONC; do
      N=$((C * 3 > 8 ? C * 3 : 8))
      echo "routing $R, --parallel $P, prompts of $PROMPT, concurrency $C: $N requests"
      curl -s "http://127.0.0.1:$port/metrics" > "$W/m_before.txt"
      python3 scripts/load_test.py --url "http://127.0.0.1:$port" --requests "$N" --concurrency "$C" \
        --max-tokens "$MAXTOK" --stream --prompt-tokens "$PROMPT" --vocab "$V" --seconds "$SECS" --json \
        > "$W/run.json"
      curl -s "http://127.0.0.1:$port/metrics" > "$W/m_after.txt"
      # Token-id prompts without a tokenizer stream no text, so the client sees no per-token events: TTFT and
      # inter-token latency come from the server's histograms over this run (quantiles interpolated in buckets).
      python3 - "$W/run.json" "$W/m_before.txt" "$W/m_after.txt" "$R" "$P" <<'PY' | tee -a "$O/serve_load.jsonl"
import json, re, sys
run = json.load(open(sys.argv[1]))
def hist(path, name):
    h = {}
    for line in open(path):
        m = re.match(r'%s_bucket\{le="([^"]+)"\} (\S+)' % name, line)
        if m:
            h[float("inf") if m.group(1) == "+Inf" else float(m.group(1))] = float(m.group(2))
    return h
def quantile(before, after, q):
    bounds = sorted(after)
    cum = [after[b] - before.get(b, 0.0) for b in bounds]
    total = cum[-1] if cum else 0
    if total <= 0:
        return float("nan")
    want, lo, prev = q * total, 0.0, 0.0
    for b, c in zip(bounds, cum):
        if c >= want:
            if b == float("inf"):
                return lo
            return lo + (b - lo) * (want - prev) / max(c - prev, 1e-12)
        lo, prev = b, c
    return lo
for key, name in (("server_ttft", "elastic_time_to_first_token_seconds"), ("server_itl", "elastic_inter_token_latency_seconds")):
    b, a = hist(sys.argv[2], name), hist(sys.argv[3], name)
    run[key + "_p50"], run[key + "_p99"] = quantile(b, a, 0.5), quantile(b, a, 0.99)
run.update(routing=sys.argv[4], parallel=int(sys.argv[5]))
print(json.dumps(run))
PY
    done
    done
    curl -s "http://127.0.0.1:$port/metrics" | grep -E "^elastic_(kv_cache|decode|requests_running)" > "$W/metrics_${R}_p$P.txt"
    kill $pid; wait $pid 2>/dev/null
    rm -f "$W/m_before.txt" "$W/m_after.txt" "$W/run.json"
  done
done
# The servers' logs and last metrics in one archive (the device tool brings back 8 files a call).
tar -czf "$O/serve_logs${TAG:+_$TAG}.tgz" -C "$W" $(cd "$W" && ls *.log *.txt 2>/dev/null)
python3 - "$O/serve_load.jsonl" "$O/serve_load.md" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
out = ["| prompt | routing | --parallel | clients | ok/sent | requests/s | output tok/s | latency p50 / p99 s | "
       "TTFT p50 / p99 s (server) | inter-token p50 / p99 ms (server) | Omega_MSR mean (min-max) | KV MiB per request "
       "(all full) |",
       "|---|---|---|---|---|---|---|---|---|---|---|---|"]
for r in rows:
    out.append("| %d | %s | %d | %d | %d/%d | %.2f | %.1f | %.2f / %.2f | %.2f / %.2f | %.1f / %.1f | %.3f (%.3f-%.3f) | "
               "%.0f (%.0f) |" % (
        r["prompt_tokens"], r["routing"], r["parallel"], r["concurrency"], r["ok"], r["sent"], r["requests_per_s"],
        r["completion_tokens_per_s"], r["latency_p50"], r["latency_p99"], r["server_ttft_p50"],
        r["server_ttft_p99"], 1e3 * r["server_itl_p50"], 1e3 * r["server_itl_p99"], r.get("omega_msr_mean", float("nan")),
        r.get("omega_msr_min", float("nan")), r.get("omega_msr_max", float("nan")),
        r.get("kv_bytes_mean", float("nan")) / 2**20, r.get("kv_bytes_if_full_mean", float("nan")) / 2**20))
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
