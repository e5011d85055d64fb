// The CPU matrix products (model/ops.h) against a float64 reference on fresh random inputs: sgemm for every transpose
// combination and thread count, linear_rowwise's batch invariance, linear's switch between the two, and block-format
// weights (Q8_0, Q4_0, Q4_1) read in place against their fp32 widening.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "elastic/gguf.h"
#include "elastic/weight_matrix.h"
#include "model/ops.h"

namespace elastic {
namespace {

std::vector<float> random_vec(size_t n, std::mt19937& g) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// Restores the OpenMP thread count a test changes.
struct ThreadCount {
  int saved = omp_get_max_threads();
  explicit ThreadCount(int t) { omp_set_num_threads(t); }
  ~ThreadCount() { omp_set_num_threads(saved); }
};

// fp32 products of K terms of unit normals: each output is within a few ulps per term of the exact sum, so the bound
// scales with sqrt(K) times the magnitude sum; 1e-5 relative to sum |a||b| is about 80 ulps.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& mag) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5 * mag[i] + 1e-6) << "output " << i;
}

// got[T, N] against x[T, K] W[N, K]^T + bias in float64 (expect_close's bound from the magnitude sums).
void expect_linear_close(const std::vector<float>& got, const std::vector<float>& x, const std::vector<float>& W,
                         const std::vector<float>& bias, int T, int N, int K) {
  std::vector<double> want(static_cast<size_t>(T) * N), mag(want.size());
  for (int t = 0; t < T; ++t)
    for (int n = 0; n < N; ++n) {
      double s = bias[n], sm = std::abs(bias[n]);
      for (int k = 0; k < K; ++k) {
        const double p = double(x[static_cast<size_t>(t) * K + k]) * W[static_cast<size_t>(n) * K + k];
        s += p, sm += std::abs(p);
      }
      want[static_cast<size_t>(t) * N + n] = s, mag[static_cast<size_t>(t) * N + n] = sm;
    }
  expect_close(got, want, mag);
}

TEST(Sgemm, EveryTransposeAndThreadCountMatchesFloat64) {
  std::mt19937 g(7);
  // 130 x 300 x 70 is above sgemm's threading threshold; the sizes are not multiples of 16 so the last slab is short.
  // 12 x 257 and 257 x 12 (x 400) leave one column or row past 2 x 128: a slab rounded down would skip it.
  for (const auto [M, N, K] : {std::tuple{130, 300, 70}, std::tuple{300, 130, 70}, std::tuple{5, 7, 3},
                               std::tuple{12, 257, 400}, std::tuple{257, 12, 400}})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        const std::vector<float> A = random_vec(static_cast<size_t>(M) * K, g), B = random_vec(static_cast<size_t>(K) * N, g),
                                 C0 = random_vec(static_cast<size_t>(M) * N, g);
        const int lda = ta ? M : K, ldb = tb ? K : N;
        auto a = [&](int m, int k) { return double(ta ? A[static_cast<size_t>(k) * lda + m] : A[static_cast<size_t>(m) * lda + k]); };
        auto b = [&](int k, int n) { return double(tb ? B[static_cast<size_t>(n) * ldb + k] : B[static_cast<size_t>(k) * ldb + n]); };
        std::vector<double> want(C0.size()), mag(C0.size());
        for (int m = 0; m < M; ++m)
          for (int n = 0; n < N; ++n) {
            double s = 0, sm = 0;
            for (int k = 0; k < K; ++k) s += a(m, k) * b(k, n), sm += std::abs(a(m, k) * b(k, n));
            want[static_cast<size_t>(m) * N + n] = 0.5 * s + 2.0 * C0[static_cast<size_t>(m) * N + n];
            mag[static_cast<size_t>(m) * N + n] = sm + 2.0 * std::abs(C0[static_cast<size_t>(m) * N + n]);
          }
        for (int threads : {1, 2, 3}) {
          ThreadCount tc(threads);
          std::vector<float> C = C0;
          sgemm(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 2.f, C.data(), N);
          SCOPED_TRACE(testing::Message() << M << "x" << N << "x" << K << " ta " << ta << " tb " << tb << " threads " << threads);
          expect_close(C, want, mag);
        }
      }
}

