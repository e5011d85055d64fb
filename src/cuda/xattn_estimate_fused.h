#pragma once
// The fused estimator's entry (xattn_estimate_fused.cu); callers go through xattn_estimate_cuda with
// kernel = XAttnEstimateKernel::Fused, which checks the common parameters and dispatches here.
#include <cuda_runtime.h>

#include "elastic/cuda_attention.h"

namespace elastic::cuda {

// p.scratch of at least xattn_fused_scratch_bytes(T, pos0 + T, scored KV heads, query heads per KV head, head_dim,
// stride, block) bytes, p.xa_kv_heads as for the Gemm form; p.gemm is not used. head_dim 64 or 128, stride 8 or 16,
// block / stride 4, 8 or 16; throws std::invalid_argument naming the problem otherwise.
void xattn_estimate_fused(const XAttnEstimateParams& p, cudaStream_t stream);

}  // namespace elastic::cuda
