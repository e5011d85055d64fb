#pragma once
// The argument checks every XAttention estimator form shares (the engine's xattn_estimate_cuda and the dev area's
// variants), with the caller's name in the message.
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

}  // namespace elastic::cuda
