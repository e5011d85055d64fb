// The engine's generate loop and run figures (engine.h), shared by the CPU and CUDA backends.
#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "elastic/engine.h"

namespace elastic {

int32_t SequenceBackend::decode_greedy(int32_t id) {
  decode(id, greedy_logits_);
  return static_cast<int32_t>(std::max_element(greedy_logits_.begin(), greedy_logits_.end()) - greedy_logits_.begin());
}

void SequenceBackend::extend(const std::vector<int32_t>& ids, std::vector<float>& all_logits) {
  all_logits.clear();
  std::vector<float> row;
  for (const int32_t id : ids) {
    decode(id, row);
    all_logits.insert(all_logits.end(), row.begin(), row.end());
  }
}

AttentionStats run_attention_figures(const SequenceBackend& be, const RoutingTable& used, int rows, bool prompt_only) {
  if (const AttentionStats* counted = be.counted_attention(prompt_only)) return *counted;
  return routed_prefill_stats(used, rows);
}

std::vector<int32_t> generate(SequenceBackend& be, const ModelConfig& c, const std::vector<int32_t>& prompt, int n_new,
                              const RoutingTable* routing, const PromptRouter* router, const SamplerParams& sp,
                              bool stop_at_eos, GenerateStats* stats, const std::function<void(int32_t)>& on_token) {
  using clock = std::chrono::steady_clock;
  if (prompt.empty()) throw std::runtime_error("generate: empty prompt");
  const bool greedy = sp.temperature <= 0.f;
  Sampler sampler(sp);
  std::vector<float> logits;
  RoutingTable used;
  const auto t0 = clock::now();
  be.prefill(prompt, routing, router, logits, used);
  const auto t1 = clock::now();
  std::vector<int32_t> out;
  int32_t id = sampler.sample(logits.data(), c.vocab);  // greedy: the first largest logit, as decode_greedy
  for (int i = 0; i < n_new; ++i) {
    out.push_back(id);
    if (on_token) on_token(id);
    if (stop_at_eos && std::find(c.eos_ids.begin(), c.eos_ids.end(), id) != c.eos_ids.end()) break;
    if (i + 1 == n_new || be.length() >= be.capacity()) break;  // a full sequence stops: its last token is not fed
    if (greedy) {
      id = be.decode_greedy(id);
    } else {
      be.decode(id, logits);
      id = sampler.sample(logits.data(), c.vocab);
    }
  }
  if (stats) {
    stats->prompt_tokens = static_cast<int>(prompt.size());
    stats->new_tokens = static_cast<int>(out.size());
    stats->prefill_s = std::chrono::duration<double>(t1 - t0).count();
    stats->decode_s = std::chrono::duration<double>(clock::now() - t1).count();
    stats->kv_bytes = be.kv_bytes();
    stats->routing = used;
    stats->attn = run_attention_figures(be, used, be.length(), false);  // the rows that ran: prompt + fed tokens
  }
  return out;
}

}  // namespace elastic
