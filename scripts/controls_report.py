#!/usr/bin/env python3
"""The method against its controls (issue 23): reads the merged results of scripts/gpu_controls.sh (one method per
eval folder, the folder's tag as the method: full, ssa, adaptive_s<seed>, static_s<seed> (learned-static),
random_<draw>, static_task / static_classic (retrieval heads from the task probe / the magic-number probe)) and writes
report.md plus Pareto SVGs.

Statistics. Every method ran the same prompts (same --seed: sample i of a (task, length) cell is one prompt), so
differences are paired per prompt. A group with several members (seeds, random draws) is averaged per prompt first.
Confidence intervals are 95% percentile intervals of a two-level bootstrap clustered by task: resample tasks with
replacement, then prompts within each drawn task (tasks are few and differ a lot, so an interval over prompts alone
would be too narrow). Accuracy tasks (string match, 0/100 per prompt) and likelihood tasks (100 * exp(mean log-prob)
of the reference) are reported apart; every table says which split (tasks the router trained on, or held out) a
number is from.
Usage: controls_report.py RESULTS.jsonl[.gz] [--out DIR] [--boot 2000] [--seed 0]"""
import argparse
import collections
import gzip
import json
import math
import os
import random

# Rows name their split ("train": in the router's training mix, else "held-out"); files from before rows did fall back
# on this copy of tasks.h's training_task_names().
TRAIN_TASKS = {"niah_single_2", "sum_recap", "niah_multikey_1", "continue_text", "qa_1", "code_continue"}
SPLIT = {}  # task -> split, from the rows
ROBUST = {"summarization", "continuation", "code"}  # target Omega 1.0 in training; the other classes 0.7
GROUPS = [  # (group, member prefix, description)
    ("full", "full", "all heads full"),
    ("adaptive", "adaptive_s", "the method: input-adaptive router (pooled keys)"),
    ("learned-static", "static_s", "same trainer, data and loss, one fixed input per head"),
    ("random", "random_", "random heads at the adaptive routers' Omega"),
    ("static-task-probe", "static_task", "retrieval heads, probe on the eval's niah_single_2 prompts"),
    ("static-classic-probe", "static_classic", "retrieval heads, run 3's magic-number probe"),
    ("ssa", "ssa", "all heads streaming"),
    ("sweep-pool400", "sweep_pool400", "adaptive, seed 1, pooling window 400 tokens at each end (not 100)"),
    ("sweep-mlr1e-2", "sweep_mlr1e-2", "adaptive, seed 1, multiplier lr 1e-2 (run 3's) instead of 1e-3"),
    ("sweep-mlr1e-2-static", "sweep_mlr1e-2static", "learned-static twin of sweep-mlr1e-2"),
    ("sweep-tauexp", "sweep_tauexp", "adaptive, seed 1, exponential temperature schedule (not cosine)"),
    ("sweep-tauexp-static", "sweep_tauexpstatic", "learned-static twin of sweep-tauexp"),
    ("sweep-len4k", "sweep_len4k", "adaptive, seed 1, trained on 1K, 2K and 4K prompts (not 1K)"),
    ("sweep-len4k-static", "sweep_len4kstatic", "learned-static twin of sweep-len4k"),
    ("sweep-targets", "sweep_targets", "adaptive, seed 1, sensitive target 0.5 (not 0.7), multiplier lr 1e-2"),
    ("sweep-targets-static", "sweep_targetsstatic", "learned-static twin of sweep-targets"),
    ("sweep-faxa", "sweep_faxa", "adaptive, seed 1, FA-XA: the router picks full or XAttention per head"),
    ("sweep-faxa-static", "sweep_faxastatic", "learned-static twin of sweep-faxa"),
    ("sweep-xassa", "sweep_xassa", "adaptive, seed 1, XA-SSA: the router picks XAttention or streaming per head"),
    ("sweep-xassa-static", "sweep_xassastatic", "learned-static twin of sweep-xassa"),
]
SWEEPS = [  # (sweep group, its learned-static control: a group or a member, what the sweep changes)
    ("sweep-pool400", "static_s1", "pooling window 400 (the head-identity control ignores pooling)"),
    ("sweep-mlr1e-2", "sweep-mlr1e-2-static", "multiplier lr 1e-2, against its own learned-static twin"),
    ("sweep-tauexp", "sweep-tauexp-static", "exponential temperature schedule, against its twin"),
    ("sweep-len4k", "sweep-len4k-static", "training prompts of 1K-4K, against its twin"),
    ("sweep-targets", "sweep-targets-static", "class targets 0.5 / 1.0, against its twin"),
    ("sweep-faxa", "sweep-faxa-static", "configuration FA-XA, against its twin"),
    ("sweep-xassa", "sweep-xassa-static", "configuration XA-SSA, against its twin"),
]


