#pragma once
// Dev area (llm.c's dev/cuda): the prefill attention kernel's measurement variants. The engine runs Auto, Simple and
// WgmmaOverlap (src/cuda/attention_fwd.cu, is_engine_kernel); the wgmma template's other forms are kept here, to be
// timed against it (bench_attention_gpu) and kept correct by their GPU tests while they are measured:
//   Wgmma                   pingpong between the two consumer warpgroups, no intra-warpgroup overlap ("v4")
//   WgmmaNoPingpong         neither
//   WgmmaOverlapNoPingpong  the overlap without the turn-taking
//   WgmmaPersistent         the overlap, one CTA per SM taking work items from a device counter (launches on one
//                           device must not overlap in time: the counter is shared)
// Their speeds against the engine's kernel are in docs/CUDA_ATTENTION.md.
#include <cuda_runtime.h>

#include "elastic/cuda_attention.h"

namespace elastic::cuda {

// hybrid_attention_fwd for any AttnKernel: the engine's kernels through the engine's dispatch, the variants here.
// Throws std::invalid_argument on bad shapes, as hybrid_attention_fwd does.
void hybrid_attention_fwd_any(const HybridAttnParams& p, cudaStream_t stream);

}  // namespace elastic::cuda
