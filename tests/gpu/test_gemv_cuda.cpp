// GPU tests (label gpu): the dev area's GEMV (dev/cuda/gemv.h) on fresh random bf16 inputs.
//
// Against a CPU double reference of y = x' W^T: max |gpu - ref| / max |ref| below 1e-2 for bf16 outputs (one bf16
// rounding is 2^-9 relative; fp32 accumulation adds far less) and 2e-3 for fp32 outputs. The fused input forms are
// also checked bit for bit: GEMV(RMSNorm fused) equals rmsnorm_bf16_stream then GEMV on its output, and GEMV(SwiGLU
// fused) equals swiglu_bf16 then GEMV, because the fused prologue promises the separate kernels' bits. Outputs start
// as NaN (poisoned buffers), so an unwritten feature shows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "gemv.h"
#include "elastic/cuda_ops.h"
#include "gpu_test_util.h"

namespace {

using elastic::cuda::GemvParams;
using elastic::gpu_test::Dev;
using elastic::gpu_test::from_bf16;
using elastic::gpu_test::random_bf16;

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double d : v) m = std::max(m, std::abs(d));
  return m;
}

// ref[r, n] = sum_k xin[r, k] W[n, k] in double (xin already bf16 values).
std::vector<double> reference(const std::vector<float>& xin, const std::vector<uint16_t>& W, int m, int n, int k) {
  std::vector<double> ref(size_t(m) * n, 0.0);
  std::vector<float> wf(static_cast<size_t>(k));
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < k; ++i) wf[i] = from_bf16(W[size_t(j) * k + i]);
    for (int r = 0; r < m; ++r) {
      double s = 0;
      for (int i = 0; i < k; ++i) s += double(xin[size_t(r) * k + i]) * wf[i];
      ref[size_t(r) * n + j] = s;
    }
  }
  return ref;
}

struct Case {
  int m, n, k;
};

// Plain input, bf16 and fp32 outputs, with and without accumulation.
void check_plain(const Case& c, std::mt19937& rng) {
  SCOPED_TRACE("m " + std::to_string(c.m) + " n " + std::to_string(c.n) + " k " + std::to_string(c.k));
  const auto X = random_bf16(size_t(c.m) * c.k, rng, 1.f), W = random_bf16(size_t(c.n) * c.k, rng, 0.05f);
  const auto Y0 = random_bf16(size_t(c.m) * c.n, rng, 1.f);
  std::vector<float> xin(X.size());
  for (size_t i = 0; i < X.size(); ++i) xin[i] = from_bf16(X[i]);
  const std::vector<double> ref = reference(xin, W, c.m, c.n, c.k);
  Dev<uint16_t> dX(X), dW(W), dY(size_t(c.m) * c.n);
  Dev<float> dYf(size_t(c.m) * c.n);
  elastic::gpu_test::Stream st;
  GemvParams p;
  p.x = dX.p, p.w = dW.p, p.m = c.m, p.n = c.n, p.k = c.k;
  // bf16 out.
  p.y = dY.p;
  elastic::cuda::gemv_bf16(p, st.s);
  const double scale = max_abs(ref);
  {
    const auto y = dY.down();
    double e = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_TRUE(std::isfinite(from_bf16(y[i]))) << "output " << i << " not written";
      e = std::max(e, std::abs(from_bf16(y[i]) - ref[i]) / scale);
    }
    EXPECT_LT(e, 1e-2) << "bf16 out";
  }
  // fp32 out.
  p.y = dYf.p, p.y_f32 = true;
  elastic::cuda::gemv_bf16(p, st.s);
  {
    const auto y = dYf.down();
    double e = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_TRUE(std::isfinite(y[i])) << "output " << i << " not written";
      e = std::max(e, std::abs(y[i] - ref[i]) / scale);
    }
    EXPECT_LT(e, 2e-3) << "fp32 out";
  }
  // Accumulate into Y0 (the residual add).
  dY.up(Y0);
  p.y = dY.p, p.y_f32 = false, p.accumulate = true;
  elastic::cuda::gemv_bf16(p, st.s);
  {
    const auto y = dY.down();
    double e = 0, s = 0;
    for (size_t i = 0; i < y.size(); ++i) s = std::max(s, std::abs(ref[i] + from_bf16(Y0[i])));
    for (size_t i = 0; i < y.size(); ++i) e = std::max(e, std::abs(from_bf16(y[i]) - (ref[i] + from_bf16(Y0[i]))) / s);
    EXPECT_LT(e, 1e-2) << "accumulate";
  }
}

}  // namespace

