// GPU tests (label gpu): every kernel of include/elastic/cuda_ops.h against a CPU reference written here (double
// math on the bf16-rounded inputs), on fresh random inputs (the std::random_device seed is printed on failure).
// Outputs are poisoned with 0xffff (a bf16 NaN) before each launch; what the contract does not write must still
// hold the poison afterwards.
//
// Tolerance for computed bf16 outputs, per element: |gpu - ref| <= 1e-2 * |ref| + 1e-3 * max|ref| (bf16 keeps 8
// significant bits, 2^-9 ~ 0.2% relative; the small absolute floor covers outputs near zero after cancellation, as
// in RoPE). fp32 outputs (the pool sums) use 1e-4 and 1e-5. Copies (embedding, caches), argmax, fills and the bf16
// residual sum must match bit for bit. A NaN always fails.
//
// GPU tests skip when no device is present; the host-only tests (bf16 conversion, argument checks) always run.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "elastic/cuda.h"
#include "elastic/cuda_ops.h"
#include "contiguous_decode.h"  // dev/cuda: the per-head cache copies
#include "gpu_test_util.h"

namespace cu = elastic::cuda;

namespace {

using elastic::gpu_test::Dev;
using elastic::gpu_test::Stream;

constexpr uint16_t kPoison = 0xffff;
constexpr double kRel = 1e-2, kAbs = 1e-3;
constexpr size_t kGuard = 16;  // poisoned elements after an output that must stay untouched


float fl(uint16_t b) { return cu::bf16_to_f32(b); }
uint16_t bf(float f) { return cu::f32_to_bf16(f); }



std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float mean, float sd) {
  std::normal_distribution<float> N(mean, sd);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = bf(N(rng));
  return v;
}

std::vector<float> to_f32(const std::vector<uint16_t>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = fl(v[i]);
  return f;
}

// Element-wise |got - ref| <= rel * |ref| + abs * max|ref|; NaN fails. Names the first mismatches.
::testing::AssertionResult close_to(const std::vector<float>& got, const std::vector<double>& ref,
                                 const std::string& what, double rel = kRel, double abs = kAbs) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " != " << ref.size();
  double mx = 0;
  for (double r : ref) mx = std::max(mx, std::fabs(r));
  size_t bad = 0;
  std::ostringstream os;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - ref[i]);
    if (!(err <= rel * std::fabs(ref[i]) + abs * mx)) {
      if (bad < 5) os << "\n  [" << i << "] gpu " << got[i] << " ref " << ref[i];
      ++bad;
    }
  }
  if (bad)
    return ::testing::AssertionFailure() << what << ": " << bad << " of " << got.size()
                                         << " elements out of tolerance (max|ref| " << mx << ")" << os.str();
  return ::testing::AssertionSuccess();
}

template <class T>
::testing::AssertionResult same(const std::vector<T>& got, const std::vector<T>& ref, const std::string& what) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " != " << ref.size();
  size_t bad = 0;
  std::ostringstream os;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != ref[i]) {
      if (bad < 5) os << "\n  [" << i << "] gpu " << +got[i] << " ref " << +ref[i];
      ++bad;
    }
  if (bad)
    return ::testing::AssertionFailure() << what << ": " << bad << " of " << got.size() << " elements differ"
                                         << os.str();
  return ::testing::AssertionSuccess();
}

// Elements of v[begin, end) that no longer hold the poison.
size_t touched(const std::vector<uint16_t>& v, size_t begin, size_t end) {
  size_t n = 0;
  for (size_t i = begin; i < end && i < v.size(); ++i) n += v[i] != kPoison;
  return n;
}

// RMSNorm reference over rows of the (already bf16) values: w * x / sqrt(mean(x^2) + eps).
std::vector<double> rmsnorm_ref(const std::vector<double>& x, const std::vector<uint16_t>& w, int rows, int n,
                                double eps) {
  std::vector<double> y(x.size());
  for (int r = 0; r < rows; ++r) {
    const double* xr = x.data() + size_t(r) * n;
    double ss = 0;
    for (int i = 0; i < n; ++i) ss += xr[i] * xr[i];
    const double inv = 1.0 / std::sqrt(ss / n + eps);
    for (int i = 0; i < n; ++i) y[size_t(r) * n + i] = fl(w[i]) * xr[i] * inv;
  }
  return y;
}

// ---- host conversions ------------------------------------------------------------------------------------------

