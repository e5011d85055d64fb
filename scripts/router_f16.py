#!/usr/bin/env python3
"""Rewrites a router file (safetensors, F32 tensors) with F16 tensors: the same names, shapes and metadata, half the
bytes (how routers/ ships them; Router::load reads F16, BF16 and F32). Prints the largest relative change per weight.
Standard library only. Usage: router_f16.py IN.safetensors OUT.safetensors"""
import json
import struct
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out_header, chunks, offset, worst = {}, [], 0, 0.0
    for name, t in header.items():
        if name == "__metadata__":
            out_header[name] = t
            continue
        if t["dtype"] != "F32":
            sys.exit(f"{src}: tensor {name} is {t['dtype']}, expected F32")
        a, b = t["data_offsets"]
        count = (b - a) // 4
        vals = struct.unpack(f"<{count}f", data[a:b])
        half = struct.pack(f"<{count}e", *vals)
        back = struct.unpack(f"<{count}e", half)
        scale = max(max(abs(v) for v in vals), 1e-30)
        worst = max(worst, max(abs(x - y) for x, y in zip(vals, back)) / scale)
        out_header[name] = {"dtype": "F16", "shape": t["shape"], "data_offsets": [offset, offset + len(half)]}
        chunks.append(half)
        offset += len(half)
    h = json.dumps(out_header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)  # safetensors pads the header to 8 bytes
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(chunks))
    print(f"{dst}: {len(chunks)} tensors as F16; largest change {worst:.2e} of each tensor's largest weight")


if __name__ == "__main__":
    main()
