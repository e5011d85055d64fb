#pragma once
// Projections of 1..kSmallMMaxRows rows (batch-1 decode, small batches): Y[M, N] = X[M, K] W[N, K]^T (+ bias)
// (+ beta * Y), bf16 in, fp32 accumulation, bf16 or fp32 out; the same contract as Gemm::bf16 / bf16_out_f32, used by
// Gemm when GpuOptions::small_m_rows (Gemm::set_small_m_rows) covers M.
//
// Why our own: at M = 1 a projection only streams W (2560 x 19456 bf16 is 100 MB, 1 KB of X), and cuBLASLt's kernels
// for it reached 58-72% of the copy rate in the model's decode step (docs/PERFORMANCE.md). A warp owns one output
// feature; lane l reads W's 16-byte chunks l, l + 32, ... eight at a time before using any (128 B in flight per lane),
// and the X rows come through the read-only cache (a few KiB, every warp of an SM reads the same). No shared memory
// and no block-wide prologue: the dev area's earlier GEMV (dev/cuda/gemv.cu) rebuilt X in shared memory per block
// and loaded its row tail one chunk at a time, and measured slower than cuBLASLt.
#include <cuda_runtime.h>

#include <cstdint>

namespace elastic::cuda {

constexpr int kSmallMMaxRows = 4;

// True when the kernel takes this call: 1 <= M <= kSmallMMaxRows, K a multiple of 8, W and X 16-byte aligned.
bool small_m_gemv_fits(const void* X, const void* W, int M, int K);

// Launches on `stream` (graph-capturable). Y fp32 when y_f32 (then bias null and beta 0), else bf16.
void small_m_gemv(const uint16_t* X, const uint16_t* W, void* Y, bool y_f32, int M, int N, int K,
                  const uint16_t* bias, float beta, cudaStream_t stream);

}  // namespace elastic::cuda