double bf16_value(uint16_t b) {  // the bf16 pattern as a number; the inf pattern stands for 2^128 (RNE overflow)
  if ((b & 0x7fffu) == 0x7f80u) return (b & 0x8000u ? -1.0 : 1.0) * std::ldexp(1.0, 128);
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Independent round-to-nearest-even reference for finite f: of the two bf16 neighbours (truncation and the next
// pattern away from zero) the nearer wins, a tie goes to the even one.
uint16_t ref_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t lo = uint16_t(u >> 16), hi = uint16_t(lo + 1);
  const double dlo = std::fabs(double(f) - bf16_value(lo)), dhi = std::fabs(double(f) - bf16_value(hi));
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1u) ? hi : lo;
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(CudaOpsHost, Bf16ConversionRoundsToNearestEven) {
  SEEDED_RNG(rng);
  std::uniform_int_distribution<uint32_t> U;
  int checked = 0;
  while (checked < 1000000) {
    const uint32_t u = U(rng);
    if ((u & 0x7f800000u) == 0x7f800000u) continue;  // inf / NaN: below
    const float f = from_bits(u);
    ASSERT_EQ(cu::f32_to_bf16(f), ref_bf16(f)) << "bits 0x" << std::hex << u;
    ++checked;
  }
  EXPECT_EQ(cu::f32_to_bf16(1.f + std::ldexp(1.f, -8)), 0x3f80);      // tie, even below
  EXPECT_EQ(cu::f32_to_bf16(1.f + 3 * std::ldexp(1.f, -8)), 0x3f82);  // tie, even above
  EXPECT_EQ(cu::f32_to_bf16(FLT_MAX), 0x7f80);                         // rounds up to inf
  EXPECT_EQ(cu::f32_to_bf16(-FLT_MAX), 0xff80);
  EXPECT_EQ(cu::f32_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(cu::f32_to_bf16(-INFINITY), 0xff80);
  EXPECT_EQ(cu::f32_to_bf16(-0.f), 0x8000);
  EXPECT_EQ(cu::f32_to_bf16(from_bits(0x00008000u)), 0x0000);  // denormal tie -> even (0)
  EXPECT_EQ(cu::f32_to_bf16(from_bits(0x00018000u)), 0x0002);  // denormal tie -> even (2)
  // NaNs stay NaN, sign kept, even those whose payload lies only in the low 16 bits (truncation gives inf).
  for (uint32_t u : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0xffc00000u}) {
    const uint16_t b = cu::f32_to_bf16(from_bits(u));
    EXPECT_TRUE(std::isnan(cu::bf16_to_f32(b))) << std::hex << u;
    EXPECT_EQ(int(b >> 15), int(u >> 31)) << std::hex << u;
  }
  for (uint32_t b = 0; b <= 0xffffu; ++b) {
    const float f = cu::bf16_to_f32(uint16_t(b));
    if ((b & 0x7fffu) > 0x7f80u) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << b;
    } else {
      uint32_t u;
      std::memcpy(&u, &f, 4);
      ASSERT_EQ(u, b << 16) << std::hex << b;
      ASSERT_EQ(cu::f32_to_bf16(f), uint16_t(b)) << std::hex << b;  // exact values round-trip
    }
  }
}

// ---- argument checks (host only: every call throws before any CUDA work) -----------------------------------

template <class F>
void expect_invalid(F f, const std::string& fn, const std::string& field) {
  try {
    f();
    ADD_FAILURE() << fn << ": no exception, expected one naming \"" << field << "\"";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(fn + ":"), std::string::npos) << m;
    EXPECT_NE(m.find(field), std::string::npos) << m;
  }
}

TEST(CudaOpsHost, BadShapesThrowNamingTheField) {
  expect_invalid([] { cu::embed_rows_bf16(nullptr, nullptr, nullptr, 4, 0, 10, nullptr); }, "embed_rows_bf16", "D ");
  expect_invalid([] { cu::embed_rows_bf16(nullptr, nullptr, nullptr, 4, 8, 0, nullptr); }, "embed_rows_bf16", "V ");
  expect_invalid([] { cu::embed_rows_bf16(nullptr, nullptr, nullptr, -1, 8, 10, nullptr); }, "embed_rows_bf16", "T ");
  expect_invalid([] { cu::embed_rows_bf16(nullptr, nullptr, nullptr, 2, 8, 10, nullptr); }, "embed_rows_bf16",
                 "null");
  expect_invalid([] { cu::rmsnorm_bf16_stream(nullptr, nullptr, nullptr, 4, 0, 1e-6f, nullptr); },
                 "rmsnorm_bf16_stream", "n must be > 0");
  expect_invalid([] { cu::rmsnorm_bf16_stream(nullptr, nullptr, nullptr, -2, 8, 1e-6f, nullptr); },
                 "rmsnorm_bf16_stream", "rows");
  expect_invalid([] { cu::rmsnorm_bf16_stream(nullptr, nullptr, nullptr, 2, 8, 1e-6f, nullptr); },
                 "rmsnorm_bf16_stream", "null");
  expect_invalid([] { cu::add_rmsnorm_bf16(nullptr, nullptr, nullptr, nullptr, 4, 0, 1e-6f, nullptr); },
                 "add_rmsnorm_bf16", "n must be > 0");
  expect_invalid([] { cu::swiglu_bf16(nullptr, nullptr, 3, 0, nullptr); }, "swiglu_bf16", "F ");
  expect_invalid([] { cu::add_inplace_bf16(nullptr, nullptr, -1, nullptr); }, "add_inplace_bf16", "n ");
  expect_invalid([] { cu::scatter_to_head_caches(nullptr, 10, 0, 64, nullptr, nullptr, nullptr, nullptr); },
                 "scatter_to_head_caches", "n_kv_heads");
  expect_invalid([] { cu::scatter_to_head_caches(nullptr, 10, 2, 0, nullptr, nullptr, nullptr, nullptr); },
                 "scatter_to_head_caches", "head_dim");
  expect_invalid([] { cu::scatter_to_head_caches(nullptr, -1, 2, 64, nullptr, nullptr, nullptr, nullptr); },
                 "scatter_to_head_caches", "n_pos");
  expect_invalid([] { cu::append_to_head_caches(nullptr, nullptr, nullptr, 2, 0, nullptr, nullptr, nullptr, nullptr,
                                                nullptr); },
                 "append_to_head_caches", "head_dim");
  expect_invalid([] { cu::append_to_head_caches(nullptr, nullptr, nullptr, 2, 64, nullptr, nullptr, nullptr, nullptr,
                                                nullptr); },
                 "append_to_head_caches", "null");
  expect_invalid([] { cu::argmax_rows_f32(nullptr, 2, 0, nullptr, nullptr); }, "argmax_rows_f32", "V ");
  expect_invalid([] { cu::argmax_rows_f32(nullptr, -1, 10, nullptr, nullptr); }, "argmax_rows_f32", "rows");
  expect_invalid([] { cu::fill_uniform_bf16(nullptr, -5, 1, 1.f, nullptr); }, "fill_uniform_bf16", "n ");
  expect_invalid([] { cu::fill_const_bf16(nullptr, 5, 1.f, nullptr); }, "fill_const_bf16", "null x");

  const auto qkv_with = [](int T, int Hq, int Hkv, int hd, int pos0) {
    cu::QkvPostParams p;
    p.T = T, p.n_heads = Hq, p.n_kv_heads = Hkv, p.head_dim = hd, p.pos0 = pos0;
    cu::qkv_post(p, nullptr);
  };
  expect_invalid([&] { qkv_with(4, 0, 1, 64, 0); }, "qkv_post", "n_heads");
  expect_invalid([&] { qkv_with(4, 2, 0, 64, 0); }, "qkv_post", "n_kv_heads");
  expect_invalid([&] { qkv_with(4, 2, 1, 63, 0); }, "qkv_post", "head_dim");
  expect_invalid([&] { qkv_with(4, 2, 1, 258, 0); }, "qkv_post", "head_dim");
  expect_invalid([&] { qkv_with(4, 2, 1, 64, -1); }, "qkv_post", "pos0");
  expect_invalid([&] { qkv_with(-1, 2, 1, 64, 0); }, "qkv_post", "T ");
  expect_invalid([&] { qkv_with(4, 2, 1, 64, 0); }, "qkv_post", "null qkv");

  // Empty work is a no-op that touches nothing (no CUDA call either).
  EXPECT_NO_THROW(cu::rmsnorm_bf16_stream(nullptr, nullptr, nullptr, 0, 8, 1e-6f, nullptr));
  EXPECT_NO_THROW(cu::add_inplace_bf16(nullptr, nullptr, 0, nullptr));
  EXPECT_NO_THROW(qkv_with(0, 2, 1, 64, 0));
}

