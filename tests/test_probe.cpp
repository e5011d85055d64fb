#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>

#include "elastic/heatmap_svg.h"
#include "elastic/model.h"
#include "elastic/probe.h"
#include "elastic/tasks.h"
#include "scratch_dir.h"

using namespace elastic;

namespace {

std::string fixture() { return std::string(ELASTIC_FIXTURE_DIR) + "/qwen3_tiny"; }

std::string tmp_path(const std::string& name) {
  return elastic::test::scratch_path("probe_" + name);
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

ProbeOptions small_opts(uint64_t seed = 3) {
  ProbeOptions o;
  o.context = 96;
  o.n_depths = 4;
  o.n_needles_per_depth = 2;
  o.seed = seed;
  return o;
}

HeadScores hand_scores() {
  HeadScores s;
  s.n_layers = 4;
  s.n_kv_heads = 5;
  s.prompts = 1;
  // Distinct scores except a few ties.
  s.score = {0.10, 0.90, 0.30, 0.30, 0.05, 0.70, 0.20, 0.95, 0.00, 0.40,
             0.30, 0.60, 0.80, 0.15, 0.50, 0.25, 0.35, 0.45, 0.55, 0.65};
  return s;
}

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

}  // namespace

TEST(Probe, ShapeRangeAndDeterminism) {
  Model m = Model::load(fixture());
  int calls = 0, last_total = 0;
  HeadScores a = probe_retrieval_heads(m, nullptr, small_opts(), [&](int done, int total) {
    ++calls;
    EXPECT_EQ(done, calls);
    last_total = total;
  });
  EXPECT_EQ(calls, 8);
  EXPECT_EQ(last_total, 8);
  EXPECT_EQ(a.n_layers, m.config.n_layers);
  EXPECT_EQ(a.n_kv_heads, m.config.n_kv_heads);
  EXPECT_EQ(a.prompts, 8);
  ASSERT_EQ(a.score.size(), static_cast<size_t>(m.config.n_layers) * m.config.n_kv_heads);
  double total = 0;
  for (double v : a.score) {
    EXPECT_TRUE(std::isfinite(v));
    EXPECT_GE(v, 0.0);
    EXPECT_LE(v, 1.0);
    total += v;
  }
  EXPECT_GT(total, 0.0);  // 8 of ~96 keys: some mass must land on the needle

  HeadScores b = probe_retrieval_heads(m, nullptr, small_opts());
  EXPECT_EQ(a.score, b.score);
  HeadScores c = probe_retrieval_heads(m, nullptr, small_opts(4));
  EXPECT_NE(a.score, c.score);
}

TEST(Probe, SingleDepth) {
  Model m = Model::load(fixture());
  ProbeOptions o = small_opts();
  o.n_depths = 1;
  o.n_needles_per_depth = 1;
  HeadScores s = probe_retrieval_heads(m, nullptr, o);
  EXPECT_EQ(s.prompts, 1);
}

TEST(Probe, BadOptionsThrow) {
  Model m = Model::load(fixture());
  ProbeOptions o = small_opts();
  o.context = m.config.max_positions + 1;
  EXPECT_THROW(probe_retrieval_heads(m, nullptr, o), std::runtime_error);
  o = small_opts();
  o.context = 8 + 8 + 10;  // needle + question + less than 16
  EXPECT_THROW(probe_retrieval_heads(m, nullptr, o), std::runtime_error);
  o = small_opts();
  o.n_depths = 0;
  EXPECT_THROW(probe_retrieval_heads(m, nullptr, o), std::runtime_error);
  o = small_opts();
  o.n_needles_per_depth = 0;
  EXPECT_THROW(probe_retrieval_heads(m, nullptr, o), std::runtime_error);
}

// Task mode: the eval's own samples are the prompts and their evidence tokens the needle. Each head's score is the
// mean over prompts of the last row's mass on those tokens, recomputed here from the model's attention directly.
TEST(Probe, TaskModeScoresTheEvalSamplesEvidence) {
  Model m = Model::load(fixture());
  ProbeOptions o;
  o.context = 120;
  o.task = "niah_single_2";
  o.prompts = 3;
  o.seed = 5;
  int calls = 0;
  const HeadScores hs = probe_retrieval_heads(m, nullptr, o, [&](int done, int total) {
    EXPECT_EQ(done, ++calls);
    EXPECT_EQ(total, 3);
  });
  EXPECT_EQ(hs.prompts, 3);
  const ModelConfig& c = m.config;
  const int group = c.n_heads / c.n_kv_heads;
  std::vector<double> want(static_cast<size_t>(c.n_layers) * c.n_kv_heads, 0.0);
  TaskSpec ts;
  ts.name = o.task;
  ts.vocab = c.vocab;
  const LastRowAttention att = cpu_last_row_attention(m);
  for (int i = 0; i < 3; ++i) {
    const TaskSample smp = make_sample(ts, nullptr, o.context, o.seed + i);
    ASSERT_FALSE(smp.evidence.empty());
    const int T = static_cast<int>(smp.prompt_ids.size());
    const auto probs = att(smp.prompt_ids);
    std::vector<char> in(T, 0);
    for (auto [b, e] : smp.evidence)
      for (int t = b; t < e; ++t) in[t] = 1;
    for (int l = 0; l < c.n_layers; ++l)
      for (int kh = 0; kh < c.n_kv_heads; ++kh)
        for (int g = 0; g < group; ++g)
          for (int t = 0; t < T; ++t)
            if (in[t]) want[l * c.n_kv_heads + kh] += probs[l][(kh * group + g) * static_cast<size_t>(T) + t] / group / 3;
  }
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(hs.score[i], want[i], 1e-9) << i;
  // A task without evidence spans, or no prompts, is refused by name.
  o.task = "continue_text";
  try {
    probe_retrieval_heads(m, nullptr, o);
    ADD_FAILURE() << "continue_text probed";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("marks no evidence tokens"), std::string::npos) << e.what();
  }
  o.task = "niah_single_2";
  o.prompts = 0;
  EXPECT_THROW(probe_retrieval_heads(m, nullptr, o), std::runtime_error);
}

