#pragma once
// Projections through cuBLASLt: Y[M, N] = X[M, K] * W[N, K]^T (the Hugging Face [out, in] weight layout), bf16
// inputs, fp32 accumulation, bf16 or fp32 output, optional fused bf16 bias [N]. One handle and one workspace per
// Gemm object; algorithm choices are cached per (M, N, K, output type). All pointers are device pointers.
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

namespace elastic::cuda {

class Gemm {
 public:
  explicit Gemm(size_t workspace_bytes = 32u << 20);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // Y = X W^T (+ bias); X [M, K] row-major bf16, W [N, K] row-major bf16, Y [M, N] row-major.
  // beta = 1 accumulates into Y (Y += X W^T), used for residual adds fused into the output projections.
  // Throws std::invalid_argument on non-positive shapes; std::runtime_error naming the cuBLASLt status.
  void bf16(const uint16_t* X, const uint16_t* W, uint16_t* Y, int M, int N, int K, cudaStream_t stream,
            const uint16_t* bias = nullptr, float beta = 0.f);
  void bf16_out_f32(const uint16_t* X, const uint16_t* W, float* Y, int M, int N, int K, cudaStream_t stream);

  // batch independent products at element strides: Y[b] = X[b] W[b]^T, fp32 out, b < batch (X + b * stride_x, ...).
  // Never the small-M kernel. XAttention's estimator scores every routed KV head in one call.
  void bf16_out_f32_batched(const uint16_t* X, const uint16_t* W, float* Y, int M, int N, int K, int batch,
                            int64_t stride_x, int64_t stride_w, int64_t stride_y, cudaStream_t stream);

  // The activation gradient of a projection: dX[M, K] (+)= dY[M, N] W[N, K] (W the same [out, in] buffer as the
  // forward), fp32 out; beta = 1 adds into dX (branches summing into one gradient).
  void bf16_dx_f32(const uint16_t* dY, const uint16_t* W, float* dX, int M, int N, int K, cudaStream_t stream,
                   float beta = 0.f);

  size_t workspace_bytes() const { return ws_bytes_; }

  // Row invariance (a server's batched decode): calls with M <= max_rows run the algorithm the heuristic picks for
  // max_rows rows, whatever M is, so a row of Y gets the same bits alone and in any batch of up to max_rows (the
  // heuristic's choice otherwise changes with M: another tiling or split-K, another summation order). 0 (the
  // default) turns it off. Set before the first call; throws std::runtime_error naming the shape when the pinned
  // algorithm does not run a smaller M.
  void pin_rows(int max_rows);
  int pinned_rows() const;

  // Calls with M <= rows (at most kSmallMMaxRows = 4, src/cuda/gemv_small_m.cuh) run Elastic's small-M kernel (a
  // warp per output feature streaming W) instead of cuBLASLt, where K is a multiple of 8 and X, W are 16-byte
  // aligned; 0 (the default) keeps cuBLASLt for every M. Ignored while rows are pinned (pin_rows: one algorithm for
  // every batch size). Each row's sum runs in the same order for every M it allows.
  void set_small_m_rows(int rows);
  int small_m_rows() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  size_t ws_bytes_;
};

}  // namespace elastic::cuda
