// The CPU matrix products (model/ops.h) against a float64 reference on fresh random inputs: sgemm for every transpose
// combination and thread count, linear_rowwise's batch invariance, and linear's switch between the two.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <random>
#include <vector>

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
  for (const auto [M, N, K] : {std::tuple{130, 300, 70}, std::tuple{300, 130, 70}, std::tuple{5, 7, 3}})
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
  std::vector<float> alone(static_cast<size_t>(B) * N);
  {
    ThreadCount tc(1);
    for (int r = 0; r < B; ++r) linear_rowwise(x.data() + static_cast<size_t>(r) * K, W.data(), bias, alone.data() + static_cast<size_t>(r) * N, 1, N, K);
  }
  expect_linear_close(alone, x, W, bias, B, N, K);
  for (int threads : {1, 2, 4})
    for (int rows = 1; rows <= B; ++rows) {
      ThreadCount tc(threads);
      std::vector<float> y(static_cast<size_t>(rows) * N);
      linear_rowwise(x.data(), W.data(), bias, y.data(), rows, N, K);
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
  for (int T : {1, kRowwiseRows, kRowwiseRows + 1, 200}) {
    const std::vector<float> x = random_vec(static_cast<size_t>(T) * K, g);
    std::vector<float> y(static_cast<size_t>(T) * N);
    linear(x.data(), W.data(), bias, y.data(), T, N, K);
    SCOPED_TRACE(testing::Message() << T << " rows");
    expect_linear_close(y, x, W, bias, T, N, K);
    if (T <= kRowwiseRows) {  // the decode path is the batch-invariant one
      std::vector<float> r(y.size());
      linear_rowwise(x.data(), W.data(), bias, r.data(), T, N, K);
      EXPECT_EQ(r, y);
    }
  }
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