// ---- embedding ---------------------------------------------------------------------------------------------------

void run_embed(int D, std::mt19937& rng) {
  const int T = 37, V = 1000;
  auto table = random_bf16(size_t(V) * D, rng, 0.f, 1.f);
  std::uniform_int_distribution<int> U(0, V - 1);
  std::vector<int32_t> ids(T);
  for (auto& i : ids) i = U(rng);
  ids[3] = -1, ids[7] = V, ids[11] = V + 7, ids[20] = INT_MAX, ids[21] = INT_MIN, ids[22] = 0, ids[23] = V - 1;
  Dev<uint16_t> d_table(table), d_out(size_t(T) * D + kGuard);
  Dev<int32_t> d_ids(ids);
  Stream s;
  cu::embed_rows_bf16(d_table.p, d_ids.p, d_out.p, T, D, V, s.s);
  s.sync();
  std::vector<uint16_t> ref(size_t(T) * D + kGuard, kPoison);
  for (int t = 0; t < T; ++t)
    for (int d = 0; d < D; ++d)
      ref[size_t(t) * D + d] = ids[t] >= 0 && ids[t] < V ? table[size_t(ids[t]) * D + d] : uint16_t(0);
  EXPECT_TRUE(same(d_out.down(), ref, "embed D=" + std::to_string(D)));
}

TEST(CudaOps, EmbedRowsCopiesAndZeroesOutOfRangeIds) {
  SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  run_embed(4096, rng);  // 16-byte path
  run_embed(100, rng);   // element path (D % 8 != 0)
}

// ---- RMSNorm -----------------------------------------------------------------------------------------------------

void run_rmsnorm(int rows, int n, bool in_place, std::mt19937& rng) {
  SCOPED_TRACE("rmsnorm rows " + std::to_string(rows) + " n " + std::to_string(n) + (in_place ? " in place" : ""));
  const float eps = 1e-6f;
  auto x = random_bf16(size_t(rows) * n, rng, 0.f, 1.f);
  auto w = random_bf16(n, rng, 1.f, 0.1f);
  Dev<uint16_t> d_x(size_t(rows) * n + kGuard), d_w(w), d_y(size_t(rows) * n + kGuard);
  d_x.up(x);
  Stream s;
  uint16_t* y = in_place ? d_x.p : d_y.p;
  cu::rmsnorm_bf16_stream(d_x.p, d_w.p, y, rows, n, eps, s.s);
  s.sync();
  std::vector<double> xd(x.size());
  for (size_t i = 0; i < x.size(); ++i) xd[i] = fl(x[i]);
  const auto ref = rmsnorm_ref(xd, w, rows, n, eps);
  const auto got = in_place ? d_x.down() : d_y.down();
  EXPECT_TRUE(close_to(to_f32(std::vector<uint16_t>(got.begin(), got.begin() + ref.size())), ref, "y"));
  EXPECT_EQ(touched(got, ref.size(), got.size()), 0u) << "wrote past the last row";
}

TEST(CudaOps, RmsNormStreamMatchesCpu) {
  SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  run_rmsnorm(37, 4096, false, rng);  // 16-byte path
  run_rmsnorm(37, 1001, false, rng);  // element path
  run_rmsnorm(37, 4096, true, rng);   // x == y
  run_rmsnorm(5, 128, false, rng);    // fewer elements than threads
}

enum class AddAlias { None, YisX, NoResidual };

