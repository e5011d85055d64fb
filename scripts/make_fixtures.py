#!/usr/bin/env python3
"""Make tiny random-weight reference checkpoints + reference outputs.

For each model writes <out>/<name>/:
  config.json, model.safetensors (or shards + model.safetensors.index.json),
  generation_config.json (whatever save_pretrained writes),
  ids.npy     int32 [24]           prompt token ids (seeded)
  logits.npy  float32 [24, vocab]  fp32 eager forward over ids, using the
                                   weights rounded to the saved dtype
  greedy.npy  int32 [16]           16 greedy new ids after ids (do_sample=False)
  meta.json   what was made (versions, dtypes, tensor names, checks)

Usage: python3 scripts/make_fixtures.py --out tests/fixtures
Runs on CPU for determinism.
"""
import argparse
import copy
import inspect
import json
import math
import os

import numpy as np
import torch
import transformers
from safetensors import safe_open
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

T_PROMPT = 24
N_NEW = 16
VOCAB = 512


def has_rope_parameters(cfg_cls):
    return "rope_parameters" in inspect.signature(cfg_cls.__init__).parameters


def make_config(cfg_cls, common, rope_theta, rope_scaling=None):
    kw = dict(common)
    if has_rope_parameters(cfg_cls):
        rp = {"rope_type": "default", "rope_theta": rope_theta}
        if rope_scaling is not None:
            rp.update(rope_scaling)
        kw["rope_parameters"] = rp
    else:
        kw["rope_theta"] = rope_theta
        if rope_scaling is not None:
            kw["rope_scaling"] = rope_scaling
    return cfg_cls(**kw)


def init_weights(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, (torch.nn.Linear, torch.nn.Embedding)):
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=g) * 0.2)
                if getattr(mod, "bias", None) is not None:
                    mod.bias.copy_(torch.randn(mod.bias.shape, generator=g) * 0.02)
            elif "RMSNorm" in type(mod).__name__ or name.endswith("norm"):
                w = getattr(mod, "weight", None)
                if w is not None:
                    w.copy_(1.0 + 0.1 * torch.randn(w.shape, generator=g))
    if model.config.tie_word_embeddings:
        model.tie_weights()


def expected_inv_freq(head_dim, theta, scaling):
    inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if scaling and scaling.get("rope_type") == "llama3":
        f = scaling["factor"]
        lo = scaling["low_freq_factor"]
        hi = scaling["high_freq_factor"]
        omax = scaling["original_max_position_embeddings"]
        lo_wl = omax / lo
        hi_wl = omax / hi
        out = []
        for x in inv:
            wl = 2 * math.pi / x
            if wl < hi_wl:
                out.append(x)
            elif wl > lo_wl:
                out.append(x / f)
            else:
                s = (omax / wl - lo) / (hi - lo)
                out.append((1 - s) * x / f + s * x)
        inv = np.array(out)
    return inv


