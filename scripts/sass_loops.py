#!/usr/bin/env python3
"""Here (no GPU needed): the loops of each hd-128 attention kernel in SASS, with their instruction counts, to compare
the per-step code of kernel variants (docs/CUDA_ATTENTION.md, next steps).

  nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc -cubin -o /tmp/af.cubin \
      src/cuda/attention_fwd.cu
  NVDISASM -c /tmp/af.cubin > /tmp/af.sass      # nvdisasm: CUDA toolkit, or pip's nvidia-cuda-nvdisasm
  python3 scripts/sass_loops.py /tmp/af.sass

Per kernel: one (instructions, MUFU.EX2, HGMMA, predicated, barrier/sync) tuple per backward branch whose body holds
an EX2 or an HGMMA; nested loops are counted with their inner loops. The innermost ones (66 EX2, 16 HGMMA at hd 128)
are the per-step bodies.
"""
import re
import sys


def loops(ins, lab_addr):
    addr_idx = {a: i for i, (a, _) in enumerate(ins)}
    out = []
    for i, (a, t) in enumerate(ins):
        m = re.search(r"BRA\s+(?:`\()?\.?(L_x_\d+)", t)
        if m and m.group(1) in lab_addr and lab_addr[m.group(1)] < a:
            seg = [x[1] for x in ins[addr_idx[lab_addr[m.group(1)]]:i + 1]]
            ex = sum("MUFU.EX2" in x for x in seg)
            hg = sum("HGMMA" in x for x in seg)
            if ex or hg:
                out.append((len(seg), ex, hg, sum(x.startswith("@") for x in seg),
                            sum("BAR" in x or "SYNCS" in x for x in seg)))
    return out


def main(path):
    lines = open(path).read().split("\n")
    starts = [(i, l) for i, l in enumerate(lines) if l.startswith(".text.")]
    for k, (i, name) in enumerate(starts):
        if "ILi128" not in name:
            continue
        body = lines[i:starts[k + 1][0] if k + 1 < len(starts) else len(lines)]
        ins, lab_addr, label = [], {}, None
        for l in body:
            m = re.match(r"^\s*\.(L_x_\d+):", l)
            if m:
                label = m.group(1)
                continue
            m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", l)
            if m:
                a = int(m.group(1), 16)
                ins.append((a, m.group(2)))
                if label:
                    lab_addr[label], label = a, None
        tag = re.search(r"(attn_fwd_\w+?I\w+?E)E?Ev", name)
        print(tag.group(1) if tag else name[:80], loops(ins, lab_addr))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: sass_loops.py FILE.sass (see the docstring)")
    main(sys.argv[1])
