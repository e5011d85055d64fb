// The fused XAttention estimator's selection rule (src/cuda/xattn_threshold.h, the code the kernel runs), checked on
// the CPU against the greedy rule it replaces: sort the candidates by descending mass (ties: lower index first), take
// them while the kept mass is < tau * total. Both sides sum the same fixed-point masses, so they must agree exactly,
// on random masses and on the cases that break careless thresholds: ties, zeros, tau 1, nothing or everything kept.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "cuda/xattn_threshold.h"

namespace xt = elastic::cuda::xattn_threshold;

namespace {

// Kept flags for blocks 0..qb under the greedy rule (xattn_select's steps 4-5, in fixed point).
std::vector<uint8_t> greedy(const std::vector<float>& m, int qb, float tau) {
  std::vector<uint8_t> keep(qb + 1, 0);
  uint64_t total = 0;
  for (int b = 0; b <= qb; ++b) total += xt::to_fixed(m[b]);
  const double required = static_cast<double>(total) * tau;
  keep[0] = keep[qb] = 1;
  uint64_t cum = xt::to_fixed(m[0]) + (qb > 0 ? xt::to_fixed(m[qb]) : 0);
  std::vector<int> cand;
  for (int b = 1; b < qb; ++b) cand.push_back(b);
  std::stable_sort(cand.begin(), cand.end(), [&](int a, int b) { return m[a] > m[b]; });  // ties: lower index first
  for (int b : cand) {
    if (!(static_cast<double>(cum) < required)) break;
    keep[b] = 1;
    cum += xt::to_fixed(m[b]);
  }
  return keep;
}

std::vector<uint8_t> by_threshold(const std::vector<float>& m, int qb, float tau) {
  uint64_t total = 0;
  for (int b = 0; b <= qb; ++b) total += xt::to_fixed(m[b]);
  const uint64_t forced = xt::to_fixed(m[0]) + (qb > 0 ? xt::to_fixed(m[qb]) : 0);
  auto above = [&](uint64_t t) {
    uint64_t s = 0;
    for (int b = 1; b < qb; ++b)
      if (xt::order_key(m[b], b) > t) s += xt::to_fixed(m[b]);
    return s;
  };
  const uint64_t t = xt::kept_threshold(qb > 1, forced, static_cast<double>(total) * tau, above);
  std::vector<uint8_t> keep(qb + 1, 0);
  for (int b = 0; b <= qb; ++b) keep[b] = b == 0 || b == qb || xt::kept(t, m[b], b);
  return keep;
}

}  // namespace

TEST(XAttnThreshold, MatchesTheGreedyRuleOnRandomMasses) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> qbs(0, 80), kind(0, 4);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  const float taus[] = {0.1f, 0.5f, 0.9f, 0.95f, 1.f};
  for (int trial = 0; trial < 20000; ++trial) {
    const int qb = qbs(rng);
    std::vector<float> m(qb + 1);
    const int k = kind(rng);
    for (float& x : m) {
      const float r = u(rng);
      x = k == 0   ? r                                    // spread
          : k == 1 ? std::floor(r * 4.f) / 4.f            // few distinct values: ties, zeros
          : k == 2 ? (r < 0.8f ? 0.f : r)                 // mostly zero (underflowed exps)
          : k == 3 ? 0.25f                                // all equal
                   : std::ldexp(1.f, -static_cast<int>(r * 40.f));  // powers of two down to 2^-40
    }
    const float tau = taus[trial % 5];
    ASSERT_EQ(by_threshold(m, qb, tau), greedy(m, qb, tau)) << "trial " << trial << " qb " << qb << " tau " << tau;
  }
}

TEST(XAttnThreshold, EdgeCases) {
  // No candidates (qb 0 and 1): only the forced blocks.
  EXPECT_EQ(by_threshold({1.f}, 0, 0.9f), (std::vector<uint8_t>{1}));
  EXPECT_EQ(by_threshold({0.5f, 0.5f}, 1, 0.9f), (std::vector<uint8_t>{1, 1}));
  // The forced blocks already reach tau * total: nothing else.
  EXPECT_EQ(by_threshold({0.6f, 0.1f, 0.3f}, 2, 0.9f), (std::vector<uint8_t>{1, 0, 1}));
  // tau 1 keeps every block with mass; ties go to the lower index.
  EXPECT_EQ(by_threshold({0.1f, 0.2f, 0.2f, 0.f, 0.1f}, 4, 1.f), greedy({0.1f, 0.2f, 0.2f, 0.f, 0.1f}, 4, 1.f));
  // Forced 0.1 of 1.0, required 0.5: block 1 (0.1 kept so far), block 2 (0.4), then 0.7 stops: of three equal
  // masses the two lower indices.
  EXPECT_EQ(by_threshold({0.f, 0.3f, 0.3f, 0.3f, 0.1f}, 4, 0.5f), (std::vector<uint8_t>{1, 1, 1, 0, 1}));
  // Keys order by mass, then lower index first.
  EXPECT_GT(xt::order_key(0.5f, 3), xt::order_key(0.25f, 1));
  EXPECT_GT(xt::order_key(0.5f, 1), xt::order_key(0.5f, 3));
  EXPECT_EQ(xt::kept_threshold(false, 0, 1.0, [](uint64_t) { return uint64_t(0); }), xt::kNone);
}
