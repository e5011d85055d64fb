// GPU test (label "gpu"): the GPU model's slots. Several sequences of different lengths and routings decode together
// (GpuModel::decode_batch: one GEMM over the batch, one paged attention launch over every sequence's heads), against
// the same sequences run alone and against the fp32 CPU model; a prefill in steps interleaves with other slots'
// decode steps; a small page pool refuses what does not fit and keeps the other sequences intact; and the server
// runs concurrent requests on the GPU slots (gpu_batch_backend) with the answers of lone runs.
//
// Batch invariance: by default a decode step's projections are cuBLASLt GEMMs whose algorithm may change with the
// batch size, so a row's logits in a batch may differ from its lone run in the last bf16 bits: those tests check the
// logits within kBatchTol of the lone run and of the CPU model, greedy tokens equal wherever the lone run's top two
// logits are further apart than that, and print how many rows were bitwise equal. With GpuOptions::batch_invariant
// (what the server runs) rows are bitwise their lone runs on the same model.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <future>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "elastic/cuda.h"
#include "elastic/engine.h"
#include "elastic/gpu_model.h"
#include "elastic/kv_pages.h"
#include "elastic/server.h"
#include "gpu_test_models.h"
#include "gpu_test_util.h"

using namespace elastic;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr double kTol = 3e-2;       // against the fp32 CPU model (bf16 activations through every layer)
constexpr double kBatchTol = 1e-2;  // against the same sequence decoded alone on the GPU

double rel_err(const float* got, const float* ref, size_t n) {
  double md = 0, mv = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) return 1e30;
    md = std::max(md, double(std::abs(got[i] - ref[i])));
    mv = std::max(mv, double(std::abs(ref[i])));
  }
  return md / mv;
}

// The gap between the largest and second largest logit, relative to the largest |logit|.
double top2_margin(const float* x, int V) {
  float a = -INFINITY, b = -INFINITY, mv = 0;
  for (int i = 0; i < V; ++i) {
    mv = std::max(mv, std::abs(x[i]));
    if (x[i] > a) b = a, a = x[i];
    else if (x[i] > b) b = x[i];
  }
  return (a - b) / mv;
}

std::vector<int32_t> random_ids(int T, int V, std::mt19937_64& rng) {
  std::vector<int32_t> ids(T);
  for (auto& x : ids) x = int32_t(rng() % V);
  return ids;
}

cuda::GpuOptions options(int max_ctx, int chunk, int slots) {
  cuda::GpuOptions o;
  o.max_ctx = max_ctx;
  o.chunk = chunk;
  o.slots = slots;
  return o;
}

// Four routings: all full, full + streaming, full + streaming + XAttention (XA heads decode densely), all streaming.
RoutingTable routing_kind(const ModelConfig& c, int kind) {
  RoutingTable r = RoutingTable::all_full(c.n_layers, c.n_kv_heads);
  r.sparse.block = 64, r.sparse.sink = 64, r.sparse.local = 128, r.sparse.xattn.block = 64;
  for (size_t i = 0; i < r.mode.size(); ++i) {
    if (kind == 1) r.mode[i] = i % 2 ? HeadMode::Streaming : HeadMode::Full;
    if (kind == 2) r.mode[i] = i % 3 == 1 ? HeadMode::Streaming : i % 3 == 2 ? HeadMode::XAttn : HeadMode::Full;
    if (kind == 3) r.mode[i] = HeadMode::Streaming;
  }
  return r;
}

struct Seq {
  std::vector<int32_t> prompt, forced;  // forced: the ids fed at each decode step (teacher forcing)
  RoutingTable r;
};

