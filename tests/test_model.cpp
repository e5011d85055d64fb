// Model outputs against Hugging Face transformers fixtures (scripts/make_fixtures.py, run on the GPU machine).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "elastic/density_report.h"
#include "elastic/generate.h"
#include "elastic/model.h"
#include "elastic/npy.h"
#include "elastic/route_policy.h"
#include "elastic/router.h"
#include "elastic/train.h"

using namespace elastic;
namespace fs = std::filesystem;

class Fixture : public ::testing::TestWithParam<std::string> {
 protected:
  std::string dir() const { return std::string(ELASTIC_FIXTURE_DIR) + "/" + GetParam(); }
};

static double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double md = 0, mv = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    md = std::max(md, double(std::abs(a[i] - b[i])));
    mv = std::max(mv, double(std::abs(b[i])));
  }
  return md / mv;
}

TEST_P(Fixture, LogitsMatchTransformers) {
  ASSERT_TRUE(fs::exists(dir() + "/logits.npy")) << "fixture missing: " << dir();
  Model m = Model::load(dir());
  auto ids = read_npy_ids(dir() + "/ids.npy");
  std::vector<int64_t> shape;
  auto ref = read_npy_f32(dir() + "/logits.npy", &shape);
  ASSERT_EQ(shape, (std::vector<int64_t>{(int64_t)ids.size(), m.config.vocab}));
  KVCache cache;
  cache.init(m.config, ids.size());
  std::vector<float> logits;
  m.forward(ids.data(), ids.size(), cache, logits, true);
  EXPECT_LT(rel_err(logits, ref), 1e-4);
}

TEST_P(Fixture, GreedyMatchesTransformers) {
  Model m = Model::load(dir());
  auto ids = read_npy_ids(dir() + "/ids.npy");
  auto ref = read_npy_ids(dir() + "/greedy.npy");
  auto out = generate(m, RoutePolicy::all_full(m.config), ids, ref.size(), 0, SamplerParams{}, false, nullptr);
  EXPECT_EQ(out, ref);
}

TEST_P(Fixture, IncrementalDecodeEqualsFullForward) {
  Model m = Model::load(dir());
  auto ids = read_npy_ids(dir() + "/ids.npy");
  KVCache full, inc;
  full.init(m.config, ids.size());
  inc.init(m.config, ids.size());
  std::vector<float> all, step;
  m.forward(ids.data(), ids.size(), full, all, true);
  const int split = ids.size() / 2;
  m.forward(ids.data(), split, inc, step, false);
  for (size_t t = split; t < ids.size(); ++t) {
    m.forward(&ids[t], 1, inc, step, false);
    std::vector<float> row(all.begin() + t * m.config.vocab, all.begin() + (t + 1) * m.config.vocab);
    EXPECT_LT(rel_err(step, row), 1e-5) << "position " << t;
  }
}

TEST_P(Fixture, ChunkedPrefillEqualsOnePass) {
  Model m = Model::load(dir());
  std::vector<int32_t> ids(120);  // two 64-token blocks, so the streaming mask matters
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = (i * 131 + 7) % m.config.vocab;
  RoutingTable ssa = RoutingTable::uniform(m.config.n_layers, m.config.n_kv_heads, HeadMode::Streaming);
  ssa.sparse.sink = 0;
  ssa.sparse.local = 1;  // one block of 64: every query sees its own block only
  KVCache a, b;
  a.init(m.config, ids.size(), &ssa);
  b.init(m.config, ids.size(), &ssa);
  std::vector<float> one, chunked;
  m.prefill(ids.data(), ids.size(), ids.size(), a, one, true);
  m.prefill(ids.data(), ids.size(), 5, b, chunked, true);
  EXPECT_LT(rel_err(chunked, one), 1e-5);
  KVCache c;
  c.init(m.config, ids.size());  // all full
  std::vector<float> full;
  m.prefill(ids.data(), ids.size(), 64, c, full, true);
  EXPECT_GT(rel_err(full, one), 1e-3);  // the sparse run really differs from full attention
}

