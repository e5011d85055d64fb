#pragma once
// Dev area (llm.c's dev/cuda): the XAttention estimator's earlier forms. The engine estimates with the scores through
// cuBLASLt (xattn_estimate_cuda, src/cuda/xattn_estimate_gemm.cu) or, as a candidate, the Fused form
// (src/cuda/xattn_estimate_fused.cu); these are kept to be timed against them (bench_attention_gpu --xa-estimate)
// and as the GPU tests' second opinion:
//   Simple             one CTA per (query block, query head), fp32 CUDA-core dot products;
//   TensorCore         one CTA per (query block, KV head), mma.sync over 16 or 32 folded query rows, in one pass
//                      where the per-(row, block) log-sum-exps fit shared memory, else two;
//   TensorCoreTwoPass  the two-pass form forced;
//   Auto               TensorCore where (query heads per KV head) x block / stride <= 16, else Simple.
// Their speeds against the engine's form are in docs/PERFORMANCE.md.
#include <cuda_runtime.h>

#include "elastic/cuda_attention.h"

namespace elastic::cuda {

// p.kernel picks the form (Gemm and Fused refused: xattn_estimate_cuda runs them). Same lists and checks as
// xattn_estimate_cuda; throws std::invalid_argument naming the problem, also where a form's shared memory does not fit.
void xattn_estimate_variant(const XAttnEstimateParams& p, cudaStream_t stream);

}  // namespace elastic::cuda
