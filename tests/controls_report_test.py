#!/usr/bin/env python3
"""scripts/controls_report.py on a synthetic results file whose differences are known exactly: every table the
science rests on (paired differences with their bootstrap intervals, the control and sweep tables, the per-length and
paraphrase sections, the head maps and Pareto plots) must show them. Usage: controls_report_test.py REPO_DIR"""
import gzip
import json
import os
import subprocess
import sys
import tempfile


def main():
    repo = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="controls_report_")
    rows = []
    # (task, split, metric, class): one training accuracy task, one held-out accuracy task, one likelihood task.
    tasks = [("niah_single_2", "train", "string_match_all", "retrieval"),
             ("niah_single_3", "held-out", "string_match_all", "retrieval"),
             ("sum_recap", "train", "likelihood", "summarization")]
    # Per method: (score offset against full, msr, modes). Offsets are constant, so every interval is a point.
    methods = {"full": (0, 0.0, "FFFF"), "adaptive_s1": (-10, 0.5, "FSSF"), "adaptive_s2": (-10, 0.5, "FSFS"),
               "static_s1": (-4, 0.5, "FSSF"), "random_1": (-40, 0.5, "SSFF"), "ssa": (-50, 1.0, "SSSS"),
               "sweep_pool400": (-6, 0.5, "FSSF"), "para_full": (0, 0.0, "FFFF"),
               "para_adaptive_s1": (-20, 0.5, "FSSF"), "para_static_s1": (-5, 0.5, "FSSF")}
    for length in (256, 512):
        for task, split, metric, cls in tasks:
            for i in range(10):
                base = 80.0 if metric != "likelihood" else 50.0
                for m, (off, msr, modes) in methods.items():
                    r = {"method": m, "task": task, "split": split, "metric": metric, "class": cls, "length": length,
                         "sample": i, "score": base + off, "msr": msr, "esr": msr / 2, "flops": 1 - msr / 2,
                         "kv": 1 - msr / 2, "modes": modes, "n_layers": 2, "n_kv_heads": 2}
                    if m.startswith("para_"):
                        r["templates"] = "paraphrase"
                    rows.append(r)
    # A third length where other routers ran (a training-length sweep and its twin) and take the roles (--roles).
    for task, split, metric, cls in tasks:
        for i in range(10):
            base = 80.0 if metric != "likelihood" else 50.0
            for m, off in (("full", 0), ("sweep_len4k", -8), ("sweep_len4kstatic", -3), ("random_1", -30)):
                rows.append({"method": m, "task": task, "split": split, "metric": metric, "class": cls, "length": 768,
                             "sample": i, "score": base + off, "msr": 0.5, "esr": 0.25, "flops": 0.75, "kv": 0.75,
                             "modes": "FSSF", "n_layers": 2, "n_kv_heads": 2})
    path = os.path.join(tmp, "results.jsonl.gz")
    with gzip.open(path, "wt") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    out = os.path.join(tmp, "report")
    subprocess.run([sys.executable, os.path.join(repo, "scripts/controls_report.py"), path, "--out", out,
                    "--boot", "200", "--roles", "768:sweep_len4k=adaptive,768:sweep_len4kstatic=learned-static"],
                   check=True, stdout=subprocess.DEVNULL)
    text = open(os.path.join(out, "report.md")).read()
    fails = []

    def expect(s, why):
        if s not in text:
            fails.append(f"missing {why}: {s!r}")

    expect("256-token prompts", "the first length's section")
    expect("512-token prompts", "the second length's section")
    expect("| adaptive | -10.0 [-10.0, -10.0] | -10.0 [-10.0, -10.0] | -10.0 [-10.0, -10.0] |", "adaptive - full")
    expect("| learned-static | -6.0 [-6.0, -6.0] |", "adaptive - learned-static (control table)")
    expect("| random | +30.0 [+30.0, +30.0] |", "adaptive - random")
    expect("| sweep-pool400 | static_s1 |", "the sweep against its control")
    expect("-2.0 [-2.0, -2.0]", "sweep-pool400 - static_s1")
    expect("768-token prompts (adaptive: sweep_len4k; learned-static: sweep_len4kstatic)", "the roles in the title")
    expect("| learned-static | -5.0 [-5.0, -5.0] |", "the role-taking adaptive - learned-static at 768")
    expect("| random | +22.0 [+22.0, +22.0] |", "the role-taking adaptive - random at 768")
    expect("# The same on held-out templates", "the paraphrase section")
    expect("| adaptive | -20.0 [-20.0, -20.0] |", "paraphrased adaptive - full")
    expect("accuracy, held-out", "a held-out column")
    expect("| niah_single_3 | held-out | accuracy | 80.0 | 70.0 | 76.0 | 40.0 | 30.0 |", "the per-task table")
    expect("| sum_recap | train | likelihood | 50.0 | 40.0 |", "a likelihood task's row")
    for f in ("pareto_accuracy_flops.svg", "pareto_class_retrieval_kv.svg", "headmap_adaptive_s1_niah_single_2.svg",
              "para_pareto_likelihood_kv.svg"):
        if not os.path.exists(os.path.join(out, f)):
            fails.append(f"missing file {f}")
    if fails:
        print("\n".join(fails))
        print(text[:3000])
        sys.exit(1)
    print("controls_report: all expected tables and plots present")


if __name__ == "__main__":
    main()
