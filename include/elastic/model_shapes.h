#pragma once
// Named model shapes (from the published Hugging Face configs) and random-weight models of any shape, so speed can be
// measured without real weights.
#include <cstdint>
#include <string>
#include <vector>

#include "elastic/model.h"

namespace elastic {

// "qwen3-0.6b", "qwen3-4b", "qwen3-8b", "llama-3.1-8b", "tiny" (2 layers, hidden 64: tests). Throws on others.
ModelConfig named_shape(const std::string& name);
const std::vector<std::string>& named_shape_names();

// Gaussian weights (std 0.02, norms 1) for a config; all-full routing. Memory: 4 bytes per parameter.
Model random_model(const ModelConfig& c, uint64_t seed);

// A routing with round(omega * L * Hkv) heads in sparse_mode, spread at random (seeded), the rest full.
RoutingTable random_routing(int n_layers, int n_kv_heads, double omega, HeadMode sparse_mode, uint64_t seed);

}  // namespace elastic
