// GPU test (CTest label "gpu", run on the GPU machine): CUDA RMSNorm vs the fp32 CPU formula, bf16 tolerance.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "elastic/cuda.h"
#include "gpu_test_util.h"

using namespace elastic;
using gpu_test::Dev;
using gpu_test::from_bf16;
using gpu_test::to_bf16;

TEST(CudaRmsNorm, MatchesCpuReference) {
  SKIP_WITHOUT_GPU();
  const int rows = 37, n = 4096;
  SEEDED_RNG(rng);
  std::normal_distribution<float> N(0.f, 1.f);
  std::vector<uint16_t> x(rows * n), w(n);
  for (auto& v : x) v = to_bf16(N(rng));
  for (auto& v : w) v = to_bf16(1.f + 0.1f * N(rng));
  Dev<uint16_t> dx(x), dw(w), dy(x.size());  // dy poisoned (all bits set: NaN)
  cuda::rmsnorm_bf16(dx.p, dw.p, dy.p, rows, n, 1e-6f);
  ELASTIC_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> y = dy.down();
  double max_err = 0, max_ref = 0;
  size_t bad = 0;  // non-finite outputs: std::max would pass over a NaN, so they are counted apart
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < n; ++i) ss += double(from_bf16(x[r * n + i])) * from_bf16(x[r * n + i]);
    const double inv = 1.0 / std::sqrt(ss / n + 1e-6);
    for (int i = 0; i < n; ++i) {
      const double ref = from_bf16(w[i]) * from_bf16(x[r * n + i]) * inv;
      const float got = from_bf16(y[r * n + i]);
      bad += !std::isfinite(got);
      max_err = std::max(max_err, std::abs(ref - got));
      max_ref = std::max(max_ref, std::abs(ref));
    }
  }
  EXPECT_EQ(bad, 0u) << "rows left unwritten (poisoned) or non-finite";
  EXPECT_LT(max_err / max_ref, 1e-2);
}