void run_add_rmsnorm(int rows, int n, AddAlias alias, std::mt19937& rng) {
  SCOPED_TRACE("add_rmsnorm rows " + std::to_string(rows) + " n " + std::to_string(n) + " alias " +
               std::to_string(int(alias)));
  const float eps = 1e-6f;
  const size_t m = size_t(rows) * n;
  auto res = random_bf16(m, rng, 0.f, 1.f);
  auto x = random_bf16(m, rng, 0.f, 1.f);
  auto w = random_bf16(n, rng, 1.f, 0.1f);
  Dev<uint16_t> d_res(m + kGuard), d_x(m + kGuard), d_w(w), d_y(m + kGuard);
  d_res.up(res);
  d_x.up(x);
  Stream s;
  uint16_t* residual = alias == AddAlias::NoResidual ? nullptr : d_res.p;
  uint16_t* y = alias == AddAlias::YisX ? d_x.p : d_y.p;
  cu::add_rmsnorm_bf16(residual, d_x.p, d_w.p, y, rows, n, eps, s.s);
  s.sync();

  // The stored residual is the fp32 sum of the two bf16 values rounded to bf16, bit for bit (unchanged when the
  // kernel is not given it).
  std::vector<uint16_t> res_ref(m + kGuard, kPoison);
  std::vector<double> normed_in(m);
  for (size_t i = 0; i < m; ++i) {
    res_ref[i] = alias == AddAlias::NoResidual ? res[i] : bf(fl(res[i]) + fl(x[i]));
    normed_in[i] = alias == AddAlias::NoResidual ? fl(x[i]) : fl(res_ref[i]);
  }
  EXPECT_TRUE(same(d_res.down(), res_ref, "residual"));
  const auto ref = rmsnorm_ref(normed_in, w, rows, n, eps);
  const auto got = alias == AddAlias::YisX ? d_x.down() : d_y.down();
  EXPECT_TRUE(close_to(to_f32(std::vector<uint16_t>(got.begin(), got.begin() + m)), ref, "y"));
  EXPECT_EQ(touched(got, m, got.size()), 0u) << "wrote past the last row";
}

TEST(CudaOps, AddRmsNormUpdatesResidualThenNorms) {
  SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  run_add_rmsnorm(37, 4096, AddAlias::None, rng);        // 16-byte path
  run_add_rmsnorm(37, 1001, AddAlias::None, rng);        // element path
  run_add_rmsnorm(37, 4096, AddAlias::YisX, rng);        // y == x
  run_add_rmsnorm(37, 4096, AddAlias::NoResidual, rng);  // residual null: plain norm of x
}

// ---- q/k/v post-processing -------------------------------------------------------------------------------------

struct QkvCase {
  int T, pos0, Hq, Hkv, hd;
  bool bias, norm, pool, dev_pos;
  int pool_first_end, pool_last_begin;
  double theta;
};

