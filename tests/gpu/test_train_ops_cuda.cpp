// GPU tests (label gpu): the backward ops of router training (include/elastic/cuda_train_ops.h) against CPU
// references written here in double, on the bf16-rounded inputs, with fresh random inputs per run (the
// std::random_device seed is printed with any failure). Outputs are poisoned with NaN before each launch (so an
// element left unwritten fails); add-into outputs start from a random base and (got - base) is checked against
// the reference result. The q/k/v backward's reference is itself checked against a finite difference of a double
// forward written from qkv_post's contract, so the GPU is tied to the forward, not only to a second backward.
//
// Tolerances: fp32 outputs relative L2 < 1e-4 (fp32 math, other summation orders); bf16 outputs relative L2 < 1e-2
// and per element |gpu - ref| <= 1e-2 |ref| + 1e-3 max|ref| (one bf16 rounding is <= 2^-9 relative; the floor covers
// values near zero after cancellation, as in the norm backward). The loss sum: 1e-5 relative. Conversions and the
// fp32 add must match the host helpers bit for bit; dz and dlogits must repeat bit for bit.
//
// The bad-argument test needs no GPU (arguments are checked on the host before any launch) and always runs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "elastic/cuda.h"
#include "elastic/cuda_ops.h"
#include "elastic/cuda_train_ops.h"
#include "gpu_test_util.h"

namespace cu = elastic::cuda;

namespace {

using elastic::gpu_test::Dev;
using elastic::gpu_test::Stream;


float fl(uint16_t b) { return cu::bf16_to_f32(b); }
uint16_t bf(float f) { return cu::f32_to_bf16(f); }



// bf16 values and the same values widened to double.
struct Bf {
  std::vector<uint16_t> b;
  std::vector<double> d;
};
Bf random_bf(size_t n, std::mt19937& rng, double sd, double mean = 0) {
  std::normal_distribution<double> N(mean, sd);
  Bf x{std::vector<uint16_t>(n), std::vector<double>(n)};
  for (size_t i = 0; i < n; ++i) x.b[i] = bf(float(N(rng))), x.d[i] = fl(x.b[i]);
  return x;
}
std::vector<float> random_f(size_t n, std::mt19937& rng, double sd = 1) {
  std::normal_distribution<float> N(0.f, float(sd));
  std::vector<float> v(n);
  for (float& x : v) x = N(rng);
  return v;
}
std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }
std::vector<double> widen(const std::vector<uint16_t>& v) {
  std::vector<double> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = fl(v[i]);
  return o;
}
// got - base, in double (exact for the fp32 values involved).
std::vector<double> minus(const std::vector<float>& got, const std::vector<float>& base) {
  std::vector<double> o(got.size());
  for (size_t i = 0; i < got.size(); ++i) o[i] = double(got[i]) - double(base[i]);
  return o;
}

// Relative L2 error; any non-finite value (a NaN left by the poison) fails.
::testing::AssertionResult rel_l2(const std::vector<double>& got, const std::vector<double>& ref, double tol,
                                  const std::string& what) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " != " << ref.size();
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i]))
      return ::testing::AssertionFailure() << what << ": [" << i << "] = " << got[i] << " (ref " << ref[i] << ")";
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  const double e = std::sqrt(num / std::max(den, 1e-300));
  if (e < tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": relative L2 error " << e << " >= " << tol;
}

// Per element |got - ref| <= rel |ref| + abs * max|ref| (bf16 outputs); names the first mismatches.
::testing::AssertionResult close_each(const std::vector<double>& got, const std::vector<double>& ref,
                                      const std::string& what, double rel = 1e-2, double abs = 1e-3) {
  double mx = 0;
  for (double r : ref) mx = std::max(mx, std::fabs(r));
  size_t bad = 0;
  std::ostringstream os;
  for (size_t i = 0; i < ref.size(); ++i)
    if (!(std::fabs(got[i] - ref[i]) <= rel * std::fabs(ref[i]) + abs * mx)) {
      if (bad < 5) os << "\n  [" << i << "] gpu " << got[i] << " ref " << ref[i];
      ++bad;
    }
  if (!bad) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << ref.size() << " elements out of tolerance"
                                       << os.str();
}

