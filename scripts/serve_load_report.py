#!/usr/bin/env python3
"""Plots of scripts/gpu_serve_load.sh's results: per prompt length, requests/s and output tokens/s against concurrent
clients, one series per (routing, --parallel), drawn by `elastic plot` (SVG). Also writes the CSVs it plots.

  python3 scripts/serve_load_report.py serve_load.jsonl [more.jsonl ...] --out DIR [--elastic build/elastic]
"""
import argparse
import collections
import json
import os
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("jsonl", nargs="+")
    ap.add_argument("--out", required=True, help="folder for serve_<metric>_<prompt>.csv and .svg")
    ap.add_argument("--elastic", default="build/elastic")
    args = ap.parse_args()
    rows = []
    for path in args.jsonl:
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    if not rows:
        sys.exit("serve_load_report: no rows in " + ", ".join(args.jsonl))
    os.makedirs(args.out, exist_ok=True)
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


if __name__ == "__main__":
    main()
