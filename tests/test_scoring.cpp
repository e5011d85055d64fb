// RULER scorers on hand-made cases, and reference-likelihood scoring against a full forward pass.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "elastic/model.h"
#include "elastic/scoring.h"

using namespace elastic;

TEST(EvalScoring, PostprocessLikeRuler) {
  EXPECT_EQ(ruler_postprocess("  a\tb\x01 \n"), "a\nb");
  EXPECT_EQ(ruler_postprocess(""), "");
  EXPECT_EQ(ruler_postprocess("\x02\x03"), "");
}

TEST(EvalScoring, StringMatchAllIsRecallOfReferences) {
  EXPECT_DOUBLE_EQ(string_match_all("The numbers are 123 and 456.", {"123", "456", "789"}), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(string_match_all("APPLE, Banana", {"apple", "banana"}), 1.0);  // case-insensitive
  EXPECT_DOUBLE_EQ(string_match_all("nothing here", {"apple"}), 0.0);
  EXPECT_DOUBLE_EQ(string_match_all("ab", {"a", "a"}), 1.0);  // each reference counted on its own
  // Substring semantics, as RULER's "r in pred": "12" is found inside "123".
  EXPECT_DOUBLE_EQ(string_match_all("123", {"12"}), 1.0);
  // A control character splits the prediction (becomes a newline), so the reference is no longer found.
  EXPECT_DOUBLE_EQ(string_match_all("12\x01" "34", {"1234"}), 0.0);
  EXPECT_THROW(string_match_all("x", std::vector<std::string>{}), std::runtime_error);
}

TEST(EvalScoring, StringMatchPartIsAnyReference) {
  EXPECT_DOUBLE_EQ(string_match_part("Paris is the answer", {"London", "paris"}), 1.0);
  EXPECT_DOUBLE_EQ(string_match_part("Rome", {"London", "Paris"}), 0.0);
  EXPECT_THROW(string_match_part("x", std::vector<std::string>{}), std::runtime_error);
}

TEST(EvalScoring, CorpusScoresMeanTimes100Rounded) {
  EXPECT_DOUBLE_EQ(ruler_string_match_all({"a b", "c"}, {{"a", "b"}, {"d"}}), 50.0);
  EXPECT_DOUBLE_EQ(ruler_string_match_all({"a", "x", "x"}, {{"a"}, {"b"}, {"c"}}), 33.33);
  EXPECT_DOUBLE_EQ(ruler_string_match_all({"a"}, {{"a", "b", "c"}}), 33.33);
  EXPECT_DOUBLE_EQ(ruler_string_match_part({"a", "x", "b"}, {{"a", "z"}, {"b"}, {"q", "b"}}), 66.67);
  EXPECT_THROW(ruler_string_match_all({"a"}, {{"a"}, {"b"}}), std::runtime_error);
  EXPECT_THROW(ruler_string_match_part(std::vector<std::string>{}, {}), std::runtime_error);
}

TEST(EvalScoring, IdsMatch) {
  const std::vector<int32_t> pred = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(ids_match_all(pred, {{2, 3}, {3, 2}, {5}}), 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(ids_match_part(pred, {{3, 2}, {4}}), 1.0);
  EXPECT_DOUBLE_EQ(ids_match_part(pred, {{3, 2}, {1, 3}}), 0.0);  // contiguous only
  EXPECT_DOUBLE_EQ(ids_match_all({}, {{1}}), 0.0);
  EXPECT_THROW(ids_match_all(pred, {}), std::runtime_error);
}

TEST(EvalScoring, LikelihoodFromLogitsByHand) {
  // V = 3. Row 0: uniform, reference 1 (argmax is 0 by the first-max rule: not a greedy hit).
  // Row 1: logits [2, 0, 0], reference 0: a greedy hit.
  const std::vector<float> logits = {0, 0, 0, 2, 0, 0};
  const LikelihoodScore s = likelihood_from_logits(logits.data(), 3, {1, 0});
  const double lp0 = -std::log(3.0), lp1 = 2.0 - std::log(std::exp(2.0) + 2.0);
  EXPECT_NEAR(s.mean_logprob, (lp0 + lp1) / 2, 1e-12);
  EXPECT_DOUBLE_EQ(s.greedy_acc, 0.5);
  EXPECT_EQ(s.tokens, 2);
  EXPECT_NEAR(s.score(), 100.0 * std::exp((lp0 + lp1) / 2), 1e-9);
  EXPECT_THROW(likelihood_from_logits(logits.data(), 3, {1, 3}), std::runtime_error);
  EXPECT_THROW(likelihood_from_logits(logits.data(), 3, {}), std::runtime_error);
}

TEST(EvalScoring, ReferenceLikelihoodMatchesOneFullPass) {
  Model m = Model::load(std::string(ELASTIC_FIXTURE_DIR) + "/qwen3_tiny");
  const int V = m.config.vocab;
  std::vector<int32_t> prompt, ref;
  for (int i = 0; i < 70; ++i) prompt.push_back((i * 37 + 11) % V);
  for (int i = 0; i < 12; ++i) ref.push_back((i * 101 + 7) % V);
  const RoutingTable full = RoutingTable::all_full(m.config.n_layers, m.config.n_kv_heads);
  AttentionStats st;
  const LikelihoodScore got = reference_likelihood(m, prompt, ref, &full, nullptr, &st, 32);
  // Expected: one pass over prompt + ref with all logits; row T-1+t predicts ref[t].
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), ref.begin(), ref.end() - 1);
  KVCache cache;
  cache.init(m.config, static_cast<int>(all.size()));
  std::vector<float> logits;
  m.forward(all.data(), static_cast<int>(all.size()), cache, logits, true);
  const LikelihoodScore want =
      likelihood_from_logits(logits.data() + (prompt.size() - 1) * static_cast<size_t>(V), V, ref);
  EXPECT_NEAR(got.mean_logprob, want.mean_logprob, 1e-4);
  EXPECT_DOUBLE_EQ(got.greedy_acc, want.greedy_acc);
  EXPECT_EQ(got.tokens, 12);
  EXPECT_GT(st.pairs_full, 0);
  EXPECT_LT(got.mean_logprob, 0);
  // Over the model context (128): a clear error.
  std::vector<int32_t> long_prompt(120, 1);
  EXPECT_THROW(reference_likelihood(m, long_prompt, ref, &full), std::runtime_error);
}
