// GPU test (label "gpu"): router training on the GPU against the CPU trainer on the same bf16-rounded weights.
// One step: loss, gate probabilities, gate decisions and the router gradient; whole runs: train_router on both
// devices with the same data, seeds and schedule, compared step by step.
// Tolerances (bf16 activations through every layer and gradients rounded to bf16 where they enter the GEMMs and the
// attention backward): loss and gate probabilities 2e-2 relative, router gradient 8e-2 relative L2 (the gradient
// passes back through every layer), trained parameters 8e-2 relative L2.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "elastic/cuda.h"
#include "elastic/gpu_model.h"
#include "elastic/gpu_train.h"
#include "elastic/nccl_comm.h"
#include "elastic/train.h"
#include "gpu_test_models.h"
#include "gpu_test_util.h"
#include "router/router_mlp.h"
#include "train/router_step.h"

using namespace elastic;

namespace {

double rel_l2(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return 1e30;
    num += double(got[i] - ref[i]) * (got[i] - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

RouterSpec spec_for(const Model& m, bool xattn, bool sigmoid) {
  RouterSpec s;
  s.n_layers = m.config.n_layers;
  s.n_kv_heads = m.config.n_kv_heads;
  s.head_dim = m.config.head_dim;
  s.pool_first = s.pool_last = 40;
  s.sigmoid = sigmoid;
  s.sparse_mode = xattn ? HeadMode::XAttn : HeadMode::Streaming;
  s.sparse.block = 64;
  s.sparse.sink = 64;
  s.sparse.local = 128;
  s.sparse.xattn.block = 64;
  s.base_model = model_fingerprint(m.config);
  return s;
}

struct Case {
  bool llama, xattn, sigmoid, hard;
  bool head_identity = false;  // the learned-static control's fixed router input
};

class GpuTrainStep : public ::testing::TestWithParam<Case> {};

TEST_P(GpuTrainStep, MatchesCpuStep) {
  SKIP_WITHOUT_GPU();
  const Case k = GetParam();
  TRACED_SEED(seed);
  Model m = gpu_test::make_model(k.llama, seed);
  RouterSpec spec = spec_for(m, k.xattn, k.sigmoid);
  if (k.head_identity) spec.input = RouterInput::HeadIdentity;
  // Router weights scaled up so that its logits move with the pooled keys (an initial router's are near zero).
  Router r = Router::init(spec, seed);
  for (float& p : r.params) p *= 3.f;
  std::mt19937_64 rng(seed);
  train::TrainSample s;
  const int T = 420, prompt = 380;
  s.ids.resize(T);
  for (auto& x : s.ids) x = int32_t(rng() % m.config.vocab);
  s.prompt_len = prompt;
  std::vector<double> noise(size_t(m.config.n_layers) * m.config.n_kv_heads);
  std::uniform_real_distribution<double> u(0.05, 0.95);
  for (double& z : noise) z = std::log(u(rng)) - std::log1p(-u(rng));
  train::GateSettings g;
  g.tau = 1.2;
  g.hard = k.hard;
  g.noise = &noise;

  train::RouterStep<float> cpu(m, spec, r.params.data());
  const auto rc = cpu.forward(s, g);
  std::vector<float> dc(r.params.size(), 0.f);
  cpu.backward(0.7f, 0.3f, dc.data());

  cuda::GpuOptions o;
  o.max_ctx = 64;
  o.graphs = false;
  auto gm = cuda::GpuModel::upload(m, o);
  auto factory = cuda::gpu_step_runner_factory(*gm, 512, false);
  auto run = factory(spec, r.params.data());
  const auto rg = run->forward(s, g);
  std::vector<float> dg(r.params.size(), 0.f);
  run->backward(0.7f, 0.3f, dg.data());

  EXPECT_EQ(rg.n_answer, rc.n_answer);
  EXPECT_NEAR(rg.lm_loss, rc.lm_loss, 2e-2 * std::abs(rc.lm_loss));
  ASSERT_EQ(rg.z.size(), rc.z.size());
  int agree = 0;
  for (size_t i = 0; i < rc.z.size(); ++i) {
    EXPECT_NEAR(rg.p_full[i], rc.p_full[i], 2e-2) << "head " << i;
    agree += rg.z[i] == rc.z[i] || !k.hard;
  }
  ASSERT_EQ(agree, int(rc.z.size())) << "a gate decision flipped between bf16 and fp32 (margin at the threshold)";
  EXPECT_LT(rel_l2(dg, dc), 8e-2) << "router gradient";
  // The gradient is not trivially zero.
  double n2 = 0;
  for (float x : dc) n2 += double(x) * x;
  EXPECT_GT(n2, 0.0);
}

INSTANTIATE_TEST_SUITE_P(Variants, GpuTrainStep,
                         ::testing::Values(Case{false, false, false, true}, Case{false, false, false, false},
                                           Case{true, true, true, true}, Case{true, false, false, false},
                                           Case{false, false, false, false, true}),
                         [](const auto& i) {
                           const Case& c = i.param;
                           return std::string(c.llama ? "Llama" : "Qwen3") + (c.xattn ? "XAttn" : "Ssa") +
                                  (c.sigmoid ? "Sigmoid" : "Softmax") + (c.hard ? "Hard" : "Soft") +
                                  (c.head_identity ? "HeadIdentity" : "");
                         });

// train_router on both devices: the same batches, gates and schedules, step by step.
TEST(GpuTrainRouter, MatchesCpuTrainerStepByStep) {
  SKIP_WITHOUT_GPU();
  TRACED_SEED(seed);
  Model m = gpu_test::make_model(false, seed);
  std::mt19937_64 rng(seed);
  std::vector<TrainExample> data;
  for (int i = 0; i < 6; ++i) {
    TrainExample e;
    e.task_class = i % 2 ? "qa" : "summarization";
    e.input_ids.resize(300);
    e.output_ids.resize(12);
    for (auto& x : e.input_ids) x = int32_t(rng() % m.config.vocab);
    for (auto& x : e.output_ids) x = int32_t(rng() % m.config.vocab);
    data.push_back(e);
  }
  TrainOptions to;
  to.steps = 4;
  to.batch = 2;
  to.max_len = 320;
  to.lr = 1e-3;
  to.seed = seed;
  to.spec.pool_first = to.spec.pool_last = 40;
  to.spec.sparse.block = 64;
  to.spec.sparse.sink = 64;
  to.spec.sparse.local = 128;
  std::vector<StepLog> lc, lg;
  Router rc = train_router(m, data, to, [&](const StepLog& s) { lc.push_back(s); });
  cuda::GpuOptions o;
  o.max_ctx = 64;
  o.graphs = false;
  auto gm = cuda::GpuModel::upload(m, o);
  Router rg = train_router(m, data, to, [&](const StepLog& s) { lg.push_back(s); },
                           cuda::gpu_step_runner_factory(*gm, to.max_len, false));
  ASSERT_EQ(lc.size(), lg.size());
  for (size_t i = 0; i < lc.size(); ++i) {
    EXPECT_NEAR(lg[i].lm, lc[i].lm, 2e-2 * std::abs(lc[i].lm)) << "step " << i + 1;
    for (auto& [cls, v] : lc[i].msr) EXPECT_NEAR(lg[i].msr[cls], v, 1e-6) << "step " << i + 1 << " " << cls;
  }
  EXPECT_LT(rel_l2(rg.params, rc.params), 8e-2);
}

TEST(GpuTrainErrors, TooLongSampleAndBadShapes) {
  SKIP_WITHOUT_GPU();
  Model m = gpu_test::make_model(false, 3);
  cuda::GpuOptions o;
  o.max_ctx = 64;
  o.graphs = false;
  auto gm = cuda::GpuModel::upload(m, o);
  auto factory = cuda::gpu_step_runner_factory(*gm, 256, false);
  const RouterSpec spec = spec_for(m, false, false);
  Router r = Router::init(spec, 1);
  auto run = factory(spec, r.params.data());
  train::TrainSample s;
  s.ids.assign(300, 1);
  s.prompt_len = 290;
  train::GateSettings g;
  EXPECT_THROW(run->forward(s, g), std::invalid_argument);  // longer than the plan
  s.ids.assign(100, 1);
  s.prompt_len = 100;
  EXPECT_THROW(run->forward(s, g), std::invalid_argument);  // no answer token
  s.prompt_len = 90;
  s.ids[5] = m.config.vocab;
  EXPECT_THROW(run->forward(s, g), std::invalid_argument);  // id outside the vocabulary
  EXPECT_THROW(cuda::gpu_step_runner_factory(*gm, 1, false), std::invalid_argument);
  train::TrainSample ok;
  ok.ids.assign(100, 2);
  ok.prompt_len = 90;
  RouterSpec wrong = spec;
  wrong.n_layers += 1;
  auto bad = factory(wrong, r.params.data());
  EXPECT_THROW(bad->forward(ok, g), std::invalid_argument);
}

}  // namespace

namespace {

// NCCL with one rank (what a one-GPU machine can run): the rendezvous file, the communicator and an all-reduce
// that must return its input. Skips when libnccl.so.2 cannot be loaded (it is loaded at run time).
TEST(GpuNccl, OneRankAllReduceIsIdentity) {
  SKIP_WITHOUT_GPU();
  const std::string id = ::testing::TempDir() + "/elastic_nccl_id_" + std::to_string(::getpid());
  std::unique_ptr<Communicator> c;
  try {
    c = cuda::nccl_communicator(0, 1, id, 10);
  } catch (const std::runtime_error& e) {
    if (std::string(e.what()).find("cannot load libnccl") != std::string::npos) GTEST_SKIP() << e.what();
    throw;
  }
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i) * 0.5f - 3.f;
  const auto want = v;
  c->all_reduce_sum(v.data(), v.size());
  EXPECT_EQ(v, want);
  std::remove(id.c_str());
}

}  // namespace
