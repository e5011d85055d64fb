"""PyTorch baselines on the GPU machine, same shapes as bench_attention_gpu: scaled_dot_product_attention with its
flash and cuDNN backends (Qwen3-4B attention: 32 query / 8 KV heads, d = 128, causal, bf16), and the bf16 matmul
ceiling (8192^3 torch.matmul on random data). TFLOP/s on the dense causal count 4 * d * Hq * T(T+1)/2.
Usage: python3 sdpa_baseline.py [T ...]"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from cuda_timing import median_ms


def main():
    lengths = [int(x) for x in sys.argv[1:]] or [8192, 16384, 32768, 65536, 131072]
    hq, hkv, hd = 32, 8, 128
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = median_ms(lambda: torch.matmul(a, b), 10)
    print(f"bf16 matmul ceiling: {2 * n**3 / ms * 1e-9:.1f} TFLOP/s ({n}^3, {ms:.3f} ms, {torch.cuda.get_device_name()})")
    del a, b
    print("\n| T | backend | ms | TFLOP/s (dense causal) |\n|---|---|---|---|")
    for t in lengths:
        q = torch.randn(1, hq, t, hd, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, hkv, t, hd, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(1, hkv, t, hd, device="cuda", dtype=torch.bfloat16)
        # GQA expanded outside the timed region (same FLOPs; not every backend takes enable_gqa).
        ke = k.repeat_interleave(hq // hkv, dim=1)
        ve = v.repeat_interleave(hq // hkv, dim=1)
        flops = 4.0 * hd * hq * t * (t + 1) / 2
        reps = 3 if t >= 65536 else 5
        for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                with sdpa_kernel(be):
                    ms = median_ms(lambda: F.scaled_dot_product_attention(q, ke, ve, is_causal=True), reps)
                print(f"| {t} | {name} | {ms:.3f} | {flops / ms * 1e-9:.1f} |", flush=True)
            except RuntimeError as e:  # a backend that refuses the shape says so in the table
                print(f"| {t} | {name} | failed: {str(e).splitlines()[0][:80]} | |", flush=True)
        del q, k, v, ke, ve
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
