// Sampling: greedy, temperature draws follow softmax(logits / T), top-k and top-p restrict the candidates, seeds repeat.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "elastic/generate.h"

using namespace elastic;

TEST(Sampler, GreedyTakesTheFirstMax) {
  const std::vector<float> lg = {0.f, 3.f, 1.f, 3.f};
  Sampler s(SamplerParams{});
  EXPECT_EQ(s.sample(lg.data(), 4), 1);
}

TEST(Sampler, TemperatureFrequenciesFollowSoftmax) {
  const std::vector<float> lg = {1.f, 0.f, 2.f, -1.f, 0.5f};
  const float T = 0.8f;
  std::vector<double> p(lg.size());
  double z = 0;
  for (size_t i = 0; i < lg.size(); ++i) z += p[i] = std::exp(lg[i] / T);
  Sampler s(SamplerParams{T, 0, 1.f, 7});
  const int n = 200000;
  std::vector<int> count(lg.size(), 0);
  for (int i = 0; i < n; ++i) ++count[s.sample(lg.data(), 5)];
  for (size_t i = 0; i < lg.size(); ++i) {
    const double want = p[i] / z, sd = std::sqrt(want * (1 - want) / n);
    EXPECT_NEAR(static_cast<double>(count[i]) / n, want, 5 * sd) << "token " << i;  // 5 sigma
  }
}

TEST(Sampler, TopKAndTopPRestrictTheCandidates) {
  const std::vector<float> lg = {2.f, 1.f, 0.f, 3.f, -1.f};  // order: 3, 0, 1, 2, 4
  Sampler k2(SamplerParams{1.f, 2, 1.f, 1});
  Sampler p50(SamplerParams{1.f, 0, 0.5f, 1});  // token 3 alone holds ~64% of the mass
  Sampler p80(SamplerParams{1.f, 0, 0.8f, 1});  // tokens 3 and 0 (~87%)
  for (int i = 0; i < 2000; ++i) {
    const int a = k2.sample(lg.data(), 5);
    EXPECT_TRUE(a == 3 || a == 0) << a;
    EXPECT_EQ(p50.sample(lg.data(), 5), 3);
    const int c = p80.sample(lg.data(), 5);
    EXPECT_TRUE(c == 3 || c == 0) << c;
  }
}

TEST(Sampler, SameSeedSameDraws) {
  std::vector<float> lg(1000);
  for (size_t i = 0; i < lg.size(); ++i) lg[i] = std::sin(0.37f * i) * 3;
  Sampler a(SamplerParams{0.9f, 0, 0.95f, 42}), b(SamplerParams{0.9f, 0, 0.95f, 42});
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.sample(lg.data(), 1000), b.sample(lg.data(), 1000));
}
