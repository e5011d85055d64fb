#pragma once
// XAttention block selection (antidiagonal scoring), CPU reference.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace elastic {

struct XAttnParams {
  int block = 64;     // block size B (64 default, 128 allowed)
  int stride = 16;    // antidiagonal stride S (16 default, 8 allowed); must divide block
  float tau = 0.9f;   // cumulative softmax-mass threshold
};

// Selected key blocks per query block for one head, causal.
// mask[qb * n_blocks + kb] = 1 when key block kb is computed for query block qb (kb <= qb always).
struct BlockMask {
  int n_blocks = 0;  // ceil(T / block)
  std::vector<uint8_t> mask;
  bool at(int qb, int kb) const { return mask[static_cast<size_t>(qb) * n_blocks + kb] != 0; }
  int64_t selected() const;  // number of selected (qb, kb) pairs
};

// q: [T, hd] one query head (RoPE applied), k: [T, hd] its KV head. Returns the selection as published:
// stride-S antidiagonal sums form a [T/S, T/S] reshaped score matrix, scaled by 1/sqrt(hd)/S, causal-masked,
// softmax per reshaped row, summed into B x B block scores, then per query-block row keep block 0 and the diagonal
// and add blocks by descending score until the cumulative mass reaches tau. q_begin: the first query position a
// chunked prefill asks for (a multiple of the block); the query blocks before it are neither scored nor selected (their
// mask rows stay empty), since a block's row depends only on its own queries and the keys before it.
BlockMask xattn_select(const float* q, const float* k, int T, int hd, const XAttnParams& p, int q_begin = 0);

}  // namespace elastic
