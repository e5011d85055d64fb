#pragma once
// One decode step for several sequences at once (continuous batching in the server). The token-wise parts
// (projections, norms, MLP, lm_head) run as one GEMM over all sequences' rows; attention runs per sequence
// against that sequence's own KV cache with its own routing.
#include <cstdint>
#include <vector>

#include "elastic/model.h"

namespace elastic {

struct DecodeSlot {
  int32_t token = 0;                      // next input id; it sits at position cache->length
  KVCache* cache = nullptr;               // this sequence's cache (hybrid for its routing); appended to
  AttentionStats* stats = nullptr;        // optional, accumulated like Model::forward's
};

// logits: [slots.size(), V], row b for slot b. Every slot's cache grows by one position.
// Same result as one Model::forward(&token, 1, ...) per slot (decode step, prefill = false) up to float rounding, and
// batch-invariant: a slot's row is bit-identical whatever the other slots, their number or its place among them
// (the projections sum in an order that depends only on the sizes), so seeded sampling answers the same batched.
// Throws (before touching any cache) on a full cache, an id outside the vocabulary, a routing of the wrong shape,
// a cache built for another routing, or one cache given twice.
void decode_batch(const Model& m, const std::vector<DecodeSlot>& slots, std::vector<float>& logits);

}  // namespace elastic