def load(path):
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


ROLE = {}  # method -> group at the length being analysed (--roles), ahead of the name prefixes


def group_of(method):
    if method in ROLE:
        return ROLE[method]
    for g, prefix, _ in GROUPS:
        if method == prefix or (prefix.endswith(("_s", "_")) and method.startswith(prefix)):
            return g
    return None


def kind_of(r):
    return "likelihood" if r["metric"] == "likelihood" else "accuracy"


def split_of(task):
    return SPLIT.get(task) or ("train" if task in TRAIN_TASKS else "held-out")


def mean(v):
    return sum(v) / len(v) if v else float("nan")


def boot_ci(per_task, reps, rng):
    """per_task: task -> list of paired differences. Mean over all prompts, and its 95% two-level bootstrap CI."""
    tasks = sorted(per_task)
    if not tasks:
        return float("nan"), float("nan"), float("nan")
    point = mean([d for t in tasks for d in per_task[t]])
    stats = []
    for _ in range(reps):
        vals = []
        for t in (rng.choice(tasks) for _ in tasks):
            xs = per_task[t]
            vals.extend(rng.choice(xs) for _ in xs)
        stats.append(mean(vals))
    stats.sort()
    return point, stats[int(0.025 * reps)], stats[int(0.975 * reps) - 1]


def fmt_ci(p, lo, hi):
    return "n/a" if math.isnan(p) else f"{p:+.1f} [{lo:+.1f}, {hi:+.1f}]"


