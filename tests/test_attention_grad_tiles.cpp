// The trainer's tiled attention (train::attn_fwd / attn_bwd: products over query and key blocks) against the
// row-by-row definition below, on fresh random inputs for every head mode, mixed routings within a layer, GQA groups
// of 1, 2 and 3, lengths that end mid-block and a lone partial block. double: within 1e-11 (only the summation order
// differs); float: within 2e-5 of the double reference relative to the tensor's largest entry.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "train/attention_grad.h"

using namespace elastic;
using namespace elastic::train;

namespace {

// The definition, one query row at a time: softmax over the kept keys at or before the row's position.
void ref_fwd(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v, int T, int Hq,
             int Hkv, int hd, const BlockKeep& keep, std::vector<double>& out, std::vector<double>& lse) {
  const int B = keep.sparse->block;
  const double scale = 1.0 / std::sqrt(double(hd));
  out.assign(q.size(), 0.0);
  lse.assign(static_cast<size_t>(Hq) * T, 0.0);
  std::vector<double> s(T);
  for (int h = 0; h < Hq; ++h)
    for (int i = 0; i < T; ++i) {
      const int kvh = h / keep.group, qb = i / B;
      double mx = -INFINITY;
      for (int j = 0; j <= i; ++j) {
        if (!keep(h, qb, j / B)) continue;
        double d = 0;
        for (int c = 0; c < hd; ++c) d += q[(size_t(i) * Hq + h) * hd + c] * k[(size_t(j) * Hkv + kvh) * hd + c];
        s[j] = d * scale;
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (int j = 0; j <= i; ++j) {
        if (!keep(h, qb, j / B)) continue;
        const double e = std::exp(s[j] - mx);
        sum += e;
        for (int c = 0; c < hd; ++c) out[(size_t(i) * Hq + h) * hd + c] += e * v[(size_t(j) * Hkv + kvh) * hd + c];
      }
      for (int c = 0; c < hd; ++c) out[(size_t(i) * Hq + h) * hd + c] /= sum;
      lse[size_t(h) * T + i] = mx + std::log(sum);
    }
}

// dS = P (dP - rowsum(dO O)) scale, per (row, kept key), accumulated into dq, dk, dv.
void ref_bwd(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
             const std::vector<double>& out, const std::vector<double>& lse, const std::vector<double>& dout, int T,
             int Hq, int Hkv, int hd, const BlockKeep& keep, std::vector<double>& dq, std::vector<double>& dk,
             std::vector<double>& dv) {
  const int B = keep.sparse->block;
  const double scale = 1.0 / std::sqrt(double(hd));
  for (int h = 0; h < Hq; ++h)
    for (int i = 0; i < T; ++i) {
      const int kvh = h / keep.group, qb = i / B;
      const size_t qo = (size_t(i) * Hq + h) * hd;
      double Di = 0;
      for (int c = 0; c < hd; ++c) Di += dout[qo + c] * out[qo + c];
      for (int j = 0; j <= i; ++j) {
        if (!keep(h, qb, j / B)) continue;
        const size_t ko = (size_t(j) * Hkv + kvh) * hd;
        double sd = 0, dp = 0;
        for (int c = 0; c < hd; ++c) {
          sd += q[qo + c] * k[ko + c];
          dp += dout[qo + c] * v[ko + c];
        }
        const double p = std::exp(sd * scale - lse[size_t(h) * T + i]), ds = p * (dp - Di) * scale;
        for (int c = 0; c < hd; ++c) {
          dq[qo + c] += ds * k[ko + c];
          dk[ko + c] += ds * q[qo + c];
          dv[ko + c] += p * dout[qo + c];
        }
      }
    }
}

std::vector<double> randn(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<double> N(0.0, 1.0);
  std::vector<double> x(n);
  for (auto& e : x) e = N(rng);
  return x;
}

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double e : x) m = std::max(m, std::abs(e));
  return m;
}

template <class Real>
void expect_near_all(const std::vector<Real>& got, const std::vector<double>& want, double rel, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double tol = rel * std::max(1.0, max_abs(want));
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(double(got[i]) - want[i]) <= tol) && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " entries off by more than " << tol
                     << "; first at " << first << ": " << double(got[first]) << " vs " << want[first];
}

struct Case {
  int T, Hq, Hkv, hd, block;
  std::vector<HeadMode> modes;  // per KV head
};

