#!/usr/bin/env python3
"""Paired comparison of eval runs: mean score per (method, task) over the samples every run has in common (the same
sample index means the same prompt for a given --seed), plus mean Omega_MSR. Reads results.jsonl or .jsonl.gz files;
a method name gets the file's label as suffix when given as LABEL=PATH. Prints a Markdown table.
Usage: compare_eval.py [--length 1024] [--samples 10] [--tasks a,b] [LABEL=]results.jsonl[.gz] ..."""
import argparse
import collections
import gzip
import json


def load(path):
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--tasks", default="")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    cells = collections.defaultdict(dict)  # (method, task) -> sample -> (score, msr)
    for spec in a.files:
        label, path = spec.split("=", 1) if "=" in spec else ("", spec)
        for r in load(path):
            if r["length"] != a.length or r["sample"] >= a.samples:
                continue
            m = r["method"] + (f" ({label})" if label else "")
            cells[(m, r["task"])][r["sample"]] = (r["score"], r["msr"])
    tasks = a.tasks.split(",") if a.tasks else sorted({t for _, t in cells})
    methods = sorted({m for m, _ in cells})
    # Only tasks every method has all samples of, so every mean is over the same prompts.
    tasks = [t for t in tasks if all(len(cells.get((m, t), {})) == a.samples for m in methods)]
    print("| method | Omega_MSR | " + " | ".join(tasks) + " | mean |")
    print("|---|---:|" + "---:|" * (len(tasks) + 1))
    rows = []
    for m in methods:
        scores = [sum(s for s, _ in cells[(m, t)].values()) / a.samples for t in tasks]
        msr = sum(x for t in tasks for _, x in cells[(m, t)].values()) / (a.samples * len(tasks))
        rows.append((msr, m, scores))
    for msr, m, scores in sorted(rows):
        print(f"| {m} | {msr:.3f} | " + " | ".join(f"{s:.1f}" for s in scores) + f" | {sum(scores) / len(scores):.1f} |")
    print(f"\n{a.samples} samples per cell at {a.length} tokens; tasks: {', '.join(tasks)}")


if __name__ == "__main__":
    main()
