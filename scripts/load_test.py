#!/usr/bin/env python3
"""Load test for `elastic serve` (standard library only).

Sends up to --requests completion requests from --concurrency threads, stops early after --seconds, and prints
requests/s, tokens/s and latency percentiles (p50/p90/p99). With --stream it reads SSE streams and also reports
time to first token. Exits non-zero when any request failed.

  python3 scripts/load_test.py --url http://127.0.0.1:8080 --requests 64 --concurrency 8 --max-tokens 32
"""
import argparse
import json
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
    """Returns (ok, latency_s, ttft_s or None, completion_tokens, error text)."""
    body = {
        "prompt": args.prompt + " " + str(i),
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "stream": args.stream,
    }
    if args.chat:
        body["messages"] = [{"role": "user", "content": body.pop("prompt")}]
    path = "/v1/chat/completions" if args.chat else "/v1/completions"
    req = urllib.request.Request(args.url.rstrip("/") + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft = None
    tokens = 0
    try:
        with urllib.request.urlopen(req, timeout=args.timeout) as r:
            if not args.stream:
                out = json.loads(r.read())
                tokens = out.get("usage", {}).get("completion_tokens", 0)
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
                        return False, time.perf_counter() - t0, None, 0, ev["error"].get("message", "error")
                    ch = (ev.get("choices") or [{}])[0]
                    if ttft is None and (ch.get("text") or (ch.get("delta") or {}).get("content")):
                        ttft = time.perf_counter() - t0  # first text, not the opening role chunk
                    if "usage" in ev:
                        tokens = ev["usage"].get("completion_tokens", 0)
    except urllib.error.HTTPError as e:
        return False, time.perf_counter() - t0, None, 0, "HTTP %d: %s" % (e.code, e.read()[:200].decode("utf-8", "replace"))
    except Exception as e:  # connection refused, timeout, bad JSON
        return False, time.perf_counter() - t0, None, 0, repr(e)
    return True, time.perf_counter() - t0, ttft, tokens, ""


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
    args = ap.parse_args()
    if args.requests < 1 or args.concurrency < 1 or args.seconds <= 0:
        ap.error("--requests, --concurrency and --seconds must be positive")

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
    print("requests: %d sent, %d ok, %d failed in %.2f s" % (len(results), len(ok), len(bad), wall))
    print("throughput: %.2f requests/s, %.1f completion tokens/s" % (len(ok) / wall, toks / wall))
    print("latency s: p50 %.3f | p90 %.3f | p99 %.3f | max %.3f" % (
        percentile(lat, 50), percentile(lat, 90), percentile(lat, 99), max(lat) if lat else float("nan")))
    if ttft:
        print("time to first token s: p50 %.3f | p90 %.3f | p99 %.3f" % (
            percentile(ttft, 50), percentile(ttft, 90), percentile(ttft, 99)))
    for r in bad[:5]:
        print("failed: " + r[4], file=sys.stderr)
    return 1 if bad or not results else 0


if __name__ == "__main__":
    sys.exit(main())