template <class Real>
void check_case(const Case& c, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "T " << c.T << " Hq " << c.Hq << " Hkv " << c.Hkv << " block " << c.block
                                    << " seed " << seed);
  std::mt19937_64 rng(seed);
  SparseSettings sp;
  sp.block = c.block;
  sp.sink = c.block;       // one sink block
  sp.local = 2 * c.block;  // and a window of two
  sp.xattn.stride = 4;
  const size_t nq = size_t(c.T) * c.Hq * c.hd, nk = size_t(c.T) * c.Hkv * c.hd;
  auto q = randn(nq, rng), k = randn(nk, rng), v = randn(nk, rng), dout = randn(nq, rng);
  // Peaked scores so XAttention drops blocks.
  for (auto& x : q) x *= 2.0;
  const auto xm = xattn_masks<double>(q.data(), k.data(), c.T, c.Hq, c.Hkv, c.hd, c.modes.data(), sp);
  const BlockKeep keep(c.modes.data(), c.Hkv, sp, &xm, c.Hq / c.Hkv);
  std::vector<double> out, lse, dq(nq, 0.0), dk(nk, 0.0), dv(nk, 0.0);
  ref_fwd(q, k, v, c.T, c.Hq, c.Hkv, c.hd, keep, out, lse);
  ref_bwd(q, k, v, out, lse, dout, c.T, c.Hq, c.Hkv, c.hd, keep, dq, dk, dv);

  auto as = [](const std::vector<double>& x) { return std::vector<Real>(x.begin(), x.end()); };
  const auto qr = as(q), kr = as(k), vr = as(v), doutr = as(dout);
  // NaN-filled outputs: every entry must be written. Gradients start from a random base (the backward adds).
  std::vector<Real> o(nq, Real(NAN)), l(size_t(c.Hq) * c.T, Real(NAN));
  attn_fwd<Real>(qr.data(), kr.data(), vr.data(), c.T, c.Hq, c.Hkv, c.hd, keep, o.data(), l.data());
  const auto base_q = randn(nq, rng), base_k = randn(nk, rng), base_v = randn(nk, rng);
  auto gq = as(base_q), gk = as(base_k), gv = as(base_v);
  attn_bwd<Real>(qr.data(), kr.data(), vr.data(), o.data(), l.data(), doutr.data(), c.T, c.Hq, c.Hkv, c.hd, keep,
                 gq.data(), gk.data(), gv.data());
  for (size_t i = 0; i < nq; ++i) gq[i] -= Real(base_q[i]);
  for (size_t i = 0; i < nk; ++i) {
    gk[i] -= Real(base_k[i]);
    gv[i] -= Real(base_v[i]);
  }
  const double rel = std::is_same_v<Real, double> ? 1e-11 : 2e-5;
  expect_near_all(o, out, rel, "out");
  expect_near_all(l, lse, rel, "lse");
  expect_near_all(gq, dq, rel, "dq");
  expect_near_all(gk, dk, rel, "dk");
  expect_near_all(gv, dv, rel, "dv");
}

std::vector<Case> cases() {
  using M = HeadMode;
  return {
      {37, 4, 2, 8, 8, {M::Streaming, M::Full}},
      {37, 4, 2, 8, 8, {M::XAttn, M::Full}},
      {5, 2, 1, 8, 8, {M::Full}},  // one partial block
      {200, 6, 2, 16, 16, {M::XAttn, M::Streaming}},
      {257, 9, 3, 16, 32, {M::Full, M::XAttn, M::Streaming}},  // SmolLM2's group of 3
      {130, 3, 3, 8, 16, {M::XAttn, M::XAttn, M::Full}},       // group of 1
  };
}

}  // namespace

TEST(AttentionGradTiles, DoubleMatchesRowByRow) {
  uint64_t seed = 11;
  for (const Case& c : cases()) check_case<double>(c, seed++);
}

TEST(AttentionGradTiles, FloatMatchesRowByRow) {
  uint64_t seed = 101;
  for (const Case& c : cases()) check_case<float>(c, seed++);
}

// A KV head whose backward is off (its branch weight 0 under hard routing) leaves every gradient row it would have
// touched as it was; the others equal the reference given a zero dout for the skipped head's query heads.
TEST(AttentionGradTiles, SkippedHeadsLeaveGradientsAlone) {
  std::mt19937_64 rng(7);
  const int T = 150, Hq = 6, Hkv = 3, hd = 8, group = Hq / Hkv;
  SparseSettings sp;
  sp.block = 16;
  sp.sink = 16;
  sp.local = 32;
  sp.xattn.stride = 4;
  const std::vector<HeadMode> modes = {HeadMode::Full, HeadMode::XAttn, HeadMode::Streaming};
  const size_t nq = size_t(T) * Hq * hd, nk = size_t(T) * Hkv * hd;
  auto q = randn(nq, rng), k = randn(nk, rng), v = randn(nk, rng), dout = randn(nq, rng);
  const auto xm = xattn_masks<double>(q.data(), k.data(), T, Hq, Hkv, hd, modes.data(), sp);
  for (int skipped = 0; skipped < Hkv; ++skipped) {
    BlockKeep keep(modes.data(), Hkv, sp, &xm, group);
    std::vector<double> out, lse, dq(nq, 0.0), dk(nk, 0.0), dv(nk, 0.0);
    ref_fwd(q, k, v, T, Hq, Hkv, hd, keep, out, lse);
    auto dout0 = dout;
    for (int t = 0; t < T; ++t)
      for (int h = skipped * group; h < (skipped + 1) * group; ++h)
        std::fill_n(dout0.begin() + (size_t(t) * Hq + h) * hd, hd, 0.0);
    ref_bwd(q, k, v, out, lse, dout0, T, Hq, Hkv, hd, keep, dq, dk, dv);
    keep.backward[skipped] = 0;
    std::vector<double> gq(nq, 0.0), gk(nk, 0.0), gv(nk, 0.0);
    attn_bwd<double>(q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), T, Hq, Hkv, hd, keep,
                     gq.data(), gk.data(), gv.data());  // the full dout: the skipped heads' rows must not be read
    expect_near_all(gq, dq, 1e-11, "dq");
    expect_near_all(gk, dk, 1e-11, "dk");
    expect_near_all(gv, dv, 1e-11, "dv");
  }
}
