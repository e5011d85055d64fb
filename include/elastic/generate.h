#pragma once
// Token sampling and the prefill + decode loop.
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "elastic/model.h"
#include "elastic/route_policy.h"

namespace elastic {

struct SamplerParams {
  float temperature = 0.f;  // 0 = greedy
  int top_k = 0;            // 0 = off
  float top_p = 1.f;        // 1 = off
  uint64_t seed = 0;
};

constexpr int kDefaultPrefillChunk = 16384;

class Sampler {
 public:
  explicit Sampler(const SamplerParams& p) : p_(p), rng_(p.seed) {}
  int32_t sample(const float* logits, int vocab);

 private:
  SamplerParams p_;
  std::mt19937_64 rng_;
};

struct GenerateStats {
  int prompt_tokens = 0, new_tokens = 0;
  double prefill_s = 0, decode_s = 0;
  size_t kv_bytes = 0;  // KV-cache memory (hybrid: follows the routing)
  AttentionStats attn;  // prefill + decode attention work, Omega_ESR of the last layer
  RoutingTable routing;  // the routing this prompt ran under (the router's decision when the model has one)
};

// The KV-cache capacity a generation of n_new tokens after a prompt_len-token prompt needs, checked against the
// model: context 0 means prompt + n_new, which must then fit the model's max_positions; a context > 0 (-c) caps the
// cache (generation stops when it is full) and must itself fit max_positions. max_positions <= 0 (unknown) is read
// as kMaxContext. Computed in 64 bits; throws naming -n and -c.
constexpr int kMaxContext = 1 << 24;
int generation_capacity(int64_t prompt_len, int64_t n_new, int64_t context, int max_positions);

// Prefills `prompt` (routed by `policy`: its table, or its router's decision), then emits up to n_new tokens (stops at
// an EOS id when stop_at_eos). on_token (optional) sees each new id as it is produced.
std::vector<int32_t> generate(const Model& m, const RoutePolicy& policy, const std::vector<int32_t>& prompt, int n_new, int context,
                              const SamplerParams& sp, bool stop_at_eos, GenerateStats* stats,
                              const std::function<void(int32_t)>& on_token = {}, int prefill_chunk = kDefaultPrefillChunk);

}  // namespace elastic