// bf16 output: both checks.
void expect_bf16(const std::vector<uint16_t>& got, const std::vector<double>& ref, const std::string& what) {
  const std::vector<double> g = widen(got);
  EXPECT_TRUE(rel_l2(g, ref, 1e-2, what));
  EXPECT_TRUE(close_each(g, ref, what));
}

// ---- RMSNorm backward --------------------------------------------------------------------------------------------

// dx_j = r w_j dy_j - x_j r^3 sum_i(w_i dy_i x_i) / n, r = 1 / sqrt(mean(x^2) + eps); rows of n.
void rmsnorm_bwd_ref(const double* x, const double* w, const double* dy, double* dx, int rows, int n, double eps) {
  for (int r = 0; r < rows; ++r) {
    const double* xr = x + size_t(r) * n;
    const double* g = dy + size_t(r) * n;
    double ss = 0, dot = 0;
    for (int i = 0; i < n; ++i) ss += xr[i] * xr[i], dot += w[i] * g[i] * xr[i];
    const double inv = 1 / std::sqrt(ss / n + eps), c = dot * inv * inv * inv / n;
    for (int i = 0; i < n; ++i) dx[size_t(r) * n + i] = inv * w[i] * g[i] - c * xr[i];
  }
}

TEST(CudaTrainOps, RmsNormBackward) {
  SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  Stream s;
  const float eps = 1e-6f;
  for (auto [rows, n] : {std::pair{77, 2560}, std::pair{5, 64}, std::pair{300, 577}, std::pair{1, 1003},
                         std::pair{33, 4096}}) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(n));
    const Bf x = random_bf(size_t(rows) * n, rng, 1.5), w = random_bf(n, rng, 0.1, 1.0);
    const auto dy = random_f(size_t(rows) * n, rng), base = random_f(size_t(rows) * n, rng, 0.5);
    std::vector<double> ref(size_t(rows) * n);
    rmsnorm_bwd_ref(x.d.data(), w.d.data(), widen(dy).data(), ref.data(), rows, n, eps);
    Dev<uint16_t> dX(x.b), dW(w.b);
    Dev<float> dDy(dy), dDx(base);
    cu::rmsnorm_bwd(dX.p, dW.p, dDy.p, dDx.p, rows, n, eps, s.s);
    EXPECT_TRUE(rel_l2(minus(dDx.down(), base), ref, 1e-4, "dx"));
  }
}

// ---- SwiGLU backward ---------------------------------------------------------------------------------------------

TEST(CudaTrainOps, SwigluBackward) {
  SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  Stream s;
  // F % 4 == 0 takes the 4-wide path, the others the scalar one.
  for (auto [T, F] : {std::pair{33, 1000}, std::pair{7, 1003}, std::pair{1, 1}, std::pair{129, 768}}) {
    SCOPED_TRACE(std::to_string(T) + " x " + std::to_string(F));
    Bf gu = random_bf(size_t(T) * 2 * F, rng, 2.5);
    // Saturated gates: sigmoid at exactly 0 or 1 in fp32.
    const float extremes[] = {100.f, -100.f, 30.f, -30.f};
    for (int e = 0; e < 4 && e < F; ++e) gu.b[e] = bf(extremes[e]), gu.d[e] = fl(gu.b[e]);
    const auto da = random_f(size_t(T) * F, rng);
    std::vector<double> ref(size_t(T) * 2 * F);
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < F; ++c) {
        const size_t ig = size_t(t) * 2 * F + c;
        const double g = gu.d[ig], u = gu.d[ig + F], d = da[size_t(t) * F + c], sg = 1 / (1 + std::exp(-g));
        ref[ig] = d * u * sg * (1 + g * (1 - sg));
        ref[ig + F] = d * g * sg;
      }
    Dev<uint16_t> dGu(gu.b), dOut(ref.size());
    Dev<float> dDa(da);
    cu::swiglu_bwd(dGu.p, dDa.p, dOut.p, T, F, s.s);
    expect_bf16(dOut.down(), ref, "dgate_up");
  }
}

