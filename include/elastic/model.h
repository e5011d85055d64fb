#pragma once
// Qwen3 / Llama decoder on the CPU: fp32 compute, OpenBLAS sgemm, OpenMP.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "elastic/attention.h"
#include "elastic/config.h"
#include "elastic/weight_matrix.h"

namespace elastic {

// Linear weights keep the HF layout [out, in]: fp32 from safetensors, the file's block format from a GGUF file
// (Q8_0, Q4_0, Q4_1; other GGUF types widened to fp32 at load). Norms and biases are fp32.
struct LayerWeights {
  std::vector<float> attn_norm;     // [D]
  WeightMatrix wq, wk, wv;          // [Hq*hd, D], [Hkv*hd, D], [Hkv*hd, D]
  std::vector<float> bq, bk, bv;    // biases when attention_bias, else empty
  WeightMatrix wo;                  // [D, Hq*hd]
  std::vector<float> q_norm, k_norm;  // [hd] (Qwen3 only)
  std::vector<float> mlp_norm;      // [D]
  WeightMatrix w_gate, w_up;        // [F, D]
  WeightMatrix w_down;              // [D, F]
};

struct ModelWeights {
  WeightMatrix embed;             // [V, D]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // [D]
  WeightMatrix lm_head;           // [V, D]; empty when tied (embed is used)
  const WeightMatrix& head() const { return lm_head.empty() ? embed : lm_head; }
  // Every matrix to fp32 in place (the trainer and fp32-only tools); a no-op for fp32 weights.
  void widen();
  bool all_f32() const;
  size_t bytes() const;  // matrices, norms and biases as held
};

// Loads and validates every expected tensor (names, shapes) from the model folder's safetensors.
ModelWeights load_weights(const ModelConfig& cfg, const std::string& model_dir);

// Throws std::invalid_argument naming `who` when r is not one mode per (layer, KV head) of c.
void check_routing_shape(const RoutingTable& r, const ModelConfig& c, const char* who);

// Key/value cache: per layer, per KV head (index l * Hkv + h), [slots, hd] rows. `capacity` counts positions.
// A full head has one slot per position. With a routing given, a streaming head keeps only its sink blocks plus a
// ring of its local window (the hybrid cache), so memory falls with sparsity.
// The cache owns its sequence's routing (the one place it lives): init sets it (all full when none is given), a
// routed prefill decides it layer by layer, and every later forward, decode step and extend runs under it.
struct KVCache {
  int n_layers = 0, n_kv_heads = 0, head_dim = 0, capacity = 0, length = 0;
  std::vector<std::vector<float>> k, v;
  std::vector<int> sink_slots, ring_slots;  // per head; ring 0 = one slot per position
  RoutingTable routing;                     // empty only while a routed prefill is deciding it
  void init(const ModelConfig& cfg, int capacity, const RoutingTable* hybrid = nullptr);  // hybrid null: all full
  // Sizes nothing yet: a routed prefill allocates each layer once its router has decided (allocate_layer).
  void init_deferred(const ModelConfig& cfg, int capacity);
  // (Re)allocates layer l's heads for their modes: streaming heads get sink + window slots when that is smaller.
  void allocate_layer(int layer, const HeadMode* modes, const SparseSettings& sparse);
  size_t bytes() const;
  size_t bytes_all_full() const;  // what the cache would hold at its capacity were every head full
};

// Bytes KVCache::init(cfg, capacity, &routing) allocates (streaming heads keep sink + window): what a server
// reserves against its KV budget for a CPU request of `capacity` positions.
size_t kv_cache_bytes_for(const ModelConfig& cfg, int capacity, const RoutingTable& routing);

// Decides a layer's head modes from the prompt's boundary-pooled key states (after k_norm, before RoPE).
// The trained router (include/elastic/router.h) is one.
struct PromptRouter {
  virtual ~PromptRouter() = default;
  virtual int pool_first() const = 0;
  virtual int pool_last() const = 0;
  virtual const SparseSettings& sparse() const = 0;
  // pooled [Hkv, hd] -> modes [Hkv]
  virtual void decide(int layer, const float* pooled, HeadMode* modes) const = 0;
  // Every mode decide() may give a head (a trained router: its two classes' modes), so a run can check what those
  // patterns need (RoutePolicy::check_chunk) before the first prompt.
  virtual std::vector<HeadMode> modes() const = 0;
};

// Unique positions of the boundary pool: [0, min(first, P)) and [max(P - last, 0), P).
std::vector<int> boundary_positions(int prompt_len, int first, int last);

struct Model {
  ModelConfig config;
  ModelWeights weights;
  std::vector<float> rope_inv_freq;  // [hd/2], llama3 scaling applied; computed once at load

