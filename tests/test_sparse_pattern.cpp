// The sparse pattern registry (sparse_pattern.h): names, the contract every registered block rule must keep (causal
// with the diagonal, monotone in decode, kept positions non-decreasing from block end to block end), and the figures
// read off the rules (cost, kept positions, cache slots) against direct counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "elastic/sparse_pattern.h"

using namespace elastic;

TEST(SparsePattern, RegistryKeepsTheModeValuesAndNames) {
  EXPECT_STREQ(sparse_pattern(HeadMode::Full).name, "full");
  EXPECT_STREQ(sparse_pattern(HeadMode::Streaming).name, "ssa");
  EXPECT_STREQ(sparse_pattern(HeadMode::XAttn).name, "xattn");
  EXPECT_EQ(parse_head_mode("fa"), HeadMode::Full);
  EXPECT_EQ(parse_head_mode("streaming"), HeadMode::Streaming);
  EXPECT_EQ(parse_head_mode("xa"), HeadMode::XAttn);
  for (int i = 0; i < n_sparse_patterns(); ++i) {  // every name round-trips, letters are distinct
    const HeadMode m = static_cast<HeadMode>(i);
    EXPECT_EQ(parse_head_mode(head_mode_name(m)), m);
    for (int j = 0; j < i; ++j) EXPECT_NE(sparse_pattern(m).letter, sparse_pattern(static_cast<HeadMode>(j)).letter);
  }
  EXPECT_TRUE(sparse_pattern(HeadMode::XAttn).on_cuda);
  EXPECT_FALSE(sparse_pattern(parse_head_mode("strided")).on_cuda);
  try {
    parse_head_mode("vertical-slash");
    FAIL() << "an unknown name was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("full, ssa, xattn, strided"), std::string::npos) << e.what();
  }
  EXPECT_THROW(sparse_pattern(static_cast<HeadMode>(200)), std::invalid_argument);
}

TEST(SparsePattern, EveryRuleKeepsTheContract) {
  for (const int block : {64, 128})
    for (const auto& [sink, local] : {std::pair{0, 64}, std::pair{128, 256}, std::pair{64, 2048}}) {
      SparseSettings s;
      s.block = block, s.sink = sink, s.local = local;
      for (int i = 0; i < n_sparse_patterns(); ++i) {
        const HeadMode m = static_cast<HeadMode>(i);
        SCOPED_TRACE(std::string(head_mode_name(m)) + " block " + std::to_string(block) + " sink " +
                     std::to_string(sink) + " local " + std::to_string(local));
        int64_t last_end = 0;
        for (int qb = 0; qb < 80; ++qb) {
          ASSERT_TRUE(pattern_holds(m, qb, qb, s)) << "diagonal of block " << qb;
          for (int kb = 0; kb < qb; ++kb)
            if (!pattern_holds(m, qb - 1, kb, s)) ASSERT_FALSE(pattern_holds(m, qb, kb, s)) << "block " << kb << " came back at " << qb;
          const int64_t at_end = pattern_kept_positions(m, (qb + 1) * block, s);
          ASSERT_GE(at_end, last_end) << "kept positions fell at the end of block " << qb;
          last_end = at_end;
        }
      }
    }
}

