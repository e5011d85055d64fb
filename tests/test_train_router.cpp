// Router training: data loading and its errors, schedules, router files, routed prefill, and a tiny model where the
// right routing is known (found by brute force) and the trained router must find it.
#include <algorithm>
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <thread>

#include "elastic/generate.h"
#include "elastic/router.h"
#include "elastic/router_features.h"
#include "elastic/train.h"
#include "st_writer.h"
#include "train/grad_ops.h"

using namespace elastic;

namespace {

std::string fixture(const std::string& name = "qwen3_tiny") { return std::string(ELASTIC_FIXTURE_DIR) + "/" + name; }

void write_file(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

RouterSpec spec_for(const Model& m) {
  RouterSpec s;
  s.n_layers = m.config.n_layers;
  s.n_kv_heads = m.config.n_kv_heads;
  s.head_dim = m.config.head_dim;
  s.base_model = model_fingerprint(m.config);
  s.pool_first = s.pool_last = 16;
  s.sparse.sink = 0;
  s.sparse.local = 64;  // one 64-token block: a sparse head sees only its own block
  return s;
}

}  // namespace

TEST(TrainData, JsonlBadLinesReportedWithFileAndLine) {
  const std::string d = elastic::testing::temp_dir("train_data");
  const std::string p = d + "/data.jsonl";
  write_file(p,
             "{\"task\": \"qa\", \"input_ids\": [1,2,3], \"output_ids\": [4]}\n"
             "{\"task\": \"qa\", \"input_ids\": [1,2,3]\n"          // 2: malformed
             "{\"input_ids\": [1], \"output_ids\": [2]}\n"          // 3: no task
             "{\"task\": \"poetry\", \"input_ids\": [1], \"output_ids\": [2]}\n"  // 4: unknown class
             "\n"
             "{\"task\": \"code\", \"input_ids\": [1,\"x\"], \"output_ids\": [2]}\n"  // 6: bad id
             "{\"task\": \"code\", \"input\": \"hi\", \"output\": \"there\"}\n"  // 7: text without a tokenizer
             "{\"task\": \"niah\", \"input_ids\": [5,6], \"output_ids\": [7,8]}\n");  // 8: mapped task name
  DataReport rep;
  auto ex = load_train_jsonl(p, nullptr, default_targets(), {{"niah", "retrieval"}}, &rep);
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(ex[1].task_class, "retrieval");
  EXPECT_EQ(rep.lines, 7);
  ASSERT_EQ(rep.problems.size(), 5u);
  EXPECT_NE(rep.problems[0].find(p + ":2: malformed JSON"), std::string::npos) << rep.problems[0];
  EXPECT_NE(rep.problems[1].find(":3: missing string field 'task'"), std::string::npos);
  EXPECT_NE(rep.problems[2].find(":4: task 'poetry'"), std::string::npos);
  EXPECT_NE(rep.problems[3].find(":6:"), std::string::npos);
  EXPECT_NE(rep.problems[4].find(":7: text sample but the model has no tokenizer"), std::string::npos);
  // All lines bad: the whole load fails, naming the file.
  write_file(p, "nope\n{\"task\": 1}\n");
  try {
    load_train_jsonl(p, nullptr, default_targets(), {}, nullptr);
    FAIL() << "expected a throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("no usable training sample"), std::string::npos);
  }
  EXPECT_THROW(load_train_jsonl(d + "/missing.jsonl", nullptr, default_targets(), {}, nullptr), std::runtime_error);
}

TEST(TrainData, FitKeepsBoundariesAndAnswer) {
  TrainExample e;
  for (int i = 0; i < 100; ++i) e.input_ids.push_back(i);
  e.output_ids = {1000, 1001, 1002};
  fit_to_length(e, 23);
  ASSERT_EQ(e.input_ids.size() + e.output_ids.size(), 23u);
  EXPECT_EQ(e.output_ids.size(), 3u);
  EXPECT_EQ(e.input_ids.front(), 0);
  EXPECT_EQ(e.input_ids.back(), 99);
}

// FA-SSA whose window covers the training sequences: both classes see every position, and the warning says so; a
// window shorter than the sequences, or XAttention in either class (its blocks depend on the data), gives none.
TEST(TrainLog, IdenticalClassesWarningWhenTheWindowCoversTheSequence) {
  RouterSpec spec;  // FA-SSA
  spec.sparse.block = 64, spec.sparse.sink = 128, spec.sparse.local = 2048;
  EXPECT_NE(identical_classes_warning(spec, 1088).find("--local"), std::string::npos);
  EXPECT_NE(identical_classes_warning(spec, 2176).find("the LM loss teaches the router nothing"), std::string::npos);
  EXPECT_EQ(identical_classes_warning(spec, 2177), "");  // one more block than sink + window: the last row misses one
  spec.sparse.local = 256;
  EXPECT_EQ(identical_classes_warning(spec, 1088), "");
  EXPECT_NE(identical_classes_warning(spec, 384).find("fa-ssa"), std::string::npos);
  spec.sparse.local = 2048;
  spec.sparse_mode = HeadMode::XAttn;  // FA-XA
  EXPECT_EQ(identical_classes_warning(spec, 1088), "");
  spec.dense_mode = HeadMode::XAttn, spec.sparse_mode = HeadMode::Streaming;  // XA-SSA
  EXPECT_EQ(identical_classes_warning(spec, 1088), "");
}

// The CPU trainer's memory figure grows with T and the model, and train-router refuses a --max-len past 90% of the
// available memory, naming the length that fits.
TEST(TrainLog, CpuTrainMemoryRefusesWhatCannotFit) {
  ModelConfig c;
  c.hidden = 576, c.intermediate = 1536, c.n_layers = 30, c.n_heads = 9, c.n_kv_heads = 3, c.head_dim = 64;  // SmolLM2
  const size_t per_token = cpu_train_bytes(c, 1);
  EXPECT_EQ(cpu_train_bytes(c, 1000), 1000 * per_token);
  EXPECT_GT(per_token, size_t(31) * 576 * 4);  // at least the 31 layer inputs
  EXPECT_LT(per_token, size_t(400) << 10);
  const size_t avail = size_t(24) << 30;
  EXPECT_EQ(cpu_train_memory_error(c, 8192, avail), "");
  const std::string e = cpu_train_memory_error(c, 1048576, avail);
  EXPECT_NE(e.find("--max-len 1048576"), std::string::npos) << e;
  EXPECT_NE(e.find("at most about " + std::to_string(avail / 10 * 9 / per_token) + " tokens"), std::string::npos) << e;
  EXPECT_EQ(cpu_train_memory_error(c, 1048576, 0), "");  // unknown: no check
}

TEST(TrainLog, SaturationWarningOnlyForEarlyClosedGates) {
  StepLog s;
  s.step = 10;
  s.open = 0.01;
  EXPECT_NE(saturation_warning(s, 100, 5e-3).find("lower --lr"), std::string::npos);
  s.step = 60;  // late in the run: saturation is expected
  EXPECT_EQ(saturation_warning(s, 100, 5e-3), "");
  s.step = 10;
  s.open = 0.3;
  EXPECT_EQ(saturation_warning(s, 100, 5e-3), "");
}

TEST(TrainData, BuiltinMixCoversEveryTaskAtEveryLength) {
  const auto mix = builtin_train_mix(nullptr, 512, 24, {160, 240}, 3);
  ASSERT_EQ(mix.size(), 24u);
  std::map<std::string, std::set<size_t>> lengths;  // task class -> prompt lengths seen
  for (const auto& e : mix) lengths[e.task_class].insert(e.input_ids.size());
  for (const auto& [cls, ls] : lengths) EXPECT_EQ(ls, (std::set<size_t>{160, 240})) << cls;
  // The mix is the training split and nothing else; every other task is held out.
  for (const std::string& t : ruler_task_names()) {
    const bool trained = std::find(training_task_names().begin(), training_task_names().end(), t) !=
                         training_task_names().end();
    EXPECT_STREQ(task_split(t), trained ? "train" : "held-out") << t;
  }
  EXPECT_EQ(training_task_names().size(), 6u);
  EXPECT_STREQ(task_split("niah_multivalue"), "held-out");
  EXPECT_THROW(builtin_train_mix(nullptr, 512, 6, {}, 3), std::invalid_argument);
}

TEST(TrainData, BuiltinMixHasBothKinds) {
  auto mix = builtin_train_mix(nullptr, 512, 12, {200}, 3);
  ASSERT_FALSE(mix.empty());
  int sensitive = 0, robust = 0;
  const auto t = default_targets();
  for (auto& e : mix) {
    ASSERT_TRUE(t.count(e.task_class)) << e.task_class;
    EXPECT_FALSE(e.output_ids.empty());
    (t.at(e.task_class) < 1.0 ? sensitive : robust)++;
  }
  EXPECT_GT(sensitive, 0);
  EXPECT_GT(robust, 0);
}

// With a chat format, built-in prompts are wrapped the way eval wraps them (the router must train on what it routes).
TEST(TrainData, BuiltinMixAppliesTheChatFormat) {
  const Tokenizer tok = Tokenizer::from_file(std::string(ELASTIC_SHARED_DIR) + "/qwen3-tokenizer/tokenizer.json");
  const ChatFormat chat = [](const std::string& u) { return "<|im_start|>user\n" + u + "<|im_end|>\n<|im_start|>assistant\n"; };
  const auto raw = builtin_train_mix(&tok, tok.vocab_size(), 6, {300}, 5);
  const auto wrapped = builtin_train_mix(&tok, tok.vocab_size(), 6, {300}, 5, "", chat);
  ASSERT_EQ(raw.size(), wrapped.size());
  // Each sample is formatted as eval formats its task: retrieval and QA (and recap) prompts through the template,
  // raw-continuation tasks stay raw in both.
  int n_wrapped = 0;
  for (size_t i = 0; i < wrapped.size(); ++i) {
    const std::string text = tok.decode(wrapped[i].input_ids);
    EXPECT_EQ(raw[i].task_class, wrapped[i].task_class);
    EXPECT_NE(tok.decode(raw[i].input_ids).rfind("<|im_start|>", 0), 0u);
    const bool is_wrapped = text.rfind("<|im_start|>user\n", 0) == 0;
    if (is_wrapped) {
      ++n_wrapped;
      EXPECT_NE(text.find("<|im_start|>assistant\n"), std::string::npos) << wrapped[i].task_class;
    } else {
      EXPECT_EQ(wrapped[i].input_ids, raw[i].input_ids) << wrapped[i].task_class;
    }
    if (wrapped[i].task_class == "retrieval" || wrapped[i].task_class == "qa") EXPECT_TRUE(is_wrapped) << text.substr(0, 60);
  }
  EXPECT_GT(n_wrapped, 0);
}

TEST(TrainSchedule, TemperatureAndLearningRate) {
  TrainOptions o;
  o.steps = 101;
  EXPECT_NEAR(tau_at(o, 0), 1.5, 1e-12);
  EXPECT_NEAR(tau_at(o, 30), 1.25, 1e-12);  // half-way through the cosine's 60% of steps
  EXPECT_NEAR(tau_at(o, 60), 1.0, 1e-12);
  EXPECT_NEAR(tau_at(o, 100), 1.0, 1e-12);
  o.tau_schedule = "exp";
  EXPECT_NEAR(tau_at(o, 0), 1.5, 1e-12);
  EXPECT_NEAR(tau_at(o, 50), 1.5 * std::exp(-0.3), 1e-12);
  EXPECT_NEAR(tau_at(o, 100), 1.0, 1e-12);
  o.tau_schedule = "linear";
  EXPECT_THROW(tau_at(o, 3), std::invalid_argument);
  o.steps = 100;  // 20 warmup steps, then cosine to 0
  EXPECT_NEAR(lr_at(o, 0, 1.0), 0.05, 1e-12);
  EXPECT_NEAR(lr_at(o, 19, 1.0), 1.0, 1e-12);
  EXPECT_NEAR(lr_at(o, 20, 1.0), 1.0, 1e-12);
  EXPECT_NEAR(lr_at(o, 60, 1.0), 0.5, 1e-12);
  EXPECT_LT(lr_at(o, 99, 1.0), 0.01);
}

TEST(RouterFile, RoundTripAndMismatch) {
  Model m = Model::load(fixture());
  RouterSpec s = spec_for(m);
  s.sigmoid = true;
  s.sparse_mode = HeadMode::XAttn;
  s.targets = {{"qa", 0.7}};
  Router r = Router::init(s, 5);
  const std::string d = elastic::testing::temp_dir("router_file");
  r.save(d + "/r.safetensors");
  Router back = Router::load(d + "/r.safetensors", m.config);
  EXPECT_EQ(back.params, r.params);
  EXPECT_TRUE(back.spec.sigmoid);
  EXPECT_EQ(back.spec.sparse_mode, HeadMode::XAttn);
  EXPECT_EQ(back.spec.sparse.local, 64);
  EXPECT_EQ(back.spec.targets.at("qa"), 0.7);
  EXPECT_EQ(back.spec.input, RouterInput::Pooled);
  // The learned-static control's input is kept by the file; a file with an unknown input is refused by name.
  s.input = RouterInput::HeadIdentity;
  Router::init(s, 5).save(d + "/static.safetensors");
  EXPECT_EQ(Router::load(d + "/static.safetensors", m.config).spec.input, RouterInput::HeadIdentity);
  EXPECT_THROW(parse_router_input("constant"), std::invalid_argument);
  // Another model's shape is refused with a clear error.
  Model other = Model::load(fixture("llama_tiny"));
  try {
    Router::load(d + "/r.safetensors", other.config);
    FAIL() << "expected a throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("router is for 2 layers x 2 KV heads x head_dim 32"), std::string::npos)
        << e.what();
  }
  // Same shapes, other backbone: refused by the fingerprint.
  ModelConfig c2 = m.config;
  c2.vocab = 1024;
  EXPECT_THROW(Router::load(d + "/r.safetensors", c2), std::runtime_error);
  // A file that is not a router.
  EXPECT_THROW(Router::load(fixture() + "/model.safetensors", m.config), std::runtime_error);
}

namespace {
// The fixture model prefilled unrouted under `routing` (in chunks of `chunk`, capacity 120) gives `routed`'s logits;
// returns that cache's bytes.
size_t expect_unrouted_prefill_equal(const std::vector<int32_t>& prompt, const RoutingTable& routing,
                                     const std::vector<float>& routed, int chunk = 32) {
  Model plain = Model::load(fixture());
  KVCache pc;
  pc.init(plain.config, 120, &routing);
  std::vector<float> ref;
  plain.prefill(prompt.data(), static_cast<int>(prompt.size()), chunk, pc, ref, true);
  EXPECT_EQ(routed.size(), ref.size());
  for (size_t i = 0; i < ref.size() && i < routed.size(); ++i) {
    EXPECT_NEAR(routed[i], ref[i], 1e-5f * (1 + std::abs(ref[i]))) << i;
    if (std::abs(routed[i] - ref[i]) > 1e-5f * (1 + std::abs(ref[i]))) break;  // one report, not thousands
  }
  return pc.bytes();
}
}  // namespace

TEST(RouterInference, RoutedPrefillEqualsPrefillUnderItsRouting) {
  Model m = Model::load(fixture());
  RouterSpec s = spec_for(m);
  auto r = std::make_shared<Router>(Router::init(s, 9));
  // Bias the last layer so the decisions are mixed across heads.
  std::vector<int32_t> prompt(100);
  for (int i = 0; i < 100; ++i) prompt[i] = (i * 53 + 7) % m.config.vocab;
  KVCache rc;
  rc.init_deferred(m.config, 120);
  std::vector<float> routed;
  AttentionStats st;
  m.prefill(prompt.data(), 100, 32, rc, routed, true, &st, r.get());
  ASSERT_EQ(rc.routing.n_layers, m.config.n_layers);
  EXPECT_EQ(rc.bytes(), expect_unrouted_prefill_equal(prompt, rc.routing, routed));
  // generate() with the router: decode follows the prompt's routing and reports it.
  GenerateStats gs;
  auto out = generate(m, RoutePolicy::routed(r), prompt, 5, 0, SamplerParams{}, false, &gs);
  EXPECT_EQ(out.size(), 5u);
  EXPECT_EQ(gs.routing.mode, rc.routing.mode);
}

// The paper's three configurations: names both ways, kept by the router file, and the dense class decides what a
// kept head runs. The same router weights under XA-SSA route exactly the heads FA-SSA keeps full to XAttention, and
// the routed prefill equals the unrouted one under that routing.
TEST(RouterConfig, ThreeConfigurationsRouteTheirDenseClass) {
  for (const char* name : {"fa-ssa", "fa-xa", "xa-ssa"}) {
    HeadMode d = HeadMode::Full, sp = HeadMode::Full;
    parse_router_config(name, d, sp);
    EXPECT_EQ(router_config_name(d, sp), name);
  }
  HeadMode d, sp;
  EXPECT_THROW(parse_router_config("xa-xa", d, sp), std::invalid_argument);
  EXPECT_THROW(router_config_name(HeadMode::Streaming, HeadMode::Full), std::invalid_argument);

  Model m = Model::load(fixture());
  RouterSpec s = spec_for(m);
  s.sparse.xattn.block = s.sparse.block;
  const std::string dir = elastic::testing::temp_dir("router_config");
  std::vector<int32_t> prompt(100);
  for (int i = 0; i < 100; ++i) prompt[i] = (i * 53 + 7) % m.config.vocab;
  // Router weights whose FA-SSA decisions on this prompt are mixed (both classes appear): the first such seed.
  auto fa_decisions = [&](uint64_t seed) {
    const Router r = Router::init(s, seed);
    KVCache rc;
    rc.init_deferred(m.config, 120);
    std::vector<float> lg;
    m.prefill(prompt.data(), 100, 32, rc, lg, false, nullptr, &r);
    return rc.routing.mode;
  };
  uint64_t seed = 1;
  for (; seed < 200; ++seed) {
    const std::vector<HeadMode> md = fa_decisions(seed);
    if (std::count(md.begin(), md.end(), HeadMode::Full) && std::count(md.begin(), md.end(), HeadMode::Streaming)) break;
  }
  ASSERT_LT(seed, 200u) << "no router seed gives mixed decisions on this prompt";
  std::vector<HeadMode> fa_modes;
  for (const char* name : {"fa-ssa", "xa-ssa"}) {
    SCOPED_TRACE(name);
    parse_router_config(name, s.dense_mode, s.sparse_mode);
    Router r0 = Router::init(s, seed);  // the same weights for both configurations
    r0.save(dir + "/" + name + ".safetensors");
    auto r = std::make_shared<Router>(Router::load(dir + "/" + name + ".safetensors", m.config));
    EXPECT_EQ(r->spec.dense_mode, s.dense_mode);
    EXPECT_EQ(r->spec.sparse_mode, s.sparse_mode);
    KVCache rc;
    rc.init_deferred(m.config, 120);
    std::vector<float> routed;
    if (r->spec.dense_mode == HeadMode::XAttn) {  // XAttention heads need chunks of whole blocks (64 here)
      KVCache bad;
      bad.init_deferred(m.config, 120);
      EXPECT_THROW(m.prefill(prompt.data(), 100, 32, bad, routed, true, nullptr, r.get()), std::invalid_argument);
    }
    m.prefill(prompt.data(), 100, 64, rc, routed, true, nullptr, r.get());
    if (fa_modes.empty()) {
      fa_modes = rc.routing.mode;
    } else {
      for (size_t i = 0; i < fa_modes.size(); ++i)
        EXPECT_EQ(rc.routing.mode[i], fa_modes[i] == HeadMode::Full ? HeadMode::XAttn : HeadMode::Streaming) << i;
    }
    expect_unrouted_prefill_equal(prompt, rc.routing, routed, 64);
  }
}

namespace {

// Greedy continuation of `prompt` under a routing (n tokens).
std::vector<int32_t> continuation(const Model& m, const std::vector<int32_t>& prompt, int n, const RoutingTable& r) {
  KVCache c;
  c.init(m.config, static_cast<int>(prompt.size()) + n, &r);
  std::vector<float> lg;
  m.forward(prompt.data(), static_cast<int>(prompt.size()), c, lg, false, nullptr, nullptr, true);
  std::vector<int32_t> out;
  Sampler greedy(SamplerParams{});
  for (int i = 0; i < n; ++i) {
    out.push_back(greedy.sample(lg.data(), m.config.vocab));
    if (i + 1 < n) m.forward(&out.back(), 1, c, lg, false);
  }
  return out;
}

double answer_loss(const Model& m, const std::vector<TrainExample>& data, const RoutingTable& r) {
  double total = 0;
  for (const TrainExample& e : data) {
    std::vector<int32_t> ids = e.input_ids;
    ids.insert(ids.end(), e.output_ids.begin(), e.output_ids.end());
    KVCache c;
    c.init(m.config, static_cast<int>(ids.size()));
    c.routing = r;  // every position kept, attention masked by r (as the trainer's forward)
    std::vector<float> lg;
    m.forward(ids.data(), static_cast<int>(ids.size()), c, lg, true, nullptr, nullptr, true);
    for (size_t t = e.input_ids.size() - 1; t + 1 < ids.size(); ++t)
      total += train::cross_entropy_row<float>(lg.data() + t * m.config.vocab, m.config.vocab, ids[t + 1], 1.f, nullptr);
  }
  return total / data.size();
}

}  // namespace

// One head (layer 0, KV head 0) carries almost all of the attention output and reads far back; the other heads are
// nearly silent. Sensitive samples (target Omega 0.75 = one head of four full) are answered by the full model, robust
// ones (target 1.0) by the all-sparse model. The router must keep exactly the head that brute force finds best for
// sensitive prompts, and route robust prompts all-sparse.
// The pooling window and the shapes a router is built from are bounded, so pool_first + pool_last and the MLP's
// parameter count cannot overflow (a router file or --pool of INT_MAX used to be taken as is).
TEST(RouterFile, SpecBoundsNameTheField) {
  Model m = Model::load(fixture());
  auto error = [&](const std::function<void(RouterSpec&)>& edit) {
    RouterSpec s = spec_for(m);
    edit(s);
    try {
      validate_router_spec(s, "r.safetensors");
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error([](RouterSpec&) {}), "");
  const int big = std::numeric_limits<int>::max();
  EXPECT_NE(error([&](RouterSpec& s) { s.pool_first = big; }).find("r.safetensors: router pool_first 2147483647"),
            std::string::npos);
  EXPECT_NE(error([&](RouterSpec& s) { s.pool_first = s.pool_last = big; }).find("pool_first"), std::string::npos);
  EXPECT_NE(error([](RouterSpec& s) { s.pool_last = -1; }).find("pool_last -1"), std::string::npos);
  EXPECT_NE(error([](RouterSpec& s) { s.pool_first = s.pool_last = 0; }).find("pooling window is empty"),
            std::string::npos);
  EXPECT_NE(error([](RouterSpec& s) { s.head_dim = 1 << 20; }).find("head_dim"), std::string::npos);
  EXPECT_NE(error([](RouterSpec& s) { s.sparse_mode = HeadMode::Full; }).find("is not one of fa-ssa, fa-xa, xa-ssa"),
            std::string::npos);
  EXPECT_NE(error([](RouterSpec& s) { s.dense_mode = HeadMode::Streaming; }).find("dense ssa"), std::string::npos);
  EXPECT_NE(error([](RouterSpec& s) { s.dense_mode = s.sparse_mode = HeadMode::XAttn; }).find("r.safetensors: router"),
            std::string::npos);
  EXPECT_NE(error([](RouterSpec& s) { s.input = RouterInput::HeadIdentity, s.head_dim = 1; })
                .find("head-identity router input needs n_kv_heads (2) <= head_dim (1)"),
            std::string::npos);
  RouterSpec s = spec_for(m);
  s.pool_last = big;
  EXPECT_THROW(Router::init(s, 1), std::runtime_error);
}

// Writes to a full disk fail loudly: the router file (a small one fits the stream's buffer, so the old writer's
// check before the final flush passed) and the per-step training log (its flushes were never checked).
TEST(RouterFile, WritesToAFullDiskThrow) {
  if (access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no /dev/full";
  RouterSpec s;
  s.n_layers = s.n_kv_heads = s.head_dim = 1;
  const Router r = Router::init(s, 1);
  try {
    r.save("/dev/full");
    ADD_FAILURE() << "router saved to /dev/full";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/full: cannot write safetensors file"), std::string::npos) << e.what();
  }
  Model m = Model::load(fixture());
  std::vector<TrainExample> data(2);
  for (int i = 0; i < 2; ++i) {
    data[i].task_class = "qa";
    for (int t = 0; t < 40; ++t) data[i].input_ids.push_back((t * 7 + i) % m.config.vocab);
    data[i].output_ids = {1, 2};
  }
  TrainOptions o;
  o.steps = 2;
  o.batch = 1;
  o.max_len = 64;
  o.targets = {{"qa", 0.5}};
  o.spec.pool_first = o.spec.pool_last = 8;
  o.spec.sparse.sink = 0;
  o.spec.sparse.local = 64;
  o.log_jsonl = "/dev/full";
  try {
    train_router(m, data, o, {});
    ADD_FAILURE() << "training log written to /dev/full";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/full: cannot write training log"), std::string::npos) << e.what();
  }
}

TEST(TrainRouter, FindsTheKnownRouting) {
  Model m = Model::load(fixture());
  const ModelConfig& c = m.config;
  const int hd = c.head_dim, group = c.n_heads / c.n_kv_heads;
  for (int l = 0; l < c.n_layers; ++l)
    for (int h = 0; h < c.n_heads; ++h) {
      const float f = (l == 0 && h / group == 0) ? 4.f : 0.1f;
      for (int r = 0; r < c.hidden; ++r)
        for (int d = 0; d < hd; ++d) m.weights.layers[l].wo.f32()[static_cast<size_t>(r) * c.n_heads * hd + h * hd + d] *= f;
    }
  RouterSpec spec = spec_for(m);
  RoutingTable full = RoutingTable::all_full(c.n_layers, c.n_kv_heads), sparse = full;
  for (auto& x : sparse.mode) x = HeadMode::Streaming;
  full.sparse = sparse.sparse = spec.sparse;
  std::mt19937_64 rng(21);
  auto make = [&](const std::string& cls, int lo, int n) {
    std::vector<TrainExample> v;
    for (int i = 0; i < n; ++i) {
      TrainExample e;
      e.task_class = cls;
      for (int t = 0; t < 100; ++t) e.input_ids.push_back(lo + static_cast<int>(rng() % 256));
      e.output_ids = continuation(m, e.input_ids, 6, cls == "qa" ? full : sparse);
      v.push_back(std::move(e));
    }
    return v;
  };
  auto qa = make("qa", 0, 24), code = make("code", 256, 24);
  // Brute force over the routings with exactly one full head.
  int best = -1;
  double best_loss = 1e30;
  for (size_t i = 0; i < sparse.mode.size(); ++i) {
    RoutingTable r = sparse;
    r.mode[i] = HeadMode::Full;
    const double loss = answer_loss(m, qa, r);
    if (loss < best_loss) best_loss = loss, best = static_cast<int>(i);
  }
  ASSERT_EQ(best, 0) << "the amplified head should be the one that matters";

  std::vector<TrainExample> data = qa;
  data.insert(data.end(), code.begin(), code.end());
  TrainOptions o;
  o.steps = 200;
  o.batch = 4;
  o.max_len = 128;
  o.lr = 5e-3;  // a tiny model and few steps: larger than the paper's 5e-4
  o.multiplier_lr = 3e-2;
  o.spec = spec;
  o.targets = {{"qa", 0.75}, {"code", 1.0}};
  o.seed = 5;  // also passes with seeds 6 and 7 (seed 4: 7 of 10 held-out prompts)
  std::vector<StepLog> logs;
  Router r = train_router(m, data, o, [&](const StepLog& s) { logs.push_back(s); });
  ASSERT_EQ(logs.size(), 200u);
  // A freshly initialised router's logits are near 0: most gates start open (in play for the gradient).
  EXPECT_GT(logs.front().open, 0.5);
  for (const StepLog& s : logs) ASSERT_TRUE(s.open >= 0.0 && s.open <= 1.0) << "step " << s.step;
  const std::string d = elastic::testing::temp_dir("train_router");
  write_training_plots(logs, d + "/curves");
  EXPECT_TRUE(std::ifstream(d + "/curves_sparsity.svg").good());

  // Held-out prompts of each kind.
  auto fresh_qa = make("qa", 0, 10), fresh_code = make("code", 256, 10);
  int qa_right = 0;
  double code_omega = 0;
  for (auto& e : fresh_qa) {
    KVCache kc;
    kc.init_deferred(c, 100);
    std::vector<float> lg;
    m.prefill(e.input_ids.data(), 100, 100, kc, lg, false, nullptr, &r);
    RoutingTable want = sparse;
    want.mode[0] = HeadMode::Full;
    qa_right += kc.routing.mode == want.mode;
  }
  for (auto& e : fresh_code) {
    KVCache kc;
    kc.init_deferred(c, 100);
    std::vector<float> lg;
    m.prefill(e.input_ids.data(), 100, 100, kc, lg, false, nullptr, &r);
    code_omega += kc.routing.msr() / fresh_code.size();
  }
  EXPECT_GE(qa_right, 8) << "router keeps head (0, 0) full on sensitive prompts";
  EXPECT_GE(code_omega, 0.9) << "router routes robust prompts sparse";

  // The learned-static control (RouterInput::HeadIdentity): the same trainer, data, loss and seed, but one fixed input
  // per head. It can only learn one routing for every prompt: the adaptive router's per-input split is out of its
  // reach, and its file says so.
  o.spec.input = RouterInput::HeadIdentity;
  Router st = train_router(m, data, o);
  st.save(d + "/static.safetensors");
  const Router loaded = Router::load(d + "/static.safetensors", c);
  EXPECT_EQ(loaded.spec.input, RouterInput::HeadIdentity);
  std::vector<HeadMode> first;
  for (auto* set : {&fresh_qa, &fresh_code})
    for (auto& e : *set) {
      KVCache kc;
      kc.init_deferred(c, 100);
      std::vector<float> lg;
      m.prefill(e.input_ids.data(), 100, 100, kc, lg, false, nullptr, &loaded);
      if (first.empty()) first = kc.routing.mode;
      EXPECT_EQ(kc.routing.mode, first) << "a learned-static router routed two prompts differently";
    }
}

// Data-parallel training: N ranks (threads here; processes with NCCL under --gpus N) with the same global batch
// train the same router as one rank, also when the batch does not split evenly.
TEST(TrainRouterDataParallel, RanksEqualOneRankWithTheSameGlobalBatch) {
  Model m = Model::load(std::string(ELASTIC_FIXTURE_DIR) + "/qwen3_tiny");
  std::mt19937_64 rng(3);
  std::vector<TrainExample> data;
  for (int i = 0; i < 10; ++i) {
    TrainExample e;
    e.task_class = i % 2 ? "qa" : "code";
    for (int t = 0; t < 150; ++t) e.input_ids.push_back(static_cast<int32_t>(rng() % m.config.vocab));
    for (int t = 0; t < 5; ++t) e.output_ids.push_back(static_cast<int32_t>(rng() % m.config.vocab));
    data.push_back(std::move(e));
  }
  TrainOptions o;
  o.steps = 4;
  o.batch = 4;
  o.max_len = 128;
  o.lr = 5e-3;
  o.multiplier_lr = 3e-2;
  o.seed = 9;
  o.spec.pool_first = o.spec.pool_last = 16;
  o.spec.sparse.block = 64;
  o.spec.sparse.sink = 0;
  o.spec.sparse.local = 64;
  std::vector<StepLog> one;
  const Router ref = train_router(m, data, o, [&](const StepLog& s) { one.push_back(s); });
  for (int world : {2, 3}) {
    auto group = make_thread_group(world);
    std::vector<Router> out(world);
    std::vector<std::vector<StepLog>> logs(world);
    std::vector<std::thread> th;
    for (int r = 0; r < world; ++r)
      th.emplace_back([&, r] {
        out[r] = train_router(m, data, o, [&, r](const StepLog& s) { logs[r].push_back(s); }, {}, group[r].get());
      });
    for (auto& t : th) t.join();
    ASSERT_EQ(logs[0].size(), one.size()) << world;
    for (int r = 1; r < world; ++r) EXPECT_TRUE(logs[r].empty()) << "only rank 0 logs";
    for (size_t i = 0; i < one.size(); ++i) {
      EXPECT_NEAR(logs[0][i].lm, one[i].lm, 1e-5 * std::abs(one[i].lm)) << world << " ranks, step " << i + 1;
      EXPECT_NEAR(logs[0][i].reg, one[i].reg, 1e-5 + 1e-5 * std::abs(one[i].reg));
      for (auto& [cls, v] : one[i].msr) EXPECT_NEAR(logs[0][i].msr[cls], v, 1e-6) << cls;
      EXPECT_DOUBLE_EQ(logs[0][i].open, one[i].open) << world << " ranks, step " << i + 1;  // counts: exact
    }
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(out[r].params.size(), ref.params.size());
      double num = 0, den = 0;
      for (size_t j = 0; j < ref.params.size(); ++j) {
        num += double(out[r].params[j] - ref.params[j]) * (out[r].params[j] - ref.params[j]);
        den += double(ref.params[j]) * ref.params[j];
      }
      EXPECT_LT(std::sqrt(num / den), 1e-5) << world << " ranks, rank " << r;
      EXPECT_EQ(out[r].params, out[0].params) << "every rank holds the same router";
    }
  }
}

// A learned-static router's one routing (route export): what it decides in a prefill of any prompt, with its sparse
// settings; a router that reads the prompt has none to export.
TEST(RouterExport, LearnedStaticRouterHasOneRouting) {
  Model m = Model::load(fixture());
  RouterSpec hs = spec_for(m);
  hs.input = RouterInput::HeadIdentity;
  auto r = std::make_shared<Router>(Router::init(hs, 11));
  const RoutingTable fixed = r->fixed_routing();
  EXPECT_EQ(fixed.sparse.local, hs.sparse.local);
  std::mt19937_64 rng(3);
  for (int prompt = 0; prompt < 2; ++prompt) {
    std::vector<int32_t> ids(90);
    for (auto& t : ids) t = static_cast<int32_t>(rng() % m.config.vocab);
    KVCache cache;
    cache.init_deferred(m.config, static_cast<int>(ids.size()));
    std::vector<float> logits;
    m.prefill(ids.data(), static_cast<int>(ids.size()), 32, cache, logits, false, nullptr, r.get());
    EXPECT_EQ(cache.routing.mode, fixed.mode) << "prompt " << prompt;
  }
  EXPECT_THROW(Router::init(spec_for(m), 11).fixed_routing(), std::invalid_argument);
}

// The representation analysis: the recorder sees exactly the router's input; two copies of a prompt have cosine 1
// before and after the task MLP, so a set where each task's prompts are copies separates perfectly (within = 1);
// too few prompts are refused.
TEST(RouterFeatures, SeparationOfCopiesAndDistinctTasks) {
  Model m = Model::load(fixture());
  const Router r = Router::init(spec_for(m), 4);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> tasks;
  std::mt19937_64 rng(8);
  for (const char* t : {"a", "b", "c"}) {
    std::vector<int32_t> p(80);
    for (auto& x : p) x = static_cast<int32_t>(rng() % m.config.vocab);
    for (int copy = 0; copy < 2; ++copy) prompts.push_back(p), tasks.push_back(t);
  }
  const FeatureSeparation s = router_feature_separation(m, r, prompts, tasks, 32);
  ASSERT_EQ(s.n_layers, m.config.n_layers);
  EXPECT_EQ(s.prompts, 6);
  for (int l = 0; l < s.n_layers; ++l)
    for (const LayerSeparation* x : {&s.before[l], &s.after[l]}) {
      EXPECT_NEAR(x->within, 1.0, 1e-9);
      EXPECT_LT(x->between, 1.0 - 1e-6);  // distinct random prompts pool to different keys
      EXPECT_GE(x->between, -1.0);
      // Centred, copies still coincide; three equidistant-ish groups around their mean have negative cosines.
      EXPECT_NEAR(x->within_centred, 1.0, 1e-5);
      EXPECT_LT(x->between_centred, 0.0);
      EXPECT_NEAR(x->task_variance_share, 1.0, 1e-5);  // no spread within a task: the task explains it all
    }
  // Unrelated labels: six distinct prompts, labels a a b b c c over a different pairing explain only part of it.
  std::vector<std::vector<int32_t>> mixed = {prompts[0], prompts[2], prompts[4], prompts[1], prompts[3], prompts[5]};
  const FeatureSeparation u = router_feature_separation(m, r, mixed, {"a", "a", "b", "b", "c", "c"}, 32);
  for (int l = 0; l < u.n_layers; ++l) {
    EXPECT_LT(u.before[l].task_variance_share, 0.99);
    EXPECT_GT(u.before[l].task_variance_share, 0.0);
    EXPECT_LT(u.before[l].within_centred, 0.999);
  }
  EXPECT_NE(feature_separation_table(s).find("| 0 | 1.0000 |"), std::string::npos);
  // A learned-static router's task MLP sees one fixed input per head: its output does not vary across prompts, so
  // there is no variance for the task to explain (NaN, not a rounding-noise 1); its input (pooled keys) still varies.
  RouterSpec hs = spec_for(m);
  hs.input = RouterInput::HeadIdentity;
  const FeatureSeparation fixed = router_feature_separation(m, Router::init(hs, 4), prompts, tasks, 32);
  for (int l = 0; l < fixed.n_layers; ++l) {
    EXPECT_TRUE(std::isnan(fixed.after[l].task_variance_share)) << l;
    EXPECT_NEAR(fixed.before[l].task_variance_share, 1.0, 1e-5) << l;
  }
  EXPECT_THROW(router_feature_separation(m, r, {prompts[0], prompts[1]}, {"a", "a"}, 32), std::invalid_argument);
  EXPECT_THROW(router_feature_separation(m, r, prompts, {"a"}, 32), std::invalid_argument);
}
