#pragma once
// What a block-sparse pattern with an estimator (XAttention) keeps on a real prompt, per (layer, KV head): the share
// of causal key blocks its selection computed. Random Q/K make XAttention keep ~89% of blocks; real attention is more
// peaked, so the speed XAttention can reach depends on this figure (`elastic bench --density`, CPU reference).
#include <cmath>
#include <string>
#include <vector>

#include "elastic/attention.h"

namespace elastic {

struct HeadDensity {
  int n_layers = 0, n_kv_heads = 0;
  std::vector<double> kept;  // [L * Hkv]: kept / causal blocks for heads whose pattern selects; NaN for the others
  // Tiles the GPU's paired walk computes per tile the selections keep (AttentionStats::xattn_paired_tiles /
  // xattn_kept_tiles); NaN without selections. 1 when paired heads keep the same 128-key groups.
  double paired_walk_cost = NAN;
  // The same for the kernel's row pairs, one head's two 64-row query tiles walked together
  // (AttentionStats::xattn_rowpair_*); NaN without selections. Near 1 at block 128 (the tiles share a selection and a
  // 128-key block is a whole step; the first tile also computes the second's diagonal tile, masked).
  double rowpair_walk_cost = NAN;
  int heads() const;         // how many heads have a figure
  double mean() const;       // over the heads that have one (NaN when none)
};

// From a prefill's per-layer counts (AttentionStats::per_layer set before the run) under routing r. Throws
// std::invalid_argument when the counts are missing or do not match r's shape.
HeadDensity selected_head_density(const AttentionStats& st, const RoutingTable& r);

// Markdown: a summary line (heads, mean, quantiles, least and most kept) and one row per layer (each head's share).
std::string head_density_markdown(const HeadDensity& d);

}  // namespace elastic