// ---- q/k/v post-processing backward -----------------------------------------------------------------------------

struct QkvCase {
  int Hq, Hkv, hd;
  bool norm, bias, add;
};
std::string name(const QkvCase& k) {
  return "Hq " + std::to_string(k.Hq) + " Hkv " + std::to_string(k.Hkv) + " hd " + std::to_string(k.hd) +
         (k.norm ? " norm" : "") + (k.bias ? " bias" : "") + (k.add ? " pool-add" : "");
}

// Everything a q/k/v post-processing problem needs, in double.
struct QkvProblem {
  int T = 0, Hq = 0, Hkv = 0, hd = 0, W = 0;
  bool norm = false, bias = false, add = false;
  double eps = 0;
  std::vector<double> qkv, b, qn, kn, dq, dk, dv, dadd;
  std::vector<float> inv;  // fp32, as the model keeps it

  // RoPE's angle exactly as qkv_post forms it: the fp32 product float(t) * inv_freq[i].
  double angle(int t, int i) const { return double(static_cast<float>(t) * inv[i]); }

  // The loss whose gradient the backward computes: sum(dq . q_rot) + sum(dk . k_rot) + sum(dadd . k_normed) +
  // sum(dv . v), q_rot / k_rot / v from qkv_post's contract (bias, per-head RMSNorm, rotate-half RoPE).
  double loss(const std::vector<double>& x) const {
    const int half = hd / 2;
    double L = 0;
    std::vector<double> h(hd);
    for (int t = 0; t < T; ++t)
      for (int hh = 0; hh < Hq + Hkv; ++hh) {
        const bool is_q = hh < Hq;
        const int col = hh * hd;
        for (int i = 0; i < hd; ++i) h[i] = x[size_t(t) * W + col + i] + (bias ? b[col + i] : 0.0);
        if (norm) {
          double ss = 0;
          for (double v : h) ss += v * v;
          const double r = 1 / std::sqrt(ss / hd + eps);
          for (int i = 0; i < hd; ++i) h[i] = (is_q ? qn : kn)[i] * (h[i] * r);
        }
        const size_t g = is_q ? (size_t(t) * Hq + hh) * hd : (size_t(t) * Hkv + hh - Hq) * hd;
        if (!is_q && add)
          for (int i = 0; i < hd; ++i) L += dadd[g + i] * h[i];
        const std::vector<double>& gr = is_q ? dq : dk;
        for (int i = 0; i < half; ++i) {
          const double c = std::cos(angle(t, i)), s = std::sin(angle(t, i));
          L += gr[g + i] * (h[i] * c - h[i + half] * s) + gr[g + i + half] * (h[i + half] * c + h[i] * s);
        }
        if (!is_q) {
          const size_t vc = size_t(t) * W + (Hq + Hkv + hh - Hq) * hd;
          for (int i = 0; i < hd; ++i) L += dv[g + i] * (x[vc + i] + (bias ? b[(Hq + Hkv + hh - Hq) * hd + i] : 0.0));
        }
      }
    return L;
  }

  // The backward, per head: RoPE transposed, (+ pooled-key gradient for k), norm backward; v passes through.
  std::vector<double> grad() const {
    const int half = hd / 2;
    std::vector<double> out(size_t(T) * W), g(hd), h(hd), dx(hd);
    for (int t = 0; t < T; ++t)
      for (int hh = 0; hh < Hq + Hkv; ++hh) {
        const bool is_q = hh < Hq;
        const int col = hh * hd;
        const size_t gi = is_q ? (size_t(t) * Hq + hh) * hd : (size_t(t) * Hkv + hh - Hq) * hd;
        const std::vector<double>& gr = is_q ? dq : dk;
        for (int i = 0; i < half; ++i) {
          const double c = std::cos(angle(t, i)), s = std::sin(angle(t, i));
          g[i] = gr[gi + i] * c + gr[gi + i + half] * s;
          g[i + half] = gr[gi + i + half] * c - gr[gi + i] * s;
        }
        if (!is_q && add)
          for (int i = 0; i < hd; ++i) g[i] += dadd[gi + i];
        if (norm) {
          for (int i = 0; i < hd; ++i) h[i] = qkv[size_t(t) * W + col + i] + (bias ? b[col + i] : 0.0);
          rmsnorm_bwd_ref(h.data(), (is_q ? qn : kn).data(), g.data(), dx.data(), 1, hd, eps);
        } else {
          dx = g;
        }
        for (int i = 0; i < hd; ++i) out[size_t(t) * W + col + i] = dx[i];
        if (!is_q)
          for (int i = 0; i < hd; ++i) out[size_t(t) * W + (Hq + Hkv + hh - Hq) * hd + i] = dv[gi + i];
      }
    return out;
  }
};

