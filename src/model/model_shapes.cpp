#include "elastic/model_shapes.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <stdexcept>

#include "model/ops.h"

namespace elastic {

const std::vector<std::string>& named_shape_names() {
  static const std::vector<std::string> v = {"qwen3-0.6b", "qwen3-4b", "qwen3-8b", "llama-3.1-8b", "tiny"};
  return v;
}

ModelConfig named_shape(const std::string& name) {
  ModelConfig c;
  c.max_positions = 131072;
  c.rms_eps = 1e-6f;
  c.rope.theta = 1e6;
  c.qk_norm = true;
  c.eos_ids = {151645};
  auto qwen3 = [&](int D, int L, int Hq, int F, bool tied) {
    c.arch = Arch::Qwen3;
    c.hidden = D;
    c.n_layers = L;
    c.n_heads = Hq;
    c.n_kv_heads = 8;
    c.head_dim = 128;
    c.intermediate = F;
    c.vocab = 151936;
    c.tie_embeddings = tied;
  };
  if (name == "qwen3-0.6b") qwen3(1024, 28, 16, 3072, true);
  else if (name == "qwen3-4b") qwen3(2560, 36, 32, 9728, true);
  else if (name == "qwen3-8b") qwen3(4096, 36, 32, 12288, false);
  else if (name == "llama-3.1-8b") {
    c.arch = Arch::Llama;
    c.hidden = 4096;
    c.n_layers = 32;
    c.n_heads = 32;
    c.n_kv_heads = 8;
    c.head_dim = 128;
    c.intermediate = 14336;
    c.vocab = 128256;
    c.rms_eps = 1e-5f;
    c.qk_norm = false;
    c.rope.theta = 500000;
    c.rope.llama3 = true;
    c.rope.factor = 8;
    c.rope.low_freq_factor = 1;
    c.rope.high_freq_factor = 4;
    c.rope.original_max_positions = 8192;
    c.eos_ids = {128001, 128008, 128009};
  } else if (name == "tiny") {
    qwen3(64, 2, 4, 128, true);
    c.n_kv_heads = 2;
    c.head_dim = 32;
    c.vocab = 512;
  } else {
    std::string all;
    for (const auto& n : named_shape_names()) all += (all.empty() ? "" : ", ") + n;
    throw std::runtime_error("unknown model shape '" + name + "' (known: " + all + ")");
  }
  return c;
}

Model random_model(const ModelConfig& c, uint64_t seed) {
  Model m;
  m.config = c;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> N(0.f, 0.02f);
  auto rnd = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = N(rng);
    return v;
  };
  const size_t D = c.hidden, hd = c.head_dim, Hq = c.n_heads, Hkv = c.n_kv_heads, F = c.intermediate, V = c.vocab;
  ModelWeights& w = m.weights;
  w.embed = WeightMatrix::from_f32(rnd(V * D), V, D);
  w.final_norm.assign(D, 1.f);
  if (!c.tie_embeddings) w.lm_head = WeightMatrix::from_f32(rnd(V * D), V, D);
  w.layers.resize(c.n_layers);
  for (LayerWeights& L : w.layers) {
    L.attn_norm.assign(D, 1.f);
    L.wq = WeightMatrix::from_f32(rnd(Hq * hd * D), Hq * hd, D);
    L.wk = WeightMatrix::from_f32(rnd(Hkv * hd * D), Hkv * hd, D);
    L.wv = WeightMatrix::from_f32(rnd(Hkv * hd * D), Hkv * hd, D);
    L.wo = WeightMatrix::from_f32(rnd(D * Hq * hd), D, Hq * hd);
    if (c.qk_norm) {
      L.q_norm.assign(hd, 1.f);
      L.k_norm.assign(hd, 1.f);
    }
    L.mlp_norm.assign(D, 1.f);
    L.w_gate = WeightMatrix::from_f32(rnd(F * D), F, D);
    L.w_up = WeightMatrix::from_f32(rnd(F * D), F, D);
    L.w_down = WeightMatrix::from_f32(rnd(D * F), D, F);
  }
  m.rope_inv_freq = compute_rope_inv_freq(c);
  return m;
}

RoutingTable random_routing(int n_layers, int n_kv_heads, double omega, HeadMode sparse_mode, uint64_t seed) {
  if (!(omega >= 0 && omega <= 1)) throw std::invalid_argument("random_routing: omega must be in [0, 1]");
  RoutingTable r = RoutingTable::all_full(n_layers, n_kv_heads);
  std::vector<size_t> idx(r.mode.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(idx.begin(), idx.end(), rng);
  const size_t n_sparse = static_cast<size_t>(omega * idx.size() + 0.5);
  for (size_t i = 0; i < n_sparse; ++i) r.mode[idx[i]] = sparse_mode;
  return r;
}

}  // namespace elastic
