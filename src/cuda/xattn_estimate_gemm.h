#pragma once
// The cuBLASLt form of the XAttention estimator (xattn_estimate_gemm.cu), dispatched by xattn_estimate_cuda.
#include <cuda_runtime.h>

#include "elastic/cuda_attention.h"

namespace elastic::cuda {

// Whether p carries what the Gemm form needs (gemm, and scratch for this chunk and its scored heads).
bool xattn_gemm_fits(const XAttnEstimateParams& p);
// The Gemm form; p has been validated by xattn_estimate_cuda. Throws std::invalid_argument where it does not fit.
void xattn_estimate_gemm(const XAttnEstimateParams& p, cudaStream_t stream);

}  // namespace elastic::cuda
