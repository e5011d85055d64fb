#include "model/cached_attention.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace elastic {

void cached_attention(const ModelConfig& c, int l, const float* q, const float* k, const float* v, int T, int pos0,
                      KVCache& cache, const RoutingTable& routing, float* out, AttentionStats* stats,
                      float* last_row_probs, bool prefill) {
  const int hd = c.head_dim, Hkv = c.n_kv_heads;
  std::vector<HeadKV> kv(Hkv);
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
    e.k_new = k + static_cast<size_t>(kh) * hd;
    e.v_new = v + static_cast<size_t>(kh) * hd;
    e.new_stride = Hkv * hd;
    e.pos0 = pos0;
    e.hd = hd;
  }
  AttentionArgs a;
  a.q = q;
  a.kv = kv.data();
  a.out = out;
  a.T = T;
  a.pos0 = pos0;
  a.n_heads = c.n_heads;
  a.n_kv_heads = Hkv;
  a.head_dim = hd;
  a.modes = routing.mode.data() + static_cast<size_t>(l) * Hkv;
  a.sparse = &routing.sparse;
  a.stats = stats;
  a.track_esr = stats && l == c.n_layers - 1;
  a.prefill = prefill || T > 1;
  a.last_row_probs = last_row_probs;
  if (stats && stats->per_layer) {
    AttentionStats one;  // this layer's counts, then added at their (layer, head) place
    a.stats = &one;
    a.track_esr = true;
    attention_forward(a);
    stats->add_layer(l, c.n_layers, one);
  } else {
    attention_forward(a);
  }
  // Append after attention (a streaming head's ring may reuse slots read above).
  for (int kh = 0; kh < Hkv; ++kh) {
    const size_t ci = static_cast<size_t>(l) * Hkv + kh;
    for (int t = 0; t < T; ++t) {
      const size_t slot = kv[kh].slot(pos0 + t);
      std::copy_n(k + (static_cast<size_t>(t) * Hkv + kh) * hd, hd, cache.k[ci].data() + slot * hd);
      std::copy_n(v + (static_cast<size_t>(t) * Hkv + kh) * hd, hd, cache.v[ci].data() + slot * hd);
    }
  }
}

}  // namespace elastic
