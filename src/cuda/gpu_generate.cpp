// Prompt + continuation on the GPU model, with the CPU generate()'s statistics.
#include <algorithm>
#include <chrono>

#include "elastic/attention.h"
#include "elastic/gpu_model.h"

namespace elastic::cuda {

std::vector<int32_t> generate(GpuModel& g, const std::vector<int32_t>& prompt, int n_new, const RoutingTable* routing,
                              const PromptRouter* router, const SamplerParams& sp, bool stop_at_eos,
                              GenerateStats* stats, const std::function<void(int32_t)>& on_token) {
  const ModelConfig& c = g.config();
  if (prompt.empty()) throw std::invalid_argument("generate: empty prompt");
  const bool greedy = sp.temperature <= 0.f;
  Sampler sampler(sp);
  GpuPrefillStats ps;
  std::vector<float> logits;
  using clock = std::chrono::steady_clock;
  g.prefill(prompt.data(), int(prompt.size()), routing, router, &logits, false, &ps);
  std::vector<int32_t> out;
  int fed = int(prompt.size());  // rows that ran attention: the prompt, then one per decode step
  const auto t1 = clock::now();
  int32_t id = greedy ? int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin())
                      : sampler.sample(logits.data(), c.vocab);
  for (int i = 0; i < n_new; ++i) {
    out.push_back(id);
    if (on_token) on_token(id);
    if (stop_at_eos && std::find(c.eos_ids.begin(), c.eos_ids.end(), id) != c.eos_ids.end()) break;
    // A full sequence stops as the CPU's generate does (the last token is returned, not fed), instead of the
    // decode step refusing mid-stream.
    if (i + 1 == n_new || g.length() >= g.max_ctx()) break;
    const int32_t next = g.decode(id, greedy ? nullptr : &logits);
    ++fed;
    id = greedy ? next : sampler.sample(logits.data(), c.vocab);
  }
  if (stats) {
    stats->prompt_tokens = int(prompt.size());
    stats->new_tokens = int(out.size());
    stats->prefill_s = ps.total_ms / 1e3;
    stats->decode_s = std::chrono::duration<double>(clock::now() - t1).count();
    stats->kv_bytes = ps.kv_bytes;
    stats->routing = g.routing();
    // The CPU counts the work of every row it runs; the same figures from the routing alone (tests/test_model.cpp
    // ties the two), so generate prints one Omega_ESR and FLOPs ratio on either device. XAttention heads: NaN.
    stats->attn = routed_prefill_stats(g.routing(), fed);
    stats->attn.seconds = ps.attention_ms / 1e3;
  }
  return out;
}

}  // namespace elastic::cuda