class CudaQkvPostBwd : public ::testing::TestWithParam<QkvCase> {};

TEST_P(CudaQkvPostBwd, MatchesCpuAndForward) {
  SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  const QkvCase k = GetParam();
  SCOPED_TRACE(name(k));
  const int T = 300;  // positions up to 299: angles far past 2 pi in the fast RoPE pairs
  const float eps = 1e-6f;
  QkvProblem P;
  P.T = T, P.Hq = k.Hq, P.Hkv = k.Hkv, P.hd = k.hd, P.W = (k.Hq + 2 * k.Hkv) * k.hd;
  P.norm = k.norm, P.bias = k.bias, P.add = k.add, P.eps = double(eps);
  const Bf qkv = random_bf(size_t(T) * P.W, rng, 1.0), bias = random_bf(P.W, rng, 0.5),
           qn = random_bf(P.hd, rng, 0.2, 1.0), kn = random_bf(P.hd, rng, 0.2, 1.0);
  P.qkv = qkv.d, P.b = bias.d, P.qn = qn.d, P.kn = kn.d;
  P.inv.resize(P.hd / 2);
  for (int i = 0; i < P.hd / 2; ++i) P.inv[i] = float(std::pow(1e6, -2.0 * i / P.hd));
  const auto dq = random_f(size_t(T) * P.Hq * P.hd, rng), dk = random_f(size_t(T) * P.Hkv * P.hd, rng),
             dv = random_f(size_t(T) * P.Hkv * P.hd, rng), dadd = random_f(size_t(T) * P.Hkv * P.hd, rng);
  P.dq = widen(dq), P.dk = widen(dk), P.dv = widen(dv), P.dadd = widen(dadd);
  const std::vector<double> ref = P.grad();

  // The reference against the forward: a central difference along a random direction (double, tiny error).
  {
    std::normal_distribution<double> N(0, 1);
    std::vector<double> dir(ref.size()), xp = P.qkv, xm = P.qkv;
    double dd = 0, mag = 0;  // mag: the scale of the dot product's terms, for the rounding-level tolerance
    for (size_t i = 0; i < dir.size(); ++i) {
      dir[i] = N(rng);
      dd += dir[i] * ref[i];
      mag += std::fabs(dir[i] * ref[i]);
    }
    const double h = 1e-5;
    for (size_t i = 0; i < dir.size(); ++i) xp[i] += h * dir[i], xm[i] -= h * dir[i];
    const double fd = (P.loss(xp) - P.loss(xm)) / (2 * h);
    EXPECT_NEAR(dd, fd, 1e-7 * mag + 1e-6 * std::fabs(fd)) << "the CPU reference disagrees with the forward";
  }

  Dev<uint16_t> dQkv(qkv.b), dBias(bias.b), dQn(qn.b), dKn(kn.b), dOut(ref.size());
  Dev<float> dInv(P.inv), dDq(dq), dDk(dk), dDv(dv), dAdd(dadd);
  cu::QkvPostBwdParams p;
  p.qkv = dQkv.p;
  p.bias = k.bias ? dBias.p : nullptr;
  p.q_norm = k.norm ? dQn.p : nullptr;
  p.k_norm = k.norm ? dKn.p : nullptr;
  p.inv_freq = dInv.p;
  p.eps = eps;
  p.T = T, p.n_heads = k.Hq, p.n_kv_heads = k.Hkv, p.head_dim = k.hd;
  p.dq_rot = dDq.p, p.dk_rot = dDk.p, p.dv = dDv.p;
  p.dk_pre_rope_add = k.add ? dAdd.p : nullptr;
  p.dqkv = dOut.p;
  Stream s;
  cu::qkv_post_bwd(p, s.s);
  expect_bf16(dOut.down(), ref, "dqkv");
}

