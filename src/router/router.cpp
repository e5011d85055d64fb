#include "elastic/router.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "router/router_mlp.h"

namespace elastic {

std::string model_fingerprint(const ModelConfig& c) {
  return std::string("arch=") + arch_name(c.arch) + " L=" + std::to_string(c.n_layers) + " D=" +
         std::to_string(c.hidden) + " Hq=" + std::to_string(c.n_heads) + " Hkv=" + std::to_string(c.n_kv_heads) +
         " hd=" + std::to_string(c.head_dim) + " V=" + std::to_string(c.vocab);
}

size_t Router::layer_size() const { return router::layer_param_count(spec.head_dim, spec.classes()); }

Router Router::init(const RouterSpec& spec, uint64_t seed) {
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
  router::mlp_fwd<float>(this->layer(layer), spec.head_dim, spec.classes(), pooled, spec.n_kv_heads, out, nullptr);
}

void Router::decide(int layer, const float* pooled, HeadMode* modes) const {
  const int C = spec.classes();
  std::vector<float> lg(static_cast<size_t>(spec.n_kv_heads) * C);
  logits(layer, pooled, lg.data());
  for (int h = 0; h < spec.n_kv_heads; ++h)
    modes[h] = router::gate_full(lg.data() + static_cast<size_t>(h) * C, C) ? HeadMode::Full : spec.sparse_mode;
}

}  // namespace elastic