TEST(Probe, SaveLoadRoundTrip) {
  HeadScores s = hand_scores();
  s.prompts = 7;
  const std::string p = tmp_path("rt.json");
  save_head_scores(s, p);
  HeadScores t = load_head_scores(p);
  EXPECT_EQ(t.n_layers, s.n_layers);
  EXPECT_EQ(t.n_kv_heads, s.n_kv_heads);
  EXPECT_EQ(t.prompts, 7);
  ASSERT_EQ(t.score.size(), s.score.size());
  for (size_t i = 0; i < s.score.size(); ++i) EXPECT_DOUBLE_EQ(t.score[i], s.score[i]);
  EXPECT_NO_THROW(load_head_scores(p, 4, 5));
  EXPECT_THROW(load_head_scores(p, 4, 4), std::runtime_error);
  EXPECT_THROW(load_head_scores(p, 3, 5), std::runtime_error);
  std::remove(p.c_str());
}

TEST(Probe, MalformedScoreFilesThrow) {
  const std::string p = tmp_path("bad.json");
  const char* bad[] = {
      "{not json",
      "[1, 2]",
      "{\"n_kv_heads\":2,\"prompts\":1,\"scores\":[[0,0]]}",                          // missing n_layers
      "{\"n_layers\":\"1\",\"n_kv_heads\":2,\"prompts\":1,\"scores\":[[0,0]]}",      // wrong type
      "{\"n_layers\":1,\"n_kv_heads\":2,\"prompts\":1}",                              // missing scores
      "{\"n_layers\":2,\"n_kv_heads\":2,\"prompts\":1,\"scores\":[[0,0]]}",           // layer count mismatch
      "{\"n_layers\":1,\"n_kv_heads\":2,\"prompts\":1,\"scores\":[[0,0,0]]}",         // head count mismatch
      "{\"n_layers\":1,\"n_kv_heads\":2,\"prompts\":1,\"scores\":[[0,\"x\"]]}",       // non-number
      "{\"n_layers\":1,\"n_kv_heads\":2,\"prompts\":1,\"scores\":[0.5]}",             // row not a list
      "{\"n_layers\":0,\"n_kv_heads\":2,\"prompts\":1,\"scores\":[]}",                // zero layers
      "{\"n_layers\":1,\"n_kv_heads\":2,\"prompts\":-1,\"scores\":[[0,0]]}",          // negative prompts
  };
  for (const char* text : bad) {
    write_file(p, text);
    try {
      load_head_scores(p);
      ADD_FAILURE() << "no throw for: " << text;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  }
  std::remove(p.c_str());
  EXPECT_THROW(load_head_scores("/nonexistent/scores.json"), std::runtime_error);
}

TEST(Probe, StaticRoutingKeepsTopHeads) {
  const HeadScores s = hand_scores();
  const int n = s.n_layers * s.n_kv_heads;
  for (double sp : {0.0, 0.5, 0.7, 0.9, 1.0}) {
    RoutingTable r = static_routing(s, sp, HeadMode::Streaming);
    ASSERT_EQ(r.n_layers, s.n_layers);
    ASSERT_EQ(r.n_kv_heads, s.n_kv_heads);
    ASSERT_EQ(r.mode.size(), static_cast<size_t>(n));
    const int keep = static_cast<int>(std::floor((1.0 - sp) * n + 1e-9));
    int full = 0;
    double min_full = INFINITY, max_sparse = -INFINITY;
    for (int i = 0; i < n; ++i) {
      if (r.mode[i] == HeadMode::Full) {
        ++full;
        min_full = std::min(min_full, s.score[i]);
      } else {
        EXPECT_EQ(r.mode[i], HeadMode::Streaming);
        max_sparse = std::max(max_sparse, s.score[i]);
      }
    }
    EXPECT_EQ(full, keep) << "sparsity " << sp;
    if (full > 0 && full < n) {
      EXPECT_GE(min_full, max_sparse) << "sparsity " << sp;
    }
    EXPECT_NEAR(r.msr(), 1.0 - static_cast<double>(keep) / n, 1e-12);
  }
  // Exact sets: 0.9 of 20 heads keeps 2 -> indices 7 (0.95) and 1 (0.90).
  RoutingTable r = static_routing(s, 0.9, HeadMode::XAttn);
  for (int i = 0; i < n; ++i) EXPECT_EQ(r.mode[i] == HeadMode::Full, i == 7 || i == 1) << i;
  // Ties are broken by the lower (layer, head) index: on a flat table the first heads stay full.
  HeadScores flat;
  flat.n_layers = 2;
  flat.n_kv_heads = 3;
  flat.score = {0.5, 0.5, 0.5, 0.5, 0.5, 0.5};
  RoutingTable t = static_routing(flat, 0.5, HeadMode::Streaming);  // keep 3 -> lowest indices
  for (int i = 0; i < 6; ++i) EXPECT_EQ(t.mode[i] == HeadMode::Full, i < 3) << i;
}

TEST(Probe, StaticRoutingBadInputThrows) {
  const HeadScores s = hand_scores();
  EXPECT_THROW(static_routing(s, -0.01, HeadMode::Streaming), std::runtime_error);
  EXPECT_THROW(static_routing(s, 1.01, HeadMode::Streaming), std::runtime_error);
  EXPECT_THROW(static_routing(s, std::nan(""), HeadMode::Streaming), std::runtime_error);
  HeadScores bad = s;
  bad.score.pop_back();
  EXPECT_THROW(static_routing(bad, 0.5, HeadMode::Streaming), std::runtime_error);
}

TEST(Probe, HeatmapSvg) {
  Model m = Model::load(fixture());
  HeadScores s = probe_retrieval_heads(m, nullptr, small_opts());
  const std::string p = tmp_path("map.svg");
  write_heatmap_svg(p, s.score, s.n_layers, s.n_kv_heads, "Retrieval <scores>", "layer", "KV head");
  const std::string svg = read_file(p);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_EQ(count(svg, "<rect class=\"cell\""), static_cast<size_t>(s.n_layers) * s.n_kv_heads);
  EXPECT_NE(svg.find("Retrieval &lt;scores&gt;"), std::string::npos);
  EXPECT_NE(svg.find("class=\"colorbar\""), std::string::npos);
  std::remove(p.c_str());

  const HeadScores h = hand_scores();
  write_heatmap_svg(p, h.score, h.n_layers, h.n_kv_heads, "hand", "layer", "head");
  EXPECT_EQ(count(read_file(p), "<rect class=\"cell\""), 20u);
  std::remove(p.c_str());
  EXPECT_THROW(write_heatmap_svg(p, h.score, 3, 5, "bad", "r", "c"), std::runtime_error);
  EXPECT_THROW(write_heatmap_svg("/nonexistent/dir/map.svg", h.score, 4, 5, "t", "r", "c"), std::runtime_error);
}

// Scores and heat maps on a full disk are errors (a small scores file stayed in the stream's buffer past the old
// writer's check, so it "succeeded").
TEST(Probe, WritesToAFullDiskThrow) {
  if (access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no /dev/full";
  const HeadScores h = hand_scores();
  try {
    save_head_scores(h, "/dev/full");
    ADD_FAILURE() << "scores written to /dev/full";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/full: cannot write head scores"), std::string::npos) << e.what();
  }
  try {
    write_heatmap_svg("/dev/full", h.score, h.n_layers, h.n_kv_heads, "t", "r", "c");
    ADD_FAILURE() << "heat map written to /dev/full";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/full: cannot write heat map SVG"), std::string::npos) << e.what();
  }
}

// The tokenizer path: real needle / question text with the Qwen3 tokenizer on a random-weight model whose vocabulary
// covers it (written here, f32, tied embeddings).
#include <random>

#include "elastic/tokenizer.h"
#include "st_writer.h"

TEST(Probe, TokenizerPathWithQwen3Tokenizer) {
  using namespace elastic::testing;
  const std::string d = temp_dir("probe_tok");
  write_tiny_qwen3_full_vocab(d, 3, 0.3f);
  Model m = Model::load(d);
  Tokenizer tok = Tokenizer::from_file(std::string(ELASTIC_SHARED_DIR) + "/qwen3-tokenizer/tokenizer.json");
  ProbeOptions o;
  o.context = 300;
  o.n_depths = 3;
  HeadScores s = probe_retrieval_heads(m, &tok, o);
  ASSERT_EQ(s.score.size(), 2u);
  EXPECT_EQ(s.prompts, 3);
  for (double x : s.score) {
    EXPECT_GT(x, 0.0);
    EXPECT_LE(x, 1.0);
  }
}