// The server's resumable prefill (PrefillCursor: one chunk of one layer a step) against Model::prefill's
// token-major chunks under the same table: bit-identical logits (every row) and caches, at chunk sizes that do and
// do not divide the prompt; steps_left counts down to zero; misuse is refused.
TEST_P(Fixture, PrefillCursorEqualsTokenMajorPrefill) {
  Model m = Model::load(dir());
  std::vector<int32_t> ids(150);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = (i * 131 + 7) % m.config.vocab;
  RoutingTable r = RoutingTable::uniform(m.config.n_layers, m.config.n_kv_heads, HeadMode::Full);
  for (size_t i = 0; i < r.mode.size(); i += 2) r.mode[i] = HeadMode::Streaming;  // a hybrid table
  r.sparse.sink = 0;
  r.sparse.local = 64;
  for (const int chunk : {150, 64, 37}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    KVCache a, b;
    a.init(m.config, ids.size(), &r);
    b.init(m.config, ids.size(), &r);
    std::vector<float> want, got;
    AttentionStats sa, sb;
    m.prefill(ids.data(), ids.size(), chunk, a, want, true, &sa);
    PrefillCursor cur(m, ids.data(), ids.size(), chunk, b, nullptr, &sb);
    int steps = 0;
    const int first = cur.steps_left();
    while (!cur.done()) {
      ASSERT_EQ(cur.steps_left(), first - steps);
      cur.step();
      ++steps;
    }
    EXPECT_EQ(steps, m.config.n_layers * int((ids.size() + chunk - 1) / chunk));
    EXPECT_EQ(cur.steps_left(), 0);
    EXPECT_THROW(cur.step(), std::logic_error);
    cur.finish(got, true);
    EXPECT_EQ(got, want);  // bitwise: the same operations per layer and chunk
    EXPECT_EQ(b.length, a.length);
    EXPECT_EQ(b.k, a.k);
    EXPECT_EQ(b.v, a.v);
    EXPECT_DOUBLE_EQ(sb.flops_ratio(), sa.flops_ratio());
  }
  KVCache used;
  used.init(m.config, ids.size(), &r);
  std::vector<float> lg;
  m.prefill(ids.data(), 10, 64, used, lg, false);
  EXPECT_THROW(PrefillCursor(m, ids.data(), 10, 64, used, nullptr), std::invalid_argument);  // not empty
  KVCache deferred;
  deferred.init_deferred(m.config, ids.size());
  EXPECT_THROW(PrefillCursor(m, ids.data(), 10, 64, deferred, nullptr), std::invalid_argument);  // no routing
  std::vector<float> none;
  EXPECT_THROW(m.forward(ids.data(), 10, deferred, none, false), std::invalid_argument);  // nor for a forward
  KVCache fresh;
  fresh.init(m.config, ids.size(), &r);
  PrefillCursor early(m, ids.data(), 10, 64, fresh, nullptr);
  EXPECT_THROW(early.finish(lg), std::logic_error);
}

// XAttention heads in chunks that are not whole blocks: refused by name (as the GPU backend refuses them), where a
// chunk starting inside a block used to run its XAttention heads densely without a word; whole-block chunks give
// the one-pass result.
TEST_P(Fixture, XAttnChunksMustBeWholeBlocks) {
  Model m = Model::load(dir());
  std::vector<int32_t> ids(150);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = (i * 131 + 7) % m.config.vocab;
  RoutingTable r = RoutingTable::uniform(m.config.n_layers, m.config.n_kv_heads, HeadMode::Streaming);
  r.mode[0] = HeadMode::XAttn;
  KVCache a, b, c;
  a.init(m.config, ids.size(), &r);
  b.init(m.config, ids.size(), &r);
  c.init(m.config, ids.size(), &r);
  std::vector<float> one, whole, bad;
  try {
    m.prefill(ids.data(), ids.size(), 50, a, bad, true);
    ADD_FAILURE() << "chunk 50 with 64-token blocks was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of the block (50 vs 64)"), std::string::npos) << e.what();
  }
  m.prefill(ids.data(), ids.size(), ids.size(), b, one, true);  // one chunk: any size
  m.prefill(ids.data(), ids.size(), 64, c, whole, true);
  EXPECT_LT(rel_err(whole, one), 1e-5);
  // The same rule, checked before any prompt (the server at start-up): a fixed table with an XAttention head, and a
  // router whose classes include XAttention (XA-SSA), refuse chunk 50; whole blocks and routers without an estimator
  // pass.
  EXPECT_THROW(RoutePolicy::fixed(r).check_chunk(50), std::invalid_argument);
  EXPECT_NO_THROW(RoutePolicy::fixed(r).check_chunk(128));
  EXPECT_NO_THROW(RoutePolicy::all_full(m.config).check_chunk(50));
  RouterSpec spec;
  spec.n_layers = m.config.n_layers, spec.n_kv_heads = m.config.n_kv_heads, spec.head_dim = m.config.head_dim;
  spec.base_model = model_fingerprint(m.config);
  spec.targets = default_targets();
  auto fa_ssa = std::make_shared<Router>(Router::init(spec, 1));
  EXPECT_NO_THROW(RoutePolicy::routed(fa_ssa).check_chunk(50));
  spec.dense_mode = HeadMode::XAttn;
  auto xa_ssa = std::make_shared<Router>(Router::init(spec, 1));
  try {
    RoutePolicy::routed(xa_ssa).check_chunk(50);
    ADD_FAILURE() << "an XA-SSA router with chunk 50 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("xattn heads need a prefill chunk that is a multiple of the block (50 vs 64)"),
              std::string::npos) << e.what();
  }
}

