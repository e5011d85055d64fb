// Routed attention against dense attention with an explicit mask built from the same definitions (fp32, 1e-5).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <random>
#include <thread>

#include "elastic/attention.h"
#include "elastic/head_parallel.h"
#include "elastic/model.h"
#include "scratch_dir.h"

using namespace elastic;

namespace {

struct Case {
  int T = 300, Hq = 4, Hkv = 2, hd = 32;
  std::vector<float> q, k, v;  // q [T, Hq, hd]; k, v [Hkv][T, hd]
  explicit Case(unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> N(0.f, 1.f);
    q.resize(size_t(T) * Hq * hd);
    k.resize(size_t(Hkv) * T * hd);
    v.resize(k.size());
    for (auto* x : {&q, &k, &v})
      for (auto& e : *x) e = N(rng);
  }
  // One prefill in chunks; `call` runs each chunk's AttentionArgs (default: attention_forward).
  template <class Call>
  std::vector<float> run_with(const std::vector<HeadMode>& modes, const SparseSettings& sp, int chunk,
                              AttentionStats* st, const Call& call) const {
    std::vector<float> out(q.size());
    std::vector<HeadKV> kv(Hkv);
    for (int p0 = 0; p0 < T; p0 += chunk) {
      for (int h = 0; h < Hkv; ++h) {
        kv[h].k_cache = k.data() + size_t(h) * T * hd;
        kv[h].v_cache = v.data() + size_t(h) * T * hd;
        kv[h].k_new = kv[h].k_cache + size_t(p0) * hd;
        kv[h].v_new = kv[h].v_cache + size_t(p0) * hd;
        kv[h].new_stride = kv[h].hd = hd;
        kv[h].pos0 = p0;
      }
      AttentionArgs a;
      a.q = q.data() + size_t(p0) * Hq * hd;
      a.kv = kv.data();
      a.out = out.data() + size_t(p0) * Hq * hd;
      a.T = std::min(chunk, T - p0);
      a.pos0 = p0;
      a.n_heads = Hq;
      a.n_kv_heads = Hkv;
      a.head_dim = hd;
      a.modes = modes.data();
      a.sparse = &sp;
      a.stats = st;
      a.track_esr = st != nullptr;
      call(a);
    }
    return out;
  }
  std::vector<float> run(const std::vector<HeadMode>& modes, const SparseSettings& sp, int chunk,
                         AttentionStats* st = nullptr) const {
    return run_with(modes, sp, chunk, st, [](const AttentionArgs& a) { attention_forward(a); });
  }
  // Dense double-precision attention with mask(h, i, j).
  template <class Mask>
  std::vector<float> dense(const Mask& mask) const {
    std::vector<float> out(q.size());
    const int g = Hq / Hkv;
    for (int h = 0; h < Hq; ++h)
      for (int i = 0; i < T; ++i) {
        std::vector<double> s(T, -INFINITY);
        double mx = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          if (!mask(h, i, j)) continue;
          double d = 0;
          for (int e = 0; e < hd; ++e) d += double(q[(size_t(i) * Hq + h) * hd + e]) * k[(size_t(h / g) * T + j) * hd + e];
          s[j] = d / std::sqrt(double(hd));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int j = 0; j <= i; ++j) sum += mask(h, i, j) ? std::exp(s[j] - mx) : 0;
        for (int e = 0; e < hd; ++e) {
          double acc = 0;
          for (int j = 0; j <= i; ++j)
            if (mask(h, i, j)) acc += std::exp(s[j] - mx) / sum * v[(size_t(h / g) * T + j) * hd + e];
          out[(size_t(i) * Hq + h) * hd + e] = float(acc);
        }
      }
    return out;
  }
};

double rel(const std::vector<float>& a, const std::vector<float>& b) {
  double md = 0, mv = 0;
  for (size_t i = 0; i < a.size(); ++i) md = std::max(md, double(std::abs(a[i] - b[i]))), mv = std::max(mv, double(std::abs(b[i])));
  return md / mv;
}

unsigned fresh_seed() {
  unsigned s = std::random_device{}();
  std::printf("seed %u\n", s);
  return s;
}

}  // namespace

TEST(Attention, FullEqualsDenseCausal) {
  Case c(fresh_seed());
  SparseSettings sp;
  auto out = c.run({HeadMode::Full, HeadMode::Full}, sp, c.T);
  EXPECT_LT(rel(out, c.dense([](int, int, int) { return true; })), 1e-5);
}

