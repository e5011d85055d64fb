#!/usr/bin/env bash
# GPU machine: how many concurrent long requests the GPU server holds in one KV pool (issue 26), full vs routed.
# For each routing in ROUTINGS (full, hybrid = 70% of KV heads streaming drawn with seed 7, router = an untrained
# router deciding per prompt; the same files as scripts/gpu_serve_load.sh) starts
#   elastic serve --device cuda --shape SHAPE -c CTX --parallel SLOTS --kv-budget-mib POOL_MIB
# opens CLIENTS streamed requests of PROMPT random token ids (MAXTOK tokens each, long enough that none finishes in
# the window) at once, samples /metrics every 0.5 s for WINDOW seconds (running and waiting requests, bytes reserved
# and held, pool budget) and then drops the connections (the server frees their pages on disconnect; the last sample
# after a pause checks that). Writes $OUT/capacity.jsonl (one line per sample), $OUT/capacity.md (per routing: the
# most requests running at once, bytes per request) and $OUT/capacity_logs.tgz (each server's log). Binaries from
# .gpucarry (bash scripts/gpu_carry.sh).
# Env: SHAPE (qwen3-4b), PROMPT (32000), MAXTOK (2048), CTX (PROMPT + MAXTOK), SLOTS (128), POOL_MIB (112640 = 110
#      GiB), CLIENTS (100), WINDOW (60), ROUTINGS ("full hybrid router"), ROUTER_BIAS (-0.1).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp}
SHAPE=${SHAPE:-qwen3-4b}; PROMPT=${PROMPT:-32000}; MAXTOK=${MAXTOK:-2048}; CTX=${CTX:-$((PROMPT + MAXTOK))}
SLOTS=${SLOTS:-128}; POOL_MIB=${POOL_MIB:-112640}; CLIENTS=${CLIENTS:-100}; WINDOW=${WINDOW:-60}
ROUTINGS=${ROUTINGS:-"full hybrid router"}
. scripts/gpu_serve_common.sh
: > "$O/capacity.jsonl"
port=18800
for R in $ROUTINGS; do
  RFLAG=$(routing_flags "$R")
  port=$((port + 1))
  $E serve --device cuda --shape "$SHAPE" -c "$CTX" --parallel "$SLOTS" --kv-budget-mib "$POOL_MIB" --port $port \
    --max-queue 1024 -q $RFLAG > "$W/capacity_$R.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 180); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 1; done
  echo "routing $R: $CLIENTS requests of $PROMPT tokens at once, $SLOTS slots, pool $POOL_MIB MiB"
  python3 - "$port" "$R" "$PROMPT" "$MAXTOK" "$CLIENTS" "$WINDOW" "$V" <<'PY' | tee -a "$O/capacity.jsonl"
import json, random, re, socket, sys, time, urllib.request
port, routing, prompt, maxtok, clients, window, vocab = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
url = "http://127.0.0.1:%s" % port
def metrics():
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    want = {"elastic_requests_running": "running", "elastic_requests_waiting": "waiting",
            "elastic_kv_cache_bytes": "reserved", "elastic_kv_cache_bytes_held": "held",
            "elastic_kv_cache_budget_bytes": "budget", "elastic_kv_cache_bytes_if_full": "if_full",
            "elastic_omega_msr_mean": "omega_msr_mean"}
    out = {}
    for line in text.splitlines():
        m = re.match(r"(\w+) (\S+)$", line)
        if m and m.group(1) in want:
            out[want[m.group(1)]] = float(m.group(2))
    return out
socks = []
for i in range(clients):  # raw sockets: requests stay open without a thread each, and closing them is a disconnect
    rng = random.Random(1000003 + i)
    body = json.dumps({"prompt": [rng.randrange(100, vocab) for _ in range(prompt)], "max_tokens": maxtok,
                       "temperature": 0, "stream": True, "ignore_eos": True}).encode()
    s = socket.create_connection(("127.0.0.1", int(port)))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
              % len(body) + body)
    socks.append(s)
t0 = time.time()
peak = {}
max_held = 0
while time.time() - t0 < window:
    m = metrics()
    m.update(routing=routing, t=round(time.time() - t0, 2))
    print(json.dumps(m), flush=True)
    if m.get("running", 0) >= peak.get("running", 0):
        peak = m
    max_held = max(max_held, m.get("held", 0))
    time.sleep(0.5)
for s in socks:
    s.close()
time.sleep(5)
after = metrics()
print(json.dumps(dict(routing=routing, summary=True, clients=clients, prompt=prompt, peak_running=peak.get("running"),
                      reserved_at_peak=peak.get("reserved"), held_at_peak=peak.get("held"), max_held=max_held, budget=peak.get("budget"),
                      if_full_at_peak=peak.get("if_full"), running_after_disconnect=after.get("running"),
                      held_after_disconnect=after.get("held"))), flush=True)
PY
  kill $pid; wait $pid 2>/dev/null
done
tar -czf "$O/capacity_logs.tgz" -C "$W" $(cd "$W" && ls *.log)
python3 - "$O/capacity.jsonl" "$O/capacity.md" "$PROMPT" "$MAXTOK" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
out = ["| routing | most requests running at once | reserved per request, MiB | most held in the window, GiB | pool, GiB "
       "| all-full bytes of those requests, GiB | running / held 5 s after the clients left |", "|---|---|---|---|---|---|---|"]
for r in rows:
    if not r.get("summary"):
        continue
    n = r["peak_running"] or 0
    out.append("| %s | %d | %.0f | %.1f | %.1f | %.1f | %d / %.2f GiB |" % (
        r["routing"], n, (r["reserved_at_peak"] or 0) / max(n, 1) / 2**20, (r["max_held"] or 0) / 2**30,
        (r["budget"] or 0) / 2**30, (r["if_full_at_peak"] or 0) / 2**30, r["running_after_disconnect"] or 0,
        (r["held_after_disconnect"] or 0) / 2**30))
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
