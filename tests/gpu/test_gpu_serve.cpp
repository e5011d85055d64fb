// GPU test (label "gpu"): `serve --device cuda`: the server runs requests on the GPU model through its
// SequenceBackend, one at a time. Token-id prompts on a small random model (no tokenizer): the answer has the
// length greedy generation on the same GPU model gives, the routing and cache figures of the request, and a second
// request after the first reuses the device model.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <random>

#include <nlohmann/json.hpp>

#include "elastic/engine.h"
#include "elastic/cuda.h"
#include "elastic/gpu_model.h"
#include "elastic/server.h"
#include "gpu_test_models.h"
#include "gpu_test_util.h"

using namespace elastic;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

TEST(GpuServe, RequestsRunOnTheGpuModel) {
  SKIP_WITHOUT_GPU();
  TRACED_SEED(seed);
  Model m = gpu_test::make_model(false, seed);
  m.config.eos_ids.clear();  // every request runs to max_tokens
  RoutingTable r = RoutingTable::all_full(m.config.n_layers, m.config.n_kv_heads);
  r.sparse.block = 64, r.sparse.sink = 64, r.sparse.local = 128;
  for (size_t i = 0; i < r.mode.size(); i += 2) r.mode[i] = HeadMode::Streaming;
  cuda::GpuOptions go;
  go.max_ctx = 512;
  auto g = cuda::GpuModel::upload(m, go);
  const std::string dir = (fs::temp_directory_path() / ("elastic_gpu_serve_" + std::to_string(seed))).string();
  fs::create_directories(dir);
  ServerOptions o;
  o.policy = RoutePolicy::fixed(r);
  o.port = 0;
  o.max_slots = 1;
  o.max_context = 512;
  o.backend = cuda::gpu_sequence_backend(*g);
  Server srv(m, dir, o);
  srv.start();
  httplib::Client c("127.0.0.1", srv.port());
  c.set_read_timeout(120, 0);
  std::mt19937 rng(static_cast<unsigned>(seed));
  std::vector<int32_t> prompt(300);
  for (auto& id : prompt) id = static_cast<int32_t>(rng() % m.config.vocab);
  for (int req = 0; req < 2; ++req) {
    auto res = c.Post("/v1/completions",
                      json{{"prompt", prompt}, {"max_tokens", 16}, {"temperature", 0}}.dump(), "application/json");
    ASSERT_TRUE(res) << httplib::to_string(res.error());
    ASSERT_EQ(res->status, 200) << res->body;
    const json j = json::parse(res->body);
    EXPECT_EQ(j["usage"]["prompt_tokens"], 300);
    EXPECT_EQ(j["usage"]["completion_tokens"], 16);
    EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
    EXPECT_DOUBLE_EQ(j["elastic"]["omega_msr"].get<double>(), r.msr());
    EXPECT_GT(j["elastic"]["kv_cache_bytes"].get<size_t>(), 0u);
    EXPECT_GT(j["elastic"]["attention_flops_ratio"].get<double>(), 0.0);
    EXPECT_LT(j["elastic"]["attention_flops_ratio"].get<double>(), 1.0);  // half the heads streaming
  }
  srv.stop();
  // The device model is free again: greedy generation on it runs the same 16 steps.
  const auto out = generate(*cuda::gpu_sequence_backend(*g), g->config(), prompt, 16, &r, nullptr, SamplerParams{}, false,
                            nullptr);
  EXPECT_EQ(out.size(), 16u);
  fs::remove_all(dir);
}

}  // namespace