void run_qkv_case(const QkvCase& c) {
  SEEDED_RNG(rng);
  const int T = c.T, hd = c.hd, half = hd / 2, Hq = c.Hq, Hkv = c.Hkv, W = (Hq + 2 * Hkv) * hd;
  const float eps = 1e-6f;
  auto qkv = random_bf16(size_t(T) * W, rng, 0.f, 1.f);
  auto bias = random_bf16(W, rng, 0.f, 0.5f);
  auto qn = random_bf16(hd, rng, 1.f, 0.1f), kn = random_bf16(hd, rng, 1.f, 0.1f);
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) inv[i] = static_cast<float>(1.0 / std::pow(c.theta, 2.0 * i / hd));
  std::normal_distribution<float> N(0.f, 1.f);
  std::vector<float> pool0(size_t(Hkv) * hd);  // the pool accumulates: start from random sums
  for (auto& v : pool0) v = N(rng);

  const size_t row = size_t(Hkv) * hd;      // one position of k_out / v_out
  const size_t cap = size_t(c.pos0) + T + 3;  // rows outside [pos0, pos0 + T) must stay poisoned
  Dev<uint16_t> d_qkv(qkv), d_bias(bias), d_qn(qn), d_kn(kn);
  Dev<float> d_inv(inv), d_pool(pool0);
  Dev<uint16_t> d_q(size_t(T) * Hq * hd), d_k(cap * row), d_v(cap * row);
  Dev<int32_t> d_pos(std::vector<int32_t>{c.pos0});

  cu::QkvPostParams p;
  p.qkv = d_qkv.p;
  p.bias = c.bias ? d_bias.p : nullptr;
  p.q_norm = c.norm ? d_qn.p : nullptr;
  p.k_norm = c.norm ? d_kn.p : nullptr;
  p.inv_freq = d_inv.p;
  p.eps = eps;
  p.T = T;
  p.pos0 = c.dev_pos ? 0 : c.pos0;  // with pos0_dev set, this wrong host value must be ignored
  p.pos0_dev = c.dev_pos ? d_pos.p : nullptr;
  p.n_heads = Hq, p.n_kv_heads = Hkv, p.head_dim = hd;
  p.q_out = d_q.p, p.k_out = d_k.p, p.v_out = d_v.p;
  p.pool_sum = c.pool ? d_pool.p : nullptr;
  p.pool_first_end = c.pool_first_end, p.pool_last_begin = c.pool_last_begin;
  Stream s;
  cu::qkv_post(p, s.s);
  s.sync();

  std::vector<double> q_ref(size_t(T) * Hq * hd), k_ref(size_t(T) * row), v_ref(size_t(T) * row);
  std::vector<double> pool_ref(pool0.begin(), pool0.end()), x(hd);
  for (int t = 0; t < T; ++t) {
    const int pos = c.pos0 + t;
    const uint16_t* in = qkv.data() + size_t(t) * W;
    for (int hh = 0; hh < Hq + Hkv; ++hh) {
      const bool is_q = hh < Hq;
      const int kvh = hh - Hq;
      for (int d = 0; d < hd; ++d) x[d] = double(fl(in[hh * hd + d])) + (c.bias ? fl(bias[hh * hd + d]) : 0.f);
      if (c.norm) {
        double ss = 0;
        for (int d = 0; d < hd; ++d) ss += x[d] * x[d];
        const double r = 1.0 / std::sqrt(ss / hd + eps);
        const std::vector<uint16_t>& w = is_q ? qn : kn;
        for (int d = 0; d < hd; ++d) x[d] = fl(w[d]) * x[d] * r;
      }
      if (!is_q && c.pool && (pos < c.pool_first_end || pos >= c.pool_last_begin))
        for (int d = 0; d < hd; ++d) pool_ref[size_t(kvh) * hd + d] += x[d];
      double* out = is_q ? &q_ref[(size_t(t) * Hq + hh) * hd] : &k_ref[(size_t(t) * Hkv + kvh) * hd];
      for (int i = 0; i < half; ++i) {
        const float ang = static_cast<float>(pos) * inv[i];  // the fp32 product of the contract (and HF)
        const double co = std::cos(double(ang)), si = std::sin(double(ang));
        out[i] = x[i] * co - x[i + half] * si;
        out[i + half] = x[i + half] * co + x[i] * si;
      }
      if (!is_q)
        for (int d = 0; d < hd; ++d) {
          const int col = (Hq + Hkv + kvh) * hd + d;
          v_ref[(size_t(t) * Hkv + kvh) * hd + d] = double(fl(in[col])) + (c.bias ? fl(bias[col]) : 0.f);
        }
    }
  }

  EXPECT_TRUE(close_to(to_f32(d_q.down()), q_ref, "q_out"));
  // k_out / v_out: the rows [pos0, pos0 + T) against the reference, a window of rows around them (all rows when
  // pos0 is small) and the first rows must still be poisoned.
  const size_t lo = c.pos0 > 1000 ? size_t(c.pos0) - 3 : 0, mid = size_t(c.pos0) - lo;
  for (int kv = 0; kv < 2; ++kv) {
    const Dev<uint16_t>& d = kv ? d_v : d_k;
    const char* name = kv ? "v_out" : "k_out";
    const auto win = d.down(lo * row, (cap - lo) * row);
    const std::vector<uint16_t> rows(win.begin() + mid * row, win.begin() + (mid + T) * row);
    EXPECT_TRUE(close_to(to_f32(rows), kv ? v_ref : k_ref, name));
    EXPECT_EQ(touched(win, 0, mid * row), 0u) << name << ": rows before pos0 written";
    EXPECT_EQ(touched(win, (mid + T) * row, win.size()), 0u) << name << ": rows after pos0 + T written";
    if (lo > 0) {
      EXPECT_EQ(touched(d.down(0, 3 * row), 0, 3 * row), 0u) << name << ": rows 0..2 written";
    }
  }
  const auto pool = d_pool.down();
  if (c.pool) {
    EXPECT_TRUE(close_to(pool, pool_ref, "pool_sum", 1e-4, 1e-5));
  } else {
    EXPECT_TRUE(same(pool, pool0, "pool_sum (not passed)"));
  }
}

TEST(CudaOpsQkvPost, Qwen3LikeNormNoBias) {
  SKIP_WITHOUT_GPU();
  // Pool: positions 100..109 and 130..136 of 100..136.
  run_qkv_case({37, 100, 16, 8, 128, false, true, true, false, 110, 130, 1e6});
}

TEST(CudaOpsQkvPost, Qwen3LikeDevicePos0) {
  SKIP_WITHOUT_GPU();
  // pos0 from the device scalar; pool: only the tail 120..136.
  run_qkv_case({37, 100, 16, 8, 128, false, true, true, true, 0, 120, 1e6});
}

TEST(CudaOpsQkvPost, LlamaLikeBiasNoNorm) {
  SKIP_WITHOUT_GPU();
  // Pool: only the head 100..104 (the tail starts past the prompt).
  run_qkv_case({37, 100, 9, 3, 64, true, false, true, false, 105, 1000, 5e5});
  run_qkv_case({37, 100, 9, 3, 64, true, false, true, true, 105, 1000, 5e5});
}

TEST(CudaOpsQkvPost, OddHeadDimBiasAndNorm) {
  SKIP_WITHOUT_GPU();
  // hd 80: 40 pairs, so part of the block's last warp idles (and must not disturb the norm).
  run_qkv_case({37, 100, 4, 2, 80, true, true, true, false, 101, 136, 1e4});
}

TEST(CudaOpsQkvPost, LargePositionRope) {
  SKIP_WITHOUT_GPU();
  // Positions near 256K: angles ~2.6e5 rad need sincosf's full range reduction.
  run_qkv_case({37, 262000, 9, 3, 64, true, false, false, false, 0, 0, 5e5});
}

// ---- SwiGLU and residual add -------------------------------------------------------------------------------------

