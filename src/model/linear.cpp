// y = x W^T over a WeightMatrix: the row-wise decode kernel (fp32 rows or ggml blocks widened in registers) and the
// prefill path (sgemm, block matrices widened one panel at a time).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "elastic/gguf.h"
#include "model/ops.h"

namespace elastic {

namespace {

// OpenBLAS's sgemm chooses its kernel, and with it the summation order of each output, by the row count: row 0 of a
// 4-row product differs in the last bits from the same row computed alone. Those bits flip sampled tokens, so a seeded
// request would answer differently batched than alone. Here every output y[b, n] is one dot product whose order of
// operations depends only on K: the same bits for any batch size, any batch position and any thread count. Each
// weight row is read once for all batch rows, so at decode batch sizes this is memory-bound, and reading the file's
// blocks instead of fp32 copies is what makes it fast (Q4_1: 0.625 bytes per weight instead of 4).
//
// The order: lanes j of two 8-wide accumulators s0, s1 take elements k + j and k + 8 + j of each 16-element step, by
// fused multiply-add; then lane j of s0 plus lane j of s1, a fixed pairwise tree over the 8 sums, and a scalar tail.
// The block kernels take their 32 elements as two such steps, so a block row gives the bits of its fp32 widening.

constexpr int kLanes = 16;

template <int R>
void finish(const float (&lane)[R][kLanes], const float* x, const float* w, int k, int K, float* y, size_t ystride) {
  for (int r = 0; r < R; ++r) {
    const float* L = lane[r];
    float a[8];
    for (int j = 0; j < 8; ++j) a[j] = L[j] + L[j + 8];  // s0 + s1, lane by lane
    float s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    for (int t = k; t < K; ++t) s = std::fma(x[static_cast<size_t>(r) * K + t], w[t], s);
    y[r * ystride] = s;
  }
}

// Dot products of R rows of x (stride K) with one fp32 weight row w, written to y[r * ystride].
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
  finish<R>(lane, x, w, k, K, y, ystride);
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
uint16_t rd16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// The 32 weights of one block as four 8-wide vectors in element order, by gguf::dequantize_row's formulas
// (one rounding each: d*q, d*(nibble-8), fma(d, nibble, m)); fp16 scales by F16C, exact like fp16_to_fp32.
template <WeightFormat F>
inline void widen_block(const uint8_t* blk, __m256 (&w)[4]) {
  const __m256 d = _mm256_set1_ps(_cvtsh_ss(rd16(blk)));
  if constexpr (F == WeightFormat::Q8_0) {
    const uint8_t* q = blk + 2;
    for (int i = 0; i < 4; ++i) {
      const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * i));
      w[i] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)));
    }
  } else {
    const uint8_t* q = blk + (F == WeightFormat::Q4_1 ? 4 : 2);
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)), mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(bytes, mask), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
    const __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};  // elements 0-7, 8-15, 16-23, 24-31
    if constexpr (F == WeightFormat::Q4_1) {
      const __m256 m = _mm256_set1_ps(_cvtsh_ss(rd16(blk + 2)));
      for (int i = 0; i < 4; ++i) w[i] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(part[i])), m);
    } else {
      const __m256i eight = _mm256_set1_epi32(8);
      for (int i = 0; i < 4; ++i)
        w[i] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(part[i]), eight)));
    }
  }
}

// Dot products of R rows of x with one block-format weight row (K a multiple of 32), in dot_rows' order.
template <WeightFormat F, int R>
void dot_rows_blocks(const float* x, const uint8_t* wrow, int K, float* y, size_t ystride) {
  const size_t bb = weight_block_bytes(F);
  __m256 s0[R], s1[R];
  for (int r = 0; r < R; ++r) s0[r] = s1[r] = _mm256_setzero_ps();
  for (int k = 0; k < K; k += kWeightBlock, wrow += bb) {
    __m256 w[4];
    widen_block<F>(wrow, w);
    for (int half = 0; half < 2; ++half) {
      const int kk = k + 16 * half;
      for (int r = 0; r < R; ++r) {
        const float* xr = x + static_cast<size_t>(r) * K + kk;
        s0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xr), w[2 * half], s0[r]);
        s1[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 8), w[2 * half + 1], s1[r]);
      }
    }
  }
  float lane[R][kLanes];
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(lane[r], s0[r]);
    _mm256_storeu_ps(lane[r] + 8, s1[r]);
  }
  finish<R>(lane, x, nullptr, K, K, y, ystride);
}
#else
// Without AVX2: each block widened by dequantize_row, then dot_rows' scalar order.
template <WeightFormat F, int R>
void dot_rows_blocks(const float* x, const uint8_t* wrow, int K, float* y, size_t ystride) {
  const gguf::GgmlType t = F == WeightFormat::Q8_0 ? gguf::GgmlType::Q8_0
                           : F == WeightFormat::Q4_0 ? gguf::GgmlType::Q4_0
                                                     : gguf::GgmlType::Q4_1;
  const size_t bb = weight_block_bytes(F);
  float lane[R][kLanes] = {};
  for (int k = 0; k < K; k += kWeightBlock, wrow += bb) {
    float w[kWeightBlock];
    gguf::dequantize_row(t, wrow, w, kWeightBlock);
    for (int s = 0; s < kWeightBlock; s += kLanes)
      for (int r = 0; r < R; ++r)
        for (int j = 0; j < kLanes; ++j)
          lane[r][j] = std::fma(x[static_cast<size_t>(r) * K + k + s + j], w[s + j], lane[r][j]);
  }
  finish<R>(lane, x, nullptr, K, K, y, ystride);
}
#endif