def svg_scatter(path, title, xlabel, ylabel, points):
    """points: (label, x, y, color). A plain SVG scatter with a legend."""
    W, H, L, R, T, B = 640, 420, 60, 190, 40, 50
    xs = [p[1] for p in points] + [0.0, 1.0]
    ys = [p[2] for p in points]
    y0, y1 = min(ys), max(ys)
    pad = max(1.0, 0.08 * (y1 - y0))
    y0, y1 = y0 - pad, y1 + pad
    x0, x1 = min(xs), max(xs)
    sx = lambda x: L + (x - x0) / (x1 - x0 or 1) * (W - L - R)
    sy = lambda y: H - B - (y - y0) / (y1 - y0 or 1) * (H - T - B)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="13">{title}</text>',
           f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
           f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">{xlabel}</text>',
           f'<text x="14" y="{(T + H - B) / 2}" text-anchor="middle" transform="rotate(-90 14 {(T + H - B) / 2})">{ylabel}</text>']
    for i in range(6):
        xv = x0 + (x1 - x0) * i / 5
        yv = y0 + (y1 - y0) * i / 5
        out.append(f'<text x="{sx(xv)}" y="{H - B + 14}" text-anchor="middle">{xv:.2f}</text>')
        out.append(f'<text x="{L - 6}" y="{sy(yv) + 4}" text-anchor="end">{yv:.1f}</text>')
    seen = {}
    for label, x, y, color in points:
        out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" fill="{color}" fill-opacity="0.8"><title>{label}: '
                   f'{x:.3f}, {y:.1f}</title></circle>')
        seen.setdefault(label.split(" ")[0], color)
    for i, (g, color) in enumerate(seen.items()):
        yy = T + 10 + 16 * i
        out.append(f'<circle cx="{W - R + 14}" cy="{yy}" r="4" fill="{color}"/>')
        out.append(f'<text x="{W - R + 24}" y="{yy + 4}">{g}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def svg_headmap(path, title, share, L, H):
    """share[l * H + h] in [0, 1]: a layer x KV head grid, white (never full) to dark red (always full)."""
    cw, ch, left, top = 40, 14, 50, 36
    W, Hh = left + H * cw + 20, top + L * ch + 20
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{Hh}" font-family="sans-serif" font-size="10">',
           f'<rect width="{W}" height="{Hh}" fill="white"/>', f'<text x="4" y="14" font-size="11">{title}</text>']
    for h in range(H):
        out.append(f'<text x="{left + h * cw + cw / 2}" y="{top - 4}" text-anchor="middle">h{h}</text>')
    for l in range(L):
        out.append(f'<text x="{left - 4}" y="{top + l * ch + 10}" text-anchor="end">L{l}</text>')
        for h in range(H):
            v = share[l * H + h]
            g = int(255 * (1 - v))
            out.append(f'<rect x="{left + h * cw}" y="{top + l * ch}" width="{cw - 1}" height="{ch - 1}" '
                       f'fill="rgb(255,{g},{g})" stroke="#ccc"><title>L{l} h{h}: {v:.2f}</title></rect>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


COLORS = {"full": "#000000", "adaptive": "#d62728", "learned-static": "#1f77b4", "random": "#7f7f7f",
          "static-task-probe": "#2ca02c", "static-classic-probe": "#98df8a", "ssa": "#9467bd", "sweep-pool400": "#ff7f0e", "sweep-mlr1e-2": "#e377c2",
          "sweep-mlr1e-2-static": "#17becf", "sweep-tauexp": "#bcbd22", "sweep-tauexp-static": "#8c564b",
          "sweep-len4k": "#ff9896", "sweep-len4k-static": "#c5b0d5", "sweep-targets": "#9edae5",
          "sweep-targets-static": "#dbdb8d", "sweep-faxa": "#393b79", "sweep-faxa-static": "#6b6ecf",
          "sweep-xassa": "#637939", "sweep-xassa-static": "#b5cf6b"}


def analyze(rows, a, rng, prefix, title):
    by_method = collections.defaultdict(dict)  # method -> key -> row
    for r in rows:
        by_method[r["method"]][(r["task"], r["length"], r["sample"])] = r
    members = collections.defaultdict(list)
    for m in sorted(by_method):
        g = group_of(m)
        if g:
            members[g].append(m)
    if "full" not in members:
        return [title, "", "No full-attention rows: nothing to pair against."]
    # A member that has not run most of full's prompts yet (an eval cut by the device call's limit) is left out and
    # named, rather than shrinking every comparison to its few prompts.
    dropped = []
    for g in list(members):
        keep = [m for m in members[g] if len(set(by_method[m]) & set(by_method["full"])) >= 0.9 * len(by_method["full"])]
        dropped += [m for m in members[g] if m not in keep]
        if keep:
            members[g] = keep
        else:
            del members[g]
    # Prompts every method has: every comparison is over the same prompts.
    common = set(by_method["full"])
    for ms in members.values():
        for m in ms:
            common &= set(by_method[m])
    keys = sorted(common)
    lengths = sorted({k[1] for k in keys})
    tasks = sorted({k[0] for k in keys})
    lines = [title, "",
             f"SmolLM2-135M-Instruct, {len(keys)} prompts per method (tasks: {', '.join(tasks)}; lengths: "
             f"{', '.join(map(str, lengths))}); every method on the same prompts. Intervals: 95% two-level bootstrap "
             f"clustered by task ({a.boot} draws). Groups with several members (seeds, draws) are averaged per prompt.",
             "", "| group | members | what it is |", "|---|---|---|"]
    if dropped:
        lines.insert(3, f"Left out (under 90% of full's prompts done): {', '.join(dropped)}.")
    for g, _, desc in GROUPS:
        if g in members:
            lines.append(f"| {g} | {', '.join(members[g])} | {desc} |")

    def group_value(g, key, field="score"):
        return mean([by_method[m][key][field] for m in members[g]])

    # 1. Scores and sparsity per group, per split and kind.
    cols = [(s, k) for s in ("train", "held-out") for k in ("accuracy", "likelihood")]
    cols = [(s, k) for s, k in cols if any(split_of(key[0]) == s and kind_of(by_method["full"][key]) == k for key in keys)]
    lines += ["", "## Scores (mean over prompts) and sparsity", "",
              "| group | Omega_MSR | KV kept | attention FLOPs | " + " | ".join(f"{k}, {s} tasks" for s, k in cols) + " |",
              "|---|---:|---:|---:|" + "---:|" * len(cols)]
    for g, _, _ in GROUPS:
        if g not in members:
            continue
        msr = mean([group_value(g, k, "msr") for k in keys])
        kv = mean([group_value(g, k, "kv") for k in keys if all("kv" in by_method[m][k] for m in members[g])])
        fl = mean([group_value(g, k, "flops") for k in keys])
        vals = []
        for s, kd in cols:
            ks = [k for k in keys if split_of(k[0]) == s and kind_of(by_method["full"][k]) == kd]
            vals.append(f"{mean([group_value(g, k) for k in ks]):.1f}")
        lines.append(f"| {g} | {msr:.3f} | {kv:.3f} | {fl:.3f} | " + " | ".join(vals) + " |")

    # 2. Paired differences against full and head to head against the adaptive router.
    def paired(ga, gb, s, kd):
        per_task = collections.defaultdict(list)
        for k in keys:
            if split_of(k[0]) == s and kind_of(by_method["full"][k]) == kd:
                per_task[k[0]].append(group_value(ga, k) - group_value(gb, k))
        return boot_ci(per_task, a.boot, rng)

    lines += ["", "## Paired difference to full attention (points; mean [95% CI])", "",
              "| group | " + " | ".join(f"{k}, {s}" for s, k in cols) + " |", "|---|" + "---:|" * len(cols)]
    for g, _, _ in GROUPS:
        if g in members and g != "full":
            lines.append(f"| {g} | " + " | ".join(fmt_ci(*paired(g, "full", s, kd)) for s, kd in cols) + " |")
    if "adaptive" in members:
        lines += ["", "## The adaptive router minus each control (points; mean [95% CI]; > 0: the router is better)", "",
                  "| control | " + " | ".join(f"{k}, {s}" for s, k in cols) + " |", "|---|" + "---:|" * len(cols)]
        for g, _, _ in GROUPS:
            if g in members and g not in ("adaptive", "full") and not g.startswith("sweep"):
                lines.append(f"| {g} | " + " | ".join(fmt_ci(*paired("adaptive", g, s, kd)) for s, kd in cols) + " |")
    # What changes the picture: each sweep router minus its learned-static control, on the same prompts.
    sweeps = [(g, c, what) for g, c, what in SWEEPS if g in members and (c in members or
              any(c in ms for ms in members.values()))]
    if sweeps:
        lines += ["", "## Sweeps: each minus its learned-static control (points; mean [95% CI]; > 0: adaptivity helps)",
                  "", "| sweep | control | what changes | " + " | ".join(f"{k}, {s}" for s, k in cols) + " |",
                  "|---|---|---|" + "---:|" * len(cols)]
        for g, c, what in sweeps:
            if c not in members:
                members[c] = [c]  # a single member as its own group, for pairing
            lines.append(f"| {g} | {c} | {what} | " + " | ".join(fmt_ci(*paired(g, c, s, kd)) for s, kd in cols) + " |")

    # 2b. Per task: each group's mean score (accuracy tasks: string match 0-100; likelihood: 100 x exp(mean log-prob)).
    shown = [g for g, _, _ in GROUPS if g in members and not g.startswith("sweep")]
    lines += ["", "## Per task (mean score over prompts; the group's members averaged per prompt)", "",
              "| task | split | kind | " + " | ".join(shown) + " |", "|---|---|---|" + "---:|" * len(shown)]
    for t in tasks:
        ks = [k for k in keys if k[0] == t]
        lines.append(f"| {t} | {split_of(t)} | {kind_of(by_method['full'][ks[0]])} | " +
                     " | ".join(f"{mean([group_value(g, k) for k in ks]):.1f}" for g in shown) + " |")

    # 3. Spread over seeds and draws: each member's own difference to full, accuracy and likelihood pooled over splits.
    lines += ["", "## Each member against full (points, all tasks of a kind pooled)", "",
              "| group | member | Omega_MSR | accuracy | likelihood |", "|---|---|---:|---:|---:|"]
    for g, _, _ in GROUPS:
        if g not in members or g == "full":
            continue
        for m in members[g]:
            d = {kd: mean([by_method[m][k]["score"] - by_method["full"][k]["score"] for k in keys
                           if kind_of(by_method["full"][k]) == kd]) for kd in ("accuracy", "likelihood")}
            lines.append(f"| {g} | {m} | {mean([by_method[m][k]['msr'] for k in keys]):.3f} | "
                         f"{d['accuracy']:+.1f} | {d['likelihood']:+.1f} |")

    # 4. Is the routing input-adaptive? Omega per task, its spread over prompts, distinct routings; class targets.
    for g in ("adaptive", "learned-static"):
        if g not in members:
            continue
        lines += ["", f"## Routing of the {g} routers per task (Omega_MSR mean, sd over prompts, distinct routings)", "",
                  "| task | class | split | " + " | ".join(members[g]) + " |", "|---|---|---|" + "---:|" * len(members[g])]
        for t in tasks:
            ks = [k for k in keys if k[0] == t]
            cells = []
            for m in members[g]:
                v = [by_method[m][k]["msr"] for k in ks]
                sd = math.sqrt(mean([(x - mean(v)) ** 2 for x in v]))
                distinct = len({by_method[m][k].get("modes", "") for k in ks})
                cells.append(f"{mean(v):.3f} / {sd:.3f} / {distinct}")
            lines.append(f"| {t} | {by_method['full'][ks[0]]['class']} | {split_of(t)} | " + " | ".join(cells) + " |")
        sens = [group_value(g, k, "msr") for k in keys if by_method["full"][k]["class"] not in ROBUST]
        rob = [group_value(g, k, "msr") for k in keys if by_method["full"][k]["class"] in ROBUST]
        lines.append(f"\nClass targets ({g}): sensitive classes {mean(sens):.3f} (target 0.7), robust classes "
                     f"{mean(rob):.3f} (target 1.0).")

    # 5. Which heads: per task, the share of prompts that keep each (layer, KV head) full, for every adaptive member;
    # the heads every prompt keeps full; and a head map per task (SVG).
    for m in members.get("adaptive", []):
        first = by_method[m][keys[0]]
        L, H = first.get("n_layers", 0), first.get("n_kv_heads", 0)
        if not L or not H:
            continue
        always = [i for i in range(L * H) if all(by_method[m][k]["modes"][i] == "F" for k in keys)]
        ever = [i for i in range(L * H) if any(by_method[m][k]["modes"][i] == "F" for k in keys)]
        lines += ["", f"Heads {m} keeps full on every prompt ({len(always)} of {L * H}): " +
                  ", ".join(f"L{i // H}.{i % H}" for i in always) +
                  f"; full on some prompts only: {len(ever) - len(always)}."]
        for t in tasks:
            ks = [k for k in keys if k[0] == t]
            share = [mean([1.0 if by_method[m][k]["modes"][i] == "F" else 0.0 for k in ks]) for i in range(L * H)]
            name = f"{prefix}headmap_{m}_{t}.svg"
            svg_headmap(os.path.join(a.out, name), f"{m}, {t}: share of prompts keeping each head full", share, L, H)
        lines.append(f"Head maps per task: {prefix}headmap_{m}_<task>.svg")

    # 6. Pareto plots: every member, score against attention FLOPs and against KV kept, per kind of task and per task
    # class (a class holds one kind: retrieval and qa are accuracy tasks, the robust classes likelihood ones).
    facets = [(kd, f"{kd} tasks", lambda k, kd=kd: kind_of(by_method["full"][k]) == kd) for kd in ("accuracy", "likelihood")]
    for c in sorted({by_method["full"][k]["class"] for k in keys}):
        facets.append((f"class_{c}", f"class {c}", lambda k, c=c: by_method["full"][k]["class"] == c))
    for kd, label, keep in facets:
        ks = [k for k in keys if keep(k)]
        if not ks:
            continue
        for field, xlabel in (("flops", "attention FLOPs vs full"), ("kv", "KV memory vs full")):
            pts = []
            for g, _, _ in GROUPS:
                for m in members.get(g, []):
                    xs = [by_method[m][k].get(field) for k in ks]
                    if any(x is None for x in xs):
                        continue
                    pts.append((f"{g} {m}", mean(xs), mean([by_method[m][k]["score"] for k in ks]), COLORS[g]))
            if pts:
                name = f"{prefix}pareto_{kd}_{field}.svg"
                svg_scatter(os.path.join(a.out, name), f"{label}: score vs {xlabel}", xlabel, "score", pts)
                lines.append(f"\n![{kd} vs {field}]({name})")
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--out", default=".")
    ap.add_argument("--boot", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--roles", default="", help="LEN:METHOD=GROUP,... e.g. 4096:sweep_len4k=adaptive,4096:sweep_len4kstatic="
                    "learned-static: at a length where other routers than adaptive_s*/static_s* ran, they take the roles "
                    "(the controls there were matched to their Omega)")
    a = ap.parse_args()
    roles = {}
    for item in filter(None, a.roles.split(",")):
        try:
            length, rest = item.split(":", 1)
            method, group = rest.split("=", 1)
            roles.setdefault(int(length), {})[method] = group
        except ValueError:
            ap.error(f"--roles: '{item}' is not LEN:METHOD=GROUP")
        if group not in {g for g, _, _ in GROUPS}:
            ap.error(f"--roles: unknown group '{group}'")
    rng = random.Random(a.seed)
    rows = load(a.results)
    os.makedirs(a.out, exist_ok=True)
    for r in rows:
        if "split" in r:
            SPLIT[r["task"]] = r["split"]
    plain = [r for r in rows if not r.get("templates") and not r["method"].startswith("para_")]
    para = [dict(r, method=r["method"][len("para_"):]) for r in rows if r["method"].startswith("para_")]
    lengths = sorted({r["length"] for r in plain})
    lines = []
    for i, L in enumerate(lengths):  # one analysis per prompt length: the controls are matched at each length's Omega
        sub = [r for r in plain if r["length"] == L]
        title = "# Elastic Attention against its controls at matched sparsity" + (f", {L}-token prompts" if len(lengths) > 1 else "")
        ROLE.clear()
        ROLE.update(roles.get(L, {}))
        if ROLE:
            title += " (" + "; ".join(f"{g}: {m}" for m, g in ROLE.items()) + ")"
        lines += ([""] if i else []) + analyze(sub, a, rng, f"L{L}_" if i else "", title)
    if para:
        ROLE.clear()
        lines += [""] + analyze(para, a, rng, "para_", "# The same on held-out templates (eval --paraphrase)")
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