TEST(CudaGemv, MatchesCpuReference) {
  SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  // Decode's shapes (Qwen3-4B's o_proj and down, SmolLM2's qkv), every row count, and odd k (the scalar path).
  for (const Case& c : {Case{1, 2560, 4096}, Case{1, 2560, 9728}, Case{2, 960, 576}, Case{3, 1000, 1536},
                        Case{4, 333, 2560}, Case{1, 77, 33}, Case{4, 129, 200}, Case{2, 5, 8}})
    check_plain(c, rng);
}

TEST(CudaGemv, FusedNormEqualsNormThenGemvBitwise) {
  SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  elastic::gpu_test::Stream st;
  for (const Case& c : {Case{1, 6144, 2560}, Case{3, 1000, 576}, Case{2, 70, 100}}) {
    SCOPED_TRACE("m " + std::to_string(c.m) + " k " + std::to_string(c.k));
    const auto X = random_bf16(size_t(c.m) * c.k, rng, 3.f), W = random_bf16(size_t(c.n) * c.k, rng, 0.05f);
    const auto G = random_bf16(size_t(c.k), rng, 1.f);
    Dev<uint16_t> dX(X), dW(W), dG(G), dXn(size_t(c.m) * c.k), dA(size_t(c.m) * c.n), dB(size_t(c.m) * c.n);
    elastic::cuda::rmsnorm_bf16_stream(dX.p, dG.p, dXn.p, c.m, c.k, 1e-6f, st.s);
    GemvParams p;
    p.x = dXn.p, p.w = dW.p, p.y = dA.p, p.m = c.m, p.n = c.n, p.k = c.k;
    elastic::cuda::gemv_bf16(p, st.s);
    p.x = dX.p, p.y = dB.p, p.norm_w = dG.p, p.eps = 1e-6f;
    elastic::cuda::gemv_bf16(p, st.s);
    const auto a = dA.down(), b = dB.down();
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_TRUE(std::isfinite(from_bf16(b[i]))) << i;
      ASSERT_EQ(a[i], b[i]) << "feature " << i;
    }
  }
}

TEST(CudaGemv, FusedSwigluEqualsSwigluThenGemvBitwise) {
  SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  elastic::gpu_test::Stream st;
  for (const Case& c : {Case{1, 2560, 9728}, Case{4, 300, 1536}, Case{1, 31, 45}}) {
    SCOPED_TRACE("m " + std::to_string(c.m) + " k " + std::to_string(c.k));
    const auto GU = random_bf16(size_t(c.m) * 2 * c.k, rng, 2.f), W = random_bf16(size_t(c.n) * c.k, rng, 0.05f);
    Dev<uint16_t> dGU(GU), dW(W), dAct(size_t(c.m) * c.k), dA(size_t(c.m) * c.n), dB(size_t(c.m) * c.n);
    elastic::cuda::swiglu_bf16(dGU.p, dAct.p, c.m, c.k, st.s);
    GemvParams p;
    p.x = dAct.p, p.w = dW.p, p.y = dA.p, p.m = c.m, p.n = c.n, p.k = c.k;
    elastic::cuda::gemv_bf16(p, st.s);
    p.x = dGU.p, p.y = dB.p, p.swiglu = true;
    elastic::cuda::gemv_bf16(p, st.s);
    const auto a = dA.down(), b = dB.down();
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_TRUE(std::isfinite(from_bf16(b[i]))) << i;
      ASSERT_EQ(a[i], b[i]) << "feature " << i;
    }
  }
}

TEST(CudaGemv, RejectsBadArguments) {
  SKIP_WITHOUT_GPU();
  Dev<uint16_t> a(4096), b(4096);
  GemvParams p;
  p.x = a.p, p.w = b.p, p.y = b.p + 2048, p.n = 16, p.k = 64;
  auto fails = [&](GemvParams q, const char* what) {
    try {
      elastic::cuda::gemv_bf16(q, nullptr);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("gemv_bf16"), std::string::npos) << e.what();
    }
  };
  GemvParams q = p;
  q.m = 5;
  fails(q, "m above kGemvMaxRows");
  q = p, q.k = 0;
  fails(q, "k 0");
  q = p, q.y = a.p + 16;
  fails(q, "y overlapping x");
  q = p, q.y_f32 = true, q.accumulate = true;
  fails(q, "accumulate into fp32");
  q = p, q.norm_w = b.p, q.swiglu = true;
  fails(q, "norm and swiglu");
  q = p, q.x = nullptr;
  fails(q, "null x");
  q = p, q.k = 100000, q.m = 4, q.n = 1;
  fails(q, "inputs larger than shared memory");
}
