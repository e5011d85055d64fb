#pragma once
// Dev area (not linked by the engine): a GEMV for decode's projections, y[m, n] (+)= sum_k x'[m, k] W[n, k], W in the
// Hugging Face [out, in] layout, bf16 inputs, fp32 accumulation. A warp owns an output feature and streams its row of
// W with 16-byte loads (four a lane in flight). Written to replace cuBLASLt's M = 1 path and the separate RMSNorm and
// SwiGLU launches in the GPU model's decode step; measured inside the model on an H100 (docs/PERFORMANCE.md, decode
// parts) it was faster for o_proj (0.52 vs 0.56 ms a step) and the logits, slower for the MLP (2.76 vs 2.50 + the
// norm), and 5% slower over the whole step (4.80 vs 4.57 ms at 8K), so the model stays on cuBLASLt. Kept, with its
// tests (tests/gpu/test_gemv_cuda.cpp, passing). The next attempt, without the suspects (the single-load tail passes and
// the wave of per-block prologues), is the engine's src/cuda/gemv_small_m.cu, which measured faster than cuBLASLt at
// 1-2 rows (docs/PERFORMANCE.md); the fused norms here are not in it.
//
// The input row can be made inside the kernel, which removes a launch and a round trip per use:
//   norm_w set:  x' = bf16(norm_w * (x * rsqrt(mean(x^2) + eps)))   (rmsnorm_bf16's formula and rounding)
//   swiglu:      x' = bf16(silu(g) * u) with x = [m, 2K] holding gate | up (swiglu_bf16's formula and rounding)
// so a fused GEMV gives the bits the separate kernels followed by this GEMV give. Each block rebuilds x' in shared
// memory (K * m bf16; x is a few KiB and comes from L2), so m is at most kGemvMaxRows.
#include <cuda_runtime.h>

#include <cstdint>

namespace elastic::cuda {

constexpr int kGemvMaxRows = 4;

struct GemvParams {
  const uint16_t* x = nullptr;       // [m, K] bf16, or [m, 2K] (gate | up) with swiglu
  const uint16_t* w = nullptr;       // [N, K] bf16
  void* y = nullptr;                 // [m, N] bf16, or fp32 with y_f32; must not overlap x
  int m = 1, n = 0, k = 0;
  bool y_f32 = false;
  bool accumulate = false;           // y = bf16(y + x'W^T) (the residual add); bf16 output only
  const uint16_t* norm_w = nullptr;  // [K] RMSNorm weight: x' is x's RMSNorm
  float eps = 1e-6f;
  bool swiglu = false;
};

// Throws std::invalid_argument naming the problem (shape, m > kGemvMaxRows, null pointer, overlapping x and y,
// accumulate with fp32 output, norm with swiglu).
void gemv_bf16(const GemvParams& p, cudaStream_t stream);

}  // namespace elastic::cuda
