#pragma once
// Forward and backward of the decoder's ops for router training, in float (training) or double (gradient checks).
// Backbone weights stay the model's fp32 arrays; activations and gradients are Real. Backward functions ADD into
// their input-gradient outputs so that branches (residuals, q/k/v) sum without extra buffers.
#include <cstddef>
#include <vector>

namespace elastic::train {

// C[M,N] = alpha * op(A) * op(B) + beta * C (row-major; op = transpose when the flag is set).
template <class Real>
void gemm(bool ta, bool tb, int M, int N, int K, Real alpha, const Real* A, int lda, const Real* B, int ldb, Real beta,
          Real* C, int ldc);

// y[T, N] = x[T, K] W[N, K]^T (+ b[N]); W and b are frozen fp32 weights.
template <class Real>
void linear_fwd(const Real* x, const float* W, const float* b, Real* y, int T, int N, int K);
// dx[T, K] += dy[T, N] W[N, K]  (activation gradient only: the backbone is frozen).
template <class Real>
void linear_bwd(const Real* dy, const float* W, Real* dx, int T, int N, int K);

// RMSNorm over rows of n: y = w * x / sqrt(mean(x^2) + eps). In place allowed for fwd.
template <class Real>
void rmsnorm_fwd(const Real* x, const float* w, Real* y, int rows, int n, float eps);
// dx += d/dx of sum(dy * y).
template <class Real>
void rmsnorm_bwd(const Real* x, const float* w, const Real* dy, Real* dx, int rows, int n, float eps);

// rotate_half RoPE on rows [T, H, hd] at positions pos0 + t, in place; the backward rotates by the negative angle.
template <class Real>
void rope_fwd(Real* x, int T, int H, int hd, int pos0, const std::vector<float>& inv_freq);
template <class Real>
void rope_bwd(Real* dx, int T, int H, int hd, int pos0, const std::vector<float>& inv_freq);

// a = silu(g) * u elementwise; backward: dg += da * u * silu'(g), du += da * silu(g).
template <class Real>
void swiglu_fwd(const Real* g, const Real* u, Real* a, size_t n);
template <class Real>
void swiglu_bwd(const Real* g, const Real* u, const Real* da, Real* dg, Real* du, size_t n);

// Cross-entropy of one logits row against `target`; writes d loss / d logits * scale into dlogits. Returns the loss.
template <class Real>
Real cross_entropy_row(const Real* logits, int V, int target, Real scale, Real* dlogits);

}  // namespace elastic::train
