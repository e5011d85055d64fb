#!/usr/bin/env python3
"""How long running requests stall while long prompts arrive (standard library only).

One client streams a short-prompt request (--tokens tokens, ignore_eos) and records when each token arrives; after
--warmup tokens, --long clients each send a prompt of --long-tokens token ids (max_tokens 1), one after another.
Prints the streaming request's inter-token gaps (p50 / p99 / max, ms) and the long requests' latency. Run it against
`elastic serve --chunk C` for two chunk sizes in one session: a chunk as large as the prompts is the server without
interleaving (a whole prefill between two decode steps), a small one bounds the stall to one chunk's worth.

  python3 bench/server_stall.py --url http://127.0.0.1:8080 --long 4 --long-tokens 3000
"""
import argparse
import http.client
import json
import threading
import time
import urllib.parse


def post(url, body, stream=False):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    return c, c.getresponse()


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--tokens", type=int, default=300, help="tokens the streaming request generates")
    ap.add_argument("--warmup", type=int, default=20, help="its tokens before the long prompts start")
    ap.add_argument("--long", type=int, default=4, help="long-prompt requests, sent one after another")
    ap.add_argument("--long-tokens", type=int, default=3000, help="prompt length of each long request (token ids)")
    a = ap.parse_args()

    arrivals = []
    started = threading.Event()

    def streamer():
        body = {"prompt": "Once upon a time", "max_tokens": a.tokens, "ignore_eos": True, "temperature": 0,
                "stream": True}
        c, r = post(a.url, body)
        if r.status != 200:
            raise SystemExit(f"streaming request: HTTP {r.status}: {r.read()[:200]}")
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("choices") and ev["choices"][0].get("text"):
                arrivals.append(time.perf_counter())
                if len(arrivals) == a.warmup:
                    started.set()
        c.close()
        started.set()

    long_lat = []

    def longs():
        started.wait()
        for i in range(a.long):
            ids = [100 + (i * 7919 + j * 31) % 20000 for j in range(a.long_tokens)]
            t0 = time.perf_counter()
            c, r = post(a.url, {"prompt": ids, "max_tokens": 1, "temperature": 0})
            body = r.read()
            if r.status != 200:
                raise SystemExit(f"long request: HTTP {r.status}: {body[:200]}")
            long_lat.append(time.perf_counter() - t0)
            c.close()

    ts = [threading.Thread(target=streamer), threading.Thread(target=longs)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    gaps = [1e3 * (b - a_) for a_, b in zip(arrivals, arrivals[1:])]
    print(f"| stream tokens | gap p50 ms | gap p99 ms | gap max ms | long prompts | long latency mean s |")
    print(f"|---|---|---|---|---|---|")
    mean_long = sum(long_lat) / len(long_lat) if long_lat else float("nan")
    print(f"| {len(arrivals)} | {pct(gaps, 0.5):.1f} | {pct(gaps, 0.99):.1f} | {max(gaps) if gaps else float('nan'):.1f} "
          f"| {len(long_lat)} x {a.long_tokens} | {mean_long:.2f} |")


if __name__ == "__main__":
    main()