// GQA groups 1, 2, 4 (and 8); head_dim 64, 128, 256 (the limit); with and without the norms, bias, pooled-key add.
INSTANTIATE_TEST_SUITE_P(Shapes, CudaQkvPostBwd,
                         ::testing::Values(QkvCase{8, 2, 128, true, false, true}, QkvCase{6, 3, 64, false, true, false},
                                           QkvCase{4, 4, 64, true, true, true}, QkvCase{16, 4, 128, true, true, false},
                                           QkvCase{4, 2, 128, false, false, true},
                                           QkvCase{8, 1, 256, true, true, true},
                                           QkvCase{2, 2, 128, false, false, false}));

// ---- the gate's mixture ------------------------------------------------------------------------------------------

TEST(CudaTrainOps, GateMixtureForwardBackward) {
  SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  Stream s;
  struct Case {
    int T, Hq, Hkv, hd;
  };
  // T below, at and far above the chunk count; groups 4, 1, 2.
  for (const Case c : {Case{50, 8, 2, 128}, Case{1001, 4, 4, 64}, Case{257, 8, 4, 64}, Case{1, 2, 1, 128},
                       Case{2053, 16, 8, 128}}) {
    SCOPED_TRACE("T " + std::to_string(c.T) + " Hq " + std::to_string(c.Hq) + " Hkv " + std::to_string(c.Hkv) +
                 " hd " + std::to_string(c.hd));
    const int group = c.Hq / c.Hkv;
    const size_t n = size_t(c.T) * c.Hq * c.hd;
    const Bf of = random_bf(n, rng, 1.0), os = random_bf(n, rng, 1.0);
    std::uniform_real_distribution<float> U(0.f, 1.f);
    std::vector<float> z(c.Hkv);
    for (float& v : z) v = U(rng);
    z[0] = 1.f;  // hard routing values
    if (c.Hkv > 1) z[1] = 0.f;
    const auto dO = random_f(n, rng), dz0 = random_f(c.Hkv, rng, 10.0);
    std::vector<double> o_ref(n), dof_ref(n), dos_ref(n), dz_ref(c.Hkv, 0.0);
    for (size_t i = 0; i < n; ++i) {
      const int kvh = int(i / c.hd % c.Hq) / group;
      o_ref[i] = z[kvh] * of.d[i] + (1.0 - z[kvh]) * os.d[i];
      dof_ref[i] = double(z[kvh]) * dO[i];
      dos_ref[i] = (1.0 - z[kvh]) * dO[i];
      dz_ref[kvh] += dO[i] * (of.d[i] - os.d[i]);
    }
    Dev<uint16_t> dOf(of.b), dOs(os.b), dOut(n), dDof(n), dDos(n);
    Dev<float> dZ(z), dDO(dO), dDz(dz0), dPart(size_t(cu::mix_bwd_partials(c.Hkv)));
    cu::mix_fwd(dOf.p, dOs.p, dZ.p, dOut.p, c.T, c.Hq, c.Hkv, c.hd, s.s);
    expect_bf16(dOut.down(), o_ref, "o");
    cu::mix_bwd(dDO.p, dOf.p, dOs.p, dZ.p, dDof.p, dDos.p, dDz.p, dPart.p, c.T, c.Hq, c.Hkv, c.hd, s.s);
    expect_bf16(dDof.down(), dof_ref, "dof");
    expect_bf16(dDos.down(), dos_ref, "dos");
    const auto dz1 = dDz.down();
    EXPECT_TRUE(rel_l2(minus(dz1, dz0), dz_ref, 1e-4, "dz"));
    // Reproducible: the same inputs give a bit-identical dz (poisoned workspace: stale partials must not matter).
    Dev<float> dPart2(size_t(cu::mix_bwd_partials(c.Hkv)));
    dDz.up(dz0);
    cu::mix_bwd(dDO.p, dOf.p, dOs.p, dZ.p, dDof.p, dDos.p, dDz.p, dPart2.p, c.T, c.Hq, c.Hkv, c.hd, s.s);
    EXPECT_EQ(dDz.down(), dz1);
  }
}

