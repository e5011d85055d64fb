// Dev area: launches the prefill attention kernel's measurement variants (attention_variants.h) from the shared
// kernel code; the engine's kernels go through the engine's dispatch.
#include <string>

#include "attention_variants.h"
#include "cuda/attention_fwd_kernels.cuh"

namespace elastic::cuda {

void hybrid_attention_fwd_any(const HybridAttnParams& p, cudaStream_t stream) {
  if (is_engine_kernel(p.kernel)) return hybrid_attention_fwd(p, stream);
  // The engine's checks on the same parameters (shapes, pointers, options), with an engine kernel in its place.
  HybridAttnParams check = p;
  check.kernel = AttnKernel::Simple;
  if (!p.q || !p.k || !p.v || !p.out || !p.meta || p.T <= 0 || p.pos0 < 0 || p.n_heads <= 0 || p.n_kv_heads <= 0 ||
      p.n_heads % p.n_kv_heads || (p.block != 64 && p.block != 128) || (p.head_dim != 64 && p.head_dim != 128) ||
      p.opts < -1 || p.opts > kOptsAll || (p.xattn.blocks && (!p.xattn.offsets || !p.xattn.counts)))
    return hybrid_attention_fwd(check, stream);  // throws, naming the field (every field here is one it refuses)
  if ((p.n_heads / p.n_kv_heads) % 2 && !row_pairs_asked(p.opts))
    throw std::invalid_argument("hybrid_attention_fwd: the wgmma kernels need an even number of query heads per KV "
                                "head (or row pairs: opts bit 16)");
  const bool hd64 = p.head_dim == 64;
  switch (p.kernel) {
    case AttnKernel::Wgmma:
      hd64 ? launch_wgmma<64, true, false>(p, stream) : launch_wgmma<128, true, false>(p, stream);
      break;
    case AttnKernel::WgmmaNoPingpong:
      hd64 ? launch_wgmma<64, false, false>(p, stream) : launch_wgmma<128, false, false>(p, stream);
      break;
    case AttnKernel::WgmmaOverlapNoPingpong:
      hd64 ? launch_wgmma<64, false, false, true>(p, stream) : launch_wgmma<128, false, false, true>(p, stream);
      break;
    case AttnKernel::WgmmaPersistent:
      hd64 ? launch_wgmma<64, true, true, true>(p, stream) : launch_wgmma<128, true, true, true>(p, stream);
      break;
    default:
      throw std::invalid_argument("hybrid_attention_fwd_any: unknown kernel " + std::to_string(int(p.kernel)));
  }
}

}  // namespace elastic::cuda
