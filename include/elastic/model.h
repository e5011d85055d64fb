#pragma once
// Qwen3 / Llama decoder on the CPU: fp32 compute, OpenBLAS sgemm, OpenMP.
#include <cstdint>
#include <string>
#include <vector>

#include "elastic/attention.h"
#include "elastic/config.h"

namespace elastic {

// Weights widened to fp32 at load. Linear weights keep the HF layout [out, in].
struct LayerWeights {
  std::vector<float> attn_norm;     // [D]
  std::vector<float> wq, wk, wv;    // [Hq*hd, D], [Hkv*hd, D], [Hkv*hd, D]
  std::vector<float> bq, bk, bv;    // biases when attention_bias, else empty
  std::vector<float> wo;            // [D, Hq*hd]
  std::vector<float> q_norm, k_norm;  // [hd] (Qwen3 only)
  std::vector<float> mlp_norm;      // [D]
  std::vector<float> w_gate, w_up;  // [F, D]
  std::vector<float> w_down;        // [D, F]
};

struct ModelWeights {
  std::vector<float> embed;       // [V, D]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // [D]
  std::vector<float> lm_head;     // [V, D]; empty when tied (embed is used)
  const float* head() const { return lm_head.empty() ? embed.data() : lm_head.data(); }
};

// Loads and validates every expected tensor (names, shapes) from the model folder's safetensors.
ModelWeights load_weights(const ModelConfig& cfg, const std::string& model_dir);

// Key/value cache: per layer, per KV head (index l * Hkv + h), [slots, hd] rows. `capacity` counts positions.
// A full head has one slot per position. With a routing given, a streaming head keeps only its sink blocks plus a
// ring of its local window (the hybrid cache), so memory falls with sparsity.
struct KVCache {
  int n_layers = 0, n_kv_heads = 0, head_dim = 0, capacity = 0, length = 0;
  std::vector<std::vector<float>> k, v;
  std::vector<int> sink_slots, ring_slots;  // per head; ring 0 = one slot per position
  void init(const ModelConfig& cfg, int capacity, const RoutingTable* hybrid = nullptr);
  size_t bytes() const;
};

struct Model {
  ModelConfig config;
  ModelWeights weights;
  RoutingTable routing;  // defaults to all-full
  std::vector<float> rope_inv_freq;  // [hd/2], llama3 scaling applied; computed once at load

  static Model load(const std::string& model_dir);

  // Runs T tokens at positions [cache.length, cache.length + T) and appends them to the cache.
  // logits: [T, V] when all_logits, else [1, V] for the last position.
  // stats (optional) accumulates attention work and the last layer's block skips (Omega_ESR).
  void forward(const int32_t* ids, int T, KVCache& cache, std::vector<float>& logits, bool all_logits,
               AttentionStats* stats = nullptr, std::vector<std::vector<float>>* last_row_probs = nullptr,
               bool prefill = false, const RoutingTable* routing_override = nullptr) const;
  // A call with T > 1 or prefill = true is a prefill step (XAttention selects blocks); else a decode step.
  // Prefill in chunks of `chunk` tokens: the same result as one pass for full and streaming heads, and for
  // XAttention heads when `chunk` is a multiple of the block size.
  void prefill(const int32_t* ids, int T, int chunk, KVCache& cache, std::vector<float>& logits, bool all_logits,
               AttentionStats* stats = nullptr, const RoutingTable* routing_override = nullptr) const;
  // last_row_probs (optional): per layer, [Hq, cache.length] attention weights of the last position (probing).
  // routing_override (optional): route this call by another table than `routing` (per-request routing, e.g. a
  // router's decision for this prompt); it must keep the layer/head counts.
};

}  // namespace elastic