  // A Hugging Face folder (config.json + safetensors) or a .gguf file (dispatches to load_gguf).
  static Model load(const std::string& model_dir);
  // GGUF v2/v3 (llama, qwen3): Q8_0/Q4_0/Q4_1 matrices kept in their blocks, other types widened to fp32;
  // llama.cpp's Q/K row permutation undone.
  static Model load_gguf(const std::string& gguf_path);

  // Runs T tokens at positions [cache.length, cache.length + T) under the cache's routing and appends them to it.
  // logits: [T, V] when all_logits, else [1, V] for the last position.
  // stats (optional) accumulates attention work and the last layer's block skips (Omega_ESR).
  // last_row_probs (optional): per layer, [Hq, cache.length] attention weights of the last position (probing).
  void forward(const int32_t* ids, int T, KVCache& cache, std::vector<float>& logits, bool all_logits,
               AttentionStats* stats = nullptr, std::vector<std::vector<float>>* last_row_probs = nullptr,
               bool prefill = false) const;
  // A call with T > 1 or prefill = true is a prefill step (XAttention selects blocks); else a decode step.
  // Prefill in chunks of `chunk` tokens: the same result as one pass for full and streaming heads, and for
  // XAttention heads when `chunk` is a multiple of the block size.
  // Without a router the chunks run under the cache's routing. With one (the cache empty) the prompt runs layer by
  // layer (all chunks of layer l, then l + 1), so that layer l's router sees the whole prompt's keys before that
  // layer's attention; the cache is resized layer by layer as it decides and keeps the routing decided; the result
  // equals the unrouted prefill under that routing.
  void prefill(const int32_t* ids, int T, int chunk, KVCache& cache, std::vector<float>& logits, bool all_logits,
               AttentionStats* stats = nullptr, const PromptRouter* router = nullptr) const;
};

// Readies an empty `cache` for a prompt's prefill into `capacity` positions, the one rule both CPU backends follow:
// routed by `router` (when `routing` is null), the cache is sized layer by layer as it decides (init_deferred);
// else the cache is built for `routing` (all full when null), which it then holds. Returns the router the prefill
// runs under: nullptr when a table routes it.
const PromptRouter* init_sequence_cache(const ModelConfig& c, int capacity, const RoutingTable* routing,
                                        const PromptRouter* router, KVCache& cache);

// A prompt's prefill into an empty cache in steps of one chunk through one layer (layer-major: every chunk of layer
// l, then l + 1), so a server can run other sequences' decode steps between steps and a long prompt stalls them by
// one step at most. Routed by `router` (layer l decided from its boundary keys before its attention; the cache is
// sized layer by layer: init_deferred) or, router null, by the table the cache was built for (init). The same arithmetic as
// Model::prefill, whose routed path is this cursor run to the end: the cache and logits are bit-identical.
class PrefillCursor {
 public:
  // m, ids and cache must outlive the cursor; stats (optional) accumulates like Model::prefill's.
  PrefillCursor(const Model& m, const int32_t* ids, int T, int chunk, KVCache& cache, const PromptRouter* router,
                AttentionStats* stats = nullptr);
  bool done() const { return layer_ >= n_layers_; }
  int steps_left() const;
  void step();  // one chunk of the current layer (routing the layer first where a router decides)
  // After done(): the last position's logits ([V]) or every row's ([T, V]); sets cache.length and cache.routing.
  void finish(std::vector<float>& logits, bool all_logits = false);
  const RoutingTable& routing() const { return decided_; }  // complete once done()

 private:
  const Model& m_;
  const int32_t* ids_;
  int T_, chunk_, n_layers_, layer_ = 0, t0_ = 0;
  KVCache& cache_;
  const PromptRouter* router_;
  AttentionStats* stats_;
  RoutingTable decided_;
  std::vector<float> x_;  // [T, D] residual stream of the whole prompt
  std::shared_ptr<void> work_;  // the chunk's activations (model.cpp's Work)
};

}  // namespace elastic
