#pragma once
// Routed block-sparse causal attention for training: forward keeps each row's log-sum-exp, backward recomputes the
// probabilities from it (flash-style) and gives dQ, dK, dV. One instance per branch: the full branch (every head
// Full) and the sparse branch (every head Streaming or every head XAttn) of the router's soft/hard mixture.
#include <vector>

#include "elastic/attention.h"

namespace elastic::train {

// Which blocks each query head computes: mode per KV head plus the XAttention selections per query head.
struct BlockKeep {
  const HeadMode* modes = nullptr;             // [Hkv]
  const SparseSettings* sparse = nullptr;
  const std::vector<BlockMask>* xmask = nullptr;  // [Hq] when any head is XAttn
  int group = 1;                                // Hq / Hkv
  bool operator()(int h, int qb, int kb) const {
    return block_kept(modes[h / group], xmask && !xmask->empty() ? &(*xmask)[h] : nullptr, qb, kb, *sparse);
  }
};

// q [T, Hq, hd], k/v [T, Hkv, hd] (RoPE applied); out [T, Hq, hd]; lse [Hq, T] (natural log, of scaled scores).
template <class Real>
void attn_fwd(const Real* q, const Real* k, const Real* v, int T, int Hq, int Hkv, int hd, const BlockKeep& keep,
              Real* out, Real* lse);

// Adds the gradients of sum(dout * out) into dq [T, Hq, hd], dk and dv [T, Hkv, hd].
template <class Real>
void attn_bwd(const Real* q, const Real* k, const Real* v, const Real* out, const Real* lse, const Real* dout, int T,
              int Hq, int Hkv, int hd, const BlockKeep& keep, Real* dq, Real* dk, Real* dv);

// XAttention selections for every query head whose KV head is XAttn (others left empty), from float copies.
template <class Real>
std::vector<BlockMask> xattn_masks(const Real* q, const Real* k, int T, int Hq, int Hkv, int hd, const HeadMode* modes,
                                   const SparseSettings& s);

}  // namespace elastic::train