// Per-layer block counts (bench --density): the run's figures are unchanged by counting them; the last layer's counts
// are the ESR's; a full head skips nothing, a streaming head skips what its rule gives (routed_prefill_stats over an
// all-streaming table), and an XAttention head keeps a share in (0, 1] that the density report carries, with no
// figure for the other heads.
TEST_P(Fixture, PerLayerBlockCountsGiveXAttnDensity) {
  Model m = Model::load(dir());
  const ModelConfig& c = m.config;
  std::vector<int32_t> ids(320);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = (i * 131 + 7) % c.vocab;
  RoutingTable r = RoutingTable::uniform(c.n_layers, c.n_kv_heads, HeadMode::XAttn);
  r.sparse.sink = 0;
  r.sparse.local = 64;
  r.mode[0] = HeadMode::Full;
  r.mode[1] = HeadMode::Streaming;
  auto run = [&](bool per_layer) {
    KVCache cache;
    cache.init(c, ids.size(), &r);
    AttentionStats st;
    st.per_layer = per_layer;
    std::vector<float> lg;
    m.prefill(ids.data(), ids.size(), 128, cache, lg, false, &st);
    return st;
  };
  const AttentionStats plain = run(false), counted = run(true);
  EXPECT_DOUBLE_EQ(counted.pairs_done, plain.pairs_done);
  EXPECT_DOUBLE_EQ(counted.esr(), plain.esr());
  EXPECT_TRUE(plain.layer_blocks_causal.empty());
  const size_t H = c.n_kv_heads, L = c.n_layers;
  ASSERT_EQ(counted.layer_blocks_causal.size(), L * H);
  for (size_t h = 0; h < H; ++h) {
    EXPECT_DOUBLE_EQ(counted.layer_blocks_skipped[(L - 1) * H + h], counted.blocks_skipped[h]);
    EXPECT_DOUBLE_EQ(counted.layer_blocks_causal[(L - 1) * H + h], counted.blocks_causal[h]);
  }
  EXPECT_EQ(counted.layer_blocks_skipped[0], 0.0);  // the full head
  RoutingTable ssa = RoutingTable::uniform(c.n_layers, c.n_kv_heads, HeadMode::Streaming);
  ssa.sparse = r.sparse;
  const AttentionStats rule = routed_prefill_stats(ssa, static_cast<int>(ids.size()));
  EXPECT_NEAR(counted.layer_blocks_skipped[1], rule.blocks_skipped[0], 1e-9);
  EXPECT_NEAR(counted.layer_blocks_causal[1], rule.blocks_causal[0], 1e-9);
  const HeadDensity d = selected_head_density(counted, r);
  EXPECT_EQ(d.heads(), static_cast<int>(L * H) - 2);
  EXPECT_TRUE(std::isnan(d.kept[0]) && std::isnan(d.kept[1]));
  for (size_t i = 2; i < d.kept.size(); ++i) {
    EXPECT_GT(d.kept[i], 0.0) << i;
    EXPECT_LE(d.kept[i], 1.0) << i;
  }
  // The paired walk computes at least the tiles the selections keep (two per step for each head, a step covering at
  // most two of a head's tiles), and the report says how many more.
  EXPECT_GT(counted.xattn_kept_tiles, 0.0);
  EXPECT_GE(counted.xattn_paired_tiles, counted.xattn_kept_tiles);
  EXPECT_DOUBLE_EQ(d.paired_walk_cost, counted.xattn_paired_tiles / counted.xattn_kept_tiles);
  // The row-pair walk too: both count each (head, 64-row query tile)'s kept tiles once, so they keep the same tiles.
  EXPECT_GE(counted.xattn_rowpair_tiles, counted.xattn_rowpair_kept);
  EXPECT_DOUBLE_EQ(counted.xattn_rowpair_kept, counted.xattn_kept_tiles);
  EXPECT_DOUBLE_EQ(d.rowpair_walk_cost, counted.xattn_rowpair_tiles / counted.xattn_rowpair_kept);
  const std::string md = head_density_markdown(d);
  EXPECT_NE(md.find("tiles per tile these selections keep"), std::string::npos) << md;
  EXPECT_NE(md.find("adjacent 64-row query tiles walked together"), std::string::npos) << md;
  EXPECT_NE(md.find(std::to_string(L * H - 2) + " heads select blocks"), std::string::npos) << md;
  EXPECT_NE(md.find("| 0 | "), std::string::npos);
  EXPECT_NE(md.find("| " + std::to_string(L - 1) + " | "), std::string::npos);
  EXPECT_THROW(selected_head_density(plain, r), std::invalid_argument);  // counts not kept
}

