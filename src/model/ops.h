#pragma once
// The decoder's CPU building blocks (fp32), shared by the forward pass, the backward pass and the trainer.
#include <string>
#include <vector>

#include "elastic/config.h"
#include "elastic/weight_matrix.h"

namespace elastic {

// C[M, N] = alpha * op(A) * op(B) + beta * C, row-major, op = transpose when the flag is set: every fp32 matrix
// product of the engine and the trainer. OpenBLAS runs single-threaded inside it and the product is split over the
// OpenMP threads, so one thread pool (OpenMP's, sized by -t) owns the cores: OpenBLAS's own pool beside it
// oversubscribed them and busy-waited (issue 24: 42% of decode samples in libgomp's spin loop at -t 2).
void sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
           float beta, float* C, int ldc);

// x[i] = exp(x[i]) over n floats: glibc's vector expf, 8 lanes at a time (within 1 ulp, the same function the scalar
// expf is), so the softmax of the attention tiles (inference and training) costs a fraction of their products.
void exp_inplace(float* x, int n);

// The warning sgemm prints once when OpenBLAS picked kernels older than the CPU (OpenBLAS 0.3.21 does not recognise
// some recent Xeons and falls back to its SSE3 "Prescott" kernels: prefill 2-3x slower), naming the remedy; empty
// when its kernels fit the CPU. `core` is openblas_get_corename().
std::string blas_kernel_warning(const std::string& core, bool cpu_avx2, bool cpu_avx512);

// y[T, N] = x[T, K] * W[N, K]^T (+ b), N and K from W. Up to kRowwiseRows rows (decode, small batches) this is
// linear_rowwise; more rows go to sgemm, a block-format W widened one panel of rows at a time (a matrix of up to 8M
// weights in one panel, so its result has the bits of its fp32 copy's).
constexpr int kRowwiseRows = 8;
void linear(const float* x, const WeightMatrix& W, const std::vector<float>& b, float* y, int T);
// y[B, N] = x[B, K] * W[N, K]^T (+ b) where every output is one dot product whose order of operations depends only on
// K: the same bits for any B, any row position and any thread count (batch-invariant decode), and the same bits for a
// block-format W as for its fp32 widening. It reads W in place, block formats widened in registers; sgemm repacks W
// on every call, which at one row was 81% of a decode profile.
void linear_rowwise(const float* x, const WeightMatrix& W, const std::vector<float>& b, float* y, int B);
// RMSNorm over rows of length n, fp32 math as in HF: x * rsqrt(mean(x^2) + eps) * w. In place allowed.
void rmsnorm_rows(const float* x, const float* w, float* y, int rows, int n, float eps);
// Inverse frequencies [hd/2] with optional llama3 scaling (same formulas as transformers' rope init).
std::vector<float> compute_rope_inv_freq(const ModelConfig& c);
// rotate_half RoPE in place on rows [T, H, hd] at positions pos0 + t.
void apply_rope(float* x, int T, int H, int hd, int pos0, const std::vector<float>& inv);

}  // namespace elastic