void run_swiglu(int T, int F, std::mt19937& rng) {
  SCOPED_TRACE("swiglu F " + std::to_string(F));
  auto gu = random_bf16(size_t(T) * 2 * F, rng, 0.f, 2.f);
  Dev<uint16_t> d_gu(gu), d_out(size_t(T) * F + kGuard);
  Stream s;
  cu::swiglu_bf16(d_gu.p, d_out.p, T, F, s.s);
  s.sync();
  std::vector<double> ref(size_t(T) * F);
  for (int t = 0; t < T; ++t)
    for (int f = 0; f < F; ++f) {
      const double g = fl(gu[size_t(t) * 2 * F + f]), u = fl(gu[size_t(t) * 2 * F + F + f]);
      ref[size_t(t) * F + f] = g / (1.0 + std::exp(-g)) * u;
    }
  const auto got = d_out.down();
  EXPECT_TRUE(close_to(to_f32(std::vector<uint16_t>(got.begin(), got.begin() + ref.size())), ref, "out"));
  EXPECT_EQ(touched(got, ref.size(), got.size()), 0u) << "wrote past the end";
}

TEST(CudaOps, SwigluMatchesCpu) {
  SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  run_swiglu(37, 1536, rng);  // 16-byte path
  run_swiglu(37, 1001, rng);  // element path
}

void run_add(int64_t n, size_t offset, bool alias, std::mt19937& rng) {
  SCOPED_TRACE("add n " + std::to_string(n) + " offset " + std::to_string(offset) + (alias ? " y == x" : ""));
  auto y = random_bf16(size_t(n), rng, 0.f, 1.f), x = random_bf16(size_t(n), rng, 0.f, 1.f);
  Dev<uint16_t> d_y(offset + size_t(n) + kGuard), d_x(offset + size_t(n));
  std::vector<uint16_t> hy(offset + size_t(n) + kGuard, kPoison), hx(offset + size_t(n), kPoison);
  std::copy(y.begin(), y.end(), hy.begin() + offset);
  std::copy(x.begin(), x.end(), hx.begin() + offset);
  d_y.up(hy);
  d_x.up(hx);
  Stream s;
  cu::add_inplace_bf16(d_y.p + offset, alias ? d_y.p + offset : d_x.p + offset, n, s.s);
  s.sync();
  std::vector<double> ref(static_cast<size_t>(n));
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = double(fl(y[i])) + fl(alias ? y[i] : x[i]);
  const auto got = d_y.down();
  EXPECT_TRUE(close_to(to_f32(std::vector<uint16_t>(got.begin() + offset, got.begin() + offset + n)), ref, "y"));
  EXPECT_EQ(touched(got, 0, offset), 0u) << "wrote before y";
  EXPECT_EQ(touched(got, offset + n, got.size()), 0u) << "wrote past the end";
}

TEST(CudaOps, AddInplaceMatchesCpu) {
  SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  run_add(37 * 4096 + 5, 0, false, rng);  // 16-byte path plus a 5-element tail
  run_add(37 * 4096 + 5, 1, false, rng);  // misaligned: element path
  run_add(1001, 0, true, rng);            // y += y
  run_add(3, 0, false, rng);              // tail only
}

// ---- per-head KV caches -------------------------------------------------------------------------------------------

struct HeadCfg {
  int sink, ring, slots;  // ring 0: one slot per position, `slots` = capacity
};
int slot_of(const HeadCfg& h, int j) { return h.ring == 0 || j < h.sink ? j : h.sink + (j - h.sink) % h.ring; }

// Per-head device caches ([slots, hd] plus a poisoned guard; one may start one element in, i.e. misaligned) and
// the device arrays the kernels take.
struct HeadCaches {
  std::vector<std::unique_ptr<Dev<uint16_t>>> buf;
  std::vector<size_t> off;
  std::unique_ptr<Dev<uint16_t*>> ptrs;
  HeadCaches(const std::vector<HeadCfg>& heads, int hd, int misaligned_head) {
    std::vector<uint16_t*> p;
    for (size_t h = 0; h < heads.size(); ++h) {
      buf.push_back(std::make_unique<Dev<uint16_t>>(size_t(heads[h].slots) * hd + kGuard));
      off.push_back(int(h) == misaligned_head ? 1 : 0);
      p.push_back(buf.back()->p + off.back());
    }
    ptrs = std::make_unique<Dev<uint16_t*>>(p);
  }
};

std::vector<HeadCfg> mixed_heads(int full_slots) {  // full, ring (sink 64 / ring 128) and a sink-free ring of 64
  return {{0, 0, full_slots}, {64, 128, 192}, {0, 64, 64},  {64, 128, 192},
          {0, 0, full_slots}, {64, 128, 192}, {128, 64, 192}, {0, 0, full_slots}};
}

void run_scatter(int n_pos, int hd, const std::vector<HeadCfg>& heads, int misaligned_head, std::mt19937& rng) {
  SCOPED_TRACE("scatter n_pos " + std::to_string(n_pos) + " hd " + std::to_string(hd));
  const int Hkv = int(heads.size());
  auto src = random_bf16(size_t(n_pos) * Hkv * hd, rng, 0.f, 1.f);
  std::vector<int32_t> sink, ring;
  for (const auto& h : heads) sink.push_back(h.sink), ring.push_back(h.ring);
  HeadCaches caches(heads, hd, misaligned_head);
  Dev<uint16_t> d_src(src);
  Dev<int32_t> d_sink(sink), d_ring(ring);
  Stream s;
  cu::scatter_to_head_caches(d_src.p, n_pos, Hkv, hd, caches.ptrs->p, d_sink.p, d_ring.p, s.s);
  s.sync();
  for (int h = 0; h < Hkv; ++h) {
    // Sequential reference: every position in order, later ones overwriting earlier ones in a ring.
    std::vector<uint16_t> ref(caches.buf[h]->n, kPoison);
    for (int j = 0; j < n_pos; ++j)
      for (int d = 0; d < hd; ++d)
        ref[caches.off[h] + size_t(slot_of(heads[h], j)) * hd + d] = src[(size_t(j) * Hkv + h) * hd + d];
    EXPECT_TRUE(same(caches.buf[h]->down(), ref, "head " + std::to_string(h)));
  }
}