TEST(Attention, StreamingEqualsDenseWithBlockMask) {
  Case c(fresh_seed());
  SparseSettings sp;
  sp.block = 64;
  sp.sink = 64;
  sp.local = 128;
  auto out = c.run({HeadMode::Streaming, HeadMode::Full}, sp, c.T);
  auto ref = c.dense([&](int h, int i, int j) {
    if (h / 2 == 1) return true;
    const int qb = i / 64, kb = j / 64;
    return kb < 1 || qb - kb < 2;
  });
  EXPECT_LT(rel(out, ref), 1e-5);
}

TEST(Attention, XAttnEqualsDenseWithItsSelection) {
  Case c(fresh_seed());
  SparseSettings sp;
  sp.xattn.tau = 0.5f;
  auto out = c.run({HeadMode::Full, HeadMode::XAttn}, sp, c.T);
  std::vector<BlockMask> masks(c.Hq);
  for (int h = 2; h < 4; ++h) {
    std::vector<float> qh(size_t(c.T) * c.hd);
    for (int t = 0; t < c.T; ++t)
      for (int e = 0; e < c.hd; ++e) qh[size_t(t) * c.hd + e] = c.q[(size_t(t) * c.Hq + h) * c.hd + e];
    XAttnParams xp = sp.xattn;
    xp.block = sp.block;
    masks[h] = xattn_select(qh.data(), c.k.data() + size_t(1) * c.T * c.hd, c.T, c.hd, xp);
  }
  auto ref = c.dense([&](int h, int i, int j) { return h < 2 || masks[h].at(i / 64, j / 64); });
  EXPECT_LT(rel(out, ref), 1e-5);
}

TEST(Attention, ChunkedPrefillEqualsUnchunked) {
  Case c(fresh_seed());
  SparseSettings sp;
  sp.sink = 64;
  sp.local = 64;
  std::vector<HeadMode> modes{HeadMode::Streaming, HeadMode::Full};
  auto whole = c.run(modes, sp, c.T);
  for (int chunk : {1, 37, 64, 150}) EXPECT_LT(rel(c.run(modes, sp, chunk), whole), 1e-6) << "chunk " << chunk;
}

TEST(Attention, ChunkedXAttnEqualsUnchunkedOnBlockMultiples) {
  Case c(fresh_seed());
  SparseSettings sp;
  sp.xattn.tau = 0.5f;
  std::vector<HeadMode> modes{HeadMode::XAttn, HeadMode::Full};
  auto whole = c.run(modes, sp, c.T);
  for (int chunk : {64, 128}) EXPECT_LT(rel(c.run(modes, sp, chunk), whole), 1e-6) << "chunk " << chunk;
  // Omega_ESR does not depend on how the prefill was split.
  AttentionStats one, chunked, s_one, s_chunked;
  c.run(modes, sp, c.T, &one);
  c.run(modes, sp, 64, &chunked);
  EXPECT_NEAR(one.esr(), chunked.esr(), 1e-12);
  std::vector<HeadMode> streaming{HeadMode::Streaming, HeadMode::Full};
  sp.sink = 64;
  sp.local = 64;
  c.run(streaming, sp, c.T, &s_one);
  c.run(streaming, sp, 37, &s_chunked);  // blocks split across calls count once in total
  EXPECT_GT(s_one.esr(), 0.0);
  EXPECT_NEAR(s_one.esr(), s_chunked.esr(), 1e-12);
}

TEST(Attention, MetricsOnHandMadeCase) {
  Case c(1);
  c.T = 256;
  SparseSettings sp;
  sp.sink = 64;
  sp.local = 64;
  AttentionStats st;
  c.run({HeadMode::Streaming, HeadMode::Full}, sp, c.T, &st);
  // 4 query blocks: causal block pairs 1+2+3+4 = 10; streaming keeps {0},{0,1},{0,2},{0,3} = 7, skips 3.
  EXPECT_NEAR(st.esr(), (0.3 + 0.0) / 2, 1e-12);
  // Keys computed per streaming query row: block 0 (capped causally) + own block up to the row.
  double done = 0, full = 0;
  for (int i = 0; i < 256; ++i) {
    full += i + 1;
    done += (i < 128) ? i + 1 : 64 + (i % 64) + 1;
  }
  EXPECT_NEAR(st.flops_ratio(), (2 * full + 2 * done) / (4 * full), 1e-12);
  RoutingTable r = RoutingTable::all_full(4, 2);
  r.mode[1] = HeadMode::Streaming;
  r.mode[6] = HeadMode::XAttn;
  EXPECT_DOUBLE_EQ(r.msr(), 0.25);
}

