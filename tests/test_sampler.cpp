// Sampling: greedy, temperature draws follow softmax(logits / T), top-k and top-p restrict the candidates, seeds repeat.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
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

// Found by review: an +inf or NaN logit (an overflowed model) left the top-p path an empty candidate list, which it
// indexed (a crash of the server's engine thread). Every path now refuses such logits by name.
TEST(Sampler, NonFiniteLogitsAreRefusedByName) {
  const float inf = INFINITY, nan = NAN;
  const std::vector<std::vector<float>> bad = {{0.f, inf, 1.f}, {nan, 0.f, 1.f}, {-inf, -inf, -inf}};
  const std::vector<SamplerParams> params = {SamplerParams{}, SamplerParams{1.f, 0, 0.5f, 1},
                                             SamplerParams{1.f, 2, 1.f, 1}, SamplerParams{0.7f, 0, 1.f, 1}};
  for (const auto& lg : bad)
    for (const SamplerParams& p : params) {
      Sampler s(p);
      try {
        s.sample(lg.data(), 3);
        ADD_FAILURE() << "accepted non-finite logits at temperature " << p.temperature << ", top_p " << p.top_p;
      } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("sampler: "), std::string::npos) << e.what();
      }
    }
  // -inf beside finite logits is a mask, not an error: the masked ids are never drawn.
  const std::vector<float> masked = {-inf, 1.f, -inf, 0.f};
  Sampler s(SamplerParams{1.f, 0, 0.9f, 3});
  for (int i = 0; i < 200; ++i) {
    const int t = s.sample(masked.data(), 4);
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
}