// ---- cross-entropy -----------------------------------------------------------------------------------------------

TEST(CudaTrainOps, CrossEntropyRows) {
  SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  Stream s;
  // V % 4 == 0 takes the 4-wide path (151936: Qwen's vocabulary), the others the scalar one.
  for (auto [rows, V] : {std::pair{5, 151936}, std::pair{7, 1000}, std::pair{3, 37}, std::pair{4, 32003},
                         std::pair{600, 4096}}) {
    SCOPED_TRACE("rows " + std::to_string(rows) + " V " + std::to_string(V));
    auto logits = random_f(size_t(rows) * V, rng, 3.0);
    std::vector<int32_t> tg(rows);
    for (auto& t : tg) t = int32_t(rng() % V);
    // Row 0: masked entries (-inf; the target stays finite); row 1: a confident prediction (loss ~ 0).
    for (int j = 0; j < V; j += 3)
      if (j != tg[0]) logits[j] = -INFINITY;
    if (rows > 1) logits[size_t(V) + tg[1]] = 60.f;
    const float scale = 0.37f;
    const double base = 1.25;  // loss_sum adds onto this
    double loss_ref = 0;
    std::vector<double> dref(size_t(rows) * V);
    for (int r = 0; r < rows; ++r) {
      const float* l = logits.data() + size_t(r) * V;
      double mx = -INFINITY, sum = 0;
      for (int j = 0; j < V; ++j) mx = std::max(mx, double(l[j]));
      for (int j = 0; j < V; ++j) sum += std::exp(double(l[j]) - mx);
      const double lse = mx + std::log(sum);
      loss_ref += lse - l[tg[r]];
      for (int j = 0; j < V; ++j) dref[size_t(r) * V + j] = scale * (std::exp(double(l[j]) - lse) - (j == tg[r]));
    }
    Dev<float> dL(logits), dRow(rows), dSum(std::vector<float>{float(base)});
    Dev<int32_t> dT(tg);
    Dev<uint16_t> dD(dref.size());
    cu::cross_entropy_rows(dL.p, rows, V, dT.p, scale, dRow.p, dSum.p, dD.p, s.s);
    const double got = dSum.down()[0] - base;
    EXPECT_NEAR(got, loss_ref, 1e-5 * std::fabs(loss_ref) + 1e-5);
    const auto d1 = dD.down();
    expect_bf16(d1, dref, "dlogits");
    // Without a gradient buffer only the loss is added, the same value again.
    cu::cross_entropy_rows(dL.p, rows, V, dT.p, scale, dRow.p, dSum.p, nullptr, s.s);
    EXPECT_NEAR(dSum.down()[0] - base, 2 * loss_ref, 2e-5 * std::fabs(loss_ref) + 2e-5);
    // Bit-identical on a repeat.
    Dev<uint16_t> dD2(dref.size());
    cu::cross_entropy_rows(dL.p, rows, V, dT.p, scale, dRow.p, dSum.p, dD2.p, s.s);
    EXPECT_EQ(dD2.down(), d1);
  }
}

TEST(CudaTrainOps, CrossEntropyIgnoredTargets) {
  SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  const int rows = 4, V = 1000;
  const auto logits = random_f(size_t(rows) * V, rng, 2.0);
  const std::vector<int32_t> tg = {-100, 3, V, 999};  // rows 0 and 2 are ignored
  double loss_ref = 0;
  for (int r : {1, 3}) {
    const float* l = logits.data() + size_t(r) * V;
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j < V; ++j) mx = std::max(mx, double(l[j]));
    for (int j = 0; j < V; ++j) sum += std::exp(double(l[j]) - mx);
    loss_ref += mx + std::log(sum) - l[tg[r]];
  }
  Dev<float> dL(logits), dRow(rows), dSum(std::vector<float>{0.f});
  Dev<int32_t> dT(tg);
  Dev<uint16_t> dD(size_t(rows) * V);
  cu::cross_entropy_rows(dL.p, rows, V, dT.p, 1.f, dRow.p, dSum.p, dD.p, nullptr);
  EXPECT_NEAR(dSum.down()[0], loss_ref, 1e-5 * loss_ref);
  const auto d = dD.down();
  for (int r : {0, 2})
    for (int j = 0; j < V; ++j) ASSERT_EQ(fl(d[size_t(r) * V + j]), 0.f) << "row " << r << " col " << j;
  for (int j = 0; j < V; ++j) ASSERT_TRUE(std::isfinite(fl(d[size_t(V) + j])));
}

