#!/usr/bin/env python3
"""Load test for `elastic serve` (standard library only).

Sends up to --requests completion requests from --concurrency threads, stops early after --seconds, and prints
requests/s, tokens/s and latency percentiles (p50/p90/p99). With --stream it reads SSE streams and also reports
time to first token and the gaps between streamed tokens (inter-token latency). --prompt-tokens N sends prompts of N
random token ids (seeded, one prompt per request: long prompts without a text file); --json prints one JSON object
with every figure instead. Exits non-zero when any request failed.

  python3 scripts/load_test.py --url http://127.0.0.1:8080 --requests 64 --concurrency 8 --max-tokens 32
"""
import argparse
import json
import random
import sys
import threading
import time
import urllib.error
import urllib.request


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def one_request(args, i):
    """Returns (ok, latency_s, ttft_s or None, completion_tokens, error text, inter-token gaps, the response's
    elastic object or None)."""
    if args.prompt_tokens:
        rng = random.Random(args.seed * 1000003 + i)
        prompt = [rng.randrange(args.id_low, args.vocab) for _ in range(args.prompt_tokens)]
    else:
        prompt = args.prompt + " " + str(i)
    body = {
        "prompt": prompt,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "stream": args.stream,
    }
    if args.chat and not args.prompt_tokens:
        body["messages"] = [{"role": "user", "content": body.pop("prompt")}]
    path = "/v1/chat/completions" if args.chat else "/v1/completions"
    req = urllib.request.Request(args.url.rstrip("/") + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft = None
    tokens = 0
    gaps = []
    last = None
    elastic = None
    try:
        with urllib.request.urlopen(req, timeout=args.timeout) as r:
            if not args.stream:
                out = json.loads(r.read())
                tokens = out.get("usage", {}).get("completion_tokens", 0)
                elastic = out.get("elastic")
            else:
                for raw in r:
                    line = raw.decode("utf-8", "replace").strip()
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        break
                    ev = json.loads(data)
                    if "error" in ev:
                        return False, time.perf_counter() - t0, None, 0, ev["error"].get("message", "error"), [], None
                    ch = (ev.get("choices") or [{}])[0]
                    if "text" in ch or (ch.get("delta") or {}).get("content") is not None:
                        now = time.perf_counter()
                        if ttft is None:
                            ttft = now - t0  # first token event, not the opening role chunk
                        else:
                            gaps.append(now - last)
                        last = now
                    if "usage" in ev:
                        tokens = ev["usage"].get("completion_tokens", 0)
                    if "elastic" in ev:
                        elastic = ev["elastic"]
    except urllib.error.HTTPError as e:
        return False, time.perf_counter() - t0, None, 0, "HTTP %d: %s" % (e.code, e.read()[:200].decode("utf-8", "replace")), [], None
    except Exception as e:  # connection refused, timeout, bad JSON
        return False, time.perf_counter() - t0, None, 0, repr(e), [], None
    return True, time.perf_counter() - t0, ttft, tokens, "", gaps, elastic


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--requests", type=int, default=32, help="total requests (upper bound)")
    ap.add_argument("--seconds", type=float, default=60.0, help="stop sending new requests after this long")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--prompt", default="Write a short note about long-context attention.")
    ap.add_argument("--chat", action="store_true", help="use /v1/chat/completions")
    ap.add_argument("--stream", action="store_true", help="stream (SSE) and report time to first token")
    ap.add_argument("--timeout", type=float, default=300.0, help="per-request timeout, seconds")
    ap.add_argument("--prompt-tokens", type=int, default=0, help="prompts of this many random token ids")
    ap.add_argument("--vocab", type=int, default=49152, help="token ids are drawn below this (the model's vocabulary)")
    ap.add_argument("--id-low", type=int, default=100, help="and at or above this (past the special tokens)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = ap.parse_args()
    if args.requests < 1 or args.concurrency < 1 or args.seconds <= 0:
        ap.error("--requests, --concurrency and --seconds must be positive")
    if args.prompt_tokens < 0 or (args.prompt_tokens and not 0 <= args.id_low < args.vocab):
        ap.error("--prompt-tokens must be >= 0 and --id-low below --vocab")

    lock = threading.Lock()
    next_i = [0]
    results = []
    t_start = time.perf_counter()
    deadline = t_start + args.seconds

    def worker():
        while True:
            with lock:
                if next_i[0] >= args.requests or time.perf_counter() >= deadline:
                    return
                i = next_i[0]
                next_i[0] += 1
            r = one_request(args, i)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(args.concurrency, args.requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t_start

    ok = [r for r in results if r[0]]
    bad = [r for r in results if not r[0]]
    lat = [r[1] for r in ok]
    ttft = [r[2] for r in ok if r[2] is not None]
    toks = sum(r[3] for r in ok)
    itl = [g for r in ok for g in r[5]]
    # What each request's routing decided and held (the server's elastic object): Omega_MSR and KV bytes against
    # the same request with every head full.
    el = [r[6] for r in ok if r[6]]
    msr = [e.get("omega_msr", float("nan")) for e in el]
    kv = [e.get("kv_cache_bytes", 0) for e in el]
    kv_full = [e.get("kv_cache_bytes_if_full", 0) for e in el]
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
    if args.json:
        print(json.dumps({
            "sent": len(results), "ok": len(ok), "failed": len(bad), "wall_s": wall,
            "requests_per_s": len(ok) / wall, "completion_tokens_per_s": toks / wall,
            "concurrency": args.concurrency, "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
            "latency_p50": percentile(lat, 50), "latency_p99": percentile(lat, 99),
            "ttft_p50": percentile(ttft, 50), "ttft_p99": percentile(ttft, 99),
            "itl_p50": percentile(itl, 50), "itl_p99": percentile(itl, 99),
            "omega_msr_mean": mean(msr), "omega_msr_min": min(msr) if msr else float("nan"),
            "omega_msr_max": max(msr) if msr else float("nan"), "distinct_omega_msr": len(set(msr)),
            "kv_bytes_mean": mean(kv), "kv_bytes_if_full_mean": mean(kv_full),
            "errors": [r[4] for r in bad[:5]]}))
        return 1 if bad or not results else 0
    print("requests: %d sent, %d ok, %d failed in %.2f s" % (len(results), len(ok), len(bad), wall))
    print("throughput: %.2f requests/s, %.1f completion tokens/s" % (len(ok) / wall, toks / wall))
    print("latency s: p50 %.3f | p90 %.3f | p99 %.3f | max %.3f" % (
        percentile(lat, 50), percentile(lat, 90), percentile(lat, 99), max(lat) if lat else float("nan")))
    if ttft:
        print("time to first token s: p50 %.3f | p90 %.3f | p99 %.3f" % (
            percentile(ttft, 50), percentile(ttft, 90), percentile(ttft, 99)))
    if itl:
        print("inter-token latency s: p50 %.4f | p90 %.4f | p99 %.4f" % (
            percentile(itl, 50), percentile(itl, 90), percentile(itl, 99)))
    if el:
        print("routing: Omega_MSR mean %.3f (min %.3f, max %.3f, %d distinct) | KV held %.1f MiB per request, %.1f "
              "if every head were full" % (mean(msr), min(msr), max(msr), len(set(msr)), mean(kv) / 2**20,
                                           mean(kv_full) / 2**20))
    for r in bad[:5]:
        print("failed: " + r[4], file=sys.stderr)
    return 1 if bad or not results else 0


if __name__ == "__main__":
    sys.exit(main())
