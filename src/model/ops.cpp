#include "model/ops.h"

#include <cblas.h>
#include <omp.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace elastic {

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
  // Rounded up twice (to a share per thread, then to 16): rounding the share down lost the last rows or columns
  // whenever extent / threads was a multiple of 16 with a remainder (257 columns on 2 threads computed 256).
  const int extent = by_rows ? M : N, slab = ((extent + threads - 1) / threads + 15) / 16 * 16;
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

#if defined(__AVX2__)
extern "C" __m256 _ZGVdN8v_expf(__m256);  // glibc's libmvec
#endif
void exp_inplace(float* x, int n) {
  int i = 0;
#if defined(__AVX2__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _ZGVdN8v_expf(_mm256_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) x[i] = std::exp(x[i]);
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