TEST(SparsePattern, FiguresEqualDirectCounts) {
  SparseSettings s;
  s.block = 64, s.sink = 64, s.local = 128;
  const int T = 1000, B = 64, nb = (T + B - 1) / B;
  for (int i = 0; i < n_sparse_patterns(); ++i) {
    const HeadMode m = static_cast<HeadMode>(i);
    SCOPED_TRACE(head_mode_name(m));
    // Pairs, the slow way: every (query, key) pair whose blocks the rule keeps.
    double pairs = 0;
    for (int q = 0; q < T; ++q)
      for (int k = 0; k <= q; ++k) pairs += pattern_holds(m, q / B, k / B, s);
    const PatternPrefillCost c = pattern_prefill_cost(m, T, s);
    EXPECT_EQ(c.pairs_full, double(T) * (T + 1) / 2);
    double causal = 0;  // block pairs, a partial last query block weighted by its rows
    for (int qb = 0; qb < nb; ++qb) causal += (qb + 1) * (std::min(T, (qb + 1) * B) - qb * B) / double(B);
    EXPECT_DOUBLE_EQ(c.blocks_causal, causal);
    if (sparse_pattern(m).select) {
      EXPECT_TRUE(std::isnan(c.pairs));  // input dependent
    } else {
      EXPECT_EQ(c.pairs, pairs);
    }
    // Kept positions at every length against a direct count.
    for (const int n : {1, 63, 64, 65, 300, 999}) {
      int64_t kept = 0;
      for (int j = 0; j < n; ++j) kept += pattern_holds(m, (n - 1) / B, j / B, s);
      EXPECT_EQ(pattern_kept_positions(m, n, s), kept) << "n_pos " << n;
    }
  }
  // Cache slots: streaming is bounded (sink 64 + ring 128) below the capacity; the others hold one slot a position.
  int64_t sink = -1, ring = -1;
  EXPECT_EQ(pattern_cache_slots(HeadMode::Streaming, s, 4096, &sink, &ring), 192);
  EXPECT_EQ(sink, 64);
  EXPECT_EQ(ring, 128);
  EXPECT_EQ(pattern_cache_slots(HeadMode::Streaming, s, 150, &sink, &ring), 150);  // the ring would not be smaller
  EXPECT_EQ(sink, 0);
  EXPECT_EQ(pattern_cache_slots(HeadMode::Full, s, 4096), 4096);
  EXPECT_EQ(pattern_cache_slots(parse_head_mode("strided"), s, 4096), 4096);
}

// Parameters as JSON, one home for routing files and router metadata: each pattern reads and writes its own fields;
// a round trip keeps every setting; absent fields take their defaults unless required (router files), and then the
// error names the field.
TEST(SparsePatternParams, JsonRoundTripDefaultsAndRequiredFields) {
  SparseSettings s;
  s.block = 128, s.sink = 256, s.local = 1024, s.xattn.stride = 8, s.xattn.tau = 0.75f;
  const nlohmann::json j = sparse_settings_to_json(s);
  EXPECT_EQ(j.at("sink"), 256);                // streaming.cpp's fields
  EXPECT_EQ(j.at("xattn").at("stride"), 8);    // xattn.cpp's
  const SparseSettings back = sparse_settings_from_json(j, "t", true);
  EXPECT_EQ(back.block, 128);
  EXPECT_EQ(back.sink, 256);
  EXPECT_EQ(back.local, 1024);
  EXPECT_EQ(back.xattn.stride, 8);
  EXPECT_FLOAT_EQ(back.xattn.tau, 0.75f);
  EXPECT_EQ(back.xattn.block, 128);
  const SparseSettings d = sparse_settings_from_json(nlohmann::json::object(), "t");
  EXPECT_EQ(d.block, 64);
  EXPECT_EQ(d.sink, 128);
  EXPECT_EQ(d.local, 2048);
  EXPECT_EQ(d.xattn.stride, 16);
  auto error = [](const nlohmann::json& x, bool required) {
    try {
      sparse_settings_from_json(x, "src.json", required);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  nlohmann::json no_local = j;
  no_local.erase("local");
  EXPECT_EQ(error(no_local, true), "src.json: missing 'local'");
  EXPECT_EQ(error(no_local, false), "no error");
  nlohmann::json no_tau = j;
  no_tau["xattn"].erase("tau");
  EXPECT_EQ(error(no_tau, true), "src.json: missing 'xattn.tau'");
  nlohmann::json bad = j;
  bad["xattn"]["stride"] = 7;  // must divide the block
  EXPECT_NE(error(bad, false).find("stride 7 must divide block_size 128"), std::string::npos) << error(bad, false);
  EXPECT_NE(error(nlohmann::json::array(), false).find("must be a JSON object"), std::string::npos);
}
