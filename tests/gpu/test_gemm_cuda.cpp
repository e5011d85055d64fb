// GPU tests (label gpu): cuBLASLt projections (elastic::cuda::Gemm) against a CPU double reference on fresh random
// bf16 inputs. Outputs written with beta = 0 are poisoned with NaN first, so unwritten elements (or a C read when
// beta is 0) show up.
//
// Tolerances, as max |gpu - ref| / max |ref| per output: bf16 output 1e-2 (one bf16 rounding of the result is at
// most 2^-9 relative; fp32 accumulation adds far less), fp32 output 2e-3 (fp32 accumulation only; a wrong layout
// or a missed term gives errors of order 1).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "elastic/cuda.h"
#include "elastic/cuda_gemm.h"
#include "gpu_test_util.h"

namespace {

// Independent host bf16 rounding (the library's own conversion is not the reference here).
uint16_t f2bf(float f) { return elastic::gpu_test::to_bf16(f); }
float bf2f(uint16_t b) { return elastic::gpu_test::from_bf16(b); }
using elastic::gpu_test::kNaNBf16;

template <class T>
struct DevBuf {  // device buffer freed on scope exit
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) { ELASTIC_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T))); }
  explicit DevBuf(const std::vector<T>& h) : DevBuf(h.size()) { up(h); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void up(const std::vector<T>& h) {
    ELASTIC_CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> down() const {
    std::vector<T> h(n);
    ELASTIC_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

using elastic::gpu_test::random_bf16;

// ref[m, n] = sum_k X[m, k] W[n, k] in double. A product of two bf16 values is exact in float (8-bit significands),
// so each term is exact and only the double sum rounds. Eight rows at a time (X padded with zero rows) give eight
// independent sums per W row, so the loop is not bound by one add chain and W's row stays in cache.
std::vector<double> reference(const std::vector<uint16_t>& X, const std::vector<uint16_t>& W, int M, int N, int K) {
  constexpr int R = 8;
  const int Mp = (M + R - 1) / R * R;
  std::vector<float> xf(size_t(Mp) * K, 0.f), wf(W.size());
  for (size_t i = 0; i < X.size(); ++i) xf[i] = bf2f(X[i]);
  for (size_t i = 0; i < W.size(); ++i) wf[i] = bf2f(W[i]);
  std::vector<double> ref(size_t(M) * N);
  for (int m0 = 0; m0 < Mp; m0 += R) {
    const float* x = &xf[size_t(m0) * K];
    for (int n = 0; n < N; ++n) {
      const float* w = &wf[size_t(n) * K];
      double acc[R] = {};
      for (int k = 0; k < K; ++k)
        for (int r = 0; r < R; ++r) acc[r] += double(x[size_t(r) * K + k] * w[k]);
      for (int r = 0; r < R && m0 + r < M; ++r) ref[size_t(m0 + r) * N + n] = acc[r];
    }
  }
  return ref;
}

// max |got - ref| / max |ref|; non-finite outputs counted separately.
template <class Get>
double rel_err(const std::vector<double>& ref, Get got, size_t* bad) {
  double mx = 0, err = 0;
  *bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = got(i);
    if (!std::isfinite(g)) {
      ++*bad;
      continue;
    }
    mx = std::max(mx, std::abs(ref[i]));
    err = std::max(err, std::abs(g - ref[i]));
  }
  return mx > 0 ? err / mx : err;
}

struct Shape {
  int M, N, K;
};

// All four variants on one shape with fresh inputs: bf16 out, bf16 out + bias, bf16 out + bias + beta = 1
// accumulate, fp32 out. One double reference serves them all.
void check_shape(elastic::cuda::Gemm& g, const Shape& s, std::mt19937& rng, cudaStream_t stream) {
  const int M = s.M, N = s.N, K = s.K;
  const std::string tag = "M " + std::to_string(M) + " N " + std::to_string(N) + " K " + std::to_string(K);
  const auto X = random_bf16(size_t(M) * K, rng, 1.f);
  const auto W = random_bf16(size_t(N) * K, rng, 1.f / std::sqrt(float(K)));  // keeps |Y| of order 1
  const auto bias = random_bf16(N, rng, 1.f);
  const auto Y0 = random_bf16(size_t(M) * N, rng, 1.f);  // the residual that beta = 1 accumulates onto
  const auto ref = reference(X, W, M, N, K);

  DevBuf<uint16_t> dX(X), dW(W), dbias(bias), dY(size_t(M) * N);
  DevBuf<float> dYf(size_t(M) * N);
  size_t bad = 0;

  // bf16 out, beta = 0.
  dY.up(std::vector<uint16_t>(size_t(M) * N, kNaNBf16));
  g.bf16(dX.p, dW.p, dY.p, M, N, K, stream);
  ELASTIC_CUDA_CHECK(cudaStreamSynchronize(stream));
  {
    const auto y = dY.down();
    const double e = rel_err(ref, [&](size_t i) { return double(bf2f(y[i])); }, &bad);
    EXPECT_EQ(bad, 0u) << tag << " bf16: non-finite outputs";
    EXPECT_LT(e, 1e-2) << tag << " bf16";
  }

  // bf16 out + bias.
  std::vector<double> ref_b(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) ref_b[i] = ref[i] + bf2f(bias[i % N]);
  dY.up(std::vector<uint16_t>(size_t(M) * N, kNaNBf16));
  g.bf16(dX.p, dW.p, dY.p, M, N, K, stream, dbias.p);
  ELASTIC_CUDA_CHECK(cudaStreamSynchronize(stream));
  {
    const auto y = dY.down();
    const double e = rel_err(ref_b, [&](size_t i) { return double(bf2f(y[i])); }, &bad);
    EXPECT_EQ(bad, 0u) << tag << " bf16+bias: non-finite outputs";
    EXPECT_LT(e, 1e-2) << tag << " bf16+bias";
  }

  // bf16 out + bias, beta = 1: Y = Y0 + X W^T + bias.
  std::vector<double> ref_acc(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) ref_acc[i] = ref_b[i] + bf2f(Y0[i]);
  dY.up(Y0);
  g.bf16(dX.p, dW.p, dY.p, M, N, K, stream, dbias.p, 1.f);
  ELASTIC_CUDA_CHECK(cudaStreamSynchronize(stream));
  {
    const auto y = dY.down();
    const double e = rel_err(ref_acc, [&](size_t i) { return double(bf2f(y[i])); }, &bad);
    EXPECT_EQ(bad, 0u) << tag << " bf16+bias+beta1: non-finite outputs";
    EXPECT_LT(e, 1e-2) << tag << " bf16+bias+beta1";
  }

  // bf16 out, beta = 1, no bias (the plain residual add of the output projections).
  std::vector<double> ref_res(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) ref_res[i] = ref[i] + bf2f(Y0[i]);
  dY.up(Y0);
  g.bf16(dX.p, dW.p, dY.p, M, N, K, stream, nullptr, 1.f);
  ELASTIC_CUDA_CHECK(cudaStreamSynchronize(stream));
  {
    const auto y = dY.down();
    const double e = rel_err(ref_res, [&](size_t i) { return double(bf2f(y[i])); }, &bad);
    EXPECT_EQ(bad, 0u) << tag << " bf16+beta1: non-finite outputs";
    EXPECT_LT(e, 1e-2) << tag << " bf16+beta1";
  }

  // fp32 out.
  dYf.up(std::vector<float>(size_t(M) * N, NAN));
  g.bf16_out_f32(dX.p, dW.p, dYf.p, M, N, K, stream);
  ELASTIC_CUDA_CHECK(cudaStreamSynchronize(stream));
  {
    const auto y = dYf.down();
    const double e = rel_err(ref, [&](size_t i) { return double(y[i]); }, &bad);
    EXPECT_EQ(bad, 0u) << tag << " fp32: non-finite outputs";
    EXPECT_LT(e, 2e-3) << tag << " fp32";
  }
}

}  // namespace

TEST(CudaGemm, MatchesCpuReference) {
  if (elastic::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  SEEDED_RNG(rng);
  cudaStream_t stream = nullptr;
  ELASTIC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    elastic::cuda::Gemm g;
    for (const Shape& s : {Shape{1, 4096, 2560}, Shape{37, 1152, 576}, Shape{300, 8192, 1024}, Shape{13, 50000, 256}})
      check_shape(g, s, rng, stream);
    // The first shape again with fresh data: runs the cached plans.
    check_shape(g, Shape{1, 4096, 2560}, rng, stream);
  }
  ELASTIC_CUDA_CHECK(cudaStreamDestroy(stream));
}

// The small-M kernel (Gemm::set_small_m_rows): every variant at M 1..4 against the same reference, on the model's
// decode shapes (Qwen3-4B's q/k/v, o, gate/up, down; a K whose 16-byte chunks are not a multiple of 32 lanes x 8 in
// flight; an N not a multiple of the block's 8 warps); then a K not a multiple of 8 and M 5, which fall back to
// cuBLASLt. Each row's bits do not depend on M: row 0 of an M-row call equals the same row alone.
TEST(CudaGemm, SmallMKernelMatchesCpuReference) {
  if (elastic::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  SEEDED_RNG(rng);
  cudaStream_t stream = nullptr;
  ELASTIC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    elastic::cuda::Gemm g;
    g.set_small_m_rows(4);
    EXPECT_EQ(g.small_m_rows(), 4);
    for (int M = 1; M <= 4; ++M)
      for (const Shape& s : {Shape{M, 6144, 2560}, Shape{M, 2560, 4096}, Shape{M, 2560, 9728}, Shape{M, 1003, 2568},
                             Shape{M, 19456, 2560}})
        check_shape(g, s, rng, stream);
    check_shape(g, Shape{2, 77, 33}, rng, stream);     // K % 8 != 0: cuBLASLt
    check_shape(g, Shape{5, 2560, 4096}, rng, stream);  // M past the rows: cuBLASLt

    const int N = 1003, K = 2568;
    const auto X = random_bf16(size_t(4) * K, rng, 1.f);
    const auto W = random_bf16(size_t(N) * K, rng, 1.f / std::sqrt(float(K)));
    DevBuf<uint16_t> dX(X), dW(W), d1(N), d4(size_t(4) * N);
    g.bf16(dX.p, dW.p, d1.p, 1, N, K, stream);
    g.bf16(dX.p, dW.p, d4.p, 4, N, K, stream);
    ELASTIC_CUDA_CHECK(cudaStreamSynchronize(stream));
    const auto y1 = d1.down(), y4 = d4.down();
    EXPECT_TRUE(std::equal(y1.begin(), y1.end(), y4.begin())) << "row 0 alone differs from row 0 of 4";
    EXPECT_THROW(g.set_small_m_rows(5), std::invalid_argument);
  }
  ELASTIC_CUDA_CHECK(cudaStreamDestroy(stream));
}

// The small-M kernel's sum for one output, emulated on the host in the kernel's exact order: lane l takes W's 8-element
// chunks l, l + 32, ... in ascending order, each chunk's eight products accumulated by fma in element order, then the
// xor butterfly over offsets 16, 8, 4, 2, 1 (a float add is commutative, so every lane ends with the same bits).
static float small_m_order(const uint16_t* x, const uint16_t* w, int K) {
  float acc[32];
  for (int l = 0; l < 32; ++l) {
    float a = 0.f;
    for (int c = l; c < K / 8; c += 32)
      for (int e = 0; e < 8; ++e) a = std::fma(bf2f(w[size_t(c) * 8 + e]), bf2f(x[size_t(c) * 8 + e]), a);
    acc[l] = a;
  }
  for (int o = 16; o > 0; o >>= 1) {
    float next[32];
    for (int l = 0; l < 32; ++l) next[l] = acc[l] + acc[l ^ o];
    std::copy(next, next + 32, acc);
  }
  return acc[0];
}

// The calls set_small_m_rows covers run the small-M kernel, not cuBLASLt: every output has the bits of the kernel's
// order emulated on the host (cuBLASLt's summation order differs, so a fallback would fail here), for bf16 and fp32
// outputs, bias and beta = 1, at K whose chunks leave every tail length (K / 8 = 496: 240 chunks past the last pass of
// 256, the seventh tail slot used by some lanes and not others; 16 and 1 chunks: lanes with nothing to load). A
// misaligned X falls back to cuBLASLt and is still right.
TEST(CudaGemm, SmallMKernelRunsInItsOrderBitwise) {
  if (elastic::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  SEEDED_RNG(rng);
  elastic::cuda::Gemm g;
  g.set_small_m_rows(4);
  for (const Shape& s : {Shape{1, 6144, 2560}, Shape{4, 1003, 3968}, Shape{3, 77, 128}, Shape{2, 33, 8},
                         Shape{4, 2560, 9728}}) {
    const int M = s.M, N = s.N, K = s.K;
    const std::string tag = "M " + std::to_string(M) + " N " + std::to_string(N) + " K " + std::to_string(K);
    const auto X = random_bf16(size_t(M) * K, rng, 1.f);
    const auto W = random_bf16(size_t(N) * K, rng, 1.f / std::sqrt(float(K)));
    const auto bias = random_bf16(N, rng, 1.f);
    const auto Y0 = random_bf16(size_t(M) * N, rng, 1.f);
    std::vector<float> sum(size_t(M) * N);
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) sum[size_t(m) * N + n] = small_m_order(&X[size_t(m) * K], &W[size_t(n) * K], K);
    DevBuf<uint16_t> dX(X), dW(W), dbias(bias), dY(size_t(M) * N);
    DevBuf<float> dYf(size_t(M) * N);
    g.bf16_out_f32(dX.p, dW.p, dYf.p, M, N, K, nullptr);
    dY.up(Y0);
    g.bf16(dX.p, dW.p, dY.p, M, N, K, nullptr, dbias.p, 1.f);
    ELASTIC_CUDA_CHECK(cudaDeviceSynchronize());
    const auto yf = dYf.down();
    const auto y = dY.down();
    size_t off_f = 0, off_b = 0;
    for (size_t i = 0; i < sum.size(); ++i) {
      off_f += std::memcmp(&yf[i], &sum[i], 4) != 0;
      const float v = std::fma(1.f, bf2f(Y0[i]), sum[i] + bf2f(bias[i % N]));
      off_b += y[i] != f2bf(v);
    }
    EXPECT_EQ(off_f, 0u) << tag << ": fp32 outputs off the kernel's order";
    EXPECT_EQ(off_b, 0u) << tag << ": bf16 + bias + beta outputs off the kernel's order";
  }
  // X 8 bytes past a 16-byte boundary: cuBLASLt runs it, within check_shape's tolerance of the double reference.
  const int M = 2, N = 300, K = 256;
  const auto X = random_bf16(size_t(M) * K + 4, rng, 1.f);
  const auto W = random_bf16(size_t(N) * K, rng, 1.f / std::sqrt(float(K)));
  const auto ref = reference(std::vector<uint16_t>(X.begin() + 4, X.end()), W, M, N, K);
  DevBuf<uint16_t> dX(X), dW(W), dY(size_t(M) * N);
  g.bf16(dX.p + 4, dW.p, dY.p, M, N, K, nullptr);
  ELASTIC_CUDA_CHECK(cudaDeviceSynchronize());
  const auto y = dY.down();
  size_t bad = 0;
  EXPECT_LT(rel_err(ref, [&](size_t i) { return double(bf2f(y[i])); }, &bad), 1e-2);
  EXPECT_EQ(bad, 0u);
}

// Odd sizes (no dimension a multiple of 8) and the default stream.
TEST(CudaGemm, OddShapesDefaultStream) {
  if (elastic::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  SEEDED_RNG(rng);
  elastic::cuda::Gemm g(4u << 20);
  EXPECT_EQ(g.workspace_bytes(), size_t(4u << 20));
  check_shape(g, Shape{3, 77, 33}, rng, nullptr);
}

TEST(CudaGemm, RejectsBadShapes) {
  if (elastic::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";  // constructing a Gemm needs a device
  elastic::cuda::Gemm g;
  DevBuf<uint16_t> x(std::vector<uint16_t>(16, f2bf(1.f))), w(std::vector<uint16_t>(16, f2bf(1.f))), y(16);
  DevBuf<float> f(16);
  EXPECT_THROW(g.bf16(x.p, w.p, y.p, 0, 4, 4, nullptr), std::invalid_argument);
  EXPECT_THROW(g.bf16(x.p, w.p, y.p, 4, -1, 4, nullptr), std::invalid_argument);
  EXPECT_THROW(g.bf16(x.p, w.p, y.p, 4, 4, 0, nullptr, w.p, 1.f), std::invalid_argument);
  EXPECT_THROW(g.bf16_out_f32(x.p, w.p, f.p, 4, 4, -3, nullptr), std::invalid_argument);
  EXPECT_THROW(g.bf16(nullptr, w.p, y.p, 4, 4, 4, nullptr), std::invalid_argument);
  EXPECT_NO_THROW(g.bf16(x.p, w.p, y.p, 4, 4, 4, nullptr));  // still usable after the rejects: all ones -> 4
  ELASTIC_CUDA_CHECK(cudaDeviceSynchronize());
  for (uint16_t v : y.down()) EXPECT_EQ(bf2f(v), 4.f);
}

// Strided batches (XAttention's estimator: one product per KV head): every batch against its own double reference,
// batch strides larger than the matrices (gaps left poisoned and checked untouched), and the refusals.
TEST(CudaGemm, StridedBatchesMatchCpuReference) {
  if (elastic::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  SEEDED_RNG(rng);
  elastic::cuda::Gemm g;
  for (const Shape s : {Shape{256, 512, 2048}, Shape{37, 75, 64}}) {
    const int M = s.M, N = s.N, K = s.K, batch = 3;
    const int64_t sx = int64_t(M) * K + 64, sw = int64_t(N) * K + 128, sy = int64_t(M) * N + 32;
    const auto X = random_bf16(size_t(sx) * batch, rng, 1.f);
    const auto W = random_bf16(size_t(sw) * batch, rng, 1.f / std::sqrt(float(K)));
    DevBuf<uint16_t> dX(X), dW(W);
    DevBuf<float> dY(size_t(sy) * batch);
    dY.up(std::vector<float>(dY.n, NAN));
    g.bf16_out_f32_batched(dX.p, dW.p, dY.p, M, N, K, batch, sx, sw, sy, nullptr);
    ELASTIC_CUDA_CHECK(cudaDeviceSynchronize());
    const auto y = dY.down();
    for (int b = 0; b < batch; ++b) {
      const std::vector<uint16_t> xb(X.begin() + b * sx, X.begin() + b * sx + int64_t(M) * K),
          wb(W.begin() + b * sw, W.begin() + b * sw + int64_t(N) * K);
      const auto ref = reference(xb, wb, M, N, K);
      size_t bad = 0;
      const double e = rel_err(ref, [&](size_t i) { return double(y[size_t(b) * sy + i]); }, &bad);
      EXPECT_EQ(bad, 0u) << "batch " << b << " M " << M << ": non-finite outputs";
      EXPECT_LT(e, 2e-3) << "batch " << b << " M " << M;
      for (int64_t i = int64_t(M) * N; i < sy; ++i) EXPECT_TRUE(std::isnan(y[size_t(b * sy + i)])) << "gap written";
    }
  }
  DevBuf<uint16_t> x(16), w(16);
  DevBuf<float> f(64);
  EXPECT_THROW(g.bf16_out_f32_batched(x.p, w.p, f.p, 4, 4, 4, 0, 16, 16, 16, nullptr), std::invalid_argument);
  EXPECT_THROW(g.bf16_out_f32_batched(x.p, w.p, f.p, 4, 4, 4, 2, 16, 16, 15, nullptr), std::invalid_argument);
  EXPECT_THROW(g.bf16_out_f32_batched(x.p, w.p, f.p, 4, 4, 4, 2, -1, 16, 16, nullptr), std::invalid_argument);
}

// The activation-gradient form dX[M, K] (+)= dY[M, N] W[N, K] (no transpose of W), fp32 out, beta 0 and 1.
TEST(CudaGemm, BackwardDxMatchesCpuReference) {
  if (elastic::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  SEEDED_RNG(rng);
  elastic::cuda::Gemm g;
  for (const Shape& s : {Shape{300, 1152, 576}, Shape{37, 77, 33}, Shape{1000, 4096, 2560}}) {
    const int M = s.M, N = s.N, K = s.K;
    const std::string tag = "M " + std::to_string(M) + " N " + std::to_string(N) + " K " + std::to_string(K);
    const auto dY = random_bf16(size_t(M) * N, rng, 1.f);
    const auto W = random_bf16(size_t(N) * K, rng, 1.f / std::sqrt(float(N)));
    // Reference through the forward helper: dX = dY W = dY (W^T)^T, so transpose W into [K, N].
    std::vector<uint16_t> Wt(W.size());
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < K; ++k) Wt[size_t(k) * N + n] = W[size_t(n) * K + k];
    const auto ref = reference(dY, Wt, M, K, N);
    std::vector<float> base(size_t(M) * K);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (float& x : base) x = nd(rng);
    DevBuf<uint16_t> ddY(dY), dW(W);
    DevBuf<float> dX(std::vector<float>(size_t(M) * K, NAN));
    size_t bad = 0;
    g.bf16_dx_f32(ddY.p, dW.p, dX.p, M, N, K, nullptr);
    ELASTIC_CUDA_CHECK(cudaDeviceSynchronize());
    {
      const auto y = dX.down();
      const double e = rel_err(ref, [&](size_t i) { return double(y[i]); }, &bad);
      EXPECT_EQ(bad, 0u) << tag << " dx: non-finite outputs";
      EXPECT_LT(e, 2e-3) << tag << " dx";
    }
    dX.up(base);
    g.bf16_dx_f32(ddY.p, dW.p, dX.p, M, N, K, nullptr, 1.f);
    ELASTIC_CUDA_CHECK(cudaDeviceSynchronize());
    {
      std::vector<double> ref_acc(ref.size());
      for (size_t i = 0; i < ref.size(); ++i) ref_acc[i] = ref[i] + base[i];
      const auto y = dX.down();
      const double e = rel_err(ref_acc, [&](size_t i) { return double(y[i]); }, &bad);
      EXPECT_EQ(bad, 0u) << tag << " dx beta1: non-finite outputs";
      EXPECT_LT(e, 2e-3) << tag << " dx beta1";
    }
  }
}
