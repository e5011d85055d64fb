#pragma once
// Routed block-sparse causal attention for training: forward keeps each row's log-sum-exp, backward recomputes the
// probabilities from it (flash-style) and gives dQ, dK, dV. One instance per branch: the full branch (every head
// Full) and the sparse branch (every head Streaming or every head XAttn) of the router's soft/hard mixture.
#include <vector>

#include "elastic/attention.h"
#include "elastic/sparse_pattern.h"

namespace elastic::train {

// Which blocks each query head computes: each KV head's pattern rule, looked up in the registry once here (the
// attention loops ask per (head, query block, key block)), plus the XAttention selections per query head.
struct BlockKeep {
  using Rule = bool (*)(int qb, int kb, const SparseSettings& s, const BlockMask* sel);
  std::vector<Rule> rule;                         // [Hkv]
  const SparseSettings* sparse = nullptr;
  const std::vector<BlockMask>* xmask = nullptr;  // [Hq] when any head is XAttn
  int group = 1;                                  // Hq / Hkv
  // Per KV head: whether the backward computes it. A head whose branch weight is exactly 0 (hard routing) gets a
  // zero dout, so skipping it changes nothing and saves that branch's backward for the head.
  std::vector<char> backward;                     // [Hkv], all 1 unless the caller clears some
  BlockKeep(const HeadMode* modes, int n_kv_heads, const SparseSettings& s, const std::vector<BlockMask>* masks,
            int hq_per_kv)
      : sparse(&s), xmask(masks), group(hq_per_kv) {
    for (int h = 0; h < n_kv_heads; ++h) rule.push_back(sparse_pattern(modes[h]).keeps);
    backward.assign(n_kv_heads, 1);
  }
  bool operator()(int h, int qb, int kb) const {
    return rule[h / group](qb, kb, *sparse, xmask && !xmask->empty() ? &(*xmask)[h] : nullptr);
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