TEST(CudaOpsCache, ScatterToRingAndFullHeads) {
  SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  run_scatter(300, 128, mixed_heads(320), 1, rng);  // head 1's cache misaligned: 16-byte reads, 2-byte stores
  run_scatter(300, 64, mixed_heads(300), -1, rng);
}

TEST(CudaOpsCache, ScatterShortPromptLeavesUnusedSlotsPoisoned) {
  SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  run_scatter(150, 128, mixed_heads(320), -1, rng);  // rings not yet full: slots 150..191 untouched
  run_scatter(40, 128, mixed_heads(320), -1, rng);   // inside the sinks
  run_scatter(300, 36, {{0, 0, 300}, {64, 128, 192}, {0, 64, 64}}, 2, rng);  // hd % 8 != 0: element path
}

TEST(CudaOpsCache, AppendWritesOneSlotPerHead) {
  SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  const int hd = 128;
  const auto heads = mixed_heads(512);
  const int Hkv = int(heads.size());
  std::vector<int32_t> sink, ring;
  for (const auto& h : heads) sink.push_back(h.sink), ring.push_back(h.ring);
  HeadCaches kc(heads, hd, -1), vc(heads, hd, 3);
  std::vector<std::vector<uint16_t>> kref(Hkv), vref(Hkv);
  for (int h = 0; h < Hkv; ++h) {  // caches start with random content, which must survive except at slot(pos)
    kref[h] = random_bf16(kc.buf[h]->n, rng, 0.f, 1.f);
    vref[h] = random_bf16(vc.buf[h]->n, rng, 0.f, 1.f);
    kc.buf[h]->up(kref[h]);
    vc.buf[h]->up(vref[h]);
  }
  Dev<int32_t> d_sink(sink), d_ring(ring), d_pos(1);
  Stream s;
  for (int pos : {30, 299, 453, 64, 191, 192, 0, 511}) {
    SCOPED_TRACE("pos " + std::to_string(pos));
    auto kn = random_bf16(size_t(Hkv) * hd, rng, 0.f, 1.f), vn = random_bf16(size_t(Hkv) * hd, rng, 0.f, 1.f);
    Dev<uint16_t> d_kn(kn), d_vn(vn);
    d_pos.up({pos});
    cu::append_to_head_caches(d_kn.p, d_vn.p, d_pos.p, Hkv, hd, kc.ptrs->p, vc.ptrs->p, d_sink.p, d_ring.p, s.s);
    s.sync();
    for (int h = 0; h < Hkv; ++h) {
      const size_t at = size_t(slot_of(heads[h], pos)) * hd;
      std::copy_n(kn.begin() + size_t(h) * hd, hd, kref[h].begin() + kc.off[h] + at);
      std::copy_n(vn.begin() + size_t(h) * hd, hd, vref[h].begin() + vc.off[h] + at);
      EXPECT_TRUE(same(kc.buf[h]->down(), kref[h], "k head " + std::to_string(h)));
      EXPECT_TRUE(same(vc.buf[h]->down(), vref[h], "v head " + std::to_string(h)));
    }
  }
}

// ---- argmax --------------------------------------------------------------------------------------------------

void run_argmax(int V, std::mt19937& rng) {
  SCOPED_TRACE("argmax V " + std::to_string(V));
  const int rows = 8;
  std::normal_distribution<float> N(0.f, 3.f);
  std::uniform_int_distribution<int> U(0, V - 2);
  std::vector<float> x(size_t(rows) * V);
  for (auto& v : x) v = N(rng);
  auto r = [&](int i) { return x.begin() + size_t(i) * V; };
  float* r1 = &*r(1);
  int a = U(rng), b = U(rng);
  if (a == b) b = a + 1;
  r1[a] = r1[b] = 100.f;                                   // tie far apart
  float* r2 = &*r(2);
  a = U(rng);
  r2[a] = r2[a + 1] = 100.f;                               // tie of neighbours (often one vector load)
  std::fill(r(3), r(4), 0.5f);                             // all equal -> 0
  (&*r(4))[V - 1] = 100.f;                                 // max at the very end
  std::fill(r(5), r(6), -INFINITY);                        // all -inf -> 0
  (&*r(6))[0] = (&*r(6))[V - 1] = 100.f;                   // tie at both ends -> 0
  for (auto it = r(7); it != r(8); ++it) *it = -1e30f + *it;  // all huge negative (rounds to ties)
  Dev<float> d_x(x);
  Dev<int32_t> d_out(rows + 1);
  Stream s;
  cu::argmax_rows_f32(d_x.p, rows, V, d_out.p, s.s);
  s.sync();
  std::vector<int32_t> ref(rows + 1, -1);  // the poison of an int32 buffer is -1
  for (int i = 0; i < rows; ++i) {
    const float* row = &*r(i);
    int best = 0;
    for (int j = 1; j < V; ++j)
      if (row[j] > row[best]) best = j;  // strict: the lowest index wins ties
    ref[i] = best;
  }
  EXPECT_TRUE(same(d_out.down(), ref, "argmax"));
}

TEST(CudaOps, ArgmaxLowestIndexOnTies) {
  SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  run_argmax(151936, rng);  // Qwen vocabulary: float4 path
  run_argmax(32001, rng);   // V % 4 != 0: element path
  run_argmax(7, rng);       // fewer elements than threads
}

// ---- fills -------------------------------------------------------------------------------------------------------

