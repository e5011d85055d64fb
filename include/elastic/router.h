#pragma once
// The Elastic Attention router: per layer a small MLP (weights shared across the layer's KV heads) reads each KV
// head's key states after k_norm and before RoPE, mean-pooled over the first and last tokens of the prompt, and
// says FULL (class 1) or sparse. Routed once per prompt at prefill; the routing then stays fixed for decode and
// sets each head's KV-cache capacity.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "elastic/attention.h"
#include "elastic/config.h"
#include "elastic/model.h"

namespace elastic {

// What the router reads. Pooled is the method: each KV head's boundary-pooled keys of this prompt. HeadIdentity is the
// learned-static control (docs/RESULTS.md): every prompt gives head h the same input, sqrt(head_dim) * e_h (the scale
// of a k_norm'ed key), so the same trainer, data and loss learn one fixed routing. Comparing the two at matched Omega
// isolates what input-adaptivity adds.
enum class RouterInput : uint8_t { Pooled = 0, HeadIdentity = 1 };
const char* router_input_name(RouterInput in);          // "pooled" | "head-identity"
RouterInput parse_router_input(const std::string& s);   // throws std::invalid_argument naming both

struct RouterSpec {
  int n_layers = 0, n_kv_heads = 0, head_dim = 0;
  int pool_first = 100, pool_last = 100;  // boundary pooling window (tokens)
  bool sigmoid = false;                   // 1-logit sigmoid gate instead of the 2-class softmax
  RouterInput input = RouterInput::Pooled;  // HeadIdentity needs n_kv_heads <= head_dim
  // The paper's configurations, as (dense class, sparse class) = (class 1, class 0): FA-SSA (full, ssa), FA-XA (full,
  // xattn), XA-SSA (xattn, ssa). router_config_name / parse_router_config spell them.
  HeadMode dense_mode = HeadMode::Full;        // what a head the router keeps dense runs
  HeadMode sparse_mode = HeadMode::Streaming;  // what the other heads run
  SparseSettings sparse;
  std::string base_model;                 // fingerprint of the backbone (model_fingerprint)
  std::map<std::string, double> targets;  // target Omega per task class used in training (metadata)
  int classes() const { return sigmoid ? 1 : 2; }
};

// Throws "<source>: ..." unless the spec is one a router can be built from: 1..4096 layers and KV heads, head_dim
// 1..4096 (the MLP's parameter count is computed from it), a pooling window of 0..kMaxSparseWindow tokens at each end
// and not empty, n_kv_heads <= head_dim for the head-identity input, and a (dense, sparse) pair that is one of the paper's configurations. The bounds keep pool sums and parameter counts far from int
// overflow. The sparse settings are validate_sparse's (not called here: tests build routers with 16-token blocks).
void validate_router_spec(const RouterSpec& spec, const std::string& source);

// "fa-ssa", "fa-xa" or "xa-ssa" for a spec's (dense_mode, sparse_mode); throws std::invalid_argument for any other
// pair (the dense class must be full or xattn, the sparse one ssa or xattn, and the two must differ).
std::string router_config_name(HeadMode dense_mode, HeadMode sparse_mode);
// The inverse: sets dense_mode and sparse_mode from a name (case-sensitive); throws std::invalid_argument naming
// the accepted names.
void parse_router_config(const std::string& name, HeadMode& dense_mode, HeadMode& sparse_mode);

// "arch=qwen3 L=28 D=1024 Hq=16 Hkv=8 hd=128 V=151936": what a router must match.
std::string model_fingerprint(const ModelConfig& c);

class Router : public PromptRouter {
 public:
  RouterSpec spec;
  std::vector<float> params;  // n_layers x layer_param_count(head_dim, classes), layout in src/router/router_mlp.h

  // PyTorch-style default init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases, from the seed.
  static Router init(const RouterSpec& spec, uint64_t seed);
  // Safetensors file with metadata; refuses a router made for another model with a clear error.
  static Router load(const std::string& path, const ModelConfig& model);
  void save(const std::string& path) const;

  size_t layer_size() const;
  const float* layer(int l) const { return params.data() + layer_size() * l; }
  float* layer(int l) { return params.data() + layer_size() * l; }
  // logits [Hkv, classes] of one layer from pooled keys [Hkv, head_dim] (ignored under RouterInput::HeadIdentity).
  void logits(int layer, const float* pooled, float* out) const;

  int pool_first() const override { return spec.pool_first; }
  int pool_last() const override { return spec.pool_last; }
  const SparseSettings& sparse() const override { return spec.sparse; }
  void decide(int layer, const float* pooled, HeadMode* modes) const override;
  std::vector<HeadMode> modes() const override { return {spec.dense_mode, spec.sparse_mode}; }
  // The one routing a learned-static router (RouterInput::HeadIdentity) gives every prompt, with its sparse settings:
  // a routing file can then serve it without a router. Throws std::invalid_argument for a router that reads the
  // prompt (its routing differs per prompt).
  RoutingTable fixed_routing() const;
};

}  // namespace elastic
