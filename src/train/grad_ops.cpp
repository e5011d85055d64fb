#include "train/grad_ops.h"

#include <cblas.h>

#include "model/ops.h"

#include <algorithm>
#include <cmath>

namespace elastic::train {

template <>
void gemm<float>(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
                 float beta, float* C, int ldc) {
  elastic::sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);  // the engine's one threaded product
}
template <>
void gemm<double>(bool ta, bool tb, int M, int N, int K, double alpha, const double* A, int lda, const double* B,
                  int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda,
              B, ldb, beta, C, ldc);
}

namespace {
// A frozen fp32 weight as Real: no copy for float, a widened copy for double (gradient checks only).
template <class Real>
struct WeightAs {
  std::vector<Real> buf;
  const Real* p;
  WeightAs(const float* w, size_t n) : buf(w, w + n), p(buf.data()) {}
};
template <>
struct WeightAs<float> {
  const float* p;
  WeightAs(const float* w, size_t) : p(w) {}
};
}  // namespace

template <class Real>
void linear_fwd(const Real* x, const float* W, const float* b, Real* y, int T, int N, int K) {
  WeightAs<Real> w(W, static_cast<size_t>(N) * K);
  gemm<Real>(false, true, T, N, K, Real(1), x, K, w.p, K, Real(0), y, N);
  if (b)
    for (int t = 0; t < T; ++t)
      for (int n = 0; n < N; ++n) y[static_cast<size_t>(t) * N + n] += b[n];
}

template <class Real>
void linear_bwd(const Real* dy, const float* W, Real* dx, int T, int N, int K) {
  WeightAs<Real> w(W, static_cast<size_t>(N) * K);
  gemm<Real>(false, false, T, K, N, Real(1), dy, N, w.p, K, Real(1), dx, K);
}

template <class Real>
void rmsnorm_fwd(const Real* x, const float* w, Real* y, int rows, int n, float eps) {
#pragma omp parallel for schedule(static) if (rows > 16)
  for (int r = 0; r < rows; ++r) {
    const Real* xr = x + static_cast<size_t>(r) * n;
    Real* yr = y + static_cast<size_t>(r) * n;
    Real ss = 0;
    for (int i = 0; i < n; ++i) ss += xr[i] * xr[i];
    const Real inv = Real(1) / std::sqrt(ss / n + Real(eps));
    for (int i = 0; i < n; ++i) yr[i] = Real(w[i]) * (xr[i] * inv);
  }
}

template <class Real>
void rmsnorm_bwd(const Real* x, const float* w, const Real* dy, Real* dx, int rows, int n, float eps) {
#pragma omp parallel for schedule(static) if (rows > 16)
  for (int r = 0; r < rows; ++r) {
    const Real* xr = x + static_cast<size_t>(r) * n;
    const Real* gr = dy + static_cast<size_t>(r) * n;
    Real* dr = dx + static_cast<size_t>(r) * n;
    Real ss = 0, dot = 0;
    for (int i = 0; i < n; ++i) {
      ss += xr[i] * xr[i];
      dot += Real(w[i]) * gr[i] * xr[i];
    }
    const Real inv = Real(1) / std::sqrt(ss / n + Real(eps));
    const Real c = dot * inv * inv * inv / n;  // from d(inv)/dx_i = -x_i inv^3 / n
    for (int i = 0; i < n; ++i) dr[i] += inv * Real(w[i]) * gr[i] - c * xr[i];
  }
}

namespace {
template <class Real>
void rope_rotate(Real* x, int T, int H, int hd, int pos0, const std::vector<float>& inv, Real sign) {
  const int half = hd / 2;
#pragma omp parallel for schedule(static) if (T > 16)
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < half; ++i) {
      // The angle is formed in fp32 as the inference path (and HF) does, so float training matches inference.
      const float ang = static_cast<float>(pos0 + t) * inv[i];
      const Real c = std::cos(Real(ang)), s = sign * std::sin(Real(ang));
      for (int h = 0; h < H; ++h) {
        Real* r = x + (static_cast<size_t>(t) * H + h) * hd;
        const Real x1 = r[i], x2 = r[i + half];
        r[i] = x1 * c - x2 * s;
        r[i + half] = x2 * c + x1 * s;
      }
    }
}
}  // namespace

template <class Real>
void rope_fwd(Real* x, int T, int H, int hd, int pos0, const std::vector<float>& inv) {
  rope_rotate(x, T, H, hd, pos0, inv, Real(1));
}
template <class Real>
void rope_bwd(Real* dx, int T, int H, int hd, int pos0, const std::vector<float>& inv) {
  rope_rotate(dx, T, H, hd, pos0, inv, Real(-1));  // a rotation's transpose is the opposite rotation
}

template <class Real>
void swiglu_fwd(const Real* g, const Real* u, Real* a, size_t n) {
#pragma omp parallel for schedule(static) if (n > 4096)
  for (size_t i = 0; i < n; ++i) a[i] = g[i] / (Real(1) + std::exp(-g[i])) * u[i];
}

template <class Real>
void swiglu_bwd(const Real* g, const Real* u, const Real* da, Real* dg, Real* du, size_t n) {
#pragma omp parallel for schedule(static) if (n > 4096)
  for (size_t i = 0; i < n; ++i) {
    const Real s = Real(1) / (Real(1) + std::exp(-g[i]));
    dg[i] += da[i] * u[i] * s * (Real(1) + g[i] * (Real(1) - s));
    du[i] += da[i] * g[i] * s;
  }
}

template <class Real>
Real cross_entropy_row(const Real* logits, int V, int target, Real scale, Real* dlogits) {
  Real mx = logits[0];
  for (int i = 1; i < V; ++i) mx = std::max(mx, logits[i]);
  Real sum = 0;
  for (int i = 0; i < V; ++i) sum += std::exp(logits[i] - mx);
  const Real lse = mx + std::log(sum);
  if (dlogits) {
    for (int i = 0; i < V; ++i) dlogits[i] = scale * std::exp(logits[i] - lse);
    dlogits[target] -= scale;
  }
  return lse - logits[target];
}

#define ELASTIC_INSTANTIATE(R)                                                                    \
  template void linear_fwd<R>(const R*, const float*, const float*, R*, int, int, int);          \
  template void linear_bwd<R>(const R*, const float*, R*, int, int, int);                       \
  template void rmsnorm_fwd<R>(const R*, const float*, R*, int, int, float);                    \
  template void rmsnorm_bwd<R>(const R*, const float*, const R*, R*, int, int, float);          \
  template void rope_fwd<R>(R*, int, int, int, int, const std::vector<float>&);                 \
  template void rope_bwd<R>(R*, int, int, int, int, const std::vector<float>&);                 \
  template void swiglu_fwd<R>(const R*, const R*, R*, size_t);                                  \
  template void swiglu_bwd<R>(const R*, const R*, const R*, R*, R*, size_t);                    \
  template R cross_entropy_row<R>(const R*, int, int, R, R*);
ELASTIC_INSTANTIATE(float)
ELASTIC_INSTANTIATE(double)
#undef ELASTIC_INSTANTIATE

}  // namespace elastic::train
