#pragma once
// Attention entry point shared by every head mode. The hybrid modes (streaming, XAttention) plug in here:
// each (layer, KV head) carries its own mode, and a query head follows its KV head.
#include <cstdint>
#include <string>
#include <vector>

namespace elastic {

enum class HeadMode : uint8_t { Full = 0 };

// Per-(layer, KV head) routing table; mode[l * n_kv_heads + h].
struct RoutingTable {
  int n_layers = 0;
  int n_kv_heads = 0;
  std::vector<HeadMode> mode;
  static RoutingTable all_full(int n_layers, int n_kv_heads);
  HeadMode at(int layer, int kv_head) const { return mode[static_cast<size_t>(layer) * n_kv_heads + kv_head]; }
};

// One layer's attention for T new query positions [pos0, pos0 + T).
struct AttentionArgs {
  const float* q = nullptr;       // [T, Hq, hd], RoPE applied
  const float* const* k = nullptr;  // per KV head: [pos0 + T, hd] cached keys (RoPE applied)
  const float* const* v = nullptr;  // per KV head: [pos0 + T, hd]
  float* out = nullptr;           // [T, Hq, hd]
  int T = 0, pos0 = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  const HeadMode* modes = nullptr;  // [Hkv] routing of this layer
};

// Causal softmax attention with fp32 accumulation; dispatches per KV head on its mode.
void attention_forward(const AttentionArgs& a);

}  // namespace elastic
