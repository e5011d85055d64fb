#!/usr/bin/env python3
"""Reference data for Elastic's GGUF loader, made with ggml's own Python package `gguf` (pip install gguf numpy).

Never used at runtime: it produces independent numbers that the C++ tests compare against.

  dump      FILE OUT_DIR TENSOR[:ROWS] ...  dequantized rows of tensors as float32 .npy (gguf.quants.dequantize)
  kquant    OUT_DIR                         random Q4_K / Q6_K blocks (raw .bin) and their dequantization (.npy)
  forward   FILE OUT_DIR IDS                numpy forward of a llama GGUF *in llama.cpp's own layout* (interleaved
                                            RoPE on the permuted q/k rows, no un-permutation): logits of the last
                                            position -> top tokens (+ greedy continuation with --greedy N)
  tokenizer FILE OUT_DIR [TEXT ...]         rebuild the HF tokenizer.json from the GGUF metadata and, when the
                                            `tokenizers` package is installed, encode the texts with it
  hf        FILE OUT_DIR                    HF folder (config.json + model.safetensors fp32, q/k un-permuted) for
                                            transformers (e.g. reference logits on a GPU machine)
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

try:
    import gguf
    from gguf import quants
except ImportError:  # pragma: no cover
    sys.exit("gguf_reference.py needs the `gguf` package: pip install gguf")


def field(r, key, default=None):
    f = r.fields.get(key)
    if f is None:
        return default
    return f.contents()


def tensors(r):
    return {t.name: t for t in r.tensors}


def deq(t):
    """Dequantized tensor as float32 with numpy shape [ne_{n-1}, ..., ne_0] (HF [out, in] for matrices)."""
    a = quants.dequantize(t.data, t.tensor_type)
    shape = tuple(int(x) for x in reversed(t.shape))
    return np.asarray(a, dtype=np.float32).reshape(shape)


def cmd_dump(a):
    r = gguf.GGUFReader(a.file)
    ts = tensors(r)
    os.makedirs(a.out, exist_ok=True)
    meta = {}
    for spec in a.tensors:
        name, _, rows = spec.partition(":")
        t = ts[name]
        x = deq(t)
        if rows:
            x = x[: int(rows)]
        fn = name.replace(".", "_") + ".npy"
        np.save(os.path.join(a.out, fn), np.ascontiguousarray(x, dtype=np.float32))
        meta[fn] = {"tensor": name, "type": t.tensor_type.name, "ne": [int(v) for v in t.shape],
                    "rows": int(x.shape[0]), "source": "gguf.quants.dequantize (gguf %s)" % gguf_version()}
    with open(os.path.join(a.out, "dump.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps(meta, indent=1))


def gguf_version():
    try:
        from importlib.metadata import version
        return version("gguf")
    except Exception:
        return "?"


def cmd_kquant(a):
    """Random but well-formed K-quant blocks: fp16 scales set to modest values, everything else random bytes."""
    rng = np.random.default_rng(a.seed)
    os.makedirs(a.out, exist_ok=True)
    for qt, nbytes, d_off in ((gguf.GGMLQuantizationType.Q4_K, 144, (0, 2)),
                              (gguf.GGMLQuantizationType.Q6_K, 210, (208,))):
        nblk = 2
        raw = rng.integers(0, 256, size=(nblk, nbytes), dtype=np.uint8)
        for b in range(nblk):
            for off in d_off:
                raw[b, off:off + 2] = np.frombuffer(np.float16(rng.uniform(0.001, 0.05)).tobytes(), np.uint8)
        y = np.asarray(quants.dequantize(raw, qt), dtype=np.float32).reshape(-1)
        raw.tofile(os.path.join(a.out, qt.name.lower() + ".bin"))
        np.save(os.path.join(a.out, qt.name.lower() + ".npy"), y)
        print(qt.name, raw.size, "bytes ->", y.size, "floats; first", y[:4])


# ---------------------------------------------------------------- numpy forward, llama.cpp semantics

def rms(x, w, eps):
    x64 = x.astype(np.float32)
    return (x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps)) * w


def rope_interleaved(x, pos, theta, freq_div=None):
    """ggml's normal (non-NeoX) RoPE: rotates pairs (x[2i], x[2i+1]) of each head. x: [T, H, hd]."""
    hd = x.shape[-1]
    inv = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    if freq_div is not None:
        inv = inv / freq_div
    ang = pos[:, None].astype(np.float64) * inv[None, :]  # [T, hd/2]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


