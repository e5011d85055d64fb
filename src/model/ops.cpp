#include "model/ops.h"

#include <cblas.h>

#include <cmath>

namespace elastic {

// y[T, N] = x[T, K] * W[N, K]^T (+ b)
void linear(const float* x, const float* W, const std::vector<float>& b, float* y, int T, int N, int K) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, N, K, 1.f, x, K, W, K, 0.f, y, N);
  if (!b.empty())
    for (int t = 0; t < T; ++t)
      for (int n = 0; n < N; ++n) y[static_cast<size_t>(t) * N + n] += b[n];
}

// RMSNorm over rows of length n, fp32 math as in HF: x * rsqrt(mean(x^2) + eps) * w.
void rmsnorm_rows(const float* x, const float* w, float* y, int rows, int n, float eps) {
#pragma omp parallel for schedule(static) if (rows > 16)
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<size_t>(r) * n;
    float* yr = y + static_cast<size_t>(r) * n;
    float ss = 0.f;
    for (int i = 0; i < n; ++i) ss += xr[i] * xr[i];
    const float inv = 1.f / std::sqrt(ss / n + eps);
    for (int i = 0; i < n; ++i) yr[i] = w[i] * (xr[i] * inv);
  }
}

// Inverse frequencies with optional llama3 scaling (same formulas as transformers' rope init).
std::vector<float> compute_rope_inv_freq(const ModelConfig& c) {
  const int half = c.head_dim / 2;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i)
    inv[i] = 1.f / static_cast<float>(std::pow(c.rope.theta, static_cast<double>(2 * i) / c.head_dim));
  if (c.rope.llama3) {
    const double orig = c.rope.original_max_positions, lf = c.rope.low_freq_factor, hf = c.rope.high_freq_factor;
    const double low_wavelen = orig / lf, high_wavelen = orig / hf;
    for (int i = 0; i < half; ++i) {
      const double f = inv[i], wavelen = 2.0 * M_PI / f;
      double r;
      if (wavelen > low_wavelen) r = f / c.rope.factor;
      else if (wavelen < high_wavelen) r = f;
      else {
        const double smooth = (orig / wavelen - lf) / (hf - lf);
        r = (1.0 - smooth) * f / c.rope.factor + smooth * f;
      }
      inv[i] = static_cast<float>(r);
    }
  }
  return inv;
}

// rotate_half RoPE in place on rows [T, H, hd] at positions pos0 + t.
void apply_rope(float* x, int T, int H, int hd, int pos0, const std::vector<float>& inv) {
  const int half = hd / 2;
#pragma omp parallel for schedule(static)
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < half; ++i) {
      const float ang = static_cast<float>(pos0 + t) * inv[i];  // fp32 product, as HF
      const float c = std::cos(ang), s = std::sin(ang);
      for (int h = 0; h < H; ++h) {
        float* r = x + (static_cast<size_t>(t) * H + h) * hd;
        const float x1 = r[i], x2 = r[i + half];
        r[i] = x1 * c - x2 * s;
        r[i + half] = x2 * c + x1 * s;
      }
    }
  }
}

}  // namespace elastic
