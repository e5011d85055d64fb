// Tests for XAttention block selection (src/attention/xattn_select.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "elastic/xattn.h"

using elastic::BlockMask;
using elastic::XAttnParams;
using elastic::xattn_select;

namespace {

uint32_t fresh_seed(const char* what) {
  std::random_device rd;
  const uint32_t seed = rd();
  std::printf("[xattn] %s seed=%u\n", what, seed);
  return seed;
}

std::vector<float> randn(std::mt19937& rng, size_t n, float sd) {
  std::normal_distribution<float> nd(0.f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// Literal, slow reference. Everything in double.
struct RefResult {
  int nb = 0;
  std::vector<uint8_t> mask;
  std::vector<double> block;  // [nb, nb]
  double min_margin = std::numeric_limits<double>::infinity();  // relative distance to any decision boundary / tie
};

RefResult reference(const std::vector<float>& q, const std::vector<float>& k, int T, int hd, const XAttnParams& p) {
  const int B = p.block, S = p.stride;
  const int R = (T + S - 1) / S;
  const int nb = (T + B - 1) / B;
  const int rb = B / S;
  auto qv = [&](int t, int d) -> double { return t < T ? q[static_cast<size_t>(t) * hd + d] : 0.0; };
  auto kv = [&](int t, int d) -> double { return t < T ? k[static_cast<size_t>(t) * hd + d] : 0.0; };

  // Full reshaped score matrix [R, R].
  const double neg_inf = -std::numeric_limits<double>::infinity();
  std::vector<double> A(static_cast<size_t>(R) * R, neg_inf);
  for (int i = 0; i < R; ++i) {
    for (int j = 0; j < R; ++j) {
      if (j > i) continue;  // causal mask on reshaped grid
      double s = 0.0;
      for (int st = 0; st < S; ++st)
        for (int d = 0; d < hd; ++d) s += qv(i * S + (S - 1 - st), d) * kv(j * S + st, d);
      A[static_cast<size_t>(i) * R + j] = s / std::sqrt(static_cast<double>(hd)) / S;
    }
  }
  // Softmax per row.
  for (int i = 0; i < R; ++i) {
    double mx = neg_inf;
    for (int j = 0; j < R; ++j) mx = std::max(mx, A[static_cast<size_t>(i) * R + j]);
    double sum = 0.0;
    for (int j = 0; j < R; ++j) {
      double& a = A[static_cast<size_t>(i) * R + j];
      a = std::exp(a - mx);  // exp(-inf) = 0
      sum += a;
    }
    for (int j = 0; j < R; ++j) A[static_cast<size_t>(i) * R + j] /= sum;
  }
  // Block sums.
  RefResult r;
  r.nb = nb;
  r.block.assign(static_cast<size_t>(nb) * nb, 0.0);
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < R; ++j) r.block[static_cast<size_t>(i / rb) * nb + j / rb] += A[static_cast<size_t>(i) * R + j];
  // Greedy selection.
  r.mask.assign(static_cast<size_t>(nb) * nb, 0);
  for (int qb = 0; qb < nb; ++qb) {
    const double* row = &r.block[static_cast<size_t>(qb) * nb];
    double total = 0.0;
    for (int kb = 0; kb < nb; ++kb) total += row[kb];
    const double required = total * static_cast<double>(p.tau);
    r.mask[static_cast<size_t>(qb) * nb + 0] = 1;
    r.mask[static_cast<size_t>(qb) * nb + qb] = 1;
    double cum = row[0] + (qb > 0 ? row[qb] : 0.0);
    std::vector<int> rest;
    for (int kb = 1; kb < qb; ++kb) rest.push_back(kb);
    std::stable_sort(rest.begin(), rest.end(), [row](int a, int b) { return row[a] > row[b]; });
    for (size_t t = 0; t + 1 < rest.size(); ++t)
      r.min_margin = std::min(r.min_margin, std::fabs(row[rest[t]] - row[rest[t + 1]]) / total);
    for (int kb : rest) {
      r.min_margin = std::min(r.min_margin, std::fabs(cum - required) / total);
      if (!(cum < required)) break;
      r.mask[static_cast<size_t>(qb) * nb + kb] = 1;
      cum += row[kb];
    }
  }
  return r;
}

std::string mask_str(const std::vector<uint8_t>& m, int nb) {
  std::string s;
  for (int qb = 0; qb < nb; ++qb) {
    for (int kb = 0; kb < nb; ++kb) s += m[static_cast<size_t>(qb) * nb + kb] ? '1' : '.';
    s += '\n';
  }
  return s;
}

void check_structure(const BlockMask& m, int T, int B) {
  const int nb = (T + B - 1) / B;
  ASSERT_EQ(m.n_blocks, nb);
  ASSERT_EQ(m.mask.size(), static_cast<size_t>(nb) * nb);
  for (int qb = 0; qb < nb; ++qb) {
    EXPECT_TRUE(m.at(qb, 0)) << "block 0 not selected, qb=" << qb;
    EXPECT_TRUE(m.at(qb, qb)) << "diagonal not selected, qb=" << qb;
    for (int kb = qb + 1; kb < nb; ++kb) EXPECT_FALSE(m.at(qb, kb)) << "above diagonal qb=" << qb << " kb=" << kb;
  }
}

}  // namespace

TEST(XAttn, MatchesLiteralReference) {
  const uint32_t seed = fresh_seed("MatchesLiteralReference");
  std::mt19937 rng(seed);
  int cases = 0;
  for (int T : {200, 256, 333, 517}) {
    for (int hd : {64, 128}) {
      for (int B : {64, 128}) {
        for (int S : {8, 16}) {
          for (float tau : {0.9f, 0.5f}) {
            XAttnParams p;
            p.block = B;
            p.stride = S;
            p.tau = tau;
            // Re-draw if the random input happens to sit close to a tie or threshold boundary.
            for (int attempt = 0; attempt < 10; ++attempt) {
              const auto q = randn(rng, static_cast<size_t>(T) * hd, 2.0f);
              const auto k = randn(rng, static_cast<size_t>(T) * hd, 1.0f);
              const RefResult ref = reference(q, k, T, hd, p);
              if (ref.min_margin < 1e-4 && attempt < 9) continue;
              const BlockMask m = xattn_select(q.data(), k.data(), T, hd, p);
              SCOPED_TRACE(testing::Message() << "seed=" << seed << " T=" << T << " hd=" << hd << " B=" << B
                                              << " S=" << S << " tau=" << tau << " margin=" << ref.min_margin);
              check_structure(m, T, B);
              ASSERT_EQ(m.n_blocks, ref.nb);
              EXPECT_EQ(m.mask, ref.mask) << "got:\n" << mask_str(m.mask, m.n_blocks) << "want:\n"
                                          << mask_str(ref.mask, ref.nb);
              int64_t cnt = 0;
              for (auto v : ref.mask) cnt += v;
              EXPECT_EQ(m.selected(), cnt);
              // Mass condition: selected mass reaches tau * total for every row.
              for (int qb = 0; qb < ref.nb; ++qb) {
                double tot = 0, sel = 0;
                for (int kb = 0; kb <= qb; ++kb) {
                  const double b = ref.block[static_cast<size_t>(qb) * ref.nb + kb];
                  tot += b;
                  if (m.at(qb, kb)) sel += b;
                }
                EXPECT_GE(sel, tau * tot * (1 - 1e-9)) << "qb=" << qb;
              }
              ++cases;
              break;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 4 * 2 * 2 * 2 * 2);
}

TEST(XAttn, LowerTauSelectsSubset) {
  const uint32_t seed = fresh_seed("LowerTauSelectsSubset");
  std::mt19937 rng(seed);
  const int T = 1024, hd = 64;
  const auto q = randn(rng, static_cast<size_t>(T) * hd, 2.0f);
  const auto k = randn(rng, static_cast<size_t>(T) * hd, 1.0f);
  XAttnParams hi, lo;
  hi.tau = 0.95f;
  lo.tau = 0.3f;
  const BlockMask mh = xattn_select(q.data(), k.data(), T, hd, hi);
  const BlockMask ml = xattn_select(q.data(), k.data(), T, hd, lo);
  check_structure(mh, T, 64);
  check_structure(ml, T, 64);
  for (size_t i = 0; i < ml.mask.size(); ++i)
    if (ml.mask[i]) {
      EXPECT_TRUE(mh.mask[i]) << "index " << i << " seed=" << seed;
    }
  EXPECT_LT(ml.selected(), mh.selected());
}

TEST(XAttn, TauOneSelectsAllCausal) {
  const uint32_t seed = fresh_seed("TauOneSelectsAllCausal");
  std::mt19937 rng(seed);
  for (int T : {200, 333, 640}) {
    for (int S : {8, 16}) {
      const int hd = 64;
      XAttnParams p;
      p.block = 64;
      p.stride = S;
      p.tau = 1.0f;
      const auto q = randn(rng, static_cast<size_t>(T) * hd, 2.0f);
      const auto k = randn(rng, static_cast<size_t>(T) * hd, 1.0f);
      const BlockMask m = xattn_select(q.data(), k.data(), T, hd, p);
      SCOPED_TRACE(testing::Message() << "seed=" << seed << " T=" << T << " S=" << S);
      check_structure(m, T, p.block);
      const int nb = m.n_blocks;
      const int64_t causal = static_cast<int64_t>(nb) * (nb + 1) / 2;
      // Every row may miss at most its last (smallest) block to rounding; in practice none.
      EXPECT_GE(m.selected(), causal - nb);
      EXPECT_LE(m.selected(), causal);
      const RefResult ref = reference(q, k, T, hd, p);
      for (int qb = 0; qb < nb; ++qb) {
        double tot = 0, sel = 0;
        for (int kb = 0; kb <= qb; ++kb) {
          const double b = ref.block[static_cast<size_t>(qb) * nb + kb];
          tot += b;
          if (m.at(qb, kb)) sel += b;
        }
        EXPECT_GE(sel, tot * (1 - 1e-5)) << "qb=" << qb;
      }
    }
  }
}

TEST(XAttn, PlantedDominantKeyBlock) {
  const uint32_t seed = fresh_seed("PlantedDominantKeyBlock");
  std::mt19937 rng(seed);
  const int T = 600, hd = 64;  // 10 blocks of 64, last one partial (600 = 9*64 + 24)
  const int planted = 3;
  std::vector<float> u = randn(rng, hd, 1.0f);
  auto q = randn(rng, static_cast<size_t>(T) * hd, 0.1f);
  auto k = randn(rng, static_cast<size_t>(T) * hd, 1.0f);
  for (int t = 0; t < T; ++t)
    for (int d = 0; d < hd; ++d) q[static_cast<size_t>(t) * hd + d] += u[d];
  for (int t = planted * 64; t < (planted + 1) * 64; ++t)
    for (int d = 0; d < hd; ++d) k[static_cast<size_t>(t) * hd + d] = 3.0f * u[d];
  for (int S : {8, 16}) {
    XAttnParams p;
    p.block = 64;
    p.stride = S;
    p.tau = 0.3f;
    const BlockMask m = xattn_select(q.data(), k.data(), T, hd, p);
    SCOPED_TRACE(testing::Message() << "seed=" << seed << " S=" << S << "\n" << mask_str(m.mask, m.n_blocks));
    check_structure(m, T, 64);
    for (int qb = planted + 1; qb < m.n_blocks; ++qb) {
      EXPECT_TRUE(m.at(qb, planted)) << "qb=" << qb;
      for (int kb = 1; kb < qb; ++kb)
        if (kb != planted) {
          EXPECT_FALSE(m.at(qb, kb)) << "qb=" << qb << " kb=" << kb;
        }
    }
    EXPECT_EQ(m.mask, reference(q, k, T, hd, p).mask);
  }
}

TEST(XAttn, SmallAndEdgeSizes) {
  const uint32_t seed = fresh_seed("SmallAndEdgeSizes");
  std::mt19937 rng(seed);
  const int hd = 64;
  for (int T : {1, 7, 16, 63, 64, 65, 129}) {
    const auto q = randn(rng, static_cast<size_t>(T) * hd, 2.0f);
    const auto k = randn(rng, static_cast<size_t>(T) * hd, 1.0f);
    XAttnParams p;  // defaults: B=64, S=16, tau=0.9
    const BlockMask m = xattn_select(q.data(), k.data(), T, hd, p);
    SCOPED_TRACE(testing::Message() << "seed=" << seed << " T=" << T);
    check_structure(m, T, p.block);
    EXPECT_EQ(m.mask, reference(q, k, T, hd, p).mask);
  }
  const BlockMask empty = xattn_select(nullptr, nullptr, 0, hd, XAttnParams{});
  EXPECT_EQ(empty.n_blocks, 0);
  EXPECT_EQ(empty.selected(), 0);
}

TEST(XAttn, NonDefaultBlockMultipleOfStride) {
  const uint32_t seed = fresh_seed("NonDefaultBlockMultipleOfStride");
  std::mt19937 rng(seed);
  const int T = 300, hd = 64;
  XAttnParams p;
  p.block = 48;
  p.stride = 16;
  p.tau = 0.8f;
  const auto q = randn(rng, static_cast<size_t>(T) * hd, 2.0f);
  const auto k = randn(rng, static_cast<size_t>(T) * hd, 1.0f);
  const BlockMask m = xattn_select(q.data(), k.data(), T, hd, p);
  check_structure(m, T, p.block);
  EXPECT_EQ(m.mask, reference(q, k, T, hd, p).mask) << "seed=" << seed;
}

TEST(XAttn, BadParamsThrow) {
  std::vector<float> q(128 * 64, 0.1f), k(128 * 64, 0.1f);
  auto run = [&](int block, int stride, float tau) {
    XAttnParams p;
    p.block = block;
    p.stride = stride;
    p.tau = tau;
    return xattn_select(q.data(), k.data(), 128, 64, p);
  };
  EXPECT_THROW(run(64, 0, 0.9f), std::invalid_argument);
  EXPECT_THROW(run(64, -8, 0.9f), std::invalid_argument);
  EXPECT_THROW(run(0, 16, 0.9f), std::invalid_argument);
  EXPECT_THROW(run(-64, 16, 0.9f), std::invalid_argument);
  EXPECT_THROW(run(100, 16, 0.9f), std::invalid_argument);
  EXPECT_THROW(run(64, 128, 0.9f), std::invalid_argument);
  EXPECT_THROW(run(64, 16, 0.0f), std::invalid_argument);
  EXPECT_THROW(run(64, 16, -0.5f), std::invalid_argument);
  EXPECT_THROW(run(64, 16, 1.01f), std::invalid_argument);
  EXPECT_THROW(run(64, 16, std::numeric_limits<float>::quiet_NaN()), std::invalid_argument);
  EXPECT_NO_THROW(run(64, 16, 1.0f));
  EXPECT_NO_THROW(run(128, 8, 0.5f));
  EXPECT_NO_THROW(run(64, 1, 0.9f));
  XAttnParams p;
  EXPECT_THROW(xattn_select(q.data(), k.data(), 128, 0, p), std::invalid_argument);
  EXPECT_THROW(xattn_select(q.data(), k.data(), -1, 64, p), std::invalid_argument);
  EXPECT_THROW(xattn_select(nullptr, k.data(), 128, 64, p), std::invalid_argument);
}

// q_begin (a chunk's first position): the rows from its block on are the full selection's rows, whatever the queries
// before it hold; the rows before are left empty; a q_begin off the block grid is refused.
TEST(XAttn, QueryBeginSelectsTheSameLaterRows) {
  const uint32_t seed = fresh_seed("QueryBeginSelectsTheSameLaterRows");
  std::mt19937 rng(seed);
  const int T = 700, hd = 64;
  XAttnParams p;
  p.block = 64;
  auto q = randn(rng, static_cast<size_t>(T) * hd, 2.0f);
  const auto k = randn(rng, static_cast<size_t>(T) * hd, 1.0f);
  const BlockMask full = xattn_select(q.data(), k.data(), T, hd, p);
  for (int q_begin : {64, 256, 640}) {
    auto q2 = q;
    for (size_t i = 0; i < static_cast<size_t>(q_begin) * hd; ++i) q2[i] = 123.f;  // never read
    const BlockMask m = xattn_select(q2.data(), k.data(), T, hd, p, q_begin);
    ASSERT_EQ(m.n_blocks, full.n_blocks);
    for (int qb = 0; qb < m.n_blocks; ++qb)
      for (int kb = 0; kb < m.n_blocks; ++kb)
        EXPECT_EQ(m.at(qb, kb), qb >= q_begin / p.block && full.at(qb, kb)) << "q_begin " << q_begin << " qb " << qb;
  }
  EXPECT_THROW(xattn_select(q.data(), k.data(), T, hd, p, 32), std::invalid_argument);
  EXPECT_THROW(xattn_select(q.data(), k.data(), T, hd, p, -64), std::invalid_argument);
}
