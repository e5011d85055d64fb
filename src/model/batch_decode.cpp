#include "elastic/batch_decode.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <unordered_set>

#include "model/cached_attention.h"
#include "model/cpu_layer.h"
#include "model/ops.h"

namespace elastic {

namespace {

// All checks up front, so a bad slot leaves every cache untouched.
void check_slots(const Model& m, const std::vector<DecodeSlot>& slots) {
  const ModelConfig& c = m.config;
  std::unordered_set<const KVCache*> seen;
  for (size_t b = 0; b < slots.size(); ++b) {
    const DecodeSlot& s = slots[b];
    const std::string who = "decode_batch: slot " + std::to_string(b);
    if (!s.cache) throw std::invalid_argument(who + " has no KV cache");
    if (!seen.insert(s.cache).second) throw std::invalid_argument(who + " repeats another slot's KV cache");
    const KVCache& kc = *s.cache;
    if (kc.n_layers != c.n_layers || kc.n_kv_heads != c.n_kv_heads || kc.head_dim != c.head_dim)
      throw std::invalid_argument(who + ": KV cache was built for another model shape");
    if (kc.length + 1 > kc.capacity)
      throw std::runtime_error(who + ": context overflow: " + std::to_string(kc.length + 1) +
                               " tokens exceed the KV cache capacity " + std::to_string(kc.capacity));
    if (s.token < 0 || s.token >= c.vocab)
      throw std::runtime_error(who + ": token id " + std::to_string(s.token) + " is outside the vocabulary [0, " +
                               std::to_string(c.vocab) + ")");
    const RoutingTable& r = kc.routing;  // the slot decodes under its cache's routing, as Model::forward
    check_routing_shape(r, c, who.c_str());
    // A ring cache holds only a streaming head's window: any other mode would read overwritten keys.
    for (size_t i = 0; i < r.mode.size(); ++i)
      if (kc.ring_slots[i] && r.mode[i] != HeadMode::Streaming)
        throw std::runtime_error(who + ": KV cache was built for another routing: layer " +
                                 std::to_string(i / c.n_kv_heads) + " KV head " + std::to_string(i % c.n_kv_heads) +
                                 " has a streaming window cache but is routed " + head_mode_name(r.mode[i]));
  }
}

}  // namespace

void decode_batch(const Model& m, const std::vector<DecodeSlot>& slots, std::vector<float>& logits) {
  const ModelConfig& c = m.config;
  const int B = static_cast<int>(slots.size());
  logits.clear();
  if (B == 0) return;
  check_slots(m, slots);
  const int D = c.hidden, hd = c.head_dim, Hq = c.n_heads, Hkv = c.n_kv_heads, V = c.vocab;
  const ModelWeights& W = m.weights;

  // Row b of every activation belongs to slot b (one new position each); products row by row, so a row's bits do not
  // depend on the batch.
  std::vector<float> x(static_cast<size_t>(B) * D);
  cpu::LayerActs w(c, B);
  for (int b = 0; b < B; ++b)
    W.embed.rows_to_f32(slots[b].token, 1, x.data() + static_cast<size_t>(b) * D);

  for (int l = 0; l < c.n_layers; ++l) {
    cpu::layer_qkv(m, l, x.data(), B, w, cpu::Products::RowWise);
    for (int b = 0; b < B; ++b) {
      const int pos0 = slots[b].cache->length;
      float* qb = w.q.data() + static_cast<size_t>(b) * Hq * hd;
      float* kb = w.k.data() + static_cast<size_t>(b) * Hkv * hd;
      const float* vb = w.v.data() + static_cast<size_t>(b) * Hkv * hd;
      apply_rope(qb, 1, Hq, hd, pos0, m.rope_inv_freq);  // each row at its own sequence's position
      apply_rope(kb, 1, Hkv, hd, pos0, m.rope_inv_freq);
      cached_attention(c, l, qb, kb, vb, 1, pos0, *slots[b].cache, slots[b].cache->routing,
                       w.att.data() + static_cast<size_t>(b) * Hq * hd, slots[b].stats, nullptr, false);
    }
    cpu::layer_out_mlp(m, l, x.data(), B, w, cpu::Products::RowWise);
  }
  for (const DecodeSlot& s : slots) s.cache->length += 1;

  rmsnorm_rows(x.data(), W.final_norm.data(), w.h.data(), B, D, c.rms_eps);
  logits.resize(static_cast<size_t>(B) * V);
  linear_rowwise(w.h.data(), W.head(), {}, logits.data(), B);
}

}  // namespace elastic
