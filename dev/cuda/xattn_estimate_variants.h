#pragma once
// Dev area (llm.c's dev/cuda): the XAttention estimator's earlier forms. The engine estimates with the scores through
// cuBLASLt (xattn_estimate_cuda, src/cuda/xattn_estimate_gemm.cu); these are kept to be timed against it
// (bench_attention_gpu --xa-estimate) and as the GPU tests' second opinion:
//   Simple             one CTA per (query block, query head), fp32 CUDA-core dot products;
//   TensorCore         one CTA per (query block, KV head), mma.sync over 16 or 32 folded query rows, in one pass
//                      where the per-(row, block) log-sum-exps fit shared memory, else two;
//   TensorCoreTwoPass  the two-pass form forced;
//   Fused              the candidate engine form (xattn_estimate_fused.cu): the scores on wgmma straight from q and k
//                      (TMA folds them), per-(row, key block) log-sum-exps instead of scores, a sort-free
//                      selection; needs scratch of xattn_fused_scratch_bytes; head_dim 64/128, stride 8/16;
//   Auto               TensorCore where (query heads per KV head) x block / stride <= 16, else Simple.
// Their speeds against the engine's form are in docs/PERFORMANCE.md.
#include <cuda_runtime.h>

#include "elastic/cuda_attention.h"

namespace elastic::cuda {

// p.kernel picks the form (Gemm refused: xattn_estimate_cuda runs it). Same lists and checks as xattn_estimate_cuda;
// throws std::invalid_argument naming the problem, also where a form's shared memory does not fit.
void xattn_estimate_variant(const XAttnEstimateParams& p, cudaStream_t stream);

// The Fused form (xattn_estimate_variant with kernel Fused calls it): p.scratch of at least
// xattn_fused_scratch_bytes(T, pos0 + T, scored KV heads, query heads per KV head, head_dim, stride, block) bytes,
// p.xa_kv_heads as for the Gemm form; p.gemm is not used.
void xattn_estimate_fused(const XAttnEstimateParams& p, cudaStream_t stream);
size_t xattn_fused_scratch_bytes(int T, int n_pos, int n_kv_heads, int n_heads_per_kv, int head_dim, int stride,
                                 int block);

}  // namespace elastic::cuda
