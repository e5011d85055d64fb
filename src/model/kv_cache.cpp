// KV-cache sizing: one slot per position for full heads, sink + ring window for streaming heads (hybrid cache).
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "elastic/sparse_pattern.h"
#include "elastic/model.h"

namespace elastic {

size_t kv_cache_bytes_for(const ModelConfig& cfg, int capacity, const RoutingTable& r) {
  // KVCache's slot count per head (pattern_cache_slots; checked against KVCache in the tests).
  size_t slots = 0;
  const size_t n = static_cast<size_t>(cfg.n_layers) * cfg.n_kv_heads;
  for (size_t i = 0; i < n; ++i)
    slots += i < r.mode.size() ? static_cast<size_t>(pattern_cache_slots(r.mode[i], r.sparse, capacity)) : capacity;
  return slots * cfg.head_dim * sizeof(float) * 2;  // keys and values
}

void KVCache::init_deferred(const ModelConfig& cfg, int cap) {
  if (cap < 0) throw std::invalid_argument("KV cache: negative capacity " + std::to_string(cap));
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
  routing = RoutingTable{};
}

void KVCache::allocate_layer(int layer, const HeadMode* modes, const SparseSettings& s) {
  for (int h = 0; h < n_kv_heads; ++h) {
    const size_t i = static_cast<size_t>(layer) * n_kv_heads + h;
    // A bounded pattern (streaming) keeps a sink + ring when that is smaller than the capacity; in 64 bits, so a sink
    // or window near INT_MAX just keeps one slot per position.
    int64_t sink = 0, ring = 0;
    const int slots = static_cast<int>(pattern_cache_slots(modes[h], s, capacity, &sink, &ring));
    sink_slots[i] = static_cast<int>(sink);
    ring_slots[i] = static_cast<int>(ring);
    k[i].assign(static_cast<size_t>(slots) * head_dim, 0.f);
    v[i].assign(static_cast<size_t>(slots) * head_dim, 0.f);
  }
}

void KVCache::init(const ModelConfig& cfg, int cap, const RoutingTable* hybrid) {
  if (hybrid) check_routing_shape(*hybrid, cfg, "KV cache");
  init_deferred(cfg, cap);
  const std::vector<HeadMode> full(n_kv_heads, HeadMode::Full);
  for (int l = 0; l < n_layers; ++l)
    allocate_layer(l, hybrid ? hybrid->mode.data() + static_cast<size_t>(l) * n_kv_heads : full.data(),
                   hybrid ? hybrid->sparse : SparseSettings{});
  routing = hybrid ? *hybrid : RoutingTable::all_full(n_layers, n_kv_heads);
}

size_t KVCache::bytes_all_full() const {
  return size_t(n_layers) * n_kv_heads * size_t(capacity) * head_dim * sizeof(float) * 2;  // keys and values
}

size_t KVCache::bytes() const {
  size_t b = 0;
  for (auto& x : k) b += x.size() * sizeof(float);
  for (auto& x : v) b += x.size() * sizeof(float);
  return b;
}

}  // namespace elastic
