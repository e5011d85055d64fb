#pragma once
// Head-parallel prefill: the KV heads of a layer (each with its query heads) are split across ranks, each rank
// computes its heads' attention, and the ranks combine the outputs. Routing makes heads unequal (a full head at 64K
// costs ~14x a streaming one with a 2K window), so heads are assigned by their work, not by count.
#include <vector>

#include "elastic/attention.h"
#include "elastic/comm.h"

namespace elastic {

// Causal (query, key) pairs one KV head's prefill attention computes at T tokens, per query head: exact for full and
// streaming heads; an XAttention head counts xattn_keep of the full pairs (its blocks depend on the input).
double head_prefill_pairs(HeadMode m, int T, const SparseSettings& s, double xattn_keep = 0.5);

struct HeadPlan {
  int world = 1, n_layers = 0, n_kv_heads = 0;
  std::vector<int> owner;    // [L * Hkv] rank that computes each (layer, KV head)
  std::vector<double> load;  // [world] pairs summed over every layer
  double imbalance() const;  // max load / mean load (1 = even)
  std::vector<uint8_t> mask(int layer, int rank) const;  // [Hkv] 1 where rank owns the head
};

// Per layer, longest-processing-time first: heads by descending cost go to the least-loaded rank (loads carried
// across layers, ties to the lower rank / head), which keeps every rank within one head's cost of the mean.
HeadPlan plan_head_parallel(const RoutingTable& r, int T, int world, double xattn_keep = 0.5);

// One layer's attention, head-parallel: this rank computes the heads the plan gives it, then the ranks sum their
// outputs (zero outside their own heads, so the sum is exact) and every rank holds the whole [T, Hq, hd] output.
void attention_forward_head_parallel(AttentionArgs a, const HeadPlan& plan, int layer, Communicator& comm);

}  // namespace elastic
