#include "elastic/router.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>

#include "router/router_mlp.h"

namespace elastic {

std::string model_fingerprint(const ModelConfig& c) {
  return std::string("arch=") + arch_name(c.arch) + " L=" + std::to_string(c.n_layers) + " D=" +
         std::to_string(c.hidden) + " Hq=" + std::to_string(c.n_heads) + " Hkv=" + std::to_string(c.n_kv_heads) +
         " hd=" + std::to_string(c.head_dim) + " V=" + std::to_string(c.vocab);
}

void validate_router_spec(const RouterSpec& s, const std::string& src) {
  auto check = [&](const char* what, int v, int lo, int hi) {
    if (v < lo || v > hi)
      throw std::runtime_error(src + ": router " + what + " " + std::to_string(v) + " is not in [" +
                               std::to_string(lo) + ", " + std::to_string(hi) + "]");
  };
  check("n_layers", s.n_layers, 1, 4096);
  check("n_kv_heads", s.n_kv_heads, 1, 4096);
  check("head_dim", s.head_dim, 1, 4096);
  check("pool_first", s.pool_first, 0, kMaxSparseWindow);
  check("pool_last", s.pool_last, 0, kMaxSparseWindow);
  if (s.pool_first == 0 && s.pool_last == 0) throw std::runtime_error(src + ": router pooling window is empty");
  if (s.input == RouterInput::HeadIdentity && s.n_kv_heads > s.head_dim)
    throw std::runtime_error(src + ": the head-identity router input needs n_kv_heads (" + std::to_string(s.n_kv_heads) +
                             ") <= head_dim (" + std::to_string(s.head_dim) + ")");
  try {
    (void)router_config_name(s.dense_mode, s.sparse_mode);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(src + ": router " + e.what());
  }
}

const char* router_input_name(RouterInput in) { return in == RouterInput::Pooled ? "pooled" : "head-identity"; }

RouterInput parse_router_input(const std::string& s) {
  if (s == "pooled") return RouterInput::Pooled;
  if (s == "head-identity") return RouterInput::HeadIdentity;
  throw std::invalid_argument("router input '" + s + "' is not one of pooled, head-identity");
}

std::string router_config_name(HeadMode dense_mode, HeadMode sparse_mode) {
  if (dense_mode == HeadMode::Full && sparse_mode == HeadMode::Streaming) return "fa-ssa";
  if (dense_mode == HeadMode::Full && sparse_mode == HeadMode::XAttn) return "fa-xa";
  if (dense_mode == HeadMode::XAttn && sparse_mode == HeadMode::Streaming) return "xa-ssa";
  throw std::invalid_argument(std::string("configuration (dense ") + head_mode_name(dense_mode) + ", sparse " +
                              head_mode_name(sparse_mode) + ") is not one of fa-ssa, fa-xa, xa-ssa");
}

void parse_router_config(const std::string& name, HeadMode& dense_mode, HeadMode& sparse_mode) {
  if (name == "fa-ssa") dense_mode = HeadMode::Full, sparse_mode = HeadMode::Streaming;
  else if (name == "fa-xa") dense_mode = HeadMode::Full, sparse_mode = HeadMode::XAttn;
  else if (name == "xa-ssa") dense_mode = HeadMode::XAttn, sparse_mode = HeadMode::Streaming;
  else throw std::invalid_argument("router configuration '" + name + "' is not one of fa-ssa, fa-xa, xa-ssa");
}

size_t Router::layer_size() const { return router::layer_param_count(spec.head_dim, spec.classes()); }

Router Router::init(const RouterSpec& spec, uint64_t seed) {
  validate_router_spec(spec, "router init");
  Router r;
  r.spec = spec;
  const int d = spec.head_dim, C = spec.classes(), d4 = 4 * d;
  r.params.resize(r.layer_size() * spec.n_layers);
  std::mt19937_64 rng(seed);
  // (rows, fan_in) of the five linears, weights then biases, in layout order.
  const int shapes[5][2] = {{d4, d}, {d, d4}, {d4, d}, {d, d4}, {C, d}};
  for (int l = 0; l < spec.n_layers; ++l) {
    float* p = r.layer(l);
    for (auto& s : shapes) {
      std::uniform_real_distribution<float> u(-1.f / std::sqrt(float(s[1])), 1.f / std::sqrt(float(s[1])));
      for (int i = 0; i < s[0] * s[1] + s[0]; ++i) *p++ = u(rng);
    }
  }
  return r;
}

void Router::logits(int layer, const float* pooled, float* out) const {
  std::vector<float> x(pooled, pooled + static_cast<size_t>(spec.n_kv_heads) * spec.head_dim);
  router::apply_router_input(spec.input, spec.n_kv_heads, spec.head_dim, x.data());
  router::mlp_fwd<float>(this->layer(layer), spec.head_dim, spec.classes(), x.data(), spec.n_kv_heads, out, nullptr);
}

void Router::decide(int layer, const float* pooled, HeadMode* modes) const {
  const int C = spec.classes();
  std::vector<float> lg(static_cast<size_t>(spec.n_kv_heads) * C);
  logits(layer, pooled, lg.data());
  for (int h = 0; h < spec.n_kv_heads; ++h)
    modes[h] = router::gate_full(lg.data() + static_cast<size_t>(h) * C, C) ? spec.dense_mode : spec.sparse_mode;
}

RoutingTable Router::fixed_routing() const {
  if (spec.input != RouterInput::HeadIdentity)
    throw std::invalid_argument("this router reads the prompt (input: pooled keys), so its routing differs per prompt; "
                                "only a learned-static router (train-router --router-input head-identity) has one "
                                "routing to export");
  RoutingTable r = RoutingTable::all_full(spec.n_layers, spec.n_kv_heads);
  r.sparse = spec.sparse;
  const std::vector<float> unused(static_cast<size_t>(spec.n_kv_heads) * spec.head_dim, 0.f);  // input replaced
  for (int l = 0; l < spec.n_layers; ++l) decide(l, unused.data(), r.mode.data() + static_cast<size_t>(l) * spec.n_kv_heads);
  return r;
}

}  // namespace elastic
