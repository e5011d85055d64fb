#include "model/ops.h"

#include <cblas.h>
#include <omp.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace elastic {

namespace {

// OpenBLAS's sgemm chooses its kernel, and with it the summation order of each output, by the row count: row 0 of a
// 4-row product differs in the last bits from the same row computed alone. Those bits flip sampled tokens, so a seeded
// request would answer differently batched than alone. Here every output y[b, n] is one dot product whose order of
// operations depends only on K: the same bits for any batch size, any batch position and any thread count. Each
// weight row is read once for all batch rows, so at decode batch sizes this is memory-bound like the sgemm it
// replaces.

constexpr int kLanes = 16;  // two 8-wide accumulators; the scalar form below does the same operations in the same order

// Dot products of R rows of x (stride K) with one weight row w, written to y[r * ystride].
template <int R>
void dot_rows(const float* x, const float* w, int K, float* y, size_t ystride) {
  int k = 0;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 s0[R], s1[R];
  for (int r = 0; r < R; ++r) s0[r] = s1[r] = _mm256_setzero_ps();
  for (; k + kLanes <= K; k += kLanes) {
    const __m256 w0 = _mm256_loadu_ps(w + k), w1 = _mm256_loadu_ps(w + k + 8);
    for (int r = 0; r < R; ++r) {
      s0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + static_cast<size_t>(r) * K + k), w0, s0[r]);
      s1[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + static_cast<size_t>(r) * K + k + 8), w1, s1[r]);
    }
  }
  float lane[R][kLanes];
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(lane[r], s0[r]);
    _mm256_storeu_ps(lane[r] + 8, s1[r]);
  }
#else
  float lane[R][kLanes] = {};
  for (; k + kLanes <= K; k += kLanes)
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < kLanes; ++j) lane[r][j] = std::fma(x[static_cast<size_t>(r) * K + k + j], w[k + j], lane[r][j]);
#endif
  for (int r = 0; r < R; ++r) {
    const float* L = lane[r];
    float a[8];
    for (int j = 0; j < 8; ++j) a[j] = L[j] + L[j + 8];  // s0 + s1, lane by lane
    float s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    for (int t = k; t < K; ++t) s = std::fma(x[static_cast<size_t>(r) * K + t], w[t], s);
    y[r * ystride] = s;
  }
}

}  // namespace

void linear_rowwise(const float* x, const float* W, const std::vector<float>& b, float* y, int B, int N, int K) {
  const size_t ys = static_cast<size_t>(N);
#pragma omp parallel for schedule(static) if (static_cast<double>(N) * K * B > 1e5)
  for (int n = 0; n < N; ++n) {
    const float* w = W + static_cast<size_t>(n) * K;
    int r = 0;
    for (; r + 4 <= B; r += 4) dot_rows<4>(x + static_cast<size_t>(r) * K, w, K, y + r * ys + n, ys);
    for (; r < B; ++r) dot_rows<1>(x + static_cast<size_t>(r) * K, w, K, y + r * ys + n, ys);
    if (!b.empty())
      for (int t = 0; t < B; ++t) y[t * ys + n] += b[n];
  }
}

std::string blas_kernel_warning(const std::string& core, bool cpu_avx2, bool cpu_avx512) {
  // OpenBLAS's x86 cores without AVX2 kernels (its DYNAMIC_ARCH list); Sandybridge has AVX but not FMA.
  static const char* const old_cores[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom",
                                          "Opteron", "Opteron(SSE3)", "Barcelona", "Bobcat", "Sandybridge", "Katmai",
                                          "Coppermine", "Northwood", "Banias"};
  if (!cpu_avx2) return {};
  bool old = false;
  for (const char* c : old_cores) old = old || core == c;
  if (!old) return {};
  const std::string fit = cpu_avx512 ? "SkylakeX" : "Haswell";
  return "OpenBLAS runs its '" + core + "' kernels on this CPU, which has " + (cpu_avx512 ? "AVX-512" : "AVX2") +
         ": prompt processing is 2-3x slower than it can be. Set OPENBLAS_CORETYPE=" + fit +
         " in the environment (OpenBLAS reads it when it loads), or use an OpenBLAS that knows this CPU";
}

void sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
           float beta, float* C, int ldc) {
  // Once per process: OpenBLAS's pool would otherwise run beside the OpenMP threads that call it.
  static const bool blas_single_threaded = [] {
    openblas_set_num_threads(1);
    const std::string w = blas_kernel_warning(openblas_get_corename(), __builtin_cpu_supports("avx2"),
                                              __builtin_cpu_supports("avx512f"));
    if (!w.empty()) std::fprintf(stderr, "warning: %s\n", w.c_str());
    return true;
  }();
  (void)blas_single_threaded;
  const CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  // Below about a million multiply-adds a fork costs more than it saves.
  if (threads == 1 || static_cast<double>(M) * N * K < 1e6) {
    cblas_sgemm(CblasRowMajor, opa, opb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  // Each thread computes a slab of C: rows when C is taller than wide, else columns, in multiples of 16 so every
  // slab keeps OpenBLAS's full-width kernels. Each output is still one of OpenBLAS's dot products over K.
  const bool by_rows = M >= N;
  const int extent = by_rows ? M : N, slab = (extent / threads + 15) / 16 * 16;
#pragma omp parallel num_threads(threads)
  {
    const int i0 = std::min(extent, omp_get_thread_num() * slab), i1 = std::min(extent, i0 + slab);
    if (i1 > i0) {
      if (by_rows)  // rows i0..i1 of op(A): A's rows, or A's columns when transposed
        cblas_sgemm(CblasRowMajor, opa, opb, i1 - i0, N, K, alpha, ta ? A + i0 : A + static_cast<size_t>(i0) * lda,
                    lda, B, ldb, beta, C + static_cast<size_t>(i0) * ldc, ldc);
      else  // columns i0..i1 of op(B): B's columns, or B's rows when transposed
        cblas_sgemm(CblasRowMajor, opa, opb, M, i1 - i0, K, alpha, A, lda,
                    tb ? B + static_cast<size_t>(i0) * ldb : B + i0, ldb, beta, C + i0, ldc);
    }
  }
}

void linear(const float* x, const float* W, const std::vector<float>& b, float* y, int T, int N, int K) {
  if (T <= kRowwiseRows) return linear_rowwise(x, W, b, y, T, N, K);
  sgemm(false, true, T, N, K, 1.f, x, K, W, K, 0.f, y, N);
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
