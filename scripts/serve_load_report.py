#!/usr/bin/env python3
"""Plots of scripts/gpu_serve_load.sh's results: per prompt length, requests/s and output tokens/s against concurrent
clients, one series per (routing, --parallel), drawn by `elastic plot` (SVG). With --capacity, also
scripts/gpu_serve_capacity.sh's samples: requests running and GiB of KV held against time, one series per routing.
Writes the CSVs it plots beside the SVGs.

  python3 scripts/serve_load_report.py [serve_load.jsonl ...] [--capacity capacity.jsonl] --out DIR [--elastic E]
"""
import argparse
import collections
import json
import os
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("jsonl", nargs="*")
    ap.add_argument("--capacity", help="capacity.jsonl of scripts/gpu_serve_capacity.sh")
    ap.add_argument("--out", required=True, help="folder for serve_<metric>_<prompt>.csv and .svg")
    ap.add_argument("--elastic", default="build/elastic")
    args = ap.parse_args()
    rows = []
    for path in args.jsonl:
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    if not rows and not args.capacity:
        sys.exit("serve_load_report: give serve_load.jsonl files or --capacity")
    os.makedirs(args.out, exist_ok=True)
    if args.capacity:
        capacity_plots(args.capacity, args.out, args.elastic)
    # A later row of the same (prompt, routing, parallel, clients) replaces an earlier one (a rerun).
    cell = {}
    for r in rows:
        cell[(r["prompt_tokens"], r["routing"], r["parallel"], r["concurrency"])] = r
    by_prompt = collections.defaultdict(dict)
    for (prompt, routing, parallel, clients), r in cell.items():
        by_prompt[prompt].setdefault("%s, --parallel %d" % (routing, parallel), {})[clients] = r
    for prompt, series in sorted(by_prompt.items()):
        names = sorted(series)
        xs = sorted({c for s in series.values() for c in s})
        for metric, label in (("requests_per_s", "requests/s"), ("completion_tokens_per_s", "output tokens/s")):
            base = os.path.join(args.out, "serve_%s_%d" % (metric, prompt))
            with open(base + ".csv", "w") as f:
                f.write("clients," + ",".join(n.replace(",", ";") for n in names) + "\n")
                for x in xs:
                    f.write("%d,%s\n" % (x, ",".join(
                        ("%.4g" % series[n][x][metric]) if x in series[n] else "" for n in names)))
            maxtok = sorted({r["max_tokens"] for s in series.values() for r in s.values()})
            title = "GPU server, %d-token prompts, %s output tokens: %s" % (
                prompt, "/".join(map(str, maxtok)), label)
            subprocess.run([args.elastic, "plot", base + ".csv", "-o", base + ".svg", "--title", title,
                            "--x-label", "concurrent clients", "--y-label", label, "--log2-x"], check=True)


def capacity_plots(path, out, elastic):
    samples = collections.defaultdict(dict)  # routing -> {t rounded to 0.5 s: sample}
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                if not r.get("summary"):
                    samples[r["routing"]][round(r["t"] * 2) / 2] = r
    if not samples:
        sys.exit("serve_load_report: no samples in " + path)
    names = list(samples)
    ts = sorted({t for s in samples.values() for t in s})
    for key, label, scale in (("running", "requests running", 1.0), ("held", "KV held, GiB", 2.0 ** -30)):
        base = os.path.join(out, "capacity_%s" % key)
        with open(base + ".csv", "w") as f:
            f.write("seconds," + ",".join(names) + "\n")
            for t in ts:
                f.write("%g,%s\n" % (t, ",".join(("%.4g" % (samples[n][t].get(key, 0) * scale))
                                                   if t in samples[n] else "" for n in names)))
        subprocess.run([elastic, "plot", base + ".csv", "-o", base + ".svg", "--title",
                        "GPU server, one KV pool, long requests arriving at once: " + label,
                        "--x-label", "seconds since the requests were sent", "--y-label", label], check=True)


if __name__ == "__main__":
    main()
