#pragma once
// The decoder's CPU building blocks (fp32), shared by the forward pass, the backward pass and the trainer.
#include <vector>

#include "elastic/config.h"

namespace elastic {

// y[T, N] = x[T, K] * W[N, K]^T (+ b)
void linear(const float* x, const float* W, const std::vector<float>& b, float* y, int T, int N, int K);
// RMSNorm over rows of length n, fp32 math as in HF: x * rsqrt(mean(x^2) + eps) * w. In place allowed.
void rmsnorm_rows(const float* x, const float* w, float* y, int rows, int n, float eps);
// Inverse frequencies [hd/2] with optional llama3 scaling (same formulas as transformers' rope init).
std::vector<float> compute_rope_inv_freq(const ModelConfig& c);
// rotate_half RoPE in place on rows [T, H, hd] at positions pos0 + t.
void apply_rope(float* x, int T, int H, int hd, int pos0, const std::vector<float>& inv);

}  // namespace elastic
