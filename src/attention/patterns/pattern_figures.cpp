// The figures every consumer reads off a pattern's block rule (sparse_pattern.h): prefill cost and ESR blocks, decode's
// kept positions, cache slots.
#include <algorithm>
#include <cmath>

#include "elastic/sparse_pattern.h"

namespace elastic {

PatternPrefillCost pattern_prefill_cost(HeadMode m, int T, const SparseSettings& s) {
  PatternPrefillCost c;
  const SparsePattern& p = sparse_pattern(m);
  const int B = s.block, nb = (T + B - 1) / B;
  for (int qb = 0; qb < nb; ++qb) {
    const int rows = std::min(T, (qb + 1) * B) - qb * B;
    for (int kb = 0; kb <= qb; ++kb) {
      const double pairs = kb < qb ? double(rows) * B : double(rows) * (rows + 1) / 2;
      const double w = double(rows) / B;  // a partial last block counts by its rows, as attention_forward does
      c.pairs_full += pairs;
      c.blocks_causal += w;
      if (p.keeps(qb, kb, s, nullptr)) c.pairs += pairs;
      else c.blocks_skipped += w;
    }
  }
  if (p.select) c.pairs = c.blocks_skipped = NAN;  // input dependent: not a made-up number
  return c;
}

int64_t pattern_kept_positions(HeadMode m, int n_pos, const SparseSettings& s) {
  if (n_pos <= 0) return 0;
  const int B = s.block, qb = (n_pos - 1) / B;
  int64_t kept = 0;
  for (int kb = 0; kb <= qb; ++kb)
    if (pattern_holds(m, qb, kb, s)) kept += std::min<int64_t>(B, int64_t(n_pos) - int64_t(kb) * B);
  return kept;
}

int64_t pattern_cache_slots(HeadMode m, const SparseSettings& s, int64_t capacity, int64_t* sink_out,
                            int64_t* ring_out) {
  int64_t sink = 0, ring = 0;
  const SparsePattern& p = sparse_pattern(m);
  const bool bounded = p.bounded_slots && p.bounded_slots(s, sink, ring) && sink + ring < capacity;
  if (!bounded) sink = ring = 0;
  if (sink_out) *sink_out = sink;
  if (ring_out) *ring_out = ring;
  return bounded ? sink + ring : capacity;
}

}  // namespace elastic