TEST(LinearRowwise, EveryRowHasTheSameBitsInAnyBatchAndThreadCount) {
  std::mt19937 g(11);
  const int N = 333, K = 200, B = 9;  // K not a multiple of the 16 lanes: the scalar tail runs too
  const std::vector<float> W = random_vec(static_cast<size_t>(N) * K, g), x = random_vec(static_cast<size_t>(B) * K, g),
                           bias = random_vec(N, g);
  const WeightMatrix Wm = WeightMatrix::from_f32(W, N, K);
  std::vector<float> alone(static_cast<size_t>(B) * N);
  {
    ThreadCount tc(1);
    for (int r = 0; r < B; ++r) linear_rowwise(x.data() + static_cast<size_t>(r) * K, Wm, bias, alone.data() + static_cast<size_t>(r) * N, 1);
  }
  expect_linear_close(alone, x, W, bias, B, N, K);
  for (int threads : {1, 2, 4})
    for (int rows = 1; rows <= B; ++rows) {
      ThreadCount tc(threads);
      std::vector<float> y(static_cast<size_t>(rows) * N);
      linear_rowwise(x.data(), Wm, bias, y.data(), rows);
      for (size_t i = 0; i < y.size(); ++i)
        ASSERT_EQ(y[i], alone[i]) << rows << " rows, " << threads << " threads, output " << i;
    }
}

// linear: up to kRowwiseRows rows go through linear_rowwise (decode reads the weights in place, batch-invariant),
// more through sgemm; both agree with float64 and carry the bias.
TEST(Linear, SmallAndLargeRowCountsMatchFloat64) {
  std::mt19937 g(3);
  const int N = 96, K = 64;
  const std::vector<float> W = random_vec(static_cast<size_t>(N) * K, g), bias = random_vec(N, g);
  const WeightMatrix Wm = WeightMatrix::from_f32(W, N, K);
  for (int T : {1, kRowwiseRows, kRowwiseRows + 1, 200}) {
    const std::vector<float> x = random_vec(static_cast<size_t>(T) * K, g);
    std::vector<float> y(static_cast<size_t>(T) * N);
    linear(x.data(), Wm, bias, y.data(), T);
    SCOPED_TRACE(testing::Message() << T << " rows");
    expect_linear_close(y, x, W, bias, T, N, K);
    if (T <= kRowwiseRows) {  // the decode path is the batch-invariant one
      std::vector<float> r(y.size());
      linear_rowwise(x.data(), Wm, bias, r.data(), T);
      EXPECT_EQ(r, y);
    }
  }
}

// Random blocks of a ggml format: fp16 scales over several magnitudes (subnormal ones included), random quants.
WeightMatrix random_blocks(WeightFormat f, int N, int K, std::mt19937& g) {
  const size_t bb = weight_block_bytes(f), nb = static_cast<size_t>(N) * (K / kWeightBlock);
  std::vector<uint8_t> bytes(nb * bb);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  for (size_t b = 0; b < nb; ++b) {
    uint8_t* p = bytes.data() + b * bb;
    for (size_t i = 0; i < bb; ++i) p[i] = static_cast<uint8_t>(byte(g));
    auto put16 = [&](uint8_t* at, float v) {
      const uint16_t h = gguf::fp32_to_fp16(v);
      std::memcpy(at, &h, 2);
    };
    put16(p, b % 17 == 0 ? 3e-6f : scale(g));  // 3e-6 is an fp16 subnormal
    if (f == WeightFormat::Q4_1) put16(p + 2, scale(g) * 4);
  }
  return WeightMatrix::from_blocks(f, std::move(bytes), N, K);
}