// ---- conversions -------------------------------------------------------------------------------------------------

TEST(CudaTrainOps, ConversionsAndAdd) {
  SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  Stream s;
  for (size_t n : {size_t(100003), size_t(1)}) {
    auto x = random_f(n, rng, 100.0);
    const auto y0 = random_f(n, rng);
    // Specials: infinities, rounding over the top into inf, ties, subnormals, signed zero.
    const float specials[] = {INFINITY, -INFINITY, FLT_MAX, -3.3961e38f, 1.00390625f, 1.01171875f,
                              1e-40f,   -3e-39f,   0.f,     -0.f};
    for (size_t i = 0; i < std::size(specials) && i < n; ++i) x[i] = specials[i];
    Dev<float> dx(x), dy(y0), back(n);
    Dev<uint16_t> b(n);
    cu::convert_f32_to_bf16(dx.p, b.p, int64_t(n), s.s);
    cu::convert_bf16_to_f32(b.p, back.p, int64_t(n), s.s);
    cu::add_inplace_f32(dy.p, dx.p, int64_t(n), s.s);
    const auto bb = b.down();
    const auto fb = back.down();
    const auto sum = dy.down();
    size_t bad_b = 0, bad_f = 0, bad_s = 0;
    for (size_t i = 0; i < n; ++i) {
      bad_b += bb[i] != bf(x[i]);
      const float wide = fl(bb[i]);
      bad_f += std::memcmp(&fb[i], &wide, sizeof(float)) != 0;
      const float want = y0[i] + x[i];
      bad_s += !(sum[i] == want || (std::isnan(sum[i]) && std::isnan(want)));
    }
    EXPECT_EQ(bad_b, 0u) << "f32 -> bf16 mismatches, n " << n;
    EXPECT_EQ(bad_f, 0u) << "bf16 -> f32 mismatches, n " << n;
    EXPECT_EQ(bad_s, 0u) << "add mismatches, n " << n;
  }
}

// ---- argument checks (host side, no GPU needed) ------------------------------------------------------------------