template <int R>
void dot_rows_any(WeightFormat f, const float* x, const uint8_t* wrow, int K, float* y, size_t ystride) {
  switch (f) {
    case WeightFormat::F32: return dot_rows<R>(x, reinterpret_cast<const float*>(wrow), K, y, ystride);
    case WeightFormat::Q8_0: return dot_rows_blocks<WeightFormat::Q8_0, R>(x, wrow, K, y, ystride);
    case WeightFormat::Q4_0: return dot_rows_blocks<WeightFormat::Q4_0, R>(x, wrow, K, y, ystride);
    case WeightFormat::Q4_1: return dot_rows_blocks<WeightFormat::Q4_1, R>(x, wrow, K, y, ystride);
  }
}

void add_bias(const std::vector<float>& b, float* y, int T, int N) {
  if (b.empty()) return;
  for (int t = 0; t < T; ++t)
    for (int n = 0; n < N; ++n) y[static_cast<size_t>(t) * N + n] += b[n];
}

// Scratch of one widened panel, in floats: a matrix up to this size is one sgemm call, the same call as for its fp32
// copy; larger ones (an output layer of a large vocabulary, say) go panel by panel.
constexpr int64_t kPanelFloats = int64_t{1} << 23;  // 32 MiB

}  // namespace

void linear_rowwise(const float* x, const WeightMatrix& W, const std::vector<float>& b, float* y, int B) {
  const int N = static_cast<int>(W.rows()), K = static_cast<int>(W.cols());
  const WeightFormat f = W.format();
  const size_t ys = static_cast<size_t>(N);
  // A block-format row is cheaper to read than an fp32 one: the threshold counts multiply-adds either way.
#pragma omp parallel for schedule(static) if (static_cast<double>(N) * K * B > 1e5)
  for (int n = 0; n < N; ++n) {
    const uint8_t* w = W.row_data(n);
    int r = 0;
    for (; r + 4 <= B; r += 4) dot_rows_any<4>(f, x + static_cast<size_t>(r) * K, w, K, y + r * ys + n, ys);
    for (; r < B; ++r) dot_rows_any<1>(f, x + static_cast<size_t>(r) * K, w, K, y + r * ys + n, ys);
    if (!b.empty())
      for (int t = 0; t < B; ++t) y[t * ys + n] += b[n];
  }
}

void linear(const float* x, const WeightMatrix& W, const std::vector<float>& b, float* y, int T) {
  if (T <= kRowwiseRows) return linear_rowwise(x, W, b, y, T);
  const int N = static_cast<int>(W.rows()), K = static_cast<int>(W.cols());
  if (W.is_f32()) {
    sgemm(false, true, T, N, K, 1.f, x, K, W.f32().data(), K, 0.f, y, N);
  } else {
    // Kept per thread across calls: re-faulting a fresh buffer per projection would cost more than the widening.
    static thread_local std::vector<float> panel;
    const int rows = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(N, kPanelFloats / K)));
    panel.resize(static_cast<size_t>(rows) * K);
    for (int n0 = 0; n0 < N; n0 += rows) {
      const int n = std::min(rows, N - n0);
      W.rows_to_f32(n0, n, panel.data());
      sgemm(false, true, T, n, K, 1.f, x, K, panel.data(), K, 0.f, y + n0, N);
    }
  }
  add_bias(b, y, T, N);
}

}  // namespace elastic
