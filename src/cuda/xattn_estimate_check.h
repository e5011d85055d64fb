#pragma once
// The argument checks every XAttention estimator form shares (the engine's xattn_estimate_cuda and the dev area's
// variants), with the caller's name in the message; and the scored-head list the engine's product forms (cuBLASLt,
// fused wgmma) launch over.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "elastic/cuda_attention.h"

namespace elastic::cuda {

inline void check_xattn_estimate(const XAttnEstimateParams& p, const char* fn) {
  auto bad = [fn](const std::string& what) { throw std::invalid_argument(std::string(fn) + ": " + what); };
  if (!p.q || !p.k || !p.meta || !p.blocks || !p.offsets || !p.counts) bad("null q, k, meta or output lists");
  if (p.T <= 0 || p.pos0 < 0) bad("T must be > 0 and pos0 >= 0");
  if (p.block != 64 && p.block != 128) bad("block must be 64 or 128 (got " + std::to_string(p.block) + ")");
  if (p.stride < 1 || p.block % p.stride || p.block / p.stride > 16)
    bad("stride must divide block with block/stride <= 16 (got stride " + std::to_string(p.stride) + ")");
  if (p.pos0 % p.block) bad("pos0 must be a multiple of block (got " + std::to_string(p.pos0) + ")");
  if (!(p.tau > 0.f && p.tau <= 1.f)) bad("tau must be in (0, 1]");
  if (p.n_heads <= 0 || p.n_kv_heads <= 0 || p.n_heads % p.n_kv_heads)
    bad("n_heads must be a positive multiple of n_kv_heads");
}

inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// The KV heads a product form scores, passed by value to its kernels: the routed heads when the caller lists them
// (XAttnEstimateParams::xa_kv_heads), else every KV head.
constexpr int kMaxKvHeads = 64;
struct HeadList {
  int32_t kv[kMaxKvHeads];    // slot x -> KV head
  int32_t slot[kMaxKvHeads];  // KV head -> slot x, or -1 when not scored
};
inline HeadList head_list(const XAttnEstimateParams& p, int& X, const std::string& who) {
  if (p.n_kv_heads > kMaxKvHeads)
    throw std::invalid_argument(who + " takes at most " + std::to_string(kMaxKvHeads) + " KV heads (got " +
                                std::to_string(p.n_kv_heads) + ")");
  HeadList l;
  for (int h = 0; h < kMaxKvHeads; ++h) l.kv[h] = 0, l.slot[h] = -1;
  X = 0;
  for (int i = 0; i < (p.xa_kv_heads ? p.n_xa_kv_heads : p.n_kv_heads); ++i) {
    const int h = p.xa_kv_heads ? p.xa_kv_heads[i] : i;
    if (h < 0 || h >= p.n_kv_heads || l.slot[h] >= 0)
      throw std::invalid_argument(who + "'s xa_kv_heads holds an invalid or repeated KV head (" + std::to_string(h) +
                                  " of " + std::to_string(p.n_kv_heads) + ")");
    l.slot[h] = X;
    l.kv[X++] = h;
  }
  return l;
}

}  // namespace elastic::cuda
