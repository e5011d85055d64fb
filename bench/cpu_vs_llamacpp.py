#!/usr/bin/env python3
"""Elastic's CPU path against llama.cpp (llama-cpp-python) on the same GGUF, same machine, same run.

For each thread count and prompt length: prefill tok/s, greedy decode tok/s and peak RSS of one process per engine
and case (both engines get the same token ids). Prints a Markdown table with the ratios ours / llama.cpp.
Run through bench/cpu_vs_llamacpp.sh, which builds llama-cpp-python in a venv.
"""
import argparse, os, re, struct, subprocess, sys, tempfile, time

ROW = "| {t} | {p} | {lp:.0f} | {ep:.0f} | {rp:.2f}x | {ld:.1f} | {ed:.1f} | {rd:.2f}x | {lm:.0f} | {em:.0f} | {rm:.2f}x |"


def llama_case(model, ids, n_new, threads):
    """Runs in a child process: prints 'prefill_s decode_s' for llama.cpp."""
    import numpy as np
    from llama_cpp import Llama
    llm = Llama(model_path=model, n_ctx=len(ids) + n_new + 8, n_threads=threads, n_threads_batch=threads,
                n_batch=min(len(ids), 512), n_ubatch=min(len(ids), 512), logits_all=False, verbose=False)
    t0 = time.perf_counter()
    llm.eval(ids)
    t1 = time.perf_counter()
    n_vocab = llm.n_vocab()
    for _ in range(n_new):  # greedy; without logits_all the last position's logits are only in the context
        tok = int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))))
        llm.eval([tok])
    t2 = time.perf_counter()
    print(f"{t1 - t0} {t2 - t1}")


def run_measured(cmd):
    """Runs cmd, returns (stdout+stderr, peak RSS MiB) of that process alone."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        sys.exit(f"cpu_vs_llamacpp: {' '.join(cmd)} failed:\n{out[-2000:]}")
    return out, ru.ru_maxrss / 1024.0


def write_npy_i32(path, ids):
    header = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }" % len(ids)
    header += " " * (63 - (len(header) + 10) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(struct.pack("<%di" % len(ids), *ids))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--elastic", required=True)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--prompts", default="128,512,2048")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("-n", type=int, default=64, help="decoded tokens per case")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        ids = [int(x) for x in open(a.child[0]).read().split()]
        return llama_case(a.model, ids, a.n, int(a.child[1]))
    from llama_cpp import Llama
    tok = Llama(model_path=a.model, vocab_only=True, verbose=False)
    text = open(__file__).read() * 20  # varied English-and-code text
    all_ids = tok.tokenize(text.encode(), add_bos=False)
    tmp = tempfile.mkdtemp()
    print(f"model {os.path.basename(a.model)}, {os.cpu_count()} cores, {a.n} decoded tokens per case")
    print("| threads | prompt | llama.cpp prefill tok/s | Elastic prefill tok/s | ratio | llama.cpp decode tok/s | "
          "Elastic decode tok/s | ratio | llama.cpp peak MiB | Elastic peak MiB | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for t in [int(x) for x in a.threads.split(",")]:
        for p in [int(x) for x in a.prompts.split(",")]:
            ids = all_ids[:p]
            idf, npy = os.path.join(tmp, f"{p}.txt"), os.path.join(tmp, f"{p}.npy")
            open(idf, "w").write(" ".join(map(str, ids)))
            write_npy_i32(npy, ids)
            out, lm = run_measured([sys.executable, __file__, "--elastic", a.elastic, "-m", a.model, "-n", str(a.n),
                                    "--child", idf, str(t), "x"])
            lp_s, ld_s = map(float, out.split()[-2:])
            out, em = run_measured([a.elastic, "generate", "-m", a.model, "--ids", npy, "-n", str(a.n + 1),
                                    "--ignore-eos", "--print-ids", "-t", str(t)])
            m = re.search(r"prompt: (\d+) tokens in ([\d.]+) s .*decode: (\d+) tokens in ([\d.]+) s", out)
            if not m:
                sys.exit(f"cpu_vs_llamacpp: no timing line from elastic:\n{out[-2000:]}")
            ep, ed = int(m[1]) / float(m[2]), (int(m[3]) - 1) / float(m[4])
            lp, ld = p / lp_s, a.n / ld_s
            print(ROW.format(t=t, p=p, lp=lp, ep=ep, rp=ep / lp, ld=ld, ed=ed, rd=ed / ld, lm=lm, em=em, rm=em / lm),
                  flush=True)


if __name__ == "__main__":
    main()