def build(spec, out_root):
    name = spec["name"]
    out = os.path.join(out_root, name)
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(spec["seed"])
    cfg = make_config(spec["cfg_cls"], spec["common"], spec["rope_theta"], spec.get("rope_scaling"))
    cfg.eos_token_id = None
    cfg.bos_token_id = None
    cfg.pad_token_id = None
    try:
        model = spec["cls"]._from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    except TypeError:
        model = spec["cls"]._from_config(cfg, attn_implementation="eager", torch_dtype=torch.float32)
    model.eval()
    init_weights(model, spec["seed"])

    save_dtype = spec["save_dtype"]
    # Round parameters to the saved dtype, then compute in fp32. Only parameters
    # (not buffers such as rotary inv_freq) are rounded.
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.to(save_dtype).to(torch.float32)
    if model.config.tie_word_embeddings:
        model.tie_weights()

    # Save a copy in save_dtype.
    to_save = copy.deepcopy(model).to(save_dtype)
    save_kw = {}
    if spec.get("max_shard_size"):
        save_kw["max_shard_size"] = spec["max_shard_size"]
    to_save.save_pretrained(out, **save_kw)
    del to_save

    rng = np.random.default_rng(spec["seed"])
    ids = rng.integers(0, VOCAB, size=T_PROMPT).astype(np.int32)
    ids_t = torch.from_numpy(ids.astype(np.int64))[None]

    with torch.no_grad():
        logits = model(ids_t).logits[0].float().numpy()
        gen = model.generate(ids_t, max_new_tokens=N_NEW, min_new_tokens=N_NEW, do_sample=False,
                             pad_token_id=0, eos_token_id=None)
        greedy = gen[0, T_PROMPT:].numpy().astype(np.int32)
        # Cross-check: greedy via full (no-cache) forwards.
        seq = ids_t.clone()
        for _ in range(N_NEW):
            nxt = model(seq).logits[0, -1].argmax()
            seq = torch.cat([seq, nxt.view(1, 1)], dim=1)
        greedy_nocache = seq[0, T_PROMPT:].numpy().astype(np.int32)

    assert logits.shape == (T_PROMPT, VOCAB), logits.shape
    assert greedy.shape == (N_NEW,), greedy.shape
    np.save(os.path.join(out, "ids.npy"), ids)
    np.save(os.path.join(out, "logits.npy"), logits.astype(np.float32))
    np.save(os.path.join(out, "greedy.npy"), greedy)

    # Tensor inventory from the written safetensors.
    tensors = {}
    for fn in sorted(os.listdir(out)):
        if fn.endswith(".safetensors"):
            with safe_open(os.path.join(out, fn), framework="pt") as f:
                for k in f.keys():
                    t = f.get_slice(k)
                    tensors[k] = {"file": fn, "dtype": t.get_dtype(), "shape": list(t.get_shape())}

    head_dim = spec["common"].get("head_dim", spec["common"]["hidden_size"] // spec["common"]["num_attention_heads"])
    inv_model = model.model.rotary_emb.inv_freq.double().numpy()
    inv_exp = expected_inv_freq(head_dim, spec["rope_theta"], spec.get("rope_scaling"))
    meta = {
        "name": name,
        "class": spec["cls"].__name__,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "numpy_version": np.__version__,
        "seed": spec["seed"],
        "saved_dtype": str(save_dtype).replace("torch.", ""),
        "compute_dtype": "float32 (weights rounded to saved_dtype, then upcast)",
        "attn_implementation": "eager",
        "device": "cpu",
        "init": "Linear/Embedding weight ~ N(0, 0.2^2); RMSNorm weight = 1 + 0.1*N(0,1)",
        "prompt_len": T_PROMPT,
        "n_new": N_NEW,
        "files": {
            "ids.npy": "int32 [%d]" % T_PROMPT,
            "logits.npy": "float32 [%d, %d]" % (T_PROMPT, VOCAB),
            "greedy.npy": "int32 [%d]" % N_NEW,
        },
        "ids": ids.tolist(),
        "greedy": greedy.tolist(),
        "greedy_matches_nocache_loop": bool((greedy == greedy_nocache).all()),
        "greedy_nocache": greedy_nocache.tolist(),
        "logits_stats": {"mean": float(logits.mean()), "std": float(logits.std()),
                         "min": float(logits.min()), "max": float(logits.max())},
        "rope_inv_freq_model": inv_model.tolist(),
        "rope_inv_freq_expected": inv_exp.tolist(),
        "rope_inv_freq_max_rel_err": float(np.max(np.abs(inv_model - inv_exp) / inv_exp)),
        "tensors": tensors,
        "save_pretrained_kwargs": save_kw,
    }
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
    print(name, "greedy", greedy.tolist(), "nocache-match", meta["greedy_matches_nocache_loop"],
          "inv_freq rel err", meta["rope_inv_freq_max_rel_err"], "logit std", meta["logits_stats"]["std"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures")
    ap.add_argument("--only", default="", help="comma list of fixture names (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    qwen_common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                       max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=False,
                       attention_bias=False, hidden_act="silu")
    qwen_tied = dict(qwen_common, num_hidden_layers=3, tie_word_embeddings=True)
    llama_common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        max_position_embeddings=128, rms_norm_eps=1e-5, tie_word_embeddings=False,
                        attention_bias=False, mlp_bias=False, hidden_act="silu")
    llama_scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    specs = [
        dict(name="qwen3_tiny", cls=Qwen3ForCausalLM, cfg_cls=Qwen3Config, common=qwen_common,
             rope_theta=1e6, save_dtype=torch.bfloat16, seed=1234),
        dict(name="qwen3_tied", cls=Qwen3ForCausalLM, cfg_cls=Qwen3Config, common=qwen_tied,
             rope_theta=1e6, save_dtype=torch.float32, seed=2345, max_shard_size="100KB"),
        dict(name="llama_tiny", cls=LlamaForCausalLM, cfg_cls=LlamaConfig, common=llama_common,
             rope_theta=500000.0, rope_scaling=llama_scaling, save_dtype=torch.float16, seed=3456),
        # Head dims the CUDA kernels run (64, 128), for the GPU model tests (tests/gpu/test_gpu_model.cpp).
        dict(name="qwen3_gpu", cls=Qwen3ForCausalLM, cfg_cls=Qwen3Config,
             common=dict(qwen_common, hidden_size=128, head_dim=128, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=256),
             rope_theta=1e6, save_dtype=torch.bfloat16, seed=4567),
        dict(name="llama_gpu", cls=LlamaForCausalLM, cfg_cls=LlamaConfig,
             common=dict(llama_common, hidden_size=192, head_dim=64, num_attention_heads=6, num_key_value_heads=2,
                         intermediate_size=256),
             rope_theta=500000.0, rope_scaling=llama_scaling, save_dtype=torch.bfloat16, seed=5678),
    ]
    only = set(x for x in args.only.split(",") if x)
    os.makedirs(args.out, exist_ok=True)
    for s in specs:
        if not only or s["name"] in only:
            build(s, args.out)


if __name__ == "__main__":
    main()