// A block-format matrix read in place (widened in registers) gives exactly the bits of its fp32 widening, on the decode
// path at every batch size and thread count, and on the prefill path (at the same thread count) while the matrix fits
// one panel; every form also agrees with float64 over the widened values. The prefill path is not compared across
// thread counts: sgemm splits the product into one call per thread, and OpenBLAS may pick another kernel for a
// smaller call (on an AMD EPYC with its Zen kernels, 64 x 200 x 320 at 1 and 2 threads differ in 432 outputs).
TEST(LinearBlocks, BlockFormatsGiveTheBitsOfTheirFp32Widening) {
  std::mt19937 g(5);
  const int N = 200, K = 320;  // K = 10 blocks
  for (WeightFormat f : {WeightFormat::Q8_0, WeightFormat::Q4_0, WeightFormat::Q4_1}) {
    SCOPED_TRACE(weight_format_name(f));
    const WeightMatrix Q = random_blocks(f, N, K, g);
    const WeightMatrix F = WeightMatrix::from_f32(Q.to_f32(), N, K);
    std::vector<float> row(K);
    Q.rows_to_f32(7, 1, row.data());
    EXPECT_TRUE(std::equal(row.begin(), row.end(), F.f32().begin() + 7 * K));
    const std::vector<float> bias = random_vec(N, g);
    for (int T : {1, 3, 4, 5, kRowwiseRows, kRowwiseRows + 1, 64}) {
      const std::vector<float> x = random_vec(static_cast<size_t>(T) * K, g);
      std::vector<float> want(static_cast<size_t>(T) * N);
      linear(x.data(), F, bias, want.data(), T);
      expect_linear_close(want, x, F.f32(), bias, T, N, K);
      for (int threads : {1, 2}) {
        ThreadCount tc(threads);
        if (T > kRowwiseRows) linear(x.data(), F, bias, want.data(), T);  // the fp32 product at this thread count
        std::vector<float> got(want.size());
        linear(x.data(), Q, bias, got.data(), T);
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_EQ(got[i], want[i]) << T << " rows, " << threads << " threads, output " << i;
      }
    }
  }
}

// A matrix over one panel (8M weights) is widened and multiplied panel by panel: still within float64's bound.
TEST(LinearBlocks, MatricesLargerThanOnePanelGoPanelByPanel) {
  std::mt19937 g(9);
  const int N = 8200, K = 1056, T = 12;  // 8.66M weights: two panels
  const WeightMatrix Q = random_blocks(WeightFormat::Q4_1, N, K, g);
  const std::vector<float> x = random_vec(static_cast<size_t>(T) * K, g), none;
  std::vector<float> y(static_cast<size_t>(T) * N);
  linear(x.data(), Q, none, y.data(), T);
  expect_linear_close(y, x, Q.to_f32(), std::vector<float>(N, 0.f), T, N, K);
}

TEST(WeightMatrixTest, FormatsAreCheckedAndFp32ReadersRefuseBlocks) {
  std::mt19937 g(2);
  WeightMatrix Q = random_blocks(WeightFormat::Q8_0, 4, 64, g);
  EXPECT_EQ(Q.bytes(), 4u * 2 * 34);
  try {
    (void)Q.f32();
    FAIL() << "f32() of a Q8_0 matrix";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("Q8_0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(WeightMatrix::from_blocks(WeightFormat::Q4_1, std::vector<uint8_t>(40), 1, 48), std::invalid_argument);
  EXPECT_THROW(WeightMatrix::from_blocks(WeightFormat::Q4_1, std::vector<uint8_t>(39), 1, 64), std::invalid_argument);
  EXPECT_THROW(WeightMatrix::from_f32(std::vector<float>(5), 2, 3), std::invalid_argument);
  // permute_rows moves whole rows in either form; widen keeps the values.
  const std::vector<float> before = Q.to_f32();
  Q.permute_rows({2, 0, 3, 1});
  std::vector<float> r(64);
  Q.rows_to_f32(1, 1, r.data());
  EXPECT_TRUE(std::equal(r.begin(), r.end(), before.begin()));
  Q.widen();
  ASSERT_TRUE(Q.is_f32());
  EXPECT_TRUE(std::equal(r.begin(), r.end(), Q.f32().begin() + 64));
  WeightMatrix F = WeightMatrix::from_f32(before, 4, 64);
  F.permute_rows({2, 0, 3, 1});
  EXPECT_EQ(F.f32(), Q.f32());
}

TEST(BlasKernels, AWarningNamesTheRemedyOnlyWhenOpenBlasKernelsAreOlderThanTheCpu) {
  const std::string w = blas_kernel_warning("Prescott", true, true);
  EXPECT_NE(w.find("'Prescott' kernels"), std::string::npos) << w;
  EXPECT_NE(w.find("OPENBLAS_CORETYPE=SkylakeX"), std::string::npos) << w;
  EXPECT_NE(blas_kernel_warning("Sandybridge", true, false).find("OPENBLAS_CORETYPE=Haswell"), std::string::npos);
  EXPECT_EQ(blas_kernel_warning("Prescott", false, false), "");  // an old CPU: the kernels fit it
  EXPECT_EQ(blas_kernel_warning("SkylakeX", true, true), "");
  EXPECT_EQ(blas_kernel_warning("Haswell", true, false), "");
  EXPECT_EQ(blas_kernel_warning("Zen", true, false), "");
}

}  // namespace
}  // namespace elastic
