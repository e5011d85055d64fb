#include "elastic/sparse_pattern.h"
#include "elastic/model.h"

#include "model/cached_attention.h"
#include "model/cpu_layer.h"
#include "router/router_mlp.h"
#include "model/ops.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <stdexcept>

namespace elastic {

std::vector<int> boundary_positions(int P, int first, int last) {
  std::vector<int> pos;
  const int a = std::min(std::max(first, 0), P), b = std::max(P - std::max(last, 0), a);
  for (int t = 0; t < a; ++t) pos.push_back(t);
  for (int t = b; t < P; ++t) pos.push_back(t);
  return pos;
}

Model Model::load(const std::string& model_dir) {
  namespace fs = std::filesystem;
  if (model_dir.size() > 5 && model_dir.compare(model_dir.size() - 5, 5, ".gguf") == 0) return load_gguf(model_dir);
  if (!fs::is_directory(model_dir)) throw std::runtime_error(model_dir + ": model folder not found");
  Model m;
  m.config = load_config((fs::path(model_dir) / "config.json").string());
  m.weights = load_weights(m.config, model_dir);
  m.rope_inv_freq = compute_rope_inv_freq(m.config);
  return m;
}


void check_routing_shape(const RoutingTable& r, const ModelConfig& c, const char* who) {
  if (r.n_layers != c.n_layers || r.n_kv_heads != c.n_kv_heads ||
      r.mode.size() != static_cast<size_t>(c.n_layers) * c.n_kv_heads)
    throw std::invalid_argument(std::string(who) + ": routing table is " + std::to_string(r.n_layers) + " x " +
                                std::to_string(r.n_kv_heads) + ", the model has " + std::to_string(c.n_layers) +
                                " layers x " + std::to_string(c.n_kv_heads) + " KV heads");
}

namespace {

using Work = cpu::LayerActs;

void check_ids(const int32_t* ids, int T, int V) {
  for (int t = 0; t < T; ++t)
    if (ids[t] < 0 || ids[t] >= V)
      throw std::runtime_error("token id " + std::to_string(ids[t]) + " at position " + std::to_string(t) +
                               " is outside the vocabulary [0, " + std::to_string(V) + ")");
}

// q/k/v of T rows of the residual x [T, D] at layer l, RoPE'd at positions pos0 + t unless `rope` is false (the
// router reads keys before RoPE).
void qkv(const Model& m, int l, const float* x, int T, int pos0, Work& w, bool rope) {
  const ModelConfig& c = m.config;
  cpu::layer_qkv(m, l, x, T, w);
  if (rope) {
    apply_rope(w.q.data(), T, c.n_heads, c.head_dim, pos0, m.rope_inv_freq);
    apply_rope(w.k.data(), T, c.n_kv_heads, c.head_dim, pos0, m.rope_inv_freq);
  }
}

// One decoder layer over T rows at positions [pos0, pos0 + T): attention against cache + fresh rows, then appends
// the fresh keys/values to the cache, then the MLP. x is updated in place.
void layer_step(const Model& m, int l, float* x, int T, int pos0, KVCache& cache, const RoutingTable& routing,
                Work& w, AttentionStats* stats, float* last_row_probs, bool prefill) {
  qkv(m, l, x, T, pos0, w, true);
  cached_attention(m.config, l, w.q.data(), w.k.data(), w.v.data(), T, pos0, cache, routing, w.att.data(), stats,
                   last_row_probs, prefill);
  cpu::layer_out_mlp(m, l, x, T, w);
}

void embed(const Model& m, const int32_t* ids, int T, float* x) {
  const int D = m.config.hidden;
  for (int t = 0; t < T; ++t)
    m.weights.embed.rows_to_f32(ids[t], 1, x + static_cast<size_t>(t) * D);
}

// Final norm and lm_head over the last row or all T rows of x.
void head(const Model& m, const float* x, int T, bool all_logits, std::vector<float>& logits) {
  const ModelConfig& c = m.config;
  const int rows = all_logits ? T : 1, D = c.hidden;
  const float* xs = x + static_cast<size_t>(all_logits ? 0 : T - 1) * D;
  std::vector<float> h(static_cast<size_t>(rows) * D);
  rmsnorm_rows(xs, m.weights.final_norm.data(), h.data(), rows, D, c.rms_eps);
  logits.resize(static_cast<size_t>(rows) * c.vocab);
  linear(h.data(), m.weights.head(), {}, logits.data(), rows);
}

void check_capacity(const KVCache& cache, int T) {
  if (T <= 0) throw std::invalid_argument("forward: no tokens");
  if (int64_t{cache.length} + T > cache.capacity)
    throw std::runtime_error("context overflow: " + std::to_string(int64_t{cache.length} + T) +
                             " tokens exceed the KV cache capacity " + std::to_string(cache.capacity) + " (raise -c)");
}

}  // namespace

void Model::forward(const int32_t* ids, int T, KVCache& cache, std::vector<float>& logits, bool all_logits,
                    AttentionStats* stats, std::vector<std::vector<float>>* last_row_probs, bool prefill) const {
  const ModelConfig& c = config;
  const RoutingTable& r = cache.routing;
  if (r.n_layers == 0) throw std::invalid_argument("forward: the KV cache has no routing (KVCache::init sets one)");
  check_routing_shape(r, c, "forward");
  check_capacity(cache, T);
  check_ids(ids, T, c.vocab);
  const int pos0 = cache.length;
  std::vector<float> x(static_cast<size_t>(T) * c.hidden);
  embed(*this, ids, T, x.data());
  Work w(c, T);
  for (int l = 0; l < c.n_layers; ++l) {
    float* probs = nullptr;
    if (last_row_probs) {
      last_row_probs->resize(c.n_layers);
      (*last_row_probs)[l].assign(static_cast<size_t>(c.n_heads) * (pos0 + T), 0.f);
      probs = (*last_row_probs)[l].data();
    }
    layer_step(*this, l, x.data(), T, pos0, cache, r, w, stats, probs, prefill);
  }
  cache.length = pos0 + T;
  head(*this, x.data(), T, all_logits, logits);
}

namespace {
// A chunk size that is not a multiple of the block would leave later chunks' estimator heads dense without a word:
// refused (check_estimator_chunk), as the GPU refuses it. A prompt in one chunk is any length.
void check_xattn_chunk(const HeadMode* modes, size_t n, int T, int chunk, int block) {
  if (T > chunk) check_estimator_chunk(modes, n, chunk, block, "prefill: ");
}
}  // namespace

void Model::prefill(const int32_t* ids, int T, int chunk, KVCache& cache, std::vector<float>& logits, bool all_logits,
                    AttentionStats* stats, const PromptRouter* router) const {
  if (chunk <= 0) throw std::invalid_argument("prefill: chunk size must be positive");
  if (router && cache.length > 0) throw std::invalid_argument("prefill: a router routes a prompt into an empty cache only");
  if (!router) {
    const RoutingTable& r = cache.routing;
    check_xattn_chunk(r.mode.data(), r.mode.size(), T, chunk, r.sparse.block);
    std::vector<float> part;
    if (all_logits) logits.clear();
    for (int t0 = 0; t0 < T; t0 += chunk) {
      const int n = std::min(chunk, T - t0);
      forward(ids + t0, n, cache, part, all_logits, stats, nullptr, true);
      if (all_logits) logits.insert(logits.end(), part.begin(), part.end());
    }
    if (!all_logits) logits.swap(part);
    return;
  }
  // Routed prefill, layer-major, through the cursor (one chunk of one layer a step).
  PrefillCursor cur(*this, ids, T, chunk, cache, router, stats);
  while (!cur.done()) cur.step();
  cur.finish(logits, all_logits);
}

const PromptRouter* init_sequence_cache(const ModelConfig& c, int capacity, const RoutingTable* routing,
                                        const PromptRouter* router, KVCache& cache) {
  if (!routing && router) {
    cache.init_deferred(c, capacity);
    return router;
  }
  cache.init(c, capacity, routing);
  return nullptr;
}

PrefillCursor::PrefillCursor(const Model& m, const int32_t* ids, int T, int chunk, KVCache& cache,
                             const PromptRouter* router, AttentionStats* stats)
    : m_(m), ids_(ids), T_(T), chunk_(chunk), n_layers_(m.config.n_layers), cache_(cache), router_(router), stats_(stats) {
  const ModelConfig& c = m.config;
  if (chunk <= 0) throw std::invalid_argument("prefill: chunk size must be positive");
  if (cache.length != 0) throw std::invalid_argument("prefill: a layer-major prefill needs an empty cache");
  if (!router_ && cache.routing.n_layers == 0)
    throw std::invalid_argument("prefill: no router and the KV cache has no routing (KVCache::init sets one)");
  check_capacity(cache, T);
  check_ids(ids, T, c.vocab);
  if (router_) {
    decided_ = RoutingTable::all_full(c.n_layers, c.n_kv_heads);
    decided_.sparse = router_->sparse();
  } else {
    check_routing_shape(cache.routing, c, "prefill");
    check_xattn_chunk(cache.routing.mode.data(), cache.routing.mode.size(), T, chunk, cache.routing.sparse.block);
    decided_ = cache.routing;
  }
  x_.resize(static_cast<size_t>(T) * c.hidden);
  embed(m, ids, T, x_.data());
  work_ = std::make_shared<Work>(c, std::min(chunk, T));
}

int PrefillCursor::steps_left() const {
  const int per_layer = (T_ + chunk_ - 1) / chunk_;
  return done() ? 0 : (n_layers_ - layer_) * per_layer - t0_ / chunk_;
}

void PrefillCursor::step() {
  if (done()) throw std::logic_error("PrefillCursor::step after the last layer");
  const ModelConfig& c = m_.config;
  const int D = c.hidden, Hkv = c.n_kv_heads, hd = c.head_dim, l = layer_;
  HeadMode* modes = decided_.mode.data() + static_cast<size_t>(l) * Hkv;
  if (t0_ == 0 && router_) {
    // Route layer l from the boundary keys (after k_norm, before RoPE), then size its cache.
    const std::vector<int> pos = boundary_positions(T_, router_->pool_first(), router_->pool_last());
    const int nb = static_cast<int>(pos.size());
    std::vector<float> xb(static_cast<size_t>(nb) * D), pooled(static_cast<size_t>(Hkv) * hd, 0.f);
    for (int i = 0; i < nb; ++i)
      std::copy_n(x_.data() + static_cast<size_t>(pos[i]) * D, D, xb.data() + static_cast<size_t>(i) * D);
    Work wb(c, nb);
    qkv(m_, l, xb.data(), nb, 0, wb, false);
    std::vector<int> rows(nb);
    for (int i = 0; i < nb; ++i) rows[i] = i;  // wb holds just the boundary rows
    router::pool_rows<float>(wb.k.data(), rows, pooled.size(), pooled.data());
    router_->decide(l, pooled.data(), modes);
    check_xattn_chunk(modes, static_cast<size_t>(Hkv), T_, chunk_, decided_.sparse.block);
    cache_.allocate_layer(l, modes, decided_.sparse);
  }
  const int n = std::min(chunk_, T_ - t0_);
  layer_step(m_, l, x_.data() + static_cast<size_t>(t0_) * D, n, t0_, cache_, decided_, *static_cast<Work*>(work_.get()),
             stats_, nullptr, true);
  t0_ += n;
  if (t0_ >= T_) t0_ = 0, ++layer_;
}

void PrefillCursor::finish(std::vector<float>& logits, bool all_logits) {
  if (!done()) throw std::logic_error("PrefillCursor::finish before the last layer");
  cache_.length = T_;
  cache_.routing = decided_;
  if (all_logits) {  // chunk by chunk, as the token-major prefill does (a product's bits depend on its row count)
    const int D = m_.config.hidden;
    std::vector<float> part;
    logits.clear();
    for (int t0 = 0; t0 < T_; t0 += chunk_) {
      head(m_, x_.data() + static_cast<size_t>(t0) * D, std::min(chunk_, T_ - t0), true, part);
      logits.insert(logits.end(), part.begin(), part.end());
    }
  } else {
    head(m_, x_.data(), T_, false, logits);
  }
  x_ = {};
  work_.reset();
}



}  // namespace elastic
