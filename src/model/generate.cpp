#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

#include "elastic/generate.h"

namespace elastic {

int generation_capacity(int64_t prompt_len, int64_t n_new, int64_t context, int max_positions) {
  const int64_t model_ctx = max_positions > 0 ? std::min(max_positions, kMaxContext) : kMaxContext;
  const std::string ctx_s = std::to_string(model_ctx) + " tokens" + (max_positions > 0 ? "" : " (the engine's limit)");
  if (n_new < 0) throw std::runtime_error("generate: -n must be >= 0, got " + std::to_string(n_new));
  if (context < 0) throw std::runtime_error("generate: -c must be >= 0, got " + std::to_string(context));
  if (context > model_ctx)
    throw std::runtime_error("generate: -c " + std::to_string(context) + " exceeds the model's context of " + ctx_s);
  if (prompt_len > (context > 0 ? context : model_ctx))
    throw std::runtime_error("generate: the prompt has " + std::to_string(prompt_len) + " tokens, more than the " +
                             (context > 0 ? "context -c " + std::to_string(context) : "model's context of " + ctx_s));
  // prompt_len <= model_ctx here and n_new is capped just past it: the sum stays far below 2^31.
  const int64_t need = prompt_len + std::min<int64_t>(n_new, kMaxContext + int64_t{1});
  if (context > 0) return static_cast<int>(std::min(context, need));
  if (need > model_ctx)
    throw std::runtime_error("generate: the prompt (" + std::to_string(prompt_len) + " tokens) + -n " +
                             std::to_string(n_new) + " exceeds the model's context of " + ctx_s +
                             ": lower -n, or give -c to stop when the context is full");
  return static_cast<int>(need);
}

std::vector<int32_t> generate(const Model& m, const std::vector<int32_t>& prompt, int n_new, int context,
                              const SamplerParams& sp, bool stop_at_eos, GenerateStats* stats,
                              const std::function<void(int32_t)>& on_token, int prefill_chunk) {
  using clock = std::chrono::steady_clock;
  if (prompt.empty()) throw std::runtime_error("generate: empty prompt");
  const int capacity = generation_capacity(static_cast<int64_t>(prompt.size()), n_new, context, m.config.max_positions);
  KVCache cache;
  // Hybrid cache: streaming heads keep sink + window; with a router each layer is sized once it is routed.
  if (m.router) cache.init_deferred(m.config, capacity);
  else cache.init(m.config, capacity, &m.routing);
  Sampler sampler(sp);
  std::vector<float> logits;
  std::vector<int32_t> out;
  auto t0 = clock::now();
  AttentionStats* as = stats ? &stats->attn : nullptr;
  m.prefill(prompt.data(), static_cast<int>(prompt.size()), prefill_chunk, cache, logits, false, as);
  auto t1 = clock::now();
  for (int i = 0; i < n_new; ++i) {
    int32_t id = sampler.sample(logits.data(), m.config.vocab);
    out.push_back(id);
    if (on_token) on_token(id);
    if (stop_at_eos && std::find(m.config.eos_ids.begin(), m.config.eos_ids.end(), id) != m.config.eos_ids.end()) break;
    if (i + 1 == n_new || cache.length >= cache.capacity) break;
    m.forward(&id, 1, cache, logits, false, as);
  }
  auto t2 = clock::now();
  if (stats) {
    stats->prompt_tokens = static_cast<int>(prompt.size());
    stats->new_tokens = static_cast<int>(out.size());
    stats->prefill_s = std::chrono::duration<double>(t1 - t0).count();
    stats->decode_s = std::chrono::duration<double>(t2 - t1).count();
    stats->kv_bytes = cache.bytes();
    stats->routing = cache.routing.n_layers ? cache.routing : m.routing;
  }
  return out;
}

}  // namespace elastic