TEST(CudaTrainOpsHost, BadArgumentsThrow) {
  // Stand-in pointers: never dereferenced, every call below fails its host-side checks before any launch.
  std::vector<uint16_t> hb(64);
  std::vector<float> hf(64);
  std::vector<int32_t> hi(4);
  uint16_t* b = hb.data();
  float* f = hf.data();
  const cudaStream_t st = nullptr;
  using IA = std::invalid_argument;

  EXPECT_THROW(cu::rmsnorm_bwd(b, b, f, f, 0, 8, 1e-6f, st), IA);
  EXPECT_THROW(cu::rmsnorm_bwd(b, b, f, f, 2, -1, 1e-6f, st), IA);
  EXPECT_THROW(cu::rmsnorm_bwd(nullptr, b, f, f, 2, 8, 1e-6f, st), IA);
  EXPECT_THROW(cu::rmsnorm_bwd(b, b, f, nullptr, 2, 8, 1e-6f, st), IA);

  EXPECT_THROW(cu::swiglu_bwd(b, f, nullptr, 2, 4, st), IA);
  EXPECT_THROW(cu::swiglu_bwd(b, f, b, 0, 4, st), IA);
  EXPECT_THROW(cu::swiglu_bwd(b, f, b, 2, 0, st), IA);

  cu::QkvPostBwdParams ok;
  ok.T = 1, ok.n_heads = 4, ok.n_kv_heads = 2, ok.head_dim = 8;
  ok.qkv = b, ok.inv_freq = f, ok.dq_rot = f, ok.dk_rot = f, ok.dv = f, ok.dqkv = b;
  auto with = [&](auto change) {
    cu::QkvPostBwdParams p = ok;
    change(p);
    return p;
  };
  EXPECT_THROW(cu::qkv_post_bwd(with([](auto& p) { p.n_heads = 3; }), st), IA);  // 3 % 2 != 0
  EXPECT_THROW(cu::qkv_post_bwd(with([](auto& p) { p.head_dim = 7; }), st), IA);
  EXPECT_THROW(cu::qkv_post_bwd(with([](auto& p) { p.head_dim = 258; }), st), IA);
  EXPECT_THROW(cu::qkv_post_bwd(with([](auto& p) { p.head_dim = 0; }), st), IA);
  EXPECT_THROW(cu::qkv_post_bwd(with([](auto& p) { p.T = 0; }), st), IA);
  EXPECT_THROW(cu::qkv_post_bwd(with([](auto& p) { p.n_kv_heads = 0; }), st), IA);
  EXPECT_THROW(cu::qkv_post_bwd(with([](auto& p) { p.n_heads = 65536, p.n_kv_heads = 2; }), st), IA);
  EXPECT_THROW(cu::qkv_post_bwd(with([](auto& p) { p.qkv = nullptr; }), st), IA);
  EXPECT_THROW(cu::qkv_post_bwd(with([](auto& p) { p.inv_freq = nullptr; }), st), IA);
  EXPECT_THROW(cu::qkv_post_bwd(with([](auto& p) { p.dk_rot = nullptr; }), st), IA);
  EXPECT_THROW(cu::qkv_post_bwd(with([](auto& p) { p.dqkv = nullptr; }), st), IA);

  EXPECT_THROW(cu::mix_fwd(b, b, f, b, 1, 3, 2, 8, st), IA);
  EXPECT_THROW(cu::mix_fwd(b, b, nullptr, b, 1, 2, 1, 8, st), IA);
  EXPECT_THROW(cu::mix_fwd(b, b, f, b, 0, 2, 1, 8, st), IA);
  EXPECT_THROW(cu::mix_bwd(f, b, b, f, b, b, f, nullptr, 1, 2, 1, 8, st), IA);  // no workspace
  EXPECT_THROW(cu::mix_bwd(f, b, b, f, b, b, nullptr, f, 1, 2, 1, 8, st), IA);
  EXPECT_THROW(cu::mix_bwd(f, b, b, f, b, b, f, f, 1, 2, 1, 9, st), IA);
  EXPECT_THROW(cu::mix_bwd(f, b, b, f, b, b, f, f, -1, 2, 1, 8, st), IA);

  EXPECT_THROW(cu::cross_entropy_rows(f, 1, 0, hi.data(), 1.f, f, f, nullptr, st), IA);
  EXPECT_THROW(cu::cross_entropy_rows(f, 0, 8, hi.data(), 1.f, f, f, nullptr, st), IA);
  EXPECT_THROW(cu::cross_entropy_rows(f, 1, 8, nullptr, 1.f, f, f, nullptr, st), IA);
  EXPECT_THROW(cu::cross_entropy_rows(f, 1, 8, hi.data(), 1.f, nullptr, f, nullptr, st), IA);
  EXPECT_THROW(cu::cross_entropy_rows(f, 1, 8, hi.data(), 1.f, f, nullptr, nullptr, st), IA);

  EXPECT_THROW(cu::convert_f32_to_bf16(f, b, 0, st), IA);
  EXPECT_THROW(cu::convert_f32_to_bf16(nullptr, b, 4, st), IA);
  EXPECT_THROW(cu::convert_bf16_to_f32(b, f, -3, st), IA);
  EXPECT_THROW(cu::convert_bf16_to_f32(b, nullptr, 4, st), IA);
  EXPECT_THROW(cu::add_inplace_f32(f, f, 0, st), IA);
  EXPECT_THROW(cu::add_inplace_f32(nullptr, f, 4, st), IA);
}

}  // namespace