TEST(Attention, AllFullRoutingEqualsPlainModel) {
  const std::string dir = std::string(ELASTIC_FIXTURE_DIR) + "/qwen3_tiny";
  Model m = Model::load(dir);
  std::vector<int32_t> ids(20);
  for (int i = 0; i < 20; ++i) ids[i] = (i * 37) % m.config.vocab;
  const RoutingTable ssa = RoutingTable::uniform(m.config.n_layers, m.config.n_kv_heads, HeadMode::Streaming);
  KVCache c1, c2;
  c1.init(m.config, 20);
  c2.init(m.config, 20, &ssa);  // the window covers all 20 positions
  std::vector<float> a, b;
  m.forward(ids.data(), 20, c1, a, true);
  m.forward(ids.data(), 20, c2, b, true);
  EXPECT_EQ(a, b);
}

static std::string write_tmp(const std::string& body) {
  std::string p = elastic::test::scratch_path("routing.json");
  std::ofstream(p) << body;
  return p;
}

static std::string routing_error(const std::string& body) {
  try {
    load_routing(write_tmp(body), 2, 2);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(Routing, FileRoundTripAndErrors) {
  RoutingTable r = RoutingTable::all_full(2, 2);
  r.mode[3] = HeadMode::XAttn;
  r.sparse.local = 512;
  std::string p = write_tmp("");
  save_routing(r, p);
  RoutingTable back = load_routing(p, 2, 2);
  EXPECT_EQ(back.mode, r.mode);
  EXPECT_EQ(back.sparse.local, 512);
  EXPECT_NE(routing_error(R"({"layers":[["full","full"]]})").find("has 1 layers, the model has 2"), std::string::npos);
  EXPECT_NE(routing_error(R"({"layers":[["full"],["full","full"]]})").find("layer 0 must list 2"), std::string::npos);
  EXPECT_NE(routing_error(R"({"layers":[["full","dense"],["full","full"]]})").find("unknown head mode 'dense'"), std::string::npos);
  EXPECT_NE(routing_error(R"({"block_size":96,"layers":[["full","full"],["full","full"]]})").find("block_size"), std::string::npos);
  EXPECT_NE(routing_error(R"({"layers": [)").find("malformed JSON"), std::string::npos);
  EXPECT_NE(routing_error(R"({"xattn":{"stride":7},"layers":[["full","full"],["full","full"]]})").find("stride"), std::string::npos);
}

// Hostile routing files: integers that do not fit an int (nlohmann's get<int> would wrap 2^32 + 64 to a valid 64),
// windows over the engine's limit, fields of the wrong type; each names the file and the field.
TEST(Routing, OutOfRangeFieldsNameTheField) {
  const std::string L = R"("layers":[["ssa","full"],["full","full"]])";
  const std::string wrap = routing_error(R"({"sink":4294967360,)" + L + "}");
  EXPECT_NE(wrap.find("routing.json: 'sink' 4294967360 is out of range"), std::string::npos) << wrap;
  EXPECT_NE(routing_error(R"({"local":-4294967296,)" + L + "}").find("'local'"), std::string::npos);
  EXPECT_NE(routing_error(R"({"block_size":64.5,)" + L + "}").find("'block_size' must be an integer"),
            std::string::npos);
  EXPECT_NE(routing_error(R"({"xattn":{"stride":99999999999},)" + L + "}").find("'xattn.stride'"), std::string::npos);
  EXPECT_NE(routing_error(R"({"xattn":{"tau":"high"},)" + L + "}").find("'xattn.tau' must be a number"),
            std::string::npos);
  EXPECT_NE(routing_error(R"({"local":16777217,)" + L + "}").find("'local' 16777217 is out of range (at most 16777216)"),
            std::string::npos);
  EXPECT_NE(routing_error("[1, 2]").find("must be a JSON object"), std::string::npos);
  EXPECT_EQ(routing_error(R"({"sink":16777216,"local":16777216,)" + L + "}"), "");  // the limits themselves load
}

TEST(Routing, ValidateSparseBoundsTheWindow) {
  SparseSettings s;
  s.sink = kMaxSparseWindow + 1;
  EXPECT_THROW(validate_sparse(s, "test"), std::runtime_error);
  s.sink = 0;
  s.local = std::numeric_limits<int>::max();
  try {
    validate_sparse(s, "route static");
    ADD_FAILURE() << "local INT_MAX accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("route static: local 2147483647 must be in [1, "), std::string::npos);
  }
}

// A full disk is an error: /dev/full accepts the open and fails every write (the old writer never flushed before
// returning, so a small routing file "succeeded").
TEST(Routing, SaveToAFullDiskThrows) {
  if (access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no /dev/full";
  const RoutingTable r = RoutingTable::all_full(2, 2);
  try {
    save_routing(r, "/dev/full");
    ADD_FAILURE() << "no error writing to /dev/full";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/full: cannot write routing file: No space left"), std::string::npos)
        << e.what();
  }
}

// Settings built in code skip validate_sparse: a sink or window near INT_MAX must mean "everything", not overflow
// when rounded up to whole blocks (it wrapped negative and kept only the diagonal block).
TEST(Attention, StreamingWindowNearIntMaxKeepsEveryBlock) {
  SparseSettings s;
  s.sink = std::numeric_limits<int>::max();
  s.local = 64;
  for (int kb = 0; kb <= 40; ++kb) EXPECT_TRUE(streaming_keeps(40, kb, s)) << "sink INT_MAX, block " << kb;
  s.sink = 0;
  s.local = std::numeric_limits<int>::max();
  for (int kb = 0; kb <= 40; ++kb) EXPECT_TRUE(streaming_keeps(40, kb, s)) << "local INT_MAX, block " << kb;
  EXPECT_FALSE(streaming_keeps(3, 4, s));  // still causal
}

// The hybrid cache with such a head: one slot per position (the sink + window covers the capacity), where the
// overflowed size used to be negative and the allocation threw length_error.
TEST(Attention, HybridCacheWithHugeWindowKeepsOneSlotPerPosition) {
  ModelConfig c;
  c.n_layers = 1;
  c.n_kv_heads = 2;
  c.head_dim = 8;
  RoutingTable r = RoutingTable::uniform(1, 2, HeadMode::Streaming);
  r.sparse.sink = std::numeric_limits<int>::max();
  r.sparse.local = std::numeric_limits<int>::max();
  KVCache cache;
  ASSERT_NO_THROW(cache.init(c, 100, &r));
  for (int h = 0; h < 2; ++h) {
    EXPECT_EQ(cache.ring_slots[h], 0);
    EXPECT_EQ(cache.k[h].size(), 100u * 8);
  }
  EXPECT_THROW(cache.init(c, -1, &r), std::invalid_argument);
}

namespace {

// Head-parallel prefill: ranks (threads here) each compute their heads and sum outputs; every rank must hold exactly
// (bit for bit: the other ranks add zeros) what one rank computes for all heads, chunked or not.
TEST(HeadParallel, RanksTogetherEqualOneRankExactly) {
  Case c(fresh_seed());
  c.Hq = 8, c.Hkv = 4;
  {
    std::mt19937 rng(std::random_device{}());
    std::normal_distribution<float> N(0.f, 1.f);
    c.q.resize(size_t(c.T) * c.Hq * c.hd);
    c.k.resize(size_t(c.Hkv) * c.T * c.hd);
    c.v.resize(c.k.size());
    for (auto* x : {&c.q, &c.k, &c.v})
      for (auto& e : *x) e = N(rng);
  }
  SparseSettings sp;
  sp.block = 64;
  sp.sink = 64;
  sp.local = 64;
  RoutingTable r = RoutingTable::uniform(1, c.Hkv, HeadMode::Full);
  r.mode = {HeadMode::Streaming, HeadMode::Full, HeadMode::XAttn, HeadMode::Streaming};
  r.sparse = sp;
  for (int chunk : {c.T, 128}) {
    const auto want = c.run(r.mode, sp, chunk);
    for (int world : {2, 3}) {
      const HeadPlan plan = plan_head_parallel(r, c.T, world);
      auto group = make_thread_group(world);
      std::vector<std::vector<float>> got(world);
      std::vector<std::thread> th;
      for (int rk = 0; rk < world; ++rk)
        th.emplace_back([&, rk] {
          got[rk] = c.run_with(r.mode, sp, chunk, nullptr, [&](const AttentionArgs& a) {
            attention_forward_head_parallel(a, plan, 0, *group[rk]);
          });
        });
      for (auto& t : th) t.join();
      for (int rk = 0; rk < world; ++rk) EXPECT_EQ(got[rk], want) << world << " ranks, rank " << rk << ", chunk " << chunk;
    }
  }
}

TEST(HeadParallel, PlanBalancesRoutedWork) {
  SparseSettings sp;  // block 64, sink 128, local 2048
  const int T = 65536;
  const double full = head_prefill_pairs(HeadMode::Full, T, sp), ssa = head_prefill_pairs(HeadMode::Streaming, T, sp);
  EXPECT_DOUBLE_EQ(full, double(T) * (T + 1) / 2);
  EXPECT_GT(full / ssa, 10);  // a 2K window at 64K: far cheaper
  EXPECT_LT(full / ssa, 20);
  // 36 layers x 8 KV heads, Omega 0.7 at random: the plan keeps every rank near the mean.
  std::mt19937 rng(7);
  RoutingTable r = RoutingTable::uniform(36, 8, HeadMode::Streaming);
  for (auto& m : r.mode) m = rng() % 10 < 3 ? HeadMode::Full : HeadMode::Streaming;
  r.sparse = sp;
  for (int world : {1, 2, 4, 8}) {
    const HeadPlan p = plan_head_parallel(r, T, world);
    double total = 0;
    for (HeadMode m : r.mode) total += head_prefill_pairs(m, T, sp);
    double sum = 0;
    for (double l : p.load) sum += l;
    EXPECT_DOUBLE_EQ(sum, total);
    for (int o : p.owner) EXPECT_TRUE(o >= 0 && o < world);
    // Greedy bound: no rank is more than one head's cost above the mean.
    EXPECT_LE(*std::max_element(p.load.begin(), p.load.end()), total / world + full) << world;
    EXPECT_LT(p.imbalance(), 1.05) << world << " ranks";
  }
  // By count, 4 ranks x 2 heads each would put up to 8 full heads' work on one rank of a layer; by cost it spreads.
  RoutingTable skew = RoutingTable::uniform(1, 8, HeadMode::Streaming);
  skew.mode[0] = skew.mode[1] = HeadMode::Full;
  skew.sparse = sp;
  const HeadPlan p = plan_head_parallel(skew, T, 2);
  EXPECT_NE(p.owner[0], p.owner[1]) << "the two full heads go to different ranks";
  EXPECT_THROW(plan_head_parallel(skew, T, 0), std::invalid_argument);
  EXPECT_THROW(plan_head_parallel(skew, 0, 2), std::invalid_argument);
}

}  // namespace

namespace {

// routed_prefill_stats for a one-layer routing of `modes` equals what attention_forward counted for it.
void expect_analytic_figures(const Case& c, const std::vector<HeadMode>& modes, const SparseSettings& sp,
                             const AttentionStats& counted) {
  RoutingTable r = RoutingTable::uniform(1, c.Hkv, HeadMode::Full);
  r.mode = modes;
  r.sparse = sp;
  const AttentionStats analytic = routed_prefill_stats(r, c.T);
  EXPECT_NEAR(analytic.flops_ratio(), counted.flops_ratio(), 1e-12);
  EXPECT_NEAR(analytic.esr(), counted.esr(), 1e-12);
}

// The analytic prefill figures a backend without counters reports (GPU eval) equal what attention_forward counts.
TEST(Attention, RoutedPrefillStatsEqualCountedStats) {
  Case c(fresh_seed());
  SparseSettings sp;
  sp.block = 64;
  sp.sink = 64;
  sp.local = 128;
  for (const auto& modes : {std::vector<HeadMode>{HeadMode::Streaming, HeadMode::Full},
                            std::vector<HeadMode>{HeadMode::Streaming, HeadMode::Streaming},
                            std::vector<HeadMode>{HeadMode::Full, HeadMode::Full}}) {
    AttentionStats counted;
    c.run(modes, sp, c.T, &counted);
    expect_analytic_figures(c, modes, sp, counted);
  }
  RoutingTable x = RoutingTable::uniform(1, c.Hkv, HeadMode::XAttn);
  EXPECT_TRUE(std::isnan(routed_prefill_stats(x, c.T).flops_ratio()));  // input-dependent: not claimed
  EXPECT_TRUE(std::isnan(routed_prefill_stats(x, c.T).esr()));
}

}  // namespace

namespace {

// The toy pattern (src/attention/patterns/strided.cpp, one file plus a registry line) through the CPU reference:
// every 4th key block plus the diagonal, in chunks, beside a full head; its counted work equals its analytic cost.
TEST(Attention, StridedToyPatternRunsOnTheCpuReference) {
  Case c(fresh_seed());
  SparseSettings sp;
  sp.block = 64;
  const HeadMode strided = parse_head_mode("strided");
  const std::vector<HeadMode> modes{strided, HeadMode::Full};
  AttentionStats counted;
  const auto out = c.run(modes, sp, 128, &counted);
  const auto ref = c.dense([&](int h, int i, int j) {
    if (h / 2 == 1) return true;  // query heads 2, 3 read the full head
    const int qb = i / 64, kb = j / 64;
    return kb == qb || kb % 4 == 0;  // the rule, written here independently
  });
  EXPECT_LT(rel(out, ref), 1e-5);
  expect_analytic_figures(c, modes, sp, counted);
  EXPECT_LT(counted.flops_ratio(), 1.0);
  EXPECT_STREQ(head_mode_name(strided), "strided");
}

}  // namespace