TEST_P(Fixture, HybridCacheDecodesLikeFullCache) {
  Model m = Model::load(dir());
  std::vector<int32_t> prompt(100);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = (i * 97 + 3) % m.config.vocab;
  RoutingTable hyb = RoutingTable::all_full(m.config.n_layers, m.config.n_kv_heads);
  for (size_t i = 0; i < hyb.mode.size(); i += 2) hyb.mode[i] = HeadMode::Streaming;
  hyb.sparse.sink = 0;
  hyb.sparse.local = 64;  // streaming heads: one block window, a 64-slot ring
  const int n_new = 60;         // decode well past the ring's wrap-around
  // 160 positions: past the fixture's 128-token context, which generate() now enforces; RoPE runs at any position.
  m.config.max_positions = 256;
  GenerateStats st;
  auto hybrid = generate(m, RoutePolicy::fixed(hyb), prompt, n_new, 0, SamplerParams{}, false, &st);
  // Same routing, full-length cache for every head: built all full, then given the hybrid routing.
  KVCache full;
  full.init(m.config, prompt.size() + n_new);
  full.routing = hyb;
  std::vector<float> logits;
  m.prefill(prompt.data(), prompt.size(), 37, full, logits, false);
  std::vector<int32_t> ref;
  Sampler greedy(SamplerParams{});
  for (int i = 0; i < n_new; ++i) {
    ref.push_back(greedy.sample(logits.data(), m.config.vocab));
    if (i + 1 < n_new) m.forward(&ref.back(), 1, full, logits, false);
  }
  EXPECT_EQ(hybrid, ref);
  EXPECT_LT(st.kv_bytes, full.bytes());
  EXPECT_LT(st.attn.flops_ratio(), 1.0);
  // Prefill and decode rows together are what routed_prefill_stats counts over prompt + n_new - 1 rows (the last
  // token is never fed): the GPU's generate reports that function's figures, so both devices print the same ones.
  const AttentionStats want = routed_prefill_stats(hyb, int(prompt.size()) + n_new - 1);
  EXPECT_NEAR(st.attn.flops_ratio(), want.flops_ratio(), 1e-12);
  EXPECT_NEAR(st.attn.esr(), want.esr(), 1e-12);
  EXPECT_GT(st.attn.esr(), 0.0);
  // generate ran in a cache built for the policy's table (the hybrid one's size) and reports that routing.
  KVCache hc;
  hc.init(m.config, prompt.size() + n_new, &hyb);
  EXPECT_EQ(st.kv_bytes, hc.bytes());
  EXPECT_EQ(st.routing.mode, hyb.mode);
  // A hybrid cache whose routing is changed to make a windowed head full is refused (its ring is too small).
  KVCache hc3;
  hc3.init(m.config, prompt.size() + n_new, &hyb);
  hc3.routing = RoutingTable::all_full(m.config.n_layers, m.config.n_kv_heads);
  EXPECT_THROW(m.forward(prompt.data(), prompt.size(), hc3, logits, false), std::runtime_error);
}

INSTANTIATE_TEST_SUITE_P(HF, Fixture, ::testing::Values("qwen3_tiny", "qwen3_tied", "llama_tiny"));

TEST(Model, ErrorsAreClear) {
  EXPECT_THROW(Model::load("/nonexistent/model"), std::runtime_error);
  Model m = Model::load(std::string(ELASTIC_FIXTURE_DIR) + "/qwen3_tiny");
  KVCache c;
  c.init(m.config, 4);
  std::vector<float> lg;
  std::vector<int32_t> bad{0, m.config.vocab};
  EXPECT_THROW(m.forward(bad.data(), 2, c, lg, false), std::runtime_error);
  std::vector<int32_t> many(5, 1);
  EXPECT_THROW(m.forward(many.data(), 5, c, lg, false), std::runtime_error);
}

