#pragma once
// The engine's loops over a SequenceBackend, the same on every device: generate (prefill, sample, decode, stop at EOS,
// -n or the backend's capacity) and the one rule for a run's figures.
#include <cstdint>
#include <functional>
#include <vector>

#include "elastic/generate.h"
#include "elastic/sequence_backend.h"

namespace elastic {

// A run's attention figures (Omega_ESR, attention FLOPs vs full) for `rows` rows that ran attention under `used`:
// what the backend counted where it counts (counted_attention), else routed_prefill_stats(used, rows), which equals
// the CPU's count for full and streaming heads (tests/test_model.cpp) and is NaN with XAttention heads (input
// dependent: not claimed).
// prompt_only: the figures of the prompt's prefill (rows = its length), else of every row the sequence ran.
AttentionStats run_attention_figures(const SequenceBackend& be, const RoutingTable& used, int rows, bool prompt_only);

// Prefills `prompt` under `routing` (or `router`'s decision, or all full), then emits up to n_new tokens: stops at an
// EOS id (stop_at_eos), after n_new, or when the sequence reaches the backend's capacity (the last token is returned,
// not fed). on_token sees each id as it is produced. stats: timings, KV bytes, routing, figures.
std::vector<int32_t> generate(SequenceBackend& be, const ModelConfig& c, const std::vector<int32_t>& prompt, int n_new,
                              const RoutingTable* routing, const PromptRouter* router, const SamplerParams& sp,
                              bool stop_at_eos, GenerateStats* stats, const std::function<void(int32_t)>& on_token = {});

}  // namespace elastic
