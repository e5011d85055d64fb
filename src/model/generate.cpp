#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "elastic/generate.h"

namespace elastic {

std::vector<int32_t> generate(const Model& m, const std::vector<int32_t>& prompt, int n_new, int context,
                              const SamplerParams& sp, bool stop_at_eos, GenerateStats* stats,
                              const std::function<void(int32_t)>& on_token, int prefill_chunk) {
  using clock = std::chrono::steady_clock;
  if (prompt.empty()) throw std::runtime_error("generate: empty prompt");
  if (n_new < 0) throw std::runtime_error("generate: -n must be >= 0");
  const int need = static_cast<int>(prompt.size()) + n_new;
  if (context <= 0) context = need;
  if (static_cast<int>(prompt.size()) > context)
    throw std::runtime_error("prompt has " + std::to_string(prompt.size()) + " tokens, more than the context " +
                             std::to_string(context));
  KVCache cache;
  // Hybrid cache: streaming heads keep sink + window; with a router each layer is sized once it is routed.
  if (m.router) cache.init_deferred(m.config, std::min(context, need));
  else cache.init(m.config, std::min(context, need), &m.routing);
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
