#include "elastic/model.h"

#include "model/ops.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <stdexcept>

namespace elastic {
void KVCache::init(const ModelConfig& cfg, int cap, const RoutingTable* hybrid) {
  n_layers = cfg.n_layers;
  n_kv_heads = cfg.n_kv_heads;
  head_dim = cfg.head_dim;
  capacity = cap;
  length = 0;
  const size_t n = static_cast<size_t>(n_layers) * n_kv_heads;
  k.assign(n, {});
  v.assign(n, {});
  sink_slots.assign(n, 0);
  ring_slots.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    int slots = cap;
    if (hybrid && hybrid->mode[i] == HeadMode::Streaming) {
      const SparseSettings& s = hybrid->sparse;
      const int sink = (s.sink + s.block - 1) / s.block * s.block;
      const int ring = std::max(1, (s.local + s.block - 1) / s.block) * s.block;
      if (sink + ring < cap) {
        sink_slots[i] = sink;
        ring_slots[i] = ring;
        slots = sink + ring;
      }
    }
    k[i].assign(static_cast<size_t>(slots) * head_dim, 0.f);
    v[i].assign(static_cast<size_t>(slots) * head_dim, 0.f);
  }
}

size_t KVCache::bytes() const {
  size_t b = 0;
  for (auto& x : k) b += x.size() * sizeof(float);
  for (auto& x : v) b += x.size() * sizeof(float);
  return b;
}

Model Model::load(const std::string& model_dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(model_dir)) throw std::runtime_error(model_dir + ": model folder not found");
  Model m;
  m.config = load_config((fs::path(model_dir) / "config.json").string());
  m.weights = load_weights(m.config, model_dir);
  m.routing = RoutingTable::all_full(m.config.n_layers, m.config.n_kv_heads);
  m.rope_inv_freq = compute_rope_inv_freq(m.config);
  return m;
}

