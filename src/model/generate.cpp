#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>

#include "elastic/engine.h"
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

std::vector<int32_t> generate(const Model& m, const RoutePolicy& policy, const std::vector<int32_t>& prompt, int n_new, int context,
                              const SamplerParams& sp, bool stop_at_eos, GenerateStats* stats,
                              const std::function<void(int32_t)>& on_token, int prefill_chunk) {
  if (prompt.empty()) throw std::runtime_error("generate: empty prompt");
  const int capacity = generation_capacity(static_cast<int64_t>(prompt.size()), n_new, context, m.config.max_positions);
  // The engine's loop on the CPU backend; the model outlives the call, so the backend borrows it.
  const std::shared_ptr<const Model> borrowed(&m, [](const Model*) {});
  const auto be = cpu_sequence_backend(borrowed, capacity, prefill_chunk);
  return generate(*be, m.config, prompt, n_new, policy.fixed_table(), policy.prompt_router(), sp, stop_at_eos, stats,
                  on_token);
}

}  // namespace elastic
