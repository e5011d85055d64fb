#pragma once
// One layer's attention against the KV cache, shared by the forward pass and batched decode: views of the cached and
// fresh keys/values per KV head, the routed attention, then the append of the fresh rows to the cache.
#include "elastic/attention.h"
#include "elastic/model.h"

namespace elastic {

// q [T, Hq, hd], k/v [T, Hkv, hd] (RoPE applied) at positions [pos0, pos0 + T) of layer l; out [T, Hq, hd].
// Throws when a head with a ring (streaming-window) cache is routed to another mode.
void cached_attention(const ModelConfig& c, int l, const float* q, const float* k, const float* v, int T, int pos0,
                      KVCache& cache, const RoutingTable& routing, float* out, AttentionStats* stats,
                      float* last_row_probs, bool prefill);

}  // namespace elastic