// Lone runs on a one-slot model: the logits of every decode step, [steps, V].
std::vector<float> lone_logits(cuda::GpuModel& g, const Seq& s, int steps) {
  g.prefill(s.prompt.data(), int(s.prompt.size()), &s.r, nullptr, nullptr, false);
  std::vector<float> all, l;
  for (int i = 0; i < steps; ++i) {
    g.decode(s.forced[i], &l);
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

void prefill_in_steps(cuda::GpuModel& g, int slot, const Seq& s, std::vector<float>* logits = nullptr) {
  g.prefill_begin(slot, s.prompt.data(), int(s.prompt.size()), &s.r, nullptr);
  EXPECT_EQ(g.prefilling_slot(), slot);
  int steps = 1;
  while (!g.prefill_step()) ++steps;
  g.prefill_end(logits, false);
  EXPECT_EQ(g.prefilling_slot(), -1);
  EXPECT_GE(steps, g.config().n_layers);
}

class GpuBatch : public ::testing::TestWithParam<bool> {};

// Four sequences (lengths 500, 300, 130, 64; the first crosses the 512 page and block boundary while decoding) under
// four routings decode 16 steps together, then a non-contiguous pair of them 4 more (another batch size, another
// CUDA graph): every row's logits match the sequence's lone run and the CPU model.
TEST_P(GpuBatch, BatchedDecodeMatchesLoneRunsAndCpu) {
  SKIP_WITHOUT_GPU();
  TRACED_SEED(seed);
  const Model m = gpu_test::make_model(GetParam(), seed);
  const ModelConfig& c = m.config;
  const int V = c.vocab, steps = 16, more = 4;
  std::mt19937_64 rng(seed);
  std::vector<Seq> seqs;
  const int lens[4] = {500, 300, 130, 64};
  for (int i = 0; i < 4; ++i)
    seqs.push_back({random_ids(lens[i], V, rng), random_ids(steps + more, V, rng), routing_kind(c, i)});
  cuda::GpuOptions plain = options(1024, 256, 4);
  plain.programmatic_launch = false;
  auto batch = cuda::GpuModel::upload(m, plain);
  auto lone = cuda::GpuModel::upload(m, options(1024, 256, 1));
  cuda::GpuOptions po = options(1024, 256, 4);
  po.programmatic_launch = true;  // batch 4 runs cuBLASLt between our kernels, batch 2 the small-M kernel
  auto batch_pdl = cuda::GpuModel::upload(m, po);
  EXPECT_EQ(batch->slots(), 4);
  std::vector<std::vector<float>> ref(4);
  for (int i = 0; i < 4; ++i) ref[i] = lone_logits(*lone, seqs[i], steps + more);

  for (int i = 0; i < 4; ++i) prefill_in_steps(*batch, i, seqs[i]);
  for (int i = 0; i < 4; ++i) prefill_in_steps(*batch_pdl, i, seqs[i]);
  // The same batches under programmatic dependent launch: the same kernels and arithmetic, so the same bits.
  auto check_pdl = [&](const std::vector<int>& slots, const std::vector<int32_t>& ids, const std::vector<float>& got,
                       const std::vector<int32_t>& next) {
    std::vector<float> got_pdl;
    std::vector<int32_t> next_pdl;
    batch_pdl->decode_batch(slots, ids, &got_pdl, &next_pdl);
    EXPECT_EQ(got_pdl, got) << "programmatic launch changed the logits";
    EXPECT_EQ(next_pdl, next);
  };
  // The CPU model, teacher-forced the same way.
  std::vector<KVCache> caches(4);
  for (int i = 0; i < 4; ++i) {
    caches[i].init(c, 1024, &seqs[i].r);
    std::vector<float> l;
    m.prefill(seqs[i].prompt.data(), int(seqs[i].prompt.size()), 256, caches[i], l, false);
  }
  int bitwise = 0, rows = 0;
  auto check_step = [&](const std::vector<int>& slots, int step, const std::vector<float>& got,
                        const std::vector<int32_t>& next) {
    for (size_t b = 0; b < slots.size(); ++b) {
      const int s = slots[b];
      const float* g = got.data() + b * V;
      const float* r = ref[s].data() + size_t(step) * V;
      SCOPED_TRACE("slot " + std::to_string(s) + " step " + std::to_string(step));
      EXPECT_LT(rel_err(g, r, V), kBatchTol);
      bitwise += std::equal(g, g + V, r);
      ++rows;
      std::vector<float> cpu;
      m.forward(&seqs[s].forced[step], 1, caches[s], cpu, false);
      EXPECT_LT(rel_err(g, cpu.data(), V), kTol);
      const int32_t lone_top = int32_t(std::max_element(r, r + V) - r);
      EXPECT_EQ(next[b], int32_t(std::max_element(g, g + V) - g)) << "the device argmax is the logits' first max";
      if (top2_margin(r, V) > kBatchTol) EXPECT_EQ(next[b], lone_top);
    }
  };
  for (int i = 0; i < steps; ++i) {
    const std::vector<int> slots = {0, 1, 2, 3};
    std::vector<int32_t> ids, next;
    for (int s : slots) ids.push_back(seqs[s].forced[i]);
    std::vector<float> got;
    batch->decode_batch(slots, ids, &got, &next);
    check_step(slots, i, got, next);
    check_pdl(slots, ids, got, next);
  }
  for (int i = steps; i < steps + more; ++i) {
    const std::vector<int> slots = {3, 1};  // a batch of 2, out of slot order
    std::vector<int32_t> ids = {seqs[3].forced[i], seqs[1].forced[i]}, next;
    std::vector<float> got;
    batch->decode_batch(slots, ids, &got, &next);
    check_step(slots, i, got, next);
    check_pdl(slots, ids, got, next);
  }
  std::printf("[ batch ] %d of %d batched rows bitwise equal to their lone runs\n", bitwise, rows);
  EXPECT_EQ(batch->length(0), 500 + steps);
  EXPECT_EQ(batch->length(1), 300 + steps + more);
  EXPECT_EQ(batch->length(3), 64 + steps + more);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(batch->routing(i).mode, seqs[i].r.mode);
  // Each sequence holds what it would alone.
  lone->prefill(seqs[2].prompt.data(), 130, &seqs[2].r, nullptr, nullptr, false);
  for (int i = 0; i < steps; ++i) lone->decode(seqs[2].forced[i]);
  EXPECT_EQ(batch->kv_bytes(2), lone->kv_bytes());
  EXPECT_LE(batch->kv_bytes(2), batch->kv_bytes_for(130, 130 + steps, seqs[2].r));
}

// GpuOptions::batch_invariant: a sequence decoded in a batch (any size, any slot) gets exactly the logits it gets
// alone on the same model: bitwise, so greedy and seeded sampling are batch-invariant.
TEST_P(GpuBatch, BatchInvariantRowsEqualLoneRowsBitwise) {
  SKIP_WITHOUT_GPU();
  TRACED_SEED(seed);
  const Model m = gpu_test::make_model(GetParam(), seed);
  const ModelConfig& c = m.config;
  const int V = c.vocab, steps = 12;
  std::mt19937_64 rng(seed);
  std::vector<Seq> seqs;
  const int lens[4] = {500, 300, 130, 64};
  for (int i = 0; i < 4; ++i)
    seqs.push_back({random_ids(lens[i], V, rng), random_ids(steps, V, rng), routing_kind(c, i)});
  cuda::GpuOptions o = options(1024, 256, 4);
  o.batch_invariant = true;
  auto g = cuda::GpuModel::upload(m, o);
  EXPECT_NE(g->plan().kernels.find("batch-invariant"), std::string::npos) << g->plan().kernels;
  std::vector<std::vector<float>> lone(4);
  for (int i = 0; i < 4; ++i) {  // alone, in slot 0
    lone[i] = lone_logits(*g, seqs[i], steps);
    g->release(0);
  }
  // Sequence i in slot (i + 1) % 4; the first half of the steps all four together, then two pairs.
  for (int i = 0; i < 4; ++i) prefill_in_steps(*g, (i + 1) % 4, seqs[i]);
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<int>> groups = step < steps / 2 ? std::vector<std::vector<int>>{{0, 1, 2, 3}}
                                                            : std::vector<std::vector<int>>{{2, 0}, {3, 1}};
    for (const auto& grp : groups) {  // sequence indices
      std::vector<int> slots;
      std::vector<int32_t> ids;
      for (int i : grp) slots.push_back((i + 1) % 4), ids.push_back(seqs[i].forced[step]);
      std::vector<float> got;
      g->decode_batch(slots, ids, &got);
      for (size_t b = 0; b < grp.size(); ++b) {
        const float* r = lone[grp[b]].data() + size_t(step) * V;
        EXPECT_TRUE(std::equal(r, r + V, got.data() + b * V))
            << "sequence " << grp[b] << " step " << step << " (batch of " << grp.size()
            << "): max diff " << rel_err(got.data() + b * V, r, V);
      }
    }
  }
}

// A prefill run in steps while another slot decodes: the decoding slot's logits are those of its lone run, the new
// prompt's last-row logits those of a whole prefill; a prefill dropped half way (release) returns its pages.
TEST_P(GpuBatch, SteppedPrefillInterleavesWithDecode) {
  SKIP_WITHOUT_GPU();
  TRACED_SEED(seed);
  const Model m = gpu_test::make_model(GetParam(), seed);
  const int V = m.config.vocab;
  std::mt19937_64 rng(seed);
  // a at 250 positions: the decode steps beside b's prefill cross the page boundary at 256.
  const Seq a{random_ids(250, V, rng), random_ids(64, V, rng), routing_kind(m.config, 1)};
  const Seq b{random_ids(700, V, rng), random_ids(4, V, rng), routing_kind(m.config, 2)};
  auto g = cuda::GpuModel::upload(m, options(1024, 256, 3));
  auto lone = cuda::GpuModel::upload(m, options(1024, 256, 1));
  const std::vector<float> ref_a = lone_logits(*lone, a, 64);
  std::vector<float> ref_b;
  lone->prefill(b.prompt.data(), 700, &b.r, nullptr, &ref_b, false);

  prefill_in_steps(*g, 0, a);
  const size_t a_bytes_before = g->kv_bytes(0);
  int step = 0;
  std::vector<float> got;
  auto decode_a = [&] {
    std::vector<int32_t> next;
    g->decode_batch({0}, {a.forced[step]}, &got, &next);
    EXPECT_LT(rel_err(got.data(), ref_a.data() + size_t(step) * V, V), kBatchTol) << "step " << step;
    ++step;
  };
  g->prefill_begin(1, b.prompt.data(), 700, &b.r, nullptr);
  EXPECT_THROW(g->prefill_begin(2, b.prompt.data(), 700, &b.r, nullptr), std::logic_error) << "one prefill at a time";
  bool done = false;
  while (!done) {  // 700 positions in chunks of 256: 3 steps a layer
    done = g->prefill_step();
    decode_a();
  }
  std::vector<float> last_b;
  g->prefill_end(&last_b, false);
  EXPECT_EQ(last_b, ref_b) << "a stepped prefill computes what a whole one does";
  EXPECT_GT(g->kv_bytes(0), a_bytes_before);  // slot 0 grew while decoding

  // Slot 2 starts a prefill and is released half way: its pages go back, the others keep theirs.
  const size_t held = g->kv_bytes(0) + g->kv_bytes(1);
  g->prefill_begin(2, b.prompt.data(), 700, &b.r, nullptr);
  for (int i = 0; i < 4; ++i) g->prefill_step();
  EXPECT_GT(g->kv_bytes(2), 0u);
  g->release(2);
  EXPECT_EQ(g->prefilling_slot(), -1);
  EXPECT_EQ(g->kv_bytes(2), 0u);
  EXPECT_EQ(g->kv_bytes(0) + g->kv_bytes(1), held);
  EXPECT_THROW(g->decode_batch({2}, {1}, nullptr), std::logic_error);
  // Both live slots decode on together.
  std::vector<int32_t> next;
  g->decode_batch({0, 1}, {a.forced[step], b.forced[0]}, &got, &next);
  EXPECT_LT(rel_err(got.data(), ref_a.data() + size_t(step) * V, V), kBatchTol);
}

// A pool smaller than every slot's heads full: a prompt whose pages do not fit is refused with OutOfPages during its
// prefill, leaves its slot empty and the pool as it was, and the sequence already held decodes on; kv_bytes_for is
// the peak a sequence reaches.
TEST_P(GpuBatch, SmallPoolRefusesWhatDoesNotFit) {
  SKIP_WITHOUT_GPU();
  TRACED_SEED(seed);
  const Model m = gpu_test::make_model(GetParam(), seed);
  const ModelConfig& c = m.config;
  std::mt19937_64 rng(seed);
  cuda::GpuOptions o = options(1024, 256, 2);
  auto probe = cuda::GpuModel::upload(m, o);
  const RoutingTable full = RoutingTable::all_full(c.n_layers, c.n_kv_heads);
  const size_t need_600 = probe->kv_bytes_for(600, 640, full);
  EXPECT_EQ(probe->kv_pool_bytes(), 2 * probe->kv_bytes_for(1024, 1024, full)) << "default: every slot full";
  probe.reset();
  o.kv_pool_bytes = need_600 + need_600 / 2;  // one 600-position sequence, not two
  auto g = cuda::GpuModel::upload(m, o);
  EXPECT_LE(g->kv_pool_bytes(), o.kv_pool_bytes);
  const auto ids = random_ids(600, c.vocab, rng);
  g->prefill_begin(0, ids.data(), 600, &full, nullptr);
  while (!g->prefill_step()) {
  }
  g->prefill_end(nullptr, false);
  std::vector<int32_t> next;
  for (int i = 0; i < 40; ++i) g->decode_batch({0}, {ids[i]}, nullptr, &next);
  EXPECT_EQ(g->kv_bytes(0), need_600) << "at 640 positions a sequence holds its kv_bytes_for";
  g->prefill_begin(1, ids.data(), 600, &full, nullptr);
  try {
    while (!g->prefill_step()) {
    }
    ADD_FAILURE() << "a second 600-position prompt fit in a pool for one and a half";
  } catch (const OutOfPages& e) {
    EXPECT_NE(std::string(e.what()).find("pages"), std::string::npos) << e.what();
  }
  EXPECT_EQ(g->prefilling_slot(), -1);
  EXPECT_EQ(g->kv_bytes(1), 0u);
  EXPECT_EQ(g->kv_bytes(0), need_600);
  g->decode_batch({0}, {ids[41]}, nullptr, &next);  // slot 0 decodes on (into a new page)
  // A streaming routing fits beside it.
  const RoutingTable ssa = routing_kind(c, 3);
  EXPECT_LT(g->kv_bytes_for(600, 640, ssa), need_600 / 2);
  g->prefill_begin(1, ids.data(), 600, &ssa, nullptr);
  while (!g->prefill_step()) {
  }
  g->prefill_end(nullptr, false);
  g->decode_batch({0, 1}, {ids[42], ids[0]}, nullptr, &next);
}

// fork copies a sequence's pages into another slot: fed the same ids, the two rows of a batched step are equal (one
// GEMM, identical inputs) and equal to the source's lone run; each then holds its own pages.
TEST_P(GpuBatch, ForkedSequenceDecodesLikeItsSource) {
  SKIP_WITHOUT_GPU();
  TRACED_SEED(seed);
  const Model m = gpu_test::make_model(GetParam(), seed);
  const int V = m.config.vocab;
  std::mt19937_64 rng(seed);
  const Seq a{random_ids(450, V, rng), random_ids(100, V, rng), routing_kind(m.config, 2)};
  auto g = cuda::GpuModel::upload(m, options(1024, 256, 3));
  auto lone = cuda::GpuModel::upload(m, options(1024, 256, 1));
  const std::vector<float> ref = lone_logits(*lone, a, 100);
  prefill_in_steps(*g, 0, a);
  std::vector<float> got;
  std::vector<int32_t> next;
  // Forked at 500 positions; the pair then crosses the page and block boundary at 512 (new pages, windows move).
  for (int i = 0; i < 50; ++i) g->decode_batch({0}, {a.forced[i]}, nullptr);
  g->fork(0, 2);
  EXPECT_EQ(g->length(2), 500);
  EXPECT_EQ(g->kv_bytes(2), g->kv_bytes(0));
  EXPECT_EQ(g->routing(2).mode, a.r.mode);
  for (int i = 50; i < 100; ++i) {
    g->decode_batch({2, 0}, {a.forced[i], a.forced[i]}, &got, &next);
    EXPECT_TRUE(std::equal(got.begin(), got.begin() + V, got.begin() + V)) << "step " << i;
    EXPECT_EQ(next[0], next[1]);
    EXPECT_LT(rel_err(got.data(), ref.data() + size_t(i) * V, V), kBatchTol) << "step " << i;
  }
  g->release(0);  // the fork keeps its own pages
  g->decode_batch({2}, {a.forced[0]}, &got);
  EXPECT_THROW(g->fork(0, 1), std::logic_error) << "slot 0 holds nothing now";
  EXPECT_THROW(g->fork(2, 2), std::invalid_argument);
}

TEST(GpuBatchErrors, BadBatchesNameTheProblem) {
  SKIP_WITHOUT_GPU();
  const Model m = gpu_test::make_model(false, 7);
  EXPECT_THROW(cuda::GpuModel::upload(m, options(512, 256, 0)), std::invalid_argument);
  EXPECT_THROW(cuda::GpuModel::upload(m, options(512, 256, 257)), std::invalid_argument);
  cuda::GpuOptions tiny_pool = options(512, 256, 1);
  tiny_pool.kv_pool_bytes = 1;  // less than one page of K and V
  EXPECT_THROW(cuda::GpuModel::upload(m, tiny_pool), std::invalid_argument);
  auto g = cuda::GpuModel::upload(m, options(512, 256, 2));
  std::vector<int32_t> ids(100, 5);
  g->prefill(ids.data(), 100, nullptr, nullptr, nullptr, false);
  EXPECT_THROW(g->decode_batch({}, {}, nullptr), std::invalid_argument);
  EXPECT_THROW(g->decode_batch({0, 0}, {1, 2}, nullptr), std::invalid_argument);  // a slot twice
  EXPECT_THROW(g->decode_batch({0, 1}, {1, 2}, nullptr), std::logic_error);       // slot 1 holds nothing
  EXPECT_THROW(g->decode_batch({0, 2}, {1, 2}, nullptr), std::out_of_range);      // no slot 2
  EXPECT_THROW(g->decode_batch({0}, {1, 2}, nullptr), std::invalid_argument);     // ids and slots differ
  EXPECT_THROW(g->decode_batch({0}, {m.config.vocab}, nullptr), std::invalid_argument);
  EXPECT_EQ(g->length(0), 100) << "refused steps change nothing";
  EXPECT_THROW(g->prefill_step(), std::logic_error);
  EXPECT_THROW(g->prefill_end(nullptr, false), std::logic_error);
  // Stepping past the last layer or ending early is refused and keeps the running prefill.
  g->prefill_begin(1, ids.data(), 100, nullptr, nullptr);
  EXPECT_THROW(g->prefill_end(nullptr, false), std::logic_error);
  EXPECT_EQ(g->prefilling_slot(), 1);
  while (!g->prefill_step()) {
  }
  EXPECT_THROW(g->prefill_step(), std::logic_error);
  g->prefill_end(nullptr, false);
  EXPECT_EQ(g->length(1), 100);
}

INSTANTIATE_TEST_SUITE_P(Archs, GpuBatch, ::testing::Values(false, true),
                         [](const auto& i) { return std::string(i.param ? "LlamaHd64Bias" : "Qwen3Hd128QkNorm"); });

// `serve --device cuda --parallel 4`: four concurrent requests (different prompt lengths; two greedy, two seeded
// samples) run on the GPU
// model's slots together (fewer decode steps than tokens: the steps were batched), batch-invariantly as serve runs
// them, and each returns the tokens (return_token_ids) the same request gets alone on the same model afterwards,
// with its routing figures; the model's pages are all back when they are done.
TEST(GpuServe, ConcurrentRequestsBatchOnTheGpuSlots) {
  SKIP_WITHOUT_GPU();
  TRACED_SEED(seed);
  Model m = gpu_test::make_model(false, seed);
  m.config.eos_ids.clear();  // every request runs to max_tokens
  RoutingTable r = routing_kind(m.config, 1);
  cuda::GpuOptions go = options(512, 128, 4);
  go.batch_invariant = true;  // as serve --device cuda
  auto g = cuda::GpuModel::upload(m, go);
  const std::string dir = (fs::temp_directory_path() / ("elastic_gpu_serve_batch_" + std::to_string(seed))).string();
  fs::create_directories(dir);
  ServerOptions o;
  o.policy = RoutePolicy::fixed(r);
  o.port = 0;
  o.max_slots = 4;
  o.max_context = 512;
  o.kv_budget_bytes = g->kv_pool_bytes();
  o.batch_backend = cuda::gpu_batch_backend(*g);  // (serve --device cuda also sets batch_invariant)
  Server srv(m, dir, o);
  srv.start();
  std::mt19937 rng(static_cast<unsigned>(seed));
  std::vector<std::vector<int32_t>> prompts;
  for (int n : {300, 90, 200, 40}) {
    std::vector<int32_t> p(n);
    for (auto& id : p) id = static_cast<int32_t>(rng() % m.config.vocab);
    prompts.push_back(p);
  }
  const int port = srv.port();
  std::vector<std::future<json>> answers;
  // Requests 0 and 2 greedy; 1 and 3 sampled with their own seeds (temperature, top-k, top-p): seeded sampling is
  // batch-invariant too, since the rows' logits are.
  std::vector<SamplerParams> sampling(prompts.size());
  for (size_t i = 1; i < prompts.size(); i += 2) sampling[i] = SamplerParams{0.8f, 40, 0.9f, 1000 + i};
  for (size_t i = 0; i < prompts.size(); ++i)
    answers.push_back(std::async(std::launch::async, [port, p = prompts[i], sp = sampling[i]] {
      httplib::Client c("127.0.0.1", port);
      c.set_read_timeout(120, 0);
      json body{{"prompt", p}, {"max_tokens", 64}, {"temperature", sp.temperature}, {"return_token_ids", true}};
      if (sp.temperature > 0) body.update(json{{"top_k", sp.top_k}, {"top_p", sp.top_p}, {"seed", sp.seed}});
      auto res = c.Post("/v1/completions", body.dump(), "application/json");
      if (!res) return json{{"error", httplib::to_string(res.error())}};
      if (res->status != 200) return json{{"error", res->body}};
      return json::parse(res->body);
    }));
  std::vector<std::vector<int32_t>> served;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const json j = answers[i].get();
    ASSERT_FALSE(j.contains("error")) << j.dump();
    EXPECT_EQ(j["usage"]["prompt_tokens"], int(prompts[i].size()));
    EXPECT_EQ(j["usage"]["completion_tokens"], 64);
    EXPECT_DOUBLE_EQ(j["elastic"]["omega_msr"].get<double>(), r.msr());
    EXPECT_GT(j["elastic"]["kv_cache_bytes"].get<size_t>(), 0u);
    served.push_back(j["elastic"]["token_ids"].get<std::vector<int32_t>>());
  }
  httplib::Client c("127.0.0.1", port);
  auto met = c.Get("/metrics");
  ASSERT_TRUE(met);
  auto value = [&](const std::string& name) {
    const size_t at = met->body.find("\n" + name + " ");
    return at == std::string::npos ? -1.0 : std::stod(met->body.substr(at + name.size() + 2));
  };
  const double steps = value("elastic_decode_steps_total"), tokens = value("elastic_decode_batch_rows_total");
  std::printf("[ batch ] %.0f decode tokens in %.0f steps\n", tokens, steps);
  EXPECT_GT(tokens, 0);
  EXPECT_LT(steps, tokens) << "concurrent requests decoded in batches";
  srv.stop();
  for (int s = 0; s < 4; ++s) EXPECT_EQ(g->kv_bytes(s), 0u) << "slot " << s << "'s pages are back";
  // Each request alone on the same model: the tokens it was served, token for token.
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto alone = generate(*cuda::gpu_sequence_backend(*g), m.config, prompts[i], 64, &r, nullptr,
                                sampling[i], false, nullptr);
    EXPECT_EQ(served[i], alone) << "request " << i;
  }
  fs::remove_all(dir);
}

}  // namespace
