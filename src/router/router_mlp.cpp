#include "router/router_mlp.h"

#include <cmath>

#include "train/grad_ops.h"

namespace elastic::router {

using train::gemm;

size_t layer_param_count(int d, int C) {
  const size_t d4 = 4 * static_cast<size_t>(d);
  return 2 * (d4 * d + d4 + d * d4 + d) + static_cast<size_t>(C) * d + C;
}

namespace {

template <class Real>
Real silu(Real x) { return x / (Real(1) + std::exp(-x)); }
template <class Real>
Real silu_grad(Real x) {
  const Real s = Real(1) / (Real(1) + std::exp(-x));
  return s * (Real(1) + x * (Real(1) - s));
}

// Offsets of the ten arrays inside one layer's parameters.
struct Layout {
  size_t w1, b1, w2, b2, w3, b3, w4, b4, w5, b5;
  Layout(int d, int C) {
    const size_t d4 = 4 * static_cast<size_t>(d);
    w1 = 0; b1 = w1 + d4 * d; w2 = b1 + d4; b2 = w2 + d * d4;
    w3 = b2 + d; b3 = w3 + d4 * d; w4 = b3 + d4; b4 = w4 + d * d4;
    w5 = b4 + d; b5 = w5 + static_cast<size_t>(C) * d;
  }
};

// y[n, N] = x[n, K] W[N, K]^T + b
template <class Real>
void dense(const Real* x, const Real* W, const Real* b, Real* y, int n, int N, int K) {
  gemm<Real>(false, true, n, N, K, Real(1), x, K, W, K, Real(0), y, N);
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < N; ++c) y[static_cast<size_t>(r) * N + c] += b[c];
}

// dW += dy^T x, db += colsum(dy), dx += dy W (dx may be null).
template <class Real>
void dense_bwd(const Real* x, const Real* W, const Real* dy, Real* dW, Real* db, Real* dx, int n, int N, int K) {
  gemm<Real>(true, false, N, K, n, Real(1), dy, N, x, K, Real(1), dW, K);
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < N; ++c) db[c] += dy[static_cast<size_t>(r) * N + c];
  if (dx) gemm<Real>(false, false, n, K, N, Real(1), dy, N, W, K, Real(1), dx, K);
}

template <class Real>
std::vector<Real> silu_of(const std::vector<Real>& u) {
  std::vector<Real> h(u.size());
  for (size_t i = 0; i < u.size(); ++i) h[i] = silu(u[i]);
  return h;
}

}  // namespace

template <class Real>
void mlp_fwd(const Real* P, int d, int C, const Real* x, int n, Real* logits, MlpActs<Real>* acts) {
  const Layout L(d, C);
  const int d4 = 4 * d;
  MlpActs<Real> local;
  MlpActs<Real>& a = acts ? *acts : local;
  a.u1.resize(static_cast<size_t>(n) * d4);
  a.t.resize(static_cast<size_t>(n) * d);
  a.u3.resize(a.u1.size());
  a.u4.resize(a.t.size());
  dense(x, P + L.w1, P + L.b1, a.u1.data(), n, d4, d);
  dense(silu_of(a.u1).data(), P + L.w2, P + L.b2, a.t.data(), n, d, d4);
  dense(a.t.data(), P + L.w3, P + L.b3, a.u3.data(), n, d4, d);
  dense(silu_of(a.u3).data(), P + L.w4, P + L.b4, a.u4.data(), n, d, d4);
  a.h4 = silu_of(a.u4);
  dense(a.h4.data(), P + L.w5, P + L.b5, logits, n, C, d);
}

template <class Real>
void mlp_bwd(const Real* P, int d, int C, const Real* x, int n, const MlpActs<Real>& a, const Real* dlogits, Real* dP,
             Real* dx) {
  const Layout L(d, C);
  const int d4 = 4 * d;
  std::vector<Real> dh4(static_cast<size_t>(n) * d, Real(0));
  dense_bwd(a.h4.data(), P + L.w5, dlogits, dP + L.w5, dP + L.b5, dh4.data(), n, C, d);
  std::vector<Real> du4(dh4.size());
  for (size_t i = 0; i < du4.size(); ++i) du4[i] = dh4[i] * silu_grad(a.u4[i]);
  std::vector<Real> dh3(static_cast<size_t>(n) * d4, Real(0));
  dense_bwd(silu_of(a.u3).data(), P + L.w4, du4.data(), dP + L.w4, dP + L.b4, dh3.data(), n, d, d4);
  for (size_t i = 0; i < dh3.size(); ++i) dh3[i] *= silu_grad(a.u3[i]);
  std::vector<Real> dt(static_cast<size_t>(n) * d, Real(0));
  dense_bwd(a.t.data(), P + L.w3, dh3.data(), dP + L.w3, dP + L.b3, dt.data(), n, d4, d);
  std::vector<Real> dh1(static_cast<size_t>(n) * d4, Real(0));
  dense_bwd(silu_of(a.u1).data(), P + L.w2, dt.data(), dP + L.w2, dP + L.b2, dh1.data(), n, d, d4);
  for (size_t i = 0; i < dh1.size(); ++i) dh1[i] *= silu_grad(a.u1[i]);
  dense_bwd(x, P + L.w1, dh1.data(), dP + L.w1, dP + L.b1, dx, n, d4, d);
}

template <class Real>
Real gate(const Real* logits, int C, Real noise, Real tau, bool hard, Real* dsoft, Real* soft_out) {
  const Real margin = C == 2 ? logits[1] - logits[0] : logits[0];
  const Real x = (margin + noise) / tau;
  const Real soft = Real(1) / (Real(1) + std::exp(-x));
  // soft*(1-soft) from e^-|x| directly: in float, 1-soft rounds to 0 once the gate saturates towards FULL.
  const Real e = std::exp(-std::abs(x));
  const Real g = e / ((Real(1) + e) * (Real(1) + e)) / tau;
  if (dsoft) {
    if (C == 2) {
      dsoft[1] = g;
      dsoft[0] = -g;
    } else {
      dsoft[0] = g;
    }
  }
  if (soft_out) *soft_out = soft;
  return hard ? (soft > Real(0.5) ? Real(1) : Real(0)) : soft;
}

#define ELASTIC_INSTANTIATE(R)                                                                          \
  template void mlp_fwd<R>(const R*, int, int, const R*, int, R*, MlpActs<R>*);                         \
  template void mlp_bwd<R>(const R*, int, int, const R*, int, const MlpActs<R>&, const R*, R*, R*);     \
  template R gate<R>(const R*, int, R, R, bool, R*, R*);
ELASTIC_INSTANTIATE(float)
ELASTIC_INSTANTIATE(double)
#undef ELASTIC_INSTANTIATE

}  // namespace elastic::router