_DEQ_CACHE = {}


def llama_forward(r, ids, layers=None):
    arch = field(r, "general.architecture")
    if arch != "llama":
        sys.exit("forward: only llama GGUF files (got %r)" % arch)
    p = arch + "."
    D = field(r, p + "embedding_length")
    L = field(r, p + "block_count") if layers is None else layers
    Hq = field(r, p + "attention.head_count")
    Hkv = field(r, p + "attention.head_count_kv", Hq)
    hd = field(r, p + "attention.key_length", D // Hq)
    eps = field(r, p + "attention.layer_norm_rms_epsilon", 1e-5)
    theta = field(r, p + "rope.freq_base", 10000.0)
    ts = tensors(r)
    fdiv = deq(ts["rope_freqs.weight"]).astype(np.float64) if "rope_freqs.weight" in ts else None
    cache = _DEQ_CACHE.setdefault(id(r), {})

    def W(n):  # dequantize once per reader (greedy loops rerun the forward)
        if n not in cache:
            cache[n] = deq(ts[n])
        return cache[n]
    emb = W("token_embd.weight")
    T = len(ids)
    pos = np.arange(T)
    x = emb[np.asarray(ids)].astype(np.float32)
    mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), 1)
    for l in range(L):
        b = "blk.%d." % l
        h = rms(x, W(b + "attn_norm.weight"), eps)
        q = (h @ W(b + "attn_q.weight").T).reshape(T, Hq, hd)
        k = (h @ W(b + "attn_k.weight").T).reshape(T, Hkv, hd)
        v = (h @ W(b + "attn_v.weight").T).reshape(T, Hkv, hd)
        q, k = rope_interleaved(q, pos, theta, fdiv), rope_interleaved(k, pos, theta, fdiv)
        rep = Hq // Hkv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", s, v).reshape(T, Hq * hd)
        x = x + o @ W(b + "attn_output.weight").T
        h = rms(x, W(b + "ffn_norm.weight"), eps)
        g, u = h @ W(b + "ffn_gate.weight").T, h @ W(b + "ffn_up.weight").T
        x = x + (g / (1 + np.exp(-g)) * u) @ W(b + "ffn_down.weight").T
    h = rms(x, W("output_norm.weight"), eps)
    head = W("output.weight") if "output.weight" in ts else emb
    return h @ head.T  # [T, V]


def cmd_forward(a):
    r = gguf.GGUFReader(a.file)
    ids = [int(s) for s in a.ids.split(",")]
    os.makedirs(a.out, exist_ok=True)
    res = {"prompt_ids": ids, "source": "numpy forward, llama.cpp layout, gguf %s" % gguf_version()}
    logits = llama_forward(r, ids)[-1]
    top = np.argsort(-logits)[: a.top]
    res["top_ids"] = [int(i) for i in top]
    res["top_logits"] = [float(logits[i]) for i in top]
    np.save(os.path.join(a.out, "last_logits.npy"), logits.astype(np.float32))
    if a.greedy:
        seq = list(ids)
        for _ in range(a.greedy):
            seq.append(int(np.argmax(llama_forward(r, seq)[-1])))
        res["greedy"] = seq[len(ids):]
    with open(os.path.join(a.out, "forward.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res))


# ---------------------------------------------------------------- tokenizer.json rebuild

HF_PRE = {
    # The HF pre-tokenizers of the families llama.cpp's converter names (tokenizer.ggml.pre).
    "smollm": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
    "gpt2": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
}


def write_tokenizer_json(r, out):
    toks = field(r, "tokenizer.ggml.tokens")
    merges = field(r, "tokenizer.ggml.merges")
    types = field(r, "tokenizer.ggml.token_type")
    pre = field(r, "tokenizer.ggml.pre", "gpt2")
    if pre not in HF_PRE:
        sys.exit("tokenizer: no HF pre-tokenizer known for %r" % pre)
    vocab = {}
    for i, t in enumerate(toks):
        vocab.setdefault(t, i)
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": types[i] == 3}
             for i, t in enumerate(toks) if types[i] in (3, 4)]
    tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
          "pre_tokenizer": HF_PRE[pre],
          "post_processor": None,
          "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
          "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                    "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                    "vocab": vocab, "merges": list(merges)}}
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    print("wrote", path, len(vocab), "tokens", len(merges), "merges, pre", pre)
    return path


