"""PyTorch decode anchor on the GPU machine, the shape of bench_attention_gpu --paged: one query token per head of
a Qwen3-4B attention layer (32 query / 8 KV heads, d = 128, bf16) against T cached keys, through
scaled_dot_product_attention with enable_gqa on its cuDNN and flash backends; and the device-to-device copy rate.
K+V read GB/s counts the cache bytes once. Usage: python3 sdpa_decode_baseline.py [T ...]"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from cuda_timing import median_ms


def main():
    lengths = [int(x) for x in sys.argv[1:]] or [8192, 32768, 131072]
    hq, hkv, hd = 32, 8, 128
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), 10)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; copy (read + write) "
          f"{2 * src.numel() / ms / 1e6:.0f} GB/s\n")
    print("| T | backend | us/layer | K+V read GB/s |\n|---|---|---|---|")
    for t in lengths:
        q = torch.randn(1, hq, 1, hd, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, hkv, t, hd, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        for name, backend in (("cuDNN", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                              ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
                print(f"| {t} | SDPA {name} (enable_gqa) | {ms * 1e3:.1f} | {2 * k.numel() * 2 / ms / 1e6:.0f} |")
            except RuntimeError as e:
                print(f"| {t} | SDPA {name} (enable_gqa) | not run: {str(e).splitlines()[0][:80]} | |")
        del q, k, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