void Model::forward(const int32_t* ids, int T, KVCache& cache, std::vector<float>& logits, bool all_logits,
                    AttentionStats* stats, std::vector<std::vector<float>>* last_row_probs, bool prefill,
                    const RoutingTable* routing_override) const {
  const ModelConfig& c = config;
  const RoutingTable& routing = routing_override ? *routing_override : this->routing;
  if (routing.n_layers != c.n_layers || routing.n_kv_heads != c.n_kv_heads ||
      routing.mode.size() != static_cast<size_t>(c.n_layers) * c.n_kv_heads)
    throw std::invalid_argument("forward: routing table is " + std::to_string(routing.n_layers) + " x " +
                                std::to_string(routing.n_kv_heads) + ", the model has " + std::to_string(c.n_layers) +
                                " layers x " + std::to_string(c.n_kv_heads) + " KV heads");
  const int D = c.hidden, hd = c.head_dim, Hq = c.n_heads, Hkv = c.n_kv_heads, F = c.intermediate, V = c.vocab;
  const int pos0 = cache.length;
  if (T <= 0) throw std::invalid_argument("forward: no tokens");
  if (pos0 + T > cache.capacity)
    throw std::runtime_error("context overflow: " + std::to_string(pos0 + T) + " tokens exceed the KV cache capacity " +
                             std::to_string(cache.capacity) + " (raise -c)");
  for (int t = 0; t < T; ++t)
    if (ids[t] < 0 || ids[t] >= V)
      throw std::runtime_error("token id " + std::to_string(ids[t]) + " at position " + std::to_string(t) +
                               " is outside the vocabulary [0, " + std::to_string(V) + ")");
  const std::vector<float>& inv = rope_inv_freq;

  // Activation plan for this call: residual x, normed h, q/k/v, attention out, MLP gate/up.
  std::vector<float> x(static_cast<size_t>(T) * D), h(x.size()), q(static_cast<size_t>(T) * Hq * hd),
      k(static_cast<size_t>(T) * Hkv * hd), v(k.size()), att(q.size()), o(x.size()),
      g(static_cast<size_t>(T) * F), u(g.size());
  for (int t = 0; t < T; ++t)
    std::copy_n(weights.embed.data() + static_cast<size_t>(ids[t]) * D, D, x.data() + static_cast<size_t>(t) * D);

  std::vector<HeadKV> kv(Hkv);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = weights.layers[l];
    rmsnorm_rows(x.data(), L.attn_norm.data(), h.data(), T, D, c.rms_eps);
    linear(h.data(), L.wq.data(), L.bq, q.data(), T, Hq * hd, D);
    linear(h.data(), L.wk.data(), L.bk, k.data(), T, Hkv * hd, D);
    linear(h.data(), L.wv.data(), L.bv, v.data(), T, Hkv * hd, D);
    if (c.qk_norm) {
      rmsnorm_rows(q.data(), L.q_norm.data(), q.data(), T * Hq, hd, c.rms_eps);
      rmsnorm_rows(k.data(), L.k_norm.data(), k.data(), T * Hkv, hd, c.rms_eps);
    }
    apply_rope(q.data(), T, Hq, hd, pos0, inv);
    apply_rope(k.data(), T, Hkv, hd, pos0, inv);
    for (int kh = 0; kh < Hkv; ++kh) {
      const size_t ci = static_cast<size_t>(l) * Hkv + kh;
      HeadKV& e = kv[kh];
      e.k_cache = cache.k[ci].data();
      e.v_cache = cache.v[ci].data();
      e.sink_slots = cache.sink_slots[ci];
      e.ring_slots = cache.ring_slots[ci];
      // A ring cache holds only a streaming head's window: any other mode would read overwritten keys.
      if (e.ring_slots && routing.at(l, kh) != HeadMode::Streaming)
        throw std::runtime_error("KV cache was built for another routing: layer " + std::to_string(l) + " KV head " +
                                 std::to_string(kh) + " has a streaming window cache but is routed " +
                                 head_mode_name(routing.at(l, kh)));
      e.k_new = k.data() + static_cast<size_t>(kh) * hd;
      e.v_new = v.data() + static_cast<size_t>(kh) * hd;
      e.new_stride = Hkv * hd;
      e.pos0 = pos0;
      e.hd = hd;
    }
    AttentionArgs a;
    a.q = q.data();
    a.kv = kv.data();
    a.out = att.data();
    a.T = T;
    a.pos0 = pos0;
    a.n_heads = Hq;
    a.n_kv_heads = Hkv;
    a.head_dim = hd;
    a.modes = routing.mode.data() + static_cast<size_t>(l) * Hkv;
    a.sparse = &routing.sparse;
    a.stats = stats;
    a.track_esr = stats && l == c.n_layers - 1;
    a.prefill = prefill || T > 1;
    if (last_row_probs) {
      last_row_probs->resize(c.n_layers);
      (*last_row_probs)[l].assign(static_cast<size_t>(Hq) * (pos0 + T), 0.f);
      a.last_row_probs = (*last_row_probs)[l].data();
    }
    attention_forward(a);
    // Append this call's keys/values after attention (a streaming head's ring may reuse slots read above).
    for (int kh = 0; kh < Hkv; ++kh) {
      const size_t ci = static_cast<size_t>(l) * Hkv + kh;
      for (int t = 0; t < T; ++t) {
        const size_t slot = kv[kh].slot(pos0 + t);
        std::copy_n(k.data() + (static_cast<size_t>(t) * Hkv + kh) * hd, hd, cache.k[ci].data() + slot * hd);
        std::copy_n(v.data() + (static_cast<size_t>(t) * Hkv + kh) * hd, hd, cache.v[ci].data() + slot * hd);
      }
    }
    linear(att.data(), L.wo.data(), {}, o.data(), T, D, Hq * hd);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];

    rmsnorm_rows(x.data(), L.mlp_norm.data(), h.data(), T, D, c.rms_eps);
    linear(h.data(), L.w_gate.data(), {}, g.data(), T, F, D);
    linear(h.data(), L.w_up.data(), {}, u.data(), T, F, D);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];  // SwiGLU
    linear(g.data(), L.w_down.data(), {}, o.data(), T, D, F);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
  }
  cache.length = pos0 + T;

  const int rows = all_logits ? T : 1;
  const float* xs = x.data() + static_cast<size_t>(all_logits ? 0 : T - 1) * D;
  rmsnorm_rows(xs, weights.final_norm.data(), h.data(), rows, D, c.rms_eps);
  logits.resize(static_cast<size_t>(rows) * V);
  linear(h.data(), weights.head(), {}, logits.data(), rows, V, D);
}

}  // namespace elastic

namespace elastic {

void Model::prefill(const int32_t* ids, int T, int chunk, KVCache& cache, std::vector<float>& logits, bool all_logits,
                    AttentionStats* stats, const RoutingTable* routing_override) const {
  if (chunk <= 0) throw std::invalid_argument("prefill: chunk size must be positive");
  std::vector<float> part;
  if (all_logits) logits.clear();
  for (int t0 = 0; t0 < T; t0 += chunk) {
    const int n = std::min(chunk, T - t0);
    forward(ids + t0, n, cache, part, all_logits, stats, nullptr, true, routing_override);
    if (all_logits) logits.insert(logits.end(), part.begin(), part.end());
  }
  if (!all_logits) logits.swap(part);
}

}  // namespace elastic