def cmd_tokenizer(a):
    r = gguf.GGUFReader(a.file)
    path = write_tokenizer_json(r, a.out)
    if a.texts:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            sys.exit("encoding needs the `tokenizers` package")
        tk = Tokenizer.from_file(path)
        cases = [{"text": t, "ids": tk.encode(t, add_special_tokens=False).ids} for t in a.texts]
        with open(os.path.join(a.out, "cases.json"), "w", encoding="utf-8") as f:
            json.dump(cases, f, ensure_ascii=False, indent=1)
        for c in cases:
            print(json.dumps(c, ensure_ascii=False))


# ---------------------------------------------------------------- HF export

def unpermute(w, heads):
    """Inverse of llama.cpp's converter permutation: rows h*hd + 2i + j  ->  h*hd + j*hd/2 + i."""
    out = w.shape[0]
    hd = out // heads
    return w.reshape(heads, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_safetensors(path, named):
    header, off, blobs = {}, 0, []
    for n, x in named:
        x = np.ascontiguousarray(x, dtype=np.float32)
        header[n] = {"dtype": "F32", "shape": list(x.shape), "data_offsets": [off, off + x.nbytes]}
        off += x.nbytes
        blobs.append(x.tobytes())
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def cmd_hf(a):
    r = gguf.GGUFReader(a.file)
    p = "llama."
    D, L = field(r, p + "embedding_length"), field(r, p + "block_count")
    Hq = field(r, p + "attention.head_count")
    Hkv = field(r, p + "attention.head_count_kv", Hq)
    ts = tensors(r)
    tied = "output.weight" not in ts
    named = [("model.embed_tokens.weight", deq(ts["token_embd.weight"])),
             ("model.norm.weight", deq(ts["output_norm.weight"]))]
    if not tied:
        named.append(("lm_head.weight", deq(ts["output.weight"])))
    hf = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj"}
    for l in range(L):
        b = "blk.%d." % l
        m = "model.layers.%d." % l
        named.append((m + "self_attn.q_proj.weight", unpermute(deq(ts[b + "attn_q.weight"]), Hq)))
        named.append((m + "self_attn.k_proj.weight", unpermute(deq(ts[b + "attn_k.weight"]), Hkv)))
        for g, h in hf.items():
            named.append((m + h + ".weight", deq(ts[b + g + ".weight"])))
    os.makedirs(a.out, exist_ok=True)
    write_safetensors(os.path.join(a.out, "model.safetensors"), named)
    eos = field(r, "tokenizer.ggml.eos_token_id")
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": D, "num_hidden_layers": L,
           "num_attention_heads": Hq, "num_key_value_heads": Hkv,
           "head_dim": field(r, p + "attention.key_length", D // Hq),
           "intermediate_size": field(r, p + "feed_forward_length"),
           "max_position_embeddings": field(r, p + "context_length"),
           "rms_norm_eps": field(r, p + "attention.layer_norm_rms_epsilon"),
           "rope_theta": field(r, p + "rope.freq_base", 10000.0), "hidden_act": "silu",
           "vocab_size": int(ts["token_embd.weight"].shape[1]), "tie_word_embeddings": tied,
           "bos_token_id": field(r, "tokenizer.ggml.bos_token_id"), "eos_token_id": eos,
           "attention_bias": False, "mlp_bias": False, "torch_dtype": "float32"}
    if "rope_freqs.weight" in ts:
        print("warning: rope_freqs present; llama3 rope_scaling parameters are not recoverable exactly", file=sys.stderr)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    write_tokenizer_json(r, a.out)
    print("wrote", a.out, len(named), "tensors")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("dump"); s.add_argument("file"); s.add_argument("out"); s.add_argument("tensors", nargs="+")
    s.set_defaults(fn=cmd_dump)
    s = sub.add_parser("kquant"); s.add_argument("out"); s.add_argument("--seed", type=int, default=7)
    s.set_defaults(fn=cmd_kquant)
    s = sub.add_parser("forward"); s.add_argument("file"); s.add_argument("out"); s.add_argument("ids")
    s.add_argument("--top", type=int, default=5); s.add_argument("--greedy", type=int, default=0)
    s.set_defaults(fn=cmd_forward)
    s = sub.add_parser("tokenizer"); s.add_argument("file"); s.add_argument("out"); s.add_argument("texts", nargs="*")
    s.set_defaults(fn=cmd_tokenizer)
    s = sub.add_parser("hf"); s.add_argument("file"); s.add_argument("out"); s.set_defaults(fn=cmd_hf)
    a = ap.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
