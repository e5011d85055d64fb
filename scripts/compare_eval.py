#!/usr/bin/env python3
"""Paired comparison of eval runs: mean score per (method, task) over the samples every run has in common (the same
sample index means the same prompt for a given --seed), plus mean Omega_MSR. Reads results.jsonl or .jsonl.gz files;
a method name gets the file's label as suffix when given as LABEL=PATH. Prints a Markdown table.
With --against METHOD it also prints each method's paired difference to METHOD (mean +- standard error over the
(task, sample) pairs both have) and its Omega_MSR on the sensitive (retrieval, qa, ...) and robust task classes.
Usage: compare_eval.py [--length 1024] [--samples 10] [--tasks a,b] [--against full] [LABEL=]results.jsonl[.gz] ..."""
import argparse
import collections
import gzip
import json
import math
import statistics

ROBUST = {"summarization", "continuation", "code", "icl"}  # target Omega 1.0 in training; the rest 0.7


def load(path):
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--length", default="1024", help="prompt length, or a comma list (cells pool the lengths)")
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--tasks", default="")
    ap.add_argument("--against", default="", help="reference method for paired differences, e.g. full")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    lengths = [int(x) for x in a.length.split(",")]
    per_cell = a.samples * len(lengths)
    cells = collections.defaultdict(dict)  # (method, task) -> sample -> (score, msr)
    classes = {}  # task -> task class
    for spec in a.files:
        label, path = spec.split("=", 1) if "=" in spec else ("", spec)
        for r in load(path):
            if r["length"] not in lengths or r["sample"] >= a.samples:
                continue
            m = r["method"] + (f" ({label})" if label else "")
            cells[(m, r["task"])][(r["length"], r["sample"])] = (r["score"], r["msr"])
            classes[r["task"]] = r.get("class", r.get("task_class", ""))
    tasks = a.tasks.split(",") if a.tasks else sorted({t for _, t in cells})
    methods = sorted({m for m, _ in cells})
    # Only tasks every method has all samples of, so every mean is over the same prompts.
    tasks = [t for t in tasks if all(len(cells.get((m, t), {})) == per_cell for m in methods)]
    print("| method | Omega_MSR | " + " | ".join(tasks) + " | mean |")
    print("|---|---:|" + "---:|" * (len(tasks) + 1))
    rows = []
    for m in methods:
        scores = [sum(s for s, _ in cells[(m, t)].values()) / per_cell for t in tasks]
        msr = sum(x for t in tasks for _, x in cells[(m, t)].values()) / (per_cell * len(tasks))
        rows.append((msr, m, scores))
    for msr, m, scores in sorted(rows):
        print(f"| {m} | {msr:.3f} | " + " | ".join(f"{s:.1f}" for s in scores) + f" | {sum(scores) / len(scores):.1f} |")
    print(f"\n{a.samples} samples per task and length at {a.length} tokens; tasks: {', '.join(tasks)}")
    if a.against:
        if a.against not in methods:
            raise SystemExit(f"--against {a.against}: no such method (have {', '.join(methods)})")
        print(f"\n| method | vs {a.against} (mean +- s.e.) | pairs | Omega_MSR sensitive | Omega_MSR robust |")
        print("|---|---:|---:|---:|---:|")
        for msr, m, _ in sorted(rows):
            d = [cells[(m, t)][i][0] - cells[(a.against, t)][i][0] for t in tasks for i in cells[(m, t)]]
            se = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else float("nan")
            sens = [x for t in tasks if classes[t] not in ROBUST for _, x in cells[(m, t)].values()]
            rob = [x for t in tasks if classes[t] in ROBUST for _, x in cells[(m, t)].values()]
            fmt = lambda v: f"{statistics.mean(v):.3f}" if v else "-"
            print(f"| {m} | {statistics.mean(d):+.2f} +- {se:.2f} | {len(d)} | {fmt(sens)} | {fmt(rob)} |")


if __name__ == "__main__":
    main()