TEST(CudaOps, FillUniformDeterministicAndInRange) {
  SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  const int64_t n = (int64_t(1) << 20) + 3;
  const uint64_t seed = (uint64_t(rng()) << 32) | rng();
  SCOPED_TRACE("fill seed " + std::to_string(seed));
  const float scale = 0.5f;
  Dev<uint16_t> a(n + kGuard), b(n + kGuard), c(n + kGuard), d(1000 + kGuard);
  Stream s;
  cu::fill_uniform_bf16(a.p, n, seed, scale, s.s);
  cu::fill_uniform_bf16(b.p, n, seed, scale, s.s);
  cu::fill_uniform_bf16(c.p, n, seed + 1, scale, s.s);
  cu::fill_uniform_bf16(d.p, 1000, seed, scale, s.s);
  s.sync();
  const auto ha = a.down(), hb = b.down(), hc = c.down(), hd = d.down();
  EXPECT_TRUE(same(ha, hb, "same seed"));
  // Values depend on (seed, i) only, not on n or the launch shape.
  EXPECT_TRUE(same(std::vector<uint16_t>(hd.begin(), hd.begin() + 1000),
                   std::vector<uint16_t>(ha.begin(), ha.begin() + 1000), "prefix fill"));
  EXPECT_EQ(touched(ha, n, ha.size()), 0u);
  EXPECT_EQ(touched(hd, 1000, hd.size()), 0u);
  size_t differ = 0;
  for (int64_t i = 0; i < n; ++i) differ += ha[i] != hc[i];
  EXPECT_GT(differ, size_t(0.95 * n)) << "seed + 1 gives nearly the same values";

  double sum = 0, sum2 = 0, mn = 1e9, mx = -1e9;
  std::vector<int64_t> bins(10, 0);
  for (int64_t i = 0; i < n; ++i) {
    const double v = fl(ha[i]);
    ASSERT_TRUE(std::isfinite(v)) << i;
    ASSERT_LE(std::fabs(v), scale * (1 + std::ldexp(1.0, -8))) << i;  // scale * [-1, 1), then bf16 rounding
    sum += v, sum2 += v * v, mn = std::min(mn, v), mx = std::max(mx, v);
    bins[std::min(9, std::max(0, int((v / scale + 1) * 5)))]++;
  }
  const double mean = sum / n, var = sum2 / n - mean * mean;
  EXPECT_LT(std::fabs(mean), 5 * scale / std::sqrt(3.0 * n));
  EXPECT_NEAR(var, scale * scale / 3, 0.02 * scale * scale / 3);
  EXPECT_LT(mn, -0.99 * scale);
  EXPECT_GT(mx, 0.99 * scale);
  for (int k = 0; k < 10; ++k) EXPECT_NEAR(double(bins[k]), n / 10.0, 0.05 * n / 10.0) << "bin " << k;
}

TEST(CudaOps, FillConst) {
  SKIP_WITHOUT_GPU();
  for (float value : {0.3f, -2.5f, 0.f}) {
    const int64_t n = 1001;
    Dev<uint16_t> x(n + kGuard);
    Stream s;
    cu::fill_const_bf16(x.p, n, value, s.s);
    s.sync();
    std::vector<uint16_t> ref(n + kGuard, kPoison);
    std::fill(ref.begin(), ref.begin() + n, bf(value));
    EXPECT_TRUE(same(x.down(), ref, "fill_const " + std::to_string(value)));
  }
}

}  // namespace

// Decode writes one token's k/v into a one-row buffer: row 0 must equal row pos of the absolute-row path.
TEST(CudaOpsQkvPost, RowsFromZeroEqualsAbsoluteRow) {
  SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  const int Hq = 16, Hkv = 8, hd = 128, W = (Hq + 2 * Hkv) * hd, pos = 517;
  auto qkv = random_bf16(W, rng, 0.f, 1.f);
  auto kn = random_bf16(hd, rng, 1.f, 0.1f);
  std::vector<float> inv(hd / 2);
  for (int i = 0; i < hd / 2; ++i) inv[i] = static_cast<float>(1.0 / std::pow(1e6, 2.0 * i / hd));
  Dev<uint16_t> d_qkv(qkv), d_kn(kn), d_q(size_t(Hq) * hd), d_kabs(size_t(pos + 1) * Hkv * hd),
      d_vabs(size_t(pos + 1) * Hkv * hd), d_k0(size_t(Hkv) * hd), d_v0(size_t(Hkv) * hd);
  Dev<float> d_inv(inv);
  Dev<int32_t> d_pos(std::vector<int32_t>{pos});
  cu::QkvPostParams p;
  p.qkv = d_qkv.p;
  p.q_norm = p.k_norm = d_kn.p;
  p.inv_freq = d_inv.p;
  p.T = 1;
  p.pos0_dev = d_pos.p;
  p.n_heads = Hq, p.n_kv_heads = Hkv, p.head_dim = hd;
  p.q_out = d_q.p, p.k_out = d_kabs.p, p.v_out = d_vabs.p;
  Stream s;
  cu::qkv_post(p, s.s);
  p.k_out = d_k0.p, p.v_out = d_v0.p;
  p.kv_rows_from_zero = true;
  cu::qkv_post(p, s.s);
  s.sync();
  const size_t row = size_t(Hkv) * hd;
  EXPECT_TRUE(same(d_k0.down(), d_kabs.down(size_t(pos) * row, row), "k row 0"));
  EXPECT_TRUE(same(d_v0.down(), d_vabs.down(size_t(pos) * row, row), "v row 0"));
}
