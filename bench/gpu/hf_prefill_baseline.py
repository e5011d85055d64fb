"""End-to-end prefill baseline on the GPU machine: Hugging Face transformers Qwen3ForCausalLM of a named shape with
random bf16 weights and attn_implementation="sdpa", one forward over T random tokens (KV cache built, logits of the
last position only), timed with CUDA events after a warm-up. Prints one JSON line per length (prefill tok/s, peak
GPU memory). Compare with `elastic bench --device cuda --shape qwen3-4b -c ...` (same shape, same lengths).
Usage: python3 hf_prefill_baseline.py [--shape qwen3-4b] [--layers N] T [T ...]"""
import argparse
import json

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from cuda_timing import event_times_ms

SHAPES = {  # hidden, layers, heads, kv heads, head_dim, intermediate, vocab, tied (the configs' values)
    "qwen3-0.6b": (1024, 28, 16, 8, 128, 3072, 151936, True),
    "qwen3-4b": (2560, 36, 32, 8, 128, 9728, 151936, True),
    "qwen3-8b": (4096, 36, 32, 8, 128, 12288, 151936, False),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen3-4b", choices=sorted(SHAPES))
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("lengths", type=int, nargs="+")
    a = ap.parse_args()
    d, L, hq, hkv, hd, f, v, tied = SHAPES[a.shape]
    L = a.layers or L
    cfg = Qwen3Config(hidden_size=d, num_hidden_layers=L, num_attention_heads=hq, num_key_value_heads=hkv,
                      head_dim=hd, intermediate_size=f, vocab_size=v, tie_word_embeddings=tied,
                      max_position_embeddings=max(a.lengths) + 16, rope_theta=1e6)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Qwen3ForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.bfloat16).eval()
    for T in a.lengths:
        ids = torch.randint(0, v, (1, T), device="cuda")

        def run():
            with torch.no_grad():
                model(input_ids=ids, use_cache=True, logits_to_keep=1)

        torch.cuda.reset_peak_memory_stats()
        ms = event_times_ms(run, a.reps)  # its first run warms up, as before
        best = min(ms)
        print(json.dumps({"impl": "transformers-sdpa", "shape": a.shape, "layers": L, "ctx": T,
                          "prefill_ms": best, "prefill_tok_s": T / (best / 1e3),
                          "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
                          "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