// A routing table of another shape is refused when a cache is built for it (it used to be read out of bounds); an empty
// policy (RoutePolicy{}) runs all full, as the CLI's default does.
TEST(Model, CacheRoutingShapeAndEmptyPolicy) {
  Model m = Model::load(std::string(ELASTIC_FIXTURE_DIR) + "/qwen3_tiny");
  const RoutingTable wrong = RoutingTable::all_full(1, 1);
  KVCache c;
  EXPECT_THROW(c.init(m.config, 4, &wrong), std::invalid_argument);
  const std::vector<int32_t> prompt{1, 2, 3, 4, 5};
  GenerateStats a, b;
  EXPECT_EQ(generate(m, RoutePolicy{}, prompt, 4, 0, SamplerParams{}, false, &a),
            generate(m, RoutePolicy::all_full(m.config), prompt, 4, 0, SamplerParams{}, false, &b));
  EXPECT_EQ(a.routing.mode, b.routing.mode);
  EXPECT_EQ(a.routing.msr(), 0.0);
}

namespace {

std::string capacity_error(int64_t prompt, int64_t n, int64_t ctx, int max_positions) {
  try {
    generation_capacity(prompt, n, ctx, max_positions);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// -n and -c against the model's context, in 64 bits: prompt + -n past the context is an error naming both (it was an
// allocation of the whole -n, a bad_alloc at -n 100000000), and -n near INT_MAX no longer overflows the sum.
TEST(Generate, CapacityCheckedAgainstTheContext) {
  EXPECT_EQ(generation_capacity(10, 20, 0, 128), 30);
  EXPECT_EQ(generation_capacity(10, 118, 0, 128), 128);
  EXPECT_EQ(generation_capacity(10, 1000, 64, 128), 64);  // -c caps the cache: generation stops when it is full
  EXPECT_EQ(generation_capacity(10, 5, 64, 128), 15);
  const std::string over = capacity_error(10, 100000000, 0, 128);
  EXPECT_NE(over.find("the prompt (10 tokens) + -n 100000000 exceeds the model's context of 128 tokens"),
            std::string::npos) << over;
  EXPECT_NE(capacity_error(10, std::numeric_limits<int>::max(), 0, 128).find("-n 2147483647 exceeds"),
            std::string::npos);
  EXPECT_NE(capacity_error(10, 5, 4096, 128).find("-c 4096 exceeds the model's context of 128"), std::string::npos);
  EXPECT_NE(capacity_error(200, 5, 0, 128).find("the prompt has 200 tokens"), std::string::npos);
  EXPECT_NE(capacity_error(100, 5, 64, 128).find("more than the context -c 64"), std::string::npos);
  EXPECT_NE(capacity_error(10, -1, 0, 128).find("-n must be >= 0"), std::string::npos);
  // An unknown model context (0) falls back to the engine's limit, still checked.
  EXPECT_EQ(generation_capacity(10, 20, 0, 0), 30);
  EXPECT_NE(capacity_error(10, int64_t{1} << 40, 0, 0).find("the engine's limit"), std::string::npos);
}

TEST(Generate, HugeNPredictIsAnErrorBeforeAnyAllocation) {
  Model m = Model::load(std::string(ELASTIC_FIXTURE_DIR) + "/qwen3_tiny");
  const std::vector<int32_t> prompt{1, 2, 3};
  try {
    generate(m, RoutePolicy::all_full(m.config), prompt, 100000000, 0, SamplerParams{}, false, nullptr);
    ADD_FAILURE() << "-n 100000000 accepted on a 128-token model";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("-n 100000000 exceeds the model's context of 128 tokens"), std::string::npos)
        << e.what();
  }
}

TEST(Sampler, SeededAndTruncated) {
  std::vector<float> logits{0.f, 3.f, 2.f, -1.f};
  SamplerParams p{1.0f, 2, 1.f, 42};
  Sampler a(p), b(p);
  for (int i = 0; i < 50; ++i) {
    int x = a.sample(logits.data(), 4);
    EXPECT_EQ(x, b.sample(logits.data(), 4));
    EXPECT_TRUE(x == 1 || x == 2);  // top-k 2
  }
  Sampler g(SamplerParams{});
  EXPECT_EQ(g.sample(logits.data(), 4), 1);
  Sampler tp(SamplerParams{1.0f, 0, 0.5f, 1});  // p(1) ~ 0.66 > 0.5 alone
  for (int i = 0; i < 20; ++i) EXPECT_EQ(tp.sample(logits.data(), 4), 1);
}
